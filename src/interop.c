/* interop.c: the CUDA Array Interface (v3). cudalua arrays answer the metafield
   __cuda_array_interface; any value whose metatable has it (a table, or a function returning
   one) becomes a view without a copy, checked with the driver. In C, because kernel launches
   convert such objects every time they are passed. */
#include <string.h>
#include "cl.h"

/* a typestr: "<f4", "=f4" (native order, little-endian here) and "<i1" for "|i1" all name
   one dtype; "<c16" has four characters */
static int dtype_of(const char *ts) {
  for (int d = 0; d < CL_NDTYPE; d++) {
    const char *t = cl_dtypes[d].typestr;
    if (!strcmp(ts + 1, t + 1) && (ts[0] == t[0] || ts[0] == '=' || (t[0] == '|' && ts[0] == '<')))
      return d;
  }
  return -1;
}

/* waits for the producer's stream of an interface (1: the legacy stream, 2: per-thread), in
   the context of the memory at ptr when the driver knows it (a legacy stream is a context's),
   else the selected device's */
void cl_wait_cai_stream(lua_State *L, lua_Integer h, lua_Integer ptr) {
  CUcontext ctx = NULL;
  if (ptr && cl_driver_load() &&
      CU(cuPointerGetAttribute, &ctx, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)ptr) == CUDA_SUCCESS && ctx)
    cl_use_ctx(L, ctx);
  else cl_ctx(L);
  CUstream s = h == 1 ? CU_STREAM_LEGACY : h == 2 ? CU_STREAM_PER_THREAD : (CUstream)(uintptr_t)h;
  cl_wait(L, CL_WAIT_STREAM, s, "waiting for the array's stream");
}

static const char cache_key = 0;   /* registry: object -> its last view (weak keys) */

/* the bytes from the first element to the end of the last: the span a view reaches */
static size_t span_of(int ndim, const int64_t *shape, const int64_t *strides, size_t n, size_t isz) {
  if (!strides || !n) return n * isz;
  size_t last = 0;
  for (int i = 0; i < ndim; i++) last += (size_t)(shape[i] - 1) * (size_t)strides[i];
  return last + isz;
}

/* a new array viewing [ptr, ptr + span) after the driver confirmed it, owner kept alive;
   strides in bytes (NULL: C order) */
static cl_array *foreign_view(lua_State *L, lua_Integer ptr, int dt, int ndim,
                              const int64_t *shape, const int64_t *strides, int readonly, int owner) {
  size_t n = 1;
  if (!cl_shape_mul(&n, ndim, shape)) cl_error(L, "cuda.as_cuda_array", "shape too large");
  size_t bytes = span_of(ndim, shape, strides, n, (size_t)cl_dtypes[dt].size);
  CUcontext ctx = cl_ctx(L);
  int portable = 0;
  if (bytes) {
    if (ptr == 0) cl_error(L, "cuda.as_cuda_array", "null data pointer for %I bytes", (lua_Integer)bytes);
    CUdeviceptr start = 0;
    size_t range = 0;
    CUresult r = CU(cuPointerGetAttribute, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)ptr);
    if (r == CUDA_SUCCESS) r = CU(cuPointerGetAttribute, &range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)ptr);
    if (r != CUDA_SUCCESS)
      cl_error(L, "cuda.as_cuda_array", "%p is not memory the CUDA driver knows (%s): a device "
                 "pointer from cudaMalloc/cuMemAlloc or pinned host memory is needed",
                 (void *)(uintptr_t)ptr, cl_errname(r));
    if ((CUdeviceptr)ptr + bytes > start + range)
      cl_error(L, "cuda.as_cuda_array", "the array needs %I bytes from %p but its allocation ends "
                 "%I bytes after it", (lua_Integer)bytes, (void *)(uintptr_t)ptr,
                 (lua_Integer)(start + range - (CUdeviceptr)ptr));
    /* device memory belongs to its device; pinned and managed memory every device reaches */
    unsigned type = 0;
    int ordinal = -1, managed = 0;
    CU(cuPointerGetAttribute, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ptr);
    CU(cuPointerGetAttribute, &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)ptr);
    if (type == CU_MEMORYTYPE_DEVICE && !managed &&
        CU(cuPointerGetAttribute, &ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)ptr) == CUDA_SUCCESS &&
        ordinal >= 0 && ordinal < cl_ndevices())
      ctx = cl_device_ctx(L, ordinal);
    else portable = 1;
  }
  cl_array *a = cl_push_array(L, NULL, 0, CL_FOREIGN, dt, ndim, shape);
  if (strides) cl_set_strides(a, strides);   /* (cl_push_array made C order's) */
  a->readonly = readonly;
  if (owner) { lua_pushvalue(L, owner); lua_setiuservalue(L, -2, 1); }
  cl_mem *m = cl_mem_record(L, CL_FOREIGN, bytes, ctx);
  m->dptr = (CUdeviceptr)ptr;
  m->portable = portable;
  a->mem = m;
  return a;
}

