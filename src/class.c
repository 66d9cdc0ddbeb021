/* class.c: how a Lua type of cudalua is declared. Each type file describes its type once (a
   cl_class: name, methods, __index function, metamethods) and cl_class_define makes the
   metatable from it, so every type is registered the same way. */
#include "cl.h"

void cl_class_define(lua_State *L, const cl_class *c) {
  /* defined once: a second definition would drop the methods other files added since */
  if (!luaL_newmetatable(L, c->name)) { lua_pop(L, 1); return; }   /* (it sets __name too) */
  int nup = 0;
  if (c->methods) {
    lua_newtable(L);
    luaL_setfuncs(L, c->methods, 0);
    /* other files add their methods to the type through the registry (copy.c, capture.c...) */
    lua_pushfstring(L, "%s.methods", c->name);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
    nup = 1;
  }
  if (c->index) lua_pushcclosure(L, c->index, nup);   /* the methods as its upvalue 1 */
  if (c->index || c->methods) lua_setfield(L, -2, "__index");
  if (c->meta) luaL_setfuncs(L, c->meta, 0);
  if (c->key) { lua_pushvalue(L, -1); lua_rawsetp(L, LUA_REGISTRYINDEX, c->key); }
  lua_pop(L, 1);
}

/* (lua_getfield with a C string looks the name up in Lua's string cache: a strcmp a call) */
void cl_class_set(lua_State *L, const void *key) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  lua_setmetatable(L, -2);
}

void *cl_class_test(lua_State *L, int idx, const void *key) {
  void *p = lua_touserdata(L, idx);
  if (!p || !lua_getmetatable(L, idx)) return NULL;
  lua_rawgetp(L, LUA_REGISTRYINDEX, key);
  int same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same ? p : NULL;
}
