/* cpu_driver.c: the driver entry points of cudalua's CPU device (CUDALUA_DEVICE=cpu), found by
   the loader through cl_cpu_symbol in place of libcuda's. One device; its context is a token;
   memory and copies are the host's (cpu_mem.c), run in stream order by the queue
   (cpu_queue.c); kernels are libraries the host compiler built, loaded from their bytes. Graphs
   and captures are cpu_graph.c's, made of the ops made here. What the CPU device does not do
   (CUDA arrays, textures, IPC, peers) answers CUDA_ERROR_NOT_SUPPORTED, which cudalua reports
   naming the call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "cl.h"
#include "cpu_dev.h"

static int ctx_token;
static __thread CUcontext cur_ctx;
static size_t limits[16];

static CUresult c_Init(unsigned f) { (void)f; return CUDA_SUCCESS; }
static CUresult c_DriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }

static const struct { CUresult r; const char *name, *text; } results[] = {
  {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
  {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "not a kernel library built for cudalua's CPU device"},
  {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "GPU code, which cudalua's CPU device cannot run"},
  {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
  {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
  {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
  {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "not supported by cudalua's CPU device"},
  {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
  {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
  {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
  {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported"},
  {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
  {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
  {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
  {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
  {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
  {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
  {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
  {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
  {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
  {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
  {CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update"},
};
#define NRESULTS (sizeof results / sizeof results[0])

static CUresult c_GetErrorName(CUresult r, const char **s) {
  for (size_t i = 0; i < NRESULTS; i++) if (results[i].r == r) { *s = results[i].name; return CUDA_SUCCESS; }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult c_GetErrorString(CUresult r, const char **s) {
  const char *t = r == CUDA_ERROR_LAUNCH_FAILED || r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_ILLEGAL_ADDRESS
    ? cpu_error_text(r) : NULL;
  for (size_t i = 0; !t && i < NRESULTS; i++) if (results[i].r == r) t = results[i].text;
  *s = t;
  return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- the device ---- */
static CUresult c_DeviceGet(CUdevice *d, int o) { if (o != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
static CUresult c_DeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult c_DeviceGetName(char *b, int n, CUdevice d) {
  (void)d;
  snprintf(b, (size_t)n, "cudalua CPU device (%d threads)", cpu_threads());
  return CUDA_SUCCESS;
}
/* the device's memory: CUDALUA_CPU_MEMORY bytes (a K, M or G after the number), else a quarter
   of the RAM and at most 4 GiB. A GPU's memory is its own, and scripts size their arrays from
   what cuda.mem_info says is free ("40% of the free memory"): the host's RAM would be taken
   whole, and an allocation past it would not fail but swap. */
static size_t capacity(void) {
  static size_t cap;
  if (cap) return cap;
  size_t ram = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
  size_t c = ram / 4 < ((size_t)4 << 30) ? ram / 4 : (size_t)4 << 30;
  const char *e = getenv("CUDALUA_CPU_MEMORY");
  char *end;
  double v = e ? strtod(e, &end) : 0;
  if (e && v > 0) {
    int k = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 0;
    c = (size_t)(v * (double)((size_t)1 << k));
  }
  return cap = c < ((size_t)1 << 20) ? (size_t)1 << 20 : c;
}
size_t cpu_device_free(void) { size_t u = cpu_mem_used(), c = capacity(); return u < c ? c - u : 0; }
static CUresult c_DeviceTotalMem(size_t *b, CUdevice d) { (void)d; *b = capacity(); return CUDA_SUCCESS; }
static CUresult c_MemGetInfo(size_t *f, size_t *t) {
  *t = capacity();
  *f = cpu_device_free();
  return CUDA_SUCCESS;
}

/* the answers a CUDA device would give where cudalua asks; the compute capability is 0.0:
   the CPU device is no GPU */
static CUresult c_DeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 0x7fffffff; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = 48 * 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 * 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 228 * 1024; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = cpu_threads(); break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *v = 512; break;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *v = 32; break;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
  case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_INTEGRATED: case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *v = 1; break;
  case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1000000; break;
  default: *v = 0;
  }
  return CUDA_SUCCESS;
}

