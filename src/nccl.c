/* nccl.c: NCCL collectives on cudalua arrays (require "cudalua.nccl"; the policy is in
   lua/cudalua/nccl.lua). NCCL is opened with dlopen like the CUDA libraries, so cudalua loads
   without it and every NCCL call then raises one message saying why. The few types and
   prototypes used are declared here (NCCL's ABI: nccl.h need not be installed to build). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;                       /* ncclSuccess = 0 */
enum { NCCL_INT8 = 0, NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_UINT32 = 3, NCCL_INT64 = 4, NCCL_UINT64 = 5,
       NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9 };

#define NCCL_FUNCS(X) \
  X(ncclGetVersion, ncclResult_t, (int *)) \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *)) \
  X(ncclCommInitRank, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int)) \
  X(ncclCommInitAll, ncclResult_t, (ncclComm_t *, int, const int *)) \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t)) \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t)) \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *)) \
  X(ncclGetErrorString, const char *, (ncclResult_t)) \
  X(ncclAllReduce, ncclResult_t, (const void *, void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclBroadcast, ncclResult_t, (const void *, void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclReduce, ncclResult_t, (const void *, void *, size_t, int, int, int, ncclComm_t, CUstream)) \
  X(ncclAllGather, ncclResult_t, (const void *, void *, size_t, int, ncclComm_t, CUstream)) \
  X(ncclReduceScatter, ncclResult_t, (const void *, void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclSend, ncclResult_t, (const void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclRecv, ncclResult_t, (void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclGroupStart, ncclResult_t, (void)) \
  X(ncclGroupEnd, ncclResult_t, (void))
/* newer: the last warning (2.13), finalizing before destroy (2.14) */
#define NCCL_OPTIONAL(X) \
  X(ncclGetLastError, const char *, (ncclComm_t)) \
  X(ncclCommFinalize, ncclResult_t, (ncclComm_t))

#define NCCL_MEMBER(name, ret, args) ret (*name) args;
static struct { NCCL_FUNCS(NCCL_MEMBER) NCCL_OPTIONAL(NCCL_MEMBER) } nc;

#define NCCL_SYM(name, ret, args) {#name, (void **)&nc.name},
static const cl_sym nccl_syms[] = {NCCL_FUNCS(NCCL_SYM) {NULL, NULL}};
static const cl_sym nccl_opt[] = {NCCL_OPTIONAL(NCCL_SYM) {NULL, NULL}};

/* libnccl.so.2: CUDALUA_NCCL names one; else NCCL_HOME/lib, the loader's path, Debian's
   multiarch folder and CUDA_HOME/lib64 */
static const char *const nccl_names[] = {"libnccl.so.2", NULL};
static const cl_libdir nccl_dirs[] = {{"NCCL_HOME", "/lib"}, {NULL, ""}, {NULL, "/usr/lib/x86_64-linux-gnu"},
  {"CUDA_HOME", "/lib64"}, {NULL, NULL}};
/* NCCL has no function naming its results (ncclGetErrorString gives the text) */
static const char *const nccl_results[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
  "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};
static cl_lib nccl = {
  .env = "CUDALUA_NCCL", .names = nccl_names, .dirs = nccl_dirs, .flags = RTLD_NOW,
  .syms = nccl_syms, .optional = nccl_opt,
  .forced_fail = "cudalua.nccl: NCCL not found: CUDALUA_NCCL=%s cannot be opened (%s)",
  .not_found = "cudalua.nccl: NCCL not found (libnccl.so.2; set NCCL_HOME or LD_LIBRARY_PATH)",
  .lacks = "cudalua.nccl: %s lacks %s (too old an NCCL)",
  .results = nccl_results, .nresults = sizeof nccl_results / sizeof nccl_results[0], .unknown = "ncclError",
  .lock = PTHREAD_MUTEX_INITIALIZER};

static void need(lua_State *L) { cl_lib_need(L, &nccl); }

/* a communicator drives GPUs through NCCL's own CUDA runtime: the CPU device has none to give */
static void need_gpu(lua_State *L, const char *where) {
  if (cl_driver_load() && cl_cpu_symbol(NULL))
    cl_error(L, where, "cudalua's CPU device (CUDALUA_DEVICE=cpu) cannot run NCCL communicators: NCCL needs NVIDIA GPUs");
}

#define COMM_MT "cudalua.nccl_comm"
typedef struct {
  ncclComm_t c;                 /* NULL once closed */
  CUcontext ctx;
  int rank, size, dev;
  int in_set;                   /* one of several communicators this process drives */
} lcomm;

static __thread int group_depth;   /* ncclGroupStart calls not yet ended, on this thread */

static const char group_keep = 0;   /* registry: arrays a group's collectives use, until it ends */

/* the arrays at the argument indexes stay alive until the group ends: NCCL queues a group's
   work only at ncclGroupEnd, so one collected inside the group must not be freed before */
static void keep_in_group(lua_State *L, int a, int b) {
  if (group_depth == 0) return;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &group_keep) != LUA_TTABLE) {   /* made once, a list */
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &group_keep);
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
  for (int i = a; i <= b; i++)
    if (lua_type(L, i) == LUA_TUSERDATA || lua_type(L, i) == LUA_TTABLE) {
      lua_pushvalue(L, i); lua_rawseti(L, -2, ++n);
    }
  lua_pop(L, 1);
}

/* the group has ended: its arrays may go (the list is emptied, not remade: groups come in
   loops of small collectives) */
static void release_group(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &group_keep) == LUA_TTABLE)
    for (lua_Integer i = (lua_Integer)lua_rawlen(L, -1); i > 0; i--) { lua_pushnil(L); lua_rawseti(L, -2, i); }
  lua_pop(L, 1);
}

/* raises "cudalua: what: ncclX (text): NCCL's last warning" */
static void check(lua_State *L, ncclResult_t r, ncclComm_t c, const char *what) {
  if (r == 0) return;
  const char *last = c && nc.ncclGetLastError ? nc.ncclGetLastError(c) : NULL;
  cl_error(L, what, "%s (%s)%s%s", cl_result_name(&nccl, r), nc.ncclGetErrorString(r),
             last && *last ? ": " : "", last && *last ? last : "");
}

static lcomm *checkcomm(lua_State *L, int idx) {
  lcomm *c = cl_checkudata(L, idx, COMM_MT);
  if (!c->c) cl_argerror(L, idx, "closed communicator");
  return c;
}

static lcomm *push_comm(lua_State *L, ncclComm_t h, CUcontext ctx) {
  lcomm *c = lua_newuserdatauv(L, sizeof *c, 1);
  memset(c, 0, sizeof *c);
  luaL_setmetatable(L, COMM_MT);
  c->c = h;
  c->ctx = ctx;
  return c;
}

/* ---- library functions ---- */

static int l_available(lua_State *L) {
  if (cl_cpu_symbol(NULL)) {   /* (chosen, not loaded: the driver is not loaded to ask) */
    lua_pushboolean(L, 0);
    lua_pushstring(L, "cudalua.nccl: cudalua's CPU device (CUDALUA_DEVICE=cpu) has no GPUs for NCCL");
    return 2;
  }
  int ok = cl_lib_load(&nccl);
  lua_pushboolean(L, ok);
  if (ok) return 1;
  lua_pushstring(L, nccl.err);
  return 2;
}

static int l_version(lua_State *L) {
  need(L);
  int v = 0;
  check(L, nc.ncclGetVersion(&v), NULL, "nccl.version");
  lua_pushinteger(L, v);
  return 1;
}

/* unique_id() -> 256 hex characters: pass them to every rank (a file, the environment, argv) */
static int l_unique_id(lua_State *L) {
  need(L);
  ncclUniqueId id;
  check(L, nc.ncclGetUniqueId(&id), NULL, "nccl.unique_id");
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  cl_add_hex(&b, id.internal, sizeof id.internal);
  luaL_pushresult(&b);
  return 1;
}

static void fill_info(lcomm *c, int rank, int size, int dev) { c->rank = rank; c->size = size; c->dev = dev; }

/* comm_init_rank(nranks, id, rank) -> a communicator on the selected device (blocks until every
   rank has joined) */
static int l_comm_init_rank(lua_State *L) {
  static const char *const where = "nccl.comm_init_rank";   /* a tail call from nccl.lua */
  int isint;
  lua_Integer n = lua_tointegerx(L, 1, &isint);
  if (!isint || n < 1 || n > 1 << 20) return cl_error(L, where, "argument 1: nranks must be >= 1");
  size_t len;
  const char *hex = lua_tolstring(L, 2, &len);
  lua_Integer rank = lua_tointegerx(L, 3, &isint);
  if (!isint || rank < 0 || rank >= n) return cl_error(L, where, "argument 3: rank must be 0..%d", (int)n - 1);
  ncclUniqueId id;
  if (!hex || len != 2 * sizeof id.internal || !cl_hex_decode(hex, id.internal, sizeof id.internal))
    return cl_error(L, where, "argument 2: not an id from nccl.unique_id() (256 hex characters)");
  need_gpu(L, where);
  need(L);
  CUcontext ctx = cl_ctx(L);
  ncclComm_t h = NULL;
  lcomm *c = push_comm(L, NULL, ctx);
  check(L, nc.ncclCommInitRank(&h, (int)n, id, (int)rank), NULL, "nccl.comm_init_rank");
  c->c = h;
  fill_info(c, (int)rank, (int)n, cl_current_device());
  return 1;
}

/* comm_init_all({devices}) -> {communicators}, one per device, ranks in that order; their
   collectives go inside nccl.group (one thread drives them all) */
static int l_comm_init_all(lua_State *L) {
  cl_checktype(L, 1, LUA_TTABLE);
  int n = (int)lua_rawlen(L, 1);
  if (n < 1 || n > 64) return cl_error(L, "nccl.comm_init_all", "expected a list of 1 to 64 device ids, got %d", (int)n);
  need_gpu(L, "nccl.comm_init_all");
  int devs[64];
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    int isint;
    lua_Integer d = lua_tointegerx(L, -1, &isint);
    if (!isint || d < 0 || d >= cl_ndevices())
      return cl_error(L, "nccl.comm_init_all", "device %s is not one of this machine's (0..%d)",
                        luaL_tolstring(L, -1, NULL), cl_ndevices() - 1);
    devs[i] = (int)d;
    lua_pop(L, 1);
    for (int j = 0; j < i; j++)
      if (devs[j] == devs[i]) return cl_error(L, "nccl.comm_init_all", "device %d given twice", devs[i]);
  }
  need(L);
  ncclComm_t h[64] = {0};
  CUcontext ctx[64];
  for (int i = 0; i < n; i++) ctx[i] = cl_device_ctx(L, devs[i]);   /* before NCCL's own runtime calls */
  lua_createtable(L, n, 0);
  int list = lua_gettop(L);
  for (int i = 0; i < n; i++) {   /* the objects first: an error after init leaks nothing */
    push_comm(L, NULL, ctx[i]);
    lua_pushvalue(L, list); lua_setiuservalue(L, -2, 1);
    lua_rawseti(L, list, i + 1);
  }
  CUcontext cur = NULL;
  CU0(cuCtxGetCurrent, &cur);
  ncclResult_t r = nc.ncclCommInitAll(h, n, devs);
  CU0(cuCtxSetCurrent, cur);
  check(L, r, NULL, "nccl.comm_init_all");
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, list, i + 1);
    lcomm *c = lua_touserdata(L, -1);
    c->c = h[i];
    c->in_set = n > 1;
    fill_info(c, i, n, devs[i]);
    lua_pop(L, 1);
  }
  return 1;
}

