/* graph.c: CUDA graphs. Explicit graphs are built node by node (kernel, memcpy, memset, host,
   empty, child) with dependencies; stream capture turns queued work into a graph. A graph
   keeps every Lua object its nodes use (arrays, kernels, host functions, child graphs) in its
   user value, and an executable graph keeps its graph, so nothing a replay touches is freed. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

#define GRAPH_MT "cudalua.graph"
#define NODE_MT "cudalua.graph_node"
#define EXEC_MT "cudalua.graph_exec"

/* A Lua host node is a memop node (write, then wait: hostfn.c) with a record of its own; the
   record's box is kept in the graph's user value. */
typedef struct lgraph {
  CUgraph g;
  CUcontext ctx;       /* its device's: nodes, instantiation and launches are there */
  cl_hostrec **recs;   /* its Lua host nodes' records, children's copies included: each
                          launch of an executable graph made from it arms them */
  int nrecs, caprecs;
  unsigned version;    /* bumped by every node and dependency added: g:launch's executable
                          graph is made again when it differs from launched */
  unsigned launched;
  uint64_t origin;     /* a clone: the id of the graph it was cloned from (graph:find) */
  uint64_t id;         /* never reused: what a condition or a graph allocation names */
  struct lgraph *parent;   /* a conditional node's body: the graph holding the node (kept by
                              the body's keep set; the driver owns the body's CUgraph) */
  const char *body;    /* a body: its node's kind ("while_loop"...), NULL for a graph */
  struct lgraph **bodies;  /* a graph's bodies, theirs included, checked at instantiation */
  int nbodies;
  int nalloc;          /* graph:alloc arrays not yet given to graph:free */
  cl_hold hold;        /* the blocks of its nodes' arrays, its bodies' and children's included
                          (empty in a body: they are its top graph's) */
  int conds;           /* it has conditional nodes, or a child that has (see cond_launch) */
} lgraph;

enum { N_KERNEL, N_MEMCPY, N_MEMSET, N_HOST, N_EMPTY, N_CHILD, N_ALLOC, N_FREE, N_RECORD, N_WAIT, N_COND };
static const char *node_kinds[] = {"kernel", "memcpy", "memset", "host", "empty", "child", "alloc",
  "free", "record", "wait", "conditional"};

typedef struct lnode {
  CUgraphNode n;
  lgraph *owner;
  int kind;
  unsigned g[3], b[3], shared;   /* kernel nodes */
  int parts;                     /* memset nodes: one driver node per 4-byte word of 8 and 16-byte elements */
  int hosts;                     /* child nodes: whether the child calls Lua host functions */
} lnode;

/* ids of graphs: above any capture id, so that the two never meet in cl_mem.graph */
static uint64_t next_id = (uint64_t)1 << 62;

/* the graph at the top of g's bodies */
static lgraph *top_of(lgraph *g) { while (g->parent) g = g->parent; return g; }

/* whether g is the graph with id, or a body inside it */
static int within(const lgraph *g, uint64_t id) {
  for (; g; g = g->parent) if (g->id == id) return 1;
  return 0;
}

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

static lgraph *checkgraph(lua_State *L, int idx) {
  lgraph *g = cl_checkudata(L, idx, GRAPH_MT);
  if (!g->g || !top_of(g)->g) cl_argerror(L, idx, "closed graph");
  return g;
}

static lexec *checkexec(lua_State *L, int idx) {
  lexec *e = cl_checkudata(L, idx, EXEC_MT);
  if (!e->e) cl_argerror(L, idx, "closed executable graph");
  return e;
}

/* a node of graph g (at gidx) that is still alive */
static lnode *checknode(lua_State *L, int idx, lgraph *g, const char *where) {
  lnode *n = luaL_testudata(L, idx, NODE_MT);
  if (!n) cl_error(L, where, "expected a graph node, got %s", luaL_typename(L, idx));
  lgraph *owner = n->owner;   /* set by push_node; the node's user value 1 keeps it alive */
  if (!owner || !owner->g || !top_of(owner)->g || !n->n) cl_error(L, where, "the node's graph is closed");
  if (g && owner != g) cl_error(L, where, "the node belongs to another graph");
  return n;
}

/* the user value holding a graph's keep set, and an executable graph's (its 1 is its graph) */
enum { GRAPH_KEEP = 1, EXEC_KEEP = 2 };   /* a graph's and an executable graph's keep tables */
enum { GRAPH_EXEC = 2 };                   /* a graph's user value: the executable g:launch made */

/* keeps the value at idx alive with the graph or executable graph at uidx, in its keep set
   (user value uv): keeping the same object again, set_args in a loop say, does not grow it */
static void keep(lua_State *L, int uidx, int uv, int idx) {
  idx = lua_absindex(L, idx);
  lua_getiuservalue(L, uidx, uv);
  cl_keep(L, -1, idx);
  lua_pop(L, 1);
  if (lua_type(L, idx) != LUA_TUSERDATA) return;
  /* and holds its memory: an array's block, or what a graph (a child, an update) holds */
  cl_hold *h = uv == GRAPH_KEEP ? &top_of(lua_touserdata(L, uidx))->hold : &((lexec *)lua_touserdata(L, uidx))->hold;
  cl_array *a = cl_toarray(L, idx);
  lgraph *c = a ? NULL : luaL_testudata(L, idx, GRAPH_MT);
  if (a) cl_hold_add(L, h, a->mem);
  else if (c) cl_hold_merge(L, h, &top_of(c)->hold);
}

/* a captured graph (at gidx) holds the arrays its capture kept, and runs on its device's
   conditional lane if the capture made conditional nodes (stream:while_loop...) */
void cl_graph_hold_kept(lua_State *L, int gidx) {
  lgraph *g = lua_touserdata(L, gidx);
  lua_getiuservalue(L, gidx, GRAPH_KEEP);
  g->conds = lua_getfield(L, -1, CL_CAPTURE_CONDS) != LUA_TNIL;
  lua_pop(L, 1);
  for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) {
    cl_array *a = lua_type(L, -2) == LUA_TUSERDATA ? cl_toarray(L, -2) : NULL;
    if (a) cl_hold_add(L, &g->hold, a->mem);
  }
  lua_pop(L, 1);
}

/* deps at idx: nil or a list of nodes of g -> CUgraphNode array: the caller's small[SMALL_DEPS]
   for a few (graphs are built node by node in loops), else a userdata. Pushes one value. */
#define SMALL_DEPS 8
static CUgraphNode *deps_of(lua_State *L, int idx, lgraph *g, size_t *n, const char *where,
                            CUgraphNode *small) {
  *n = 0;
  if (lua_isnoneornil(L, idx)) { lua_pushnil(L); return NULL; }
  if (!lua_istable(L, idx)) cl_error(L, where, "dependencies must be a list of nodes, got %s", luaL_typename(L, idx));
  size_t k = lua_rawlen(L, idx);
  CUgraphNode *d = small;
  if (k <= SMALL_DEPS) lua_pushnil(L);
  else d = lua_newuserdatauv(L, sizeof(CUgraphNode) * k, 0);
  for (size_t i = 0; i < k; i++) {
    lua_rawgeti(L, idx, (lua_Integer)i + 1);
    d[i] = checknode(L, -1, g, where)->n;
    lua_pop(L, 1);
  }
  *n = k;
  return d;
}

