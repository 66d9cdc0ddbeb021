/* launch.c: kernel launches. Arguments are converted by the kernel's own parameter types; this
   is the hot path, so it does no allocation beyond the launcher object of k[{grid, block}]. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "cl.h"

#define LAUNCHER_MT "cudalua.launcher"
typedef struct {
  cl_kernel *k;
  unsigned g[3], b[3], shared;
  cl_stream *s;
} launcher;

/* the kernel's name and the C type of parameter i, for messages (slow path only) */
static const char *kname(lua_State *L, int kidx) {
  if (luaL_testudata(L, kidx, LAUNCHER_MT)) { lua_getiuservalue(L, kidx, 1); kidx = lua_gettop(L); }
  lua_getiuservalue(L, kidx, 2);
  lua_getfield(L, -1, "name");
  return lua_tostring(L, -1);
}

static const char *ptypename(lua_State *L, int kidx, int i) {
  if (luaL_testudata(L, kidx, LAUNCHER_MT)) { lua_getiuservalue(L, kidx, 1); kidx = lua_gettop(L); }
  lua_getiuservalue(L, kidx, 2);
  lua_getfield(L, -1, "types");
  lua_rawgeti(L, -1, i + 1);
  return lua_isstring(L, -1) ? lua_tostring(L, -1) : "?";
}

static int arg_error(lua_State *L, int kidx, int i, int aidx, const char *msg) {
  const char *name = kname(L, kidx);
  const char *t = ptypename(L, kidx, i);
  const char *got = luaL_typename(L, aidx);
  if (lua_type(L, aidx) == LUA_TNUMBER) got = lua_tostring(L, aidx);
  else if (lua_type(L, aidx) == LUA_TSTRING) got = lua_pushfstring(L, "string (%I bytes)", (lua_Integer)lua_rawlen(L, aidx));
  cl_array *a = cl_toarray(L, aidx);
  if (a) got = a->mem ? (a->kind == CL_HOST ? "a pageable host array" : "an array") : "a closed array";
  return luaL_error(L, "cudalua: kernel '%s' argument %d (%s): %s, got %s", name, i + 1, t, msg, got);
}

int cl_capturing;   /* streams capturing now, in this process (changed atomically: any thread) */

void cl_capture_guard(lua_State *L, cl_stream *s, int waits, const char *where) {
  if (!cl_capturing) return;
  if (!s)
    luaL_error(L, "cudalua: %s: the legacy default stream cannot be used while a stream is "
               "capturing (pass the capturing stream, or end the capture first)", where);
  if (waits && s->capture_ref)
    luaL_error(L, "cudalua: %s: this would wait for a stream that is capturing (pageable host "
               "memory or no stream given); use pinned or device arrays and the stream", where);
}

