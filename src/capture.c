/* capture.c: stream capture. Work queued on a capturing stream becomes a graph; the objects
   it uses are kept in a table that the graph takes over. While a capture runs, cudalua refuses
   what would break it (the legacy stream, waits) instead of letting the driver invalidate it. */
#include <string.h>
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
  if (s->body)
    return cl_error(L, "stream:end_capture", "the stream captures a conditional node's body: that capture ends when the body's function returns");
  if (s->bodies)
    return cl_error(L, "stream:end_capture", "a conditional node's body of this capture is being captured (end it from outside the body's function)");
  cl_use_ctx(L, s->ctx);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->capture_ref);
  int refs = lua_gettop(L);
  cl_mem_capture_ending(L, refs, s);   /* the graph frees what the capture allocated */
  CUgraph h = NULL;
  CUresult r = CU(cuStreamEndCapture, s->h, &h);
  cl_capture_ended(L, s);
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

/* ---- conditional nodes in a capture (the capture form of graph:condition, graph:while_loop...).
   The node is added to the captured graph at the stream's place (CUDA's recipe: the capture's
   graph and dependencies from cuStreamGetCaptureInfo, the node, then the stream's dependencies
   set to it), and each body is captured into the graph the node owns, on a stream of its own
   made for that body and handed to the body's function: fn(body_stream). */

/* the capturing stream at 1 (not the legacy one, capturing) and its capture's graph */
static cl_stream *capturing(lua_State *L, const char *where, CUgraph *g, cuuint64_t *id,
                            const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n) {
  cl_stream *s = capstream(L, where);
  if (!cu.cuGraphConditionalHandleCreate || !cu.cuGraphAddNode || !cu.cuStreamBeginCaptureToGraph ||
      !cu.cuStreamUpdateCaptureDependencies)
    cl_error(L, where, "conditional nodes in captures need a CUDA 12.3 or newer driver");
  cl_use_ctx(L, s->ctx);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = CU(cuStreamGetCaptureInfo, s->h, &st, id, g, deps, edges, n);
  if (r != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    cl_error(L, where, st == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? "the stream's capture was invalidated"
             : "the stream is not capturing (stream:begin_capture first; or build the graph with graph:condition and its nodes)");
  return s;
}

/* s:condition{default = v} -> a condition of s's capture, for its conditional nodes and the
   kernels that set it (cudaGraphSetConditional) */
static int s_condition(lua_State *L) {
  CUgraph g;
  cuuint64_t id;
  cl_stream *s = capturing(L, "stream:condition", &g, &id, NULL, NULL, NULL);
  cl_push_condition(L, g, s->ctx, id, 2, "stream:condition");
  if (cl_capture_push_keep(L, s)) { cl_keep(L, -1, -2); lua_pop(L, 1); }
  return 1;
}

/* captures body h of the conditional node on a new stream: fn at fidx called with it */
static void capture_body(lua_State *L, cl_stream *s, CUgraph h, int fidx, const char *where) {
  cl_stream *b = cl_push_stream(L, s->ctx, CU_STREAM_NON_BLOCKING, where);
  int bidx = lua_gettop(L);
  /* counted as a capture (no device-wide wait may begin: none can, s captures) */
  __atomic_add_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
  /* thread_local: a global body capture would refuse other threads' allocations while it runs,
     even under an outer capture in the thread_local or relaxed mode (what is unsafe in this
     thread, cudalua refuses in bodies itself) */
  CUresult r = CU(cuStreamBeginCaptureToGraph, b->h, h, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != CUDA_SUCCESS) {
    __atomic_sub_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
    cl_check(L, r, where);
  }
  cl_capture_body_begun(L, b, s);
  s->bodies++;
  lua_pushvalue(L, fidx);
  lua_pushvalue(L, bidx);
  int failed = lua_pcall(L, 1, 0, 0) != LUA_OK;   /* its error at the top */
  s->bodies--;
  CUgraph out = NULL;
  r = CU(cuStreamEndCapture, b->h, &out);   /* out is h, the node's: not destroyed */
  cl_capture_ended(L, b);
  cl_flush_deferred(L);
  lua_getfield(L, bidx, "close");   /* the body's stream is done with */
  lua_pushvalue(L, bidx);
  lua_call(L, 1, 0);
  if (failed) lua_error(L);
  if (r != CUDA_SUCCESS)
    cl_error(L, where, "the body's capture failed (%s)", cl_errname(r));
  size_t n = 0;
  cl_check(L, CU(cuGraphGetNodes, h, NULL, &n), where);
  if (n == 0) cl_error(L, where, "the body's function queued no work on the body's stream (an empty body)");
  lua_settop(L, bidx - 1);
}

/* a conditional node of type with size bodies at s's place in its capture: the condition at 2,
   the body functions from 3 (switch: a list at 3) */
static int cond_capture(lua_State *L, CUgraphConditionalNodeType type, int size, int list, const char *where) {
  CUgraph g;
  cuuint64_t id;
  const CUgraphNode *deps;
  const CUgraphEdgeData *edges;
  size_t nd;
  cl_stream *s = capturing(L, where, &g, &id, &deps, &edges, &nd);
  cl_condition *c = luaL_testudata(L, 2, CL_CONDITION_MT);
  if (!c) return cl_error(L, where, "expected a condition (stream:condition()), got %s", luaL_typename(L, 2));
  if (c->graph != id)
    return cl_error(L, where, "the condition is not this capture's (a conditional node takes a condition made by its capturing stream's :condition())");
  if (c->node)
    return cl_error(L, where, "the condition already controls a conditional node (CUDA allows one node per condition: make another)");
  if (list) {
    cl_checktype(L, 3, LUA_TTABLE);
    size = (int)lua_rawlen(L, 3);
    if (size < 1 || size > 4096) return cl_error(L, where, "the list of body functions must have 1 to 4096, got %d", size);
    lua_settop(L, 3);
    for (int i = 1; i <= size; i++) lua_rawgeti(L, 3, i);   /* the functions from 4 */
  }
  int first = list ? 4 : 3;
  for (int i = 0; i < size; i++)
    if (lua_type(L, first + i) != LUA_TFUNCTION)
      return cl_error(L, where, "body %d: expected a function (called with the body's stream), got %s", i + 1, luaL_typename(L, first + i));
  CUgraphNodeParams p;
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = c->h;
  p.conditional.type = type;
  p.conditional.size = (unsigned)size;
  p.conditional.ctx = s->ctx;
  CUgraphNode node;
  cl_check(L, CU(cuGraphAddNode, &node, g, deps, edges, nd, &p), where);
  c->node = 1;
  cl_check(L, CU(cuStreamUpdateCaptureDependencies, s->h, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES), where);
  if (cl_capture_push_keep(L, s)) {   /* the graph made of it runs on the conditional lane */
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, CL_CAPTURE_CONDS);
    lua_pop(L, 1);
  }
  for (int i = 0; i < size; i++) capture_body(L, s, p.conditional.phGraph_out[i], first + i, where);
  return 0;
}

