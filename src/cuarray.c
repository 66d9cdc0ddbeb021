/* cuarray.c: CUDA arrays (cuda.cuda_array), the opaque memory textures and surfaces read and
   write. The CUarray is a memory record of kind CL_HANDLE (memory.c): launches and copies mark
   it used, texture and surface objects hold a reference, so it is destroyed only once nothing
   queued uses it and no object reads it, whatever the user closed first.
   Shapes are in C order as for arrays: {width}, {height, width}, {depth, height, width}; a
   layered array's first extent is its layers. Elements are `channels` values of the dtype, so
   the host or device array a copy takes has channels times as many elements. */
#include <string.h>
#include "cl.h"

/* the array format of a dtype; 0: CUDA arrays cannot hold it. (cuda.h of CUDA 13.0 has no
   bfloat16 format: CU_AD_FORMAT_BFLOAT16 is not among CUarray_format's values) */
CUarray_format cl_array_format(int dt) {
  switch (dt) {
    case CL_I8: return CU_AD_FORMAT_SIGNED_INT8;
    case CL_I16: return CU_AD_FORMAT_SIGNED_INT16;
    case CL_I32: return CU_AD_FORMAT_SIGNED_INT32;
    case CL_U8: return CU_AD_FORMAT_UNSIGNED_INT8;
    case CL_U16: return CU_AD_FORMAT_UNSIGNED_INT16;
    case CL_U32: return CU_AD_FORMAT_UNSIGNED_INT32;
    case CL_F16: return CU_AD_FORMAT_HALF;
    case CL_F32: return CU_AD_FORMAT_FLOAT;
    default: return (CUarray_format)0;
  }
}

void cl_check_format(lua_State *L, int dt, int channels, const char *where) {
  if (!cl_array_format(dt))
    cl_error(L, where, "dtype %s cannot be sampled (textures and surfaces take int8, int16, int32, "
             "uint8, uint16, uint32, float16 and float32%s)", cl_dtypes[dt].name,
             dt == CL_BF16 ? "; this CUDA has no bfloat16 array format" : "");
  if (channels != 1 && channels != 2 && channels != 4)
    cl_error(L, where, "channels must be 1, 2 or 4, got %d (CUDA has no 3-channel formats)", channels);
}

static void destroy_array(void *ud, CUdeviceptr unused) {
  (void)unused;
  CU0(cuArrayDestroy, (CUarray)ud);
}

static const char mt_key = 0;   /* the metatable's second key (cl_class_test) */
cl_cuarray *cl_tocuarray(lua_State *L, int idx) { return cl_class_test(L, idx, &mt_key); }

static cl_cuarray *checkcuarray(lua_State *L, int idx, const char *where) {
  cl_cuarray *ca = cl_tocuarray(L, idx);
  if (!ca) cl_error(L, where, "argument %d: cuda_array expected, got %s", idx, luaL_typename(L, idx));
  if (!ca->mem) cl_error(L, where, "the CUDA array is closed");
  return ca;
}

size_t cl_cuarray_size(const cl_cuarray *ca) {   /* values: elements times channels */
  size_t n = (size_t)ca->channels;
  for (int i = 0; i < ca->ndim; i++) n *= (size_t)ca->shape[i];
  return n;
}

