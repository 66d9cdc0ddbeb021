/* launch.c: kernel launches. Arguments are converted by the kernel's own parameter types; this
   is the hot path, so it does no allocation beyond the launcher object of k[{grid, block}]. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "cl.h"

#define LAUNCHER_MT "cudalua.launcher"
typedef struct {
  cl_kernel *k;
  cl_launch c;
} launcher;

/* the kernel's name and the C type of parameter i, for messages (slow path only) */
const char *cl_kernel_name(lua_State *L, int kidx) {
  if (luaL_testudata(L, kidx, LAUNCHER_MT)) { lua_getiuservalue(L, kidx, 1); kidx = lua_gettop(L); }
  if (lua_getiuservalue(L, kidx, 2) != LUA_TTABLE) return "?";   /* not a kernel */
  lua_getfield(L, -1, "name");
  return lua_isstring(L, -1) ? lua_tostring(L, -1) : "?";
}

static const char *ptypename(lua_State *L, int kidx, int i) {
  if (luaL_testudata(L, kidx, LAUNCHER_MT)) { lua_getiuservalue(L, kidx, 1); kidx = lua_gettop(L); }
  if (lua_getiuservalue(L, kidx, 2) != LUA_TTABLE || lua_getfield(L, -1, "types") != LUA_TTABLE) return "?";
  lua_rawgeti(L, -1, i + 1);
  return lua_isstring(L, -1) ? lua_tostring(L, -1) : "?";
}

static int arg_error(lua_State *L, int kidx, int i, int aidx, const char *msg) {
  const char *name = cl_kernel_name(L, kidx);
  const char *t = ptypename(L, kidx, i);
  const char *got = luaL_typename(L, aidx);
  if (lua_type(L, aidx) == LUA_TNUMBER) got = lua_tostring(L, aidx);
  else if (lua_type(L, aidx) == LUA_TSTRING) got = lua_pushfstring(L, "string (%I bytes)", (lua_Integer)lua_rawlen(L, aidx));
  cl_array *a = cl_toarray(L, aidx);
  if (a) got = a->mem ? (a->kind == CL_HOST ? "a pageable host array" : "an array") : "a closed array";
  return luaL_error(L, "cudalua: kernel '%s' argument %d (%s): %s, got %s", name, i + 1, t, msg, got);
}

/* an array of another context: host memory every device reaches, or a peer device's memory
   with peer access on; else an error naming both devices (slow path) */
static void reach(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_mem *m) {
  if (cl_mem_reachable(m, k->ctx)) return;
  int a = cl_device_of(m->ctx), b = cl_device_of(k->ctx);
  arg_error(L, kidx, i, idx, lua_pushfstring(L, "the array is on device %d and the kernel on device %d "
            "(cuda.enable_peer_access(%d, %d) lets device %d's kernels use device %d's memory)", a, b, b, a, b, a));
}

/* the cudalua array at idx, else NULL; by the metatable's address the kernel keeps (no
   registry lookup: this runs for every array argument of every launch) */
static cl_array *karray(lua_State *L, const cl_kernel *k, int idx) {
  cl_array *a = lua_touserdata(L, idx);
  if (!a || !lua_getmetatable(L, idx)) return NULL;
  if (lua_topointer(L, -1) != k->array_mt) a = NULL;
  lua_pop(L, 1);
  return a;
}



