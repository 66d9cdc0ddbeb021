/* graph.c: CUDA graphs, their nodes and their conditions. Explicit graphs are built node by
   node (kernel, memcpy, memset, host, empty, child, alloc, free, record, wait, conditional)
   with dependencies; stream capture turns queued work into a graph. A graph keeps every Lua
   object its nodes use (arrays, kernels, host functions, child graphs) in its user value, and
   an executable graph (gexec.c, which adds graph:instantiate and graph:launch) keeps its
   graph, so nothing a replay touches is freed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

#define NODE_MT "cudalua.graph_node"

const char *const cl_node_kinds[] = {"kernel", "memcpy", "memset", "host", "empty", "child", "alloc",
  "free", "record", "wait", "conditional"};

/* ids of graphs: above any capture id, so that the two never meet in cl_mem.graph */
static uint64_t next_id = (uint64_t)1 << 62;

/* whether g is the graph with id, or a body inside it */
static int within(const cl_graph *g, uint64_t id) {
  for (; g; g = g->parent) if (g->id == id) return 1;
  return 0;
}

cl_graph *cl_checkgraph(lua_State *L, int idx) {
  cl_graph *g = cl_checkudata(L, idx, CL_GRAPH_MT);
  if (!g->g || !cl_graph_top(g)->g) cl_argerror(L, idx, "closed graph");
  return g;
}

/* a node of graph g (at gidx) that is still alive */
cl_node *cl_checknode(lua_State *L, int idx, cl_graph *g, const char *where) {
  cl_node *n = luaL_testudata(L, idx, NODE_MT);
  if (!n) cl_error(L, where, "expected a graph node, got %s", luaL_typename(L, idx));
  cl_graph *owner = n->owner;   /* set by push_node; the node's user value 1 keeps it alive */
  if (!owner || !owner->g || !cl_graph_top(owner)->g || !n->n) cl_error(L, where, "the node's graph is closed");
  if (g && owner != g) cl_error(L, where, "the node belongs to another graph");
  return n;
}

/* a graph's user values: its keep set, and the executable graph g:launch made (gexec.c) */
enum { GRAPH_KEEP = 1 };

/* the memory the value at idx uses, held in h while the graph may run: an array's block, a
   CUDA array's, a texture's or surface's object and the memory it reads (closing them then
   destroys nothing a node uses), what a graph holds (a child, an update) */
static void hold_value(lua_State *L, cl_hold *h, int idx) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) != LUA_TUSERDATA || luaL_testudata(L, idx, CL_KERNEL)) return;   /* (kernels: most kept) */
  cl_array *a = cl_toarray(L, idx);
  if (a) { cl_hold_add(L, h, a->mem); return; }
  cl_graph *c = luaL_testudata(L, idx, CL_GRAPH_MT);
  if (c) { cl_hold_merge(L, h, &cl_graph_top(c)->hold); return; }
  cl_cuarray *ca = cl_tocuarray(L, idx);
  if (ca) { if (ca->mem) cl_hold_add(L, h, ca->mem); return; }
  cl_texref *t = cl_totexref(L, idx);
  if (t && t->h) { cl_hold_add(L, h, t->obj); cl_hold_add(L, h, t->src); }
}

/* keeps the value at idx alive with the graph or executable graph at uidx, in its keep set
   (user value uv): keeping the same object again, set_args in a loop say, does not grow it;
   and holds its memory in h */
void cl_graph_keep(lua_State *L, int uidx, int uv, cl_hold *h, int idx) {
  idx = lua_absindex(L, idx);
  lua_getiuservalue(L, uidx, uv);
  cl_keep(L, -1, idx);
  lua_pop(L, 1);
  hold_value(L, h, idx);
}

/* the same for the graph at gidx: its top graph holds the memory */
static void keep(lua_State *L, int gidx, int idx) {
  cl_graph_keep(L, gidx, GRAPH_KEEP, &cl_graph_top(lua_touserdata(L, gidx))->hold, idx);
}

/* a captured graph (at gidx) holds the memory of what its capture kept (arrays, CUDA arrays
   of captured copies, textures), and runs on its device's conditional lane if the capture made
   conditional nodes (stream:while_loop...) */
