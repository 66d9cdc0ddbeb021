/* memory.c: the memory blocks behind arrays. A block is reference counted by the arrays and
   views that point into it, remembers the stream that last used it, and is freed in that
   stream's order (device memory) or after that stream is done (host memory), so memory is never
   released while queued work may still use it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "cl.h"

#define BIG (2u << 20)          /* pageable arrays this large are mmapped with huge pages */
#define REGISTER_MIN (1u << 20) /* and page-locked on their first copy */

static void warn(lua_State *L, const char *what, CUresult r) {
  char buf[200];
  snprintf(buf, sizeof buf, "cudalua: %s failed while freeing memory: %s", what, cl_errname(r));
  if (L) lua_warning(L, buf, 0);
}

void cl_mem_use(cl_mem *m, cl_stream *s) {
  if (m->used && m->stream == s) return;
  if (m->used) m->multi = 1;
  cl_stream_ref(s);
  cl_stream_unref(m->stream);
  m->stream = s;
  m->used = 1;
  if (s && !s->blocking) m->multi = 2;   /* a non-blocking stream is not ordered by the legacy one */
}

/* waits until no queued work uses m; returns a CUDA status, never raises */
static CUresult settle(lua_State *L, cl_mem *m) {
  if (!m->used) return CUDA_SUCCESS;
  CUresult r = m->multi ? cl_wait_raw(L, CL_WAIT_CTX, NULL)
                        : cl_wait_raw(L, CL_WAIT_STREAM, m->stream ? m->stream->h : NULL);
  if (r == CUDA_SUCCESS) {
    cl_stream_unref(m->stream);
    m->stream = NULL; m->used = 0; m->multi = 0;
  }
  return r;
}

void cl_mem_settle(lua_State *L, cl_mem *m) {
  if (!m->used) return;
  cl_ctx(L);
  cl_check(L, settle(L, m), "waiting for queued work on an array");
  cl_host_raise(L);
}

int cl_pageable_prepare(cl_mem *m) {
  if (m->kind != CL_HOST || m->registered || m->bytes < REGISTER_MIN) return m->registered > 0;
  /* page-locking once lets every later copy run at pinned speed; if the system refuses
     (memlock limits), copies go the driver's pageable way */
  m->registered = cu.cuMemHostRegister(m->host, m->bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS ? 1 : -1;
  return m->registered > 0;
}

/* Lua's collector sees only the small userdata of an array, not the memory behind it: after
   every so many bytes of GPU-visible memory a full collection frees what is unreachable */
static size_t pressure;
#define PRESSURE_LIMIT ((size_t)1 << 31)

static void collect(lua_State *L) {
  pressure = 0;
  lua_gc(L, LUA_GCCOLLECT);
}

/* on out-of-memory: collect, let queued frees finish, give the pool's spare memory back */
static void reclaim(lua_State *L) {
  collect(L);
  collect(L);   /* finalizers of the first pass free the memory */
  if (cl_capturing) return;
  cl_wait_raw(L, CL_WAIT_CTX, NULL);
  CUmemoryPool pool;
  CUdevice dev;
  if (cu.cuCtxGetDevice(&dev) == CUDA_SUCCESS && cu.cuDeviceGetDefaultMemPool(&pool, dev) == CUDA_SUCCESS)
    cu.cuMemPoolTrimTo(pool, 0);
}

static CUresult alloc_gpu(lua_State *L, cl_mem *m, cl_stream *s, int zero) {
  CUresult r = CUDA_SUCCESS;
  size_t b = m->bytes ? m->bytes : 1;
  if (m->kind == CL_PINNED || m->kind == CL_MAPPED) {
    r = cu.cuMemHostAlloc(&m->host, b, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS) r = cu.cuMemHostGetDevicePointer(&m->dptr, m->host, 0);
    if (r == CUDA_SUCCESS && zero) memset(m->host, 0, b);
  } else if (m->kind == CL_MANAGED) {
    r = cu.cuMemAllocManaged(&m->dptr, b, CU_MEM_ATTACH_GLOBAL);
    m->host = (void *)(uintptr_t)m->dptr;
    if (r == CUDA_SUCCESS && zero) {
      if (!cl_concurrent_managed()) r = cl_wait_raw(L, CL_WAIT_CTX, NULL);
      if (r == CUDA_SUCCESS) memset(m->host, 0, b);
    }
  } else if (m->bytes) {   /* CL_DEVICE */
    r = cu.cuMemAllocAsync(&m->dptr, m->bytes, s ? s->h : NULL);
    if (r == CUDA_SUCCESS) cl_mem_use(m, s);
  }
  if (r != CUDA_SUCCESS && m->host && m->kind != CL_MANAGED) cu.cuMemFreeHost(m->host);
  if (r != CUDA_SUCCESS) { m->host = NULL; m->dptr = 0; }
  return r;
}

/* memory block records are reused: arrays are made and dropped in hot loops */
static __thread cl_mem *spare;
static __thread int nspare;

static cl_mem *mem_alloc(void) {
  cl_mem *m = spare;
  if (m) { spare = (cl_mem *)m->ud; nspare--; memset(m, 0, sizeof *m); return m; }
  return calloc(1, sizeof *m);
}

static void mem_free(cl_mem *m) {
  if (nspare >= 64) { free(m); return; }
  m->ud = spare;
  spare = m;
  nspare++;
}

cl_mem *cl_mem_new(lua_State *L, int kind, size_t bytes, cl_stream *s, int zero) {
  if (kind != CL_HOST) {
    pressure += bytes;
    if (pressure > PRESSURE_LIMIT) collect(L);
  }
  cl_mem *m = mem_alloc();
  if (!m) { luaL_error(L, "cudalua: out of host memory"); return NULL; }
  m->refs = 1; m->kind = kind; m->bytes = bytes;
  if (kind == CL_HOST) {
    if (bytes >= BIG) {
      void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = NULL;
      else madvise(p, bytes, MADV_HUGEPAGE);   /* fewer pages to lock and to walk */
      m->host = p;
    } else {
      m->host = calloc(1, bytes ? bytes : 1);
    }
    if (!m->host) {
      mem_free(m);
      luaL_error(L, "cudalua: out of host memory (%I bytes)", (lua_Integer)bytes);
    }
    return m;
  }
  m->ctx = cl_ctx(L);
  const char *what = kind == CL_PINNED ? "cuda.pinned_array" : kind == CL_MAPPED ? "cuda.mapped_array"
                   : kind == CL_MANAGED ? "cuda.managed_array" : "cuda.device_array";
  CUresult r = alloc_gpu(L, m, s, zero);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    reclaim(L);
    r = alloc_gpu(L, m, s, zero);
  }
  if (r != CUDA_SUCCESS) {
    cl_stream_unref(m->stream);
    mem_free(m);
    char buf[160];
    snprintf(buf, sizeof buf, "%s of %zu bytes", what, bytes);
    cl_check(L, r, buf);
  }
  return m;
}