/* group(fn, ...) -> fn's results: fn's collectives queued as one group; the group ends when
   fn raises too, and the error is raised after */
static int l_group(lua_State *L) {
  if (lua_type(L, 1) != LUA_TFUNCTION) return cl_error(L, "nccl.group", "expected a function, got %s", luaL_typename(L, 1));
  need(L);
  int base = lua_gettop(L) - 1;   /* below fn */
  check(L, nc.ncclGroupStart(), NULL, "nccl.group");
  group_depth++;
  int st = lua_pcall(L, base, LUA_MULTRET, 0);
  group_depth--;
  ncclResult_t r = CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclGroupEnd());
  if (group_depth == 0) release_group(L);
  if (st != LUA_OK) return lua_error(L);
  check(L, r, NULL, "nccl.group");
  return lua_gettop(L);
}

/* ---- communicators ---- */

/* the NCCL type of a cudalua dtype */
static int nccl_type(lua_State *L, int dt, const char *where) {
  switch (dt) {
    case CL_I8: return NCCL_INT8;
    case CL_U8: return NCCL_UINT8;
    case CL_I32: return NCCL_INT32;
    case CL_U32: return NCCL_UINT32;
    case CL_I64: return NCCL_INT64;
    case CL_U64: return NCCL_UINT64;
    case CL_F16: return NCCL_FLOAT16;
    case CL_BF16: return NCCL_BFLOAT16;
    case CL_F32: return NCCL_FLOAT32;
    case CL_F64: return NCCL_FLOAT64;
  }
  return cl_error(L, where, "NCCL has no %s (int8, uint8, int32, uint32, int64, uint64, "
                    "float16, bfloat16, float32, float64)", cl_dtypes[dt].name);
}