void cl_graph_hold_kept(lua_State *L, int gidx) {
  cl_graph *g = lua_touserdata(L, gidx);
  lua_getiuservalue(L, gidx, GRAPH_KEEP);
  g->conds = lua_getfield(L, -1, CL_CAPTURE_CONDS) != LUA_TNIL;
  lua_pop(L, 1);
  for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) hold_value(L, &g->hold, -2);
  cl_hold *used = cl_mem_capture_held(L, lua_gettop(L));   /* (closed objects' blocks too) */
  if (used) {   /* the graph's from now on: its close lets go of them, not the collector */
    cl_hold_merge(L, &g->hold, used);
    cl_hold_release(L, used);
  }
  lua_pop(L, 1);
}

/* deps at idx: nil or a list of nodes of g -> CUgraphNode array: the caller's small[CL_SMALL_DEPS]
   for a few (graphs are built node by node in loops), else a userdata. Pushes one value. */
static CUgraphNode *deps_of(lua_State *L, int idx, cl_graph *g, size_t *n, const char *where,
                            CUgraphNode *small) {
  *n = 0;
  if (lua_isnoneornil(L, idx)) { lua_pushnil(L); return NULL; }
  if (!lua_istable(L, idx)) cl_error(L, where, "dependencies must be a list of nodes, got %s", luaL_typename(L, idx));
  size_t k = lua_rawlen(L, idx);
  CUgraphNode *d = small;
  if (k <= CL_SMALL_DEPS) lua_pushnil(L);
  else d = lua_newuserdatauv(L, sizeof(CUgraphNode) * k, 0);
  for (size_t i = 0; i < k; i++) {
    lua_rawgeti(L, idx, (lua_Integer)i + 1);
    d[i] = cl_checknode(L, -1, g, where)->n;
    lua_pop(L, 1);
  }
  *n = k;
  return d;
}

