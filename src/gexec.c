/* gexec.c: executable graphs (cudalua.graph_exec), made from a graph by graph:instantiate
   and graph:launch, which this file adds to the graph's methods (graph.c is below it: a graph
   knows nothing of what is made from it). An executable graph keeps its graph (its user value
   1) and everything given to its setters (its keep set), and holds their memory, so nothing a
   launch touches is freed. Graphs with conditional nodes are launched on their device's
   conditional lane (the comment above lanes says why). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

#define EXEC_MT "cudalua.graph_exec"

typedef struct lexec {
  CUgraphExec e;
  cl_hostrec **recs;   /* the records of the graph it was made (or updated) from */
  int nrecs;
  int updated;         /* exec:update took another graph (exec:set_host refuses then) */
  CUcontext ctx;
  cl_hold hold;        /* its graph's blocks and those given since: each launch uses them */
  int conds;           /* launched on its device's conditional lane (see cond_launch) */
  CUevent lane_ev[2];  /* that launch's order: the stream's work before it, the graph done */
  CUstream lane;       /* its device's conditional lane, found at its first launch */
} lexec;

/* an executable graph's user values: 1 its graph, EXEC_KEEP its keep set; and a graph's user
   value GRAPH_EXEC (graph.c's cl_push_graph makes it): the executable graph g:launch made */
enum { EXEC_KEEP = 2 };
enum { GRAPH_EXEC = 2 };

static lexec *checkexec(lua_State *L, int idx) {
  lexec *e = cl_checkudata(L, idx, EXEC_MT);
  if (!e->e) cl_argerror(L, idx, "closed executable graph");
  return e;
}

/* keeps the value at idx alive with the executable graph at eidx, and holds its memory */
static void keep(lua_State *L, int eidx, int idx) {
  cl_graph_keep(L, eidx, EXEC_KEEP, &((lexec *)lua_touserdata(L, eidx))->hold, idx);
}

/* an executable graph arms the host nodes of the graph it was made or updated from */
static void exec_take_recs(lua_State *L, lexec *e, const cl_graph *g) {
  cl_hostrec **v = NULL;
  if (g->nrecs && !(v = malloc(sizeof *v * (size_t)g->nrecs))) cl_error(L, NULL, "out of host memory");
  if (g->nrecs) memcpy(v, g->recs, sizeof *v * (size_t)g->nrecs);
  free(e->recs);
  e->recs = v;
  e->nrecs = g->nrecs;
}

/* what the driver would take but cannot run right: a body is launched by its node, a graph
   allocation must be freed in the graph (else the second launch fails), an empty body would
   loop forever or do nothing */
static void instantiate_check(lua_State *L, cl_graph *g, const char *where) {
  if (g->body) cl_error(L, where, "a %s node's body runs as part of its graph: instantiate that graph", g->body);
  if (g->nalloc > 0)
    cl_error(L, where, "%d array%s from graph:alloc %s not freed in the graph (add graph:free(array, deps) after the last use)",
             g->nalloc, g->nalloc == 1 ? "" : "s", g->nalloc == 1 ? "is" : "are");
  for (int i = 0; i < g->nbodies; i++) {
    size_t n = 0;
    cl_check(L, CU(cuGraphGetNodes, g->bodies[i]->g, NULL, &n), where);
    if (!n) cl_error(L, where, "the body of a %s node is empty (fill it: body:kernel(...))", g->bodies[i]->body);
  }
}

/* Dynamic parallelism: children launched by a kernel node that ends its graph are not waited
   for by the graph (measured on an H100, driver 580, with spec 36's parent: one replay and a
   stream sync left most children's elements unwritten, written only by a later
   cuda.synchronize(); three replays lost them for good, in 32 to 36 of 40 runs; the same parent
   launched plainly, or followed in its graph by a kernel or memset node, lost none; an empty
   node after it did not help). So on a device where code using the device runtime is loaded
   (module.c), the graph is instantiated (and updated) with a 1-byte memset node after its
   last nodes, added to it for that call only: the graph the user holds, its nodes and their
   handles (the executable graph's setters take them) stay as they were. The memset's
   destination is a scratch byte of the device's, freed with the lanes. */