void cl_marshal(lua_State *L, cl_kernel *k, int kidx, int first, int nargs, cl_args *A,
                int allow_pageable) {
  if (nargs != k->nparams)
    luaL_error(L, "cudalua: kernel '%s' expects %d arguments, got %d", cl_kernel_name(L, kidx),
               k->nparams, nargs);
  A->nused = A->ntmp = 0;
  for (int i = 0; i < k->nparams; i++) {
    int idx = first + i;
    void *p = A->slots[i];
    A->params[i] = p;
    char c = k->ptype[i];
    if (c == 'p' || c == 'q') {
      cl_array *a = karray(L, k, idx);
      if (!a) {
        /* anything with __cuda_array_interface becomes an array view (src/interop.c) */
        a = cl_cai_view(L, idx);
        if (!a) arg_error(L, kidx, i, idx, "expected an array");
      }
      if (!a->mem) arg_error(L, kidx, i, idx, "expected an open array");
      if (c == 'p' && a->readonly)
        arg_error(L, kidx, i, idx, "expected a writable array (the parameter is not const)");
      if (a->kind == CL_HOST) {
        if (!allow_pageable)
          arg_error(L, kidx, i, idx, "expected a device, pinned, mapped or managed array (a pageable host array cannot be copied in and out here)");
        /* pageable memory: copied in before and out after the launch, as Numba does; the
           copies are made once every argument has been checked */
        A->tmp[A->ntmp].a = a; A->tmp[A->ntmp].back = c == 'p'; A->tmp[A->ntmp].d = 0;
        A->tmp[A->ntmp].slot = p;
        A->ntmp++;
        *(CUdeviceptr *)p = 0;
      } else {
        if (a->mem->ctx != k->ctx) reach(L, k, kidx, i, idx, a->mem);
        *(CUdeviceptr *)p = cl_devptr(a);
        A->used[A->nused++] = a->mem;
      }
      continue;
    }
    if (c == 'U') {   /* .u64 from PTX or 8 bytes of unknown type: an array or an address */
      cl_array *a = karray(L, k, idx);
      if (!a && lua_type(L, idx) != LUA_TNUMBER) a = cl_cai_view(L, idx);
      if (a) {
        if (!a->mem) arg_error(L, kidx, i, idx, "expected an open array");
        if (a->kind == CL_HOST)
          arg_error(L, kidx, i, idx, "expected a device, pinned, mapped or managed array (the parameter's type is not known, so a host array is not copied)");
        if (a->mem->ctx != k->ctx) reach(L, k, kidx, i, idx, a->mem);
        *(CUdeviceptr *)p = cl_devptr(a);
        A->used[A->nused++] = a->mem;
      } else if (lua_isinteger(L, idx)) {
        *(int64_t *)p = (int64_t)lua_tointeger(L, idx);
      } else {
        arg_error(L, kidx, i, idx, "expected an array or an integer address (give a signature for other 8-byte types)");
      }
      continue;
    }
    if (c == 'x' || c == 'y') {
      size_t n = 0;
      /* the type first: lua_tolstring would turn a number on the stack into a string */
      const char *str = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &n) : NULL;
      if (!str || n != k->psize[i])
        arg_error(L, kidx, i, idx, lua_pushfstring(L, c == 'x' ? "expected a string of exactly %d bytes"
          : "expected a string of exactly %d bytes (the type is not known: give a signature, module:get(name, \"float*, int\"))",
          (int)k->psize[i]));
      if (n <= sizeof A->slots[i]) memcpy(p, str, n);
      else A->params[i] = (void *)str;   /* the string stays on the stack meanwhile */
      continue;
    }
    if ((c == 'b' || c == 'B') && lua_type(L, idx) == LUA_TBOOLEAN) { *(uint8_t *)p = (uint8_t)lua_toboolean(L, idx); continue; }
    if (c == 'c' || c == 'C') {   /* cuFloatComplex / cuDoubleComplex: a number or {re, im} */
      int t = lua_type(L, idx);
      if (t != LUA_TNUMBER && !(t == LUA_TTABLE && lua_rawlen(L, idx) == 2))
        arg_error(L, kidx, i, idx, "expected a number or a pair {re, im}");
      cl_tovalue(L, idx, c == 'c' ? CL_C64 : CL_C128, p, "kernel argument", 0);
      continue;
    }
    if (lua_type(L, idx) != LUA_TNUMBER) arg_error(L, kidx, i, idx, "expected a number");
    if (c == 'f') {
      lua_Number v = lua_tonumber(L, idx);
      if (v == v && v - v == 0 && (v > FLT_MAX || v < -FLT_MAX)) arg_error(L, kidx, i, idx, "value out of range");
      *(float *)p = (float)v;
      continue;
    }
    if (c == 'd') { *(double *)p = lua_tonumber(L, idx); continue; }
    if (c == 'e') {
      lua_Number v = lua_tonumber(L, idx);
      if (v == v && v - v == 0 && (v > 65504.0 || v < -65504.0)) arg_error(L, kidx, i, idx, "value out of range");
      *(uint16_t *)p = cl_float_to_half((float)v);
      continue;
    }
    if (c == 'E') {   /* the elements' rule: what rounds to the largest bfloat16 fits */
      if (!cl_to_bf16(lua_tonumber(L, idx), (uint16_t *)p)) arg_error(L, kidx, i, idx, "value out of range");
      continue;
    }
    int isint;
    lua_Integer v = lua_tointegerx(L, idx, &isint);
    if (!isint) {
      lua_Number f = lua_tonumber(L, idx);
      /* uint64 values past 2^63 exist in Lua only as floats */
      if (c == 'L' && f == floor(f) && f >= 0 && f < 18446744073709551616.0) { *(uint64_t *)p = (uint64_t)f; continue; }
      arg_error(L, kidx, i, idx, f == floor(f) ? "value out of range" : "expected an integer");
    }
    int ok = 1;
    switch (c) {
      case 'a': ok = v >= INT8_MIN && v <= INT8_MAX; *(int8_t *)p = (int8_t)v; break;
      case 'A': ok = v >= 0 && v <= UINT8_MAX; *(uint8_t *)p = (uint8_t)v; break;
      case 's': ok = v >= INT16_MIN && v <= INT16_MAX; *(int16_t *)p = (int16_t)v; break;
      case 'S': ok = v >= 0 && v <= UINT16_MAX; *(uint16_t *)p = (uint16_t)v; break;
      case 'i': ok = v >= INT32_MIN && v <= INT32_MAX; *(int32_t *)p = (int32_t)v; break;
      case 'I': ok = v >= 0 && v <= (lua_Integer)UINT32_MAX; *(uint32_t *)p = (uint32_t)v; break;
      case 'l': *(int64_t *)p = v; break;
      case 'L': ok = v >= 0; *(uint64_t *)p = (uint64_t)v; break;
      case 'b': ok = v == 0 || v == 1; *(uint8_t *)p = (uint8_t)v; break;
      /* PTX types say the width, not the sign: either sign's range */
      case 'B': ok = v >= INT8_MIN && v <= UINT8_MAX; *(uint8_t *)p = (uint8_t)v; break;
      case 'H': ok = v >= INT16_MIN && v <= UINT16_MAX; *(uint16_t *)p = (uint16_t)v; break;
      case 'W': ok = v >= INT32_MIN && v <= (lua_Integer)UINT32_MAX; *(uint32_t *)p = (uint32_t)v; break;
      default: ok = 0;
    }
    if (!ok) arg_error(L, kidx, i, idx, "value out of range");
  }
}

