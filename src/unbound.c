/* unbound.c: the C half of lua/cudalua/nodes.lua, the seed's graph nodes that belong to no graph
   until node:build(): the kernel node's constructor, node:build's walk and its adding. Graphs
   of thousands of kernel nodes are made in loops, and making the nodes and building them must
   cost about what the same g:kernel calls do (bench/helpers.lua), so none of this calls Lua
   per kernel node. */
#include <string.h>
#include "cl.h"

/* whether the value at idx has the metatable at mtidx (the unbound nodes') */
static int is_node(lua_State *L, int idx, int mtidx) {
  if (!lua_getmetatable(L, idx)) return 0;
  int r = lua_rawequal(L, -1, mtidx);
  lua_pop(L, 1);
  return r;
}

/* the list at idx copied into a new table (pushed), nil an empty one: the caller's table is not
   kept, so changing it after does not change the node. deps: its elements must be nodes */
static void copy_list(lua_State *L, int idx, int mtidx, int deps) {
  if (lua_isnoneornil(L, idx)) { lua_newtable(L); return; }
  int node = is_node(L, idx, mtidx);
  if (lua_type(L, idx) != LUA_TTABLE || node) {
    if (deps) cl_error(L, "cuda.graph.kernel", "deps must be a list of nodes, got %s",
                       node ? "a node (wrap it: {node})" : luaL_typename(L, idx));
    cl_error(L, "cuda.graph.kernel", "args must be a list, got %s", luaL_typename(L, idx));
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  lua_createtable(L, (int)n, 0);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    if (deps && !is_node(L, -1, mtidx))
      cl_error(L, "cuda.graph.kernel", "deps[%I] must be a node, got %s", i, luaL_typename(L, -1));
    lua_rawseti(L, -2, i);
  }
}

/* the kernel node constructor, cuda.graph.kernel's __call: (self, k, config, args, deps) -> a
   new node {kind = "kernel", kernel, config, args, deps}; upvalue 1: the nodes' metatable. The
   kernel and the configuration are checked by node:build (the seed's nodes are made before the
   module that has their kernel may be) */
static int l_kernel_node(lua_State *L) {
  lua_settop(L, 5);
  const int mt = lua_upvalueindex(1);
  if (!lua_istable(L, 3))
    cl_error(L, "cuda.graph.kernel", "config must be a table ({grid, block} or keys), got %s", luaL_typename(L, 3));
  lua_createtable(L, 0, 5);
  lua_pushliteral(L, "kernel"); lua_setfield(L, 6, "kind");
  lua_pushvalue(L, 2); lua_setfield(L, 6, "kernel");
  lua_pushvalue(L, 3); lua_setfield(L, 6, "config");
  copy_list(L, 4, mt, 0); lua_setfield(L, 6, "args");
  copy_list(L, 5, mt, 1); lua_setfield(L, 6, "deps");
  lua_pushvalue(L, mt);
  lua_setmetatable(L, 6);
  return 1;
}

/* core.graph_kernel_node(node_mt) -> the kernel node constructor for nodes of node_mt */
static int l_graph_kernel_node(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_pushcclosure(L, l_kernel_node, 1);
  return 1;
}

/* the graph nodes bound[d] of the unbound node's deps (at didx), each once (the driver refuses
   a dependency listed twice); small[CL_SMALL_DEPS] for a few, else a userdata (pushed, or nil) */
static CUgraphNode *bound_deps(lua_State *L, int didx, int bidx, size_t *n, CUgraphNode *small) {
  size_t k = lua_rawlen(L, didx);
  CUgraphNode *d = small;
  if (k <= CL_SMALL_DEPS) lua_pushnil(L);
  else d = lua_newuserdatauv(L, sizeof(CUgraphNode) * k, 0);
  *n = 0;
  for (size_t i = 0; i < k; i++) {
    lua_rawgeti(L, didx, (lua_Integer)i + 1);
    lua_rawget(L, bidx);
    CUgraphNode h = ((cl_node *)lua_touserdata(L, -1))->n;   /* (made by this build: the walk's order) */
    lua_pop(L, 1);
    size_t j = 0;
    while (j < *n && d[j] != h) j++;
    if (j == *n) d[(*n)++] = h;
  }
  return d;
}