/* foreign_array(ptr, dtype, shape, readonly, owner [, strides]): for the C embedding API and
   DLPack (dlpack.c); strides in bytes, positive (the caller checked them) */
static int l_foreign_array(lua_State *L) {
  lua_Integer ptr = cl_checkinteger(L, 1);
  int dt = cl_checkdtype(L, 2);
  int64_t shape[CL_MAXDIM], strides[CL_MAXDIM];
  int ndim = cl_parse_shape(L, 3, shape, "as_cuda_array");
  int strided = lua_type(L, 6) == LUA_TTABLE;
  for (int i = 0; strided && i < ndim; i++) {
    lua_rawgeti(L, 6, i + 1);
    strides[i] = lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  foreign_view(L, ptr, dt, ndim, shape, strided ? strides : NULL, lua_toboolean(L, 4), lua_isnoneornil(L, 5) ? 0 : 5);
  return 1;
}

static int fail(lua_State *L, const char *fmt, const char *arg) {
  return cl_error(L, "cuda.as_cuda_array", "%s%s", lua_pushfstring(L, fmt, arg), "");
}

/* the metafield's name as a Lua string made once: the lookup of a long C string compares it whole */
static const char cai_key = 0;

/* n integers from the table at t into out; 0 if one is not an integer */
static int ints(lua_State *L, int t, int n, int64_t *out) {
  int ok = 1, isint;
  t = lua_absindex(L, t);
  for (int i = 0; i < n; i++) lua_rawgeti(L, t, i + 1);
  for (int i = 0; i < n; i++) {
    out[i] = lua_tointegerx(L, i - n, &isint);
    ok &= isint;
  }
  lua_settop(L, -n - 1);
  return ok;
}

/* what an interface table says, read in steps (each raises for what is wrong in its field) */
typedef struct {
  lua_Integer ptr;
  int readonly, dt, ndim, sdim;   /* sdim: the interface's own (0 for a 0-d array, made 1-d) */
  int64_t shape[CL_MAXDIM];
  int64_t strides[CL_MAXDIM];     /* in bytes */
  int strided;                    /* strides given (else C order) */
} cai_desc;

/* data = {ptr, readonly} and typestr */
static void cai_data(lua_State *L, int cai, cai_desc *d) {
  int ok;
  lua_getfield(L, cai, "version");
  lua_Integer version = lua_tointegerx(L, -1, &ok);
  if (!ok || version < 1 || version > 3)
    fail(L, "unsupported version %s (1 to 3)", luaL_tolstring(L, -1, NULL));
  if (lua_getfield(L, cai, "data") != LUA_TTABLE)
    fail(L, "data must be {ptr, readonly}, got %s", luaL_typename(L, -1));
  lua_rawgeti(L, -1, 1);
  d->ptr = lua_tointegerx(L, -1, &ok);
  if (!ok) fail(L, "data[1] (the pointer) must be an integer, got %s", luaL_tolstring(L, -1, NULL));
  int rt = lua_rawgeti(L, -2, 2);
  if (rt != LUA_TNIL && rt != LUA_TBOOLEAN) fail(L, "data[2] (read-only) must be a boolean%s", "");
  d->readonly = lua_toboolean(L, -1);
  size_t tslen = 0;
  const char *ts = lua_getfield(L, cai, "typestr") == LUA_TSTRING ? lua_tolstring(L, -1, &tslen) : NULL;
  d->dt = ts && (tslen == 3 || tslen == 4) && strlen(ts) == tslen ? dtype_of(ts) : -1;
  if (d->dt < 0)
    fail(L, "unsupported typestr %s (supported: <f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1 <V2 (bfloat16) <c8 <c16)",
         ts ? lua_pushfstring(L, "'%s'", ts) : luaL_tolstring(L, -1, NULL));
}

/* shape (a 0-d array holds one element) */
static void cai_shape(lua_State *L, int cai, cai_desc *d) {
  if (lua_getfield(L, cai, "shape") != LUA_TTABLE)
    fail(L, "shape must be a table of integers, got %s", luaL_typename(L, -1));
  int ndim = (int)lua_rawlen(L, -1);
  if (ndim > CL_MAXDIM) fail(L, "more than 8 dimensions%s", "");
  if (!ints(L, -1, ndim, d->shape))
    for (int i = 0; i < ndim; i++) {   /* the slow way, for the message */
      lua_rawgeti(L, -1, i + 1);
      if (!lua_isinteger(L, -1))
        cl_error(L, "cuda.as_cuda_array", "shape[%d] must be an integer, got %s", i + 1, luaL_tolstring(L, -1, NULL));
      lua_pop(L, 1);
    }
  for (int i = 0; i < ndim; i++)
    if (d->shape[i] < 0) cl_error(L, "cuda.as_cuda_array", "shape[%d] is negative (%I)", i + 1, (lua_Integer)d->shape[i]);
  d->sdim = d->ndim = ndim;
  if (ndim == 0) { d->ndim = 1; d->shape[0] = 1; }
}

/* no mask; strides absent (C order) or positive ones, in bytes: C order, Fortran order or any
   other (a strided view: kernels get its first element's address) */
static void cai_layout(lua_State *L, int cai, cai_desc *d) {
  d->strided = 0;
  if (lua_getfield(L, cai, "mask") != LUA_TNIL) fail(L, "masked arrays are not supported%s", "");
  if (lua_getfield(L, cai, "strides") == LUA_TNIL || d->sdim == 0) return;
  int sdim = d->sdim;
  if (lua_type(L, -1) != LUA_TTABLE || (int)lua_rawlen(L, -1) != sdim || !ints(L, -1, sdim, d->strides))
    fail(L, "strides must be nil or one integer per dimension%s", "");
  for (int i = 0; i < sdim; i++)
    if (d->strides[i] <= 0 && d->shape[i] > 1)
      cl_error(L, "cuda.as_cuda_array", "strides[%d] is %I: cudalua's views step forwards (strides > 0)", i + 1,
               (lua_Integer)d->strides[i]);
  for (int i = 0; i < sdim; i++) if (d->strides[i] <= 0) d->strides[i] = cl_dtypes[d->dt].size;   /* (an axis of one) */
  d->strided = 1;
}

/* stream: the producer's work may still be queued there, waited for before the data is used */
static void cai_stream(lua_State *L, int cai, const cai_desc *d) {
  int ok;
  if (lua_getfield(L, cai, "stream") == LUA_TNIL) return;
  lua_Integer h = lua_tointegerx(L, -1, &ok);
  if (!ok) fail(L, "stream must be an integer handle, got %s", luaL_tolstring(L, -1, NULL));
  if (h == 0) fail(L, "stream 0 is not allowed by the interface (use 1 for the legacy stream)%s", "");
  cl_wait_cai_stream(L, h, d->ptr);
}

/* the view made last time for the object at idx if it still describes the same memory, else
   a new one, remembered (pushed either way) */
static cl_array *cai_cached_view(lua_State *L, int idx, const cai_desc *d) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &cache_key);
  int cache = lua_gettop(L);
  lua_pushvalue(L, idx);
  cl_array *v = NULL;
  if (lua_rawget(L, cache) == LUA_TUSERDATA) {
    v = lua_touserdata(L, -1);
    if (!(v->mem && v->mem->dptr == (CUdeviceptr)d->ptr && v->dtype == d->dt && v->ndim == d->ndim &&
          v->readonly == d->readonly && !memcmp(v->shape, d->shape, sizeof(int64_t) * d->ndim) &&
          (d->strided ? !memcmp(v->strides, d->strides, sizeof(int64_t) * d->ndim) : v->contig)))
      v = NULL;
  }
  if (!v) {
    lua_pop(L, 1);
    v = foreign_view(L, d->ptr, d->dt, d->ndim, d->shape, d->strided ? d->strides : NULL, d->readonly, idx);
    lua_pushvalue(L, idx);
    lua_pushvalue(L, -2);
    lua_rawset(L, cache);
  }
  return v;
}