void cl_marshal(lua_State *L, cl_kernel *k, int kidx, int first, int nargs, cl_args *A,
                int allow_pageable) {
  if (nargs != k->nparams)
    luaL_error(L, "cudalua: kernel '%s' expects %d arguments, got %d", kname(L, kidx),
               k->nparams, nargs);
  A->nused = A->ntmp = 0;
  for (int i = 0; i < k->nparams; i++) {
    int idx = first + i;
    void *p = A->slots[i];
    A->params[i] = p;
    char c = k->ptype[i];
    if (c == 'p' || c == 'q') {
      cl_array *a = lua_touserdata(L, idx);
      if (a && lua_getmetatable(L, idx)) {
        if (lua_topointer(L, -1) != k->array_mt) a = NULL;
        lua_pop(L, 1);
      } else a = NULL;
      if (!a) {
        /* anything with __cuda_array_interface becomes an array view (src/interop.c) */
        a = cl_cai_view(L, idx);
        if (!a) arg_error(L, kidx, i, idx, "expected an array");
      }
      if (!a->mem) arg_error(L, kidx, i, idx, "expected an open array");
      if (c == 'p' && a->readonly)
        arg_error(L, kidx, i, idx, "expected a writable array (the parameter is not const)");
      if (a->kind == CL_HOST) {
        if (!allow_pageable)
          arg_error(L, kidx, i, idx, "expected a device, pinned, mapped or managed array (a pageable host array cannot be copied in and out here)");
        /* pageable memory: copied in before and out after the launch, as Numba does; the
           copies are made once every argument has been checked */
        A->tmp[A->ntmp].a = a; A->tmp[A->ntmp].back = c == 'p'; A->tmp[A->ntmp].d = 0;
        A->tmp[A->ntmp].slot = p;
        A->ntmp++;
        *(CUdeviceptr *)p = 0;
      } else {
        if (a->mem->ctx != k->ctx && a->kind != CL_FOREIGN)
          arg_error(L, kidx, i, idx, "expected an array on the kernel's device");
        *(CUdeviceptr *)p = cl_devptr(a);
        A->used[A->nused++] = a->mem;
      }
      continue;
    }
    if (c == 'x') {
      size_t n = 0;
      /* the type first: lua_tolstring would turn a number on the stack into a string */
      const char *str = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &n) : NULL;
      if (!str || n != k->psize[i])
        arg_error(L, kidx, i, idx,
                  lua_pushfstring(L, "expected a string of exactly %d bytes", (int)k->psize[i]));
      if (n <= sizeof A->slots[i]) memcpy(p, str, n);
      else A->params[i] = (void *)str;   /* the string stays on the stack meanwhile */
      continue;
    }
    if (c == 'b' && lua_type(L, idx) == LUA_TBOOLEAN) { *(uint8_t *)p = (uint8_t)lua_toboolean(L, idx); continue; }
    if (lua_type(L, idx) != LUA_TNUMBER) arg_error(L, kidx, i, idx, "expected a number");
    if (c == 'f') {
      lua_Number v = lua_tonumber(L, idx);
      if (v == v && v - v == 0 && (v > FLT_MAX || v < -FLT_MAX)) arg_error(L, kidx, i, idx, "value out of range");
      *(float *)p = (float)v;
      continue;
    }
    if (c == 'd') { *(double *)p = lua_tonumber(L, idx); continue; }
    if (c == 'e' || c == 'E') {
      lua_Number v = lua_tonumber(L, idx);
      double lim = c == 'e' ? 65504.0 : 3.3895313892515355e38;
      if (v == v && v - v == 0 && (v > lim || v < -lim)) arg_error(L, kidx, i, idx, "value out of range");
      float f = (float)v;
      uint32_t u; memcpy(&u, &f, 4);
      /* bfloat16 is the top half of a float, rounded to nearest even */
      *(uint16_t *)p = c == 'e' ? cl_float_to_half(f) : (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
      continue;
    }
    int isint;
    lua_Integer v = lua_tointegerx(L, idx, &isint);
    if (!isint) {
      lua_Number f = lua_tonumber(L, idx);
      /* uint64 values past 2^63 exist in Lua only as floats */
      if (c == 'L' && f == floor(f) && f >= 0 && f < 18446744073709551616.0) { *(uint64_t *)p = (uint64_t)f; continue; }
      arg_error(L, kidx, i, idx, f == floor(f) ? "value out of range" : "expected an integer");
    }
    int ok = 1;
    switch (c) {
      case 'a': ok = v >= INT8_MIN && v <= INT8_MAX; *(int8_t *)p = (int8_t)v; break;
      case 'A': ok = v >= 0 && v <= UINT8_MAX; *(uint8_t *)p = (uint8_t)v; break;
      case 's': ok = v >= INT16_MIN && v <= INT16_MAX; *(int16_t *)p = (int16_t)v; break;
      case 'S': ok = v >= 0 && v <= UINT16_MAX; *(uint16_t *)p = (uint16_t)v; break;
      case 'i': ok = v >= INT32_MIN && v <= INT32_MAX; *(int32_t *)p = (int32_t)v; break;
      case 'I': ok = v >= 0 && v <= (lua_Integer)UINT32_MAX; *(uint32_t *)p = (uint32_t)v; break;
      case 'l': *(int64_t *)p = v; break;
      case 'L': ok = v >= 0; *(uint64_t *)p = (uint64_t)v; break;
      case 'b': ok = v == 0 || v == 1; *(uint8_t *)p = (uint8_t)v; break;
      default: ok = 0;
    }
    if (!ok) arg_error(L, kidx, i, idx, "value out of range");
  }
}

/* keeps the kernel and its arrays alive as long as the graph a capture makes; a set (it
   becomes the graph's keep set), so a captured loop does not grow it launch by launch */
static void capture_keep(lua_State *L, cl_stream *s, int kidx, int first, int nargs) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->capture_ref);
  lua_pushvalue(L, kidx); lua_pushboolean(L, 1); lua_rawset(L, -3);
  for (int i = 0; i < nargs; i++)
    if (lua_type(L, first + i) == LUA_TUSERDATA) { lua_pushvalue(L, first + i); lua_pushboolean(L, 1); lua_rawset(L, -3); }
  lua_pop(L, 1);
}