/* ---- the context: a token, current per thread ---- */
static CUresult c_PrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&ctx_token; return CUDA_SUCCESS; }
/* released only as the last Lua state closes (cl_release_contexts): the device's threads end */
static CUresult c_PrimaryCtxRelease(CUdevice d) {
  (void)d;
  if (cpu_queue_shutdown()) cpu_pool_shutdown();
  return CUDA_SUCCESS;
}
static CUresult c_CtxSetCurrent(CUcontext c) { cur_ctx = c; return CUDA_SUCCESS; }
static CUresult c_CtxGetCurrent(CUcontext *c) { *c = cur_ctx; return CUDA_SUCCESS; }
static CUresult c_CtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult c_CtxSynchronize(void) { return cpu_wait_seq(cpu_enqueued()); }
static CUresult c_CtxSetLimit(CUlimit l, size_t v) { if ((unsigned)l < 16) limits[l] = v; return CUDA_SUCCESS; }
static CUresult c_CtxGetLimit(size_t *v, CUlimit l) {
  /* what is not set: the defaults a GPU's driver gives (the stack: a fiber's) */
  static const size_t dflt[] = {[CU_LIMIT_STACK_SIZE] = 64 * 1024, [CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20,
                                [CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20, [CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2,
                                [CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048};
  *v = (unsigned)l < 16 && limits[l] ? limits[l] : (unsigned)l < sizeof dflt / sizeof dflt[0] ? dflt[l] : 0;
  return CUDA_SUCCESS;
}
static CUresult c_CtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return CUDA_SUCCESS; }

/* ---- memory: freeing waits for the queued work (as cuMemFree does), an async free is queued ---- */
static CUresult drain(void) { cpu_drain(cpu_enqueued()); return CUDA_SUCCESS; }
static CUresult c_MemAlloc(CUdeviceptr *p, size_t n) {
  void *m;
  CUresult r = n > cpu_device_free() ? CUDA_ERROR_OUT_OF_MEMORY : cpu_alloc(&m, n, CU_MEMORYTYPE_DEVICE);
  *p = (CUdeviceptr)(uintptr_t)(r ? NULL : m);
  return r;
}
static CUresult c_MemFree(CUdeviceptr p) {
  drain();
  CUresult r = cpu_free((void *)(uintptr_t)p);
  return cpu_lost() ? cpu_lost() : r;   /* (freed all the same: nothing kept for a lost device) */
}
void cpu_run_free(cpu_op *op) { cpu_free(op->u.free.p); }
static cpu_op *new_op(cpu_work w) { cpu_op *op = calloc(1, sizeof *op); if (op) op->run = w; return op; }
static CUresult c_MemFreeAsync(CUdeviceptr p, CUstream s) {
  cpu_op *op = new_op(cpu_run_free);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.free.p = (void *)(uintptr_t)p;
  return cpu_enqueue(s, op);
}
static CUresult c_MemHostAlloc(void **p, size_t n, unsigned f) { (void)f; return cpu_alloc(p, n, CU_MEMORYTYPE_HOST); }
static CUresult c_MemFreeHost(void *p) {
  drain();
  CUresult r = cpu_free(p);
  return cpu_lost() ? cpu_lost() : r;
}
static CUresult c_MemHostGetDevicePointer(CUdeviceptr *d, void *h, unsigned f) { (void)f; *d = (CUdeviceptr)(uintptr_t)h; return CUDA_SUCCESS; }
static CUresult c_MemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) {
  (void)f;
  void *m;
  CUresult r = n > cpu_device_free() ? CUDA_ERROR_OUT_OF_MEMORY : cpu_alloc(&m, n, CU_MEMORYTYPE_UNIFIED);
  *p = r ? 0 : (CUdeviceptr)(uintptr_t)m;
  return r;
}
static CUresult c_MemHostRegister(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return CUDA_SUCCESS; }
static CUresult c_MemHostUnregister(void *p) { (void)p; return CUDA_SUCCESS; }
static CUresult c_MemAdvise(CUdeviceptr p, size_t n, CUmem_advise a, CUmemLocation l) { (void)p; (void)n; (void)a; (void)l; return CUDA_SUCCESS; }
static CUresult c_DeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d) { (void)d; *p = (CUmemoryPool)&ctx_token; return CUDA_SUCCESS; }
/* the pool: the device's memory (every allocation is the pool's); its high mark as seen by
   the reads, and reset to the current use by a set of either mark */
static size_t pool_high;
static CUresult c_MemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v) {
  (void)p; (void)v;
  if (a == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || a == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    __atomic_store_n(&pool_high, cpu_mem_used(), __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
static CUresult c_MemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v) {
  (void)p;
  size_t u = cpu_mem_used(), h = __atomic_load_n(&pool_high, __ATOMIC_RELAXED);
  while (u > h && !__atomic_compare_exchange_n(&pool_high, &h, u, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  if (a == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || a == CU_MEMPOOL_ATTR_USED_MEM_CURRENT) *(cuuint64_t *)v = u;
  else if (a == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || a == CU_MEMPOOL_ATTR_USED_MEM_HIGH) *(cuuint64_t *)v = u > h ? u : h;
  else return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}
static CUresult c_MemPoolTrimTo(CUmemoryPool p, size_t n) { (void)p; (void)n; return CUDA_SUCCESS; }

static CUresult c_PointerGetAttribute(void *out, CUpointer_attribute a, CUdeviceptr p) {
  cpu_block b;
  if (!cpu_find((uintptr_t)p, &b)) return CUDA_ERROR_INVALID_VALUE;
  switch (a) {
  case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)out = (CUcontext)&ctx_token; break;
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)out = b.kind == CU_MEMORYTYPE_UNIFIED ? CU_MEMORYTYPE_DEVICE : (unsigned)b.kind; break;
  case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)out = b.kind == CU_MEMORYTYPE_UNIFIED; break;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)out = 0; break;
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)out = b.base; break;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)out = b.size; break;
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)out = p; break;
  case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)out = (void *)(uintptr_t)p; break;
  default: return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
static CUresult c_MemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  cpu_block b;
  if (!cpu_find((uintptr_t)p, &b)) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = b.base;
  if (size) *size = b.size;
  return CUDA_SUCCESS;
}

