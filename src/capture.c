/* capture.c: stream capture. Work queued on a capturing stream becomes a graph; the objects
   it uses are kept in a table that the graph takes over. While a capture runs, cudalua refuses
   what would break it (the legacy stream, waits) instead of letting the driver invalidate it. */
#include "cl.h"



static cl_stream *capstream(lua_State *L, const char *where) {
  int is_default;
  cl_stream *s = cl_stream_of(L, 1, &is_default);
  if (is_default) cl_error(L, where, "the legacy default stream cannot be captured; use cuda.stream()");
  if (!s) cl_error(L, where, "closed stream");
  return s;
}




/* s:begin_capture([mode]): mode "global" (default), "thread_local" or "relaxed" */
static int s_begin_capture(lua_State *L) {
  cl_stream *s = capstream(L, "stream:begin_capture");
  static const char *const modes[] = {"global", "thread_local", "relaxed", NULL};
  static const CUstreamCaptureMode m[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED};
  int mode = cl_checkoption(L, 2, "global", modes);
  if (s->capture_ref) return cl_error(L, "stream:begin_capture", "the stream is already capturing");
  cl_use_ctx(L, s->ctx);
  cl_host_reserve(L);   /* no page-locked allocation may happen during the capture */
  cl_capture_enter(L);
  CUresult r = CU(cuStreamBeginCapture, s->h, m[mode]);
  if (r != CUDA_SUCCESS) __atomic_sub_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
  cl_check(L, r, "stream:begin_capture");
  cl_capture_begun(L, s);
  return 0;
}



/* s:end_capture() -> graph */
static int s_end_capture(lua_State *L) {
  cl_stream *s = capstream(L, "stream:end_capture");
  if (!s->capture_ref) return cl_error(L, "stream:end_capture", "the stream is not capturing");
  cl_use_ctx(L, s->ctx);
  cuuint64_t id = cl_capture_id(L, s);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->capture_ref);
  int refs = lua_gettop(L);
  cl_mem_capture_ending(L, refs, s);   /* the graph frees what the capture allocated */
  CUgraph h = NULL;
  CUresult r = CU(cuStreamEndCapture, s->h, &h);
  cl_capture_ended(L, s, id);
  cl_flush_deferred(L);   /* what the capture held off */
  if (r != CUDA_SUCCESS) {
    if (h) CU(cuGraphDestroy, h);
    return cl_error(L, "stream:end_capture", "the capture failed (%s); the stream is usable again", cl_errname(r));
  }
  cl_push_graph(L, h, s->ctx);
  int g = lua_gettop(L);
  lua_pushvalue(L, refs);
  lua_setiuservalue(L, g, 1);
  cl_graph_hold_kept(L, g);
  /* the captured host functions run at each launch of the graph */
  if (lua_getfield(L, refs, CL_CAPTURE_HOSTRECS) == LUA_TTABLE) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      cl_graph_add_hostrec(L, g, cl_hostrec_of_box(L, -1));
      lua_pop(L, 1);
    }
  }
  lua_settop(L, g);
  return 1;
}

static int s_is_capturing(lua_State *L) {
  cl_stream *s = cl_stream_of(L, 1, NULL);
  if (!s) { lua_pushboolean(L, 0); return 1; }
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cl_use_ctx(L, s->ctx);
  cl_check(L, CU(cuStreamIsCapturing, s->h, &st), "stream:is_capturing");
  lua_pushboolean(L, st != CU_STREAM_CAPTURE_STATUS_NONE);
  return 1;
}

void cl_open_capture(lua_State *L) {
  /* capture methods join the stream's method table */
  lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.stream.methods");
  lua_pushcfunction(L, s_begin_capture); lua_setfield(L, -2, "begin_capture");
  lua_pushcfunction(L, s_end_capture); lua_setfield(L, -2, "end_capture");
  lua_pushcfunction(L, s_is_capturing); lua_setfield(L, -2, "is_capturing");
  lua_pop(L, 1);
}