static lnode *push_node(lua_State *L, int gidx, int kind) {
  lnode *n = lua_newuserdatauv(L, sizeof *n, 2);
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->owner = lua_touserdata(L, gidx);
  top_of(n->owner)->version++;   /* (only the top graph's is read: a body's node changes it too) */
  luaL_setmetatable(L, NODE_MT);
  lua_pushvalue(L, gidx);
  lua_setiuservalue(L, -2, 1);
  return n;
}

static void destroy_graph(lua_State *L, void *g, void *unused) {
  (void)unused;
  CU(cuGraphDestroy, (CUgraph)g);
}

static int graph_close(lua_State *L) {
  lgraph *g = cl_checkudata(L, 1, GRAPH_MT);
  if (g->body) return 0;   /* the driver's, gone with its graph */
  if (g->g) {
    /* executable graphs made from it are independent of it; inside a host function (a
       collection there) the driver is not called */
    if (!(cl_in_hostfn && cl_defer_call(L, 0, destroy_graph, g->g, NULL))) destroy_graph(L, g->g, NULL);
    g->g = NULL;
  }
  cl_hold_release(L, &g->hold);   /* executable graphs made from it hold their own */
  /* the host nodes' records may be used by executable graphs: they hold this object, so the
     records (owned by boxes in its user value) go with the collector */
  return 0;
}

/* a graph's or an executable graph's list of host-node records, gone with its object */
static void free_recs(cl_hostrec ***recs, int *n) {
  free(*recs);
  *recs = NULL;
  *n = 0;
}

static int graph_gc(lua_State *L) {
  lgraph *g = cl_checkudata(L, 1, GRAPH_MT);
  graph_close(L);
  free_recs(&g->recs, &g->nrecs);
  g->caprecs = 0;
  free(g->bodies);
  g->bodies = NULL;
  g->nbodies = 0;
  return 0;
}

void cl_graph_add_hostrec(lua_State *L, int gidx, cl_hostrec *r) {
  lgraph *g = lua_touserdata(L, gidx);
  if (g->nrecs == g->caprecs) {
    int cap = g->caprecs ? 2 * g->caprecs : 4;
    cl_hostrec **v = realloc(g->recs, sizeof *v * (size_t)cap);
    if (!v) cl_error(L, NULL, "out of host memory");
    g->recs = v; g->caprecs = cap;
  }
  g->recs[g->nrecs++] = r;
}

void *cl_push_graph(lua_State *L, CUgraph h, CUcontext ctx) {
  lgraph *g = lua_newuserdatauv(L, sizeof *g, 2);
  memset(g, 0, sizeof *g);
  g->ctx = ctx;
  luaL_setmetatable(L, GRAPH_MT);
  lua_newtable(L);
  lua_setiuservalue(L, -2, GRAPH_KEEP);
  g->g = h;
  g->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
  return g;
}

/* cuda.graph() */
static int l_graph(lua_State *L) {
  if (!lua_isnone(L, 1)) return cl_error(L, "cuda.graph", "takes no arguments, got %s", luaL_typename(L, 1));
  CUcontext ctx = cl_ctx(L);
  CUgraph h;
  cl_check(L, CU(cuGraphCreate, &h, 0), "cuda.graph");
  cl_push_graph(L, h, ctx);
  return 1;
}

/* pushes the elements of the args table onto the stack; returns their first index and count */
static int push_args(lua_State *L, int idx, int *n) {
  if (lua_isnoneornil(L, idx)) { *n = 0; return lua_gettop(L) + 1; }
  cl_checktype(L, idx, LUA_TTABLE);
  *n = (int)lua_rawlen(L, idx);
  luaL_checkstack(L, *n + 8, "too many kernel arguments");
  int first = lua_gettop(L) + 1;
  for (int i = 1; i <= *n; i++) lua_rawgeti(L, idx, i);
  return first;
}

/* a graph allocation may be used by the graph that allocates it (its bodies included) */
static void own_mem(lua_State *L, const lgraph *g, const cl_mem *m, const char *where) {
  if ((m->gmem & CL_GMEM_KIND) == CL_GMEM_CAPTURED)
    cl_error(L, where, "the array was allocated in a stream capture: only that capture's work may use it");
  if ((m->gmem & CL_GMEM_KIND) == CL_GMEM_NODE && !within(g, m->graph))
    cl_error(L, where, "the array was allocated by another graph (graph:alloc)");
}

/* the conditions and graph allocations among a kernel node's arguments are g's */
static void own_args(lua_State *L, const lgraph *g, int first, int nargs, const char *where) {
  for (int i = 0; i < nargs; i++) {
    if (lua_type(L, first + i) != LUA_TUSERDATA) continue;
    cl_condition *c = luaL_testudata(L, first + i, CL_CONDITION_MT);
    if (c && !within(g, c->graph))
      cl_error(L, where, "argument %d is a condition of another graph (a kernel may set the conditions of its own graph and of the graphs around its body)", i + 1);
    cl_array *a = c ? NULL : cl_toarray(L, first + i);
    if (a && a->mem) own_mem(L, g, a->mem, where);
  }
}

static void kernel_params(lnode *n, cl_kernel *k, cl_args *A, CUDA_KERNEL_NODE_PARAMS *p) {
  memset(p, 0, sizeof *p);
  p->func = k->fn;
  p->gridDimX = n->g[0]; p->gridDimY = n->g[1]; p->gridDimZ = n->g[2];
  p->blockDimX = n->b[0]; p->blockDimY = n->b[1]; p->blockDimZ = n->b[2];
  p->sharedMemBytes = n->shared;
  p->kernelParams = A->params;
}