/* ---- copies and fills, in stream order ---- */
void cpu_run_copy(cpu_op *op) {
  size_t h = op->u.copy.h ? op->u.copy.h : 1, d = op->u.copy.d ? op->u.copy.d : 1;
  for (size_t z = 0; z < d; z++)
    for (size_t y = 0; y < h; y++)
      memmove((char *)op->u.copy.dst + z * op->u.copy.dz + y * op->u.copy.dp,
              (const char *)op->u.copy.src + z * op->u.copy.sz + y * op->u.copy.sp, op->u.copy.n);
}
/* a copy's addresses: linear memory (every kind is host memory here; CUDA arrays are not) */
static const void *side(CUmemorytype t, const void *host, CUdeviceptr dev, size_t x) {
  if (t == CU_MEMORYTYPE_HOST) return host ? (const char *)host + x : NULL;
  if (t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED) return dev ? (const char *)(uintptr_t)dev + x : NULL;
  return NULL;
}
/* op's copy (its run and u.copy) from p: pitched rows and slices of linear memory */
CUresult cpu_copy_op(const CUDA_MEMCPY3D *p, cpu_op *op) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcY || p->srcZ || p->dstY || p->dstZ || p->srcLOD || p->dstLOD) return CUDA_ERROR_NOT_SUPPORTED;
  size_t h = p->Height ? p->Height : 1, d = p->Depth ? p->Depth : 1;
  if ((h > 1 || d > 1) && (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes)) return CUDA_ERROR_INVALID_VALUE;
  if (d > 1 && (p->srcHeight < h || p->dstHeight < h)) return CUDA_ERROR_INVALID_VALUE;
  memset(&op->u.copy, 0, sizeof op->u.copy);
  op->run = cpu_run_copy;
  op->u.copy.src = side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes);
  op->u.copy.dst = (void *)side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes);
  op->u.copy.n = p->WidthInBytes, op->u.copy.h = h, op->u.copy.d = d;
  op->u.copy.dp = p->dstPitch, op->u.copy.sp = p->srcPitch;
  op->u.copy.dz = p->dstPitch * p->dstHeight, op->u.copy.sz = p->srcPitch * p->srcHeight;
  return op->u.copy.src && op->u.copy.dst ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult copy(void *dst, const void *src, size_t n, CUstream s, int wait) {
  cpu_op *op = new_op(cpu_run_copy);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.copy.dst = dst, op->u.copy.src = src, op->u.copy.n = n;
  CUresult r = cpu_enqueue(s, op);
  return r || !wait ? r : cpu_wait_seq(cpu_enqueued());
}
#define PTR(p) ((void *)(uintptr_t)(p))
static CUresult c_MemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(PTR(d), PTR(s), n, st, 0); }
static CUresult c_MemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) { return copy(PTR(d), s, n, st, 0); }
static CUresult c_MemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) { return copy(d, PTR(s), n, st, 0); }
static CUresult c_MemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(PTR(d), PTR(s), n, st, 0); }
static CUresult c_MemcpyHtoD(CUdeviceptr d, const void *s, size_t n) { return copy(PTR(d), s, n, NULL, 1); }
/* pitched copies of linear memory (every kind is host memory here) */
static CUresult c_Memcpy3DAsync(const CUDA_MEMCPY3D *p, CUstream s) {
  cpu_op *op = new_op(cpu_run_copy);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = cpu_copy_op(p, op);
  if (r) { free(op); return r; }
  return cpu_enqueue(s, op);
}
static CUresult c_Memcpy2DAsync(const CUDA_MEMCPY2D *p, CUstream s) {
  CUDA_MEMCPY3D q = {0};
  q.srcXInBytes = p->srcXInBytes, q.srcY = p->srcY, q.srcMemoryType = p->srcMemoryType, q.srcHost = p->srcHost;
  q.srcDevice = p->srcDevice, q.srcArray = p->srcArray, q.srcPitch = p->srcPitch, q.srcHeight = p->Height;
  q.dstXInBytes = p->dstXInBytes, q.dstY = p->dstY, q.dstMemoryType = p->dstMemoryType, q.dstHost = p->dstHost;
  q.dstDevice = p->dstDevice, q.dstArray = p->dstArray, q.dstPitch = p->dstPitch, q.dstHeight = p->Height;
  q.WidthInBytes = p->WidthInBytes, q.Height = p->Height, q.Depth = 1;
  return c_Memcpy3DAsync(&q, s);
}
static CUresult c_MemcpyDtoH(void *d, CUdeviceptr s, size_t n) { return copy(d, PTR(s), n, NULL, 1); }

void cpu_run_fill(cpu_op *op) {
  unsigned char *row = op->u.fill.dst;
  for (size_t y = 0; y < op->u.fill.h; y++, row += op->u.fill.pitch) {
    uint32_t v = op->u.fill.v;
    if (op->u.fill.size == 1) memset(row, (int)(v & 0xff), op->u.fill.w);
    else if (op->u.fill.size == 2) for (size_t i = 0; i < op->u.fill.w; i++) ((uint16_t *)row)[i] = (uint16_t)v;
    else for (size_t i = 0; i < op->u.fill.w; i++) ((uint32_t *)row)[i] = v;
  }
}
static CUresult fill(CUdeviceptr d, uint32_t v, int size, size_t pitch, size_t w, size_t h, CUstream s) {
  cpu_op *op = new_op(cpu_run_fill);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.fill.dst = PTR(d), op->u.fill.v = v, op->u.fill.size = size;
  op->u.fill.pitch = pitch, op->u.fill.w = w, op->u.fill.h = h;
  return cpu_enqueue(s, op);
}
static CUresult c_MemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return fill(d, v, 1, 0, n, 1, s); }
static CUresult c_MemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return fill(d, v, 2, 0, n, 1, s); }
static CUresult c_MemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { return fill(d, v, 4, 0, n, 1, s); }
static CUresult c_MemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned v, size_t w, size_t h, CUstream s) { return fill(d, v, 4, pitch, w, h, s); }

