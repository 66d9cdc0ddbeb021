/* array.c: host arrays (pageable, pinned, mapped, managed) and device arrays, all one Lua type.
   Indices are 1-based on the Lua side; a[i] reads the i-th element in row-major order. */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include "cl.h"

const char *const cl_kind_names[] = {"array", "pinned_array", "mapped_array", "managed_array",
                                   "device_array", "foreign_array"};

/* the array metatable is also kept under this address: a pointer key is the cheapest lookup,
   and arrays are made and checked in hot loops */
static const char array_key = 0;

cl_array *cl_toarray(lua_State *L, int idx) { return cl_class_test(L, idx, &array_key); }

/* set by interop.c when it opens (it sits above this file: it makes arrays): the array check
   then takes a foreign object with the CUDA Array Interface, replaced on the stack by a view of
   its memory. A pointer, so that this file calls nothing above it; only the slow path (not a
   cudalua array) goes through it */
cl_array *(*cl_foreign_array)(lua_State *L, int idx);

cl_array *cl_checkarray(lua_State *L, int idx) {
  cl_array *a = cl_toarray(L, idx);
  if (!a) {
    cl_array *(*foreign)(lua_State *, int) = __atomic_load_n(&cl_foreign_array, __ATOMIC_RELAXED);
    if (foreign) a = foreign(L, idx);
  }
  if (!a) cl_typeerror(L, idx, "cudalua array");
  if (!a->mem) cl_argerror(L, idx, "closed array");
  return a;
}

size_t cl_nbytes(const cl_array *a) { return a->size * cl_dtypes[a->dtype].size; }
CUdeviceptr cl_devptr(const cl_array *a) { return a->mem->dptr ? a->mem->dptr + a->offset : 0; }
void *cl_hostptr(const cl_array *a) { return a->mem->host ? (char *)a->mem->host + a->offset : NULL; }

int cl_is_host(const cl_array *a) { return a->kind != CL_DEVICE && a->kind != CL_FOREIGN; }

/* Lua host functions run while cudalua waits: one may close an array the waiting call goes
   on to use (its memory's free is put off, but the array has let go of it) */
void cl_still_open(lua_State *L, cl_array *a, const char *where) {
  if (!a->mem)
    cl_error(L, where, "the array was closed (by a Lua host function) while this waited for the GPU");
}

/* the host may touch managed memory only when no kernel runs, unless the device allows it */
void cl_host_access(lua_State *L, cl_array *a) {
  if (a->kind == CL_MANAGED && !cl_concurrent_managed(a->mem->ctx)) {
    cl_use_ctx(L, a->mem->ctx);
    cl_wait(L, CL_WAIT_CTX, NULL, "waiting before host access to managed memory");
    cl_still_open(L, a, "managed memory access");
  }
}