/* g:kernel(k, config, args, deps) */
static int g_kernel(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  cl_kernel *k = cl_checkkernel(L, 2);
  lua_settop(L, 5);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 5, g, &nd, "graph:kernel", small);   /* at 6 */
  lnode cfg;   /* the configuration, copied into the node once it is made */
  memset(&cfg, 0, sizeof cfg);
  cl_launch c;
  cl_launch_parse(L, 3, &c, CL_CFG_GRAPH, "graph:kernel");
  memcpy(cfg.g, c.g, sizeof cfg.g); memcpy(cfg.b, c.b, sizeof cfg.b); cfg.shared = c.shared;
  if (k->ctx != g->ctx)
    cl_error(L, "graph:kernel", "the kernel is on device %d and the graph on device %d (get the "
               "kernel from its module with device %d selected)", cl_device_of(k->ctx), cl_device_of(g->ctx),
               cl_device_of(g->ctx));
  int nargs, first = push_args(L, 4, &nargs);
  cl_args A;
  cl_marshal(L, k, 2, first, nargs, &A, 0);
  own_args(L, g, first, nargs, "graph:kernel");
  cl_use_ctx(L, g->ctx);
  cl_kernel_shared(L, k, 2, c.shared);   /* a function attribute: graph launches use it too */
  CUDA_KERNEL_NODE_PARAMS p;
  kernel_params(&cfg, k, &A, &p);
  CUgraphNode h = NULL;
  CUresult r = CU(cuGraphAddKernelNode, &h, g->g, deps, nd, &p);
  int added = r == CUDA_SUCCESS;
  /* cluster and cooperative launches are attributes of the node */
  CUkernelNodeAttrValue v;
  if (r == CUDA_SUCCESS && c.cluster[0]) {
    memset(&v, 0, sizeof v);
    v.clusterDim.x = c.cluster[0]; v.clusterDim.y = c.cluster[1]; v.clusterDim.z = c.cluster[2];
    r = CU(cuGraphKernelNodeSetAttribute, h, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v);
  }
  if (r == CUDA_SUCCESS && c.cooperative) {
    memset(&v, 0, sizeof v);
    v.cooperative = 1;
    r = CU(cuGraphKernelNodeSetAttribute, h, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v);
  }
  if (r != CUDA_SUCCESS) {
    if (added) CU(cuGraphDestroyNode, h);   /* added, its attributes refused */
    cl_error_named(L, "graph:kernel '%s': %s", cl_kernel_name(L, 2), cl_errname(r));
  }
  for (int i = 0; i < nargs; i++) keep(L, 1, GRAPH_KEEP, first + i);
  keep(L, 1, GRAPH_KEEP, 2);
  lnode *n = push_node(L, 1, N_KERNEL);
  memcpy(n->g, cfg.g, sizeof n->g); memcpy(n->b, cfg.b, sizeof n->b); n->shared = cfg.shared;
  n->n = h;
  lua_pushvalue(L, 2); lua_setiuservalue(L, -2, 2);   /* the kernel, for set_args */
  return 1;
}

/* the address an array has for copies in graphs: pageable memory is page-locked first */
static CUdeviceptr copy_addr(lua_State *L, cl_array *a, int idx, const char *where) {
  if (a->kind == CL_HOST) {
    if (cl_nbytes(a) && a->mem->registered != CL_REGISTERED) {   /* tried again if it failed before */
      CUresult r = CU(cuMemHostRegister, a->mem->host, a->mem->bytes, CU_MEMHOSTREGISTER_PORTABLE);
      if (r != CUDA_SUCCESS) cl_error(L, where, "cannot page-lock host array %d (%s): use a pinned array for graph copies", idx, cl_errname(r));
      a->mem->registered = CL_REGISTERED;
    }
    return (CUdeviceptr)(uintptr_t)cl_hostptr(a);
  }
  return cl_devptr(a);
}

static void memcpy_params(lua_State *L, int didx, int sidx, CUDA_MEMCPY3D *p, const char *where,
                          CUcontext ctx, const lgraph *g) {
  cl_array *d = cl_checkarray(L, didx), *s = cl_checkarray(L, sidx);
  cl_mem_reach(L, d->mem, ctx, where);
  cl_mem_reach(L, s->mem, ctx, where);
  if (d->dtype != s->dtype)
    cl_error(L, where, "dtype mismatch (%s into %s)", cl_dtypes[s->dtype].name, cl_dtypes[d->dtype].name);
  if (d->size != s->size)
    cl_error(L, where, "size mismatch (%I elements into %I)", (lua_Integer)s->size, (lua_Integer)d->size);
  if (d->readonly) cl_error(L, where, "destination is read-only");
  size_t n = cl_nbytes(d);
  if (n == 0) cl_error(L, where, "empty arrays");
  if (g) { own_mem(L, g, d->mem, where); own_mem(L, g, s->mem, where); }
  memset(p, 0, sizeof *p);
  p->srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  p->srcDevice = copy_addr(L, s, 2, where);
  p->dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  p->dstDevice = copy_addr(L, d, 1, where);
  p->WidthInBytes = n;
  p->Height = 1;
  p->Depth = 1;
}

/* g:memcpy(dst, src, deps) */
static int g_memcpy(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  lua_settop(L, 4);
  size_t nd;
  CUDA_MEMCPY3D p;
  CUcontext ctx = g->ctx;
  cl_use_ctx(L, ctx);
  memcpy_params(L, 2, 3, &p, "graph:memcpy", ctx, g);
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 4, g, &nd, "graph:memcpy", small);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemcpyNode, &h, g->g, deps, nd, &p, ctx), "graph:memcpy");
  keep(L, 1, GRAPH_KEEP, 2); keep(L, 1, GRAPH_KEEP, 3);
  lnode *n = push_node(L, 1, N_MEMCPY);
  n->n = h;
  return 1;
}

/* memset parameters: 1, 2 and 4-byte elements directly; 8 and 16-byte ones as one strided
   memset per 4-byte word; returns how many (p holds CL_MAXITEM / 4) */
static int memset_params(lua_State *L, int didx, int vidx, CUDA_MEMSET_NODE_PARAMS *p, const char *where,
                         CUcontext ctx, const lgraph *g) {
  cl_array *d = cl_checkarray(L, didx);
  cl_mem_reach(L, d->mem, ctx, where);
  if (d->kind == CL_HOST) cl_error(L, where, "a pageable host array cannot be set by the GPU; use a pinned or device array");
  if (d->readonly) cl_error(L, where, "destination is read-only");
  if (d->size == 0) cl_error(L, where, "empty array");
  if (g) own_mem(L, g, d->mem, where);
  char v[CL_MAXITEM];
  cl_tovalue(L, vidx, d->dtype, v, where, 0);
  int isz = cl_dtypes[d->dtype].size;
  memset(p, 0, CL_MAXITEM / 4 * sizeof *p);
  p[0].dst = cl_devptr(d);
  p[0].height = 1;
  p[0].width = d->size;
  p[0].elementSize = isz;
  if (isz == 1) p[0].value = *(uint8_t *)v;
  else if (isz == 2) p[0].value = *(uint16_t *)v;
  else if (isz == 4) p[0].value = *(uint32_t *)v;
  else {
    uint32_t w[CL_MAXITEM / 4]; memcpy(w, v, isz);
    p[0].elementSize = 4; p[0].width = 1; p[0].height = d->size; p[0].pitch = isz;
    for (int k = 0; k < isz / 4; k++) {
      p[k] = p[0];
      p[k].dst += 4 * k; p[k].value = w[k];
    }
    return isz / 4;
  }
  return 1;
}