/* keeps the kernel and its arrays alive as long as the graph a capture makes; a set (it
   becomes the graph's keep set), so a captured loop does not grow it launch by launch. Streams
   joined to the capture of another find its table too. */
static void capture_keep(lua_State *L, cl_stream *s, int kidx, int first, int nargs) {
  if (!cl_capture_push_keep(L, s)) return;
  lua_pushvalue(L, kidx); lua_pushboolean(L, 1); lua_rawset(L, -3);
  for (int i = 0; i < nargs; i++)
    if (lua_type(L, first + i) == LUA_TUSERDATA) { lua_pushvalue(L, first + i); lua_pushboolean(L, 1); lua_rawset(L, -3); }
  lua_pop(L, 1);
}

/* dynamic shared memory over what the kernel may use now (48 KiB less its static shared
   memory, to begin with): the kernel is opted in for that size, once, up to the device's
   opt-in limit */
void cl_kernel_shared(lua_State *L, cl_kernel *k, int kidx, unsigned shared) {
  if (shared <= k->dyn_max) return;
  cl_kernel_ctx(L, k);
  int optin = 0;
  CUdevice dev;
  if (CU0(cuCtxGetDevice, &dev) == CUDA_SUCCESS)
    CU0(cuDeviceGetAttribute, &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  if ((long long)shared + k->static_shared > optin)
    luaL_error(L, "cudalua: kernel '%s': %d bytes of dynamic shared memory asked for; with its %d "
               "bytes of static shared memory this device allows at most %d (its opt-in limit per block is %d)",
               cl_kernel_name(L, kidx), (int)shared, k->static_shared,
               optin > k->static_shared ? optin - k->static_shared : 0, optin);
  /* the attribute belongs to the function, which other kernel objects (the same symbol got
     with another signature) share: it is only ever raised */
  int now = 0;
  CU(cuFuncGetAttribute, &now, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k->fn);
  if ((unsigned)now < shared) {
    CUresult r = CU(cuFuncSetAttribute, k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared);
    if (r != CUDA_SUCCESS)
      luaL_error(L, "cudalua: kernel '%s': cannot opt in to %d bytes of dynamic shared memory: %s",
                 cl_kernel_name(L, kidx), (int)shared, cl_errname(r));
    now = (int)shared;
  }
  k->dyn_max = (unsigned)now;
  k->occ_block = 0;
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

/* does the cluster tile the grid? (a 0 in the cluster: no cluster in that dimension) */
static int tiles(const unsigned g[3], const unsigned cl[3]) {
  for (int d = 0; d < 3; d++) if (cl[d] && g[d] % cl[d]) return 0;
  return 1;
}

/* a cluster configuration the driver would refuse, found before it is asked (checkers such as
   compute-sanitizer report every refused call): NULL when there is nothing to say */
static const char *cluster_refusal(lua_State *L, cl_kernel *k, const cl_launch *c) {
  if (k->binary_version && k->binary_version < 90)
    return lua_pushfstring(L, "the kernel's code is for sm_%d; thread block clusters need sm_90 or newer", k->binary_version);
  const unsigned *cl = k->req_cluster;
  if (!c->cluster[0] && !tiles(c->g, cl))
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

/* pageable host arrays passed to a kernel: copied to temporary device memory first. Their
   host addresses are taken now (a host function run during a wait may close the arrays; their
   memory's free is then put off until this call is done) */
static void tmp_copies_in(lua_State *L, cl_args *A, CUstream h) {
  for (int i = 0; i < A->ntmp; i++) {
    cl_still_open(L, A->tmp[i].a, "kernel launch");
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
  cl_check(L, r, "temporary device copy of a host array argument");
}

int cl_kernel_launch(lua_State *L, cl_kernel *k, int kidx, int first, const cl_launch *c) {
  cl_args A;
  int nargs = lua_gettop(L) - first + 1;
  cl_stream *s = c->s;
  CUstream h = s ? s->h : NULL;
  if (s && s->ctx != k->ctx) cl_stream_check(L, s, k->ctx, "kernel launch", "kernel");
  cl_marshal(L, k, kidx, first, nargs, &A, 1);
  if (cl_capturing) {
    cl_capture_guard(L, s, A.ntmp > 0, "kernel launch");
    capture_keep(L, s, kidx, first, nargs);
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
  CL_BEFORE_ENQUEUE(L, "kernel launch");
  if (A.ntmp) tmp_copies_in(L, &A, h);
  CUresult r = CL_PARKED(L, CL_PARK_ENQUEUE, !c->cooperative && !c->cluster[0]
    ? cu.cuLaunchKernel(k->fn, c->g[0], c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shared, h, A.params, NULL)
    : launch_ex(k, c, h, A.params));
  if (r != CUDA_SUCCESS) {
    const char *es = NULL;
    CU0(cuGetErrorString, r, &es);
    const char *hint = launch_hint(L, c, r);
    launch_error(L, kidx, c, &A, h, lua_pushfstring(L, "%s (%s)%s%s", cl_errname(r), es ? es : "", *hint ? ": " : "", hint));
  }
  for (int i = 0; i < A.nused; i++) cl_mem_use(A.used[i], s, k->ctx);
  if (A.ntmp) {
    for (int i = 0; i < A.ntmp; i++) {
      if (!A.tmp[i].d) continue;
      if (A.tmp[i].back && r == CUDA_SUCCESS) r = CU(cuMemcpyDtoHAsync, A.tmp[i].host, A.tmp[i].d, A.tmp[i].n, h);
      CU(cuMemFreeAsync, A.tmp[i].d, h);
    }
    CUresult r2 = cl_wait_raw(L, CL_WAIT_STREAM, h);
    cl_check(L, r, "copying a host array back after the kernel");
    cl_check(L, r2, "waiting for the kernel that used a host array");
    cl_flush_deferred(L);   /* what host functions closed while it waited */
    cl_host_raise(L);
  }
  return 0;
}

/* grid, block or cluster: an integer or {x [, y [, z]]}; messages name it as prefix .. what */
static void dims(lua_State *L, int idx, unsigned out[3], const char *prefix, const char *what) {
  out[0] = out[1] = out[2] = 1;
  int n = 1;
  if (lua_type(L, idx) == LUA_TTABLE) {
    n = (int)lua_rawlen(L, idx);
    if (n < 1 || n > 3) luaL_error(L, "cudalua: %s%s needs 1 to 3 dimensions, got %d", prefix, what, n);
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, idx, i + 1);
      int isint;
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      if (!isint || v < 1 || v > 0x7fffffff)
        luaL_error(L, "cudalua: %s%s[%d] must be an integer >= 1, got %s", prefix, what, i + 1,
                   luaL_tolstring(L, -1, NULL));
      out[i] = (unsigned)v;
      lua_pop(L, 1);
    }
    return;
  }
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint || v < 1 || v > 0x7fffffff)
    luaL_error(L, "cudalua: %s%s must be an integer >= 1 or a table of them, got %s", prefix, what,
               luaL_tolstring(L, idx, NULL));
  out[0] = (unsigned)v;
}

static unsigned shared_named(lua_State *L, int idx, const char *prefix, const char *what) {
  if (lua_isnoneornil(L, idx)) return 0;
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint || v < 0 || v > 0x7fffffff)
    luaL_error(L, "cudalua: %s%s must be an integer >= 0, got %s", prefix, what, luaL_tolstring(L, idx, NULL));
  return (unsigned)v;
}

static unsigned shared_bytes(lua_State *L, int idx) { return shared_named(L, idx, "", "shared memory size"); }

/* a cluster must tile the grid: checked when the configuration is made, not per launch */
static void cfg_check_cluster(lua_State *L, const cl_launch *c, const char *where) {
  if (c->cluster[0] && !tiles(c->g, c->cluster))
    luaL_error(L, "cudalua: %s: the grid {%d, %d, %d} is not a multiple of the cluster {%d, %d, %d}",
               where, c->g[0], c->g[1], c->g[2], c->cluster[0], c->cluster[1], c->cluster[2]);
}

static const char *const cfg_keys[] = {"grid", "block", "stream", "shared", "cooperative", "cluster", NULL};

/* one pass over the table: each key is checked and its value read where it is found */
void cl_launch_parse(lua_State *L, int idx, cl_launch *c, int mode, const char *where,
                     const char *prefix) {
  luaL_checktype(L, idx, LUA_TTABLE);
  idx = lua_absindex(L, idx);
  memset(c, 0, sizeof *c);
  int have = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int v = lua_gettop(L), w = -1;
    if (lua_type(L, v - 1) == LUA_TNUMBER) {
      lua_Integer i = lua_tointeger(L, v - 1);
      if (lua_isinteger(L, v - 1) && i >= 1 && i <= 4) w = (int)i - 1;
    } else if (lua_type(L, v - 1) == LUA_TSTRING) {
      const char *key = lua_tostring(L, v - 1);
      for (int j = 0; cfg_keys[j]; j++) if (!strcmp(key, cfg_keys[j])) { w = j; break; }
    }
    if (mode == CL_CFG_FORALL && w >= 0 && (w < 2 || lua_type(L, v - 1) != LUA_TSTRING)) w = -1;
    if (w < 0 && mode == CL_CFG_FORALL)
      luaL_error(L, "cudalua: forall: unknown option '%s' (stream, shared, cooperative, cluster)", luaL_tolstring(L, v - 1, NULL));
    if (w < 0) {   /* a misspelt option must not be ignored */
      int n = (int)lua_rawlen(L, idx);
      if (lua_type(L, v - 1) == LUA_TNUMBER && n > 4)
        luaL_error(L, "cudalua: launch configuration is {grid, block [, stream [, shared]]}, got %d entries", n);
      luaL_error(L, "cudalua: %s: unknown key %s in the launch configuration (grid, block, %scooperative, cluster; or {grid, block%s})",
                 where, lua_type(L, v - 1) == LUA_TSTRING ? lua_pushfstring(L, "'%s'", lua_tostring(L, v - 1)) : luaL_tolstring(L, v - 1, NULL),
                 mode == CL_CFG_GRAPH ? "shared, " : "stream, shared, ",
                 mode == CL_CFG_GRAPH ? ", nil, shared" : " [, stream [, shared]]");
    }
    if (have & (1 << w))
      luaL_error(L, "cudalua: %s: %s given both by name and as entry %d", where, cfg_keys[w], w + 1);
    have |= 1 << w;
    switch (w) {
      case 0: dims(L, v, c->g, prefix, "grid"); break;
      case 1: dims(L, v, c->b, prefix, "block"); break;
      case 2:
        if (mode == CL_CFG_GRAPH) {   /* {g, b, nil, shared} is written with false or 0 too */
          if (lua_toboolean(L, v) && !(lua_isinteger(L, v) && lua_tointeger(L, v) == 0))
            luaL_error(L, "cudalua: %s: a graph node has no stream (the graph is launched on one)", where);
        } else c->s = cl_tostream(L, v, mode == CL_CFG_FORALL ? "forall" : "launch configuration");
        break;
      case 3: c->shared = mode == CL_CFG_GRAPH ? shared_named(L, v, prefix, "shared") : shared_bytes(L, v); break;
      case 4:
        if (!lua_isboolean(L, v))
          luaL_error(L, "cudalua: %s: cooperative must be a boolean, got %s", where, luaL_typename(L, v));
        c->cooperative = lua_toboolean(L, v);
        break;
      case 5: dims(L, v, c->cluster, prefix, "cluster"); break;   /* n | {x, y, z} */
    }
    lua_settop(L, v - 1);
  }
  for (int w = 0; w < 2 && mode != CL_CFG_FORALL; w++)
    if (!(have & (1 << w))) luaL_error(L, "cudalua: %s: configuration needs %s", where, cfg_keys[w]);
  cfg_check_cluster(L, c, where);
}