static pthread_mutex_t lanes_mu = PTHREAD_MUTEX_INITIALIZER;   /* the lanes and the scratch bytes */
static CUdeviceptr scratch[CL_MAXDEV];
static CUcontext scratch_ctx[CL_MAXDEV];

static CUdeviceptr scratch_of(CUcontext ctx) {
  int dev = cl_device_of(ctx);
  if (dev < 0 || dev >= CL_MAXDEV) return 0;
  pthread_mutex_lock(&lanes_mu);
  if (!scratch[dev]) {
    CUcontext prev = cl_ctx_swap(ctx);
    if (CU0(cuMemAlloc, &scratch[dev], 4) != CUDA_SUCCESS) scratch[dev] = 0;
    else scratch_ctx[dev] = ctx;
    cl_ctx_swap(prev);
  }
  CUdeviceptr p = scratch[dev];
  pthread_mutex_unlock(&lanes_mu);
  return p;
}

/* the tail after every node without dependents; NULL where none is needed (or none could be
   added: the graph is then instantiated as it is) */
static CUgraphNode add_tail(lua_State *L, cl_graph *g) {
  if (!cl_module_devrt_loaded(g->ctx)) return NULL;
  size_t n = 0;
  if (CU(cuGraphGetNodes, g->g, NULL, &n) != CUDA_SUCCESS || n == 0) return NULL;
  CUgraphNode *v = malloc(n * sizeof *v);
  CUdeviceptr dst = scratch_of(g->ctx);
  CUgraphNode tail = NULL;
  size_t sinks = 0;
  if (v && dst && CU(cuGraphGetNodes, g->g, v, &n) == CUDA_SUCCESS) {
    for (size_t i = 0; i < n; i++) {
      size_t deps = 0;
      if (CU(cuGraphNodeGetDependentNodes, v[i], NULL, NULL, &deps) == CUDA_SUCCESS && deps == 0) v[sinks++] = v[i];
    }
    CUDA_MEMSET_NODE_PARAMS p = {.dst = dst, .value = 0, .elementSize = 1, .width = 1, .height = 1};
    if (CU(cuGraphAddMemsetNode, &tail, g->g, v, sinks, &p, g->ctx) != CUDA_SUCCESS) tail = NULL;
  }
  free(v);
  return tail;
}

static void drop_tail(lua_State *L, CUgraphNode tail) {
  if (tail) CU(cuGraphDestroyNode, tail);
}

/* the executable graph of the graph g at 1, pushed; errors name where */
static lexec *instantiate(lua_State *L, cl_graph *g, const char *where) {
  instantiate_check(L, g, where);
  lexec *e = lua_newuserdatauv(L, sizeof *e, 2);
  memset(e, 0, sizeof *e);
  luaL_setmetatable(L, EXEC_MT);
  lua_pushvalue(L, 1); lua_setiuservalue(L, -2, 1);
  lua_newtable(L); lua_setiuservalue(L, -2, EXEC_KEEP);
  e->ctx = g->ctx;
  cl_use_ctx(L, g->ctx);
  exec_take_recs(L, e, g);
  cl_hold_merge(L, &e->hold, &g->hold);
  e->conds = g->conds;
  CUgraphNode tail = add_tail(L, g);
  CUresult r = CU(cuGraphInstantiate, &e->e, g->g, 0);
  drop_tail(L, tail);
  cl_check(L, r, where);
  return e;
}

static int g_instantiate(lua_State *L) {
  instantiate(L, cl_checkgraph(L, 1), "graph:instantiate");
  return 1;
}

/* Graphs with conditional nodes run one at a time on each device. The driver this was
   measured with (580.159.04, H100) fails the context (CUDA_ERROR_LAUNCH_FAILED, at a later
   call) when two of them run at once on different streams, in plain CUDA C too: new WHILE
   graphs launched on two or three streams, 17 to 380 graphs in. Ordered through one
   stream, the same 1500 graphs ran clean. So such a graph is launched on its device's
   conditional lane (a non-blocking stream cudalua owns), after the stream's earlier work and
   before its later work, through two events of its own: a stream's order is kept, and
   conditional graphs of every stream and state of the process queue behind each other. In
   a stream capture it is launched into the capture as it is (a child graph there). */