/* g:memset(dst, value, deps) */
static int g_memset(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  lua_settop(L, 4);
  CUcontext ctx = g->ctx;
  cl_use_ctx(L, ctx);
  CUDA_MEMSET_NODE_PARAMS p[CL_MAXITEM / 4];
  int parts = memset_params(L, 2, 3, p, "graph:memset", ctx, g);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 4, g, &nd, "graph:memset", small);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemsetNode, &h, g->g, deps, nd, &p[0], ctx), "graph:memset");
  for (int k = 1; k < parts; k++) cl_check(L, CU(cuGraphAddMemsetNode, &h, g->g, &h, 1, &p[k], ctx), "graph:memset");
  keep(L, 1, GRAPH_KEEP, 2);
  lnode *n = push_node(L, 1, N_MEMSET);
  n->n = h;
  n->parts = parts;
  return 1;
}

/* g:host(fn, deps): fn runs when the graph reaches the node, as launch_host_func's do */
static int g_host(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  cl_checktype(L, 2, LUA_TFUNCTION);
  /* a Lua host node is armed once per launch: in a body it would run any number of times */
  if (g->body) return cl_error(L, "graph:host", "a %s node's body cannot call Lua host functions", g->body);
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, "graph:host", small);   /* at 4 */
  cl_use_ctx(L, g->ctx);
  cl_hostrec *r = cl_hostrec_new(L, 2, "graph:host");   /* its box at 5 */
  CUstreamBatchMemOpParams op[2];
  cl_hostrec_ops(r, op);
  CUDA_BATCH_MEM_OP_NODE_PARAMS p = {g->ctx, 2, op, 0};
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddBatchMemOpNode, &h, g->g, deps, nd, &p), "graph:host");
  keep(L, 1, GRAPH_KEEP, 5);
  cl_graph_add_hostrec(L, 1, r);
  lnode *n = push_node(L, 1, N_HOST);
  n->n = h;
  return 1;
}

/* the host nodes in a child node's copy of a graph share their records with the graph they
   were copied from: each gets a record of its own (the same function), so that the copies
   (one graph may be a child twice) and the original never share a word. Nested children
   are walked too. New records go to the graph at gidx. */
static void own_host_nodes(lua_State *L, int gidx, CUgraph emb, int depth) {
  size_t n = 0;
  if (depth > 64 || CU(cuGraphGetNodes, emb, NULL, &n) != CUDA_SUCCESS || !n) return;
  CUgraphNode *v = lua_newuserdatauv(L, sizeof *v * n, 0);
  cl_check(L, CU(cuGraphGetNodes, emb, v, &n), "graph:child");
  for (size_t i = 0; i < n; i++) {
    CUgraphNodeType t;
    if (CU(cuGraphNodeGetType, v[i], &t) != CUDA_SUCCESS) continue;
    if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph inner;
      if (CU(cuGraphChildGraphNodeGetGraph, v[i], &inner) == CUDA_SUCCESS) own_host_nodes(L, gidx, inner, depth + 1);
      continue;
    }
    CUDA_BATCH_MEM_OP_NODE_PARAMS p;
    if (t != CU_GRAPH_NODE_TYPE_BATCH_MEM_OP || CU(cuGraphBatchMemOpNodeGetParams, v[i], &p) != CUDA_SUCCESS ||
        p.count != 2) continue;
    cl_hostrec *r = cl_hostrec_at(p.paramArray[0].writeValue.address);
    if (!r) continue;
    cl_hostrec *c = cl_hostrec_copy(L, r, "graph:child");   /* its box pushed */
    CUstreamBatchMemOpParams op[2];
    cl_hostrec_ops(c, op);
    p.paramArray = op;
    cl_check(L, CU(cuGraphBatchMemOpNodeSetParams, v[i], &p), "graph:child");
    keep(L, gidx, GRAPH_KEEP, -1);
    cl_graph_add_hostrec(L, gidx, c);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* g:empty(deps) */
static int g_empty(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  lua_settop(L, 2);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 2, g, &nd, "graph:empty", small);
  CUgraphNode h;
  cl_use_ctx(L, g->ctx);
  cl_check(L, CU(cuGraphAddEmptyNode, &h, g->g, deps, nd), "graph:empty");
  lnode *n = push_node(L, 1, N_EMPTY);
  n->n = h;
  return 1;
}

/* g:child(other, deps): a copy of other's nodes as one node */
static int g_child(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  lgraph *c = checkgraph(L, 2);
  if (c == g) return cl_error(L, "graph:child", "a graph cannot contain itself");
  if (c->ctx != g->ctx)
    return cl_error(L, "graph:child", "the graphs are on devices %d and %d", cl_device_of(c->ctx), cl_device_of(g->ctx));
  if (c->nrecs && g->body)
    return cl_error(L, "graph:child", "a %s node's body cannot call Lua host functions (the child graph has some)", g->body);
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, "graph:child", small);
  CUgraphNode h;
  cl_use_ctx(L, g->ctx);
  cl_check(L, CU(cuGraphAddChildGraphNode, &h, g->g, deps, nd, c->g), "graph:child");
  keep(L, 1, GRAPH_KEEP, 2);   /* its objects */
  if (c->nrecs) {
    CUgraph emb;
    cl_check(L, CU(cuGraphChildGraphNodeGetGraph, h, &emb), "graph:child");
    own_host_nodes(L, 1, emb, 0);
  }
  if (top_of(c)->conds) top_of(g)->conds = 1;
  lnode *n = push_node(L, 1, N_CHILD);
  n->n = h;
  n->hosts = c->nrecs > 0;
  return 1;
}

/* g:alloc(shape, dtype, deps) -> node, array: memory that exists while the graph runs, from
   this node until a graph:free node (which the graph must have: see instantiate_check) */
static int g_alloc(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  if (g->body) return cl_error(L, "graph:alloc", "a %s node's body cannot allocate (CUDA allows memory nodes only at a graph's top level)", g->body);
  lua_settop(L, 4);
  int64_t shape[CL_MAXDIM];
  int ndim = cl_parse_shape(L, 2, shape, "graph:alloc");
  int dt = cl_checkdtype(L, 3);
  size_t n = 1;
  if (!cl_shape_mul(&n, ndim, shape)) return cl_error(L, "graph:alloc", "the array would be too large");
  size_t bytes = n * (size_t)cl_dtypes[dt].size;
  if (!bytes) return cl_error(L, "graph:alloc", "an empty array cannot be allocated in a graph");
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 4, g, &nd, "graph:alloc", small);
  CUDA_MEM_ALLOC_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.poolProps.location.id = cl_device_of(g->ctx);
  p.bytesize = bytes;
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemAllocNode, &h, g->g, deps, nd, &p), "graph:alloc");
  cl_mem *m = cl_mem_record(L, CL_DEVICE, bytes, g->ctx);
  m->dptr = p.dptr;
  m->gmem = CL_GMEM_NODE;
  m->graph = g->id;
  g->nalloc++;
  lnode *node = push_node(L, 1, N_ALLOC);
  node->n = h;
  cl_push_array(L, m, 0, CL_DEVICE, dt, ndim, shape);
  return 2;
}