/* the array at idx, device memory the communicator's device reaches */
static cl_array *buffer(lua_State *L, lcomm *c, int idx, const char *where) {
  cl_array *a = cl_checkarray(L, idx);
  if (a->kind == CL_HOST || a->kind == CL_PINNED || a->kind == CL_MAPPED)
    cl_error(L, where, "NCCL works on device memory, got a %s", cl_kind_names[a->kind]);
  if (!cl_mem_reachable(a->mem, c->ctx))
    cl_error(L, where, "the array is on device %d and the communicator on device %d",
               cl_device_of(a->mem->ctx), c->dev);
  return a;
}

static int op_of(lua_State *L, int idx) {
  static const char *const ops[] = {"sum", "prod", "max", "min", "avg", NULL};
  return cl_checkoption(L, idx, "sum", ops);
}

/* what every collective does before it is queued: the context, the stream, the group rule */
static CUstream prepare(lua_State *L, lcomm *c, int sidx, cl_stream **ps, const char *where) {
  cl_stream *s = cl_tostream(L, sidx, where);
  cl_stream_check(L, s, c->ctx, where, "communicator");
  if (c->in_set && group_depth == 0)
    cl_error(L, where, "this communicator is one of several this process drives "
               "(comm_init_all): queue their collectives inside nccl.group(function() ... end)");
  keep_in_group(L, 2, 3);
  CL_BEFORE_ENQUEUE(L, where);
  *ps = s;   /* NCCL selects the communicator's device itself */
  return s ? s->h : NULL;
}

