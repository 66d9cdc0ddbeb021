/* rawloop.c: the raw side of the in-process comparisons (bench/core.lua, bench/cuda_cpp.lua,
   bench/multigpu.lua): cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
   cuMemAllocAsync/cuMemFreeAsync, cuMemcpyPeerAsync, cuMemcpy2DAsync, NCCL all_reduce, texture objects made and
   destroyed, module variables found and copied into in C loops, and NVRTC
   compiles, in the same process, context and stream as the cudalua side, so that the two take
   turns within a second: these costs drift by ~15% on the GPU machine between runs minutes
   apart. Bench only; links libcuda and NVRTC, opens NCCL with dlopen. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cuda.h>
#include <nvrtc.h>
#include <lua.h>
#include <lauxlib.h>

/* launch(handle, n): the empty kernel; launch(handle, n, a, b, m, s): four(float*, const
   float*, int, double) */
static int launch(lua_State *L) {
  CUfunction f = (CUfunction)(uintptr_t)luaL_checkinteger(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  CUdeviceptr a = 0, b = 0;
  int m = 0;
  double s = 0;
  void *args[] = {&a, &b, &m, &s}, **p = NULL;
  if (lua_gettop(L) > 2) {
    a = (CUdeviceptr)luaL_checkinteger(L, 3);
    b = (CUdeviceptr)luaL_checkinteger(L, 4);
    m = (int)luaL_checkinteger(L, 5);
    s = luaL_checknumber(L, 6);
    p = args;
  }
  for (lua_Integer i = 0; i < n; i++) {
    CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, p, NULL);
    if (r != CUDA_SUCCESS) return luaL_error(L, "rawloop: cuLaunchKernel failed (%d)", (int)r);
  }
  return 0;
}

/* alloc_free(n, bytes): n stream-ordered allocations, each freed at once, on the legacy stream */
static int alloc_free(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  size_t bytes = (size_t)luaL_checkinteger(L, 2);
  for (lua_Integer i = 0; i < n; i++) {
    CUdeviceptr p;
    CUresult r = cuMemAllocAsync(&p, bytes, NULL);
    if (r == CUDA_SUCCESS) r = cuMemFreeAsync(p, NULL);
    if (r != CUDA_SUCCESS) return luaL_error(L, "rawloop: alloc/free failed (%d)", (int)r);
  }
  return 0;
}

/* copy2d(n, dst, dpitch, src, spitch, width, height): n device-to-host cuMemcpy2DAsync of a
   pitched block into pinned memory, each waited for (the legacy stream) */
static int copy2d(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  CUDA_MEMCPY2D c = {0};
  c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = (void *)(uintptr_t)luaL_checkinteger(L, 2);
  c.dstPitch = (size_t)luaL_checkinteger(L, 3);
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE, c.srcDevice = (CUdeviceptr)luaL_checkinteger(L, 4);
  c.srcPitch = (size_t)luaL_checkinteger(L, 5);
  c.WidthInBytes = (size_t)luaL_checkinteger(L, 6), c.Height = (size_t)luaL_checkinteger(L, 7);
  for (lua_Integer i = 0; i < n; i++) {
    CUresult r = cuMemcpy2DAsync(&c, NULL);
    if (r == CUDA_SUCCESS) r = cuStreamSynchronize(NULL);
    if (r != CUDA_SUCCESS) return luaL_error(L, "rawloop: copy2d failed (%d)", (int)r);
  }
  return 0;
}

/* launch_ex(handle, n, grid, block, cluster, ptr): n launches of f(ptr) through
   cuLaunchKernelEx with a cluster dimension (cluster > 0) */