/* shape: an integer or a table of 1..8 integers >= 0 */
int cl_parse_shape(lua_State *L, int idx, int64_t *shape, const char *where) {
  int ndim = 0;
  if (lua_type(L, idx) == LUA_TNUMBER) {
    if (!lua_isinteger(L, idx)) cl_error(L, where, "shape must be an integer, got %s", lua_tostring(L, idx));
    shape[0] = lua_tointeger(L, idx);
    ndim = 1;
  } else if (lua_type(L, idx) == LUA_TTABLE) {
    ndim = (int)lua_rawlen(L, idx);
    if (ndim < 1 || ndim > CL_MAXDIM)
      cl_error(L, where, "shape needs 1 to %d dimensions, got %d", CL_MAXDIM, ndim);
    for (int i = 0; i < ndim; i++) {
      lua_rawgeti(L, idx, i + 1);
      if (!lua_isinteger(L, -1))
        cl_error(L, where, "shape[%d] must be an integer, got %s", i + 1,
                   lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
      shape[i] = lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
  } else {
    cl_error(L, where, "shape must be an integer or a table of integers, got %s",
               luaL_typename(L, idx));
  }
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) cl_error(L, where, "shape[%d] is negative (%I)", i + 1, (lua_Integer)shape[i]);
  return ndim;
}

cl_array *cl_push_array(lua_State *L, cl_mem *m, size_t offset, int kind, int dt, int ndim,
                            const int64_t *shape) {
  cl_array *a = lua_newuserdatauv(L, sizeof *a, 1);
  memset(a, 0, sizeof *a);
  a->mem = m; a->offset = offset; a->kind = kind; a->dtype = dt; a->ndim = ndim;
  a->size = 1;
  for (int i = 0; i < ndim; i++) { a->shape[i] = shape[i]; a->size *= (size_t)shape[i]; }
  cl_set_strides(a, NULL);
  cl_class_set(L, &array_key);
  return a;
}

/* ---- strides ---- */
/* contiguous: every axis of more than one index steps by the row-major stride (NumPy's
   rule: an axis of extent 1 may have any stride, and an empty array is contiguous) */
void cl_set_strides(cl_array *a, const int64_t *strides) {
  int64_t step = cl_dtypes[a->dtype].size;
  a->contig = 1;
  for (int d = a->ndim - 1; d >= 0; d--) {
    a->strides[d] = strides ? strides[d] : step;
    if (a->shape[d] > 1 && a->strides[d] != step) a->contig = 0;
    step *= a->shape[d] ? a->shape[d] : 1;
  }
  if (a->size == 0) a->contig = 1;
}

size_t cl_elem_offset(const cl_array *a, size_t flat) {
  if (a->contig) return flat * (size_t)cl_dtypes[a->dtype].size;
  size_t off = 0;
  for (int d = a->ndim - 1; d >= 0; d--) {
    size_t n = (size_t)a->shape[d];
    off += flat % n * (size_t)a->strides[d];
    flat /= n;
  }
  return off;
}

void cl_need_contiguous(lua_State *L, const cl_array *a, const char *where, const char *what) {
  if (a->contig) return;
  char buf[200] = "";
  for (int d = 0; d < a->ndim; d++)
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%lld", d ? ", " : "", (long long)a->strides[d]);
  cl_error(L, where, "%s is a strided view (strides {%s} bytes): this needs a contiguous array "
           "(a:copy() makes one)", what, buf);
}

/* each step is checked before it is taken, so nothing overflows on the way */
int cl_shape_mul(size_t *n, int ndim, const int64_t *shape) {
  for (int i = 0; i < ndim; i++) {
    if (shape[i] && *n > ((size_t)1 << 50) / (size_t)shape[i]) return 0;
    *n *= (size_t)shape[i];
  }
  return 1;
}

cl_array *cl_newarray(lua_State *L, int kind, int dt, int ndim, const int64_t *shape,
                      cl_stream *s, int flags) {
  size_t n = 1, isz = cl_dtypes[dt].size;
  if (!cl_shape_mul(&n, ndim, shape) || n > ((size_t)1 << 50) / isz) cl_error(L, NULL, "array too large");
  if (kind == CL_DEVICE) cl_capture_guard(L, s, 0, "allocating a device array");
  /* the userdata exists before the memory, so an error in between leaks nothing */
  cl_array *a = cl_push_array(L, NULL, 0, kind, dt, ndim, shape);
  a->mem = cl_mem_new(L, kind, n * isz, s, flags);
  return a;
}

/* ---- constructors ---- */

static int infer_dtype(lua_State *L, int idx, int ndim) {
  /* the first leaf decides between bool, int64 and float64; a later float widens to float64 */
  int dt = -1;
  if (ndim == 1) {
    size_t n = lua_rawlen(L, idx);
    for (size_t i = 1; i <= n; i++) {
      int t = lua_rawgeti(L, idx, (lua_Integer)i);
      if (t == LUA_TBOOLEAN && dt < 0) dt = CL_BOOL;
      else if (t == LUA_TNUMBER) {
        if (!lua_isinteger(L, -1)) { lua_pop(L, 1); return CL_F64; }
        if (dt < 0 || dt == CL_BOOL) dt = CL_I64;
      }
      lua_pop(L, 1);
    }
    return dt < 0 ? CL_F64 : dt;
  }
  size_t n = lua_rawlen(L, idx);
  for (size_t i = 1; i <= n; i++) {
    if (lua_rawgeti(L, idx, (lua_Integer)i) == LUA_TTABLE) {
      int d = infer_dtype(L, lua_gettop(L), ndim - 1);
      if (d == CL_F64) { lua_pop(L, 1); return CL_F64; }
      if (dt < 0 || d == CL_I64) dt = d;
    }
    lua_pop(L, 1);
  }
  return dt < 0 ? CL_F64 : dt;
}

static int table_shape(lua_State *L, int idx, int64_t *shape) {
  int ndim = 0;
  lua_pushvalue(L, idx);
  while (lua_type(L, -1) == LUA_TTABLE) {
    if (ndim == CL_MAXDIM) cl_error(L, "cuda.array", "tables nested deeper than %d", CL_MAXDIM);
    shape[ndim++] = (int64_t)lua_rawlen(L, -1);
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
  return ndim;
}

static char *fill_from(lua_State *L, int idx, int dt, int d, int ndim, const int64_t *shape,
                       char *p, lua_Integer *count) {
  int isz = cl_dtypes[dt].size;
  if ((int64_t)lua_rawlen(L, idx) != shape[d])
    cl_error(L, "cuda.array", "ragged table: a row at depth %d has %d elements, expected %I", d + 1,
               (int)lua_rawlen(L, idx), (lua_Integer)shape[d]);
  for (int64_t i = 1; i <= shape[d]; i++) {
    lua_rawgeti(L, idx, i);
    if (d + 1 < ndim) {
      if (!lua_istable(L, -1)) cl_error(L, "cuda.array", "ragged table: expected a row at depth %d", d + 2);
      p = fill_from(L, lua_gettop(L), dt, d + 1, ndim, shape, p, count);
    } else {
      cl_tovalue(L, -1, dt, p, "cuda.array", ++*count);
      p += isz;
    }
    lua_pop(L, 1);
  }
  return p;
}

/* an argument past those a constructor takes: refused, so that a misplaced option is not lost */
static void no_more_args(lua_State *L, int idx, const char *where, const char *takes) {
  if (!lua_isnone(L, idx) && !lua_isnil(L, idx))
    cl_error(L, where, "argument %d is not taken (%s), got %s", idx, takes, luaL_typename(L, idx));
}

int cl_l_array(lua_State *L) {
  int64_t shape[CL_MAXDIM];
  no_more_args(L, 3, "cuda.array", "it takes values or a shape, and a dtype");
  if (lua_type(L, 1) == LUA_TTABLE && luaL_getmetafield(L, 1, "__cuda_array_interface") != LUA_TNIL)
    return cl_error(L, "cuda.array", "the table is a foreign array (__cuda_array_interface): use cuda.as_cuda_array(t):copy_to_host()");
  if (lua_type(L, 1) == LUA_TTABLE) {
    int ndim = table_shape(L, 1, shape);
    if (ndim == 0) { ndim = 1; shape[0] = 0; }
    int dt = lua_isnoneornil(L, 2) ? infer_dtype(L, 1, ndim) : cl_checkdtype(L, 2);
    /* complex: below the top level, a table of two numbers is one element {re, im} */
    if (cl_is_complex(dt) && ndim >= 2 && shape[ndim - 1] == 2) ndim--;
    cl_array *a = cl_newarray(L, CL_HOST, dt, ndim, shape, NULL, 0);
    lua_Integer count = 0;
    if (a->size) fill_from(L, 1, dt, 0, ndim, shape, cl_hostptr(a), &count);
    return 1;
  }
  if (lua_type(L, 1) != LUA_TNUMBER)
    return cl_typeerror(L, 1, "table of values or integer length");
  int ndim = cl_parse_shape(L, 1, shape, "cuda.array");
  cl_newarray(L, CL_HOST, cl_optdtype(L, 2, CL_F64), ndim, shape, NULL, 1);
  return 1;
}

static int new_kind(lua_State *L, int kind, const char *where) {
  int64_t shape[CL_MAXDIM];
  int ndim = cl_parse_shape(L, 1, shape, where);
  int dt = cl_optdtype(L, 2, CL_F64);
  if (kind != CL_DEVICE) no_more_args(L, 3, where, "host memory takes a shape and a dtype, no stream or options");
  no_more_args(L, 4, where, "a shape, a dtype and a stream or options");
  lua_settop(L, 3);
  cl_stream *s = NULL;
  int flags = kind != CL_DEVICE ? CL_ZERO : 0;
  if (kind == CL_DEVICE && lua_istable(L, 3)) {   /* {stream =, ipc =} */
    static const char *const opts[] = {"stream", "ipc", NULL};
    cl_check_options(L, 3, where, opts);
    if (cl_opt_bool(L, 3, "ipc", where) == 1) flags |= CL_IPC;
    lua_getfield(L, 3, "stream");
    s = cl_tostream(L, -1, where);
    lua_settop(L, 3);
  } else if (kind == CL_DEVICE) s = cl_tostream(L, 3, where);
  if (kind == CL_DEVICE) cl_capture_guard(L, s, 0, where);
  cl_newarray(L, kind, dt, ndim, shape, s, flags);
  return 1;
}

static int l_zeros(lua_State *L) { return new_kind(L, CL_HOST, "cuda.zeros"); }
static int l_pinned_array(lua_State *L) { return new_kind(L, CL_PINNED, "cuda.pinned_array"); }
static int l_mapped_array(lua_State *L) { return new_kind(L, CL_MAPPED, "cuda.mapped_array"); }
static int l_managed_array(lua_State *L) { return new_kind(L, CL_MANAGED, "cuda.managed_array"); }
static int l_device_array(lua_State *L) { return new_kind(L, CL_DEVICE, "cuda.device_array"); }

static int l_device_array_like(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  lua_settop(L, 2);
  cl_stream *s = cl_tostream(L, 2, "cuda.device_array_like");
  cl_newarray(L, CL_DEVICE, a->dtype, a->ndim, a->shape, s, 0);
  return 1;
}

/* ---- element access ---- */

/* a[i] takes one flat (row-major) index on any array; get and set take one index per
   dimension (flat false), so a forgotten index raises instead of reading another element */
static size_t flat_index(lua_State *L, cl_array *a, int first, int n, int flat) {
  if (n == 1 && (flat || a->ndim <= 1)) {
    if (!lua_isinteger(L, first)) cl_error(L, NULL, "array index must be an integer, got %s",
                                             lua_type(L, first) == LUA_TNUMBER ? lua_tostring(L, first) : luaL_typename(L, first));
    lua_Integer i = lua_tointeger(L, first);
    if (i < 1 || (size_t)i > a->size)
      cl_error(L, NULL, "index %I out of range (1..%I)", i, (lua_Integer)a->size);
    return (size_t)(i - 1);
  }
  if (n != a->ndim)
    cl_error(L, NULL, "%d ind%s for an array of %d dimensions (one per dimension)", n, n == 1 ? "ex" : "ices", a->ndim);
  size_t off = 0;
  for (int d = 0; d < n; d++) {
    if (!lua_isinteger(L, first + d)) cl_error(L, NULL, "index %d must be an integer", d + 1);
    lua_Integer i = lua_tointeger(L, first + d);
    if (i < 1 || i > a->shape[d])
      cl_error(L, NULL, "index %d is %I, out of range (1..%I)", d + 1, i, (lua_Integer)a->shape[d]);
    off = off * (size_t)a->shape[d] + (size_t)(i - 1);
  }
  return off;
}

static void get_elem(lua_State *L, cl_array *a, size_t i) {
  int isz = cl_dtypes[a->dtype].size;
  if (cl_is_host(a)) {
    cl_host_access(L, a);
    cl_pushvalue(L, a->dtype, (char *)cl_hostptr(a) + cl_elem_offset(a, i));
  } else {   /* one element from the device: slow, synchronous */
    char buf[CL_MAXITEM];
    cl_use_ctx(L, a->mem->ctx);
    cl_capture_guard(L, NULL, 1, "reading a device array element");
    if (a->mem->gmem) cl_mem_graph_use(L, a->mem, NULL, "reading a device array element");
    /* after the work queued on it: the legacy stream's copy does not wait for non-blocking
       streams by itself */
    if (a->mem->used) cl_mem_settle(L, a->mem);
    if (cl_host_armed(L)) cl_wait(L, CL_WAIT_HOSTFNS, NULL, "reading a device array element");
    cl_still_open(L, a, "reading a device array element");
    cl_check(L, CU(cuMemcpyDtoH, buf, cl_devptr(a) + cl_elem_offset(a, i), isz), "reading a device array element");
    cl_pushvalue(L, a->dtype, buf);
  }
}

/* where: a[i] = v's name or a:set's, for a value that does not fit */
static void set_elem(lua_State *L, cl_array *a, size_t i, int vidx, const char *where) {
  int isz = cl_dtypes[a->dtype].size;
  char buf[CL_MAXITEM];
  if (a->readonly) cl_error(L, NULL, "array is read-only");
  cl_tovalue(L, vidx, a->dtype, buf, where, (lua_Integer)i + 1);
  if (cl_is_host(a)) {
    cl_host_access(L, a);
    memcpy((char *)cl_hostptr(a) + cl_elem_offset(a, i), buf, isz);
  } else {
    cl_use_ctx(L, a->mem->ctx);
    cl_capture_guard(L, NULL, 1, "writing a device array element");
    if (a->mem->gmem) cl_mem_graph_use(L, a->mem, NULL, "writing a device array element");
    if (a->mem->used) cl_mem_settle(L, a->mem);   /* as reads do */
    if (cl_host_armed(L)) cl_wait(L, CL_WAIT_HOSTFNS, NULL, "writing a device array element");
    cl_still_open(L, a, "writing a device array element");
    cl_check(L, CU(cuMemcpyHtoD, cl_devptr(a) + cl_elem_offset(a, i), buf, isz), "writing a device array element");
  }
}

static int a_get(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  get_elem(L, a, flat_index(L, a, 2, lua_gettop(L) - 1, 0));
  return 1;
}

static int a_set(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int n = lua_gettop(L) - 2;
  if (n < 1) return cl_error(L, NULL, "set needs indices and a value");
  set_elem(L, a, flat_index(L, a, 2, n, 0), n + 2, "array:set");
  return 0;
}

void cl_push_shape(lua_State *L, cl_array *a) {
  lua_createtable(L, a->ndim, 0);
  for (int i = 0; i < a->ndim; i++) { lua_pushinteger(L, a->shape[i]); lua_rawseti(L, -2, i + 1); }
}

static int a_index(lua_State *L) {
  cl_array *a = cl_checkudata(L, 1, CL_ARRAY);
  if (lua_type(L, 2) == LUA_TNUMBER) {
    if (!a->mem) return cl_error(L, NULL, "closed array");
    get_elem(L, a, flat_index(L, a, 2, 1, 1));
    return 1;
  }
  const char *k = lua_tostring(L, 2);
  if (k) {
    /* methods first: one table lookup */
    if (lua_getfield(L, lua_upvalueindex(1), k) != LUA_TNIL) return 1;
    lua_pop(L, 1);
    if (!strcmp(k, "closed")) { lua_pushboolean(L, a->mem == NULL); return 1; }
    if (!strcmp(k, "kind")) { lua_pushstring(L, cl_kind_names[a->kind]); return 1; }
    if (!strcmp(k, "dtype")) { cl_pushdtype(L, a->dtype); return 1; }
    if (!strcmp(k, "shape")) { cl_push_shape(L, a); return 1; }
    if (!strcmp(k, "strides")) {   /* in bytes, as NumPy's, CuPy's and the CUDA Array Interface's */
      lua_createtable(L, a->ndim, 0);
      for (int i = 0; i < a->ndim; i++) { lua_pushinteger(L, a->strides[i]); lua_rawseti(L, -2, i + 1); }
      return 1;
    }
    if (!strcmp(k, "ndim")) { lua_pushinteger(L, a->ndim); return 1; }
    if (!strcmp(k, "size")) { lua_pushinteger(L, (lua_Integer)a->size); return 1; }
    if (!strcmp(k, "nbytes")) { lua_pushinteger(L, (lua_Integer)cl_nbytes(a)); return 1; }
    if (!strcmp(k, "itemsize")) { lua_pushinteger(L, cl_dtypes[a->dtype].size); return 1; }
    if (!strcmp(k, "device")) {   /* nil for host memory every device reaches */
      int d = a->mem ? cl_mem_device(a->mem) : -1;
      if (d < 0) lua_pushnil(L); else lua_pushinteger(L, d);
      return 1;
    }
  }
  return cl_error(L, NULL, "arrays have no field '%s'", luaL_tolstring(L, 2, NULL));
}

static int a_newindex(lua_State *L) {
  cl_array *a = cl_checkudata(L, 1, CL_ARRAY);
  if (lua_type(L, 2) != LUA_TNUMBER)
    return cl_error(L, NULL, "cannot set field '%s' of an array", luaL_tolstring(L, 2, NULL));
  if (!a->mem) return cl_error(L, NULL, "closed array");
  set_elem(L, a, flat_index(L, a, 2, 1, 1), 3, "array[i] =");
  return 0;
}

static int a_len(lua_State *L) {
  cl_array *a = cl_checkudata(L, 1, CL_ARRAY);
  if (!a->mem) return cl_error(L, NULL, "closed array");
  lua_pushinteger(L, (lua_Integer)a->size);
  return 1;
}

/* a view of the array a at index 1 (slice, reshape, view, sub, transpose): its memory
   referenced, read-only if a is, and a foreign owner kept alive with it; strides NULL: C order */
static cl_array *push_view(lua_State *L, cl_array *a, size_t offset, int dt, int ndim, const int64_t *shape,
                           const int64_t *strides) {
  cl_array *v = cl_push_array(L, cl_mem_ref(a->mem), offset, a->kind, dt, ndim, shape);
  if (strides) cl_set_strides(v, strides);   /* (cl_push_array made C order's) */
  v->readonly = a->readonly;
  lua_getiuservalue(L, 1, 1);
  lua_setiuservalue(L, -2, 1);
  return v;
}

static int a_slice(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  lua_Integer n = a->shape[0];
  lua_Integer i = cl_checkinteger(L, 2), j = cl_optinteger(L, 3, n);
  if (i < 1 || i > n + 1) return cl_error(L, "array:slice", "start %I out of range (1..%I)", i, n + 1);
  if (j < i - 1 || j > n) return cl_error(L, "array:slice", "stop %I out of range (%I..%I)", j, i - 1, n);
  int64_t shape[CL_MAXDIM];
  memcpy(shape, a->shape, sizeof shape);
  shape[0] = j - i + 1;
  push_view(L, a, a->offset + (size_t)(i - 1) * (size_t)a->strides[0], a->dtype, a->ndim, shape, a->strides);
  return 1;
}

static int a_reshape(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int64_t shape[CL_MAXDIM];
  int ndim;
  if (lua_gettop(L) > 2) {
    lua_createtable(L, lua_gettop(L) - 1, 0);
    for (int i = 2; i < lua_gettop(L); i++) { lua_pushvalue(L, i); lua_rawseti(L, -2, i - 1); }
    ndim = cl_parse_shape(L, -1, shape, "array:reshape");
  } else ndim = cl_parse_shape(L, 2, shape, "array:reshape");
  size_t n = 1;
  /* a product that wraps around could match the size (0 elements viewed as {2^32, 2^32}): the
     view's indexes would then reach far past the memory */
  if (!cl_shape_mul(&n, ndim, shape))
    return cl_error(L, "array:reshape", "%I elements cannot take that shape (too many elements)", (lua_Integer)a->size);
  if (n != a->size)
    return cl_error(L, "array:reshape", "%I elements cannot take a shape of %I", (lua_Integer)a->size, (lua_Integer)n);
  cl_need_contiguous(L, a, "array:reshape", "the array");
  push_view(L, a, a->offset, a->dtype, ndim, shape, NULL);
  return 1;
}

/* the index of axis d a selector names: first, last (negative: from the end, -1 the last)
   and step of a:sub; the count of indexes it takes into *n */
static int64_t selected(lua_State *L, cl_array *a, int idx, int d, int64_t *n, int64_t *step) {
  int64_t ext = a->shape[d];
  lua_Integer v[3] = {1, ext, 1};
  for (int k = 0; k < 3; k++) {
    if (lua_rawgeti(L, idx, k + 1) != LUA_TNIL) {
      if (!lua_isinteger(L, -1))
        cl_error(L, "array:sub", "axis %d: the selector's %s must be an integer, got %s", d + 1,
                 k == 0 ? "first" : k == 1 ? "last" : "step", luaL_typename(L, -1));
      v[k] = lua_tointeger(L, -1);
    }
    lua_pop(L, 1);
  }
  for (int k = 0; k < 2; k++) if (v[k] < 0) v[k] += ext + 1;
  if (v[2] < 1) cl_error(L, "array:sub", "axis %d: step %I must be >= 1 (views step forwards)", d + 1, v[2]);
  if (v[0] < 1 || v[0] > ext + 1) cl_error(L, "array:sub", "axis %d: first %I out of range (1..%I)", d + 1, v[0], (lua_Integer)ext + 1);
  if (v[1] < v[0] - 1 || v[1] > ext)
    cl_error(L, "array:sub", "axis %d: last %I out of range (%I..%I)", d + 1, v[1], v[0] - 1, (lua_Integer)ext);
  *n = v[1] < v[0] ? 0 : (v[1] - v[0]) / v[2] + 1;
  *step = v[2];
  return v[0] - 1;
}

/* a:sub(sel1, sel2, ...): a view, one selector per axis (those left out: the whole axis):
   nil or true, the whole axis; an integer i, index i with the axis dropped (NumPy's a[:, j]);
   {first [, last [, step]]}, 1-based and inclusive as string.sub (negative: from the end) */
static int a_sub(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int nsel = lua_gettop(L) - 1;
  if (nsel > a->ndim)
    return cl_error(L, "array:sub", "%d selectors for an array of %d dimensions", nsel, a->ndim);
  int64_t shape[CL_MAXDIM], strides[CL_MAXDIM];
  size_t off = a->offset;
  int nd = 0;
  for (int d = 0; d < a->ndim; d++) {
    int idx = d + 2, t = d < nsel ? lua_type(L, idx) : LUA_TNIL;
    if (t == LUA_TNIL || (t == LUA_TBOOLEAN && lua_toboolean(L, idx))) {
      shape[nd] = a->shape[d], strides[nd++] = a->strides[d];
    } else if (t == LUA_TNUMBER && lua_isinteger(L, idx)) {
      lua_Integer i = lua_tointeger(L, idx);
      if (i < 0) i += a->shape[d] + 1;
      if (i < 1 || i > a->shape[d])
        return cl_error(L, "array:sub", "axis %d: index %I out of range (1..%I)", d + 1, lua_tointeger(L, idx),
                        (lua_Integer)a->shape[d]);
      off += (size_t)(i - 1) * (size_t)a->strides[d];
    } else if (t == LUA_TTABLE) {
      int64_t n, step, first = selected(L, a, idx, d, &n, &step);
      if (n) off += (size_t)first * (size_t)a->strides[d];
      shape[nd] = n, strides[nd++] = a->strides[d] * step;
    } else {
      return cl_error(L, "array:sub", "axis %d: a selector is nil, true, an integer or {first, last, step}, got %s",
                      d + 1, luaL_typename(L, idx));
    }
  }
  lua_settop(L, 1);
  push_view(L, a, off, a->dtype, nd, shape, strides);
  return 1;
}

/* a:transpose([perm]): the axes in perm's order (a list of 1-based axes; default reversed);
   a:T() reverses them */
static int a_transpose(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int perm[CL_MAXDIM], seen[CL_MAXDIM] = {0};
  if (lua_isnoneornil(L, 2)) {
    for (int d = 0; d < a->ndim; d++) perm[d] = a->ndim - 1 - d;
  } else {
    luaL_checktype(L, 2, LUA_TTABLE);
    if ((int)lua_rawlen(L, 2) != a->ndim)
      return cl_error(L, "array:transpose", "the permutation has %d axes, the array %d", (int)lua_rawlen(L, 2), a->ndim);
    for (int d = 0; d < a->ndim; d++) {
      lua_rawgeti(L, 2, d + 1);
      lua_Integer k = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
      lua_pop(L, 1);
      if (k < 1 || k > a->ndim || seen[k - 1]++)
        return cl_error(L, "array:transpose", "the permutation must name each axis 1..%d once (entry %d)", a->ndim, d + 1);
      perm[d] = (int)k - 1;
    }
  }
  int64_t shape[CL_MAXDIM], strides[CL_MAXDIM];
  for (int d = 0; d < a->ndim; d++) shape[d] = a->shape[perm[d]], strides[d] = a->strides[perm[d]];
  lua_settop(L, 1);
  push_view(L, a, a->offset, a->dtype, a->ndim, shape, strides);
  return 1;
}

static int a_T(lua_State *L) { lua_settop(L, 1); return a_transpose(L); }

/* a:squeeze([axis]): without the axes of extent 1 (or only the one given, which must be) */
static int a_squeeze(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int only = -1;
  if (!lua_isnoneornil(L, 2)) {
    lua_Integer k = cl_checkinteger(L, 2);
    if (k < 1 || k > a->ndim) return cl_error(L, "array:squeeze", "axis %I out of range (1..%d)", k, a->ndim);
    if (a->shape[k - 1] != 1)
      return cl_error(L, "array:squeeze", "axis %I has extent %I, not 1", k, (lua_Integer)a->shape[k - 1]);
    only = (int)k - 1;
  }
  int64_t shape[CL_MAXDIM], strides[CL_MAXDIM];
  int nd = 0;
  for (int d = 0; d < a->ndim; d++)
    if (!(a->shape[d] == 1 && (only < 0 || only == d))) shape[nd] = a->shape[d], strides[nd++] = a->strides[d];
  lua_settop(L, 1);
  push_view(L, a, a->offset, a->dtype, nd, shape, strides);
  return 1;
}

static int a_is_contiguous(lua_State *L) {
  lua_pushboolean(L, cl_checkarray(L, 1)->contig);
  return 1;
}

/* a:view(dtype): the same bytes as another dtype. Of another item size, as NumPy and Numba do:
   the last dimension is rescaled (int16 {3, 4} as int32 is {3, 2}), which needs its bytes to
   divide by the new size; the start must be aligned for the new type (a kernel would fault on
   a misaligned pointer). Arrays are C-contiguous (views of a range of the first axis, reshapes). */
static int a_view(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int dt = cl_checkdtype(L, 2);
  int64_t shape[CL_MAXDIM];
  memcpy(shape, a->shape, sizeof shape);
  size_t from = (size_t)cl_dtypes[a->dtype].size, to = (size_t)cl_dtypes[dt].size;
  if (from != to) {
    cl_need_contiguous(L, a, "array:view", "the array (of another item size)");
    const char *fn = cl_dtypes[a->dtype].name, *tn = cl_dtypes[dt].name;
    if (a->ndim == 0)
      return cl_error(L, "array:view", "a 0-d %s array cannot be viewed as %s (item sizes %d and %d)",
                        fn, tn, (int)from, (int)to);
    size_t last = (size_t)a->shape[a->ndim - 1] * from;
    if (last % to)   /* NumPy's and Numba's words */
      return cl_error(L, "array:view", "when changing to a larger dtype, its size must be a divisor "
                        "of the total size in bytes of the last axis of the array (%I x %s = %I bytes; %s is %d)",
                        (lua_Integer)a->shape[a->ndim - 1], fn, (lua_Integer)last, tn, (int)to);
    if (a->offset % to)
      return cl_error(L, "array:view", "the array starts %I bytes into its memory, not aligned for %s "
                        "(%d bytes): copy it first", (lua_Integer)a->offset, tn, (int)to);
    shape[a->ndim - 1] = (int64_t)(last / to);
  }
  /* (the same item size: the same strides) */
  push_view(L, a, a->offset, dt, a->ndim, shape, from == to ? a->strides : NULL);
  return 1;
}

/* a:advise(what): hints for managed memory, e.g. "preferred_device" + "accessed_by_host" lets the
   host read a counter a kernel updates without pulling its page away from the device */
static int a_advise(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  static const char *const names[] = {"preferred_device", "preferred_host", "accessed_by_host",
                                      "accessed_by_device", "read_mostly", NULL};
  int w = cl_checkoption(L, 2, NULL, names);
  if (a->kind != CL_MANAGED) return cl_error(L, "array:advise", "only managed arrays take advice (this is a %s)", cl_kind_names[a->kind]);
  cl_use_ctx(L, a->mem->ctx);
  CUmemLocation dev = {CU_MEM_LOCATION_TYPE_DEVICE, cl_device_of(a->mem->ctx)};
  CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0};
  static const CUmem_advise adv[] = {CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                                     CU_MEM_ADVISE_SET_ACCESSED_BY, CU_MEM_ADVISE_SET_ACCESSED_BY,
                                     CU_MEM_ADVISE_SET_READ_MOSTLY};
  CUmemLocation loc = (w == 1 || w == 2) ? host : dev;
  size_t n = cl_nbytes(a);
  if (n) cl_check(L, CU(cuMemAdvise, cl_devptr(a), n, adv[w], loc), NULL);
  lua_settop(L, 1);
  return 1;
}

static int a_ptr(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  if (a->kind == CL_HOST) return cl_error(L, "array:ptr", "a pageable host array has no device address");
  lua_pushinteger(L, (lua_Integer)cl_devptr(a));
  return 1;
}

static int a_close(lua_State *L) {
  cl_array *a = cl_toarray(L, 1);
  if (!a) return cl_typeerror(L, 1, "cudalua array");
  if (a->mem) { cl_mem *m = a->mem; a->mem = NULL; cl_mem_unref(L, m); }
  return 0;
}

static int a_tostring(lua_State *L) {
  cl_array *a = cl_checkudata(L, 1, CL_ARRAY);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "cudalua.%s<%s>", cl_kind_names[a->kind], cl_dtypes[a->dtype].name);
  luaL_addvalue(&b);
  for (int i = 0; i < a->ndim; i++) {
    lua_pushfstring(L, "[%I]", (lua_Integer)a->shape[i]);
    luaL_addvalue(&b);
  }
  if (!a->mem) luaL_addstring(&b, " (closed)");
  else if (cl_is_host(a) && (a->kind != CL_MANAGED || cl_concurrent_managed(a->mem->ctx))) {
    const char *p = cl_hostptr(a);
    luaL_addstring(&b, " {");
    for (size_t i = 0; i < a->size; i++) {
      if (a->size > 10 && i == 5) { luaL_addstring(&b, ", ..."); i = a->size - 5; }
      if (i) luaL_addstring(&b, ", ");
      if (cl_is_complex(a->dtype)) {   /* "1+2i" */
        double re, im;
        char num[80];
        cl_complex_parts(a->dtype, p + cl_elem_offset(a, i), &re, &im);
        snprintf(num, sizeof num, "%.14g%s%.14gi", re, signbit(im) ? "" : "+", im);
        luaL_addstring(&b, num);
        continue;
      }
      cl_pushvalue(L, a->dtype, p + cl_elem_offset(a, i));
      if (lua_isboolean(L, -1)) { int v = lua_toboolean(L, -1); lua_pop(L, 1); luaL_addstring(&b, v ? "true" : "false"); }
      else if (lua_isinteger(L, -1)) luaL_addvalue(&b);
      else {   /* "%.14g": 5 rather than 5.0, as the tutorials print arrays */
        char num[40];
        snprintf(num, sizeof num, "%.14g", (double)lua_tonumber(L, -1));
        lua_pop(L, 1);
        luaL_addstring(&b, num);
      }
    }
    luaL_addstring(&b, "}");
  }
  luaL_pushresult(&b);
  return 1;
}

