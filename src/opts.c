/* opts.c: small helpers the files share: options tables (unknown keys refused by name,
   booleans checked), keep sets (Lua objects kept alive while the GPU may use them), handles
   written as hex text, and FNV-1a hashes. */
#include <string.h>
#include "cl.h"

/* raises naming the first key of the table at idx that is not in names */
void cl_check_options(lua_State *L, int idx, const char *where, const char *const names[]) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int i = 0;
    while (k && names[i] && strcmp(k, names[i])) i++;
    if (k && names[i]) continue;
    const char *key = luaL_tolstring(L, -1, NULL);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (i = 0; names[i]; i++) { if (i) luaL_addstring(&b, ", "); luaL_addstring(&b, names[i]); }
    luaL_pushresult(&b);
    cl_error(L, where, "unknown option '%s' (%s)", key, lua_tostring(L, -1));
  }
}

int cl_opt_bool(lua_State *L, int idx, const char *key, const char *where) {
  int t = lua_getfield(L, idx, key);
  if (t != LUA_TNIL && t != LUA_TBOOLEAN)
    cl_error(L, where, "%s must be a boolean, got %s", key, luaL_typename(L, -1));
  int v = t == LUA_TNIL ? -1 : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

void cl_keep(lua_State *L, int tidx, int idx) {
  int t = lua_type(L, idx);   /* strings are copied where they are used */
  if (t != LUA_TUSERDATA && t != LUA_TTABLE && t != LUA_TFUNCTION && t != LUA_TTHREAD) return;
  tidx = lua_absindex(L, tidx);
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, tidx);
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

void cl_add_hex(luaL_Buffer *b, const void *p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) {
    luaL_addchar(b, digits[c[i] >> 4]);
    luaL_addchar(b, digits[c[i] & 15]);
  }
}

int cl_hex_decode(const char *s, void *out, size_t n) {
  unsigned char *o = out;
  for (size_t i = 0; i < n; i++) {
    int hi = hexval(s[2 * i]), lo = hi < 0 ? -1 : hexval(s[2 * i + 1]);
    if (lo < 0) return 0;
    o[i] = (unsigned char)(hi << 4 | lo);
  }
  return 1;
}

uint64_t cl_fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * CL_FNV_PRIME;
  return h;
}