/* the unbound kernel node at nidx added to the graph at gidx: pushes its node. last: the kernel and
   configuration table of the node before, whose parse is reused when they are the same */
static void add_unbound_kernel(lua_State *L, int gidx, int nidx, int bidx, const void **last, cl_launch *c) {
  lua_getfield(L, nidx, "kernel");
  int kidx = lua_gettop(L);
  int same = last[0] && lua_topointer(L, kidx) == last[0];   /* (checked: a kernel) */
  if (!same && !luaL_testudata(L, kidx, CL_KERNEL))
    cl_error(L, "graph:kernel", "expected a kernel, got %s", luaL_typename(L, kidx));
  lua_getfield(L, nidx, "config");
  if (lua_topointer(L, -1) != last[1] || !last[1]) {
    cl_launch_parse(L, kidx + 1, c, CL_CFG_GRAPH, "graph:kernel");
    last[1] = lua_topointer(L, kidx + 1);
  }
  lua_getfield(L, nidx, "args");
  lua_getfield(L, nidx, "deps");
  size_t nd;
  CUgraphNode small[CL_SMALL_DEPS];
  CUgraphNode *deps = bound_deps(L, kidx + 3, bidx, &nd, small);
  last[0] = lua_topointer(L, kidx);
  cl_graph_add_kernel(L, gidx, kidx, c, kidx + 2, deps, nd, !same);
}

/* the unbound node at nidx of another kind: add[kind](g, node, deps) (the bound function) */
static void add_unbound_other(lua_State *L, int gidx, int nidx, int bidx, int addidx) {
  lua_getfield(L, nidx, "kind");
  lua_rawget(L, addidx);
  lua_pushvalue(L, gidx);
  lua_pushvalue(L, nidx);
  lua_getfield(L, nidx, "deps");
  int didx = lua_gettop(L);
  lua_Integer k = (lua_Integer)lua_rawlen(L, didx);
  lua_createtable(L, (int)k, 0);   /* the bound nodes, each once */
  for (lua_Integer i = 1, m = 0; i <= k; i++) {
    lua_rawgeti(L, didx, i);
    lua_rawget(L, bidx);
    int seen = 0;
    for (lua_Integer j = 1; j <= m && !seen; j++) {
      lua_rawgeti(L, -2, j);
      seen = lua_rawequal(L, -1, -2);
      lua_pop(L, 1);
    }
    if (seen) lua_pop(L, 1);
    else lua_rawseti(L, -2, ++m);
  }
  lua_remove(L, didx);
  if (k == 0) { lua_pop(L, 1); lua_pushnil(L); }
  lua_call(L, 3, 1);
}

/* the unbound node at idx, reached for the first time: its deps a list of nodes (mtidx: their
   metatable), its kind one addidx has, before any of its dependencies is walked */
static void walk_check(lua_State *L, int idx, int mtidx, int addidx) {
  lua_getfield(L, idx, "kind");
  lua_pushvalue(L, -1);
  if (lua_rawget(L, addidx) == LUA_TNIL)
    cl_error(L, "node:build", "a node of unknown kind %s", luaL_tolstring(L, -2, NULL));
  const char *kind = lua_tostring(L, -2);
  if (lua_getfield(L, idx, "deps") != LUA_TTABLE)
    cl_error(L, "node:build", "the %s node's deps is not a list (%s)", kind, luaL_typename(L, -1));
  lua_Integer k = (lua_Integer)lua_rawlen(L, -1);
  for (lua_Integer i = 1; i <= k; i++) {
    lua_rawgeti(L, -1, i);
    if (!is_node(L, -1, mtidx))
      cl_error(L, "node:build", "the %s node's deps[%I] is not a node (%s)", kind, i, luaL_typename(L, -1));
    lua_pop(L, 1);
  }
  lua_pop(L, 3);
}