int cl_kernel_launch(lua_State *L, cl_kernel *k, int kidx, int first, unsigned g[3],
                     unsigned b[3], cl_stream *s, unsigned shared) {
  cl_args A;
  int nargs = lua_gettop(L) - first + 1;
  CUstream h = s ? s->h : NULL;
  cl_marshal(L, k, kidx, first, nargs, &A, 1);
  if (cl_capturing) {
    cl_capture_guard(L, s, A.ntmp > 0, "kernel launch");
    if (s->capture_ref) capture_keep(L, s, kidx, first, nargs);
  }
  /* after the arguments: a foreign array's view may have made the selected device current */
  cl_kernel_ctx(L, k);
  for (int i = 0; i < A.ntmp; i++) {
    size_t n = cl_nbytes(A.tmp[i].a);
    if (!n) continue;
    CUresult r = cu.cuMemAllocAsync(&A.tmp[i].d, n, h);
    if (r == CUDA_SUCCESS) {
      cl_pageable_prepare(A.tmp[i].a->mem);
      r = cu.cuMemcpyHtoDAsync(A.tmp[i].d, cl_hostptr(A.tmp[i].a), n, h);
    }
    if (r != CUDA_SUCCESS) {
      for (int j = 0; j <= i; j++) if (A.tmp[j].d) cu.cuMemFreeAsync(A.tmp[j].d, h);
      cl_check(L, r, "temporary device copy of a host array argument");
    }
    *(CUdeviceptr *)A.tmp[i].slot = A.tmp[i].d;
  }
  CUresult r = cu.cuLaunchKernel(k->fn, g[0], g[1], g[2], b[0], b[1], b[2], shared, h, A.params, NULL);
  if (r != CUDA_SUCCESS) {
    for (int i = 0; i < A.ntmp; i++) if (A.tmp[i].d) cu.cuMemFreeAsync(A.tmp[i].d, h);
    const char *es = NULL;
    cu.cuGetErrorString(r, &es);
    return luaL_error(L, "cudalua: kernel '%s' launch with grid {%d, %d, %d}, block {%d, %d, %d}, "
                      "shared %d failed: %s (%s)", kname(L, kidx), g[0], g[1], g[2], b[0], b[1],
                      b[2], shared, cl_errname(r), es ? es : "");
  }
  for (int i = 0; i < A.nused; i++) cl_mem_use(A.used[i], s);
  if (A.ntmp) {
    for (int i = 0; i < A.ntmp; i++) {
      if (!A.tmp[i].d) continue;
      if (A.tmp[i].back && r == CUDA_SUCCESS)
        r = cu.cuMemcpyDtoHAsync(cl_hostptr(A.tmp[i].a), A.tmp[i].d, cl_nbytes(A.tmp[i].a), h);
      cu.cuMemFreeAsync(A.tmp[i].d, h);
    }
    CUresult r2 = cl_wait_raw(L, CL_WAIT_STREAM, h);
    cl_check(L, r, "copying a host array back after the kernel");
    cl_check(L, r2, "waiting for the kernel that used a host array");
    cl_host_raise(L);
  }
  return 0;
}

/* grid or block: an integer or {x [, y [, z]]}; messages name it as prefix .. what */
static void dims(lua_State *L, int idx, unsigned out[3], const char *prefix, const char *what) {
  out[0] = out[1] = out[2] = 1;
  int n = 1;
  if (lua_type(L, idx) == LUA_TTABLE) {
    n = (int)lua_rawlen(L, idx);
    if (n < 1 || n > 3) luaL_error(L, "cudalua: %s%s needs 1 to 3 dimensions, got %d", prefix, what, n);
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, idx, i + 1);
      int isint;
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      if (!isint || v < 1 || v > 0x7fffffff)
        luaL_error(L, "cudalua: %s%s[%d] must be an integer >= 1, got %s", prefix, what, i + 1,
                   luaL_tolstring(L, -1, NULL));
      out[i] = (unsigned)v;
      lua_pop(L, 1);
    }
    return;
  }
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint || v < 1 || v > 0x7fffffff)
    luaL_error(L, "cudalua: %s%s must be an integer >= 1 or a table of them, got %s", prefix, what,
               luaL_tolstring(L, idx, NULL));
  out[0] = (unsigned)v;
}

