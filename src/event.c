/* event.c: CUDA events, for ordering streams and timing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

#define EVENT_MT "cudalua.event"
/* in_graph: a graph node or a captured external record/wait uses it, and the graph keeps the
   object: close only hides it then, the collector (once no graph keeps it) destroys it.
   capture: the capture id its last record was captured in (a wait in another capture, or in
   none, is an external wait node) */
typedef struct { CUevent e; int timing; int ipc; int recorded; CUcontext ctx; int in_graph, closed;
                 cuuint64_t capture; } levent;

static levent *checkev(lua_State *L, int idx) {
  levent *ev = cl_checkudata(L, idx, EVENT_MT);
  if (!ev->e || ev->closed) cl_argerror(L, idx, "closed event");
  return ev;
}

CUevent cl_checkevent(lua_State *L, int idx) { return checkev(L, idx)->e; }

CUevent cl_graph_event(lua_State *L, int idx, CUcontext ctx, int records, const char *where) {
  levent *ev = checkev(L, idx);
  if (ev->ctx != ctx)
    cl_error(L, where, "the event is on device %d and the graph on device %d", cl_device_of(ev->ctx), cl_device_of(ctx));
  ev->in_graph = 1;
  if (records) ev->recorded = 1;   /* (for elapsed_time: the graph's launches record it) */
  return ev->e;
}

/* cuda.event([timing]) or cuda.event{timing =, interprocess =}: on the selected device.
   An interprocess event (e:ipc_handle(), cuda.open_ipc_event) cannot time. */
static int l_event(lua_State *L) {
  int timing = 1, ipc = 0;
  if (lua_istable(L, 1)) {
    static const char *const opts[] = {"timing", "interprocess", NULL};
    cl_check_options(L, 1, "cuda.event", opts);
    int t = cl_opt_bool(L, 1, "timing", "cuda.event");
    ipc = cl_opt_bool(L, 1, "interprocess", "cuda.event") == 1;
    timing = t < 0 ? !ipc : t;
    if (ipc && timing) return cl_error(L, "cuda.event", "an interprocess event cannot time (timing = false)");
  } else if (lua_isboolean(L, 1)) timing = lua_toboolean(L, 1);   /* cuda.event(false): no timing */
  else if (!lua_isnoneornil(L, 1))
    return cl_error(L, "cuda.event", "expected nil, a boolean (timing) or an options table "
                      "{timing =, interprocess =}, got %s", luaL_typename(L, 1));
  CUcontext ctx = cl_ctx(L);
  levent *ev = lua_newuserdatauv(L, sizeof *ev, 0);
  memset(ev, 0, sizeof *ev);
  ev->timing = timing; ev->ipc = ipc; ev->ctx = ctx;
  luaL_setmetatable(L, EVENT_MT);
  unsigned flags = (timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING) | (ipc ? CU_EVENT_INTERPROCESS : 0);
  cl_check(L, CU(cuEventCreate, &ev->e, flags), "cuda.event");
  return 1;
}

/* e:record([stream] [, {external = true}]): in a capture a record orders the capture's streams
   (CUDA's fork and join) and is no node; external = true makes it an event record node, which
   records the event at each launch of the graph (to time it, or for work outside it) */
static int e_record(lua_State *L) {
  levent *ev = checkev(L, 1);
  int external = 0;
  if (lua_istable(L, 3) || lua_istable(L, 2)) {   /* (streams are userdata) */
    int o = lua_istable(L, 3) ? 3 : 2;
    static const char *const opts[] = {"external", NULL};
    cl_check_options(L, o, "event:record", opts);
    external = cl_opt_bool(L, o, "external", "event:record") == 1;
    if (o == 2) lua_pushnil(L), lua_replace(L, 2);
  }
  cl_stream *s = cl_stream_arg(L, 2, ev->ctx, "event:record", "event");
  cl_capture_guard(L, s, 0, "event:record");
  if (external && cl_capture_in_body(L, s))
    return cl_error(L, "event:record", "a conditional node's body cannot have event record nodes (CUDA refuses them there)");
  cuuint64_t cap = cl_capturing && s ? cl_capture_id(L, s) : 0;
  /* (the external flag outside a capture is CUDA_ERROR_ILLEGAL_STATE: a plain record there) */
  cl_check(L, external && cap ? CU(cuEventRecordWithFlags, ev->e, s ? s->h : NULL, CU_EVENT_RECORD_EXTERNAL)
                       : CU(cuEventRecord, ev->e, s ? s->h : NULL), "event:record");
  if (cap && external) {   /* the graph records it: kept with the capture, as a node keeps it */
    ev->in_graph = 1;
    if (cl_capture_push_keep(L, s)) { cl_keep(L, -1, 1); lua_pop(L, 1); }
  }
  ev->capture = external ? 0 : cap;
  ev->recorded = 1;
  return 0;
}