static CUstream lanes[CL_MAXDEV];
static CUcontext lane_ctx[CL_MAXDEV];

static CUresult lane_of(CUcontext ctx, CUstream *out) {
  int dev = cl_device_of(ctx);
  if (dev < 0 || dev >= CL_MAXDEV) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lanes_mu);
  CUresult r = CUDA_SUCCESS;
  if (!lanes[dev]) {
    CUcontext prev = cl_ctx_swap(ctx);
    r = CU0(cuStreamCreate, &lanes[dev], CU_STREAM_NON_BLOCKING);   /* (not parked: under the lock) */
    cl_ctx_swap(prev);
    lane_ctx[dev] = ctx;
  }
  *out = lanes[dev];
  pthread_mutex_unlock(&lanes_mu);
  return r;
}

void cl_gexec_shutdown(void) {
  pthread_mutex_lock(&lanes_mu);
  for (int d = 0; d < CL_MAXDEV; d++) {
    if (!lanes[d]) continue;
    CUcontext prev = cl_ctx_swap(lane_ctx[d]);
    CU0(cuStreamDestroy, lanes[d]);
    cl_ctx_swap(prev);
    lanes[d] = NULL;
    lane_ctx[d] = NULL;
  }
  for (int d = 0; d < CL_MAXDEV; d++) {
    if (!scratch[d]) continue;
    CUcontext prev = cl_ctx_swap(scratch_ctx[d]);
    CU0(cuMemFree, scratch[d]);
    cl_ctx_swap(prev);
    scratch[d] = 0;
  }
  pthread_mutex_unlock(&lanes_mu);
}

static CUresult cond_launch(lua_State *L, lexec *e, CUstream h) {
  /* (the lane and the events once per executable graph: not a lock at every launch) */
  CUresult r = e->lane ? CUDA_SUCCESS : lane_of(e->ctx, &e->lane);
  CUstream lane = e->lane;
  for (int i = 0; i < 2 && r == CUDA_SUCCESS; i++)
    if (!e->lane_ev[i]) r = CU(cuEventCreate, &e->lane_ev[i], CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) r = CU(cuEventRecord, e->lane_ev[0], h);
  if (r == CUDA_SUCCESS) r = CU(cuStreamWaitEvent, lane, e->lane_ev[0], 0);
  if (r == CUDA_SUCCESS) r = CU(cuGraphLaunch, e->e, lane);
  if (r == CUDA_SUCCESS) r = CU(cuEventRecord, e->lane_ev[1], lane);
  if (r == CUDA_SUCCESS) r = CU(cuStreamWaitEvent, h, e->lane_ev[1], 0);
  return r;
}

static CUresult graph_launch(lua_State *L, lexec *e, cl_stream *s) {
  CUstream h = s ? s->h : NULL;
  if (!e->conds || (cl_capturing && s && cl_capture_id(L, s))) return CU(cuGraphLaunch, e->e, h);
  return cond_launch(L, e, h);
}