/* the options of cuda.cuda_array at idx into ca (before any driver call: tested without a GPU) */
static void parse_opts(lua_State *L, int idx, cl_cuarray *ca) {
  static const char *const names[] = {"channels", "layered", "surface", NULL};
  ca->channels = 1;
  if (lua_isnoneornil(L, idx)) return;
  if (!lua_istable(L, idx)) cl_error(L, "cuda.cuda_array", "argument 3: options table expected, got %s", luaL_typename(L, idx));
  cl_check_options(L, idx, "cuda.cuda_array", names);
  if (lua_getfield(L, idx, "channels") != LUA_TNIL) {
    if (!lua_isinteger(L, -1)) cl_error(L, "cuda.cuda_array", "channels must be an integer, got %s", luaL_typename(L, -1));
    ca->channels = (int)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  ca->layered = cl_opt_bool(L, idx, "layered", "cuda.cuda_array") == 1;
  ca->surface = cl_opt_bool(L, idx, "surface", "cuda.cuda_array") == 1;
}

/* cuda.cuda_array(shape, dtype [, {channels =, layered =, surface =}]) */
static int l_cuda_array(lua_State *L) {
  cl_cuarray tmp;
  memset(&tmp, 0, sizeof tmp);
  int64_t shape[CL_MAXDIM];
  int ndim = cl_parse_shape(L, 1, shape, "cuda.cuda_array");
  tmp.dtype = cl_checkdtype(L, 2);
  parse_opts(L, 3, &tmp);
  cl_check_format(L, tmp.dtype, tmp.channels, "cuda.cuda_array");
  int least = tmp.layered ? 2 : 1;
  if (ndim < least || ndim > 3)
    return cl_error(L, "cuda.cuda_array", tmp.layered ? "a layered array has 2 or 3 extents ({layers, width} or "
                    "{layers, height, width}), got %d" : "a CUDA array has 1, 2 or 3 extents, got %d", ndim);
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1) return cl_error(L, "cuda.cuda_array", "extent %d must be at least 1, got %I", i + 1, (lua_Integer)shape[i]);
    tmp.shape[i] = shape[i];
  }
  tmp.ndim = ndim;
  /* the driver's Width, Height, Depth: 0 for the dimensions it does not have; layers in Depth */
  int64_t *s = tmp.shape;
  if (tmp.layered) { tmp.d = (size_t)s[0]; tmp.w = (size_t)s[ndim - 1]; tmp.h = ndim == 3 ? (size_t)s[1] : 0; }
  else { tmp.w = (size_t)s[ndim - 1]; tmp.h = ndim >= 2 ? (size_t)s[ndim - 2] : 0; tmp.d = ndim == 3 ? (size_t)s[0] : 0; }
  CUcontext ctx = cl_ctx(L);
  CUDA_ARRAY3D_DESCRIPTOR desc;
  memset(&desc, 0, sizeof desc);
  desc.Width = tmp.w; desc.Height = tmp.h; desc.Depth = tmp.d;
  desc.Format = cl_array_format(tmp.dtype);
  desc.NumChannels = (unsigned)tmp.channels;
  desc.Flags = (tmp.layered ? CUDA_ARRAY3D_LAYERED : 0) | (tmp.surface ? CUDA_ARRAY3D_SURFACE_LDST : 0);
  cl_cuarray *ca = lua_newuserdatauv(L, sizeof *ca, 0);
  *ca = tmp;
  ca->mem = NULL;
  cl_class_set(L, &mt_key);
  CUarray h = NULL;
  CUresult r = CU(cuArray3DCreate, &h, &desc);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {   /* as device arrays: garbage and caches first */
    cl_mem_reclaim(L);
    cl_use_ctx(L, ctx);
    r = CU(cuArray3DCreate, &h, &desc);
  }
  cl_check(L, r, "cuda.cuda_array");
  size_t bytes = cl_cuarray_size(ca) * cl_dtypes[ca->dtype].size;
  ca->mem = cl_mem_handle_try(L, ctx, bytes, destroy_array, h, 0);
  if (!ca->mem) { destroy_array(h, 0); cl_error(L, "cuda.cuda_array", "out of host memory"); }
  return 1;
}

/* after a wait (host functions may have run and closed either) */
static void both_open(lua_State *L, const cl_cuarray *ca, cl_array *a, const char *where) {
  cl_still_open(L, a, where);
  if (!ca->mem) cl_error(L, where, "the CUDA array was closed meanwhile");
}