/* (in a capture, the capture holds the block: the array may be closed before it ends) */
static void used(lua_State *L, cl_array *a, cl_stream *s, lcomm *c) {
  if (!a) return;
  cl_mem_use_n(L, &a->mem, 1, s, c->ctx);
}

/* a graph's memory (graph:alloc, a capture's allocation) may be used by that graph's work only:
   a collective on a stream capturing it (raises otherwise) */
static void graph_mem(lua_State *L, cl_array *a, cl_array *b, cl_stream *s, const char *where) {
  if (a && a->mem->gmem) cl_mem_graph_use(L, a->mem, s, where);
  if (b && b->mem->gmem) cl_mem_graph_use(L, b->mem, s, where);
}

static void same(lua_State *L, cl_array *a, cl_array *b, size_t factor_b, size_t factor_a, const char *where) {
  if (a->dtype != b->dtype)
    cl_error(L, where, "dtype mismatch (%s and %s)", cl_dtypes[a->dtype].name, cl_dtypes[b->dtype].name);
  if (a->size * factor_a != b->size * factor_b)
    cl_error(L, where, "the receiving array needs %I elements, it has %I",
               (lua_Integer)(a->size * factor_a / factor_b), (lua_Integer)b->size);
}

/* comm:all_reduce(send, recv [, op [, stream]]) and comm:reduce_scatter(send, recv [, op
   [, stream]]): with scatter, rank i gets block i of the reduction */
static int reduction(lua_State *L, int scatter) {
  lcomm *c = checkcomm(L, 1);
  const char *w = scatter ? "comm:reduce_scatter" : "comm:all_reduce";
  cl_array *s = buffer(L, c, 2, w), *r = buffer(L, c, 3, w);
  same(L, s, r, scatter ? (size_t)c->size : 1, 1, w);
  int op = op_of(L, 4), t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, c, 5, &st, w);
  graph_mem(L, s, r, st, w);
  void *sp = (void *)cl_devptr(s), *rp = (void *)cl_devptr(r);
  check(L, scatter ? CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclReduceScatter(sp, rp, r->size, t, op, c->c, h))
                   : CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclAllReduce(sp, rp, s->size, t, op, c->c, h)), c->c, w);
  used(L, s, st, c); used(L, r, st, c);
  return 0;
}
static int c_all_reduce(lua_State *L) { return reduction(L, 0); }
static int c_reduce_scatter(lua_State *L) { return reduction(L, 1); }

