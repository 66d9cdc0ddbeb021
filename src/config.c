/* config.c: launch configurations (grid, block, dynamic shared memory, stream, cluster,
   cooperative), read from the tables of k[{...}], k:launch{...}, k:forall(n, {...}) and
   g:kernel. A configuration is a C struct (cl_launch), not a Lua type; it knows nothing of
   kernels, so the kernel type below the launch layers reads its shared memory sizes here too. */
#include <string.h>
#include "cl.h"

/* grid, block or cluster: an integer or {x [, y [, z]]}; where: the public name raising */
static void dims(lua_State *L, int idx, unsigned out[3], const char *where, const char *what) {
  out[0] = out[1] = out[2] = 1;
  int n = 1;
  if (lua_type(L, idx) == LUA_TTABLE) {
    n = (int)lua_rawlen(L, idx);
    if (n < 1 || n > 3) cl_error(L, where, "%s needs 1 to 3 dimensions, got %d", what, n);
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, idx, i + 1);
      int isint;
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      if (!isint || v < 1 || v > 0x7fffffff)
        cl_error(L, where, "%s[%d] must be an integer >= 1, got %s", what, i + 1,
                   luaL_tolstring(L, -1, NULL));
      out[i] = (unsigned)v;
      lua_pop(L, 1);
    }
    return;
  }
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint || v < 1 || v > 0x7fffffff)
    cl_error(L, where, "%s must be an integer >= 1 or a table of them, got %s", what,
               luaL_tolstring(L, idx, NULL));
  out[0] = (unsigned)v;
}

static unsigned shared_named(lua_State *L, int idx, const char *where, const char *what) {
  if (lua_isnoneornil(L, idx)) return 0;
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint || v < 0 || v > 0x7fffffff)
    cl_error(L, where, "%s must be an integer >= 0, got %s", what, luaL_tolstring(L, idx, NULL));
  return (unsigned)v;
}

unsigned cl_launch_shared(lua_State *L, int idx, const char *where) { return shared_named(L, idx, where, "shared memory size"); }

/* a cluster must tile the grid: checked when the configuration is made, not per launch */
static void cfg_check_cluster(lua_State *L, const cl_launch *c, const char *where) {
  if (c->cluster[0] && !cl_tiles(c->g, c->cluster))
    cl_error(L, where, "the grid {%d, %d, %d} is not a multiple of the cluster {%d, %d, %d}", c->g[0], c->g[1], c->g[2], c->cluster[0], c->cluster[1], c->cluster[2]);
}

static const char *const cfg_keys[] = {"grid", "block", "stream", "shared", "cooperative", "cluster", NULL};

/* the entry of cfg_keys a key of the configuration table (at v - 1, its value at v) gives,
   by name or by position; -1 for none (raised by the caller) */
static int cfg_which(lua_State *L, int v, int mode) {
  int w = -1;
  if (lua_type(L, v - 1) == LUA_TNUMBER) {
    lua_Integer i = lua_tointeger(L, v - 1);
    if (lua_isinteger(L, v - 1) && i >= 1 && i <= 4) w = (int)i - 1;
  } else if (lua_type(L, v - 1) == LUA_TSTRING) {
    const char *key = lua_tostring(L, v - 1);
    for (int j = 0; cfg_keys[j]; j++) if (!strcmp(key, cfg_keys[j])) { w = j; break; }
  }
  if (mode == CL_CFG_FORALL && w >= 0 && (w < 2 || lua_type(L, v - 1) != LUA_TSTRING)) w = -1;
  return w;
}

/* a key no configuration takes: a misspelt option must not be ignored */
static void cfg_unknown(lua_State *L, int idx, int v, int mode, const char *where) {
  if (mode == CL_CFG_FORALL)
    cl_error(L, where, "unknown option '%s' (stream, shared, cooperative, cluster)", luaL_tolstring(L, v - 1, NULL));
  int n = (int)lua_rawlen(L, idx);
  if (lua_type(L, v - 1) == LUA_TNUMBER && n > 4)
    cl_error(L, where, "launch configuration is {grid, block [, stream [, shared]]}, got %d entries", n);
  cl_error(L, where, "unknown key %s in the launch configuration (grid, block, %scooperative, cluster; or {grid, block%s})", lua_type(L, v - 1) == LUA_TSTRING ? lua_pushfstring(L, "'%s'", lua_tostring(L, v - 1)) : luaL_tolstring(L, v - 1, NULL),
             mode == CL_CFG_GRAPH ? "shared, " : "stream, shared, ",
             mode == CL_CFG_GRAPH ? ", nil, shared" : " [, stream [, shared]]");
}