static int e_query(lua_State *L) {
  levent *ev = checkev(L, 1);
  cl_use_ctx(L, ev->ctx);
  cl_host_service(L);
  CUresult r = CU(cuEventQuery, ev->e);
  cl_flush_deferred(L);
  cl_host_raise(L);
  if (r == CUDA_ERROR_NOT_READY) { lua_pushboolean(L, 0); return 1; }
  cl_check(L, r, "event:query");
  lua_pushboolean(L, 1);
  return 1;
}

static int e_synchronize(lua_State *L) {
  levent *ev = checkev(L, 1);
  cl_use_ctx(L, ev->ctx);
  cl_wait(L, CL_WAIT_EVENT, ev->e, "event:synchronize");
  cl_flush_deferred(L);
  return 0;
}

static int e_elapsed_time(lua_State *L) {
  levent *a = checkev(L, 1), *b = checkev(L, 2);
  if (!a->timing || !b->timing)
    return cl_error(L, "event:elapsed_time", "an event was created without timing");
  if (a->ctx != b->ctx)
    return cl_error(L, "event:elapsed_time", "the events are on devices %d and %d (time on one device)",
                      cl_device_of(a->ctx), cl_device_of(b->ctx));
  /* what the driver would refuse is found first (checkers report every refused call; a
     query's "not ready" is an answer, not a refusal) */
  if (!a->recorded || !b->recorded) return cl_error(L, "event:elapsed_time", "an event was never recorded");
  float ms = 0;
  cl_use_ctx(L, a->ctx);
  CUresult r = CU(cuEventQuery, a->e);
  if (r == CUDA_SUCCESS) r = CU(cuEventQuery, b->e);
  if (r == CUDA_SUCCESS) r = CU(cuEventElapsedTime, &ms, a->e, b->e);
  if (r == CUDA_ERROR_NOT_READY)
    return cl_error(L, "event:elapsed_time", "an event has not completed (synchronize it first)");
  if (r == CUDA_ERROR_INVALID_HANDLE)
    return cl_error(L, "event:elapsed_time", "an event was never recorded");
  cl_check(L, r, NULL);
  lua_pushnumber(L, ms);
  return 1;
}

#define IPC_EVENT_TAG "cudalua-ipc-event:"

/* e:ipc_handle() -> a string another process gives cuda.open_ipc_event */
void cl_ipc_need_gpu(lua_State *L, const char *where) {
  if (cl_driver_load() && cl_cpu_symbol(NULL))
    cl_error(L, where, "cudalua's CPU device (CUDALUA_DEVICE=cpu) does not share memory or events between processes (IPC needs a GPU)");
}

static int e_ipc_handle(lua_State *L) {
  levent *ev = checkev(L, 1);
  CUipcEventHandle h;
  /* known here: the driver is not asked to refuse it (checkers report every refusal) */
  if (!ev->ipc)
    return cl_error(L, "event:ipc_handle", "the event was not made with cuda.event{interprocess = true}");
  cl_use_ctx(L, ev->ctx);
  cl_ipc_need_gpu(L, "event:ipc_handle");
  CUresult r = CU(cuIpcGetEventHandle, &h, ev->e);
  if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE)
    return cl_error(L, "event:ipc_handle", "the event was not made with cuda.event{interprocess = true}");
  cl_check(L, r, "event:ipc_handle");
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, IPC_EVENT_TAG);
  cl_add_hex(&b, h.reserved, sizeof h.reserved);
  luaL_pushresult(&b);
  return 1;
}