/* launches e (its object on the stack meanwhile) on the stream at sidx; errors name where */
static void exec_launch(lua_State *L, lexec *e, int sidx, const char *where) {
  cl_stream *s = cl_stream_arg(L, sidx, e->ctx, where, "graph");
  cl_capture_guard(L, s, 0, where);
  CUstream h = s ? s->h : NULL;
  if (!e->nrecs) {
    CL_BEFORE_ENQUEUE(L, where);
    cl_check(L, graph_launch(L, e, s), where);
    cl_mem_use_n(L, e->hold.v, e->hold.n, s, e->ctx);   /* (in a capture: a child node) */
    return;
  }
  /* host nodes launched into a capture would be armed here and never fire */
  if (cl_capturing && cl_capture_push_keep(L, s))
    cl_error(L, where, "a graph with Lua host functions cannot be launched into a stream capture");
  CL_BEFORE_ENQUEUE(L, where);   /* before this launch's own host nodes are armed */
  /* where the launch blocks, the host nodes run meanwhile (on the helper thread): the stream
     object stays on the stack and a close inside them is put off */
  int token = cl_host_graph_begin(L, e->recs, e->nrecs, e->ctx, h, where);
  CUresult r = graph_launch(L, e, s);   /* blocking launches wait */
  cl_host_graph_end(L, e->recs, e->nrecs, token, h, r == CUDA_SUCCESS, where);
  cl_check(L, r, where);
  cl_mem_use_n(L, e->hold.v, e->hold.n, s, e->ctx);
  cl_host_after_enqueue(L, h, where);
}

static int e_launch(lua_State *L) {
  exec_launch(L, checkexec(L, 1), 2, "graph_exec:launch");
  lua_settop(L, 1);
  return 1;
}

static int e_upload(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_stream *s = cl_stream_arg(L, 2, e->ctx, "graph_exec:upload", "graph");
  cl_check(L, CU(cuGraphUpload, e->e, s ? s->h : NULL), "graph_exec:upload");
  lua_settop(L, 1);
  return 1;
}

/* the graph an executable graph was made from (exec:update does not change it) */
static cl_graph *exec_graph(lua_State *L, int eidx) {
  lua_getiuservalue(L, eidx, 1);
  cl_graph *g = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return g;
}

/* the node at 2 for the setter where of the executable graph at 1: a node of its graph, of the
   kind the setter changes */
static cl_node *exec_node(lua_State *L, int kind, const char *where) {
  cl_node *n = cl_checknode(L, 2, NULL, where);
  if (n->owner != exec_graph(L, 1))
    cl_error(L, where, "the node is not from this executable graph's graph");
  if (kind < 0) return n;   /* the caller checks the kind */
  if (n->kind != kind && kind == CL_NODE_KERNEL)
    cl_error(L, where, "a %s node has no arguments", cl_node_kinds[n->kind]);
  if (n->kind != kind)
    cl_error(L, where, "expected a %s node, got a %s node", cl_node_kinds[kind], cl_node_kinds[n->kind]);
  return n;
}

/* exec:set_args(node, {args}) or exec:set_args(node, ...): new arguments for a kernel node,
   without instantiating again. The list form, as g:kernel takes them, is one plain table
   holding as many values as the kernel has parameters; anything else is the arguments
   themselves (a kernel of one complex parameter takes {re, im} either way: {{re, im}} or
   {re, im}) */
static int e_set_args(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, CL_NODE_KERNEL, "graph_exec:set_args");
  lua_getiuservalue(L, 2, 2);
  cl_kernel *k = cl_checkkernel(L, -1);
  int bare = 0;   /* a list without a metatable (a table with one is an argument) */
  if (lua_gettop(L) == 4 && lua_type(L, 3) == LUA_TTABLE) {
    bare = !lua_getmetatable(L, 3);
    if (!bare) lua_pop(L, 1);   /* (the metatable it pushed would have counted as an argument) */
  }
  if (bare && (int)lua_rawlen(L, 3) == k->nparams) {
    lua_insert(L, 3);   /* the kernel at 3, the list at 4: spread it after them */
    int len = (int)lua_rawlen(L, 4);
    luaL_checkstack(L, len + 8, "too many kernel arguments");
    for (int i = 1; i <= len; i++) lua_rawgeti(L, 4, i);
    lua_remove(L, 4);
    lua_pushvalue(L, 3);   /* the kernel on top again */
    lua_remove(L, 3);
  }
  int kidx = lua_gettop(L);
  int first = 3, nargs = kidx - 3;
  cl_args A;
  cl_marshal(L, k, kidx, first, nargs, &A, 0);
  cl_graph_own_args(L, exec_graph(L, 1), &A, first, nargs, "graph_exec:set_args");
  /* after the arguments: a foreign array's view may have made the selected device current */
  cl_use_ctx(L, e->ctx);
  CUDA_KERNEL_NODE_PARAMS p;
  cl_graph_kernel_params(n, k, &A, &p);
  cl_check(L, CU(cuGraphExecKernelNodeSetParams, e->e, n->n, &p), "graph_exec:set_args");
  /* (numbers, strings and {re, im} pairs not kept: set_args in a loop grew the keep set) */
  cl_graph_keep_args(L, 1, EXEC_KEEP, &e->hold, &A, first, nargs);
  lua_settop(L, 1);
  return 1;
}