/* the value at idx, if its metatable has __cuda_array_interface, is replaced by a view of the
   memory it describes (the one made last time when that still fits); NULL, and the stack as it
   was, when it has none. Raises for a malformed interface or memory the driver does not know. */
cl_array *cl_cai_view(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  int top = lua_gettop(L);
  luaL_checkstack(L, 2 * CL_MAXDIM + 16, "as_cuda_array");
  if (!lua_getmetatable(L, idx)) return NULL;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &cai_key);
  int t = lua_rawget(L, top + 1);
  if (t == LUA_TNIL) { lua_settop(L, top); return NULL; }
  if (t == LUA_TFUNCTION) { lua_pushvalue(L, idx); lua_call(L, 1, 1); t = lua_type(L, -1); }
  int cai = top + 2;
  if (t != LUA_TTABLE)
    fail(L, "__cuda_array_interface must be a table or give one, got %s", luaL_typename(L, -1));
  lua_settop(L, cai);
  cai_desc d;
  cai_data(L, cai, &d);
  cai_shape(L, cai, &d);
  cai_layout(L, cai, &d);
  cai_stream(L, cai, &d);
  cl_array *v = cai_cached_view(L, idx, &d);
  lua_replace(L, idx);
  lua_settop(L, top);
  return v;
}

