/* copy.c: copies between host and device arrays, and fill. With no stream a copy is finished
   on return; with a stream it is queued, except that pageable memory is always done on return,
   as the driver does for pageable copies. */
#include <string.h>
#include "cl.h"

/* ---- strided copies ---- */
void cl_copy_layout(const cl_array *dst, const cl_array *src, cl_layout *y) {
  int n = 0;
  for (int d = 0; d < dst->ndim; d++)
    if (dst->shape[d] != 1) y->ext[n] = (size_t)dst->shape[d], y->dst[n] = dst->strides[d], y->src[n++] = 0;
  for (int d = 0, k = 0; d < src->ndim; d++) if (src->shape[d] != 1) y->src[k++] = src->strides[d];
  y->ext[n] = (size_t)cl_dtypes[dst->dtype].size, y->dst[n] = y->src[n] = 1, n++;
  /* from the inside out: an axis whose step on both sides is the next inner one's span joins it */
  int out = n - 1;
  for (int i = n - 2; i >= 0; i--) {
    if (y->dst[i] == y->dst[out] * (int64_t)y->ext[out] && y->src[i] == y->src[out] * (int64_t)y->ext[out]) {
      y->ext[out] *= y->ext[i];
      continue;
    }
    out--;
    y->ext[out] = y->ext[i], y->dst[out] = y->dst[i], y->src[out] = y->src[i];
  }
  y->nd = n - out;
  if (out) {
    memmove(y->ext, y->ext + out, (size_t)y->nd * sizeof *y->ext);
    memmove(y->dst, y->dst + out, (size_t)y->nd * sizeof *y->dst);
    memmove(y->src, y->src + out, (size_t)y->nd * sizeof *y->src);
  }
}

int cl_copy_piece(const cl_layout *y, CUDA_MEMCPY3D *p) {
  int nd = y->nd, k = 1;
  size_t w = y->ext[nd - 1];
  memset(p, 0, sizeof *p);
  p->WidthInBytes = w, p->Height = p->Depth = 1;
  if (nd >= 2 && y->dst[nd - 2] >= (int64_t)w && y->src[nd - 2] >= (int64_t)w) {
    k = 2;
    p->Height = y->ext[nd - 2];
    p->dstPitch = (size_t)y->dst[nd - 2], p->srcPitch = (size_t)y->src[nd - 2];
    if (nd >= 3 && y->dst[nd - 3] % y->dst[nd - 2] == 0 && y->src[nd - 3] % y->src[nd - 2] == 0 &&
        y->dst[nd - 3] / y->dst[nd - 2] >= (int64_t)p->Height && y->src[nd - 3] / y->src[nd - 2] >= (int64_t)p->Height) {
      k = 3;
      p->Depth = y->ext[nd - 3];
      p->dstHeight = (size_t)(y->dst[nd - 3] / y->dst[nd - 2]), p->srcHeight = (size_t)(y->src[nd - 3] / y->src[nd - 2]);
    } else {
      p->dstHeight = p->srcHeight = p->Height;
    }
  } else {
    p->dstPitch = p->srcPitch = w, p->dstHeight = p->srcHeight = 1;
  }
  return k;
}

/* the pieces of a strided copy, one after another: each outer index's byte offsets on both
   sides (an odometer over the axes the piece leaves out) */
typedef struct pieces { const cl_layout *y; int outer; size_t idx[CL_MAXDIM + 1]; size_t doff, soff; } pieces;
static int next_piece(pieces *it, int first) {
  const cl_layout *y = it->y;
  if (first) { memset(it->idx, 0, sizeof it->idx); it->doff = it->soff = 0; return 1; }
  for (int d = it->outer - 1; d >= 0; d--) {
    it->doff += (size_t)y->dst[d], it->soff += (size_t)y->src[d];
    if (++it->idx[d] < y->ext[d]) return 1;
    it->doff -= (size_t)y->dst[d] * y->ext[d], it->soff -= (size_t)y->src[d] * y->ext[d];
    it->idx[d] = 0;
  }
  return 0;
}