/* exec:set_memcpy(node, dst, src) */
static int e_set_memcpy(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, CL_NODE_MEMCPY, "graph_exec:set_memcpy");
  CUDA_MEMCPY3D p;
  cl_use_ctx(L, e->ctx);
  cl_graph_memcpy_params(L, 3, 4, &p, "graph_exec:set_memcpy", e->ctx, exec_graph(L, 1));
  cl_check(L, CU(cuGraphExecMemcpyNodeSetParams, e->e, n->n, &p, e->ctx), "graph_exec:set_memcpy");
  keep(L, 1, 3); keep(L, 1, 4);
  lua_settop(L, 1);
  return 1;
}

/* exec:set_memset(node, dst, value) */
static int e_set_memset(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, CL_NODE_MEMSET, "graph_exec:set_memset");
  CUDA_MEMSET_NODE_PARAMS p[CL_MAXITEM / 4];
  cl_use_ctx(L, e->ctx);
  if (cl_graph_memset_params(L, 3, 4, p, "graph_exec:set_memset", e->ctx, exec_graph(L, 1)) != 1 || n->parts != 1)
    return cl_error(L, "graph_exec:set_memset", "8 and 16-byte elements are several memsets; build the graph again");
  cl_check(L, CU(cuGraphExecMemsetNodeSetParams, e->e, n->n, &p[0], e->ctx), "graph_exec:set_memset");
  keep(L, 1, 3);
  lua_settop(L, 1);
  return 1;
}

/* exec:update(graph): take a modified graph of the same shape, where the driver allows */
static int e_update(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_graph *g = cl_checkgraph(L, 2);
  CUgraphExecUpdateResultInfo info;
  memset(&info, 0, sizeof info);
  cl_use_ctx(L, e->ctx);
  CUgraphNode tail = add_tail(L, g);
  CUresult r = CU(cuGraphExecUpdate, e->e, g->g, &info);
  drop_tail(L, tail);
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
    static const char *why[] = {"ok", "error", "topology changed", "node type changed",
      "kernel function changed", "parameters changed unsupportedly", "not supported",
      "unsupported function change", "attributes changed"};
    int w = (int)info.result;
    return cl_error(L, "graph_exec:update", "the driver cannot update this executable graph (%s): instantiate the graph again",
                      w >= 0 && w < (int)(sizeof why / sizeof why[0]) ? why[w] : "unknown reason");
  }
  cl_check(L, r, "graph_exec:update");
  keep(L, 1, 2);
  exec_take_recs(L, e, g);
  e->updated = 1;
  e->conds |= g->conds;
  lua_settop(L, 1);
  return 1;
}

/* exec:enable(node, on): a kernel, memcpy or memset node skipped (false) or run again (true)
   by later launches, without instantiating again */
static int e_enable(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, -1, "graph_exec:enable");
  if (!lua_isboolean(L, 3)) return cl_error(L, "graph_exec:enable", "expected a boolean, got %s", luaL_typename(L, 3));
  if (n->kind != CL_NODE_KERNEL && n->kind != CL_NODE_MEMCPY && n->kind != CL_NODE_MEMSET)
    return cl_error(L, "graph_exec:enable", "only kernel, memcpy and memset nodes can be turned off, not a %s node", cl_node_kinds[n->kind]);
  if (n->parts > 1)
    return cl_error(L, "graph_exec:enable", "a memset of 8 or 16-byte elements is several nodes and cannot be turned off");
  cl_use_ctx(L, e->ctx);
  cl_check(L, CU(cuGraphNodeSetEnabled, e->e, n->n, (unsigned)lua_toboolean(L, 3)), "graph_exec:enable");
  lua_settop(L, 1);
  return 1;
}

