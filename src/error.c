/* error.c: every error cudalua raises has one form, `cudalua: <public name>: <what is wrong>`,
   where the public name is what the user wrote: cuda.copy, array:slice, stream:begin_capture,
   graph_exec:launch, comm:all_reduce, kernel 'add', array[i]. cl_error raises it; the argument
   checks below replace luaL_check* (whose `bad argument #2 to '?'` names no public function).
   where = NULL: the public name of the C function running, found where the user found it: a
   type's methods ("cudalua.array.methods" in the registry: array:slice), a metamethod (array[k]),
   or require "cudalua" and its parts (cuda.zeros, cuda.nvtx.mark, nccl.group). The Lua parts
   raise the same form through cudalua.check's error. */
#include <stdarg.h>
#include <string.h>
#include "cl.h"

/* "cudalua.nccl_comm" -> "comm": the name the docs give an object of the type */
static const char *short_type(const char *t) {
  static const char *const map[][2] = {
    {"cudalua.nccl_comm", "comm"}, {"cudalua.graph_node", "node"},
    {"cudalua.loaded_module", "module"}, {NULL, NULL}};
  for (int i = 0; map[i][0]; i++) if (!strcmp(t, map[i][0])) return map[i][1];
  return strncmp(t, "cudalua.", 8) ? t : t + 8;
}

/* the prefix on the top of the stack becomes "prefix<key>" if the table at t holds f (at fi)
   under a string key: 1 if so; else 0, the stack as it was */
static int find_in(lua_State *L, int t, int fi) {
  int top = lua_gettop(L);
  if (!lua_istable(L, t)) return 0;
  const char *prefix = lua_tostring(L, top);
  lua_pushnil(L);
  while (lua_next(L, t)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, fi)) {
      const char *k = lua_tostring(L, -2);
      const char *key = strcmp(prefix, "array") ? "k" : "i";   /* array[i], module[k] */
      if (!strcmp(k, "__index")) lua_pushfstring(L, "%s[%s]", prefix, key);
      else if (!strcmp(k, "__newindex")) lua_pushfstring(L, "%s[%s] =", prefix, key);
      else if (!strncmp(k, "__", 2)) lua_pushfstring(L, "%s:%s", prefix, k);
      else lua_pushfstring(L, "%s%s", prefix, k);
      lua_replace(L, top);
      lua_settop(L, top);
      return 1;
    }
    lua_pop(L, 1);
  }
  return 0;
}

/* pushes the public name of f (at fi) as one of the types' methods or metamethods */
static int find_in_types(lua_State *L, int fi) {
  int top = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, LUA_REGISTRYINDEX)) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    if (k && !strncmp(k, "cudalua.", 8) && lua_istable(L, -1)) {
      size_t n = strlen(k);
      int methods = n > 8 && !strcmp(k + n - 8, ".methods");
      lua_pushlstring(L, k, methods ? n - 8 : n);
      lua_pushfstring(L, methods ? "%s:" : "%s", short_type(lua_tostring(L, -1)));
      if (find_in(L, top + 2, fi)) {
        lua_replace(L, top + 1);
        lua_settop(L, top + 1);
        return 1;
      }
    }
    lua_settop(L, top + 1);
  }
  return 0;
}

/* pushes the public name of f (at fi) in require "cudalua" (cuda.), its tables one level down
   (cuda.nvtx.) and require "cudalua.nccl" (nccl.) */
