/* link.c: nvJitLink, opened at run time like NVRTC. Links relocatable cubins, PTX, fatbins and
   LTO-IR into one cubin; needs no GPU. The policy (which inputs, which options) lives in
   lua/cudalua/compile.lua (cuda.link, cuda.load_module). */
#include <stdlib.h>
#include <string.h>
#include "cl.h"

/* the error log (or the info log) of h as a Lua string */
static void push_log(lua_State *L, nvJitLinkHandle h, int error) {
  size_t n = 0;
  nvJitLinkResult r = error ? cu.nvJitLinkGetErrorLogSize(h, &n) : cu.nvJitLinkGetInfoLogSize(h, &n);
  char *buf = r == NVJITLINK_SUCCESS && n ? malloc(n + 1) : NULL;
  if (buf) {
    buf[0] = 0;
    r = error ? cu.nvJitLinkGetErrorLog(h, buf) : cu.nvJitLinkGetInfoLog(h, buf);
    lua_pushstring(L, r == NVJITLINK_SUCCESS ? buf : "");
    free(buf);
  } else lua_pushliteral(L, "");
}

/* jitlink({{data, name [, "library"]}, ...}, {options}, want_ptx) -> cubin, info log, ptx or nil
                                                                   | nil, error log, result name
   "library": a static library (an ar archive of relocatable cubins, such as libcudadevrt.a),
   which nvJitLink takes only when told (NVJITLINK_INPUT_ANY does not look into archives) */
static int l_jitlink(lua_State *L) {
  cl_checktype(L, 1, LUA_TTABLE);
  cl_checktype(L, 2, LUA_TTABLE);
  int want_ptx = lua_toboolean(L, 3);
  cl_lib_need(L, &cl_nvjitlink);
  int nopt = (int)lua_rawlen(L, 2), nin = (int)lua_rawlen(L, 1);
  if (nin == 0) return cl_error(L, "cuda.link", "nothing to link");
  const char **opts = lua_newuserdatauv(L, sizeof(char *) * (nopt + 1), 0);
  for (int i = 0; i < nopt; i++) {
    if (lua_rawgeti(L, 2, i + 1) != LUA_TSTRING) return cl_error(L, "cuda.link", "option %d is not a string", i + 1);
    opts[i] = lua_tostring(L, -1);
    lua_pop(L, 1);   /* the string stays referenced by the options table */
  }
  for (int i = 0; i < nin; i++) {   /* checked before the handle exists: nothing to free on error */
    if (lua_rawgeti(L, 1, i + 1) != LUA_TTABLE || lua_rawgeti(L, -1, 1) != LUA_TSTRING)
      return cl_error(L, "cuda.link", "input %d is not {bytes, name}", i + 1);
    lua_pop(L, 2);
  }
  nvJitLinkHandle h = NULL;
  nvJitLinkResult r = cu.nvJitLinkCreate(&h, (uint32_t)nopt, opts);
  if (r != NVJITLINK_SUCCESS) {
    lua_pushnil(L);
    if (h) { push_log(L, h, 1); cu.nvJitLinkDestroy(&h); } else lua_pushliteral(L, "");
    lua_pushstring(L, cl_result_name(&cl_nvjitlink, r));
    return 3;
  }
  for (int i = 0; i < nin && r == NVJITLINK_SUCCESS; i++) {
    lua_rawgeti(L, 1, i + 1);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    int library = lua_rawgeti(L, -3, 3) == LUA_TSTRING && !strcmp(lua_tostring(L, -1), "library");
    size_t n = 0;
    const char *data = lua_tolstring(L, -3, &n), *name = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "input";
    /* the library tells cubin, PTX, fatbin and LTO-IR apart by their contents */
    r = cu.nvJitLinkAddData(h, library ? NVJITLINK_INPUT_LIBRARY : NVJITLINK_INPUT_ANY, data, n, name);
    lua_pop(L, 4);
  }
  if (r == NVJITLINK_SUCCESS) r = cu.nvJitLinkComplete(h);
  if (r != NVJITLINK_SUCCESS) {
    lua_pushnil(L);
    push_log(L, h, 1);
    lua_pushstring(L, cl_result_name(&cl_nvjitlink, r));
    cu.nvJitLinkDestroy(&h);
    return 3;
  }
  size_t n = 0;
  char *img = NULL;
  if (cu.nvJitLinkGetLinkedCubinSize(h, &n) == NVJITLINK_SUCCESS && n && (img = malloc(n)) &&
      cu.nvJitLinkGetLinkedCubin(h, img) == NVJITLINK_SUCCESS)
    lua_pushlstring(L, img, n);
  else lua_pushnil(L);
  free(img);
  push_log(L, h, 0);
  img = NULL;
  /* PTX exists only when LTO-IR was linked (-lto) and -ptx was asked for */
  if (want_ptx && cu.nvJitLinkGetLinkedPtxSize(h, &n) == NVJITLINK_SUCCESS && n && (img = malloc(n)) &&
      cu.nvJitLinkGetLinkedPtx(h, img) == NVJITLINK_SUCCESS)
    lua_pushlstring(L, img, n - 1);
  else lua_pushnil(L);
  free(img);
  cu.nvJitLinkDestroy(&h);
  return 3;
}

void cl_open_link(lua_State *L) {
  lua_pushcfunction(L, l_jitlink); lua_setfield(L, -2, "jitlink");
}