static unsigned shared_named(lua_State *L, int idx, const char *prefix, const char *what) {
  if (lua_isnoneornil(L, idx)) return 0;
  int isint;
  lua_Integer v = lua_tointegerx(L, idx, &isint);
  if (!isint || v < 0 || v > 0x7fffffff)
    luaL_error(L, "cudalua: %s%s must be an integer >= 0, got %s", prefix, what, luaL_tolstring(L, idx, NULL));
  return (unsigned)v;
}

static unsigned shared_bytes(lua_State *L, int idx) { return shared_named(L, idx, "", "shared memory size"); }

static int launcher_call(lua_State *L) {
  launcher *l = lua_touserdata(L, 1);
  return cl_kernel_launch(L, l->k, 1, 2, l->g, l->b, l->s, l->shared);
}

static int launcher_gc(lua_State *L) {
  launcher *l = luaL_checkudata(L, 1, LAUNCHER_MT);
  cl_stream_unref(l->s);
  l->s = NULL;
  return 0;
}

/* a new launcher for the kernel at kidx with configuration c; takes a reference to c->s */
static launcher *push_launcher(lua_State *L, int kidx, const launcher *c) {
  launcher *l = lua_newuserdatauv(L, sizeof *l, 1);
  *l = *c;
  cl_stream_ref(l->s);
  luaL_setmetatable(L, LAUNCHER_MT);
  lua_pushvalue(L, kidx); lua_setiuservalue(L, -2, 1);
  return l;
}

/* launchers are immutable: k[{grid, block}](...) and k:forall(n)(...) in a loop reuse the last
   one the kernel at kidx made, when the configuration is the same */
static void push_reused_launcher(lua_State *L, int kidx, const launcher *c) {
  if (lua_getiuservalue(L, kidx, 3) == LUA_TUSERDATA) {
    launcher *last = lua_touserdata(L, -1);
    if (!memcmp(last->g, c->g, sizeof c->g) && !memcmp(last->b, c->b, sizeof c->b) &&
        last->shared == c->shared && last->s == c->s)
      return;
  }
  lua_pop(L, 1);
  push_launcher(L, kidx, c);
  lua_pushvalue(L, -1); lua_setiuservalue(L, kidx, 3);
}