/* comm:broadcast(send, recv, root [, stream]): send matters on root only */
static int c_broadcast(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  const char *w = "comm:broadcast";
  cl_array *s = buffer(L, c, 2, w), *r = buffer(L, c, 3, w);
  same(L, s, r, 1, 1, w);
  lua_Integer root = cl_checkinteger(L, 4);
  cl_argcheck(L, root >= 0 && root < c->size, 4, lua_pushfstring(L, "root must be 0..%d", c->size - 1));
  int t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, c, 5, &st, w);
  graph_mem(L, s, r, st, w);
  check(L, CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclBroadcast((void *)cl_devptr(s), (void *)cl_devptr(r), r->size, t, (int)root, c->c, h)), c->c, w);
  used(L, s, st, c); used(L, r, st, c);
  return 0;
}

/* comm:reduce(send, recv, op, root [, stream]): recv matters on root only (nil elsewhere) */
static int c_reduce(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  const char *w = "comm:reduce";
  cl_array *s = buffer(L, c, 2, w), *r = NULL;
  int op = op_of(L, 4);
  lua_Integer root = cl_checkinteger(L, 5);
  cl_argcheck(L, root >= 0 && root < c->size, 5, lua_pushfstring(L, "root must be 0..%d", c->size - 1));
  if (!lua_isnil(L, 3) || root == c->rank) { r = buffer(L, c, 3, w); same(L, s, r, 1, 1, w); }
  int t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, c, 6, &st, w);
  graph_mem(L, s, r, st, w);
  check(L, CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclReduce((void *)cl_devptr(s), r ? (void *)cl_devptr(r) : NULL, s->size, t, op, (int)root, c->c, h)), c->c, w);
  used(L, s, st, c); used(L, r, st, c);
  return 0;
}

/* comm:all_gather(send, recv [, stream]): recv holds every rank's send, in rank order */
static int c_all_gather(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  const char *w = "comm:all_gather";
  cl_array *s = buffer(L, c, 2, w), *r = buffer(L, c, 3, w);
  same(L, s, r, 1, (size_t)c->size, w);
  int t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, c, 4, &st, w);
  graph_mem(L, s, r, st, w);
  check(L, CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclAllGather((void *)cl_devptr(s), (void *)cl_devptr(r), s->size, t, c->c, h)), c->c, w);
  used(L, s, st, c); used(L, r, st, c);
  return 0;
}


/* comm:send(buf, peer [, stream]) and comm:recv(buf, peer [, stream]) */
static int point(lua_State *L, int recv) {
  lcomm *c = checkcomm(L, 1);
  const char *w = recv ? "comm:recv" : "comm:send";
  cl_array *a = buffer(L, c, 2, w);
  lua_Integer peer = cl_checkinteger(L, 3);
  cl_argcheck(L, peer >= 0 && peer < c->size, 3, lua_pushfstring(L, "peer must be 0..%d", c->size - 1));
  int t = nccl_type(L, a->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, c, 4, &st, w);
  graph_mem(L, a, NULL, st, w);
  ncclResult_t r = recv ? CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclRecv((void *)cl_devptr(a), a->size, t, (int)peer, c->c, h))
                        : CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclSend((void *)cl_devptr(a), a->size, t, (int)peer, c->c, h));
  check(L, r, c->c, w);
  used(L, a, st, c);
  return 0;
}
static int c_send(lua_State *L) { return point(L, 0); }
static int c_recv(lua_State *L) { return point(L, 1); }

static int c_rank(lua_State *L) { lua_pushinteger(L, checkcomm(L, 1)->rank); return 1; }
static int c_size(lua_State *L) { lua_pushinteger(L, checkcomm(L, 1)->size); return 1; }
static int c_device(lua_State *L) { lua_pushinteger(L, checkcomm(L, 1)->dev); return 1; }
static int c_handle(lua_State *L) { lua_pushinteger(L, (lua_Integer)(uintptr_t)checkcomm(L, 1)->c); return 1; }

/* the communicator's asynchronous error, if any: nil when there is none */
static int c_async_error(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  ncclResult_t e = 0;
  check(L, nc.ncclCommGetAsyncError(c->c, &e), c->c, "comm:async_error");
  if (!e) return 0;
  lua_pushfstring(L, "%s (%s)", cl_result_name(&nccl, e), nc.ncclGetErrorString(e));
  return 1;
}

/* closes the communicators of the list at idx (or the one at idx): a broken one is aborted;
   healthy ones are finalized (together, in a group: one thread drives them all) and destroyed.
   Never raises: it runs from __gc too. */
