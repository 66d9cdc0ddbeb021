/* compile.c: NVRTC. Compiling needs no GPU when the architecture is given. The policy (options,
   shipped headers, finding kernels, the cache) lives in lua/cudalua/compile.lua. */
#include <stdlib.h>
#include <string.h>
#include "cl.h"

/* the compiled output NVRTC is asked for */
enum { OUT_CUBIN, OUT_PTX, OUT_LTOIR };

/* reads one output of prog as a Lua string; 0 when there is none */
static int push_output(lua_State *L, nvrtcProgram prog, int what) {
  size_t n = 0;
  nvrtcResult r = what == OUT_PTX ? cu.nvrtcGetPTXSize(prog, &n)
                : what == OUT_LTOIR ? cu.nvrtcGetLTOIRSize(prog, &n) : cu.nvrtcGetCUBINSize(prog, &n);
  if (r != NVRTC_SUCCESS || n == 0) return 0;
  char *img = malloc(n);
  if (!img) return 0;
  r = what == OUT_PTX ? cu.nvrtcGetPTX(prog, img)
    : what == OUT_LTOIR ? cu.nvrtcGetLTOIR(prog, img) : cu.nvrtcGetCUBIN(prog, img);
  if (r == NVRTC_SUCCESS) lua_pushlstring(L, img, what == OUT_PTX && n ? n - 1 : n);   /* PTX ends with a NUL */
  free(img);
  return r == NVRTC_SUCCESS;
}

/* nvrtc_compile(src, filename, {options}, {{name, text}, ...}, {name expressions}, output)
   output: "cubin" (default; the PTX comes too), "ptx" or "ltoir"
   -> image, log, {expression = lowered name}, ptx text or nil   |   nil, log, error */
static int l_nvrtc_compile(lua_State *L) {
  const char *src = cl_checklstring(L, 1, NULL);
  const char *fname = cl_checklstring(L, 2, NULL);
  cl_checktype(L, 3, LUA_TTABLE);
  cl_checktype(L, 4, LUA_TTABLE);
  cl_checktype(L, 5, LUA_TTABLE);
  static const char *const outs[] = {"cubin", "ptx", "ltoir", NULL};
  int out = cl_checkoption(L, 6, "cubin", outs);
  cl_lib_need(L, &cl_nvrtc);
  int nopt = (int)lua_rawlen(L, 3), nh = (int)lua_rawlen(L, 4), nx = (int)lua_rawlen(L, 5);
  /* the strings stay referenced by the argument tables while NVRTC reads them */
  const char **opts = lua_newuserdatauv(L, sizeof(char *) * (nopt + 2 * nh + 1), 0);
  const char **hsrc = opts + nopt, **hname = hsrc + nh;
  for (int i = 0; i < nopt; i++) {
    lua_rawgeti(L, 3, i + 1);
    if (!(opts[i] = lua_tostring(L, -1))) return cl_error(L, "cuda.compile", "option %d is not a string", i + 1);
    lua_pop(L, 1);
  }
  for (int i = 0; i < nh; i++) {
    lua_rawgeti(L, 4, i + 1);
    lua_rawgeti(L, -1, 1); hname[i] = lua_tostring(L, -1); lua_pop(L, 1);
    lua_rawgeti(L, -1, 2); hsrc[i] = lua_tostring(L, -1); lua_pop(L, 1);
    lua_pop(L, 1);
    if (!hname[i] || !hsrc[i]) return cl_error(L, "cuda.compile", "header %d needs a name and a text", i + 1);
  }
  nvrtcProgram prog;
  nvrtcResult r = cu.nvrtcCreateProgram(&prog, src, fname, nh, hsrc, hname);
  if (r != NVRTC_SUCCESS) return cl_error(L, "cuda.compile", "%s", cl_result_name(&cl_nvrtc, r));
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
    lua_pushstring(L, cl_result_name(&cl_nvrtc, r));
    free(log);
    cu.nvrtcDestroyProgram(&prog);
    return 3;
  }
  if (!push_output(L, prog, out)) {
    free(log);
    cu.nvrtcDestroyProgram(&prog);
    return cl_error(L, "cuda.compile", "cannot read the compiled %s", outs[out]);
  }
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
  /* a cubin's PTX, for module:ptx() */
  if (out != OUT_CUBIN || !push_output(L, prog, OUT_PTX)) lua_pushnil(L);
  free(log);
  cu.nvrtcDestroyProgram(&prog);
  return 4;
}

/* ---- ptx_strip ---- */
static int ident_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

typedef struct { const char *name; size_t len, line_start, line_end; int used; } pvar;