static int launcher_call(lua_State *L) {
  launcher *l = lua_touserdata(L, 1);
  return cl_kernel_launch(L, l->k, 1, 2, &l->c);
}

static int launcher_gc(lua_State *L) {
  launcher *l = luaL_checkudata(L, 1, LAUNCHER_MT);
  cl_stream_unref(L, l->c.s);
  l->c.s = NULL;
  return 0;
}

/* a new launcher for the kernel at kidx with configuration c; takes a reference to c->s */
static launcher *push_launcher(lua_State *L, int kidx, cl_kernel *k, const cl_launch *c) {
  launcher *l = lua_newuserdatauv(L, sizeof *l, 1);
  l->k = k;
  l->c = *c;
  cl_stream_ref(l->c.s);
  luaL_setmetatable(L, LAUNCHER_MT);
  lua_pushvalue(L, kidx); lua_setiuservalue(L, -2, 1);
  return l;
}

static int same_config(const cl_launch *a, const cl_launch *b) {
  return !memcmp(a->g, b->g, sizeof a->g) && !memcmp(a->b, b->b, sizeof a->b) && a->shared == b->shared &&
         a->s == b->s && !memcmp(a->cluster, b->cluster, sizeof a->cluster) && a->cooperative == b->cooperative;
}

/* launchers are immutable: k[{grid, block}](...) and k:forall(n)(...) in a loop reuse the last
   one the kernel at kidx made, when the configuration is the same */