static cl_node *push_node(lua_State *L, int gidx, int kind) {
  cl_node *n = lua_newuserdatauv(L, sizeof *n, 2);
  memset(n, 0, sizeof *n);
  n->kind = kind;
  n->owner = lua_touserdata(L, gidx);
  cl_graph_top(n->owner)->version++;   /* (only the top graph's is read: a body's node changes it too) */
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
  cl_graph *g = cl_checkudata(L, 1, CL_GRAPH_MT);
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
void cl_graph_free_recs(cl_hostrec ***recs, int *n) {
  free(*recs);
  *recs = NULL;
  *n = 0;
}

static int graph_gc(lua_State *L) {
  cl_graph *g = cl_checkudata(L, 1, CL_GRAPH_MT);
  graph_close(L);
  cl_graph_free_recs(&g->recs, &g->nrecs);
  g->caprecs = 0;
  free(g->bodies);
  g->bodies = NULL;
  g->nbodies = 0;
  return 0;
}

void cl_graph_add_hostrec(lua_State *L, int gidx, cl_hostrec *r) {
  cl_graph *g = lua_touserdata(L, gidx);
  if (g->nrecs == g->caprecs) {
    int cap = g->caprecs ? 2 * g->caprecs : 4;
    cl_hostrec **v = realloc(g->recs, sizeof *v * (size_t)cap);
    if (!v) cl_error(L, NULL, "out of host memory");
    g->recs = v; g->caprecs = cap;
  }
  g->recs[g->nrecs++] = r;
}

void *cl_push_graph(lua_State *L, CUgraph h, CUcontext ctx) {
  cl_graph *g = lua_newuserdatauv(L, sizeof *g, 2);
  memset(g, 0, sizeof *g);
  g->ctx = ctx;
  luaL_setmetatable(L, CL_GRAPH_MT);
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
static void own_mem(lua_State *L, const cl_graph *g, const cl_mem *m, const char *where) {
  if ((m->gmem & CL_GMEM_KIND) == CL_GMEM_CAPTURED)
    cl_error(L, where, "the array was allocated in a stream capture: only that capture's work may use it");
  if ((m->gmem & CL_GMEM_KIND) == CL_GMEM_NODE && !within(g, m->graph))
    cl_error(L, where, "the array was allocated by another graph (graph:alloc)");
}

/* the conditions and graph allocations among a kernel node's arguments are g's: the blocks
   cl_marshal found (A->used: arrays, textures' objects and memory), the conditions it saw */
void cl_graph_own_args(lua_State *L, const cl_graph *g, const cl_args *A, int first, int nargs,
                       const char *where) {
  for (int i = 0; i < A->nused; i++) own_mem(L, g, A->used[i], where);
  if (!A->conds) return;
  for (int i = 0; i < nargs; i++) {
    cl_condition *c = luaL_testudata(L, first + i, CL_CONDITION_MT);
    if (c && !within(g, c->graph))
      cl_error(L, where, "argument %d is a condition of another graph (a kernel may set the conditions of its own graph and of the graphs around its body)", i + 1);
  }
}

void cl_graph_keep_args(lua_State *L, int uidx, int uv, cl_hold *h, const cl_args *A, int first, int nargs) {
  lua_getiuservalue(L, uidx, uv);
  /* userdata only: numbers, strings and {re, im} pairs are copied into the node's parameters */
  for (int i = 0; i < nargs; i++) if (lua_type(L, first + i) == LUA_TUSERDATA) cl_keep(L, -1, first + i);
  lua_pop(L, 1);
  for (int i = 0; i < A->nused; i++) cl_hold_add(L, h, A->used[i]);
}

void cl_graph_kernel_params(cl_node *n, cl_kernel *k, cl_args *A, CUDA_KERNEL_NODE_PARAMS *p) {
  memset(p, 0, sizeof *p);
  p->func = k->fn;
  p->gridDimX = n->g[0]; p->gridDimY = n->g[1]; p->gridDimZ = n->g[2];
  p->blockDimX = n->b[0]; p->blockDimY = n->b[1]; p->blockDimZ = n->b[2];
  p->sharedMemBytes = n->shared;
  p->kernelParams = A->params;
}

/* (cl.h) */
cl_node *cl_graph_add_kernel(lua_State *L, int gidx, int kidx, const cl_launch *c, int aidx,
                             const CUgraphNode *deps, size_t nd, int keep_kernel) {
  cl_graph *g = lua_touserdata(L, gidx);
  cl_kernel *k = lua_touserdata(L, kidx);
  if (k->ctx != g->ctx)
    cl_error(L, "graph:kernel", "the kernel is on device %d and the graph on device %d (get the "
               "kernel from its module with device %d selected)", cl_device_of(k->ctx), cl_device_of(g->ctx),
               cl_device_of(g->ctx));
  cl_node cfg;   /* the configuration, copied into the node once it is made */
  memset(&cfg, 0, sizeof cfg);
  memcpy(cfg.g, c->g, sizeof cfg.g); memcpy(cfg.b, c->b, sizeof cfg.b); cfg.shared = c->shared;
  int nargs, first = push_args(L, aidx, &nargs);
  cl_args A;
  cl_marshal(L, k, kidx, first, nargs, &A, 0);
  cl_graph_own_args(L, g, &A, first, nargs, "graph:kernel");
  cl_use_ctx(L, g->ctx);
  cl_kernel_shared(L, k, kidx, c->shared);   /* a function attribute: graph launches use it too */
  CUDA_KERNEL_NODE_PARAMS p;
  cl_graph_kernel_params(&cfg, k, &A, &p);
  CUgraphNode h = NULL;
  CUresult r = CU(cuGraphAddKernelNode, &h, g->g, deps, nd, &p);
  int added = r == CUDA_SUCCESS;
  /* cluster and cooperative launches are attributes of the node */
  CUkernelNodeAttrValue v;
  if (r == CUDA_SUCCESS && c->cluster[0]) {
    memset(&v, 0, sizeof v);
    v.clusterDim.x = c->cluster[0]; v.clusterDim.y = c->cluster[1]; v.clusterDim.z = c->cluster[2];
    r = CU(cuGraphKernelNodeSetAttribute, h, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &v);
  }
  if (r == CUDA_SUCCESS && c->cooperative) {
    memset(&v, 0, sizeof v);
    v.cooperative = 1;
    r = CU(cuGraphKernelNodeSetAttribute, h, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &v);
  }
  if (r != CUDA_SUCCESS) {
    if (added) CU(cuGraphDestroyNode, h);   /* added, its attributes refused */
    cl_error_named(L, "graph:kernel '%s': %s", cl_kernel_name(L, kidx), cl_errname(r));
  }
  cl_graph_keep_args(L, gidx, GRAPH_KEEP, &cl_graph_top(g)->hold, &A, first, nargs);
  if (keep_kernel) keep(L, gidx, kidx);
  cl_node *n = push_node(L, gidx, CL_NODE_KERNEL);
  memcpy(n->g, cfg.g, sizeof n->g); memcpy(n->b, cfg.b, sizeof n->b); n->shared = cfg.shared;
  n->n = h;
  lua_pushvalue(L, kidx); lua_setiuservalue(L, -2, 2);   /* the kernel, for set_args */
  return n;
}

/* g:kernel(k, config, args, deps) */
static int g_kernel(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  cl_checkkernel(L, 2);
  lua_settop(L, 5);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 5, g, &nd, "graph:kernel", small);   /* at 6 */
  cl_launch c;
  cl_launch_parse(L, 3, &c, CL_CFG_GRAPH, "graph:kernel");
  cl_graph_add_kernel(L, 1, 2, &c, 4, deps, nd, 1);
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

void cl_graph_memcpy_params(lua_State *L, int didx, int sidx, CUDA_MEMCPY3D *p, const char *where,
                            CUcontext ctx, const cl_graph *g) {
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
  cl_layout y = {1, {n}, {1}, {1}};
  if (!d->contig || !s->contig) {   /* strided views: one node is one 3-D copy */
    cl_same_shape(L, d, s, where);
    cl_copy_layout(d, s, &y);
  }
  if (g) { own_mem(L, g, d->mem, where); own_mem(L, g, s->mem, where); }
  if (cl_copy_piece(&y, p) < y.nd)
    cl_error(L, where, "these strided views take more than one 3-D copy (%d axes that do not merge): "
             "copy through a contiguous array", y.nd);
  p->srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  p->srcDevice = copy_addr(L, s, 2, where);
  p->dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  p->dstDevice = copy_addr(L, d, 1, where);
}

/* g:memcpy(dst, src, deps) */
static int g_memcpy(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  lua_settop(L, 4);
  size_t nd;
  CUDA_MEMCPY3D p;
  CUcontext ctx = g->ctx;
  cl_use_ctx(L, ctx);
  cl_graph_memcpy_params(L, 2, 3, &p, "graph:memcpy", ctx, g);
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 4, g, &nd, "graph:memcpy", small);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemcpyNode, &h, g->g, deps, nd, &p, ctx), "graph:memcpy");
  keep(L, 1, 2); keep(L, 1, 3);
  cl_node *n = push_node(L, 1, CL_NODE_MEMCPY);
  n->n = h;
  return 1;
}