/* ---- streams and events ---- */
static CUresult c_StreamCreateWithPriority(CUstream *s, unsigned f, int prio) {
  cpu_stream *st = calloc(1, sizeof *st);
  if (!st) return CUDA_ERROR_OUT_OF_MEMORY;
  st->flags = f, st->priority = prio;
  *s = (CUstream)st;
  return CUDA_SUCCESS;
}
static CUresult c_StreamCreate(CUstream *s, unsigned f) { return c_StreamCreateWithPriority(s, f, 0); }
static uint64_t last_of(CUstream s) { return (uintptr_t)s > 2 ? ((cpu_stream *)s)->last : cpu_enqueued(); }
static CUresult c_StreamSynchronize(CUstream s) { return cpu_wait_seq(last_of(s)); }
static CUresult c_StreamQuery(CUstream s) { return cpu_done(last_of(s)) ? cpu_lost() : CUDA_ERROR_NOT_READY; }
static CUresult c_StreamGetPriority(CUstream s, int *p) { *p = (uintptr_t)s > 2 ? ((cpu_stream *)s)->priority : 0; return CUDA_SUCCESS; }

static CUresult c_EventCreate(CUevent *e, unsigned f) {
  cpu_event *ev = calloc(1, sizeof *ev);
  if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
  ev->flags = f;
  *e = (CUevent)ev;
  return CUDA_SUCCESS;
}
static CUresult c_EventDestroy(CUevent e) { drain(); free(((cpu_event *)e)->deps); free(e); return CUDA_SUCCESS; }
void cpu_run_record(cpu_op *op) { op->u.rec.ev->t = cpu_now(); }
CUresult cpu_event_record(CUevent e, CUstream s) {
  cpu_op *op = new_op(cpu_run_record);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.rec.ev = (cpu_event *)e;
  CUresult r = cpu_enqueue(s, op);
  ((cpu_event *)e)->seq = cpu_enqueued();
  return r;
}
static CUresult c_EventQuery(CUevent e) { return cpu_done(((cpu_event *)e)->seq) ? cpu_lost() : CUDA_ERROR_NOT_READY; }
static CUresult c_EventSynchronize(CUevent e) { return cpu_wait_seq(((cpu_event *)e)->seq); }
static CUresult c_EventElapsedTime(float *ms, CUevent a, CUevent b) {
  cpu_event *x = (cpu_event *)a, *y = (cpu_event *)b;
  if (!cpu_done(x->seq) || !cpu_done(y->seq)) return CUDA_ERROR_NOT_READY;
  *ms = (float)(y->t - x->t);
  return CUDA_SUCCESS;
}

void cpu_run_host(cpu_op *op) { op->u.host.fn(op->u.host.data); }
static CUresult c_LaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
  cpu_op *op = new_op(cpu_run_host);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->u.host.fn = fn, op->u.host.data = data;
  return cpu_enqueue(s, op);
}

/* ---- batches of memory operations: words written, and waited for (cudalua's Lua host
   functions are a write and a wait: the device waits until the Lua thread has run one) ---- */