/* the node at nidx (its dependencies added) added to the graph at 1 */
static void walk_add(lua_State *L, int nidx, const void **last, cl_launch *c) {
  enum { ADD = 4, BOUND = 3, FAILING = 5 };   /* l_graph_add's arguments */
  lua_pushvalue(L, nidx);
  lua_rawseti(L, FAILING, 1);
  lua_getfield(L, nidx, "kind");
  int kernel = !strcmp(lua_tostring(L, -1), "kernel");
  lua_pop(L, 1);
  int top = lua_gettop(L);
  if (kernel) add_unbound_kernel(L, 1, nidx, BOUND, last, c);
  else add_unbound_other(L, 1, nidx, BOUND, ADD);
  lua_pushvalue(L, nidx);
  lua_insert(L, -2);
  lua_rawset(L, BOUND);   /* bound[node] = its graph node */
  lua_settop(L, top);
}

/* core.graph_walk(root, node_mt, add, state) -> order: node:build's walk (lua/cudalua/nodes.lua):
   every node root depends on, each once, dependencies first, a depth-first walk whose path is
   on the Lua stack (no recursion: chains of thousands of nodes). A node is checked when first
   reached, and the graph is made only after the walk: a malformed node or a cycle is refused
   before any graph exists. state: node -> false while walked, true once in order. */
static int l_graph_walk(lua_State *L) {
  lua_settop(L, 4);
  lua_newtable(L);   /* 5: the order */
  size_t cap = 64, sp = 1;
  int *at = lua_newuserdatauv(L, cap * sizeof *at, 0);   /* 6: how many deps of each frame were walked */
  const int base = 6;
  lua_Integer n = 0;
  walk_check(L, 1, 2, 3);
  lua_pushvalue(L, 1); lua_pushboolean(L, 0); lua_rawset(L, 4);
  lua_pushvalue(L, 1);
  at[0] = 0;
  while (sp > 0) {
    int nidx = base + (int)sp;
    lua_getfield(L, nidx, "deps");
    if (lua_rawgeti(L, -1, ++at[sp - 1]) == LUA_TNIL) {   /* all walked: in order, the frame popped */
      lua_settop(L, nidx);
      lua_pushvalue(L, nidx); lua_pushboolean(L, 1); lua_rawset(L, 4);
      lua_rawseti(L, 5, ++n);   /* (pops the frame's node) */
      sp--;
      continue;
    }
    lua_remove(L, -2);
    lua_pushvalue(L, -1);
    int st = lua_rawget(L, 4);
    int walking = st == LUA_TBOOLEAN && !lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (walking) {
      lua_getfield(L, -1, "kind");
      cl_error(L, "node:build", "the deps make a cycle (this %s node depends on itself through them)", lua_tostring(L, -1));
    }
    if (st != LUA_TNIL) { lua_pop(L, 1); continue; }   /* in order before */
    walk_check(L, lua_gettop(L), 2, 3);
    lua_pushvalue(L, -1); lua_pushboolean(L, 0); lua_rawset(L, 4);
    if (!lua_checkstack(L, 8)) cl_error(L, "node:build", "the graph is too deep (a chain of over %d nodes)", (int)sp);
    if (sp == cap) {   /* a bigger frame list, in place of the old */
      int *more = lua_newuserdatauv(L, 2 * cap * sizeof *more, 0);
      memcpy(more, at, cap * sizeof *at);
      at = more;
      cap *= 2;
      lua_replace(L, base);
    }
    at[sp++] = 0;   /* the dependency, on the stack, is the new frame */
  }
  lua_settop(L, 5);
  return 1;
}

/* core.graph_add(g, order, bound, add, failing): each node of order (core.graph_walk's) added
   to g; bound[node] = its graph node; failing[1] = the node being added (node:build names it) */
static int l_graph_add(lua_State *L) {
  cl_checkgraph(L, 1);
  lua_settop(L, 5);
  lua_Integer n = (lua_Integer)lua_rawlen(L, 2);
  const void *last[2] = {NULL, NULL};   /* the kernel and configuration of the last kernel node */
  cl_launch c;
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);   /* the node, at 6 */
    walk_add(L, 6, last, &c);
    lua_settop(L, 5);
  }
  return 0;
}

void cl_open_unbound(lua_State *L) {
  lua_pushcfunction(L, l_graph_kernel_node); lua_setfield(L, -2, "graph_kernel_node");
  lua_pushcfunction(L, l_graph_walk); lua_setfield(L, -2, "graph_walk");
  lua_pushcfunction(L, l_graph_add); lua_setfield(L, -2, "graph_add");
}
