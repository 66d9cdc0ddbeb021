/* capture.c: stream capture. Work queued on a capturing stream becomes a graph; the objects
   it uses are kept in a table that the graph takes over. While a capture runs, cudalua refuses
   what would break it (the legacy stream, waits) instead of letting the driver invalidate it. */
#include "cl.h"

void *cl_push_graph(lua_State *L, CUgraph h, CUcontext ctx);   /* graph.c */


static cl_stream *capstream(lua_State *L, const char *where) {
  int is_default;
  cl_stream *s = cl_stream_of(L, 1, &is_default);
  if (is_default) luaL_error(L, "cudalua: %s: the legacy default stream cannot be captured; use cuda.stream()", where);
  if (!s) luaL_error(L, "cudalua: %s: closed stream", where);
  return s;
}

/* s:begin_capture([mode]): mode "global" (default), "thread_local" or "relaxed" */
static int s_begin_capture(lua_State *L) {
  cl_stream *s = capstream(L, "stream:begin_capture");
  static const char *const modes[] = {"global", "thread_local", "relaxed", NULL};
  static const CUstreamCaptureMode m[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED};
  int mode = luaL_checkoption(L, 2, "global", modes);
  if (s->capture_ref) return luaL_error(L, "cudalua: stream:begin_capture: the stream is already capturing");
  cl_use_ctx(L, s->ctx);
  cl_check(L, cu.cuStreamBeginCapture(s->h, m[mode]), "stream:begin_capture");
  lua_newtable(L);
  s->capture_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  __atomic_add_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
  return 0;
}

static void end_capture_state(lua_State *L, cl_stream *s) {
  luaL_unref(L, LUA_REGISTRYINDEX, s->capture_ref);
  s->capture_ref = 0;
  __atomic_sub_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
  cl_flush_deferred(L);
}

/* s:end_capture() -> graph */
static int s_end_capture(lua_State *L) {
  cl_stream *s = capstream(L, "stream:end_capture");
  if (!s->capture_ref) return luaL_error(L, "cudalua: stream:end_capture: the stream is not capturing");
  cl_use_ctx(L, s->ctx);
  CUgraph h = NULL;
  CUresult r = cu.cuStreamEndCapture(s->h, &h);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->capture_ref);
  int refs = lua_gettop(L);
  end_capture_state(L, s);
  if (r != CUDA_SUCCESS) {
    if (h) cu.cuGraphDestroy(h);
    return luaL_error(L, "cudalua: stream:end_capture: the capture failed (%s); the stream is usable again", cl_errname(r));
  }
  cl_push_graph(L, h, s->ctx);
  lua_pushvalue(L, refs);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

static int s_is_capturing(lua_State *L) {
  cl_stream *s = cl_stream_of(L, 1, NULL);
  if (!s) { lua_pushboolean(L, 0); return 1; }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cl_use_ctx(L, s->ctx);
  cl_check(L, cu.cuStreamIsCapturing(s->h, &st), "stream:is_capturing");
  lua_pushboolean(L, st != CU_STREAM_CAPTURE_STATUS_NONE);
  return 1;
}

void cl_open_capture(lua_State *L) {
  /* capture methods join the stream's method table */
  luaL_getmetatable(L, "cudalua.stream");
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, s_begin_capture); lua_setfield(L, -2, "begin_capture");
  lua_pushcfunction(L, s_end_capture); lua_setfield(L, -2, "end_capture");
  lua_pushcfunction(L, s_is_capturing); lua_setfield(L, -2, "is_capturing");
  lua_pop(L, 2);
}