/* one pass over the table: each key is checked and its value read where it is found */
void cl_launch_parse(lua_State *L, int idx, cl_launch *c, int mode, const char *where) {
  cl_checktype(L, idx, LUA_TTABLE);
  idx = lua_absindex(L, idx);
  memset(c, 0, sizeof *c);
  int have = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int v = lua_gettop(L), w = cfg_which(L, v, mode);
    if (w < 0) { cfg_unknown(L, idx, v, mode, where); return; }   /* it raises */
    if (have & (1 << w))
      cl_error(L, where, "%s given both by name and as entry %d", cfg_keys[w], w + 1);
    have |= 1 << w;
    switch (w) {
      case 0: dims(L, v, c->g, where, "grid"); break;
      case 1: dims(L, v, c->b, where, "block"); break;
      case 2:
        if (mode == CL_CFG_GRAPH) {   /* {g, b, nil, shared} is written with false or 0 too */
          if (lua_toboolean(L, v) && !(lua_isinteger(L, v) && lua_tointeger(L, v) == 0))
            cl_error(L, where, "a graph node has no stream (the graph is launched on one)");
        } else c->s = cl_tostream(L, v, where);
        break;
      case 3: c->shared = mode == CL_CFG_GRAPH ? shared_named(L, v, where, "shared") : cl_launch_shared(L, v, where); break;
      case 4:
        if (!lua_isboolean(L, v))
          cl_error(L, where, "cooperative must be a boolean, got %s", luaL_typename(L, v));
        c->cooperative = lua_toboolean(L, v);
        break;
      case 5: dims(L, v, c->cluster, where, "cluster"); break;   /* n | {x, y, z} */
    }
    lua_settop(L, v - 1);
  }
  for (int w = 0; w < 2 && mode != CL_CFG_FORALL; w++)
    if (!(have & (1 << w))) cl_error(L, where, "configuration needs %s", cfg_keys[w]);
  cfg_check_cluster(L, c, where);
}

/* whether the table at 2 has no keys but 1..n (at most n + 1 steps: a named key such as
   cooperative may be stored before or after the positional ones) */
static int positional_only(lua_State *L, int n) {
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    lua_Integer i = lua_isinteger(L, -2) ? lua_tointeger(L, -2) : 0;
    lua_pop(L, 1);
    if (i < 1 || i > n) { lua_pop(L, 1); return 0; }
  }
  return 1;
}

/* the public name of k[...]'s errors (cl_where would say kernel[k]) */
#define BRACKET "kernel[{grid, block}]"

/* {grid, block [, stream [, shared]]} and nothing else: the tutorials' forms, in loops */
static void positional(lua_State *L, int n, cl_launch *c) {
  memset(c, 0, sizeof *c);
  int gi, bi;
  lua_rawgeti(L, 2, 1);
  lua_rawgeti(L, 2, 2);
  lua_Integer g = lua_tointegerx(L, 3, &gi), b = lua_tointegerx(L, 4, &bi);
  if (gi && bi && g >= 1 && b >= 1 && g <= 0x7fffffff && b <= 0x7fffffff) {
    c->g[0] = (unsigned)g; c->b[0] = (unsigned)b;
    c->g[1] = c->g[2] = c->b[1] = c->b[2] = 1;
  } else {
    dims(L, 3, c->g, BRACKET, "grid");
    dims(L, 4, c->b, BRACKET, "block");
  }
  if (n >= 3) { lua_rawgeti(L, 2, 3); c->s = cl_tostream(L, -1, BRACKET); }
  if (n >= 4) { lua_rawgeti(L, 2, 4); c->shared = cl_launch_shared(L, -1, BRACKET); }
  lua_settop(L, 2);
}

/* k[{grid, block [, stream [, shared]], cooperative=, cluster=}]: the key at 2 */
void cl_launch_bracket(lua_State *L, cl_launch *c) {
  int n = (int)lua_rawlen(L, 2);
  if (n >= 2 && n <= 4 && positional_only(L, n)) {
    positional(L, n, c);
    return;
  }
  lua_settop(L, 2);
  if (n > 4 || (n < 2 && lua_getfield(L, 2, "block") == LUA_TNIL))
    cl_error(L, BRACKET, "launch configuration is {grid, block [, stream [, shared]]}, got %d entries", n);
  lua_settop(L, 2);
  cl_launch_parse(L, 2, c, CL_CFG_LAUNCH, BRACKET);
}