/* memset parameters: 1, 2 and 4-byte elements directly; 8 and 16-byte ones as one strided
   memset per 4-byte word; returns how many (p holds CL_MAXITEM / 4) */
int cl_graph_memset_params(lua_State *L, int didx, int vidx, CUDA_MEMSET_NODE_PARAMS *p,
                           const char *where, CUcontext ctx, const cl_graph *g) {
  cl_array *d = cl_checkarray(L, didx);
  cl_mem_reach(L, d->mem, ctx, where);
  if (d->kind == CL_HOST) cl_error(L, where, "a pageable host array cannot be set by the GPU; use a pinned or device array");
  if (d->readonly) cl_error(L, where, "destination is read-only");
  if (d->size == 0) cl_error(L, where, "empty array");
  cl_need_contiguous(L, d, where, "the array");
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
  cl_graph *g = cl_checkgraph(L, 1);
  lua_settop(L, 4);
  CUcontext ctx = g->ctx;
  cl_use_ctx(L, ctx);
  CUDA_MEMSET_NODE_PARAMS p[CL_MAXITEM / 4];
  int parts = cl_graph_memset_params(L, 2, 3, p, "graph:memset", ctx, g);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 4, g, &nd, "graph:memset", small);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemsetNode, &h, g->g, deps, nd, &p[0], ctx), "graph:memset");
  for (int k = 1; k < parts; k++) cl_check(L, CU(cuGraphAddMemsetNode, &h, g->g, &h, 1, &p[k], ctx), "graph:memset");
  keep(L, 1, 2);
  cl_node *n = push_node(L, 1, CL_NODE_MEMSET);
  n->n = h;
  n->parts = parts;
  return 1;
}