/* k[{grid, block [, stream [, shared]]}] -> launcher */
int cl_kernel_index(lua_State *L) {
  cl_kernel *k = lua_touserdata(L, 1);
  if (lua_type(L, 2) == LUA_TTABLE) {
    launcher c = {k, {1, 1, 1}, {1, 1, 1}, 0, NULL};
    int cfg = 2, n = (int)lua_rawlen(L, cfg);
    if (n < 2 || n > 4)
      return luaL_error(L, "cudalua: launch configuration is {grid, block [, stream [, shared]]}, got %d entries", n);
    int gi, bi;
    lua_rawgeti(L, cfg, 1);
    lua_rawgeti(L, cfg, 2);
    lua_Integer g = lua_tointegerx(L, 3, &gi), b = lua_tointegerx(L, 4, &bi);
    if (gi && bi && g >= 1 && b >= 1 && g <= 0x7fffffff && b <= 0x7fffffff) {
      c.g[0] = (unsigned)g; c.b[0] = (unsigned)b;   /* {n, n}: the tutorials' form, in a loop */
    } else {
      dims(L, 3, c.g, "", "grid");
      dims(L, 4, c.b, "", "block");
    }
    lua_settop(L, 2);
    if (n >= 3) { lua_rawgeti(L, cfg, 3); c.s = cl_tostream(L, -1, "launch configuration"); lua_pop(L, 1); }
    if (n >= 4) { lua_rawgeti(L, cfg, 4); c.shared = shared_bytes(L, -1); lua_pop(L, 1); }
    push_reused_launcher(L, 1, &c);
    return 1;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  if (lua_type(L, 2) == LUA_TSTRING && !strcmp(lua_tostring(L, 2), "name")) {
    kname(L, 1);
    return 1;
  }
  return luaL_error(L, "cudalua: kernels have no field '%s' (launch with k[{grid, block}](...))",
                    luaL_tolstring(L, 2, NULL));
}

/* k:launch({grid=, block=, stream=, shared=}, ...) */
/* the table {grid=, block=, shared=} at idx (or {grid, block, _, shared}), for k:launch and
   graph:kernel; messages about a bad grid or block start with prefix */
void cl_launch_config(lua_State *L, int idx, unsigned g[3], unsigned b[3], unsigned *shared,
                      const char *where, const char *prefix) {
  luaL_checktype(L, idx, LUA_TTABLE);
  idx = lua_absindex(L, idx);
  static const char *const names[] = {"grid", "block"};
  for (int w = 0; w < 2; w++) {
    if (lua_getfield(L, idx, names[w]) == LUA_TNIL) { lua_pop(L, 1); lua_rawgeti(L, idx, w + 1); }
    if (lua_isnil(L, -1)) luaL_error(L, "cudalua: %s: configuration needs %s", where, names[w]);
    dims(L, lua_gettop(L), w ? b : g, prefix, names[w]);
    lua_pop(L, 1);
  }
  if (lua_getfield(L, idx, "shared") == LUA_TNIL) { lua_pop(L, 1); lua_rawgeti(L, idx, 4); }
  int v = lua_gettop(L);
  *shared = *prefix ? shared_named(L, v, prefix, "shared") : shared_bytes(L, v);
  lua_pop(L, 1);
}

static int k_launch(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  unsigned g[3], b[3], shared;
  cl_launch_config(L, 2, g, b, &shared, "launch", "");
  lua_getfield(L, 2, "stream");
  cl_stream *s = cl_tostream(L, -1, "launch configuration");
  lua_pop(L, 1);
  lua_remove(L, 2);
  return cl_kernel_launch(L, k, 1, 2, g, b, s, shared);
}

/* k:forall(n [, {stream=, shared=}]) -> launcher covering n threads, with the block size the
   occupancy calculator picks (cached per kernel and dynamic shared memory size) */
static int k_forall(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  int isint;
  lua_Integer n = lua_tointegerx(L, 2, &isint);
  if (!isint || n < 0) return luaL_error(L, "cudalua: forall: n must be an integer >= 0, got %s", luaL_tolstring(L, 2, NULL));
  cl_stream *s = NULL;
  unsigned shared = 0;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      lua_pop(L, 1);
      const char *key = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
      if (strcmp(key, "stream") && strcmp(key, "shared"))
        return luaL_error(L, "cudalua: forall: unknown option '%s' (stream, shared)", luaL_tolstring(L, -1, NULL));
    }
    lua_getfield(L, 3, "stream"); s = cl_tostream(L, -1, "forall");
    lua_getfield(L, 3, "shared"); shared = shared_bytes(L, -1);
    lua_pop(L, 2);
  }
  cl_kernel_occupancy(L, k, shared);
  lua_Integer grid = (n + k->occ_block - 1) / k->occ_block;
  if (grid < 1) grid = 1;
  if (grid > 0x7fffffff) return luaL_error(L, "cudalua: forall: n = %I needs too many blocks", n);
  launcher c = {k, {(unsigned)grid, 1, 1}, {(unsigned)k->occ_block, 1, 1}, shared, s};
  push_reused_launcher(L, 1, &c);
  return 1;
}

/* k:max_blocks_per_sm(block [, shared]) */
static int k_max_blocks(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  lua_Integer b = luaL_checkinteger(L, 2);
  unsigned shared = shared_bytes(L, 3);
  luaL_argcheck(L, b >= 1 && b <= 1024, 2, "block size must be 1..1024");
  int nb = 0;
  cl_kernel_ctx(L, k);
  cl_check(L, cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k->fn, (int)b, shared),
           "max_blocks_per_sm");
  lua_pushinteger(L, nb);
  return 1;
}

static int launcher_tostring(lua_State *L) {
  launcher *l = luaL_checkudata(L, 1, LAUNCHER_MT);
  lua_pushfstring(L, "cudalua.launcher<grid {%d, %d, %d}, block {%d, %d, %d}, shared %d>", l->g[0],
                  l->g[1], l->g[2], l->b[0], l->b[1], l->b[2], l->shared);
  return 1;
}

static int k_call(lua_State *L) {
  return luaL_error(L, "cudalua: kernel '%s' needs a launch configuration: k[{grid, block}](...)",
                    kname(L, 1));
}

void cl_open_launch(lua_State *L) {
  luaL_newmetatable(L, LAUNCHER_MT);
  lua_pushcfunction(L, launcher_call); lua_setfield(L, -2, "__call");
  lua_pushcfunction(L, launcher_gc); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, launcher_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  luaL_getmetatable(L, CL_KERNEL);
  lua_pushcfunction(L, k_call); lua_setfield(L, -2, "__call");
  lua_pop(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushcfunction(L, k_launch); lua_setfield(L, -2, "launch");
  lua_pushcfunction(L, k_forall); lua_setfield(L, -2, "forall");
  lua_pushcfunction(L, k_max_blocks); lua_setfield(L, -2, "max_blocks_per_sm");
  lua_pop(L, 1);
}
