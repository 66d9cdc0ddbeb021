/* bench/cold_start.c: what bench/cuda_cpp.lua's "cold start" row compares cudalua with: a new
   process that makes the context, loads a cubin from a file (what a disk cache hit gives
   cudalua), launches cold_fill(x, 7) on 32 threads and reads the result back.
   With "async", the array comes from cuMemAllocAsync (the stream-ordered pool, as cudalua's
   device arrays do): the pool's first allocation in a process costs the driver about 11 ms on
   the H100 machine, cuMemAlloc's 0.1 ms.
   cold_start CUBIN_PATH [async] -> prints "ok" (exit 0) or what failed (exit 1) */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("%s: %d\n", #x, (int)r_); return 1; } } while (0)

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) { fprintf(stderr, "usage: cold_start CUBIN [async]\n"); return 2; }
  int async = argc == 3 && strcmp(argv[2], "async") == 0;
  FILE *f = fopen(argv[1], "rb");
  if (!f) { printf("cannot open %s\n", argv[1]); return 1; }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *img = malloc((size_t)n);
  if (!img || fread(img, 1, (size_t)n, f) != (size_t)n) { printf("cannot read %s\n", argv[1]); return 1; }
  fclose(f);
  CUdevice dev;
  CUcontext ctx;
  CUmodule mod;
  CUfunction fn;
  CUdeviceptr x;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuModuleLoadData(&mod, img));
  CK(cuModuleGetFunction(&fn, mod, "cold_fill"));
  if (async) CK(cuMemAllocAsync(&x, 32 * sizeof(int), NULL));
  else CK(cuMemAlloc(&x, 32 * sizeof(int)));
  int v = 7;
  void *args[] = {&x, &v};
  CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
  int h[32];
  CK(cuMemcpyDtoH(h, x, sizeof h));
  if (h[31] != 7) { printf("wrong: %d\n", h[31]); return 1; }
  printf("ok\n");
  return 0;
}