static void push_reused_launcher(lua_State *L, int kidx, cl_kernel *k, const cl_launch *c) {
  if (lua_getiuservalue(L, kidx, 3) == LUA_TUSERDATA && same_config(&((launcher *)lua_touserdata(L, -1))->c, c))
    return;
  lua_pop(L, 1);
  push_launcher(L, kidx, k, c);
  lua_pushvalue(L, -1); lua_setiuservalue(L, kidx, 3);
}

/* whether the table at 2 has no keys but 1..n (at most n + 1 steps: a named key such as
   cooperative may be stored before or after the positional ones) */
static int positional_only(lua_State *L, int n) {
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    lua_Integer i = lua_isinteger(L, -2) ? lua_tointeger(L, -2) : 0;
    lua_pop(L, 1);
    if (i < 1 || i > n) { lua_pop(L, 1); return 0; }
  }
  return 1;
}

/* k[{grid, block [, stream [, shared]], cooperative=, cluster=}] -> launcher */
int cl_kernel_index(lua_State *L) {
  cl_kernel *k = lua_touserdata(L, 1);
  if (lua_type(L, 2) == LUA_TTABLE) {
    cl_launch c;
    int n = (int)lua_rawlen(L, 2);
    if (n >= 2 && n <= 4 && positional_only(L, n)) {
      /* {grid, block [, stream [, shared]]} and nothing else: the tutorials' forms, in loops */
      memset(&c, 0, sizeof c);
      int gi, bi;
      lua_rawgeti(L, 2, 1);
      lua_rawgeti(L, 2, 2);
      lua_Integer g = lua_tointegerx(L, 3, &gi), b = lua_tointegerx(L, 4, &bi);
      if (gi && bi && g >= 1 && b >= 1 && g <= 0x7fffffff && b <= 0x7fffffff) {
        c.g[0] = (unsigned)g; c.b[0] = (unsigned)b;
        c.g[1] = c.g[2] = c.b[1] = c.b[2] = 1;
      } else {
        dims(L, 3, c.g, "", "grid");
        dims(L, 4, c.b, "", "block");
      }
      if (n >= 3) { lua_rawgeti(L, 2, 3); c.s = cl_tostream(L, -1, "launch configuration"); }
      if (n >= 4) { lua_rawgeti(L, 2, 4); c.shared = shared_bytes(L, -1); }
      lua_settop(L, 2);
      push_reused_launcher(L, 1, k, &c);
      return 1;
    }
    lua_settop(L, 2);
    if (n > 4 || (n < 2 && lua_getfield(L, 2, "block") == LUA_TNIL))
      return luaL_error(L, "cudalua: launch configuration is {grid, block [, stream [, shared]]}, got %d entries", n);
    lua_settop(L, 2);
    cl_launch_parse(L, 2, &c, CL_CFG_LAUNCH, "launch", "");
    push_reused_launcher(L, 1, k, &c);
    return 1;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  if (lua_type(L, 2) == LUA_TSTRING && !strcmp(lua_tostring(L, 2), "name")) {
    cl_kernel_name(L, 1);
    return 1;
  }
  return luaL_error(L, "cudalua: kernels have no field '%s' (launch with k[{grid, block}](...))",
                    luaL_tolstring(L, 2, NULL));
}

/* k:launch({grid=, block=, stream=, shared=, cooperative=, cluster=}, ...) */
static int k_launch(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  cl_launch c;
  cl_launch_parse(L, 2, &c, CL_CFG_LAUNCH, "launch", "");
  return cl_kernel_launch(L, k, 1, 3, &c);   /* the table stays: it holds the stream */
}

/* k:forall(n [, {stream=, shared=, cooperative=, cluster=}]) -> launcher covering n threads,
   with the block size the occupancy calculator picks (cached per kernel and dynamic shared
   memory size); with a cluster the grid is rounded up to a whole number of clusters */
static int k_forall(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  int isint;
  lua_Integer n = lua_tointegerx(L, 2, &isint);
  if (!isint || n < 0) return luaL_error(L, "cudalua: forall: n must be an integer >= 0, got %s", luaL_tolstring(L, 2, NULL));
  cl_launch c;
  memset(&c, 0, sizeof c);
  if (!lua_isnoneornil(L, 3)) {
    cl_launch_parse(L, 3, &c, CL_CFG_FORALL, "forall", "forall: ");
    if (c.cluster[0] && (c.cluster[1] != 1 || c.cluster[2] != 1))
      return luaL_error(L, "cudalua: forall: the grid is one-dimensional: cluster must be n or {n}");
  }
  CL_KERNEL_FRESH(k);
  cl_kernel_shared(L, k, 1, c.shared);
  cl_kernel_occupancy(L, k, c.shared);
  /* forall(0) launches nothing (Numba's test_forall_no_work): a grid of 0 blocks */
  lua_Integer grid = (n + k->occ_block - 1) / k->occ_block;
  unsigned per = c.cluster[0] ? c.cluster[0] : k->req_cluster[0] ? k->req_cluster[0] : 1;
  grid = (grid + per - 1) / per * per;
  if (grid > 0x7fffffff) return luaL_error(L, "cudalua: forall: n = %I needs too many blocks", n);
  c.g[0] = (unsigned)grid; c.g[1] = c.g[2] = 1;
  c.b[0] = (unsigned)k->occ_block; c.b[1] = c.b[2] = 1;
  push_reused_launcher(L, 1, k, &c);
  return 1;
}

/* k:max_blocks_per_sm(block [, shared]) */
static int k_max_blocks(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  lua_Integer b = luaL_checkinteger(L, 2);
  unsigned shared = shared_bytes(L, 3);
  luaL_argcheck(L, b >= 1 && b <= 1024, 2, "block size must be 1..1024");
  int nb = 0;
  cl_kernel_shared(L, k, 1, shared);
  cl_kernel_ctx(L, k);
  cl_check(L, CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &nb, k->fn, (int)b, shared),
           "max_blocks_per_sm");
  lua_pushinteger(L, nb);
  return 1;
}

