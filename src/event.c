/* event.c: CUDA events, for ordering streams and timing. */
#include "cl.h"

#define EVENT_MT "cudalua.event"
typedef struct { CUevent e; int timing; } levent;

static levent *checkev(lua_State *L, int idx) {
  levent *ev = luaL_checkudata(L, idx, EVENT_MT);
  if (!ev->e) luaL_argerror(L, idx, "closed event");
  return ev;
}

CUevent cl_checkevent(lua_State *L, int idx) { return checkev(L, idx)->e; }

static int l_event(lua_State *L) {
  int timing = lua_isnoneornil(L, 1) ? 1 : lua_toboolean(L, 1);  /* cuda.event(false): no timing */
  cl_ctx(L);
  levent *ev = lua_newuserdatauv(L, sizeof *ev, 0);
  ev->e = NULL; ev->timing = timing;
  luaL_setmetatable(L, EVENT_MT);
  cl_check(L, cu.cuEventCreate(&ev->e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
           "cuda.event");
  return 1;
}

static int e_record(lua_State *L) {
  levent *ev = checkev(L, 1);
  cl_stream *s = cl_tostream(L, 2, "event:record");
  cl_ctx(L);
  cl_capture_guard(L, s, 0, "event:record");
  cl_check(L, cu.cuEventRecord(ev->e, s ? s->h : NULL), "event:record");
  return 0;
}

static int e_query(lua_State *L) {
  levent *ev = checkev(L, 1);
  cl_ctx(L);
  cl_host_service(L);
  CUresult r = cu.cuEventQuery(ev->e);
  cl_host_raise(L);
  if (r == CUDA_ERROR_NOT_READY) { lua_pushboolean(L, 0); return 1; }
  cl_check(L, r, "event:query");
  lua_pushboolean(L, 1);
  return 1;
}

static int e_synchronize(lua_State *L) {
  levent *ev = checkev(L, 1);
  cl_ctx(L);
  cl_wait(L, CL_WAIT_EVENT, ev->e, "event:synchronize");
  return 0;
}

static int e_elapsed_time(lua_State *L) {
  levent *a = checkev(L, 1), *b = checkev(L, 2);
  if (!a->timing || !b->timing)
    return luaL_error(L, "cudalua: elapsed_time: an event was created without timing");
  float ms = 0;
  cl_ctx(L);
  CUresult r = cu.cuEventElapsedTime(&ms, a->e, b->e);
  if (r == CUDA_ERROR_NOT_READY)
    return luaL_error(L, "cudalua: elapsed_time: an event has not completed (synchronize it first)");
  if (r == CUDA_ERROR_INVALID_HANDLE)
    return luaL_error(L, "cudalua: elapsed_time: an event was never recorded");
  cl_check(L, r, "elapsed_time");
  lua_pushnumber(L, ms);
  return 1;
}

static int e_close(lua_State *L) {
  levent *ev = luaL_checkudata(L, 1, EVENT_MT);
  if (ev->e) {
    cu.cuEventDestroy(ev->e);   /* the driver defers it if the event is still pending */
    ev->e = NULL;
  }
  return 0;
}

static int e_tostring(lua_State *L) {
  levent *ev = luaL_checkudata(L, 1, EVENT_MT);
  if (ev->e) lua_pushfstring(L, "cudalua.event<%p>", (void *)ev->e);
  else lua_pushliteral(L, "cudalua.event<closed>");
  return 1;
}

void cl_open_event(lua_State *L) {
  static const luaL_Reg m[] = {
    {"record", e_record}, {"query", e_query}, {"synchronize", e_synchronize},
    {"elapsed_time", e_elapsed_time}, {"close", e_close}, {NULL, NULL}};
  luaL_newmetatable(L, EVENT_MT);
  luaL_newlib(L, m);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, e_close); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, e_close); lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, e_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_event); lua_setfield(L, -2, "event");
  lua_pushcfunction(L, e_elapsed_time); lua_setfield(L, -2, "event_elapsed_time");
}
