/* stream.c: CUDA streams. A stream's handle is reference counted in C so that memory last
   used on it can still be freed in its order after the Lua object is closed or collected. */
#include <stdlib.h>
#include <string.h>
#include "cl.h"

#define STREAM_MT "cudalua.stream"
typedef struct { cl_stream *s; int is_default; } lstream;


static lstream *checkls(lua_State *L, int idx) {
  lstream *ls = cl_checkudata(L, idx, STREAM_MT);
  if (!ls->s && !ls->is_default) cl_argerror(L, idx, "closed stream");
  return ls;
}

/* the stream object at idx, without raising when it is closed: NULL for the default stream
   (*is_default set) or a closed one */
cl_stream *cl_stream_of(lua_State *L, int idx, int *is_default) {
  lstream *ls = cl_checkudata(L, idx, STREAM_MT);
  if (is_default) *is_default = ls->is_default;
  return ls->s;
}

void cl_stream_check(lua_State *L, cl_stream *s, CUcontext ctx, const char *where, const char *what) {
  if (!s || s->ctx == ctx) return;
  cl_error(L, where, "the stream is on device %d and the %s on device %d",
             cl_device_of(s->ctx), what, cl_device_of(ctx));
}

/* the stream argument at idx of work on ctx (an event's, a graph's): the stream, checked to be
   on ctx, and ctx made current */
cl_stream *cl_stream_arg(lua_State *L, int idx, CUcontext ctx, const char *where, const char *what) {
  cl_stream *s = cl_tostream(L, idx, where);
  cl_stream_check(L, s, ctx, where, what);
  cl_use_ctx(L, ctx);
  return s;
}

/* the stream's context made current (the selected device's for the default stream) */
CUstream cl_stream_use(lua_State *L, cl_stream *s) {
  if (s) { cl_use_ctx(L, s->ctx); return s->h; }
  cl_ctx(L);
  return NULL;
}

/* the stream object at idx as a method's self: NULL for the default stream; raises when closed */
cl_stream *cl_checkstream(lua_State *L, int idx) { return checkls(L, idx)->s; }

cl_stream *cl_tostream(lua_State *L, int idx, const char *where) {
  int t = lua_type(L, idx);
  if (t == LUA_TNONE || t == LUA_TNIL) return NULL;
  if (t == LUA_TNUMBER && lua_tointeger(L, idx) == 0 && lua_isinteger(L, idx)) return NULL;
  lstream *ls = luaL_testudata(L, idx, STREAM_MT);
  if (!ls) cl_error(L, where, "expected a stream, got %s", luaL_typename(L, idx));
  if (!ls->s && !ls->is_default) cl_error(L, where, "closed stream");
  return ls->s;
}

/* the options of cuda.stream at 1: nil, a boolean (non_blocking, the short form) or a table
   {non_blocking =, priority =}; anything else, or an unknown key, raises */
static void stream_options(lua_State *L, int *nonblocking, int *priority, int *has_priority) {
  *nonblocking = 0; *priority = 0; *has_priority = 0;
  if (lua_gettop(L) > 1)   /* cuda.stream(true, 5): a priority meant, silently dropped */
    cl_error(L, "cuda.stream", "takes one argument (non_blocking, or {non_blocking =, priority =}), got %d",
             lua_gettop(L));
  int t = lua_type(L, 1);
  if (t == LUA_TNONE || t == LUA_TNIL) return;
  if (t == LUA_TBOOLEAN) { *nonblocking = lua_toboolean(L, 1); return; }
  if (t != LUA_TTABLE)
    cl_error(L, "cuda.stream", "expected nil, a boolean (non_blocking) or an options table "
               "{non_blocking =, priority =}, got %s", luaL_typename(L, 1));
  static const char *const names[] = {"non_blocking", "priority", NULL};
  cl_check_options(L, 1, "cuda.stream", names);
  *nonblocking = cl_opt_bool(L, 1, "non_blocking", "cuda.stream") == 1;
  if (lua_getfield(L, 1, "priority") != LUA_TNIL) {
    int isint;
    lua_Integer p = lua_tointegerx(L, -1, &isint);
    if (!isint || p < -1000000 || p > 1000000)
      cl_error(L, "cuda.stream", "priority must be an integer (see cuda.stream_priority_range()), got %s",
                 luaL_tolstring(L, -1, NULL));
    *priority = (int)p;
    *has_priority = 1;
  }
  lua_pop(L, 1);
}

/* cuda.stream([non_blocking | {non_blocking =, priority =}]): a priority outside the device's
   range is refused (the driver would clamp it silently; cuda.core refuses too) */