static int reached(const CUstreamBatchMemOpParams *o) {
  const volatile void *a = (const void *)(uintptr_t)o->waitValue.address;
  int wide = o->operation == CU_STREAM_MEM_OP_WAIT_VALUE_64;
  uint64_t v = wide ? __atomic_load_n((const volatile uint64_t *)a, __ATOMIC_ACQUIRE)
                    : __atomic_load_n((const volatile uint32_t *)a, __ATOMIC_ACQUIRE);
  uint64_t ref = wide ? o->waitValue.value64 : o->waitValue.value;
  switch (o->waitValue.flags & 3) {
  case CU_STREAM_WAIT_VALUE_GEQ: return wide ? (int64_t)(v - ref) >= 0 : (int32_t)(uint32_t)(v - ref) >= 0;   /* cyclic */
  case CU_STREAM_WAIT_VALUE_EQ: return v == ref;
  case CU_STREAM_WAIT_VALUE_AND: return (v & ref) != 0;
  default: return wide ? ~(v | ref) != 0 : (uint32_t)~(v | ref) != 0;   /* NOR */
  }
}
void cpu_batch_do(const CUstreamBatchMemOpParams *v, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    const CUstreamBatchMemOpParams *o = &v[i];
    void *a = (void *)(uintptr_t)o->writeValue.address;
    if (o->operation == CU_STREAM_MEM_OP_WRITE_VALUE_32) __atomic_store_n((uint32_t *)a, o->writeValue.value, __ATOMIC_RELEASE);
    else if (o->operation == CU_STREAM_MEM_OP_WRITE_VALUE_64) __atomic_store_n((uint64_t *)a, o->writeValue.value64, __ATOMIC_RELEASE);
    else if (o->operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 || o->operation == CU_STREAM_MEM_OP_WAIT_VALUE_64)
      /* the host writes it: short sleeps, growing to a millisecond, keep the cost low */
      for (long ns = 1000; !reached(o); ns = ns < 1000000 ? ns * 2 : ns) nanosleep(&(struct timespec){0, ns}, NULL);
  }
}
void cpu_run_batch(cpu_op *op) {
  cpu_batch_do(op->u.batch.v, op->u.batch.n);
  free(op->u.batch.v);
}
/* the operations this device does: 32 and 64-bit writes and waits (a barrier is no work here) */
static int batch_ok(const CUstreamBatchMemOpParams *v, unsigned n) {
  for (unsigned i = 0; i < n; i++) {
    CUstreamBatchMemOpType t = v[i].operation;
    if (t != CU_STREAM_MEM_OP_WRITE_VALUE_32 && t != CU_STREAM_MEM_OP_WRITE_VALUE_64 && t != CU_STREAM_MEM_OP_WAIT_VALUE_32 &&
        t != CU_STREAM_MEM_OP_WAIT_VALUE_64 && t != CU_STREAM_MEM_OP_BARRIER && t != CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES)
      return 0;
    if ((t == CU_STREAM_MEM_OP_WRITE_VALUE_32 || t == CU_STREAM_MEM_OP_WAIT_VALUE_32 || t == CU_STREAM_MEM_OP_WRITE_VALUE_64 ||
         t == CU_STREAM_MEM_OP_WAIT_VALUE_64) && !v[i].writeValue.address)
      return 0;
  }
  return 1;
}
CUresult cpu_batch_copy(const CUstreamBatchMemOpParams *v, unsigned n, CUstreamBatchMemOpParams **out) {
  *out = NULL;
  if ((n && !v) || !batch_ok(v, n)) return CUDA_ERROR_INVALID_VALUE;
  if (n && !(*out = malloc(n * sizeof *v))) return CUDA_ERROR_OUT_OF_MEMORY;
  if (n) memcpy(*out, v, n * sizeof *v);
  return CUDA_SUCCESS;
}
static CUresult c_StreamBatchMemOp(CUstream s, unsigned n, CUstreamBatchMemOpParams *v, unsigned f) {
  (void)f;
  cpu_op *op = new_op(cpu_run_batch);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = cpu_batch_copy(v, n, &op->u.batch.v);
  if (r) { free(op); return r; }
  op->u.batch.n = n;
  return cpu_enqueue(s, op);
}

/* ---- modules: a kernel library's bytes, loaded from an anonymous file ---- */
static CUresult c_ModuleLoadData(CUmodule *m, const void *image) {
  const unsigned char *e = image;
  if (!e || memcmp(e, ELFMAG, SELFMAG) != 0) return CUDA_ERROR_INVALID_IMAGE;
  /* a GPU's cubin (cuda.compile with an arch): a GPU would say the same of another one's */
  if (((const Elf64_Ehdr *)e)->e_machine == 190 /* EM_CUDA */) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  /* the library's size: the end of its section headers, which come last */
  const Elf64_Ehdr *h = image;
  size_t n = h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
  int fd = memfd_create("cudalua-cpu-kernels", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, e + off, n - off);
    if (w <= 0) { close(fd); return CUDA_ERROR_OUT_OF_MEMORY; }
    off += (size_t)w;
  }
  char path[64];
  /* (by the process's number, not "self": a debugger or addr2line reads the same path) */
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)getpid(), fd);
  /* the file stays open while the library is loaded: dlopen takes a path it has loaded before
     for that library, and a closed descriptor's number (so its path) comes back */
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) { close(fd); return CUDA_ERROR_INVALID_IMAGE; }
  cpu_module *mod = calloc(1, sizeof *mod);
  void (*bind)(const cl_cpu_rt *) = (void (*)(const cl_cpu_rt *))dlsym(lib, "__cudalua_cpu_bind");
  const int *bounds = dlsym(lib, "__cudalua_cpu_max_threads");   /* __launch_bounds__, per kernel */
  const int *abi = dlsym(lib, "__cudalua_cpu_abi");
  if (mod) {
    mod->lib = lib, mod->fd = fd;
    mod->entries = dlsym(lib, "__cudalua_cpu_entries");
    mod->run = (void (*)(const cl_cpu_entry *, cl_cpu_thread *, void **))dlsym(lib, "__cudalua_cpu_run");
  }
  if (!mod || !bind || !abi || *abi != CL_CPU_ABI || !mod->entries || !mod->run) { free(mod); dlclose(lib); close(fd); return mod ? CUDA_ERROR_INVALID_IMAGE : CUDA_ERROR_OUT_OF_MEMORY; }
  /* a function record per kernel, the module's (freed with it) */
  int nk = 0;
  while (mod->entries[nk].fn) nk++;
  mod->funcs = calloc((size_t)nk + 1, sizeof *mod->funcs);
  if (!mod->funcs) { free(mod); dlclose(lib); close(fd); return CUDA_ERROR_OUT_OF_MEMORY; }
  for (int i = 0; i < nk; i++) mod->funcs[i] = (cpu_func){mod, &mod->entries[i], 48 * 1024, -1, bounds && bounds[i] > 0 && bounds[i] < 1024 ? bounds[i] : 1024};
  mod->nfuncs = nk;
  bind(&cpu_rt);
  *m = (CUmodule)mod;
  return CUDA_SUCCESS;
}
static CUresult c_ModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
  (void)n; (void)o; (void)v;
  return c_ModuleLoadData(m, image);
}
static CUresult c_ModuleUnload(CUmodule m) {
  cpu_module *mod = (cpu_module *)m;
  drain();
  dlclose(mod->lib);
  close(mod->fd);
  free(mod->funcs);
  free(mod);
  return CUDA_SUCCESS;
}