/* array_info(a) -> size, dtype, kind, device address (0 for pageable), device id (-1 for host
   memory every device reaches), C-contiguous: one call for Lua glue */
static int l_array_info(lua_State *L) {
  cl_array *a = cl_toarray(L, 1);
  if (!a) return 0;
  if (!a->mem) return cl_argerror(L, 1, "closed array");
  lua_pushinteger(L, (lua_Integer)a->size);
  cl_pushdtype(L, a->dtype);
  lua_pushstring(L, cl_kind_names[a->kind]);
  lua_pushinteger(L, a->kind == CL_HOST ? 0 : (lua_Integer)cl_devptr(a));
  lua_pushinteger(L, cl_mem_device(a->mem));
  lua_pushboolean(L, a->contig);
  return 6;
}

void cl_open_array(lua_State *L) {
  static const luaL_Reg m[] = {
    {"get", a_get}, {"set", a_set},
    {"slice", a_slice}, {"reshape", a_reshape}, {"view", a_view}, {"sub", a_sub}, {"transpose", a_transpose},
    {"T", a_T}, {"squeeze", a_squeeze}, {"is_contiguous", a_is_contiguous}, {"advise", a_advise}, {"ptr", a_ptr}, {"close", a_close},
    {NULL, NULL}};
  static const luaL_Reg f[] = {
    {"array", cl_l_array}, {"zeros", l_zeros}, {"pinned_array", l_pinned_array},
    {"mapped_array", l_mapped_array}, {"managed_array", l_managed_array},
    {"device_array", l_device_array}, {"device_array_like", l_device_array_like},
    {"array_info", l_array_info}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
    {"__newindex", a_newindex}, {"__len", a_len}, {"__gc", a_close}, {"__close", a_close},
    {"__tostring", a_tostring}, {NULL, NULL}};
  /* copy.c, interop.c and ipc.c add methods (copy_to_host, fill, totable, ipc_handle...) */
  cl_class_define(L, &(cl_class){CL_ARRAY, m, a_index, meta, &array_key});
  luaL_setfuncs(L, f, 0);
}