/* the linear side of a copy: host memory by its host address, the rest by device address */
static void linear_side(cl_array *a, CUmemorytype *type, const void **host, CUdeviceptr *dev) {
  if (a->kind == CL_HOST || a->kind == CL_PINNED || a->kind == CL_MAPPED) {
    *type = CU_MEMORYTYPE_HOST; *host = cl_hostptr(a);
  } else {
    *type = CU_MEMORYTYPE_DEVICE; *dev = cl_devptr(a);
  }
}

/* the copy between the whole CUDA array and a, either way, on s (NULL: finished on return) */
static void copy3d(lua_State *L, cl_cuarray *ca, cl_array *a, int into_ca, cl_stream *s, int sync,
                   const char *where) {
  if (!a->mem) cl_error(L, where, "the array is closed");
  cl_need_contiguous(L, a, where, "the array");
  if (a->dtype != ca->dtype)
    cl_error(L, where, "dtype mismatch (the array is %s, the CUDA array %s)", cl_dtypes[a->dtype].name, cl_dtypes[ca->dtype].name);
  if (a->size != cl_cuarray_size(ca))
    cl_error(L, where, "size mismatch (the array has %I values, the CUDA array %I: its elements times %d channels)",
             (lua_Integer)a->size, (lua_Integer)cl_cuarray_size(ca), ca->channels);
  if (!into_ca && a->readonly) cl_error(L, where, "destination is read-only");
  CUcontext ctx = ca->mem->ctx;
  if (!cl_is_host(a)) cl_mem_reach(L, a->mem, ctx, where);
  cl_stream_check(L, s, ctx, where, "arrays");
  cl_use_ctx(L, ctx);
  cl_capture_guard(L, s, sync || a->kind == CL_HOST, where);
  if (a->mem->gmem) cl_mem_graph_use(L, a->mem, s, where);
  if (!s) {
    cl_mem_order(L, a->mem, ctx, ctx);   /* (may wait: host functions run, and may close either) */
    both_open(L, ca, a, where);
    cl_mem_order(L, ca->mem, ctx, ctx);
  }
  CL_BEFORE_ENQUEUE(L, where);
  both_open(L, ca, a, where);
  /* the records from here on: the copy below is parked, and a host function run meanwhile
     may close either object (their frees are put off, so the records stay) */
  cl_mem *am = a->mem, *cm = ca->mem;
  int pageable = a->kind == CL_HOST;
  if (pageable) cl_pageable_prepare(L, am);
  size_t row = ca->w * (size_t)ca->channels * cl_dtypes[ca->dtype].size;
  CUDA_MEMCPY3D p;
  memset(&p, 0, sizeof p);
  p.WidthInBytes = row;
  p.Height = ca->h ? ca->h : 1;
  p.Depth = ca->d ? ca->d : 1;
  CUmemorytype t = CU_MEMORYTYPE_HOST;
  const void *host = NULL;
  CUdeviceptr dev = 0;
  linear_side(a, &t, &host, &dev);
  if (into_ca) {
    p.dstMemoryType = CU_MEMORYTYPE_ARRAY; p.dstArray = (CUarray)cm->ud;
    p.srcMemoryType = t; p.srcHost = host; p.srcDevice = dev; p.srcPitch = row; p.srcHeight = p.Height;
  } else {
    p.srcMemoryType = CU_MEMORYTYPE_ARRAY; p.srcArray = (CUarray)cm->ud;
    p.dstMemoryType = t; p.dstHost = (void *)host; p.dstDevice = dev; p.dstPitch = row; p.dstHeight = p.Height;
  }
  CUstream h = s ? s->h : NULL;
  cl_check(L, CL_PARKED(L, pageable ? CL_PARK_WAIT : CL_PARK_ENQUEUE, cu.cuMemcpy3DAsync(&p, h)), where);
  cl_mem_use_n(L, (cl_mem *[]){am, cm}, 2, s, ctx);
  if (sync || pageable) cl_wait(L, CL_WAIT_STREAM, h, where);
}

/* a captured copy: the CUDA array (at 1) and the array at aidx live as long as the graph (which
   holds their memory: graph.c's cl_graph_hold_kept) */