/* exec:set_host(node, fn): the host node calls fn at later launches. The old record stays
   kept (a launch queued before may still call it); this executable graph arms the new one */
static int e_set_host(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, CL_NODE_HOST, "graph_exec:set_host");
  cl_checktype(L, 3, LUA_TFUNCTION);
  lua_settop(L, 3);
  cl_use_ctx(L, e->ctx);
  /* after exec:update the node's record is the other graph's, which cannot be read back */
  if (e->updated)
    return cl_error(L, "graph_exec:set_host", "the executable graph was updated from another graph: instantiate again");
  lua_getiuservalue(L, 1, EXEC_KEEP);   /* 4: its keep set, and driver node -> record box */
  cl_hostrec *old = NULL;
  if (lua_rawgetp(L, 4, n->n) == LUA_TUSERDATA) old = cl_hostrec_of_box(L, -1);
  lua_pop(L, 1);
  CUDA_BATCH_MEM_OP_NODE_PARAMS p;
  cl_check(L, CU(cuGraphBatchMemOpNodeGetParams, n->n, &p), "graph_exec:set_host");
  if (!old) old = cl_hostrec_at(p.paramArray[0].writeValue.address);
  cl_hostrec *r = cl_hostrec_new(L, 3, "graph_exec:set_host");   /* its box at 5 */
  CUstreamBatchMemOpParams op[2];
  cl_hostrec_ops(r, op);
  p.paramArray = op;
  cl_check(L, CU(cuGraphExecBatchMemOpNodeSetParams, e->e, n->n, &p), "graph_exec:set_host");
  keep(L, 1, 5);
  lua_pushvalue(L, 5);
  lua_rawsetp(L, 4, n->n);
  for (int i = 0; i < e->nrecs; i++) if (e->recs[i] == old) e->recs[i] = r;
  lua_settop(L, 1);
  return 1;
}

/* exec:set_child(node, graph): a child node runs a copy of graph (of the same shape) */
static int e_set_child(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, CL_NODE_CHILD, "graph_exec:set_child");
  cl_graph *c = cl_checkgraph(L, 3);
  /* its host nodes' records would be shared with the graph itself: arming them cannot tell
     the two apart */
  if (c->nrecs)
    return cl_error(L, "graph_exec:set_child", "a graph with Lua host functions cannot replace a child: instantiate again");
  /* and the child's own would be armed at each launch and never called: a hang */
  if (n->hosts)
    return cl_error(L, "graph_exec:set_child", "the child node calls Lua host functions, so it cannot be replaced: instantiate again");
  cl_use_ctx(L, e->ctx);
  cl_check(L, CU(cuGraphExecChildGraphNodeSetParams, e->e, n->n, c->g), "graph_exec:set_child");
  keep(L, 1, 3);
  if (cl_graph_top(c)->conds) e->conds = 1;
  lua_settop(L, 1);
  return 1;
}

/* exec:set_event(node, event): a record or wait node's event at later launches */
static int e_set_event(lua_State *L) {
  lexec *e = checkexec(L, 1);
  cl_node *n = exec_node(L, -1, "graph_exec:set_event");
  if (n->kind != CL_NODE_RECORD && n->kind != CL_NODE_WAIT)
    return cl_error(L, "graph_exec:set_event", "expected a record or wait node, got a %s node", cl_node_kinds[n->kind]);
  CUevent ev = cl_graph_event(L, 3, e->ctx, n->kind == CL_NODE_RECORD, "graph_exec:set_event");
  cl_use_ctx(L, e->ctx);
  cl_check(L, n->kind == CL_NODE_RECORD ? CU(cuGraphExecEventRecordNodeSetEvent, e->e, n->n, ev)
                                  : CU(cuGraphExecEventWaitNodeSetEvent, e->e, n->n, ev), "graph_exec:set_event");
  keep(L, 1, 3);
  lua_settop(L, 1);
  return 1;
}

