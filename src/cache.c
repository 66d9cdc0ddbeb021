/* cache.c: what the compile cache (lua/cudalua/cache.lua) needs from C: a fast 128-bit hash of
   a string (FNV-1a 64, and a second lane of its own) and creating its directory. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "cl.h"

static int l_hash(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)cl_checklstring(L, 1, &n);
  /* FNV-1a, and a lane of FNV-1a mixed with its high bits, in one pass: the two multiply
     chains overlap (cache hits hash whole binaries; cl_fnv1a then a second loop takes ~1.7x) */
  uint64_t a = CL_FNV_BASIS, b = 0x84222325cbf29ce4ULL ^ n;
  for (size_t i = 0; i < n; i++) {
    a = (a ^ s[i]) * CL_FNV_PRIME;
    b = (b ^ s[i] ^ (b >> 29)) * CL_FNV_PRIME;
  }
  char out[33];
  snprintf(out, sizeof out, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
  lua_pushstring(L, out);
  return 1;
}

/* file_info(path) -> size, mtime, is_directory | nil when there is nothing there */
static int l_file_info(lua_State *L) {
  struct stat st;
  if (stat(cl_checklstring(L, 1, NULL), &st) != 0) return 0;
  lua_pushinteger(L, (lua_Integer)st.st_size);
  lua_pushinteger(L, (lua_Integer)st.st_mtime);
  lua_pushboolean(L, S_ISDIR(st.st_mode));
  return 3;
}

/* mkdir_p(path) -> true | nil, message */
static int l_mkdir_p(lua_State *L) {
  const char *p = cl_checklstring(L, 1, NULL);
  char buf[4096];
  size_t n = strlen(p);
  if (n == 0 || n >= sizeof buf) { lua_pushnil(L); lua_pushliteral(L, "bad path"); return 2; }
  memcpy(buf, p, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == 0) {
      char c = buf[i];
      buf[i] = 0;
      if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", buf, strerror(errno));
        return 2;
      }
      buf[i] = c;
    }
  }
  struct stat st;
  if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
    lua_pushnil(L); lua_pushfstring(L, "%s: not a directory", p); return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

void cl_open_cache(lua_State *L) {
  lua_pushcfunction(L, l_hash); lua_setfield(L, -2, "hash");
  lua_pushcfunction(L, l_file_info); lua_setfield(L, -2, "file_info");
  lua_pushcfunction(L, l_mkdir_p); lua_setfield(L, -2, "mkdir_p");
}