static void capture_keep(lua_State *L, cl_stream *s, int aidx) {
  aidx = lua_absindex(L, aidx);
  if (!cl_capturing || !cl_capture_push_keep(L, s)) return;
  cl_keep(L, -1, 1);
  cl_keep(L, -1, aidx);
  lua_pop(L, 1);
}

/* ca:copy_to_device(src [, stream]): src a host or device array, or a table of values */
static int ca_copy_to_device(lua_State *L) {
  cl_cuarray *ca = checkcuarray(L, 1, "cuda_array:copy_to_device");
  lua_settop(L, 3);
  cl_pushdtype(L, ca->dtype);
  if (cl_host_from(L, 2, 4)) lua_replace(L, 2);   /* a table of values, as the CUDA array's dtype */
  lua_settop(L, 3);
  cl_array *src = cl_toarray(L, 2);
  if (!src) src = cl_cai_view(L, 2);
  if (!src) return cl_error(L, "cuda_array:copy_to_device", "argument 1: array or table expected, got %s", luaL_typename(L, 2));
  cl_stream *s = cl_tostream(L, 3, "cuda_array:copy_to_device");
  copy3d(L, ca, src, 1, s, lua_isnoneornil(L, 3), "cuda_array:copy_to_device");   /* (the default stream given: async, as arrays') */
  capture_keep(L, s, 2);
  cl_flush_deferred(L);
  lua_settop(L, 1);
  return 1;
}

/* ca:copy_to_host([into] [, stream]): into a host array (made: shape, then channels when
   more than 1) or into any array of the same dtype and size (a device array too) */
static int ca_copy_to_host(lua_State *L) {
  cl_cuarray *ca = checkcuarray(L, 1, "cuda_array:copy_to_host");
  int into = 0, sidx = 2;
  lua_settop(L, 3);
  if (cl_toarray(L, 2)) { into = 2; sidx = 3; }
  else if (lua_isnil(L, 2) && !lua_isnone(L, 3)) sidx = 3;
  cl_stream *s = cl_tostream(L, sidx, "cuda_array:copy_to_host");
  cl_array *dst;
  if (into) {
    dst = cl_toarray(L, into);
    lua_pushvalue(L, into);
  } else {
    int64_t shape[4];
    memcpy(shape, ca->shape, sizeof ca->shape);
    int nd = ca->ndim;
    if (ca->channels > 1) shape[nd++] = ca->channels;
    dst = cl_newarray(L, CL_HOST, ca->dtype, nd, shape, NULL, 0);
  }
  copy3d(L, ca, dst, 0, s, lua_isnoneornil(L, sidx), "cuda_array:copy_to_host");
  capture_keep(L, s, into ? into : lua_gettop(L));
  cl_flush_deferred(L);
  return 1;
}

/* ---- spares: a texture made and closed in a loop over one CUDA array (a frame's resampling)
   costs a driver object's create and destroy each time, ~2.5 us on an H100, for a handle that
   reads exactly what the last one did. A closed one is kept here instead and handed to the next
   of the same description: queued work that used it reads the same through it. At most
   CL_SPARES per array, released with the array (each once the work queued on it is done, as a
   close would) ---- */
static void spare_release(lua_State *L, const cl_spare *sp) {
  cl_mem_unref(L, sp->obj);
  cl_mem_unref(L, sp->src);
}

void cl_cuarray_spare_put(lua_State *L, cl_cuarray *ca, const cl_spare *sp) {
  if (ca->nspare == CL_SPARES) {
    cl_spare old = ca->spare[0];
    memmove(&ca->spare[0], &ca->spare[1], (CL_SPARES - 1) * sizeof old);
    ca->nspare--;
    spare_release(L, &old);   /* (after: a release may run host functions, which may close ca) */
  }
  /* (room checked again: the release above may have run code that filled the slot) */
  if (ca->mem && ca->nspare < CL_SPARES) ca->spare[ca->nspare++] = *sp;
  else spare_release(L, sp);
}

