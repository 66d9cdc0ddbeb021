/* raw.c: the baseline for bench/core.lua. The same five measurements made straight on the CUDA
   driver API and NVRTC, with the same kernels, sizes and method, so that the ratio
   cudalua / raw is what the binding costs. Prints one "key value" line per measurement.

   Build: gcc -O2 -I$CUDA_DIR/include raw.c -L$CUDA_DIR/lib64 -lcuda -lnvrtc -o raw
   Env:   BENCH_LAUNCHES (default 100000), BENCH_REPS (default 5) */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <cuda.h>
#include <nvrtc.h>
#define PROG "raw"
#include "raw_common.h"

/* keep these two sources identical to the ones in bench/core.lua */
static const char *KSRC =
  "extern \"C\" __global__ void empty() {}\n"
  "extern \"C\" __global__ void four(float *a, const float *b, int n, double s) {}\n";
static const char *VECADD =
  "extern \"C\" __global__ void vecadd(float *z, const float *x, const float *y, int n) {\n"
  "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
  "  if (i < n) z[i] = x[i] + y[i];\n"
  "}\n";

#define COPY_BYTES ((size_t)256 << 20)
#define ALLOC_BYTES ((size_t)1 << 20)


int main(void) {
  int N = envint("BENCH_LAUNCHES", 100000), REPS = envint("BENCH_REPS", 5);
  double t[64], e[64];
  if (REPS > 64) REPS = 64;

  /* the device's primary context and its default pool, kept as cudalua keeps them */
  char arch[16];
  CUdevice dev = init_device(arch);
  CUmemoryPool pool;
  CK(cuDeviceGetDefaultMemPool(&pool, dev));
  cuuint64_t thr = UINT64_MAX;
  CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
  int drv;
  CK(cuDriverGetVersion(&drv));
  int nvma, nvmi;
  NK(nvrtcVersion(&nvma, &nvmi));
  char name[256];
  CK(cuDeviceGetName(name, sizeof name, dev));
  printf("info_device %s (%s), driver %d, NVRTC %d.%d\n", name, arch, drv, nvma, nvmi);

  /* 1, 2: back-to-back launches on one stream (the legacy stream, as cudalua's k[{1, 1}]) */
  size_t isz;
  char *img = compile(KSRC, arch, &isz);
  CUmodule mod;
  CUfunction fempty, ffour;
  CK(cuModuleLoadData(&mod, img));
  CK(cuModuleGetFunction(&fempty, mod, "empty"));
  CK(cuModuleGetFunction(&ffour, mod, "four"));
  CUdeviceptr da, db;
  CK(cuMemAlloc(&da, 1024 * sizeof(float)));
  CK(cuMemAlloc(&db, 1024 * sizeof(float)));
  int n = 1024;
  double s = 2.5;
  void *args4[] = {&da, &db, &n, &s};
  struct { const char *key, *ekey; CUfunction f; void **args; } lk[] = {
    {"launch_empty_us", "diag_launch_empty_enqueue_us", fempty, NULL},
    {"launch_four_us", "diag_launch_four_enqueue_us", ffour, args4}};
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 1000; i++)
      CK(cuLaunchKernel(lk[k].f, 1, 1, 1, 1, 1, 1, 0, NULL, lk[k].args, NULL));
    CK(cuCtxSynchronize());
    for (int r = 0; r < REPS; r++) {
      double t0 = now();
      for (int i = 0; i < N; i++)
        CK(cuLaunchKernel(lk[k].f, 1, 1, 1, 1, 1, 1, 0, NULL, lk[k].args, NULL));
      double t1 = now();
      CK(cuCtxSynchronize());
      double t2 = now();
      t[r] = (t2 - t0) / N * 1e6;
      e[r] = (t1 - t0) / N * 1e6;
    }
    out(lk[k].key, median(t, REPS));
    out(lk[k].ekey, median(e, REPS));
  }

  /* 3: 256 MiB copies, each finished before the clock stops */
  CUdeviceptr dbig;
  CK(cuMemAlloc(&dbig, COPY_BYTES));
  void *pinned, *pageable = malloc(COPY_BYTES);
  CK(cuMemHostAlloc(&pinned, COPY_BYTES, 0));
  memset(pinned, 1, COPY_BYTES);
  memset(pageable, 1, COPY_BYTES);
  struct { const char *key; void *h; int h2d; } cp[] = {
    {"h2d_pinned_gbs", pinned, 1}, {"d2h_pinned_gbs", pinned, 0},
    {"h2d_pageable_gbs", pageable, 1}, {"d2h_pageable_gbs", pageable, 0}};
  for (int k = 0; k < 4; k++) {
    for (int r = -1; r < REPS; r++) {   /* r = -1: warm-up */
      double t0 = now();
      if (cp[k].h2d) CK(cuMemcpyHtoD(dbig, cp[k].h, COPY_BYTES));
      else CK(cuMemcpyDtoH(cp[k].h, dbig, COPY_BYTES));
      CK(cuCtxSynchronize());
      if (r >= 0) t[r] = COPY_BYTES / (now() - t0) / 1e9;
    }
    out(cp[k].key, median(t, REPS));
  }
  /* what page-locking 256 MiB costs: cudalua pays it on a large pageable array's first copy
     (diagnostics only: a failure here is reported, not fatal) */
  {
    double t0 = now();
    if (cuMemHostRegister(pageable, COPY_BYTES, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
      out("diag_register_malloc_256MiB_ms", (now() - t0) * 1e3);
      cuMemHostUnregister(pageable);
    } else printf("# raw: cuMemHostRegister of malloc'd memory failed\n");
    void *p = mmap(NULL, COPY_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      madvise(p, COPY_BYTES, MADV_HUGEPAGE);   /* as cudalua allocates large host arrays */
      memset(p, 1, COPY_BYTES);
      t0 = now();
      if (cuMemHostRegister(p, COPY_BYTES, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
        out("diag_register_hugepage_256MiB_ms", (now() - t0) * 1e3);
        t0 = now();
        cuMemHostUnregister(p);
        out("diag_unregister_hugepage_256MiB_ms", (now() - t0) * 1e3);
      } else printf("# raw: cuMemHostRegister of mmapped memory failed\n");
      munmap(p, COPY_BYTES);
    }
  }
  CK(cuMemFreeHost(pinned));
  free(pageable);
  CK(cuMemFree(dbig));

  /* 4: stream-ordered alloc + free of 1 MiB from the default pool */
  for (int r = -1; r < REPS; r++) {
    int m = r < 0 ? 1000 : N;
    double t0 = now();
    for (int i = 0; i < m; i++) {
      CUdeviceptr p;
      CK(cuMemAllocAsync(&p, ALLOC_BYTES, NULL));
      CK(cuMemFreeAsync(p, NULL));
    }
    CK(cuCtxSynchronize());
    if (r >= 0) t[r] = (now() - t0) / m * 1e6;
  }
  out("alloc_free_us", median(t, REPS));

  /* 5: cold NVRTC compiles, a source no cache has seen each time */
  size_t len = strlen(VECADD) + 64;
  char *src = malloc(len);
  for (int r = -1; r < REPS; r++) {   /* r = -1: warm-up (loads NVRTC's builtins) */
    snprintf(src, len, "%s\n// bench %d %ld\n", VECADD, r, (long)time(NULL));
    double t0 = now();
    size_t sz;
    free(compile(src, "sm_90", &sz));
    if (r >= 0) t[r] = (now() - t0) * 1e3;
  }
  out("compile_ms", median(t, REPS));
  free(src);
  free(img);
  CK(cuModuleUnload(mod));
  CK(cuMemFree(da));
  CK(cuMemFree(db));
  return 0;
}