/* g:free(array, deps): the end of a graph:alloc array's life in each launch */
static int g_free(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  cl_array *a = cl_checkarray(L, 2);
  cl_mem *m = a->mem;
  if ((m->gmem & CL_GMEM_KIND) != CL_GMEM_NODE || m->graph != top_of(g)->id)
    return cl_error(L, "graph:free", "expected an array from this graph's graph:alloc");
  if (g->body) return cl_error(L, "graph:free", "a %s node's body cannot free (CUDA allows memory nodes only at a graph's top level)", g->body);
  if (m->gmem & CL_GMEM_FREED) return cl_error(L, "graph:free", "the array is freed in this graph already");
  if (a->offset) return cl_error(L, "graph:free", "expected the array graph:alloc returned, not a view into it");
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, "graph:free", small);
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemFreeNode, &h, g->g, deps, nd, m->dptr), "graph:free");
  m->gmem |= CL_GMEM_FREED;
  g->nalloc--;
  lnode *node = push_node(L, 1, N_FREE);
  node->n = h;
  return 1;
}

/* g:record(event, deps) and g:wait(event, deps) */
static int event_node(lua_State *L, int kind, const char *where) {
  lgraph *g = checkgraph(L, 1);
  /* the driver takes the node and refuses the instantiation (CUDA_ERROR_INVALID_VALUE) */
  if (g->body) return cl_error(L, where, "a %s node's body cannot hold event nodes (CUDA allows kernels, copies, memsets, empty, child and conditional nodes there)", g->body);
  CUevent e = cl_graph_event(L, 2, g->ctx, kind == N_RECORD, where);
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, where, small);
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, kind == N_RECORD ? CU(cuGraphAddEventRecordNode, &h, g->g, deps, nd, e)
                               : CU(cuGraphAddEventWaitNode, &h, g->g, deps, nd, e), where);
  keep(L, 1, GRAPH_KEEP, 2);
  lnode *n = push_node(L, 1, kind);
  n->n = h;
  return 1;
}
static int g_record(lua_State *L) { return event_node(L, N_RECORD, "graph:record"); }
static int g_wait(lua_State *L) { return event_node(L, N_WAIT, "graph:wait"); }

/* g:condition([{default = v}]): a conditional node's value, set by kernels of this graph (and
   of the bodies in it) with cudaGraphSetConditional; with a default it is v at each launch */
/* conditional nodes came with the 12.3 driver: an older one has neither entry point */
static void need_conditionals(lua_State *L, const char *where) {
  if (!cu.cuGraphConditionalHandleCreate || !cu.cuGraphAddNode)
    cl_error(L, where, "conditional nodes need a CUDA 12.3 or newer driver");
}

/* pushes a condition of graph h (of ctx) named owner (a graph's id or a capture's), its
   options {default = v} at optidx (none: 0) */
cl_condition *cl_push_condition(lua_State *L, CUgraph h, CUcontext ctx, uint64_t owner, int optidx,
                                const char *where) {
  need_conditionals(L, where);
  unsigned def = 0, flags = 0;
  if (optidx && !lua_isnoneornil(L, optidx)) {
    static const char *const opts[] = {"default", NULL};
    cl_checktype(L, optidx, LUA_TTABLE);
    cl_check_options(L, optidx, where, opts);
    if (lua_getfield(L, optidx, "default") != LUA_TNIL) {
      int ok;
      lua_Integer v = lua_tointegerx(L, -1, &ok);
      if (!ok || v < 0 || v > 0xffffffffLL)
        cl_error(L, where, "default must be an integer from 0 to 2^32-1, got %s", luaL_typename(L, -1));
      def = (unsigned)v;
      flags = CU_GRAPH_COND_ASSIGN_DEFAULT;
    }
    lua_pop(L, 1);
  }
  cl_use_ctx(L, ctx);
  cl_condition *c = lua_newuserdatauv(L, sizeof *c, 1);
  c->graph = owner;
  c->node = 0;
  cl_check(L, CU(cuGraphConditionalHandleCreate, &c->h, h, ctx, def, flags), where);
  luaL_setmetatable(L, CL_CONDITION_MT);
  return c;
}

/* g:condition{default = v} */
static int g_condition(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  cl_push_condition(L, g->g, g->ctx, g->id, 2, "graph:condition");
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

/* a conditional node's body graph at the top of the stack, kept by its graph (at pidx) and
   keeping it */
static void push_body(lua_State *L, int pidx, CUgraph h, const char *kind) {
  lgraph *p = lua_touserdata(L, pidx);
  lgraph *top = top_of(p);
  if (top->nbodies % 8 == 0) {
    lgraph **v = realloc(top->bodies, sizeof *v * (size_t)(top->nbodies + 8));
    if (!v) cl_error(L, NULL, "out of host memory");
    top->bodies = v;
  }
  lgraph *b = cl_push_graph(L, h, p->ctx);
  b->parent = p;
  b->body = kind;
  top->bodies[top->nbodies++] = b;
  keep(L, pidx, GRAPH_KEEP, -1);
  lua_pushvalue(L, pidx);
  keep(L, -2, GRAPH_KEEP, -1);
  lua_pop(L, 1);
}

/* the conditional node of type with size bodies, its condition at 2 and deps at didx: pushes
   the bodies (as a list when list) and the node */
static int cond_node(lua_State *L, CUgraphConditionalNodeType type, unsigned size, int didx, int list,
                     const char *kind, const char *where) {
  lgraph *g = checkgraph(L, 1);
  cl_condition *c = luaL_testudata(L, 2, CL_CONDITION_MT);
  if (!c) return cl_error(L, where, "expected a condition (graph:condition()), got %s", luaL_typename(L, 2));
  if (c->graph != g->id)
    return cl_error(L, where, "the condition is another graph's (a conditional node takes a condition made by its own graph's :condition())");
  if (c->node)
    return cl_error(L, where, "the condition already controls a conditional node (CUDA allows one node per condition: make another)");
  lua_settop(L, didx);
  size_t nd;
  CUgraphNode small[SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, didx, g, &nd, where, small);
  CUgraphNodeParams p;
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = c->h;
  p.conditional.type = type;
  p.conditional.size = size;
  p.conditional.ctx = g->ctx;
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddNode, &h, g->g, deps, NULL, nd, &p), where);
  c->node = 1;
  keep(L, 1, GRAPH_KEEP, 2);
  if (list) lua_createtable(L, (int)size, 0);
  for (unsigned i = 0; i < size; i++) {
    push_body(L, 1, p.conditional.phGraph_out[i], kind);
    if (list) lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  top_of(g)->conds = 1;
  lnode *n = push_node(L, 1, N_COND);
  n->n = h;
  return (list ? 1 : (int)size) + 1;
}