/* g:host(fn, deps): fn runs when the graph reaches the node, as launch_host_func's do */
static int g_host(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  cl_checktype(L, 2, LUA_TFUNCTION);
  /* a Lua host node is armed once per launch: in a body it would run any number of times */
  if (g->body) return cl_error(L, "graph:host", "a %s node's body cannot call Lua host functions", g->body);
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, "graph:host", small);   /* at 4 */
  cl_use_ctx(L, g->ctx);
  cl_hostrec *r = cl_hostrec_new(L, 2, "graph:host");   /* its box at 5 */
  CUstreamBatchMemOpParams op[2];
  cl_hostrec_ops(r, op);
  CUDA_BATCH_MEM_OP_NODE_PARAMS p = {g->ctx, 2, op, 0};
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddBatchMemOpNode, &h, g->g, deps, nd, &p), "graph:host");
  keep(L, 1, 5);
  cl_graph_add_hostrec(L, 1, r);
  cl_node *n = push_node(L, 1, CL_NODE_HOST);
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
    keep(L, gidx, -1);
    cl_graph_add_hostrec(L, gidx, c);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* g:empty(deps) */
static int g_empty(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  lua_settop(L, 2);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 2, g, &nd, "graph:empty", small);
  CUgraphNode h;
  cl_use_ctx(L, g->ctx);
  cl_check(L, CU(cuGraphAddEmptyNode, &h, g->g, deps, nd), "graph:empty");
  cl_node *n = push_node(L, 1, CL_NODE_EMPTY);
  n->n = h;
  return 1;
}

/* g:child(other, deps): a copy of other's nodes as one node */
static int g_child(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  cl_graph *c = cl_checkgraph(L, 2);
  if (c == g) return cl_error(L, "graph:child", "a graph cannot contain itself");
  if (c->ctx != g->ctx)
    return cl_error(L, "graph:child", "the graphs are on devices %d and %d", cl_device_of(c->ctx), cl_device_of(g->ctx));
  if (c->nrecs && g->body)
    return cl_error(L, "graph:child", "a %s node's body cannot call Lua host functions (the child graph has some)", g->body);
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, "graph:child", small);
  CUgraphNode h;
  cl_use_ctx(L, g->ctx);
  cl_check(L, CU(cuGraphAddChildGraphNode, &h, g->g, deps, nd, c->g), "graph:child");
  keep(L, 1, 2);   /* its objects */
  if (c->nrecs) {
    CUgraph emb;
    cl_check(L, CU(cuGraphChildGraphNodeGetGraph, h, &emb), "graph:child");
    own_host_nodes(L, 1, emb, 0);
  }
  if (cl_graph_top(c)->conds) cl_graph_top(g)->conds = 1;
  cl_node *n = push_node(L, 1, CL_NODE_CHILD);
  n->n = h;
  n->hosts = c->nrecs > 0;
  return 1;
}

/* g:alloc(shape, dtype, deps) -> node, array: memory that exists while the graph runs, from
   this node until a graph:free node (which the graph must have: see instantiate_check) */
static int g_alloc(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
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
  CUgraphNode small[CL_SMALL_DEPS];
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
  cl_node *node = push_node(L, 1, CL_NODE_ALLOC);
  node->n = h;
  cl_push_array(L, m, 0, CL_DEVICE, dt, ndim, shape);
  return 2;
}

/* g:free(array, deps): the end of a graph:alloc array's life in each launch */
static int g_free(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  cl_array *a = cl_checkarray(L, 2);
  cl_mem *m = a->mem;
  if ((m->gmem & CL_GMEM_KIND) != CL_GMEM_NODE || m->graph != cl_graph_top(g)->id)
    return cl_error(L, "graph:free", "expected an array from this graph's graph:alloc");
  if (g->body) return cl_error(L, "graph:free", "a %s node's body cannot free (CUDA allows memory nodes only at a graph's top level)", g->body);
  if (m->gmem & CL_GMEM_FREED) return cl_error(L, "graph:free", "the array is freed in this graph already");
  if (a->offset) return cl_error(L, "graph:free", "expected the array graph:alloc returned, not a view into it");
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, "graph:free", small);
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, CU(cuGraphAddMemFreeNode, &h, g->g, deps, nd, m->dptr), "graph:free");
  m->gmem |= CL_GMEM_FREED;
  g->nalloc--;
  cl_node *node = push_node(L, 1, CL_NODE_FREE);
  node->n = h;
  return 1;
}