static int launch_ex(lua_State *L) {
  CUfunction f = (CUfunction)(uintptr_t)luaL_checkinteger(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  CUdeviceptr a = (CUdeviceptr)luaL_checkinteger(L, 6);
  void *args[] = {&a};
  CUlaunchAttribute at[1] = {0};
  CUlaunchConfig c = {0};
  c.gridDimX = (unsigned)luaL_checkinteger(L, 3); c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = (unsigned)luaL_checkinteger(L, 4); c.blockDimY = c.blockDimZ = 1;
  c.attrs = at;
  unsigned cluster = (unsigned)luaL_checkinteger(L, 5);
  if (cluster) {
    at[c.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    at[c.numAttrs].value.clusterDim.x = cluster;
    at[c.numAttrs].value.clusterDim.y = at[c.numAttrs].value.clusterDim.z = 1;
    c.numAttrs++;
  }
  for (lua_Integer i = 0; i < n; i++) {
    CUresult r = cuLaunchKernelEx(&c, f, args, NULL);
    if (r != CUDA_SUCCESS) return luaL_error(L, "rawloop: cuLaunchKernelEx failed (%d)", (int)r);
  }
  return 0;
}

/* launch_coop(handle, n, grid, block, ptr): n cuLaunchCooperativeKernel calls of f(ptr) */
static int launch_coop(lua_State *L) {
  CUfunction f = (CUfunction)(uintptr_t)luaL_checkinteger(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  unsigned g = (unsigned)luaL_checkinteger(L, 3), b = (unsigned)luaL_checkinteger(L, 4);
  CUdeviceptr a = (CUdeviceptr)luaL_checkinteger(L, 5);
  void *args[] = {&a};
  for (lua_Integer i = 0; i < n; i++) {
    CUresult r = cuLaunchCooperativeKernel(f, g, 1, 1, b, 1, 1, 0, NULL, args);
    if (r != CUDA_SUCCESS) return luaL_error(L, "rawloop: cuLaunchCooperativeKernel failed (%d)", (int)r);
  }
  return 0;
}

/* one NVRTC program with -arch=arch and the options: created, compiled, its CUBIN read (the
   caller frees it; NULL when it failed), destroyed */
static char *cubin_of(const char *src, const char *arch, int nopt, const char **more, size_t *size) {
  char archopt[32];
  snprintf(archopt, sizeof archopt, "-arch=%s", arch);
  const char *opts[16] = {archopt};
  for (int i = 0; i < nopt && i < 15; i++) opts[i + 1] = more[i];
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src, "bench.cu", 0, NULL, NULL) != NVRTC_SUCCESS) return NULL;
  char *img = NULL;
  if (nvrtcCompileProgram(prog, nopt + 1, opts) == NVRTC_SUCCESS && nvrtcGetCUBINSize(prog, size) == NVRTC_SUCCESS &&
      (img = malloc(*size)) && nvrtcGetCUBIN(prog, img) != NVRTC_SUCCESS) {
    free(img);
    img = NULL;
  }
  nvrtcDestroyProgram(&prog);
  return img;
}

/* compile(src, arch [, option...]): what bench/raw.c's compile does: one NVRTC program with
   -arch (and the options given), created, compiled, its CUBIN read, destroyed */
static int compile(lua_State *L) {
  const char *src = luaL_checkstring(L, 1), *arch = luaL_checkstring(L, 2);
  int nopt = lua_gettop(L) - 2;
  const char *opts[15];
  if (nopt > 15) return luaL_error(L, "rawloop: too many options");
  for (int i = 0; i < nopt; i++) opts[i] = luaL_checkstring(L, 3 + i);
  size_t size = 0;
  char *img = cubin_of(src, arch, nopt, opts, &size);
  if (!img) return luaL_error(L, "rawloop: compile failed");
  free(img);
  lua_pushinteger(L, (lua_Integer)size);
  return 1;
}

/* peer_copy(dst, dst_dev, src, src_dev, bytes, n, stream): n cuMemcpyPeerAsync on a stream */
static int peer_copy(lua_State *L) {
  CUdeviceptr dst = (CUdeviceptr)luaL_checkinteger(L, 1), src = (CUdeviceptr)luaL_checkinteger(L, 3);
  int dd = (int)luaL_checkinteger(L, 2), sd = (int)luaL_checkinteger(L, 4);
  size_t bytes = (size_t)luaL_checkinteger(L, 5);
  lua_Integer n = luaL_checkinteger(L, 6);
  CUstream s = (CUstream)(uintptr_t)luaL_checkinteger(L, 7);
  /* the primary contexts, retained once for the process (cudalua holds its own) */
  static CUcontext ctx[16];
  if (dd < 0 || sd < 0 || dd >= 16 || sd >= 16) return luaL_error(L, "rawloop: device id out of range");
  for (int k = 0; k < 2; k++) {
    int d = k ? sd : dd;
    CUdevice dev;
    if (!ctx[d] && (cuDeviceGet(&dev, d) || cuDevicePrimaryCtxRetain(&ctx[d], dev)))
      return luaL_error(L, "rawloop: no context for device %d", d);
  }
  for (lua_Integer i = 0; i < n; i++) {
    CUresult r = cuMemcpyPeerAsync(dst, ctx[dd], src, ctx[sd], bytes, s);
    if (r != CUDA_SUCCESS) return luaL_error(L, "rawloop: cuMemcpyPeerAsync failed (%d)", (int)r);
  }
  return 0;
}

/* nccl_all_reduce({comm...}, {send...}, {recv...}, count, n): n groups of one float32 sum
   all_reduce per communicator (NCCL opened with dlopen: no nccl.h needed) */
typedef int (*nccl_ar)(const void *, void *, size_t, int, int, void *, CUstream);
typedef int (*nccl_grp)(void);
static int nccl_all_reduce(lua_State *L) {
  static nccl_ar ar;
  static nccl_grp start, end;
  if (!ar) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("/usr/lib/x86_64-linux-gnu/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return luaL_error(L, "rawloop: no libnccl.so.2");
    ar = (nccl_ar)dlsym(h, "ncclAllReduce");
    start = (nccl_grp)dlsym(h, "ncclGroupStart");
    end = (nccl_grp)dlsym(h, "ncclGroupEnd");
  }
  int k = (int)lua_rawlen(L, 1);
  void *comm[16], *send[16], *recv[16];
  if (k > 16) return luaL_error(L, "rawloop: at most 16 communicators");
  for (int i = 0; i < k; i++) {
    lua_rawgeti(L, 1, i + 1); comm[i] = (void *)(uintptr_t)lua_tointeger(L, -1);
    lua_rawgeti(L, 2, i + 1); send[i] = (void *)(uintptr_t)lua_tointeger(L, -1);
    lua_rawgeti(L, 3, i + 1); recv[i] = (void *)(uintptr_t)lua_tointeger(L, -1);
    lua_pop(L, 3);
  }
  size_t count = (size_t)luaL_checkinteger(L, 4);
  lua_Integer n = luaL_checkinteger(L, 5);
  for (lua_Integer j = 0; j < n; j++) {
    start();
    for (int i = 0; i < k; i++)
      if (ar(send[i], recv[i], count, 7 /* float32 */, 0 /* sum */, comm[i], NULL))
        return luaL_error(L, "rawloop: ncclAllReduce failed");
    if (end()) return luaL_error(L, "rawloop: ncclGroupEnd failed");
  }
  return 0;
}

/* tex_create_destroy(n [, array]): n cuTexObjectCreate + cuTexObjectDestroy (point, clamp) over
   the CUDA array given (a cuda_array's handle) or a 4096 x 4096 float32 one of its own, as
   bench/helpers.lua's cuda.texture(ca):close() */
static int tex_create_destroy(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  static CUarray own;
  CUarray arr = (CUarray)(uintptr_t)luaL_optinteger(L, 2, (lua_Integer)(uintptr_t)own);
  if (!arr) {
    CUDA_ARRAY3D_DESCRIPTOR ad = {0};
    ad.Width = 4096; ad.Height = 4096; ad.Format = CU_AD_FORMAT_FLOAT; ad.NumChannels = 1;
    if (cuArray3DCreate(&own, &ad) != CUDA_SUCCESS) return luaL_error(L, "rawloop: cuArray3DCreate failed");
    arr = own;
  }
  CUDA_RESOURCE_DESC rd = {0};
  rd.resType = CU_RESOURCE_TYPE_ARRAY; rd.res.array.hArray = arr;
  CUDA_TEXTURE_DESC td = {0};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_CLAMP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  for (lua_Integer i = 0; i < n; i++) {
    CUtexObject t;
    if (cuTexObjectCreate(&t, &rd, &td, NULL) != CUDA_SUCCESS || cuTexObjectDestroy(t) != CUDA_SUCCESS)
      return luaL_error(L, "rawloop: cuTexObjectCreate/Destroy failed");
  }
  return 0;
}

/* global_copy(arch, n, stream): n cuModuleGetGlobal + cuMemcpyHtoDAsync of 64 KiB from pinned
   memory into a module variable (a module of its own, compiled once), on the stream */
static int global_copy(lua_State *L) {
  const char *arch = luaL_checkstring(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  CUstream s = (CUstream)(uintptr_t)luaL_checkinteger(L, 3);
  static CUmodule mod;
  static void *host;
  if (!mod) {
    static const char src[] = "__device__ float gbuf[16384];\n"
                              "extern \"C\" __global__ void gread(float *o) { o[0] = gbuf[0]; }\n";
    size_t size = 0;
    char *img = cubin_of(src, arch, 0, NULL, &size);
    if (!img || cuModuleLoadData(&mod, img) != CUDA_SUCCESS) mod = NULL;
    free(img);
    if (!mod || cuMemHostAlloc(&host, 65536, 0) != CUDA_SUCCESS) return luaL_error(L, "rawloop: global_copy setup failed");
  }
  for (lua_Integer i = 0; i < n; i++) {
    CUdeviceptr p;
    size_t bytes;
    if (cuModuleGetGlobal(&p, &bytes, mod, "gbuf") != CUDA_SUCCESS || cuMemcpyHtoDAsync(p, host, bytes, s) != CUDA_SUCCESS)
      return luaL_error(L, "rawloop: cuModuleGetGlobal/cuMemcpyHtoDAsync failed");
  }
  return 0;
}

int luaopen_rawloop(lua_State *L) {
  static const luaL_Reg f[] = {
    {"launch", launch}, {"alloc_free", alloc_free}, {"compile", compile}, {"launch_ex", launch_ex},
    {"launch_coop", launch_coop}, {"peer_copy", peer_copy}, {"nccl_all_reduce", nccl_all_reduce},
    {"tex_create_destroy", tex_create_destroy}, {"global_copy", global_copy}, {"copy2d", copy2d}, {NULL, NULL}};
  luaL_newlib(L, f);
  return 1;
}
