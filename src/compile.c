/* compile.c: NVRTC. Compiling needs no GPU when the architecture is given. The policy (options,
   shipped headers, finding kernels, the cache) lives in lua/cudalua/compile.lua. */
#include <stdlib.h>
#include <string.h>
#include "cl.h"

/* nvrtc_compile(src, filename, {options}, {{name, text}, ...}, {name expressions}, ptx)
   -> image, log, {expression = lowered name}   |   nil, log, error */
static int l_nvrtc_compile(lua_State *L) {
  const char *src = luaL_checkstring(L, 1);
  const char *fname = luaL_checkstring(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  int ptx = lua_toboolean(L, 6);
  if (!cl_nvrtc_load()) return luaL_error(L, "%s", cl_nvrtc_error());
  int nopt = (int)lua_rawlen(L, 3), nh = (int)lua_rawlen(L, 4), nx = (int)lua_rawlen(L, 5);
  /* the strings stay referenced by the argument tables while NVRTC reads them */
  const char **opts = lua_newuserdatauv(L, sizeof(char *) * (nopt + 2 * nh + 1), 0);
  const char **hsrc = opts + nopt, **hname = hsrc + nh;
  for (int i = 0; i < nopt; i++) {
    lua_rawgeti(L, 3, i + 1);
    if (!(opts[i] = lua_tostring(L, -1))) return luaL_error(L, "cuda.compile: option %d is not a string", i + 1);
    lua_pop(L, 1);
  }
  for (int i = 0; i < nh; i++) {
    lua_rawgeti(L, 4, i + 1);
    lua_rawgeti(L, -1, 1); hname[i] = lua_tostring(L, -1); lua_pop(L, 1);
    lua_rawgeti(L, -1, 2); hsrc[i] = lua_tostring(L, -1); lua_pop(L, 1);
    lua_pop(L, 1);
    if (!hname[i] || !hsrc[i]) return luaL_error(L, "cuda.compile: header %d needs a name and a text", i + 1);
  }
  nvrtcProgram prog;
  nvrtcResult r = cu.nvrtcCreateProgram(&prog, src, fname, nh, hsrc, hname);
  if (r != NVRTC_SUCCESS) return luaL_error(L, "cuda.compile: %s", cu.nvrtcGetErrorString(r));
  for (int i = 0; i < nx; i++) {
    lua_rawgeti(L, 5, i + 1);
    const char *e = lua_tostring(L, -1);
    lua_pop(L, 1);
    if (e && (r = cu.nvrtcAddNameExpression(prog, e)) != NVRTC_SUCCESS) break;
  }
  if (r == NVRTC_SUCCESS) r = cu.nvrtcCompileProgram(prog, nopt, opts);
  size_t logn = 0;
  cu.nvrtcGetProgramLogSize(prog, &logn);
  char *log = malloc(logn + 1);
  if (log) { log[0] = 0; if (logn) cu.nvrtcGetProgramLog(prog, log); }
  if (r != NVRTC_SUCCESS) {
    lua_pushnil(L);
    lua_pushstring(L, log ? log : "");
    lua_pushstring(L, cu.nvrtcGetErrorString(r));
    free(log);
    cu.nvrtcDestroyProgram(&prog);
    return 3;
  }
  size_t n = 0;
  r = ptx ? cu.nvrtcGetPTXSize(prog, &n) : cu.nvrtcGetCUBINSize(prog, &n);
  char *img = r == NVRTC_SUCCESS ? malloc(n ? n : 1) : NULL;
  if (img) r = ptx ? cu.nvrtcGetPTX(prog, img) : cu.nvrtcGetCUBIN(prog, img);
  if (!img || r != NVRTC_SUCCESS) {
    free(img); free(log);
    cu.nvrtcDestroyProgram(&prog);
    return luaL_error(L, "cuda.compile: cannot read the compiled image");
  }
  lua_pushlstring(L, img, ptx && n ? n - 1 : n);   /* PTX ends with a NUL */
  lua_pushstring(L, log ? log : "");
  lua_createtable(L, 0, nx);
  for (int i = 0; i < nx; i++) {
    lua_rawgeti(L, 5, i + 1);
    const char *e = lua_tostring(L, -1), *low = NULL;
    if (e && cu.nvrtcGetLoweredName(prog, e, &low) == NVRTC_SUCCESS && low) {
      lua_pushstring(L, low);
      lua_rawset(L, -3);
    } else lua_pop(L, 1);
  }
  free(img); free(log);
  cu.nvrtcDestroyProgram(&prog);
  return 3;
}

/* supported architectures, e.g. {75, 80, ..., 120} */
static int l_nvrtc_archs(lua_State *L) {
  if (!cl_nvrtc_load()) return luaL_error(L, "%s", cl_nvrtc_error());
  int n = 0;
  cu.nvrtcGetNumSupportedArchs(&n);
  int *a = lua_newuserdatauv(L, sizeof(int) * (n ? n : 1), 0);
  cu.nvrtcGetSupportedArchs(a);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) { lua_pushinteger(L, a[i]); lua_rawseti(L, -2, i + 1); }
  return 1;
}

void cl_open_compile(lua_State *L) {
  lua_pushcfunction(L, l_nvrtc_compile); lua_setfield(L, -2, "nvrtc_compile");
  lua_pushcfunction(L, l_nvrtc_archs); lua_setfield(L, -2, "nvrtc_archs");
}