/* g:if_then(cond, deps) -> body, node; g:if_else -> then body, else body, node;
   g:while_loop -> body, node (the body runs while the condition is not 0, tested before each
   run); g:switch(cond, n, deps) -> {n bodies}, node (body k + 1 runs when it is k) */
static int g_if_then(lua_State *L) { return cond_node(L, CU_GRAPH_COND_TYPE_IF, 1, 3, 0, "if_then", "graph:if_then"); }
static int g_if_else(lua_State *L) { return cond_node(L, CU_GRAPH_COND_TYPE_IF, 2, 3, 0, "if_else", "graph:if_else"); }
static int g_while_loop(lua_State *L) { return cond_node(L, CU_GRAPH_COND_TYPE_WHILE, 1, 3, 0, "while_loop", "graph:while_loop"); }
static int g_switch(lua_State *L) {
  lua_Integer n = cl_checkinteger(L, 3);
  if (n < 1 || n > 4096) return cl_error(L, "graph:switch", "the number of bodies must be 1 to 4096, got %I", n);
  lua_remove(L, 3);
  lua_settop(L, 3);
  return cond_node(L, CU_GRAPH_COND_TYPE_SWITCH, (unsigned)n, 3, 1, "switch", "graph:switch");
}

/* g:clone() -> a copy of the graph; clone:find(node) is the copy of one of g's nodes */
static int g_clone(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  if (g->body) return cl_error(L, "graph:clone", "a %s node's body is cloned with its graph", g->body);
  cl_use_ctx(L, g->ctx);
  CUgraph h;
  CUresult r = CU(cuGraphClone, &h, g->g);
  if (r == CUDA_ERROR_NOT_SUPPORTED)
    return cl_error(L, "graph:clone", "CUDA cannot clone a graph with memory or conditional nodes");
  cl_check(L, r, "graph:clone");
  lgraph *c = cl_push_graph(L, h, g->ctx);
  int ci = lua_gettop(L);
  c->origin = g->id;
  keep(L, ci, GRAPH_KEEP, 1);   /* the original keeps everything its nodes use */
  if (g->nrecs) own_host_nodes(L, ci, h, 0);   /* the copies' host nodes get records of their own */
  lua_settop(L, ci);
  return 1;
}

static int g_find(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  lnode *n = checknode(L, 2, NULL, "graph:find");
  if (!g->origin || n->owner->id != g->origin)
    return cl_error(L, "graph:find", "the node is not from the graph this one was cloned from");
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, CU(cuGraphNodeFindInClone, &h, n->n, g->g), "graph:find");
  unsigned v = g->version;
  lnode *c = push_node(L, 1, n->kind);
  g->version = v;   /* a node found, not added: the executable graph stays */
  memcpy(c->g, n->g, sizeof c->g); memcpy(c->b, n->b, sizeof c->b);
  c->shared = n->shared; c->parts = n->parts; c->hosts = n->hosts; c->n = h;
  lua_getiuservalue(L, 2, 2);   /* a kernel node's kernel */
  lua_setiuservalue(L, -2, 2);
  return 1;
}

/* whether `to` can be reached from `from` along dependencies: an iterative search with a
   visited set (open addressing on the node handles), so each reachable node is walked once and
   deep chains cannot overflow the C stack. Its cost is that of the part of the graph below
   `from`. When in doubt (out of memory, a driver error) it answers 1, so that no cycle is made. */
typedef struct { CUgraphNode *slot; size_t cap, n; } nodeset;

static size_t node_hash(CUgraphNode p, size_t cap) {
  return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ULL) & (cap - 1);
}

/* 1 if p was added, 0 if it was there, -1 out of memory */
static int nodeset_add(nodeset *s, CUgraphNode p) {
  if (2 * (s->n + 1) > s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    CUgraphNode *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (size_t i = 0; i < s->cap; i++)
      if (s->slot[i]) {
        size_t j = node_hash(s->slot[i], cap);
        while (slot[j]) j = (j + 1) & (cap - 1);
        slot[j] = s->slot[i];
      }
    free(s->slot);
    s->slot = slot; s->cap = cap;
  }
  size_t j = node_hash(p, s->cap);
  while (s->slot[j]) {
    if (s->slot[j] == p) return 0;
    j = (j + 1) & (s->cap - 1);
  }
  s->slot[j] = p;
  s->n++;
  return 1;
}

static int reaches(lua_State *L, CUgraphNode from, CUgraphNode to) {
  if (from == to) return 1;
  nodeset seen = {NULL, 0, 0};
  CUgraphNode *stack = NULL, *out = NULL;
  size_t sp = 0, scap = 0, ocap = 0;
  int r = 0;
  if (nodeset_add(&seen, from) < 0) return 1;
  CUgraphNode cur = from;
  for (;;) {
    size_t n = 0;
    if (CU(cuGraphNodeGetDependentNodes, cur, NULL, NULL, &n) != CUDA_SUCCESS) { r = 1; break; }
    if (n > ocap) {
      free(out);
      if (!(out = malloc(n * sizeof *out))) { r = 1; break; }
      ocap = n;
    }
    if (n && CU(cuGraphNodeGetDependentNodes, cur, out, NULL, &n) != CUDA_SUCCESS) { r = 1; break; }
    for (size_t i = 0; i < n && !r; i++) {
      if (out[i] == to) { r = 1; break; }
      int added = nodeset_add(&seen, out[i]);
      if (added < 0) { r = 1; break; }
      if (!added) continue;
      if (sp == scap) {
        size_t cap = scap ? 2 * scap : 64;
        CUgraphNode *st = realloc(stack, cap * sizeof *st);
        if (!st) { r = 1; break; }
        stack = st; scap = cap;
      }
      stack[sp++] = out[i];
    }
    if (r || !sp) break;
    cur = stack[--sp];
  }
  free(seen.slot); free(stack); free(out);
  return r;
}

/* g:add_dependency(from, to): to runs after from */
static int g_add_dependency(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  lnode *a = checknode(L, 2, g, "graph:add_dependency");
  lnode *b = checknode(L, 3, g, "graph:add_dependency");
  cl_use_ctx(L, g->ctx);
  if (reaches(L, b->n, a->n))
    return cl_error(L, "graph:add_dependency", "this would make a cycle (the %s node already depends on the %s node)",
                      node_kinds[a->kind], node_kinds[b->kind]);
  cl_check(L, CU(cuGraphAddDependencies, g->g, &a->n, &b->n, NULL, 1), "graph:add_dependency");
  top_of(g)->version++;
  return 0;
}

