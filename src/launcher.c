/* launcher.c: the launcher type: a kernel with a launch configuration, made by k[{grid, block}]
   and k:forall(n), called with the arguments: k[{grid, block}](...). Launchers are immutable;
   the kernel keeps the last one it made, for loops. */
#include <string.h>
#include "cl.h"

typedef struct {
  cl_kernel *k;
  cl_launch c;
} launcher;

static int launcher_call(lua_State *L) {
  launcher *l = lua_touserdata(L, 1);
  return cl_kernel_launch(L, l->k, 1, 2, &l->c);
}

static int launcher_gc(lua_State *L) {
  launcher *l = cl_checkudata(L, 1, CL_LAUNCHER);
  cl_stream_unref(L, l->c.s);
  l->c.s = NULL;
  return 0;
}

/* a new launcher for the kernel at kidx with configuration c; takes a reference to c->s */
static launcher *push_launcher(lua_State *L, int kidx, cl_kernel *k, const cl_launch *c) {
  launcher *l = lua_newuserdatauv(L, sizeof *l, 1);
  l->k = k;
  l->c = *c;
  cl_stream_ref(l->c.s);
  luaL_setmetatable(L, CL_LAUNCHER);
  lua_pushvalue(L, kidx); lua_setiuservalue(L, -2, 1);
  return l;
}

static int same_config(const cl_launch *a, const cl_launch *b) {
  return !memcmp(a->g, b->g, sizeof a->g) && !memcmp(a->b, b->b, sizeof a->b) && a->shared == b->shared &&
         a->s == b->s && !memcmp(a->cluster, b->cluster, sizeof a->cluster) && a->cooperative == b->cooperative;
}

/* launchers are immutable: k[{grid, block}](...) and k:forall(n)(...) in a loop reuse the last
   one the kernel at kidx made, when the configuration is the same */
static void push_reused_launcher(lua_State *L, int kidx, cl_kernel *k, const cl_launch *c) {
  if (lua_getiuservalue(L, kidx, 3) == LUA_TUSERDATA && same_config(&((launcher *)lua_touserdata(L, -1))->c, c))
    return;
  lua_pop(L, 1);
  push_launcher(L, kidx, k, c);
  lua_pushvalue(L, -1); lua_setiuservalue(L, kidx, 3);
}

/* the kernel's __index, in front of kernel.c's: k[{grid, block [, stream [, shared]],
   cooperative=, cluster=}] -> launcher; any other key is kernel.c's (methods, k.name) */
static int launcher_index(lua_State *L) {
  if (lua_type(L, 2) != LUA_TTABLE) return cl_kernel_index(L);
  cl_kernel *k = lua_touserdata(L, 1);
  cl_launch c;
  cl_launch_bracket(L, &c);
  push_reused_launcher(L, 1, k, &c);
  return 1;
}

/* k:forall(n [, {stream=, shared=, cooperative=, cluster=}]) -> launcher covering n threads,
   with the block size the occupancy calculator picks (cached per kernel and dynamic shared
   memory size); with a cluster the grid is rounded up to a whole number of clusters */
static int k_forall(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  int isint;
  lua_Integer n = lua_tointegerx(L, 2, &isint);
  if (!isint || n < 0) return cl_error(L, "kernel:forall", "n must be an integer >= 0, got %s", luaL_tolstring(L, 2, NULL));
  cl_launch c;
  memset(&c, 0, sizeof c);
  if (!lua_isnoneornil(L, 3)) {
    cl_launch_parse(L, 3, &c, CL_CFG_FORALL, "kernel:forall");
    if (c.cluster[0] && (c.cluster[1] != 1 || c.cluster[2] != 1))
      return cl_error(L, "kernel:forall", "the grid is one-dimensional: cluster must be n or {n}");
  }
  CL_KERNEL_FRESH(k);
  cl_kernel_shared(L, k, 1, c.shared);
  cl_kernel_occupancy(L, k, c.shared);
  /* forall(0) launches nothing (Numba's test_forall_no_work): a grid of 0 blocks */
  lua_Integer grid = (n + k->occ_block - 1) / k->occ_block;
  unsigned per = c.cluster[0] ? c.cluster[0] : k->req_cluster[0] ? k->req_cluster[0] : 1;
  grid = (grid + per - 1) / per * per;
  if (grid > 0x7fffffff) return cl_error(L, "kernel:forall", "n = %I needs too many blocks", n);
  c.g[0] = (unsigned)grid; c.g[1] = c.g[2] = 1;
  c.b[0] = (unsigned)k->occ_block; c.b[1] = c.b[2] = 1;
  push_reused_launcher(L, 1, k, &c);
  return 1;
}

static int launcher_tostring(lua_State *L) {
  launcher *l = cl_checkudata(L, 1, CL_LAUNCHER);
  const cl_launch *c = &l->c;
  lua_pushfstring(L, "cudalua.launcher<grid {%d, %d, %d}, block {%d, %d, %d}, shared %d%s%s>", c->g[0],
                  c->g[1], c->g[2], c->b[0], c->b[1], c->b[2], c->shared,
                  c->cluster[0] ? lua_pushfstring(L, ", cluster {%d, %d, %d}", c->cluster[0], c->cluster[1], c->cluster[2]) : "",
                  c->cooperative ? ", cooperative" : "");
  return 1;
}

void cl_open_launcher(lua_State *L) {
  luaL_getmetatable(L, CL_KERNEL);
  lua_pushcfunction(L, launcher_index); lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushcfunction(L, k_forall); lua_setfield(L, -2, "forall");
  lua_pop(L, 1);
  static const luaL_Reg mt[] = {
    {"__call", launcher_call}, {"__gc", launcher_gc}, {"__tostring", launcher_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){CL_LAUNCHER, NULL, NULL, mt, NULL});
}