/* ptx_strip(ptx) -> ptx, number of declarations dropped. Drops the module-local .global
   variables (declared on one line, without .visible, .weak or .extern) that nothing in the
   module names. NVRTC emits every static constexpr member the headers instantiate as such
   a variable (about a thousand for <cooperative_groups.h>, libcu++'s numeric_limits and
   integral_constant members); ptxas keeps them all, and a cubin with them is 25 times the
   size and takes 30 times as long to load. In whole-program mode NVRTC also writes a plain
   __device__ variable without .visible: one no kernel uses goes too, which matters only to
   code looking globals up by name (cudalua does not). When this changes, bump PIPELINE in
   lua/cudalua/compile.lua: cached cubins were made by the old one. */
static int l_ptx_strip(lua_State *L) {
  size_t n;
  const char *s = cl_checklstring(L, 1, &n);
  size_t cap = 64, nv = 0;
  pvar *v = malloc(cap * sizeof *v);
  if (!v) return cl_error(L, NULL, "out of host memory");
  /* declarations: ".global ... NAME[...] = ...;" or ".global ... NAME;" on one line */
  for (size_t at = 0; at < n;) {
    size_t end = at;
    while (end < n && s[end] != '\n') end++;
    if (end - at > 8 && !memcmp(s + at, ".global", 7) && (s[at + 7] == ' ' || s[at + 7] == '\t')) {
      size_t stop = at, last = end;
      while (stop < end && s[stop] != '=' && s[stop] != ';' && s[stop] != '[') stop++;
      while (last > at && (s[last - 1] == ' ' || s[last - 1] == '\t' || s[last - 1] == '\r')) last--;
      size_t ne = stop;
      while (ne > at && (s[ne - 1] == ' ' || s[ne - 1] == '\t')) ne--;
      size_t nb = ne;
      while (nb > at && ident_char((unsigned char)s[nb - 1])) nb--;
      int several = memchr(s + at, ',', stop - at) != NULL;   /* ".global .u32 a, b;": kept */
      if (stop < end && last > at && s[last - 1] == ';' && nb < ne && !several) {
        if (nv == cap) {
          pvar *nv2 = realloc(v, 2 * cap * sizeof *v);
          if (!nv2) { free(v); return cl_error(L, NULL, "out of host memory"); }
          v = nv2; cap *= 2;
        }
        v[nv++] = (pvar){s + nb, ne - nb, at, end, 0};
      }
    }
    at = end + 1;
  }
  if (nv == 0) { free(v); lua_settop(L, 1); lua_pushinteger(L, 0); return 2; }
  /* an open-addressing table of the names, then every identifier of the text looked up */
  size_t tsize = 1;
  while (tsize < 2 * nv) tsize <<= 1;
  size_t *tab = calloc(tsize, sizeof *tab);   /* index + 1 into v; 0: empty */
  if (!tab) { free(v); return cl_error(L, NULL, "out of host memory"); }
  for (size_t i = 0; i < nv; i++) {
    size_t j = cl_fnv1a(CL_FNV_BASIS, v[i].name, v[i].len) & (tsize - 1);
    while (tab[j]) j = (j + 1) & (tsize - 1);
    tab[j] = i + 1;
  }
  for (size_t at = 0; at < n;) {
    if (!ident_char((unsigned char)s[at])) { at++; continue; }
    size_t b = at;
    while (at < n && ident_char((unsigned char)s[at])) at++;
    size_t j = cl_fnv1a(CL_FNV_BASIS, s + b, at - b) & (tsize - 1);
    for (; tab[j]; j = (j + 1) & (tsize - 1)) {
      pvar *p = &v[tab[j] - 1];
      if (p->len == at - b && !memcmp(p->name, s + b, p->len) && (b < p->line_start || b >= p->line_end)) p->used = 1;
    }
  }
  free(tab);
  /* the text without the unused declarations (v is in text order) */
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  size_t from = 0, dropped = 0;
  for (size_t i = 0; i < nv; i++) {
    if (v[i].used) continue;
    luaL_addlstring(&buf, s + from, v[i].line_start - from);
    from = v[i].line_end < n ? v[i].line_end + 1 : n;
    dropped++;
  }
  luaL_addlstring(&buf, s + from, n - from);
  free(v);
  luaL_pushresult(&buf);
  lua_pushinteger(L, (lua_Integer)dropped);
  return 2;
}

/* supported architectures, e.g. {75, 80, ..., 120} */
static int l_nvrtc_archs(lua_State *L) {
  cl_lib_need(L, &cl_nvrtc);
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
  lua_pushcfunction(L, l_ptx_strip); lua_setfield(L, -2, "ptx_strip");
}