/* a kernel: its entry's symbol has the name cudalua asks (plain or mangled). Not dlsym: it
   looks in the libraries under the kernel library too, and a kernel named like a C library
   function (step, index) would be that function */
static CUresult c_ModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  cpu_module *mod = (cpu_module *)m;
  for (int i = 0; name && i < mod->nfuncs; i++) {
    Dl_info info;
    if (dladdr(mod->entries[i].fn, &info) && info.dli_sname && !strcmp(info.dli_sname, name)) {
      *f = (CUfunction)&mod->funcs[i];
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
static CUresult c_ModuleGetGlobal(CUdeviceptr *p, size_t *n, CUmodule m, const char *name) {
  cpu_module *mod = (cpu_module *)m;
  void *v = dlsym(mod->lib, name);
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (!v || !dladdr1(v, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym) return CUDA_ERROR_NOT_FOUND;
  if (p) *p = (CUdeviceptr)(uintptr_t)v;
  if (n) *n = sym->st_size;
  return CUDA_SUCCESS;
}
static CUresult c_FuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  cpu_func *cf = (cpu_func *)f;
  if (a == CL_CPU_FUNC_THREADS) {
    *v = !cf->e->sync ? CL_CPU_RUN_LOOP : cpu_runs_co(cf->e) ? CL_CPU_RUN_COROUTINES : CL_CPU_RUN_FIBERS;
    return CUDA_SUCCESS;
  }
  switch (a) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = cf->max_threads; break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 1; break;   /* (none as such: the host's registers) */
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = cf->max_dyn; break;
  case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *v = cf->carveout; break;
  default: *v = 0;
  }
  return CUDA_SUCCESS;
}
static CUresult c_FuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (v < 0 || v > 227 * 1024) return CUDA_ERROR_INVALID_VALUE;   /* the opt-in limit it reports */
    ((cpu_func *)f)->max_dyn = v;
  }
  if (a == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT) {   /* kept, as it means nothing here */
    if (v < -1 || v > 100) return CUDA_ERROR_INVALID_VALUE;
    ((cpu_func *)f)->carveout = v;
  }
  return CUDA_SUCCESS;
}
static CUresult c_FuncSetCacheConfig(CUfunction f, CUfunc_cache c) { (void)f; (void)c; return CUDA_SUCCESS; }

/* parameters laid out as a GPU's: each at the next multiple of its alignment */
static CUresult c_FuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
  const cl_cpu_entry *e = ((cpu_func *)f)->e;
  if (i >= (size_t)e->nparams) return CUDA_ERROR_INVALID_VALUE;
  size_t o = 0;
  for (size_t k = 0; k <= i; k++) {
    size_t al = e->align[k] ? e->align[k] : 1;
    o = (o + al - 1) / al * al;
    if (k < i) o += e->size[k];
  }
  if (off) *off = o;
  if (size) *size = e->size[i];
  return CUDA_SUCCESS;
}
static CUresult c_ModuleGetFunctionCount(unsigned *n, CUmodule m) {
  unsigned c = 0;
  for (const cl_cpu_entry *e = ((cpu_module *)m)->entries; e->fn; e++) c++;
  *n = c;
  return CUDA_SUCCESS;
}
static CUresult c_ModuleEnumerateFunctions(CUfunction *fs, unsigned n, CUmodule m) {
  cpu_module *mod = (cpu_module *)m;
  for (unsigned i = 0; i < n && (int)i < mod->nfuncs; i++) fs[i] = (CUfunction)&mod->funcs[i];
  return CUDA_SUCCESS;
}
static CUresult c_FuncGetName(const char **name, CUfunction f) {
  Dl_info info;
  if (!dladdr(((cpu_func *)f)->e->fn, &info) || !info.dli_sname) return CUDA_ERROR_NOT_FOUND;
  *name = info.dli_sname;
  return CUDA_SUCCESS;
}