/* g:record(event, deps) and g:wait(event, deps) */
static int event_node(lua_State *L, int kind, const char *where) {
  cl_graph *g = cl_checkgraph(L, 1);
  /* the driver takes the node and refuses the instantiation (CUDA_ERROR_INVALID_VALUE) */
  if (g->body) return cl_error(L, where, "a %s node's body cannot hold event nodes (CUDA allows kernels, copies, memsets, empty, child and conditional nodes there)", g->body);
  CUevent e = cl_graph_event(L, 2, g->ctx, kind == CL_NODE_RECORD, where);
  lua_settop(L, 3);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = deps_of(L, 3, g, &nd, where, small);
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, kind == CL_NODE_RECORD ? CU(cuGraphAddEventRecordNode, &h, g->g, deps, nd, e)
                               : CU(cuGraphAddEventWaitNode, &h, g->g, deps, nd, e), where);
  keep(L, 1, 2);
  cl_node *n = push_node(L, 1, kind);
  n->n = h;
  return 1;
}
static int g_record(lua_State *L) { return event_node(L, CL_NODE_RECORD, "graph:record"); }
static int g_wait(lua_State *L) { return event_node(L, CL_NODE_WAIT, "graph:wait"); }

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
  cl_graph *g = cl_checkgraph(L, 1);
  cl_push_condition(L, g->g, g->ctx, g->id, 2, "graph:condition");
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

/* a conditional node's body graph at the top of the stack, kept by its graph (at pidx) and
   keeping it */
static void push_body(lua_State *L, int pidx, CUgraph h, const char *kind) {
  cl_graph *p = lua_touserdata(L, pidx);
  cl_graph *top = cl_graph_top(p);
  if (top->nbodies % 8 == 0) {
    cl_graph **v = realloc(top->bodies, sizeof *v * (size_t)(top->nbodies + 8));
    if (!v) cl_error(L, NULL, "out of host memory");
    top->bodies = v;
  }
  cl_graph *b = cl_push_graph(L, h, p->ctx);
  b->parent = p;
  b->body = kind;
  top->bodies[top->nbodies++] = b;
  keep(L, pidx, -1);
  lua_pushvalue(L, pidx);
  keep(L, -2, -1);
  lua_pop(L, 1);
}

/* the conditional node of type with size bodies, its condition at 2 and deps at didx: pushes
   the bodies (as a list when list) and the node */
