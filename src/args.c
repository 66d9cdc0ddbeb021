/* args.c: kernel arguments. Each Lua value is converted by its parameter's kind (a row of
   kernel.c's cl_params) into the parameter array the driver takes. Every launch runs this (the
   hot path): no allocation, and arrays are told by their metatable's address, not the registry. */
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
  cl_texref *tr = !a && lua_type(L, aidx) == LUA_TUSERDATA ? cl_totexref(L, aidx) : NULL;
  if (tr) got = tr->surface ? (tr->h ? "a surface" : "a closed surface") : (tr->h ? "a texture" : "a closed texture");
  return cl_error_named(L, "kernel '%s' argument %d (%s): %s, got %s", name, i + 1, t, msg, got);
}

/* an array of another context: host memory every device reaches, or a peer device's memory
   with peer access on; else an error naming both devices (slow path) */
static void reach(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_mem *m) {
  if (cl_mem_reachable(m, k->ctx)) return;
  int a = cl_device_of(m->ctx), b = cl_device_of(k->ctx);
  arg_error(L, kidx, i, idx, lua_pushfstring(L, "the array is on device %d and the kernel on device %d "
            "(cuda.enable_peer_access(%d, %d) lets device %d's kernels use device %d's memory)", a, b, b, a, b, a));
}

/* a graph's allocation passed to a launch (slow path): refused outside any capture; in one,
   the launch checks it against its stream's capture (cl_mem_graph_use) */
static void graph_arg(lua_State *L, int kidx, int i, int idx, cl_args *A) {
  if (!cl_capturing)
    arg_error(L, kidx, i, idx, "the array's memory is a graph's (allocated in a stream capture or by graph:alloc): "
              "it exists only while that graph runs, so only that graph's work may use it");
  A->gmem = 1;
}

/* nil or cuda.NULL (a light userdata NULL): a NULL pointer for a pointer parameter */
static int is_null(lua_State *L, int idx) {
  return lua_isnil(L, idx) || (lua_islightuserdata(L, idx) && !lua_touserdata(L, idx));
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

/* a T* or const T* parameter (writable: not const): an array, or anything with
   __cuda_array_interface; pageable host arrays: cl.h */
static void array_arg(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_args *A,
                      int writable, int allow_pageable) {
  void *p = A->slots[i];
  cl_array *a = karray(L, k, idx);
  if (!a && is_null(L, idx)) { *(CUdeviceptr *)p = 0; return; }
  if (!a) {
    /* anything with __cuda_array_interface becomes an array view (src/interop.c) */
    a = cl_cai_view(L, idx);
    if (!a) arg_error(L, kidx, i, idx, "expected an array");
  }
  if (!a->mem) arg_error(L, kidx, i, idx, "expected an open array");
  if (writable && a->readonly)
    arg_error(L, kidx, i, idx, "expected a writable array (the parameter is not const)");
  if (a->kind == CL_HOST) {
    if (!allow_pageable)
      arg_error(L, kidx, i, idx, "expected a device, pinned, mapped or managed array (a pageable host array cannot be copied in and out here)");
    if (!a->contig)
      arg_error(L, kidx, i, idx, "expected a contiguous pageable host array (it is copied in and out whole; a:copy() makes one)");
    /* pageable memory: copied in before and out after the launch, as Numba does; the
       copies are made once every argument has been checked */
    A->tmp[A->ntmp].a = a; A->tmp[A->ntmp].back = writable; A->tmp[A->ntmp].d = 0;
    A->tmp[A->ntmp].slot = p;
    A->ntmp++;
    *(CUdeviceptr *)p = 0;
  } else {
    if (a->mem->ctx != k->ctx) reach(L, k, kidx, i, idx, a->mem);
    if (a->mem->gmem && allow_pageable) graph_arg(L, kidx, i, idx, A);
    *(CUdeviceptr *)p = cl_devptr(a);
    A->used[A->nused++] = a->mem;
  }
}

/* a texture or surface object for an 8-byte parameter (cudaTextureObject_t and
   cudaSurfaceObject_t are unsigned long long): its handle; the launch marks the object and the
   memory it reads used, so closing them waits for the kernel. 0: not one (slow path only) */
static int handle_arg(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_args *A, void *p) {
  cl_texref *t = lua_type(L, idx) == LUA_TUSERDATA ? cl_totexref(L, idx) : NULL;
  if (!t) return 0;
  if (!t->h) arg_error(L, kidx, i, idx, t->surface ? "expected an open surface" : "expected an open texture");
  if (t->obj->ctx != k->ctx)
    arg_error(L, kidx, i, idx, lua_pushfstring(L, "the %s is on device %d and the kernel on device %d",
              t->surface ? "surface" : "texture", cl_device_of(t->obj->ctx), cl_device_of(k->ctx)));
  *(uint64_t *)p = t->h;
  A->used[A->nused++] = t->obj;
  A->used[A->nused++] = t->src;
  return 1;
}

/* .u64 from PTX or 8 bytes of unknown type: an array or an address */
static void address_arg(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_args *A, int eager) {
  void *p = A->slots[i];
  cl_array *a = karray(L, k, idx);
  if (!a && lua_type(L, idx) != LUA_TNUMBER) a = cl_cai_view(L, idx);
  if (!a && handle_arg(L, k, kidx, i, idx, A, p)) return;
  if (a) {
    if (!a->mem) arg_error(L, kidx, i, idx, "expected an open array");
    if (a->kind == CL_HOST)
      arg_error(L, kidx, i, idx, "expected a device, pinned, mapped or managed array (the parameter's type is not known, so a host array is not copied)");
    if (a->mem->ctx != k->ctx) reach(L, k, kidx, i, idx, a->mem);
    if (a->mem->gmem && eager) graph_arg(L, kidx, i, idx, A);
    *(CUdeviceptr *)p = cl_devptr(a);
    A->used[A->nused++] = a->mem;
  } else if (lua_isinteger(L, idx)) {
    *(int64_t *)p = (int64_t)lua_tointeger(L, idx);
  } else if (is_null(L, idx)) {
    *(CUdeviceptr *)p = 0;
  } else {
    arg_error(L, kidx, i, idx, "expected an array or an integer address (give a signature for other 8-byte types)");
  }
}

/* by value from a string of the parameter's exact size (known: the type is known, just not
   converted by cudalua) */
static void bytes_arg(lua_State *L, cl_kernel *k, int kidx, int i, int idx, cl_args *A, int known) {
  size_t n = 0;
  /* the type first: lua_tolstring would turn a number on the stack into a string */
  const char *str = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &n) : NULL;
  if (!str || n != k->psize[i])
    arg_error(L, kidx, i, idx, lua_pushfstring(L, known ? "expected a string of exactly %d bytes"
      : "expected a string of exactly %d bytes (the type is not known: give a signature, module:get(name, \"float*, int\"))",
      (int)k->psize[i]));
  if (n <= sizeof A->slots[i]) memcpy(A->slots[i], str, n);
  else A->params[i] = (void *)str;   /* the string stays on the stack meanwhile */
}