/* ---- launches: the arguments copied now, as the driver does ---- */
void cpu_run_launch(cpu_op *op) {
  cpu_launch_run(op->u.launch.l);
  free(op->u.launch.l);
}
/* a launch's record, its arguments copied (a stream's op or a graph's kernel node) */
cpu_launch *cpu_launch_new(cpu_func *cf, cl_cpu_dim g, cl_cpu_dim b, size_t shared, void **params, CUresult *r) {
  *r = CUDA_ERROR_INVALID_VALUE;
  if (!cf || (!params && cf->e->nparams)) return NULL;
  const cl_cpu_entry *e = cf->e;
  /* the limits the device reports: block 1024 threads (or the kernel's __launch_bounds__), grid
     2^31-1 x 65535 x 65535 */
  if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z || (size_t)b.x * b.y * b.z > (size_t)cf->max_threads || b.z > 64 ||
      g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    return NULL;
  if (shared > (size_t)cf->max_dyn) return NULL;
  size_t total = 0;
  for (int i = 0; i < e->nparams; i++) total += (e->size[i] + 15u) / 16 * 16;
  size_t size = sizeof(cpu_launch) + (size_t)e->nparams * sizeof(void *) + total + 16;
  cpu_launch *l = calloc(1, size);
  *r = l ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (!l) return NULL;
  l->f = cf, l->grid = g, l->block = b, l->shared = shared, l->size = size;
  l->args = (void **)(l + 1);
  unsigned char *v = (unsigned char *)(l->args + e->nparams);
  v = (unsigned char *)(((uintptr_t)v + 15) / 16 * 16);
  for (int i = 0; i < e->nparams; i++) {
    memcpy(v, params[i], e->size[i]);
    l->args[i] = v;
    v += (e->size[i] + 15u) / 16 * 16;
  }
  return l;
}
static CUresult launch(cpu_func *cf, cl_cpu_dim g, cl_cpu_dim b, size_t shared, CUstream s, void **params) {
  CUresult r;
  cpu_launch *l = cpu_launch_new(cf, g, b, shared, params, &r);
  if (!l) return r;
  cpu_op *op = new_op(cpu_run_launch);
  if (!op) { free(l); return CUDA_ERROR_OUT_OF_MEMORY; }
  op->u.launch.l = l;
  return cpu_enqueue(s, op);
}
static CUresult c_LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shared, CUstream s, void **params, void **extra) {
  if (extra) return CUDA_ERROR_NOT_SUPPORTED;
  return launch((cpu_func *)f, (cl_cpu_dim){gx, gy, gz}, (cl_cpu_dim){bx, by, bz}, shared, s, params);
}
static CUresult c_LaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  if (extra) return CUDA_ERROR_NOT_SUPPORTED;
  for (unsigned i = 0; i < c->numAttrs; i++)
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION || c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
      return CUDA_ERROR_NOT_SUPPORTED;
  return launch((cpu_func *)f, (cl_cpu_dim){c->gridDimX, c->gridDimY, c->gridDimZ},
                (cl_cpu_dim){c->blockDimX, c->blockDimY, c->blockDimZ}, c->sharedMemBytes, c->hStream, params);
}
static CUresult c_OccupancyMaxPotentialBlockSize(int *grid, int *block, CUfunction f, CUoccupancyB2DSize fn, size_t dyn, int limit) {
  (void)fn; (void)dyn;
  int most = ((cpu_func *)f)->max_threads;
  if (limit > 0 && limit < most) most = limit;
  *block = most < 256 ? most : 256;
  *grid = cpu_threads() * 8;
  return CUDA_SUCCESS;
}
static CUresult c_OccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block, size_t dyn) {
  (void)f; (void)dyn;
  *n = block > 0 ? 2048 / block : 0;
  return CUDA_SUCCESS;
}
static CUresult c_CanAccessPeer(int *can, CUdevice a, CUdevice b) { (void)a; (void)b; *can = 0; return CUDA_SUCCESS; }

/* what the CPU device does not do: every such entry point answers this (called through a
   pointer of the entry point's type: the arguments are not read) */
static CUresult unsupported(void) { return CUDA_ERROR_NOT_SUPPORTED; }
static CUresult profiler_noop(void) { return CUDA_SUCCESS; }