/* as_cuda_array(obj) -> a cudalua array viewing obj's memory */
static int l_as_cuda_array(lua_State *L) {
  lua_settop(L, 1);
  if (cl_toarray(L, 1)) return 1;
  if (!cl_cai_view(L, 1))
    return fail(L, "the object has no __cuda_array_interface (got %s)", luaL_typename(L, 1));
  return 1;
}

/* the interface of a cudalua array */
static int a_cai(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  if (a->kind == CL_HOST)
    return cl_error(L, "array.__cuda_array_interface", "a pageable host array has no device address (use a pinned, mapped, managed or device array)");
  lua_createtable(L, 0, 6);
  lua_createtable(L, 2, 0);
  lua_pushinteger(L, (lua_Integer)cl_devptr(a)); lua_rawseti(L, -2, 1);
  lua_pushboolean(L, a->readonly); lua_rawseti(L, -2, 2);
  lua_setfield(L, -2, "data");
  cl_push_shape(L, a);
  lua_setfield(L, -2, "shape");
  lua_pushstring(L, cl_dtypes[a->dtype].typestr);
  lua_setfield(L, -2, "typestr");
  lua_createtable(L, a->ndim, 0);   /* in bytes (a view's own) */
  for (int i = 0; i < a->ndim; i++) { lua_pushinteger(L, a->strides[i]); lua_rawseti(L, -2, i + 1); }
  lua_setfield(L, -2, "strides");
  lua_pushinteger(L, 3);
  lua_setfield(L, -2, "version");
  /* work still queued on the stream that last used it: consumers wait for that stream; work
     of two devices is waited for here, as no one stream covers it */
  if (a->mem->used && a->mem->spread == CL_OTHER_DEVICES) cl_mem_settle(L, a->mem);
  if (a->mem->used) {
    cl_stream *s = a->mem->spread == CL_ONE_STREAM ? a->mem->stream : NULL;
    lua_pushinteger(L, s ? (lua_Integer)(uintptr_t)s->h : 1);   /* 1: the legacy stream */
    lua_setfield(L, -2, "stream");
  }
  return 1;
}

/* sync_stream_handle(h): waits for a stream known only by its handle (CUDA Array Interface:
   1 is the legacy stream, 2 the per-thread one) */
static int l_sync_stream_handle(lua_State *L) {
  cl_wait_cai_stream(L, cl_checkinteger(L, 1), 0);
  return 0;
}

void cl_open_interop(lua_State *L) {
  /* the array check takes CUDA Array Interface objects (every state stores the same value) */
  __atomic_store_n(&cl_foreign_array, cl_cai_view, __ATOMIC_RELAXED);
  lua_pushcfunction(L, l_sync_stream_handle);
  lua_setfield(L, -2, "sync_stream_handle");
  luaL_getmetatable(L, CL_ARRAY);
  lua_pushcfunction(L, a_cai);
  lua_setfield(L, -2, "__cuda_array_interface");
  lua_pop(L, 1);
  lua_newtable(L);   /* object -> its last view; weak keys: the view dies with the object */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &cache_key);
  lua_pushliteral(L, "__cuda_array_interface");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &cai_key);
  lua_pushcfunction(L, l_foreign_array);
  lua_setfield(L, LUA_REGISTRYINDEX, "cudalua.foreign_array");
  lua_pushcfunction(L, l_as_cuda_array);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, "cudalua.as_cuda_array");
  lua_setfield(L, -2, "as_cuda_array");
}