/* a scalar, through dtype.c's conversion and its range checks, in kernel arguments' words */
static void value_arg(lua_State *L, cl_kernel *k, int kidx, int i, int idx, const cl_param_kind *pk, void *p,
                      int eager, cl_args *A) {
  int dt = pk->bools && lua_type(L, idx) == LUA_TBOOLEAN ? CL_BOOL : pk->dtype;
  int st = cl_convert(L, idx, dt, p);
  if (st == CL_CONV_RANGE && pk->dtype_neg >= 0) st = cl_convert(L, idx, pk->dtype_neg, p);
  if (st == CL_CONV_OK) return;
  /* a graph condition (cudaGraphConditionalHandle is an unsigned long long): only kernels of
     its graph may set it, so a launch outside a graph may not take it; one in a capture is
     checked against the stream's capture by the launch (cl_args.conds) */
  /* (a texture or surface first: the two types do not overlap, and theirs is the cheaper test) */
  if (st == CL_CONV_TYPE && (dt == CL_U64 || dt == CL_I64) && handle_arg(L, k, kidx, i, idx, A, p)) return;
  cl_condition *c = st == CL_CONV_TYPE && cl_dtypes[dt].size == 8 ? luaL_testudata(L, idx, CL_CONDITION_MT) : NULL;
  if (c) A->conds = 1;
  if (c && (!eager || cl_capturing)) { *(uint64_t *)p = c->h; return; }
  if (c) arg_error(L, kidx, i, idx, "a graph condition is an argument only of kernel nodes of its graph (and of their bodies)");
  const char *type = pk->how == CL_PARAM_COMPLEX ? "expected a number or a pair {re, im}" : "expected a number";
  if (is_null(L, idx)) type = "nil (NULL) is taken only by pointer parameters: expected a number";
  arg_error(L, kidx, i, idx, st == CL_CONV_TYPE ? type : st == CL_CONV_RANGE ? "value out of range" : "expected an integer");
}

/* each argument by its parameter's row of cl_params (kernel.c) */
void cl_marshal(lua_State *L, cl_kernel *k, int kidx, int first, int nargs, cl_args *A,
                int allow_pageable) {
  if (nargs != k->nparams)
    cl_error_named(L, "kernel '%s' expects %d arguments, got %d%s", cl_kernel_name(L, kidx),
               k->nparams, nargs, nargs < k->nparams ? " (a nil at the end of an argument table is not "
               "counted: give cuda.NULL for a NULL pointer there)" : "");
  A->nused = A->ntmp = A->gmem = A->conds = 0;
  for (int i = 0; i < k->nparams; i++) {
    int idx = first + i;
    void *p = A->slots[i];
    A->params[i] = p;
    const cl_param_kind *pk = &cl_params[k->ptype[i]];
    switch (pk->how) {
      case CL_PARAM_VALUE: value_arg(L, k, kidx, i, idx, pk, p, allow_pageable, A); break;
      case CL_PARAM_ARRAY: array_arg(L, k, kidx, i, idx, A, 1, allow_pageable); break;
      case CL_PARAM_CONST_ARRAY: array_arg(L, k, kidx, i, idx, A, 0, allow_pageable); break;
      case CL_PARAM_ADDRESS: address_arg(L, k, kidx, i, idx, A, allow_pageable); break;
      case CL_PARAM_BYTES: bytes_arg(L, k, kidx, i, idx, A, 1); break;
      case CL_PARAM_UNKNOWN: bytes_arg(L, k, kidx, i, idx, A, 0); break;
      case CL_PARAM_COMPLEX: value_arg(L, k, kidx, i, idx, pk, p, allow_pageable, A); break;   /* a number or {re, im} */
    }
  }
}