int cl_cuarray_spare_take(cl_cuarray *ca, int surface, const CUDA_TEXTURE_DESC *d, cl_spare *out) {
  for (int i = ca->nspare - 1; i >= 0; i--) {
    cl_spare *sp = &ca->spare[i];
    if (sp->surface != surface || memcmp(&sp->desc, d, sizeof *d)) continue;
    *out = *sp;
    memmove(sp, sp + 1, (size_t)(--ca->nspare - i) * sizeof *sp);
    return 1;
  }
  return 0;
}

static int ca_close(lua_State *L) {
  cl_cuarray *ca = cl_checkudata(L, 1, CL_CUARRAY);
  cl_mem *m = ca->mem;
  ca->mem = NULL;
  while (ca->nspare > 0) {   /* (a copy: a release may run host functions meanwhile) */
    cl_spare sp = ca->spare[--ca->nspare];
    spare_release(L, &sp);
  }
  cl_mem_unref(L, m);   /* textures and surfaces over it keep theirs */
  return 0;
}

static void push_shape(lua_State *L, const cl_cuarray *ca) {
  lua_createtable(L, ca->ndim, 0);
  for (int i = 0; i < ca->ndim; i++) { lua_pushinteger(L, ca->shape[i]); lua_rawseti(L, -2, i + 1); }
}

/* ca.shape, ca.dtype, ca.channels, ca.layered, ca.surface, ca.closed, ca.handle (the CUarray,
   for other libraries); methods otherwise */
static int ca_index(lua_State *L) {
  cl_cuarray *ca = cl_checkudata(L, 1, CL_CUARRAY);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  const char *k = lua_tostring(L, 2);
  if (!k) return 0;
  if (!strcmp(k, "shape")) push_shape(L, ca);
  else if (!strcmp(k, "dtype")) cl_pushdtype(L, ca->dtype);
  else if (!strcmp(k, "channels")) lua_pushinteger(L, ca->channels);
  else if (!strcmp(k, "ndim")) lua_pushinteger(L, ca->ndim);
  else if (!strcmp(k, "layered")) lua_pushboolean(L, ca->layered);
  else if (!strcmp(k, "surface")) lua_pushboolean(L, ca->surface);
  else if (!strcmp(k, "closed")) lua_pushboolean(L, ca->mem == NULL);
  else if (!strcmp(k, "handle")) {
    if (!ca->mem) return cl_error(L, "cuda_array.handle", "the CUDA array is closed");
    lua_pushinteger(L, (lua_Integer)(uintptr_t)ca->mem->ud);
  } else return 0;
  return 1;
}

static int ca_tostring(lua_State *L) {
  cl_cuarray *ca = cl_checkudata(L, 1, CL_CUARRAY);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "cudalua.cuda_array<%s", cl_dtypes[ca->dtype].name);
  luaL_addvalue(&b);
  if (ca->channels > 1) { lua_pushfstring(L, " x%d", ca->channels); luaL_addvalue(&b); }
  luaL_addstring(&b, ca->layered ? ", layered>[" : ">[");
  for (int i = 0; i < ca->ndim; i++) {
    lua_pushfstring(L, i ? ", %I" : "%I", (lua_Integer)ca->shape[i]);
    luaL_addvalue(&b);
  }
  luaL_addstring(&b, ca->mem ? "]" : "] (closed)");
  luaL_pushresult(&b);
  return 1;
}

void cl_open_cuarray(lua_State *L) {
  static const luaL_Reg m[] = {
    {"copy_to_device", ca_copy_to_device}, {"copy_to_host", ca_copy_to_host}, {"close", ca_close},
    {NULL, NULL}};
  static const luaL_Reg meta[] = {
    {"__gc", ca_close}, {"__close", ca_close}, {"__tostring", ca_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){CL_CUARRAY, m, ca_index, meta, &mt_key});
  lua_pushcfunction(L, l_cuda_array); lua_setfield(L, -2, "cuda_array");
}
