/* args.c: kernel arguments. Each Lua value is converted by the kernel's own parameter code
   (listed in kernel.c) into the parameter array the driver takes. Every launch runs this (the
   hot path): no allocation, and arrays are told by their metatable's address, not the registry. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "cl.h"

/* the C type of parameter i, for messages (slow path only) */
static const char *ptypename(lua_State *L, int kidx, int i) {
  kidx = cl_kernel_at(L, kidx);
  if (lua_getiuservalue(L, kidx, 2) != LUA_TTABLE || lua_getfield(L, -1, "types") != LUA_TTABLE) return "?";
  lua_rawgeti(L, -1, i + 1);
  return lua_isstring(L, -1) ? lua_tostring(L, -1) : "?";
}

static int arg_error(lua_State *L, int kidx, int i, int aidx, const char *msg) {
  const char *name = cl_kernel_name(L, kidx);
  const char *t = ptypename(L, kidx, i);
  const char *got = luaL_typename(L, aidx);
  if (lua_type(L, aidx) == LUA_TNUMBER) got = lua_tostring(L, aidx);
  else if (lua_type(L, aidx) == LUA_TSTRING) got = lua_pushfstring(L, "string (%I bytes)", (lua_Integer)lua_rawlen(L, aidx));
  cl_array *a = cl_toarray(L, aidx);
  if (a) got = a->mem ? (a->kind == CL_HOST ? "a pageable host array" : "an array") : "a closed array";
  return luaL_error(L, "cudalua: kernel '%s' argument %d (%s): %s, got %s", name, i + 1, t, msg, got);
}

/* an array of another context: host memory every device reaches, or a peer device's memory
   with peer access on; else an error naming both devices (slow path) */
static void reach(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_mem *m) {
  if (cl_mem_reachable(m, k->ctx)) return;
  int a = cl_device_of(m->ctx), b = cl_device_of(k->ctx);
  arg_error(L, kidx, i, idx, lua_pushfstring(L, "the array is on device %d and the kernel on device %d "
            "(cuda.enable_peer_access(%d, %d) lets device %d's kernels use device %d's memory)", a, b, b, a, b, a));
}

/* the cudalua array at idx, else NULL; by the metatable's address the kernel keeps (no
   registry lookup: this runs for every array argument of every launch) */
static cl_array *karray(lua_State *L, const cl_kernel *k, int idx) {
  cl_array *a = lua_touserdata(L, idx);
  if (!a || !lua_getmetatable(L, idx)) return NULL;
  if (lua_topointer(L, -1) != k->array_mt) a = NULL;
  lua_pop(L, 1);
  return a;
}

/* the rules per code: kernel.c's list; pageable host arrays: cl.h */
void cl_marshal(lua_State *L, cl_kernel *k, int kidx, int first, int nargs, cl_args *A,
                int allow_pageable) {
  if (nargs != k->nparams)
    luaL_error(L, "cudalua: kernel '%s' expects %d arguments, got %d", cl_kernel_name(L, kidx),
               k->nparams, nargs);
  A->nused = A->ntmp = 0;
  for (int i = 0; i < k->nparams; i++) {
    int idx = first + i;
    void *p = A->slots[i];
    A->params[i] = p;
    char c = k->ptype[i];
    if (c == 'p' || c == 'q') {
      cl_array *a = karray(L, k, idx);
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
        if (a->mem->ctx != k->ctx) reach(L, k, kidx, i, idx, a->mem);
        *(CUdeviceptr *)p = cl_devptr(a);
        A->used[A->nused++] = a->mem;
      }
      continue;
    }
    if (c == 'U') {   /* .u64 from PTX or 8 bytes of unknown type: an array or an address */
      cl_array *a = karray(L, k, idx);
      if (!a && lua_type(L, idx) != LUA_TNUMBER) a = cl_cai_view(L, idx);
      if (a) {
        if (!a->mem) arg_error(L, kidx, i, idx, "expected an open array");
        if (a->kind == CL_HOST)
          arg_error(L, kidx, i, idx, "expected a device, pinned, mapped or managed array (the parameter's type is not known, so a host array is not copied)");
        if (a->mem->ctx != k->ctx) reach(L, k, kidx, i, idx, a->mem);
        *(CUdeviceptr *)p = cl_devptr(a);
        A->used[A->nused++] = a->mem;
      } else if (lua_isinteger(L, idx)) {
        *(int64_t *)p = (int64_t)lua_tointeger(L, idx);
      } else {
        arg_error(L, kidx, i, idx, "expected an array or an integer address (give a signature for other 8-byte types)");
      }
      continue;
    }
    if (c == 'x' || c == 'y') {
      size_t n = 0;
      /* the type first: lua_tolstring would turn a number on the stack into a string */
      const char *str = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &n) : NULL;
      if (!str || n != k->psize[i])
        arg_error(L, kidx, i, idx, lua_pushfstring(L, c == 'x' ? "expected a string of exactly %d bytes"
          : "expected a string of exactly %d bytes (the type is not known: give a signature, module:get(name, \"float*, int\"))",
          (int)k->psize[i]));
      if (n <= sizeof A->slots[i]) memcpy(p, str, n);
      else A->params[i] = (void *)str;   /* the string stays on the stack meanwhile */
      continue;
    }
    if ((c == 'b' || c == 'B') && lua_type(L, idx) == LUA_TBOOLEAN) { *(uint8_t *)p = (uint8_t)lua_toboolean(L, idx); continue; }
    if (c == 'c' || c == 'C') {   /* cuFloatComplex / cuDoubleComplex: a number or {re, im} */
      int t = lua_type(L, idx);
      if (t != LUA_TNUMBER && !(t == LUA_TTABLE && lua_rawlen(L, idx) == 2))
        arg_error(L, kidx, i, idx, "expected a number or a pair {re, im}");
      cl_tovalue(L, idx, c == 'c' ? CL_C64 : CL_C128, p, "kernel argument", 0);
      continue;
    }
    if (lua_type(L, idx) != LUA_TNUMBER) arg_error(L, kidx, i, idx, "expected a number");
    if (c == 'f') {
      lua_Number v = lua_tonumber(L, idx);
      if (v == v && v - v == 0 && (v > FLT_MAX || v < -FLT_MAX)) arg_error(L, kidx, i, idx, "value out of range");
      *(float *)p = (float)v;
      continue;
    }
    if (c == 'd') { *(double *)p = lua_tonumber(L, idx); continue; }
    if (c == 'e') {
      lua_Number v = lua_tonumber(L, idx);
      if (v == v && v - v == 0 && (v > 65504.0 || v < -65504.0)) arg_error(L, kidx, i, idx, "value out of range");
      *(uint16_t *)p = cl_float_to_half((float)v);
      continue;
    }
    if (c == 'E') {   /* the elements' rule: what rounds to the largest bfloat16 fits */
      if (!cl_to_bf16(lua_tonumber(L, idx), (uint16_t *)p)) arg_error(L, kidx, i, idx, "value out of range");
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
      /* PTX types say the width, not the sign: either sign's range */
      case 'B': ok = v >= INT8_MIN && v <= UINT8_MAX; *(uint8_t *)p = (uint8_t)v; break;
      case 'H': ok = v >= INT16_MIN && v <= UINT16_MAX; *(uint16_t *)p = (uint16_t)v; break;
      case 'W': ok = v >= INT32_MIN && v <= (lua_Integer)UINT32_MAX; *(uint32_t *)p = (uint32_t)v; break;
      default: ok = 0;
    }
    if (!ok) arg_error(L, kidx, i, idx, "value out of range");
  }
}