static int launcher_tostring(lua_State *L) {
  launcher *l = luaL_checkudata(L, 1, LAUNCHER_MT);
  const cl_launch *c = &l->c;
  lua_pushfstring(L, "cudalua.launcher<grid {%d, %d, %d}, block {%d, %d, %d}, shared %d%s%s>", c->g[0],
                  c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shared,
                  c->cluster[0] ? lua_pushfstring(L, ", cluster {%d, %d, %d}", c->cluster[0], c->cluster[1], c->cluster[2]) : "",
                  c->cooperative ? ", cooperative" : "");
  return 1;
}

static int k_call(lua_State *L) {
  if (!luaL_testudata(L, 1, CL_KERNEL))
    return luaL_error(L, "cudalua: kernel call: expected a kernel, got %s", luaL_typename(L, 1));
  return luaL_error(L, "cudalua: kernel '%s' needs a launch configuration: k[{grid, block}](...)",
                    cl_kernel_name(L, 1));
}

void cl_open_launch(lua_State *L) {
  luaL_newmetatable(L, LAUNCHER_MT);
  lua_pushcfunction(L, launcher_call); lua_setfield(L, -2, "__call");
  lua_pushcfunction(L, launcher_gc); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, launcher_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  luaL_getmetatable(L, CL_KERNEL);
  lua_pushcfunction(L, k_call); lua_setfield(L, -2, "__call");
  lua_pop(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushcfunction(L, k_launch); lua_setfield(L, -2, "launch");
  lua_pushcfunction(L, k_forall); lua_setfield(L, -2, "forall");
  lua_pushcfunction(L, k_max_blocks); lua_setfield(L, -2, "max_blocks_per_sm");
  lua_pop(L, 1);
}