static void close_comms(lua_State *L, lcomm **cs, int n) {
  cl_host_drain(L);   /* finalizing waits for the device: L's host functions run first */
  CUcontext cur = NULL;
  CU0(cuCtxGetCurrent, &cur);
  /* one broken communicator of a list: finalizing the others would wait for it forever */
  int broken = 0;
  for (int i = 0; i < n; i++) {
    ncclResult_t e = 0;
    CU0(cuCtxSetCurrent, cs[i]->ctx);
    if (nc.ncclCommGetAsyncError(cs[i]->c, &e) != 0 || e) broken = 1;
  }
  if (broken)
    for (int i = 0; i < n; i++) { nc.ncclCommAbort(cs[i]->c); cs[i]->c = NULL; }
  if (!broken && nc.ncclCommFinalize) {
    if (n > 1) nc.ncclGroupStart();
    for (int i = 0; i < n; i++) if (cs[i]->c) { CU0(cuCtxSetCurrent, cs[i]->ctx); nc.ncclCommFinalize(cs[i]->c); }
    if (n > 1) nc.ncclGroupEnd();
  }
  for (int i = 0; i < n; i++)
    if (cs[i]->c) { CU0(cuCtxSetCurrent, cs[i]->ctx); nc.ncclCommDestroy(cs[i]->c); cs[i]->c = NULL; }
  CU0(cuCtxSetCurrent, cur);
}

/* communicators dropped inside a host function or a capture: finalizing and destroying them
   waits for the device, so copies of them are closed later (cl_defer) */
typedef struct { cl_deferred later; int n; lcomm c[]; } closing;
static void close_later(lua_State *L, cl_deferred *d) {
  closing *k = CL_DEFERRED_OWNER(d, closing, later);
  lcomm *cs[64];
  for (int i = 0; i < k->n; i++) cs[i] = &k->c[i];
  close_comms(L, cs, k->n);
  free(k);
}

/* comm:close(): a communicator of comm_init_all closes with all the others of its list */
static int c_close(lua_State *L) {
  lcomm *c = cl_checkudata(L, 1, COMM_MT);
  lcomm *cs[64];
  int n = 0;
  if (lua_getiuservalue(L, 1, 1) == LUA_TTABLE) {
    int len = (int)lua_rawlen(L, -1);
    for (int i = 1; i <= len && n < 64; i++) {
      lua_rawgeti(L, -1, i);
      lcomm *o = luaL_testudata(L, -1, COMM_MT);
      if (o && o->c) cs[n++] = o;
      lua_pop(L, 1);
    }
  } else if (c->c) cs[n++] = c;
  lua_pop(L, 1);
  if (!n) return 0;
  closing *k = cl_must_defer(L) ? malloc(sizeof *k + n * sizeof(lcomm)) : NULL;
  if (k) {
    k->later.fn = close_later;
    k->n = n;
    for (int i = 0; i < n; i++) { k->c[i] = *cs[i]; cs[i]->c = NULL; }
    cl_defer(L, &k->later);
  } else {
    close_comms(L, cs, n);
  }
  return 0;
}

/* comm:abort(): ends the communicator now, whatever is queued (after an error) */
static int c_abort(lua_State *L) {
  lcomm *c = cl_checkudata(L, 1, COMM_MT);
  if (c->c) { nc.ncclCommAbort(c->c); c->c = NULL; }
  return 0;
}

static int c_tostring(lua_State *L) {
  lcomm *c = cl_checkudata(L, 1, COMM_MT);
  if (!c->c) lua_pushliteral(L, "cudalua.nccl_comm<closed>");
  else lua_pushfstring(L, "cudalua.nccl_comm<rank %d of %d, device %d>", c->rank, c->size, c->dev);
  return 1;
}

int luaopen_cudalua_nccl_core(lua_State *L) {
  static const luaL_Reg m[] = {
    {"all_reduce", c_all_reduce}, {"broadcast", c_broadcast}, {"reduce", c_reduce},
    {"all_gather", c_all_gather}, {"reduce_scatter", c_reduce_scatter}, {"send", c_send},
    {"recv", c_recv}, {"rank", c_rank}, {"size", c_size}, {"device", c_device},
    {"handle", c_handle}, {"async_error", c_async_error}, {"close", c_close}, {"abort", c_abort},
    {NULL, NULL}};
  static const luaL_Reg f[] = {
    {"available", l_available}, {"version", l_version}, {"unique_id", l_unique_id},
    {"comm_init_rank", l_comm_init_rank}, {"comm_init_all", l_comm_init_all},
    {"group", l_group}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
    {"__gc", c_close}, {"__close", c_close}, {"__tostring", c_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){COMM_MT, m, NULL, meta, NULL});
  luaL_newlib(L, f);
  return 1;
}
