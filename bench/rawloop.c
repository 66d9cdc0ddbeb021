/* rawloop.c: the raw side of the in-process comparisons (bench/core.lua): cuLaunchKernel and
   cuMemAllocAsync/cuMemFreeAsync in C loops and NVRTC compiles, in the same process, context and stream as the
   cudalua side, so that the two take turns within a second: these costs drift by ~15% on the
   GPU machine between runs minutes apart. Bench only; links libcuda and NVRTC. */
#include <stdint.h>
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

/* compile(src, arch): what bench/raw.c's compile does: one NVRTC program with -arch only,
   created, compiled, its CUBIN read, destroyed */
static int compile(lua_State *L) {
  const char *src = luaL_checkstring(L, 1);
  const char *opt = lua_pushfstring(L, "-arch=%s", luaL_checkstring(L, 2));
  nvrtcProgram prog;
  size_t size = 0;
  nvrtcResult r = nvrtcCreateProgram(&prog, src, "bench.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) return luaL_error(L, "rawloop: %s", nvrtcGetErrorString(r));
  r = nvrtcCompileProgram(prog, 1, &opt);
  if (r == NVRTC_SUCCESS) r = nvrtcGetCUBINSize(prog, &size);
  char *img = r == NVRTC_SUCCESS ? malloc(size) : NULL;
  if (img) r = nvrtcGetCUBIN(prog, img);
  free(img);
  nvrtcDestroyProgram(&prog);
  if (r != NVRTC_SUCCESS) return luaL_error(L, "rawloop: compile failed: %s", nvrtcGetErrorString(r));
  lua_pushinteger(L, (lua_Integer)size);
  return 1;
}

int luaopen_rawloop(lua_State *L) {
  lua_newtable(L);
  lua_pushcfunction(L, launch);
  lua_setfield(L, -2, "launch");
  lua_pushcfunction(L, alloc_free);
  lua_setfield(L, -2, "alloc_free");
  lua_pushcfunction(L, compile);
  lua_setfield(L, -2, "compile");
  return 1;
}