static int cond_node(lua_State *L, CUgraphConditionalNodeType type, unsigned size, int didx, int list,
                     const char *kind, const char *where) {
  cl_graph *g = cl_checkgraph(L, 1);
  cl_condition *c = luaL_testudata(L, 2, CL_CONDITION_MT);
  if (!c) return cl_error(L, where, "expected a condition (graph:condition()), got %s", luaL_typename(L, 2));
  if (c->graph != g->id)
    return cl_error(L, where, "the condition is another graph's (a conditional node takes a condition made by its own graph's :condition())");
  if (c->node)
    return cl_error(L, where, "the condition already controls a conditional node (CUDA allows one node per condition: make another)");
  lua_settop(L, didx);
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
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
  keep(L, 1, 2);
  if (list) lua_createtable(L, (int)size, 0);
  for (unsigned i = 0; i < size; i++) {
    push_body(L, 1, p.conditional.phGraph_out[i], kind);
    if (list) lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  cl_graph_top(g)->conds = 1;
  cl_node *n = push_node(L, 1, CL_NODE_COND);
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
  cl_graph *g = cl_checkgraph(L, 1);
  if (g->body) return cl_error(L, "graph:clone", "a %s node's body is cloned with its graph", g->body);
  cl_use_ctx(L, g->ctx);
  CUgraph h;
  CUresult r = CU(cuGraphClone, &h, g->g);
  if (r == CUDA_ERROR_NOT_SUPPORTED)
    return cl_error(L, "graph:clone", "CUDA cannot clone a graph with memory or conditional nodes");
  cl_check(L, r, "graph:clone");
  cl_graph *c = cl_push_graph(L, h, g->ctx);
  int ci = lua_gettop(L);
  c->origin = g->id;
  keep(L, ci, 1);   /* the original keeps everything its nodes use */
  if (g->nrecs) own_host_nodes(L, ci, h, 0);   /* the copies' host nodes get records of their own */
  lua_settop(L, ci);
  return 1;
}

static int g_find(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  cl_node *n = cl_checknode(L, 2, NULL, "graph:find");
  if (!g->origin || n->owner->id != g->origin)
    return cl_error(L, "graph:find", "the node is not from the graph this one was cloned from");
  cl_use_ctx(L, g->ctx);
  CUgraphNode h;
  cl_check(L, CU(cuGraphNodeFindInClone, &h, n->n, g->g), "graph:find");
  unsigned v = g->version;
  cl_node *c = push_node(L, 1, n->kind);
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
  cl_graph *g = cl_checkgraph(L, 1);
  cl_node *a = cl_checknode(L, 2, g, "graph:add_dependency");
  cl_node *b = cl_checknode(L, 3, g, "graph:add_dependency");
  cl_use_ctx(L, g->ctx);
  if (reaches(L, b->n, a->n))
    return cl_error(L, "graph:add_dependency", "this would make a cycle (the %s node already depends on the %s node)",
                      cl_node_kinds[a->kind], cl_node_kinds[b->kind]);
  cl_check(L, CU(cuGraphAddDependencies, g->g, &a->n, &b->n, NULL, 1), "graph:add_dependency");
  cl_graph_top(g)->version++;
  return 0;
}

static int g_node_count(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
  size_t n = 0;
  cl_use_ctx(L, g->ctx);
  cl_check(L, CU(cuGraphGetNodes, g->g, NULL, &n), "graph:node_count");
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

/* g:dot(path): Graphviz of the graph */
static int g_dot(lua_State *L) {
  cl_graph *g = cl_checkgraph(L, 1);
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
  cl_graph *g = cl_checkudata(L, 1, CL_GRAPH_MT);
  size_t n = 0;
  if (!g->g || !cl_graph_top(g)->g) lua_pushliteral(L, "cudalua.graph<closed>");
  else if (CU(cuGraphGetNodes, g->g, NULL, &n) == CUDA_SUCCESS) lua_pushfstring(L, "cudalua.graph<%d nodes>", (int)n);
  else lua_pushliteral(L, "cudalua.graph");
  return 1;
}

static int n_tostring(lua_State *L) {
  cl_node *n = cl_checkudata(L, 1, NODE_MT);
  lua_pushfstring(L, "cudalua.graph_node<%s>", cl_node_kinds[n->kind]);
  return 1;
}

static int c_tostring(lua_State *L) {
  cl_condition *c = cl_checkudata(L, 1, CL_CONDITION_MT);
  lua_pushfstring(L, "cudalua.graph_condition<%I>", (lua_Integer)c->h);
  return 1;
}

static int n_index(lua_State *L) {
  cl_node *n = cl_checkudata(L, 1, NODE_MT);
  const char *k = cl_checklstring(L, 2, NULL);
  if (!strcmp(k, "kind")) { lua_pushstring(L, cl_node_kinds[n->kind]); return 1; }
  if (!strcmp(k, "graph")) { lua_getiuservalue(L, 1, 1); return 1; }
  return cl_error(L, NULL, "graph nodes have no field '%s'", k);
}

void cl_open_graph(lua_State *L) {
  /* graph:instantiate and graph:launch are added by gexec.c (cl_open_gexec) */
  static const luaL_Reg gm[] = {
    {"kernel", g_kernel}, {"memcpy", g_memcpy}, {"memset", g_memset}, {"host", g_host},
    {"empty", g_empty}, {"child", g_child}, {"add_dependency", g_add_dependency},
    {"dot", g_dot}, {"node_count", g_node_count},
    {"alloc", g_alloc}, {"free", g_free}, {"record", g_record}, {"wait", g_wait},
    {"condition", g_condition}, {"if_then", g_if_then}, {"if_else", g_if_else},
    {"while_loop", g_while_loop}, {"switch", g_switch}, {"clone", g_clone}, {"find", g_find},
    {"close", graph_close}, {NULL, NULL}};
  static const luaL_Reg gmeta[] = {
    {"__gc", graph_gc}, {"__close", graph_close}, {"__tostring", g_tostring}, {NULL, NULL}};
  static const luaL_Reg nmeta[] = {{"__tostring", n_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){CL_GRAPH_MT, gm, NULL, gmeta, NULL});
  cl_class_define(L, &(cl_class){NODE_MT, NULL, n_index, nmeta, NULL});
  static const luaL_Reg cmeta[] = {{"__tostring", c_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){CL_CONDITION_MT, NULL, NULL, cmeta, NULL});
  lua_pushcfunction(L, l_graph); lua_setfield(L, -2, "graph");
}