/* ---- the entry points by the names the loader asks for (cuda.h's: cuMemAlloc_v2, ...) ---- */
static const struct { const char *name; void *fn; } impls[] = {
  IMPL(cuInit, c_Init), IMPL(cuDriverGetVersion, c_DriverGetVersion), IMPL(cuGetErrorName, c_GetErrorName),
  IMPL(cuGetErrorString, c_GetErrorString), IMPL(cuDeviceGet, c_DeviceGet), IMPL(cuDeviceGetCount, c_DeviceGetCount),
  IMPL(cuDeviceGetName, c_DeviceGetName), IMPL(cuDeviceGetAttribute, c_DeviceGetAttribute),
  IMPL(cuDeviceTotalMem, c_DeviceTotalMem), IMPL(cuDevicePrimaryCtxRetain, c_PrimaryCtxRetain),
  IMPL(cuDevicePrimaryCtxRelease, c_PrimaryCtxRelease), IMPL(cuCtxSetCurrent, c_CtxSetCurrent),
  IMPL(cuCtxGetCurrent, c_CtxGetCurrent), IMPL(cuCtxSynchronize, c_CtxSynchronize), IMPL(cuCtxGetDevice, c_CtxGetDevice),
  IMPL(cuMemGetInfo, c_MemGetInfo), IMPL(cuMemAlloc, c_MemAlloc), IMPL(cuMemFree, c_MemFree),
 IMPL(cuMemFreeAsync, c_MemFreeAsync),
  IMPL(cuDeviceGetDefaultMemPool, c_DeviceGetDefaultMemPool), IMPL(cuMemPoolSetAttribute, c_MemPoolSetAttribute),
  IMPL(cuMemPoolGetAttribute, c_MemPoolGetAttribute),
  IMPL(cuMemPoolTrimTo, c_MemPoolTrimTo), IMPL(cuMemHostAlloc, c_MemHostAlloc), IMPL(cuMemFreeHost, c_MemFreeHost),
  IMPL(cuMemHostGetDevicePointer, c_MemHostGetDevicePointer), IMPL(cuMemAllocManaged, c_MemAllocManaged),
  IMPL(cuMemHostRegister, c_MemHostRegister), IMPL(cuMemHostUnregister, c_MemHostUnregister),
  IMPL(cuMemAdvise, c_MemAdvise), IMPL(cuPointerGetAttribute, c_PointerGetAttribute),
  IMPL(cuMemcpyAsync, c_MemcpyAsync), IMPL(cuMemcpyHtoDAsync, c_MemcpyHtoDAsync),
  IMPL(cuMemcpyDtoHAsync, c_MemcpyDtoHAsync), IMPL(cuMemcpyDtoDAsync, c_MemcpyDtoDAsync),
  IMPL(cuMemcpyHtoD, c_MemcpyHtoD), IMPL(cuMemcpy2DAsync, c_Memcpy2DAsync), IMPL(cuMemcpy3DAsync, c_Memcpy3DAsync), IMPL(cuMemcpyDtoH, c_MemcpyDtoH), IMPL(cuMemsetD8Async, c_MemsetD8Async),
  IMPL(cuMemsetD16Async, c_MemsetD16Async), IMPL(cuMemsetD32Async, c_MemsetD32Async),
  IMPL(cuMemsetD2D32Async, c_MemsetD2D32Async), IMPL(cuStreamCreate, c_StreamCreate),
  IMPL(cuStreamSynchronize, c_StreamSynchronize),
  IMPL(cuStreamQuery, c_StreamQuery), IMPL(cuEventCreate, c_EventCreate),
  IMPL(cuEventDestroy, c_EventDestroy), IMPL(cuEventQuery, c_EventQuery),
  IMPL(cuEventSynchronize, c_EventSynchronize), IMPL(cuEventElapsedTime, c_EventElapsedTime),
  IMPL(cuModuleLoadData, c_ModuleLoadData), IMPL(cuModuleUnload, c_ModuleUnload),
  IMPL(cuModuleGetFunction, c_ModuleGetFunction), IMPL(cuFuncGetAttribute, c_FuncGetAttribute),
  IMPL(cuModuleGetGlobal, c_ModuleGetGlobal), IMPL(cuLaunchKernel, c_LaunchKernel),
  IMPL(cuOccupancyMaxPotentialBlockSize, c_OccupancyMaxPotentialBlockSize),
  IMPL(cuFuncSetAttribute, c_FuncSetAttribute), IMPL(cuFuncSetCacheConfig, c_FuncSetCacheConfig),
  IMPL(cuLaunchKernelEx, c_LaunchKernelEx), IMPL(cuModuleLoadDataEx, c_ModuleLoadDataEx),
  IMPL(cuOccupancyMaxActiveBlocksPerMultiprocessor, c_OccupancyMaxActiveBlocksPerMultiprocessor),
  IMPL(cuLaunchHostFunc, c_LaunchHostFunc), IMPL(cuStreamBatchMemOp, c_StreamBatchMemOp),
  IMPL(cuDeviceCanAccessPeer, c_CanAccessPeer), IMPL(cuMemGetAddressRange, c_MemGetAddressRange),
  IMPL(cuStreamCreateWithPriority, c_StreamCreateWithPriority),
  IMPL(cuStreamGetPriority, c_StreamGetPriority), IMPL(cuCtxGetStreamPriorityRange, c_CtxGetStreamPriorityRange),
  IMPL(cuCtxSetLimit, c_CtxSetLimit),
  IMPL(cuCtxGetLimit, c_CtxGetLimit), IMPL(cuFuncGetParamInfo, c_FuncGetParamInfo),
  IMPL(cuModuleGetFunctionCount, c_ModuleGetFunctionCount), IMPL(cuModuleEnumerateFunctions, c_ModuleEnumerateFunctions),
  IMPL(cuFuncGetName, c_FuncGetName),
};

/* CUDALUA_DEVICE=cpu or cuda.use_cpu chooses the CPU device (read once, when the driver is
   first loaded); cl_cpu_symbol (cpu_graph.c) asks here after its own entry points */
static int chosen;
void cl_cpu_choose(void) { __atomic_store_n(&chosen, 1, __ATOMIC_RELEASE); }

void *cpu_driver_symbol(const char *name) {
  if (!name) {
    const char *d = getenv("CUDALUA_DEVICE");
    return __atomic_load_n(&chosen, __ATOMIC_ACQUIRE) || (d && !strcmp(d, "cpu")) ? (void *)impls : NULL;
  }
  for (size_t i = 0; i < sizeof impls / sizeof impls[0]; i++)
    if (!strcmp(impls[i].name, name)) return impls[i].fn;
  /* no profiler attaches to the CPU device: starting and stopping it do nothing, as the
     driver's do when no profiler is attached */
  if (!strcmp(name, "cuProfilerStart") || !strcmp(name, "cuProfilerStop")) return (void *)profiler_noop;
  return !strncmp(name, "cu", 2) ? (void *)unsupported : NULL;
}