/* a strided copy between two host arrays: row by row */
static void host_strided(char *d, const char *s, const cl_layout *y) {
  pieces it = {y, y->nd - 1, {0}, 0, 0};
  for (int f = 1; next_piece(&it, f); f = 0) memmove(d + it.doff, s + it.soff, y->ext[y->nd - 1]);
}

/* a strided copy by the driver: 2-D pieces (cuMemcpy2DAsync) or 3-D ones, d and p the arrays'
   start addresses, host memory by its host address */
static CUresult driver_strided(lua_State *L, cl_array *dst, cl_array *src, CUdeviceptr d, CUdeviceptr p,
                               const cl_layout *y, CUstream h, int kind) {
  CUDA_MEMCPY3D q;
  int k = cl_copy_piece(y, &q);
  pieces it = {y, y->nd - k, {0}, 0, 0};
  CUmemorytype dt = cl_is_host(dst) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  CUmemorytype st = cl_is_host(src) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  for (int f = 1; next_piece(&it, f); f = 0) {
    CUdeviceptr da = d + it.doff, sa = p + it.soff;
    CUresult r;
    if (k < 3) {
      CUDA_MEMCPY2D c = {0};
      c.WidthInBytes = q.WidthInBytes, c.Height = q.Height, c.dstPitch = q.dstPitch, c.srcPitch = q.srcPitch;
      c.dstMemoryType = dt, c.srcMemoryType = st;
      if (dt == CU_MEMORYTYPE_HOST) c.dstHost = (void *)(uintptr_t)da; else c.dstDevice = da;
      if (st == CU_MEMORYTYPE_HOST) c.srcHost = (const void *)(uintptr_t)sa; else c.srcDevice = sa;
      r = CL_PARKED(L, kind, cu.cuMemcpy2DAsync(&c, h));
    } else {
      q.dstMemoryType = dt, q.srcMemoryType = st;
      if (dt == CU_MEMORYTYPE_HOST) q.dstHost = (void *)(uintptr_t)da; else q.dstDevice = da;
      if (st == CU_MEMORYTYPE_HOST) q.srcHost = (const void *)(uintptr_t)sa; else q.srcDevice = sa;
      r = CL_PARKED(L, kind, cu.cuMemcpy3DAsync(&q, h));
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

/* a strided copy's shapes: one, its axes of extent 1 aside */
void cl_same_shape(lua_State *L, const cl_array *dst, const cl_array *src, const char *where) {
  int64_t a[CL_MAXDIM], b[CL_MAXDIM];
  int na = 0, nb = 0;
  for (int d = 0; d < dst->ndim; d++) if (dst->shape[d] != 1) a[na++] = dst->shape[d];
  for (int d = 0; d < src->ndim; d++) if (src->shape[d] != 1) b[nb++] = src->shape[d];
  if (na == nb && !memcmp(a, b, (size_t)na * sizeof *a)) return;
  luaL_Buffer B;
  luaL_buffinit(L, &B);
  for (int k = 0; k < 2; k++) {
    const cl_array *x = k ? dst : src;
    luaL_addstring(&B, k ? " into {" : "{");
    for (int d = 0; d < x->ndim; d++) { lua_pushfstring(L, "%s%I", d ? ", " : "", (lua_Integer)x->shape[d]); luaL_addvalue(&B); }
    luaL_addstring(&B, "}");
  }
  luaL_pushresult(&B);
  cl_error(L, where, "shape mismatch (%s): a copy to or from a strided view takes one shape", lua_tostring(L, -1));
}

/* copies src into dst (same dtype and size). With no stream the copy is finished on return;
   with a stream it is queued, except that pageable memory is always done on return, as the
   driver does for pageable copies. */
void cl_copy(lua_State *L, cl_array *dst, cl_array *src, cl_stream *s, int sync,
                 const char *where) {
  if (dst->dtype != src->dtype)
    cl_error(L, where, "dtype mismatch (%s into %s)", cl_dtypes[src->dtype].name,
               cl_dtypes[dst->dtype].name);
  if (dst->size != src->size)
    cl_error(L, where, "size mismatch (%I elements into %I)", (lua_Integer)src->size,
               (lua_Integer)dst->size);
  if (dst->readonly) cl_error(L, where, "destination is read-only");
  size_t n = cl_nbytes(src);
  if (n == 0) return;
  int strided = !dst->contig || !src->contig;
  cl_layout y;
  if (strided) {
    cl_same_shape(L, dst, src, where);
    cl_copy_layout(dst, src, &y);
    strided = y.nd > 1;   /* (views whose elements still lie one after another on both sides) */
  }
  if (cl_is_host(dst) && cl_is_host(src)) {   /* host to host: no driver needed */
    cl_host_access(L, dst); cl_host_access(L, src);
    if (dst->mem && dst->mem->used) cl_mem_settle(L, dst->mem);
    if (src->mem && src->mem->used) cl_mem_settle(L, src->mem);
    cl_still_open(L, dst, where); cl_still_open(L, src, where);
    if (strided) host_strided(cl_hostptr(dst), cl_hostptr(src), &y);
    else memmove(cl_hostptr(dst), cl_hostptr(src), n);
    return;
  }
  /* the device side runs the copy: the destination's, else the source's; between two devices
     it is a peer copy, on the stream's device */
  CUcontext dctx = cl_is_host(dst) ? NULL : dst->mem->ctx, sctx = cl_is_host(src) ? NULL : src->mem->ctx;
  CUcontext ctx = dctx ? dctx : sctx;
  int peer = dctx && sctx && dctx != sctx;
  if (peer && strided)
    cl_error(L, where, "a strided view between two devices: copy it into a contiguous array on one of them first");
  if (peer && s) {
    if (s->ctx != dctx && s->ctx != sctx)
      cl_error(L, where, "the stream is on device %d, the arrays on devices %d and %d",
                 cl_device_of(s->ctx), cl_device_of(sctx), cl_device_of(dctx));
    ctx = s->ctx;
  } else if (s && !ctx) ctx = s->ctx;   /* host memory at both ends is not here: a host kind reaches any */
  cl_stream_check(L, s, ctx, where, "arrays");
  cl_use_ctx(L, ctx);
  cl_capture_guard(L, s, sync || dst->kind == CL_HOST || src->kind == CL_HOST, where);
  if (dst->mem->gmem) cl_mem_graph_use(L, dst->mem, s, where);
  if (src->mem && src->mem->gmem) cl_mem_graph_use(L, src->mem, s, where);
  if (!s) {   /* ctx is dctx when both ends are devices */
    cl_mem_order(L, dst->mem, ctx, sctx ? sctx : ctx);
    if (src->mem) cl_mem_order(L, src->mem, ctx, sctx ? sctx : ctx);
  }
  CL_BEFORE_ENQUEUE(L, where);
  /* after the waits above; the blocks are held from here: a host function the helper thread
     runs during a copy that blocks may close the arrays (their frees are put off, the records
     stay) */
  cl_still_open(L, dst, where); cl_still_open(L, src, where);
  cl_mem *dm = dst->mem, *sm = src->mem;
  int pageable = 0;
  if (dst->kind == CL_HOST) { cl_pageable_prepare(L, dm); pageable = 1; }
  if (src->kind == CL_HOST) { cl_pageable_prepare(L, sm); pageable = 1; }
  /* host memory by its host address: the driver then copies it by DMA as host memory (a
     mapped device alias would make the copy engine go through the mapping, much slower) */
  CUdeviceptr d = cl_is_host(dst) ? (CUdeviceptr)(uintptr_t)cl_hostptr(dst) : cl_devptr(dst);
  CUdeviceptr p = cl_is_host(src) ? (CUdeviceptr)(uintptr_t)cl_hostptr(src) : cl_devptr(src);
  CUstream h = s ? s->h : NULL;
  if (peer && !s) {
    /* without a stream: ordered after all work on both devices (cuMemcpyPeer), and finished on
       return: it is queued with the destination device's work (ctx, current), which is waited for */
    cl_check(L, CL_PARKED(L, CL_PARK_WAIT, cu.cuMemcpyPeer(d, dctx, p, sctx, n)), where);
    cl_wait(L, CL_WAIT_CTX, NULL, where);
    return;
  }
  /* pageable memory is copied before the call returns: it waits like a synchronize */
  int kind = pageable ? CL_PARK_WAIT : CL_PARK_ENQUEUE;
  CUresult r = strided ? driver_strided(L, dst, src, d, p, &y, h, kind)
               : CL_PARKED(L, kind, peer ? cu.cuMemcpyPeerAsync(d, dctx, p, sctx, n, h) : cu.cuMemcpyAsync(d, p, n, h));
  cl_check(L, r, where);
  cl_mem_use_n(L, (cl_mem *[]){dm, sm}, 2, s, ctx);
  if (sync || pageable) cl_wait(L, CL_WAIT_STREAM, h, where);
}

cl_array *cl_host_from(lua_State *L, int idx, int dtidx) {
  /* a table (with a dtype) becomes a new pageable array on the stack; a table with the CUDA
     Array Interface is not data but a foreign array */
  if (!lua_istable(L, idx)) return NULL;
  if (luaL_getmetafield(L, idx, "__cuda_array_interface") != LUA_TNIL) { lua_pop(L, 1); return NULL; }
  lua_pushcfunction(L, cl_l_array);
  lua_pushvalue(L, idx);
  if (dtidx) lua_pushvalue(L, dtidx); else lua_pushnil(L);
  lua_call(L, 2, 1);
  return lua_touserdata(L, -1);
}

/* cuda.to_device(host_array | table [, dtype] [, stream]) */
static int l_to_device(lua_State *L) {
  int sidx = 2, dtidx = 0;
  lua_settop(L, 3);
  if (lua_type(L, 2) == LUA_TSTRING || (lua_type(L, 2) == LUA_TUSERDATA && !luaL_testudata(L, 2, "cudalua.stream")))
    { dtidx = 2; sidx = 3; }
  cl_array *src = cl_host_from(L, 1, dtidx);
  if (!src) {
    src = cl_toarray(L, 1);
    if (!src) src = cl_cai_view(L, 1);   /* a foreign array: its view replaces it */
    if (!src) return cl_typeerror(L, 1, "array or table");
    if (!src->mem) return cl_argerror(L, 1, "closed array");
    if (dtidx && cl_checkdtype(L, dtidx) != src->dtype)
      return cl_argerror(L, dtidx, "dtype differs from the array's (no conversion is done)");
  }
  cl_stream *s = cl_tostream(L, sidx, "cuda.to_device");
  cl_array *d = cl_newarray(L, CL_DEVICE, src->dtype, src->ndim, src->shape, s, 0);
  cl_copy(L, d, src, s, lua_isnoneornil(L, sidx), "cuda.to_device");
  cl_flush_deferred(L);   /* what host functions closed while it waited */
  return 1;
}

/* a:copy_to_host([into] [, stream]) */
static int a_copy_to_host(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  int into = 0, sidx = 2;
  lua_settop(L, 3);
  if (cl_toarray(L, 2)) { into = 2; sidx = 3; }
  else if (lua_isnil(L, 2) && !lua_isnone(L, 3)) sidx = 3;
  cl_stream *s = cl_tostream(L, sidx, "array:copy_to_host");
  cl_array *dst;
  if (into) {
    dst = cl_checkarray(L, 2);
    if (!cl_is_host(dst)) return cl_argerror(L, 2, "destination must be a host array");
    lua_pushvalue(L, 2);
  } else {
    dst = cl_newarray(L, CL_HOST, a->dtype, a->ndim, a->shape, NULL, 0);
  }
  cl_copy(L, dst, a, s, lua_isnoneornil(L, sidx), "array:copy_to_host");
  cl_flush_deferred(L);
  return 1;
}

/* d:copy_to_device(src [, stream]): src is an array or a table */
static int a_copy_to_device(lua_State *L) {
  cl_array *d = cl_checkarray(L, 1);
  lua_settop(L, 3);
  if (cl_is_host(d)) return cl_error(L, "array:copy_to_device", "the array is a host array (%s)", cl_kind_names[d->kind]);
  cl_array *src = NULL;
  if (lua_istable(L, 2)) {
    cl_pushdtype(L, d->dtype);               /* at 4: a table takes the array's dtype */
    src = cl_host_from(L, 2, 4);
  }
  if (src) lua_replace(L, 2);
  else src = cl_checkarray(L, 2);
  cl_stream *s = cl_tostream(L, 3, "array:copy_to_device");
  cl_copy(L, d, src, s, lua_isnoneornil(L, 3), "array:copy_to_device");
  cl_flush_deferred(L);
  lua_settop(L, 1);
  return 1;
}

/* cuda.copy(dst, src [, stream]): any two arrays of one dtype and size, on one device, two
   devices (a peer copy) or the host; finished on return without a stream */
static int l_copy(lua_State *L) {
  lua_settop(L, 3);
  cl_array *dst = cl_checkarray(L, 1), *src = cl_checkarray(L, 2);
  cl_stream *s = cl_tostream(L, 3, "cuda.copy");
  cl_copy(L, dst, src, s, s == NULL, "cuda.copy");
  cl_flush_deferred(L);
  lua_settop(L, 1);
  return 1;
}

/* a:copy([stream]): a new contiguous array of a's kind (a foreign array's: a device array,
   on its device) with a's values (CuPy's a.copy()) */
static int a_copy(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  lua_settop(L, 2);
  cl_stream *s = cl_tostream(L, 2, "array:copy");
  if (!cl_is_host(a)) cl_use_ctx(L, a->mem->ctx);
  cl_array *d = cl_newarray(L, a->kind == CL_FOREIGN ? CL_DEVICE : a->kind, a->dtype, a->ndim, a->shape, s, 0);
  cl_copy(L, d, a, s, s == NULL, "array:copy");
  cl_flush_deferred(L);
  return 1;
}

/* the contiguous device array a set to the item v on s (NULL: the legacy stream), queued */
static void fill_device(lua_State *L, cl_array *a, const char *v, cl_stream *s) {
  int isz = cl_dtypes[a->dtype].size;
  cl_stream_check(L, s, a->mem->ctx, "array:fill", "array");
  cl_use_ctx(L, a->mem->ctx);
  cl_capture_guard(L, s, !s, "array:fill");
  if (a->mem->gmem) cl_mem_graph_use(L, a->mem, s, "array:fill");
  if (!s) cl_mem_order(L, a->mem, a->mem->ctx, a->mem->ctx);
  CUstream h = s ? s->h : NULL;
  CL_BEFORE_ENQUEUE(L, "array:fill");
  cl_still_open(L, a, "array:fill");
  CUdeviceptr d = cl_devptr(a);
  cl_mem *m = a->mem;   /* held: see cl_copy */
  size_t n = a->size;
  CUresult r;   /* each call parks on its own (CU) */
  if (isz == 1) r = CU(cuMemsetD8Async, d, *(uint8_t *)v, n, h);
  else if (isz == 2) r = CU(cuMemsetD16Async, d, *(uint16_t *)v, n, h);
  else if (isz == 4) r = CU(cuMemsetD32Async, d, *(uint32_t *)v, n, h);
  else {   /* 8 and 16-byte elements: each 4-byte word as a strided 2-D memset */
    uint32_t w[CL_MAXITEM / 4]; memcpy(w, v, isz);
    r = CUDA_SUCCESS;
    for (int k = 0; k < isz / 4 && r == CUDA_SUCCESS; k++)
      r = CU(cuMemsetD2D32Async, d + 4 * k, isz, w[k], 1, n, h);
  }
  cl_check(L, r, "array:fill");
  cl_mem_use_n(L, &m, 1, s, m->ctx);
}

static int a_fill(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  char v[CL_MAXITEM];
  int isz = cl_dtypes[a->dtype].size;
  cl_tovalue(L, 2, a->dtype, v, "array:fill", 0);
  cl_stream *s = cl_tostream(L, 3, "array:fill");
  if (a->readonly) return cl_error(L, "array:fill", "array is read-only");
  lua_settop(L, 1);
  if (a->size == 0) return 1;
  if (cl_is_host(a)) {
    cl_host_access(L, a);
    if (a->mem && a->mem->used) cl_mem_settle(L, a->mem);
    cl_still_open(L, a, "array:fill");
    char *p = cl_hostptr(a);
    if (a->contig) for (size_t i = 0; i < a->size; i++) memcpy(p + i * isz, v, isz);
    else for (size_t i = 0; i < a->size; i++) memcpy(p + cl_elem_offset(a, i), v, isz);
    return 1;
  }
  if (!a->contig) {
    /* a strided view of device memory: an array of its shape filled, then copied into it (one
       2-D or 3-D copy, not a memset per row), the copy ordered after the fill on the stream */
    cl_use_ctx(L, a->mem->ctx);
    cl_array *t = cl_newarray(L, CL_DEVICE, a->dtype, a->ndim, a->shape, s, 0);
    fill_device(L, t, v, s);
    cl_copy(L, a, t, s, !s, "array:fill");
    cl_flush_deferred(L);
    lua_settop(L, 1);
    return 1;
  }
  fill_device(L, a, v, s);
  if (!s) {
    cl_wait(L, CL_WAIT_STREAM, NULL, "array:fill");
    cl_flush_deferred(L);
  }
  return 1;
}

/* ---- methods ---- */

static void push_table(lua_State *L, cl_array *a, const char *base, int d, size_t *off) {
  lua_createtable(L, (int)a->shape[d], 0);
  for (int64_t i = 1; i <= a->shape[d]; i++) {
    if (d + 1 < a->ndim) push_table(L, a, base, d + 1, off);
    else { cl_pushvalue(L, a->dtype, base + cl_elem_offset(a, *off)); (*off)++; }
    lua_rawseti(L, -2, i);
  }
}

/* a:totable(): nested Lua tables (a device array through a host copy) */
static int a_totable(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  if (!cl_is_host(a)) {   /* through a host copy */
    lua_pushcfunction(L, a_copy_to_host); lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    a = lua_touserdata(L, -1);
  }
  cl_host_access(L, a);
  size_t off = 0;
  push_table(L, a, cl_hostptr(a), 0, &off);
  return 1;
}

/* the copies: array methods (added to array.c's method table) and cuda.to_device, cuda.copy */
void cl_open_copy(lua_State *L) {
  static const luaL_Reg m[] = {
    {"copy_to_host", a_copy_to_host}, {"copy_to_device", a_copy_to_device},
    {"fill", a_fill}, {"totable", a_totable}, {"copy", a_copy}, {NULL, NULL}};
  static const luaL_Reg f[] = {{"to_device", l_to_device}, {"copy", l_copy}, {NULL, NULL}};
  lua_getfield(L, LUA_REGISTRYINDEX, CL_ARRAY ".methods");
  luaL_setfuncs(L, m, 0);
  lua_pop(L, 1);
  luaL_setfuncs(L, f, 0);
}