/* an executable graph arms the host nodes of the graph it was made or updated from */
static void exec_take_recs(lua_State *L, lexec *e, const lgraph *g) {
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
static void instantiate_check(lua_State *L, lgraph *g, const char *where) {
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

/* the executable graph of the graph g at 1, pushed; errors name where */
static lexec *instantiate(lua_State *L, lgraph *g, const char *where) {
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
  cl_check(L, CU(cuGraphInstantiate, &e->e, g->g, 0), where);
  return e;
}

static int g_instantiate(lua_State *L) {
  instantiate(L, checkgraph(L, 1), "graph:instantiate");
  return 1;
}

static int g_node_count(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  size_t n = 0;
  cl_use_ctx(L, g->ctx);
  cl_check(L, CU(cuGraphGetNodes, g->g, NULL, &n), "graph:node_count");
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* g:dot(path): Graphviz of the graph */
static int g_dot(lua_State *L) {
  lgraph *g = checkgraph(L, 1);
  const char *path = cl_checklstring(L, 2, NULL);
  /* a path that cannot be written is said here, with the reason, not as a refused driver call */
  FILE *f = fopen(path, "w");
  if (!f) return cl_error(L, "graph:dot", "cannot write '%s' (%s)", path, strerror(errno));
  fclose(f);
  cl_use_ctx(L, g->ctx);
  CUresult r = CU(cuGraphDebugDotPrint, g->g, path, CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE);
  if (r != CUDA_SUCCESS) return cl_error(L, "graph:dot", "cannot write '%s' (%s)", path, cl_errname(r));
  return 0;
}

static int g_tostring(lua_State *L) {
  lgraph *g = cl_checkudata(L, 1, GRAPH_MT);
  size_t n = 0;
  if (!g->g || !top_of(g)->g) lua_pushliteral(L, "cudalua.graph<closed>");
  else if (CU(cuGraphGetNodes, g->g, NULL, &n) == CUDA_SUCCESS) lua_pushfstring(L, "cudalua.graph<%d nodes>", (int)n);
  else lua_pushliteral(L, "cudalua.graph");
  return 1;
}

static int n_tostring(lua_State *L) {
  lnode *n = cl_checkudata(L, 1, NODE_MT);
  lua_pushfstring(L, "cudalua.graph_node<%s>", node_kinds[n->kind]);
  return 1;
}

static int c_tostring(lua_State *L) {
  cl_condition *c = cl_checkudata(L, 1, CL_CONDITION_MT);
  lua_pushfstring(L, "cudalua.graph_condition<%I>", (lua_Integer)c->h);
  return 1;
}

static int n_index(lua_State *L) {
  lnode *n = cl_checkudata(L, 1, NODE_MT);
  const char *k = cl_checklstring(L, 2, NULL);
  if (!strcmp(k, "kind")) { lua_pushstring(L, node_kinds[n->kind]); return 1; }
  if (!strcmp(k, "graph")) { lua_getiuservalue(L, 1, 1); return 1; }
  return cl_error(L, NULL, "graph nodes have no field '%s'", k);
}

/* ---- executable graphs ---- */

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
static pthread_mutex_t lanes_mu = PTHREAD_MUTEX_INITIALIZER;

static CUresult lane_of(CUcontext ctx, CUstream *out) {
  int dev = cl_device_of(ctx);
  if (dev < 0 || dev >= CL_MAXDEV) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lanes_mu);
  CUresult r = CUDA_SUCCESS;
  if (!lanes[dev]) {
    CUcontext prev = cl_ctx_swap(ctx);
    r = CU0(cuStreamCreate, &lanes[dev], CU_STREAM_NON_BLOCKING);   /* (not parked: under the lock) */
    cl_ctx_swap(prev);
  }
  *out = lanes[dev];
  pthread_mutex_unlock(&lanes_mu);
  return r;
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
    cl_hold_use(&e->hold, s, e->ctx);
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
  cl_hold_use(&e->hold, s, e->ctx);
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
static lgraph *exec_graph(lua_State *L, int eidx) {
  lua_getiuservalue(L, eidx, 1);
  lgraph *g = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return g;
}

/* the node at 2 for the setter where of the executable graph at 1: a node of its graph, of the
   kind the setter changes */
static lnode *exec_node(lua_State *L, int kind, const char *where) {
  lnode *n = checknode(L, 2, NULL, where);
  if (n->owner != exec_graph(L, 1))
    cl_error(L, where, "the node is not from this executable graph's graph");
  if (kind < 0) return n;   /* the caller checks the kind */
  if (n->kind != kind && kind == N_KERNEL)
    cl_error(L, where, "a %s node has no arguments", node_kinds[n->kind]);
  if (n->kind != kind)
    cl_error(L, where, "expected a %s node, got a %s node", node_kinds[kind], node_kinds[n->kind]);
  return n;
}

/* exec:set_args(node, {args}) or exec:set_args(node, ...): new arguments for a kernel node,
   without instantiating again. The list form, as g:kernel takes them, is one plain table
   holding as many values as the kernel has parameters; anything else is the arguments
   themselves (a kernel of one complex parameter takes {re, im} either way: {{re, im}} or
   {re, im}) */
static int e_set_args(lua_State *L) {
  lexec *e = checkexec(L, 1);
  lnode *n = exec_node(L, N_KERNEL, "graph_exec:set_args");
  lua_getiuservalue(L, 2, 2);
  cl_kernel *k = cl_checkkernel(L, -1);
  if (lua_gettop(L) == 4 && lua_type(L, 3) == LUA_TTABLE && !lua_getmetatable(L, 3) &&
      (int)lua_rawlen(L, 3) == k->nparams) {
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
  own_args(L, exec_graph(L, 1), first, nargs, "graph_exec:set_args");
  /* after the arguments: a foreign array's view may have made the selected device current */
  cl_use_ctx(L, e->ctx);
  CUDA_KERNEL_NODE_PARAMS p;
  kernel_params(n, k, &A, &p);
  cl_check(L, CU(cuGraphExecKernelNodeSetParams, e->e, n->n, &p), "graph_exec:set_args");
  for (int i = 0; i < nargs; i++) keep(L, 1, EXEC_KEEP, first + i);
  lua_settop(L, 1);
  return 1;
}

/* exec:set_memcpy(node, dst, src) */
static int e_set_memcpy(lua_State *L) {
  lexec *e = checkexec(L, 1);
  lnode *n = exec_node(L, N_MEMCPY, "graph_exec:set_memcpy");
  CUDA_MEMCPY3D p;
  cl_use_ctx(L, e->ctx);
  memcpy_params(L, 3, 4, &p, "graph_exec:set_memcpy", e->ctx, exec_graph(L, 1));
  cl_check(L, CU(cuGraphExecMemcpyNodeSetParams, e->e, n->n, &p, e->ctx), "graph_exec:set_memcpy");
  keep(L, 1, EXEC_KEEP, 3); keep(L, 1, EXEC_KEEP, 4);
  lua_settop(L, 1);
  return 1;
}

/* exec:set_memset(node, dst, value) */
static int e_set_memset(lua_State *L) {
  lexec *e = checkexec(L, 1);
  lnode *n = exec_node(L, N_MEMSET, "graph_exec:set_memset");
  CUDA_MEMSET_NODE_PARAMS p[CL_MAXITEM / 4];
  cl_use_ctx(L, e->ctx);
  if (memset_params(L, 3, 4, p, "graph_exec:set_memset", e->ctx, exec_graph(L, 1)) != 1 || n->parts != 1)
    return cl_error(L, "graph_exec:set_memset", "8 and 16-byte elements are several memsets; build the graph again");
  cl_check(L, CU(cuGraphExecMemsetNodeSetParams, e->e, n->n, &p[0], e->ctx), "graph_exec:set_memset");
  keep(L, 1, EXEC_KEEP, 3);
  lua_settop(L, 1);
  return 1;
}

/* exec:update(graph): take a modified graph of the same shape, where the driver allows */
static int e_update(lua_State *L) {
  lexec *e = checkexec(L, 1);
  lgraph *g = checkgraph(L, 2);
  CUgraphExecUpdateResultInfo info;
  memset(&info, 0, sizeof info);
  cl_use_ctx(L, e->ctx);
  CUresult r = CU(cuGraphExecUpdate, e->e, g->g, &info);
  if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
    static const char *why[] = {"ok", "error", "topology changed", "node type changed",
      "kernel function changed", "parameters changed unsupportedly", "not supported",
      "unsupported function change", "attributes changed"};
    int w = (int)info.result;
    return cl_error(L, "graph_exec:update", "the driver cannot update this executable graph (%s): instantiate the graph again",
                      w >= 0 && w < (int)(sizeof why / sizeof why[0]) ? why[w] : "unknown reason");
  }
  cl_check(L, r, "graph_exec:update");
  keep(L, 1, EXEC_KEEP, 2);
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
  lnode *n = exec_node(L, -1, "graph_exec:enable");
  if (!lua_isboolean(L, 3)) return cl_error(L, "graph_exec:enable", "expected a boolean, got %s", luaL_typename(L, 3));
  if (n->kind != N_KERNEL && n->kind != N_MEMCPY && n->kind != N_MEMSET)
    return cl_error(L, "graph_exec:enable", "only kernel, memcpy and memset nodes can be turned off, not a %s node", node_kinds[n->kind]);
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
  lnode *n = exec_node(L, N_HOST, "graph_exec:set_host");
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
  keep(L, 1, EXEC_KEEP, 5);
  lua_pushvalue(L, 5);
  lua_rawsetp(L, 4, n->n);
  for (int i = 0; i < e->nrecs; i++) if (e->recs[i] == old) e->recs[i] = r;
  lua_settop(L, 1);
  return 1;
}

/* exec:set_child(node, graph): a child node runs a copy of graph (of the same shape) */
static int e_set_child(lua_State *L) {
  lexec *e = checkexec(L, 1);
  lnode *n = exec_node(L, N_CHILD, "graph_exec:set_child");
  lgraph *c = checkgraph(L, 3);
  /* its host nodes' records would be shared with the graph itself: arming them cannot tell
     the two apart */
  if (c->nrecs)
    return cl_error(L, "graph_exec:set_child", "a graph with Lua host functions cannot replace a child: instantiate again");
  /* and the child's own would be armed at each launch and never called: a hang */
  if (n->hosts)
    return cl_error(L, "graph_exec:set_child", "the child node calls Lua host functions, so it cannot be replaced: instantiate again");
  cl_use_ctx(L, e->ctx);
  cl_check(L, CU(cuGraphExecChildGraphNodeSetParams, e->e, n->n, c->g), "graph_exec:set_child");
  keep(L, 1, EXEC_KEEP, 3);
  if (top_of(c)->conds) e->conds = 1;
  lua_settop(L, 1);
  return 1;
}

/* exec:set_event(node, event): a record or wait node's event at later launches */
static int e_set_event(lua_State *L) {
  lexec *e = checkexec(L, 1);
  lnode *n = exec_node(L, -1, "graph_exec:set_event");
  if (n->kind != N_RECORD && n->kind != N_WAIT)
    return cl_error(L, "graph_exec:set_event", "expected a record or wait node, got a %s node", node_kinds[n->kind]);
  CUevent ev = cl_graph_event(L, 3, e->ctx, n->kind == N_RECORD, "graph_exec:set_event");
  cl_use_ctx(L, e->ctx);
  cl_check(L, n->kind == N_RECORD ? CU(cuGraphExecEventRecordNodeSetEvent, e->e, n->n, ev)
                                  : CU(cuGraphExecEventWaitNodeSetEvent, e->e, n->n, ev), "graph_exec:set_event");
  keep(L, 1, EXEC_KEEP, 3);
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
  free_recs(&e->recs, &e->nrecs);
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
  lgraph *g = checkgraph(L, 1);
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

void cl_open_graph(lua_State *L) {
  static const luaL_Reg gm[] = {
    {"kernel", g_kernel}, {"memcpy", g_memcpy}, {"memset", g_memset}, {"host", g_host},
    {"empty", g_empty}, {"child", g_child}, {"add_dependency", g_add_dependency},
    {"instantiate", g_instantiate}, {"launch", g_launch}, {"dot", g_dot}, {"node_count", g_node_count},
    {"alloc", g_alloc}, {"free", g_free}, {"record", g_record}, {"wait", g_wait},
    {"condition", g_condition}, {"if_then", g_if_then}, {"if_else", g_if_else},
    {"while_loop", g_while_loop}, {"switch", g_switch}, {"clone", g_clone}, {"find", g_find},
    {"close", graph_close}, {NULL, NULL}};
  static const luaL_Reg em[] = {
    {"launch", e_launch}, {"upload", e_upload}, {"set_args", e_set_args},
    {"set_memcpy", e_set_memcpy}, {"set_memset", e_set_memset}, {"update", e_update},
    {"enable", e_enable}, {"set_host", e_set_host}, {"set_child", e_set_child},
    {"set_event", e_set_event}, {"close", e_close}, {NULL, NULL}};
  static const luaL_Reg gmeta[] = {
    {"__gc", graph_gc}, {"__close", graph_close}, {"__tostring", g_tostring}, {NULL, NULL}};
  static const luaL_Reg nmeta[] = {{"__tostring", n_tostring}, {NULL, NULL}};
  static const luaL_Reg emeta[] = {
    {"__gc", e_gc}, {"__close", e_close}, {"__tostring", e_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){GRAPH_MT, gm, NULL, gmeta});
  cl_class_define(L, &(cl_class){NODE_MT, NULL, n_index, nmeta});
  cl_class_define(L, &(cl_class){EXEC_MT, em, NULL, emeta});
  static const luaL_Reg cmeta[] = {{"__tostring", c_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){CL_CONDITION_MT, NULL, NULL, cmeta});
  lua_pushcfunction(L, l_graph); lua_setfield(L, -2, "graph");
}