cl_mem *cl_mem_ref(cl_mem *m) { if (m) m->refs++; return m; }

/* device-visible memory dropped while a stream captures: freeing it now would be captured
   (or refused), so it waits for the end of the capture */
static cl_mem *deferred;

void cl_mem_flush_deferred(lua_State *L) {
  while (deferred && !cl_capturing) {
    cl_mem *m = deferred;
    deferred = (cl_mem *)m->ud;
    m->ud = NULL;
    m->refs = 1;
    cl_mem_unref(L, m);
  }
}

void cl_mem_unref(lua_State *L, cl_mem *m) {
  if (!m || --m->refs > 0) return;
  if (cl_capturing && (m->kind != CL_HOST || m->registered > 0) && m->kind != CL_FOREIGN) {
    m->ud = deferred;
    deferred = m;
    return;
  }
  CUresult r = CUDA_SUCCESS;
  if (m->kind == CL_HOST) {
    if (m->registered > 0) {
      r = settle(L, m);
      if (r == CUDA_SUCCESS) r = cu.cuMemHostUnregister(m->host);
      if (r != CUDA_SUCCESS) warn(L, "unregistering host memory", r);
    }
    if (m->bytes >= BIG) munmap(m->host, m->bytes); else free(m->host);
    cl_stream_unref(m->stream);
    mem_free(m);
    return;
  }
  /* freed memory no longer counts toward the next collection */
  if (m->kind != CL_FOREIGN) pressure -= m->bytes < pressure ? m->bytes : pressure;
  CUcontext cur = NULL;
  cu.cuCtxGetCurrent(&cur);
  if (cur != m->ctx) cu.cuCtxSetCurrent(m->ctx);
  if (m->kind == CL_DEVICE) {
    if (m->dptr) {
      CUstream h = NULL;
      if (m->multi == 2) r = cl_wait_raw(L, CL_WAIT_CTX, NULL);  /* non-blocking streams too */
      else if (m->multi) h = CU_STREAM_LEGACY;          /* ordered after every blocking stream */
      else if (m->stream) h = m->stream->h;
      if (r == CUDA_SUCCESS) r = cu.cuMemFreeAsync(m->dptr, h);
      if (r != CUDA_SUCCESS) warn(L, "cuMemFreeAsync", r);
    }
  } else if (m->kind == CL_FOREIGN) {
    if (m->release) {
      r = settle(L, m);
      if (r != CUDA_SUCCESS) warn(L, "waiting for queued work", r);
      m->release(m->ud, m->dptr);
    }
  } else {
    r = settle(L, m);
    if (r == CUDA_SUCCESS)
      r = m->kind == CL_MANAGED ? cu.cuMemFree(m->dptr) : cu.cuMemFreeHost(m->host);
    if (r != CUDA_SUCCESS) warn(L, "freeing host-visible memory", r);
  }
  if (cur != m->ctx) cu.cuCtxSetCurrent(cur);
  cl_stream_unref(m->stream);
  mem_free(m);
}