/* pushes a new stream of ctx (current) */
static cl_stream *new_stream(lua_State *L, CUcontext ctx, unsigned flags, int has_priority, int priority,
                             const char *where) {
  lstream *ls = lua_newuserdatauv(L, sizeof *ls, 0);
  ls->s = NULL; ls->is_default = 0;
  luaL_setmetatable(L, STREAM_MT);
  cl_stream *s = calloc(1, sizeof *s);
  if (!s) cl_error(L, NULL, "out of host memory");
  CUresult r = has_priority ? CU(cuStreamCreateWithPriority, &s->h, flags, priority) : CU(cuStreamCreate, &s->h, flags);
  if (r != CUDA_SUCCESS) { free(s); cl_check(L, r, where); }
  s->refs = 1; s->owned = 1; s->blocking = !(flags & CU_STREAM_NON_BLOCKING); s->ctx = ctx;
  ls->s = s;
  return s;
}

static int l_stream(lua_State *L) {
  int nonblocking, priority, has_priority;
  stream_options(L, &nonblocking, &priority, &has_priority);
  CUcontext ctx = cl_ctx(L);
  if (has_priority) {
    int least = 0, greatest = 0;
    cl_check(L, CU(cuCtxGetStreamPriorityRange, &least, &greatest), "cuda.stream");
    if (priority > least || priority < greatest)
      return cl_error(L, "cuda.stream", "priority %d is outside device %d's range %d (highest) to %d "
                        "(lowest, the default)", priority, cl_device_of(ctx), greatest, least);
  }
  new_stream(L, ctx, nonblocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT, has_priority, priority, "cuda.stream");
  return 1;
}

cl_stream *cl_push_stream(lua_State *L, CUcontext ctx, unsigned flags, const char *where) {
  return new_stream(L, ctx, flags, 0, 0, where);
}

/* cuda.stream_priority_range() -> least, greatest (of the selected device; a smaller number
   is a higher priority, and 0 is the default) */
static int l_stream_priority_range(lua_State *L) {
  cl_ctx(L);
  int least = 0, greatest = 0;
  cl_check(L, CU(cuCtxGetStreamPriorityRange, &least, &greatest), "cuda.stream_priority_range");
  lua_pushinteger(L, least);
  lua_pushinteger(L, greatest);
  return 2;
}

static int l_default_stream(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, STREAM_MT ".default");
  return 1;
}

static int s_synchronize(lua_State *L) {
  lstream *ls = checkls(L, 1);
  CUstream h = cl_stream_use(L, ls->s);
  cl_capture_guard(L, ls->s, 1, "stream:synchronize");
  cl_wait(L, CL_WAIT_STREAM, h, "stream:synchronize");
  cl_flush_deferred(L);   /* what host functions closed meanwhile: nothing here uses it now */
  return 0;
}

static int s_query(lua_State *L) {
  CUstream h = cl_stream_use(L, checkls(L, 1)->s);
  cl_host_service(L);   /* a Lua host function on this stream may be what it waits for */
  CUresult r = CU(cuStreamQuery, h);
  cl_flush_deferred(L);
  cl_host_raise(L);
  if (r == CUDA_ERROR_NOT_READY) { lua_pushboolean(L, 0); return 1; }
  cl_check(L, r, "stream:query");
  lua_pushboolean(L, 1);
  return 1;
}

/* stream:launch_host_func(fn): run by this state's thread at its next wait (src/hostfn.c);
   while the stream captures, a host node of the graph, run at each of its launches */
static int s_launch_host_func(lua_State *L) {
  lstream *ls = checkls(L, 1);
  cl_stream *s = ls->s;
  CUstream h = cl_stream_use(L, s);
  cl_checktype(L, 2, LUA_TFUNCTION);
  cl_capture_guard(L, s, 0, "stream:launch_host_func");
  if (cl_capture_in_body(L, s))
    return cl_error(L, "stream:launch_host_func", "a conditional node's body cannot call Lua host functions "
                    "(a body runs any number of times per launch; a host node runs once per launch)");
  if (cl_capturing && s && cl_capture_push_keep(L, s)) {
    CUstreamBatchMemOpParams op[2];
    cl_hostrec *r = cl_hostrec_new(L, 2, "stream:launch_host_func");
    cl_hostrec_ops(r, op);
    cl_check(L, CU(cuStreamBatchMemOp, h, 2, op, 0), "stream:launch_host_func");
    cl_capture_add(L, lua_gettop(L) - 1, CL_CAPTURE_HOSTRECS, lua_gettop(L));
    return 0;
  }
  CL_BEFORE_ENQUEUE(L, "stream:launch_host_func");
  cl_host_enqueue(L, h, 2, "stream:launch_host_func");
  cl_host_after_enqueue(L, h, "stream:launch_host_func");
  return 0;
}

/* stream:device() -> the device id it belongs to (the selected one for the default stream) */
static int s_device(lua_State *L) {
  lstream *ls = checkls(L, 1);
  lua_pushinteger(L, ls->s ? cl_device_of(ls->s->ctx) : cl_current_device());
  return 1;
}

