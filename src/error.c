/* error.c: every error cudalua raises has one form, `cudalua: <public name>: <what is wrong>`,
   where the public name is what the user wrote: cuda.copy, array:slice, stream:begin_capture,
   graph_exec:launch, comm:all_reduce, kernel 'add', array[i]. cl_error raises it; the argument
   checks below replace luaL_check* (whose `bad argument #2 to '?'` names no public function).
   where = NULL: the public name of the C function running, found where the user found it: a
   type's methods ("cudalua.array.methods" in the registry: array:slice), a metamethod (array[k]),
   or require "cudalua" and its parts (cuda.zeros, cuda.nvtx.mark, nccl.group). The Lua parts
   raise the same form through cudalua.check's error. */
#include <ctype.h>
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

/* The best name found so far sits in one stack slot: a lower rank wins (a method's own name
   before __index/__newindex, those before the other metamethods: array:close, not array:__gc,
   for the function registered as both), then the smaller name. So the answer does not hang on
   the order a table's keys come in, which Lua seeds per state. */
typedef struct { int slot, rank; } best_name;

static int rank_of(const char *k) {
  if (strncmp(k, "__", 2)) return 0;
  if (!strcmp(k, "__index") || !strcmp(k, "__newindex")) return 1;
  return !strcmp(k, "__gc") || !strcmp(k, "__close") ? 3 : 2;
}

/* each string key of the table at t whose value is f (at fi), named with prefix, against best */
static void find_in(lua_State *L, int t, int fi, const char *prefix, best_name *b) {
  if (!lua_istable(L, t)) return;
  lua_pushnil(L);
  while (lua_next(L, t)) {
    if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, fi)) {
      const char *k = lua_tostring(L, -2);
      const char *key = strcmp(prefix, "array") ? "k" : "i";   /* array[i], module[k] */
      int rank = rank_of(k);
      if (!strcmp(k, "__index")) lua_pushfstring(L, "%s[%s]", prefix, key);
      else if (!strcmp(k, "__newindex")) lua_pushfstring(L, "%s[%s] =", prefix, key);
      else if (!strncmp(k, "__", 2)) lua_pushfstring(L, "%s:%s", prefix, k);
      else lua_pushfstring(L, "%s%s", prefix, k);
      if (rank < b->rank || (rank == b->rank && strcmp(lua_tostring(L, -1), lua_tostring(L, b->slot)) < 0)) {
        lua_replace(L, b->slot);
        b->rank = rank;
      } else {
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
}

/* the types' methods ("cudalua.X.methods": X:name) and metatables ("cudalua.X": X[k], X:__call) */
static void find_in_types(lua_State *L, int fi, best_name *b) {
  int top = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, LUA_REGISTRYINDEX)) {
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    if (k && !strncmp(k, "cudalua.", 8) && lua_istable(L, -1)) {
      size_t n = strlen(k);
      int methods = n > 8 && !strcmp(k + n - 8, ".methods");
      lua_pushlstring(L, k, methods ? n - 8 : n);
      const char *prefix = lua_pushfstring(L, methods ? "%s:" : "%s", short_type(lua_tostring(L, -1)));
      find_in(L, top + 2, fi, prefix, b);
    }
    lua_settop(L, top + 1);
  }
  lua_settop(L, top);
}

/* require "cudalua" (cuda.), its tables one level down (cuda.nvtx.) and require "cudalua.nccl" */
static void find_in_modules(lua_State *L, int fi, best_name *b) {
  static const char *const mods[][2] = {{"cudalua", "cuda"}, {"cudalua.nccl", "nccl"}, {NULL, NULL}};
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  for (int i = 0; mods[i][0]; i++) {
    lua_settop(L, top + 1);
    if (lua_getfield(L, top + 1, mods[i][0]) != LUA_TTABLE) continue;
    find_in(L, top + 2, fi, lua_pushfstring(L, "%s.", mods[i][1]), b);
    lua_pushnil(L);
    while (lua_next(L, top + 2)) {
      if (lua_type(L, -2) == LUA_TSTRING && lua_istable(L, -1)) {
        const char *prefix = lua_pushfstring(L, "%s.%s.", mods[i][1], lua_tostring(L, -2));
        find_in(L, top + 5, fi, prefix, b);
      }
      lua_settop(L, top + 4);   /* the key stays for lua_next */
    }
  }
  lua_settop(L, top);
}

/* where the user found the function: as a method (a:f()) among the types first, else among the
   module's functions first (cuda.event_elapsed_time and event:elapsed_time are one function) */
const char *cl_where(lua_State *L) {
  lua_Debug ar;
  if (!lua_checkstack(L, 16) || !lua_getstack(L, 0, &ar)) return "cuda.call";
  lua_getinfo(L, "nf", &ar);
  int fi = lua_gettop(L);
  lua_pushliteral(L, "");
  best_name b = {fi + 1, 4};
  int method = ar.namewhat && !strcmp(ar.namewhat, "method");
  if (method) find_in_types(L, fi, &b); else find_in_modules(L, fi, &b);
  if (b.rank == 4) { if (method) find_in_modules(L, fi, &b); else find_in_types(L, fi, &b); }
  if (b.rank == 4) {   /* not found where the user finds it: the name the call used */
    const char *type = NULL;
    if (method && luaL_getmetafield(L, 1, "__name") == LUA_TSTRING) type = short_type(lua_tostring(L, -1));
    lua_pushfstring(L, "%s%s%s", type ? type : "cuda", type ? ":" : ".", ar.name ? ar.name : "call");
    lua_replace(L, b.slot);
  }
  lua_settop(L, b.slot);
  const char *s = lua_tostring(L, -1);
  lua_rotate(L, fi, 1);   /* keep the name on the stack until the error is raised */
  lua_settop(L, fi);
  return s;
}

/* the shape of a public name: cuda.copy, array:slice, array[i], kernel 'add', or a C API
   function (cudalua_push_device_array) */
static int public_shape(const char *w) {
  if (!strncmp(w, "kernel '", 8) || !strncmp(w, "elementwise '", 13) || !strncmp(w, "cudalua_", 8)) return 1;
  if (!isalpha((unsigned char)*w) && *w != '_') return 0;
  while (isalnum((unsigned char)*w) || *w == '_') w++;
  return *w == '.' || *w == ':' || *w == '[';
}

/* where: a public name, NULL or "" (the running function's), or what was being done
   ("reading a device array element"), which follows the running function's name */
int cl_error(lua_State *L, const char *where, const char *fmt, ...) {
  if (!where || !*where) where = cl_where(L);
  else if (!public_shape(where)) where = lua_pushfstring(L, "%s: %s", cl_where(L), where);
  va_list ap;
  va_start(ap, fmt);
  lua_pushfstring(L, "cudalua: %s: ", where);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

/* the same for a message whose first words are the public name with no colon after it:
   a kernel's call is named by the kernel ("kernel 'add' expects 3 arguments", "kernel 'add'
   argument 2 (float*): ..."), and "graph:kernel 'add': ..." names the kernel node's kernel */
int cl_error_named(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushliteral(L, "cudalua: ");
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