static int find_in_modules(lua_State *L, int fi) {
  static const char *const mods[][2] = {{"cudalua", "cuda"}, {"cudalua.nccl", "nccl"}, {NULL, NULL}};
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  for (int i = 0; mods[i][0]; i++) {
    lua_settop(L, top + 1);
    if (lua_getfield(L, top + 1, mods[i][0]) != LUA_TTABLE) continue;
    lua_pushfstring(L, "%s.", mods[i][1]);
    if (find_in(L, top + 2, fi)) goto found;
    lua_pushnil(L);
    while (lua_next(L, top + 2)) {
      if (lua_type(L, -2) == LUA_TSTRING && lua_istable(L, -1)) {
        lua_pushfstring(L, "%s.%s.", mods[i][1], lua_tostring(L, -2));
        if (find_in(L, top + 5, fi)) goto found;
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  return 0;
found:
  lua_replace(L, top + 1);
  lua_settop(L, top + 1);
  return 1;
}

const char *cl_where(lua_State *L) {
  lua_Debug ar;
  if (!lua_checkstack(L, 12) || !lua_getstack(L, 0, &ar)) return "cuda.call";
  lua_getinfo(L, "nf", &ar);
  int fi = lua_gettop(L);
  if (!find_in_types(L, fi) && !find_in_modules(L, fi)) {
    /* not found where the user finds it: the name the call used */
    const char *type = NULL;
    if (ar.namewhat && !strcmp(ar.namewhat, "method") && luaL_getmetafield(L, 1, "__name") == LUA_TSTRING) {
      type = short_type(lua_tostring(L, -1));
    }
    lua_pushfstring(L, "%s%s%s", type ? type : "cuda", type ? ":" : ".", ar.name ? ar.name : "call");
  }
  const char *s = lua_tostring(L, -1);
  lua_rotate(L, fi, 1);   /* keep the name on the stack until the error is raised */
  lua_settop(L, fi);
  return s;
}

int cl_error(lua_State *L, const char *where, const char *fmt, ...) {
  if (!where) where = cl_where(L);
  va_list ap;
  va_start(ap, fmt);
  lua_pushfstring(L, "cudalua: %s: ", where);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

/* a message that has a prefix of its own ("cudalua: no CUDA driver found", "cudalua.nccl: NCCL
   not found": a library's, made once) without it, for cl_error to give the public name */
const char *cl_unprefixed(const char *msg) {
  if (!strncmp(msg, "cudalua: ", 9)) return msg + 9;
  if (!strncmp(msg, "cudalua.nccl: ", 14)) return msg + 14;
  return msg;
}

int cl_argerror(lua_State *L, int arg, const char *msg) {
  return cl_error(L, NULL, "argument %d: %s", arg, msg);
}

/* Lua's words after the prefix ("number expected, got string"), so that messages read as
   luaL_check*'s did, now naming the public function */
int cl_typeerror(lua_State *L, int arg, const char *expected) {
  const char *got;
  if (luaL_getmetafield(L, arg, "__name") == LUA_TSTRING) got = lua_tostring(L, -1);
  else if (lua_type(L, arg) == LUA_TLIGHTUSERDATA) got = "light userdata";
  else got = luaL_typename(L, arg);
  return cl_error(L, NULL, "argument %d: %s expected, got %s", arg, expected, got);
}

lua_Integer cl_checkinteger(lua_State *L, int arg) {
  int ok;
  lua_Integer i = lua_tointegerx(L, arg, &ok);
  if (!ok) {
    if (lua_isnumber(L, arg)) cl_argerror(L, arg, "number has no integer representation");
    cl_typeerror(L, arg, "number");
  }
  return i;
}

lua_Integer cl_optinteger(lua_State *L, int arg, lua_Integer def) {
  return lua_isnoneornil(L, arg) ? def : cl_checkinteger(L, arg);
}

lua_Number cl_checknumber(lua_State *L, int arg) {
  int ok;
  lua_Number x = lua_tonumberx(L, arg, &ok);
  if (!ok) cl_typeerror(L, arg, "number");
  return x;
}

const char *cl_checklstring(lua_State *L, int arg, size_t *len) {
  const char *s = lua_tolstring(L, arg, len);
  if (!s) cl_typeerror(L, arg, "string");
  return s;
}

const char *cl_optlstring(lua_State *L, int arg, const char *def, size_t *len) {
  if (!lua_isnoneornil(L, arg)) return cl_checklstring(L, arg, len);
  if (len) *len = def ? strlen(def) : 0;
  return def;
}

void cl_checktype(lua_State *L, int arg, int t) {
  if (lua_type(L, arg) != t) {
    cl_typeerror(L, arg, lua_typename(L, t));
  }
}

void *cl_checkudata(lua_State *L, int arg, const char *tname) {
  void *p = luaL_testudata(L, arg, tname);
  if (!p) cl_typeerror(L, arg, tname);
  return p;
}

int cl_checkoption(lua_State *L, int arg, const char *def, const char *const lst[]) {
  const char *name = def && lua_isnoneornil(L, arg) ? def : cl_checklstring(L, arg, NULL);
  for (int i = 0; lst[i]; i++) if (!strcmp(lst[i], name)) return i;
  return cl_error(L, NULL, "argument %d: invalid option '%s'", arg, name);
}