/* s:if_then(cond, fn), s:if_else(cond, fn_then, fn_else), s:while_loop(cond, fn) (fn runs
   while the condition is not 0, tested before each run), s:switch(cond, {fn1, fn2, ...}) (fn
   k + 1 when it is k) */
static int s_if_then(lua_State *L) { return cond_capture(L, CU_GRAPH_COND_TYPE_IF, 1, 0, "stream:if_then"); }
static int s_if_else(lua_State *L) { return cond_capture(L, CU_GRAPH_COND_TYPE_IF, 2, 0, "stream:if_else"); }
static int s_while_loop(lua_State *L) { return cond_capture(L, CU_GRAPH_COND_TYPE_WHILE, 1, 0, "stream:while_loop"); }
static int s_switch(lua_State *L) { return cond_capture(L, CU_GRAPH_COND_TYPE_SWITCH, 0, 1, "stream:switch"); }

void cl_open_capture(lua_State *L) {
  /* capture methods join the stream's method table */
  static const luaL_Reg m[] = {
    {"begin_capture", s_begin_capture}, {"end_capture", s_end_capture}, {"is_capturing", s_is_capturing},
    {"condition", s_condition}, {"if_then", s_if_then}, {"if_else", s_if_else},
    {"while_loop", s_while_loop}, {"switch", s_switch}, {NULL, NULL}};
  lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.stream.methods");
  luaL_setfuncs(L, m, 0);
  lua_pop(L, 1);
}