/* cuda.open_ipc_event(handle) -> an event of another process, on the selected device */
static int l_open_ipc_event(lua_State *L) {
  size_t n;
  const char *s = cl_checklstring(L, 1, &n);
  CUipcEventHandle h;
  size_t tag = sizeof IPC_EVENT_TAG - 1;
  if (n != tag + 2 * sizeof h.reserved || strncmp(s, IPC_EVENT_TAG, tag) ||
      !cl_hex_decode(s + tag, h.reserved, sizeof h.reserved))
    return cl_argerror(L, 1, "not an event handle from event:ipc_handle()");
  cl_ipc_need_gpu(L, "cuda.open_ipc_event");
  CUcontext ctx = cl_ctx(L);
  levent *ev = lua_newuserdatauv(L, sizeof *ev, 0);
  ev->e = NULL; ev->timing = 0; ev->ipc = 1; ev->recorded = 1; ev->ctx = ctx;
  luaL_setmetatable(L, EVENT_MT);
  cl_check(L, CU(cuIpcOpenEventHandle, &ev->e, h), "cuda.open_ipc_event");
  return 1;
}

static void destroy_event(lua_State *L, void *e, void *unused) {
  (void)unused;
  CU(cuEventDestroy, (CUevent)e);   /* the driver defers it if the event is still pending */
}

static int e_gc(lua_State *L) {
  levent *ev = cl_checkudata(L, 1, EVENT_MT);
  if (ev->e) {
    /* inside a host function the cudalua call it runs in may be recording this very event */
    if (!(cl_must_defer(L) && cl_defer_call(L, 0, destroy_event, ev->e, NULL))) destroy_event(L, ev->e, NULL);
    ev->e = NULL;
  }
  return 0;
}

/* e:close(): a graph that uses the event keeps it until the graph goes (see levent) */
static int e_close(lua_State *L) {
  levent *ev = cl_checkudata(L, 1, EVENT_MT);
  if (ev->in_graph) { ev->closed = 1; return 0; }
  return e_gc(L);
}

static int e_tostring(lua_State *L) {
  levent *ev = cl_checkudata(L, 1, EVENT_MT);
  if (ev->e && !ev->closed) lua_pushfstring(L, "cudalua.event<%p>", (void *)ev->e);
  else lua_pushliteral(L, "cudalua.event<closed>");
  return 1;
}

/* stream:wait_event(e): the event may be another device's. A stream method that takes an
   event, so it is here, above both: event.c adds it to the stream's methods */
static int s_wait_event(lua_State *L) {
  cl_stream *s = cl_checkstream(L, 1);
  levent *ev = checkev(L, 2);
  CUstream h = cl_stream_use(L, s);
  /* in a capture, an event recorded outside it (or in another) is an event wait node: the
     graph waits for the event's latest record at each launch */
  /* (the legacy stream, s NULL, captures never; it may not wait while a blocking stream does) */
  cl_capture_guard(L, s, 0, "stream:wait_event");
  cuuint64_t cap = cl_capturing && s ? cl_capture_id(L, s) : 0;
  int external = cap && ev->capture != cap;
  if (external && cl_capture_in_body(L, s))
    return cl_error(L, "stream:wait_event", "a conditional node's body can wait only for events recorded in the same body "
                    "(an event of another would be an event wait node, which CUDA refuses in bodies)");
  if (external) {
    ev->in_graph = 1;
    if (cl_capture_push_keep(L, s)) { cl_keep(L, -1, 2); lua_pop(L, 1); }
  }
  cl_check(L, CU(cuStreamWaitEvent, h, ev->e, external ? CU_EVENT_WAIT_EXTERNAL : 0), "stream:wait_event");
  return 0;
}

void cl_open_event(lua_State *L) {
  static const luaL_Reg m[] = {
    {"record", e_record}, {"query", e_query}, {"synchronize", e_synchronize},
    {"elapsed_time", e_elapsed_time}, {"close", e_close}, {"ipc_handle", e_ipc_handle}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
    {"__gc", e_gc}, {"__close", e_close}, {"__tostring", e_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){EVENT_MT, m, NULL, meta, NULL});
  lua_pushcfunction(L, l_event); lua_setfield(L, -2, "event");
  lua_pushcfunction(L, e_elapsed_time); lua_setfield(L, -2, "event_elapsed_time");
  lua_pushcfunction(L, l_open_ipc_event); lua_setfield(L, -2, "open_ipc_event");
  lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.stream.methods");
  lua_pushcfunction(L, s_wait_event); lua_setfield(L, -2, "wait_event");
  lua_pop(L, 1);
}