static void destroy_exec(lua_State *L, void *h, void *ctx) {
  CUcontext prev = cl_ctx_swap(ctx);
  CU(cuGraphExecDestroy, (CUgraphExec)h);   /* a launch still running keeps its resources until it completes */
  cl_ctx_swap(prev);
}

static void destroy_event(lua_State *L, void *ev, void *unused) {
  (void)unused;
  CU(cuEventDestroy, (CUevent)ev);   /* (recorded work pending is fine: the driver finishes it) */
}

static void close_exec(lua_State *L, lexec *e) {
  if (e->e) {
    /* inside a host function the cudalua call it runs in may be launching this very graph */
    if (!(cl_must_defer(L) && cl_defer_call(L, 0, destroy_exec, e->e, e->ctx))) destroy_exec(L, e->e, e->ctx);
    e->e = NULL;
  }
  for (int i = 0; i < 2; i++) {
    if (e->lane_ev[i] && !(cl_must_defer(L) && cl_defer_call(L, 0, destroy_event, e->lane_ev[i], NULL)))
      destroy_event(L, e->lane_ev[i], NULL);
    e->lane_ev[i] = NULL;
  }
  cl_hold_release(L, &e->hold);   /* freed after its launches: they marked the blocks used */
}

static int e_close(lua_State *L) {
  close_exec(L, cl_checkudata(L, 1, EXEC_MT));
  return 0;
}

static int e_gc(lua_State *L) {
  lexec *e = cl_checkudata(L, 1, EXEC_MT);
  e_close(L);
  cl_graph_free_recs(&e->recs, &e->nrecs);
  return 0;
}

static int e_tostring(lua_State *L) {
  lexec *e = cl_checkudata(L, 1, EXEC_MT);
  lua_pushstring(L, e->e ? "cudalua.graph_exec" : "cudalua.graph_exec<closed>");
  return 1;
}

/* g:launch([stream]): the seed's short form of g:instantiate():launch(stream). The executable
   graph is kept with the graph and made again only when nodes or dependencies were added since
   (a new node changes the topology, which cuGraphExecUpdate would refuse anyway) */
static int g_launch(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  lua_settop(L, 2);
  lexec *e = NULL;
  if (lua_getiuservalue(L, 1, GRAPH_EXEC) == LUA_TUSERDATA && g->launched == g->version) e = lua_touserdata(L, 3);
  if (!e) {
    /* a graph with memory or conditional nodes has one executable graph at a time */
    lexec *old = lua_touserdata(L, 3);
    if (old) close_exec(L, old);
    lua_pop(L, 1);
    cl_use_ctx(L, g->ctx);
    e = instantiate(L, g, "graph:launch");
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, 1, GRAPH_EXEC);
    g->launched = g->version;
  }
  exec_launch(L, e, 2, "graph:launch");
  lua_settop(L, 1);
  return 1;
}

void cl_open_gexec(lua_State *L) {
  static const luaL_Reg em[] = {
    {"launch", e_launch}, {"upload", e_upload}, {"set_args", e_set_args},
    {"set_memcpy", e_set_memcpy}, {"set_memset", e_set_memset}, {"update", e_update},
    {"enable", e_enable}, {"set_host", e_set_host}, {"set_child", e_set_child},
    {"set_event", e_set_event}, {"close", e_close}, {NULL, NULL}};
  static const luaL_Reg emeta[] = {
    {"__gc", e_gc}, {"__close", e_close}, {"__tostring", e_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){EXEC_MT, em, NULL, emeta, NULL});
  /* the graph's methods that make executable graphs join its method table (graph.c) */
  static const luaL_Reg gm[] = {{"instantiate", g_instantiate}, {"launch", g_launch}, {NULL, NULL}};
  lua_getfield(L, LUA_REGISTRYINDEX, CL_GRAPH_MT ".methods");
  luaL_setfuncs(L, gm, 0);
  lua_pop(L, 1);
}
