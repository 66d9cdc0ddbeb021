/* launch.c: kernel launches: a configuration (config.c) and arguments (args.c) to the driver,
   with the checks only the launch can make (streams, devices, captures, cooperative grids,
   clusters) and the copies of pageable host arrays. Every k[{grid, block}](...) ends in
   cl_kernel_launch: the hot path, so it does no allocation beyond the launcher object of
   k[{grid, block}] (launcher.c). */
#include <string.h>
#include "cl.h"

/* keeps the kernel and its arrays alive as long as the graph a capture makes; a set (it
   becomes the graph's keep set), so a captured loop does not grow it launch by launch. Streams
   joined to the capture of another find its table too. */
static void capture_keep(lua_State *L, cl_stream *s, int kidx, int first, int nargs, const cl_args *A) {
  if (!cl_capture_push_keep(L, s)) return;
  cl_keep(L, -1, kidx);
  for (int i = 0; i < nargs; i++)   /* values (numbers, {re, im} pairs) were copied: not kept */
    if (lua_type(L, first + i) == LUA_TUSERDATA) cl_keep(L, -1, first + i);
  cl_mem_capture_hold(L, -1, A->used, A->nused);   /* and their blocks, should they be closed */
  lua_pop(L, 1);
}

/* cluster and cooperative launches go through cuLaunchKernelEx */
static CUresult launch_ex(cl_kernel *k, const cl_launch *c, CUstream h, void **params) {
  CUlaunchAttribute at[2];
  CUlaunchConfig lc;
  memset(at, 0, sizeof at);
  memset(&lc, 0, sizeof lc);
  lc.gridDimX = c->g[0]; lc.gridDimY = c->g[1]; lc.gridDimZ = c->g[2];
  lc.blockDimX = c->b[0]; lc.blockDimY = c->b[1]; lc.blockDimZ = c->b[2];
  lc.sharedMemBytes = c->shared;
  lc.hStream = h;
  lc.attrs = at;
  if (c->cluster[0]) {
    at[lc.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    at[lc.numAttrs].value.clusterDim.x = c->cluster[0];
    at[lc.numAttrs].value.clusterDim.y = c->cluster[1];
    at[lc.numAttrs].value.clusterDim.z = c->cluster[2];
    lc.numAttrs++;
  }
  if (c->cooperative) {
    at[lc.numAttrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    at[lc.numAttrs].value.cooperative = 1;
    lc.numAttrs++;
  }
  return CU0(cuLaunchKernelEx, &lc, k->fn, params, NULL);
}

/* why a launch failed, in words a user can act on, where cudalua can tell (slow path) */
static const char *launch_hint(lua_State *L, const cl_launch *c, CUresult r) {
  /* only refusals of the configuration; an earlier fault may make any call fail */
  if (r != CUDA_ERROR_INVALID_VALUE &&
      r != CUDA_ERROR_INVALID_CLUSTER_SIZE && r != CUDA_ERROR_NOT_SUPPORTED) return "";
  /* cooperative grids and the kernel's own cluster rules were checked before the launch */
  if (!c->cluster[0]) return "";
  CUdevice dev;
  int ma = 0;
  if (CU0(cuCtxGetDevice, &dev) != CUDA_SUCCESS ||
      CU0(cuDeviceGetAttribute, &ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS) return "";
  if (ma < 9)
    return lua_pushfstring(L, "thread block clusters need a device of compute capability 9.0 or newer");
  return "";
}

/* a cluster configuration the driver would refuse, found before it is asked (checkers such as
   compute-sanitizer report every refused call): NULL when there is nothing to say */
static const char *cluster_refusal(lua_State *L, cl_kernel *k, const cl_launch *c) {
  if (k->binary_version && k->binary_version < 90)
    return lua_pushfstring(L, "the kernel's code is for sm_%d; thread block clusters need sm_90 or newer", k->binary_version);
  const unsigned *cl = k->req_cluster;
  if (!c->cluster[0] && !cl_tiles(c->g, cl))
    return lua_pushfstring(L, "the grid {%d, %d, %d} is not a multiple of the cluster {%d, %d, %d} the kernel "
                           "declares (__cluster_dims__)", c->g[0], c->g[1], c->g[2], cl[0], cl[1], cl[2]);
  if (c->cluster[0] && c->cluster[0] * c->cluster[1] * c->cluster[2] > 8) {
    int v = 0;
    if (CU(cuFuncGetAttribute, &v, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, k->fn) == CUDA_SUCCESS && !v)
      return "clusters of more than 8 blocks need k:set_attribute(\"non_portable_cluster_size_allowed\", 1) (at most 16 on Hopper)";
  }
  return NULL;
}

/* raises "cudalua: kernel 'k' launch with grid {..}, block {..}, shared n[, cluster {..}][,
   cooperative] failed: why", giving back the temporary copies of host arrays first */
static void launch_error(lua_State *L, int kidx, const cl_launch *c, cl_args *A, CUstream h,
                         const char *why) {
  for (int i = 0; i < A->ntmp; i++) if (A->tmp[i].d) CU(cuMemFreeAsync, A->tmp[i].d, h);
  const char *name = cl_kernel_name(L, kidx);
  int base = lua_gettop(L);
  lua_pushfstring(L, "cudalua: kernel '%s' launch with grid {%d, %d, %d}, block {%d, %d, %d}, shared %d",
                  name, c->g[0], c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shared);
  if (c->cluster[0]) lua_pushfstring(L, ", cluster {%d, %d, %d}", c->cluster[0], c->cluster[1], c->cluster[2]);
  if (c->cooperative) lua_pushliteral(L, ", cooperative");
  lua_pushfstring(L, " failed: %s", why);
  lua_concat(L, lua_gettop(L) - base);
  lua_error(L);
}

/* a cooperative grid larger than can be resident at once is refused before the driver is asked
   (the driver's refusal is a failed call, which checkers such as compute-sanitizer report): the
   limit is worked out once per block and shared size. NULL: the launch may go ahead */
static const char *coop_refusal(lua_State *L, cl_kernel *k, const cl_launch *c) {
  unsigned threads = c->b[0] * c->b[1] * c->b[2];
  if (k->coop_threads != threads || k->coop_shared != c->shared) {
    CUdevice dev;
    int sms = 0, coop = 0, maxt = 0, per = 0;
    if (CU0(cuCtxGetDevice, &dev) != CUDA_SUCCESS ||
        CU0(cuDeviceGetAttribute, &coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev) != CUDA_SUCCESS ||
        CU0(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        CU(cuFuncGetAttribute, &maxt, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, k->fn) != CUDA_SUCCESS)
      return NULL;
    if (!coop) return "this device does not support cooperative launches";
    /* a block the kernel cannot run is the driver's to refuse, with its own message */
    if (threads == 0 || threads > (unsigned)maxt ||
        CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &per, k->fn, (int)threads, c->shared) != CUDA_SUCCESS)
      return NULL;
    k->coop_threads = threads;
    k->coop_shared = c->shared;
    k->coop_per = (unsigned)per;
    k->coop_sms = (unsigned)sms;
  }
  unsigned long long blocks = (unsigned long long)c->g[0] * c->g[1] * c->g[2], most = (unsigned long long)k->coop_per * k->coop_sms;
  if (blocks <= most) return NULL;
  return lua_pushfstring(L, "a cooperative grid of %I blocks is more than can be resident at once: "
                         "at most %I (%d per multiprocessor x %d multiprocessors, for blocks of %d threads "
                         "and %d bytes of dynamic shared memory)", (lua_Integer)blocks, (lua_Integer)most,
                         (int)k->coop_per, (int)k->coop_sms, (int)threads, (int)c->shared);
}

/* a launch's public name, "kernel 'add'", made only where it is needed (off the fast path) */
#define KWHERE(L, kidx) lua_pushfstring((L), "kernel '%s'", cl_kernel_name((L), (kidx)))

/* pageable host arrays passed to a kernel: copied to temporary device memory first. Their
   host addresses are taken now (a host function run during a wait may close the arrays; their
   memory's free is then put off until this call is done) */
static void tmp_copies_in(lua_State *L, cl_args *A, CUstream h, int kidx) {
  for (int i = 0; i < A->ntmp; i++) {
    if (!A->tmp[i].a->mem) cl_still_open(L, A->tmp[i].a, KWHERE(L, kidx));
    A->tmp[i].host = cl_hostptr(A->tmp[i].a);
    A->tmp[i].n = cl_nbytes(A->tmp[i].a);
    cl_pageable_prepare(L, A->tmp[i].a->mem);
  }
  CUresult r = CUDA_SUCCESS;   /* each call parks on its own (CU) */
  int i;
  for (i = 0; i < A->ntmp && r == CUDA_SUCCESS; i++) {
    if (!A->tmp[i].n) continue;
    r = CU(cuMemAllocAsync, &A->tmp[i].d, A->tmp[i].n, h);
    if (r == CUDA_SUCCESS) r = CU(cuMemcpyHtoDAsync, A->tmp[i].d, A->tmp[i].host, A->tmp[i].n, h);
    *(CUdeviceptr *)A->tmp[i].slot = A->tmp[i].d;
  }
  if (r != CUDA_SUCCESS)
    for (int j = 0; j < i; j++) if (A->tmp[j].d) { CU(cuMemFreeAsync, A->tmp[j].d, h); A->tmp[j].d = 0; }
  if (r != CUDA_SUCCESS)
    cl_check(L, r, lua_pushfstring(L, "%s: temporary device copy of a host array argument", KWHERE(L, kidx)));
}


/* a captured launch's conditions are its capture's (stream:condition), or of a capture whose
   conditional body it is in */
static void capture_conds(lua_State *L, cl_stream *s, int kidx, int first, int nargs) {
  for (int i = 0; i < nargs; i++) {
    cl_condition *c = luaL_testudata(L, first + i, CL_CONDITION_MT);
    if (c && !cl_capture_within(L, s, c->graph))
      cl_error_named(L, "%s argument %d: a graph condition is an argument only of kernel nodes of its graph "
                     "(and of their bodies), or of launches in its capture", KWHERE(L, kidx), i + 1);
  }
}

int cl_kernel_launch(lua_State *L, cl_kernel *k, int kidx, int first, const cl_launch *c) {
  cl_args A;
  int nargs = lua_gettop(L) - first + 1;
  cl_stream *s = c->s;
  CUstream h = s ? s->h : NULL;
  if (s && s->ctx != k->ctx) cl_stream_check(L, s, k->ctx, KWHERE(L, kidx), "kernel");
  cl_marshal(L, k, kidx, first, nargs, &A, 1);
  if (cl_capturing) {
    if (cl_capture_refuses(s, A.ntmp > 0)) cl_capture_guard(L, s, A.ntmp > 0, KWHERE(L, kidx));
    if (A.gmem) {   /* the name made once (pushed: a name per argument overflowed the stack) */
      luaL_checkstack(L, 4, NULL);
      const char *where = KWHERE(L, kidx);
      for (int i = 0; i < A.nused; i++)
        if (A.used[i]->gmem) cl_mem_graph_use(L, A.used[i], s, where);
    }
    if (A.conds) capture_conds(L, s, kidx, first, nargs);
    capture_keep(L, s, kidx, first, nargs, &A);
  }
  if (c->g[0] == 0) return 0;   /* forall(0): the arguments were checked, there is no work */
  /* after the arguments: a foreign array's view may have made the selected device current */
  cl_kernel_ctx(L, k);
  if (c->shared > k->dyn_max) cl_kernel_shared(L, k, kidx, c->shared);
  /* refusals first: they need none of the temporary copies below */
  if (c->cooperative) {
    CL_KERNEL_FRESH(k);   /* not on the plain path: there the driver has the last word */
    const char *why = coop_refusal(L, k, c);
    if (why) launch_error(L, kidx, c, &A, h, why);
  }
  if (c->cluster[0] || k->req_cluster[0]) {
    const char *why = cluster_refusal(L, k, c);
    if (why) launch_error(L, kidx, c, &A, h, why);
  }
  CL_BEFORE_ENQUEUE(L, KWHERE(L, kidx));
  if (A.ntmp) tmp_copies_in(L, &A, h, kidx);
  CUresult r = CL_PARKED(L, CL_PARK_ENQUEUE, !c->cooperative && !c->cluster[0]
    ? cu.cuLaunchKernel(k->fn, c->g[0], c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shared, h, A.params, NULL)
    : launch_ex(k, c, h, A.params));
  if (r != CUDA_SUCCESS) {
    const char *es = NULL;
    CU0(cuGetErrorString, r, &es);
    const char *hint = launch_hint(L, c, r);
    launch_error(L, kidx, c, &A, h, lua_pushfstring(L, "%s (%s)%s%s", cl_errname(r), es ? es : "", *hint ? ": " : "", hint));
  }
  for (int i = 0; i < A.nused; i++) cl_mem_use(L, A.used[i], s, k->ctx);
  if (A.ntmp) {
    for (int i = 0; i < A.ntmp; i++) {
      if (!A.tmp[i].d) continue;
      if (A.tmp[i].back && r == CUDA_SUCCESS) r = CU(cuMemcpyDtoHAsync, A.tmp[i].host, A.tmp[i].d, A.tmp[i].n, h);
      CU(cuMemFreeAsync, A.tmp[i].d, h);
    }
    CUresult r2 = cl_wait_raw(L, CL_WAIT_STREAM, h);
    if (r != CUDA_SUCCESS || r2 != CUDA_SUCCESS) {
      const char *where = KWHERE(L, kidx);
      cl_check(L, r, lua_pushfstring(L, "%s: copying a host array back after the kernel", where));
      cl_check(L, r2, lua_pushfstring(L, "%s: waiting for the kernel that used a host array", where));
    }
    cl_flush_deferred(L);   /* what host functions closed while it waited */
    cl_host_raise(L);
  }
  return 0;
}

/* k:launch({grid=, block=, stream=, shared=, cooperative=, cluster=}, ...) */
static int k_launch(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  cl_launch c;
  cl_launch_parse(L, 2, &c, CL_CFG_LAUNCH, "kernel:launch");
  return cl_kernel_launch(L, k, 1, 3, &c);   /* the table stays: it holds the stream */
}

void cl_open_launch(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushcfunction(L, k_launch); lua_setfield(L, -2, "launch");
  lua_pop(L, 1);
  /* cuda.NULL: a NULL pointer argument where a nil would be dropped (the end of a table) */
  lua_pushlightuserdata(L, NULL); lua_setfield(L, -2, "NULL");
}