static void close_stream(lua_State *L, void *s, void *unused) {
  (void)unused;
  /* a stream closed while capturing ends its capture; then what the capture held off goes */
  if (cl_capture_abandon(L, s)) cl_flush_deferred(L);
  cl_stream_unref(L, s);
}

static int s_close(lua_State *L) {
  lstream *ls = cl_checkudata(L, 1, STREAM_MT);
  if (!ls->s) return 0;
  if (ls->s->body || ls->s->bodies)
    return cl_error(L, "stream:close", "the stream captures a conditional node's body, or its capture has one "
                    "being captured: close it after the body's function returns");
  /* inside a host function the cudalua call it runs in may be queueing work on this stream,
     and ending its capture there would call the driver (on the helper thread, another thread
     than the capture's): the whole close is put off, to the next flush even if it captures */
  if (!(cl_must_defer(L) && cl_defer_call(L, ls->s->capture_ref != 0, close_stream, ls->s, NULL)))
    close_stream(L, ls->s, NULL);
  ls->s = NULL;
  return 0;
}

/* s.priority, s.non_blocking; methods otherwise */
static int s_index(lua_State *L) {
  lstream *ls = cl_checkudata(L, 1, STREAM_MT);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  const char *k = lua_tostring(L, 2);
  if (k && !strcmp(k, "priority")) {
    if (!ls->s && !ls->is_default) return cl_error(L, "stream.priority", "closed stream");
    CUstream h = cl_stream_use(L, ls->s);
    int p = 0;
    cl_check(L, CU(cuStreamGetPriority, h, &p), "stream.priority");
    lua_pushinteger(L, p);
    return 1;
  }
  if (k && !strcmp(k, "non_blocking")) {
    if (!ls->s && !ls->is_default) return cl_error(L, "stream.non_blocking", "closed stream");
    lua_pushboolean(L, ls->s && !ls->s->blocking);
    return 1;
  }
  return cl_error(L, NULL, "streams have no field '%s'", luaL_tolstring(L, 2, NULL));
}

static int s_handle(lua_State *L) {
  lstream *ls = checkls(L, 1);
  lua_pushinteger(L, (lua_Integer)(uintptr_t)(ls->s ? ls->s->h : NULL));
  return 1;
}

static int s_tostring(lua_State *L) {
  lstream *ls = cl_checkudata(L, 1, STREAM_MT);
  if (ls->is_default) lua_pushliteral(L, "cudalua.stream<default>");
  else if (!ls->s) lua_pushliteral(L, "cudalua.stream<closed>");
  else if (cl_device_of(ls->s->ctx) < 0) lua_pushfstring(L, "cudalua.stream<%p>", (void *)ls->s->h);
  else lua_pushfstring(L, "cudalua.stream<%p on device %d>", (void *)ls->s->h, cl_device_of(ls->s->ctx));
  return 1;
}

/* lets the C embedding API and the Lua side wrap a host-made stream */
int cl_push_foreign_stream(lua_State *L, CUstream h, int blocking) {
  /* the host program's stream: of the context current on this thread (the host's device),
     else the selected device's; the handle itself is not asked (a host may hand over any
     value, and the driver does not check handles) */
  CUcontext ctx = NULL;
  if (cl_driver_load()) {
    CU0(cuCtxGetCurrent, &ctx);
    if (!ctx) ctx = cl_ctx(L);
  }
  lstream *ls = lua_newuserdatauv(L, sizeof *ls, 0);
  ls->s = NULL; ls->is_default = 0;
  luaL_setmetatable(L, STREAM_MT);
  cl_stream *s = calloc(1, sizeof *s);
  if (!s) return cl_error(L, NULL, "out of host memory");
  s->h = h; s->refs = 1; s->owned = 0; s->blocking = blocking;
  s->ctx = ctx;
  ls->s = s;
  return 1;
}

void cl_open_stream(lua_State *L) {
  static const luaL_Reg m[] = {
    {"synchronize", s_synchronize}, {"query", s_query},
    {"close", s_close}, {"handle", s_handle}, {"launch_host_func", s_launch_host_func},
    {"device", s_device},
    {NULL, NULL}};
  static const luaL_Reg meta[] = {
    {"__gc", s_close}, {"__close", s_close}, {"__tostring", s_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){STREAM_MT, m, s_index, meta, NULL});   /* capture.c and event.c add methods */
  lstream *ls = lua_newuserdatauv(L, sizeof *ls, 0);
  ls->s = NULL; ls->is_default = 1;
  luaL_setmetatable(L, STREAM_MT);
  lua_setfield(L, LUA_REGISTRYINDEX, STREAM_MT ".default");
  lua_pushcfunction(L, l_stream); lua_setfield(L, -2, "stream");
  lua_pushcfunction(L, l_default_stream); lua_setfield(L, -2, "default_stream");
  lua_pushcfunction(L, l_stream_priority_range); lua_setfield(L, -2, "stream_priority_range");
}
