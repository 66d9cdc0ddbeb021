/* raw_helpers.c: the raw CUDA C baselines for bench/helpers.lua (cudalua's reduce, forall and
   graphs), straight on the driver API and NVRTC. Prints one "key value" line per measurement;
   keys starting with diag_ are pieces timed apart.
     * reduce of 2^28 float32: a single-pass sum (grid-stride float4 loads, warp shuffles, one
       atomicAdd per warp) after a 4-byte memset, then a 4-byte copy back to the host;
     * reduce of 1234 float64: one block, then an 8-byte copy back;
     * the plain launch of the kernel bench/helpers.lua launches with forall, same grid and block;
     * a chain of 1000 empty kernels: launched one by one, built as a graph and instantiated
       (cuGraphAddKernelNode x1000 + cuGraphInstantiate), replayed (cuGraphLaunch);
     * host functions: cuLaunchHostFunc + cuStreamSynchronize one at a time, 100 then one sync,
       and a graph of HCHAIN host nodes in a chain (cuGraphAddHostNode) replayed;
     * a WHILE conditional node looping a small kernel WLOOP times in one launch (a body of
       one kernel, then of four), and the host loop that reads a flag back each iteration.
   Build: gcc -O2 -I$CUDA_DIR/include raw_helpers.c -L$CUDA_DIR/lib64 -lcuda -lnvrtc -lm
   Env:   BENCH_LAUNCHES (default 100000), BENCH_REPS (default 5)
   raw_helpers --compile-only: only compiles the kernels with NVRTC (sm_90), no GPU needed */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda.h>
#include <nvrtc.h>
#define PROG "raw_helpers"
#include "raw_common.h"

/* keep "empty" and "bump" identical to bench/helpers.lua */
static const char *KSRC =
  "extern \"C\" __global__ void empty() {}\n"
  "extern \"C\" __global__ void bump(float *x, int n) {\n"
  "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
  "  if (i < n) x[i] += 1.0f;\n"
  "}\n"
  /* section 10's loop body (bench/helpers.lua's): NVRTC does not declare the setter */
  "extern \"C\" __device__ __cudart_builtin__ void CUDARTAPI cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);\n"
  "extern \"C\" __global__ void tick(float *x, int *count, int limit, cudaGraphConditionalHandle c) {\n"
  "  x[threadIdx.x] += 1.0f;\n"
  "  if (threadIdx.x == 0 && ++*count >= limit) cudaGraphSetConditional(c, 0);\n"
  "}\n"
  /* the unrolled body's kernel: one iteration unless the loop is done (the body's later
     kernels after the last iteration do nothing) */
  "extern \"C\" __global__ void tick_n(float *x, int *count, int limit, cudaGraphConditionalHandle c) {\n"
  "  int n = *count;\n"
  "  __syncthreads();\n"
  "  if (n >= limit) return;\n"
  "  x[threadIdx.x] += 1.0f;\n"
  "  if (threadIdx.x == 0 && (*count = n + 1) >= limit) cudaGraphSetConditional(c, 0);\n"
  "}\n"
  "extern \"C\" __global__ void tick_flag(float *x, int *count, int limit, int *done) {\n"
  "  x[threadIdx.x] += 1.0f;\n"
  "  if (threadIdx.x == 0 && ++*count >= limit) *done = 1;\n"
  "}\n"
  "extern \"C\" __global__ void sum_f32(const float *x, long long n, float *out) {\n"
  "  const float4 *x4 = reinterpret_cast<const float4 *>(x);\n"
  "  long long n4 = n >> 2, stride = (long long)gridDim.x * blockDim.x;\n"
  "  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
  "  float s = 0.0f;\n"
  "  for (long long j = i; j < n4; j += stride) { float4 v = x4[j]; s += (v.x + v.y) + (v.z + v.w); }\n"
  "  for (long long j = (n4 << 2) + i; j < n; j += stride) s += x[j];\n"
  "  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);\n"
  "  if ((threadIdx.x & 31) == 0) atomicAdd(out, s);\n"
  "}\n"
  "extern \"C\" __global__ void sum_f64_block(const double *x, int n, double *out) {\n"
  "  __shared__ double w[32];\n"
  "  double s = 0.0;\n"
  "  for (int j = threadIdx.x; j < n; j += blockDim.x) s += x[j];\n"
  "  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);\n"
  "  if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = s;\n"
  "  __syncthreads();\n"
  "  if (threadIdx.x < 32) {\n"
  "    s = threadIdx.x < (blockDim.x >> 5) ? w[threadIdx.x] : 0.0;\n"
  "    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);\n"
  "    if (threadIdx.x == 0) *out = s;\n"
  "  }\n"
  "}\n";

/* section 11's texture fetch (keep identical to bench/helpers.lua's TEXSRC) */
static const char *TEXSRC =
  "extern \"C\" __global__ void tex_copy(float *out, cudaTextureObject_t t, int w, int h) {\n"
  "  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;\n"
  "  if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);\n"
  "}\n";
#define TEX_W 4096                   /* section 11: a TEX_W x TEX_W float32 texture */
#define TEX_K 50                     /* its fetch kernel launches between two events */
#define TEX_M 10000                  /* texture objects made and destroyed per repetition */

#define BIG_N ((long long)1 << 28)   /* float32 elements: 1 GiB */
#define SMALL_N 1234                 /* float64 elements */
#define FORALL_N (1 << 16)
#define CHAIN 1000
#define HCHAIN 1000                  /* host nodes in section 9's graph */
#define WLOOP 1000                   /* iterations of section 10's WHILE node */


/* fills n float32 (or float64) elements at d with 1 */
static void fill_ones(CUdeviceptr d, size_t n, int f64) {
  if (!f64) { float one = 1.0f; uint32_t u; memcpy(&u, &one, 4); CK(cuMemsetD32(d, u, n)); return; }
  double one = 1.0;
  uint32_t w[2];
  memcpy(w, &one, 8);
  CK(cuMemsetD2D32(d, 8, w[0], 1, n));
  CK(cuMemsetD2D32(d + 4, 8, w[1], 1, n));
}

/* the host function of section 9: what a Lua one does at the least, a counter bumped */
static volatile long host_calls;
static void CUDA_CB host_bump(void *arg) { (void)arg; host_calls++; }

static CUgraph build_chain(CUfunction f) {
  CUgraph g;
  CK(cuGraphCreate(&g, 0));
  CUDA_KERNEL_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.func = f;
  p.gridDimX = p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = p.blockDimY = p.blockDimZ = 1;
  CUgraphNode prev = NULL, node;
  for (int i = 0; i < CHAIN; i++) {
    CK(cuGraphAddKernelNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p));
    prev = node;
  }
  return g;
}

/* section 10's WHILE graph: a memset of the counter, then a WHILE node whose body is unroll
   launches of fn in a chain; the median ms of reps (<= 64) launches and synchronizes */
static double time_while(CUmodule mod, const char *fn, int unroll, CUdeviceptr dx, CUdeviceptr dcount, int reps) {
  double t[64];
  CUfunction f;
  CK(cuModuleGetFunction(&f, mod, fn));
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  CUgraph g;
  CK(cuGraphCreate(&g, 0));
  CUgraphConditionalHandle h;
  CK(cuGraphConditionalHandleCreate(&h, g, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
  CUDA_MEMSET_NODE_PARAMS ms;
  memset(&ms, 0, sizeof ms);
  ms.dst = dcount; ms.elementSize = 4; ms.width = 1; ms.height = 1;
  CUgraphNode zero, loop, kn = NULL;
  CK(cuGraphAddMemsetNode(&zero, g, NULL, 0, &ms, ctx));
  CUgraphNodeParams cp;
  memset(&cp, 0, sizeof cp);
  cp.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  cp.conditional.handle = h; cp.conditional.type = CU_GRAPH_COND_TYPE_WHILE;
  cp.conditional.size = 1; cp.conditional.ctx = ctx;
  CK(cuGraphAddNode(&loop, g, &zero, NULL, 1, &cp));
  int limit = WLOOP;
  void *args[] = {&dx, &dcount, &limit, &h};
  CUDA_KERNEL_NODE_PARAMS kp;
  memset(&kp, 0, sizeof kp);
  kp.func = f;
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 32; kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = args;
  for (int i = 0; i < unroll; i++) {
    CUgraphNode prev = kn;
    CK(cuGraphAddKernelNode(&kn, cp.conditional.phGraph_out[0], prev ? &prev : NULL, prev ? 1 : 0, &kp));
  }
  CUgraphExec x;
  CK(cuGraphInstantiate(&x, g, 0));
  for (int r = -2; r < reps; r++) {
    double t0 = now();
    CK(cuGraphLaunch(x, NULL));
    CK(cuCtxSynchronize());
    if (r >= 0) t[r] = (now() - t0) * 1e3;
  }
  int count = 0;
  CK(cuMemcpyDtoH(&count, dcount, sizeof count));
  if (count != WLOOP) { fprintf(stderr, PROG ": the WHILE loop (%s x %d) ran %d times, not %d\n", fn, unroll, count, WLOOP); exit(1); }
  CK(cuGraphExecDestroy(x));
  CK(cuGraphDestroy(g));
  return median(t, reps);
}

int main(int argc, char **argv) {
  int N = envint("BENCH_LAUNCHES", 100000), REPS = envint("BENCH_REPS", 5);
  double t[512], e[512];
  if (REPS > 64) REPS = 64;
  size_t isz;
  if (argc > 1 && !strcmp(argv[1], "--compile-only")) {
    free(compile(KSRC, "sm_90", &isz));
    free(compile(TEXSRC, "sm_90", &isz));
    printf("compiled %zu bytes\n", isz);
    return 0;
  }

  char arch[16];
  CUdevice dev = init_device(arch);
  int sms;
  CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  char *img = compile(KSRC, arch, &isz);
  CUmodule mod;
  CUfunction fempty, fbump, fsum, fsmall;
  CK(cuModuleLoadData(&mod, img));
  CK(cuModuleGetFunction(&fempty, mod, "empty"));
  CK(cuModuleGetFunction(&fbump, mod, "bump"));
  CK(cuModuleGetFunction(&fsum, mod, "sum_f32"));
  CK(cuModuleGetFunction(&fsmall, mod, "sum_f64_block"));
  CUevent e0, e1;
  CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));

  /* 1: reduce of 2^28 float32, the result on the host */
  {
    CUdeviceptr dx, dout;
    CK(cuMemAlloc(&dx, BIG_N * sizeof(float)));
    CK(cuMemAlloc(&dout, sizeof(float)));
    fill_ones(dx, BIG_N, 0);
    int per_sm = 0;
    CK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fsum, 256, 0));
    unsigned grid = (unsigned)(sms * (per_sm > 0 ? per_sm : 1));
    long long n = BIG_N;
    void *args[] = {&dx, &n, &dout};
    float h = 0;
    for (int r = -2; r < REPS; r++) {   /* r < 0: warm-up */
      double t0 = now();
      CK(cuMemsetD32Async(dout, 0, 1, NULL));
      CK(cuLaunchKernel(fsum, grid, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
      CK(cuMemcpyDtoH(&h, dout, sizeof h));
      if (r >= 0) t[r] = (now() - t0) * 1e6;
    }
    double us = median(t, REPS);
    if (h < 0.99 * BIG_N || h > 1.01 * BIG_N)
      printf("# raw_helpers: sum of 2^28 ones gave %.1f\n", h);
    out("reduce_f32_call_us", us);
    out("reduce_f32_gbs", BIG_N * 4.0 / (us * 1e-6) / 1e9);
    /* kernel only: K back-to-back (memset + kernel) between two events */
    const int K = 20;
    for (int r = 0; r < REPS; r++) {
      CK(cuEventRecord(e0, NULL));
      for (int k = 0; k < K; k++) {
        CK(cuMemsetD32Async(dout, 0, 1, NULL));
        CK(cuLaunchKernel(fsum, grid, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
      }
      CK(cuEventRecord(e1, NULL));
      CK(cuEventSynchronize(e1));
      float ms;
      CK(cuEventElapsedTime(&ms, e0, e1));
      t[r] = ms * 1e3 / K;
    }
    us = median(t, REPS);
    out("reduce_f32_kernel_us", us);
    out("reduce_f32_kernel_gbs", BIG_N * 4.0 / (us * 1e-6) / 1e9);
    out("diag_reduce_f32_grid_blocks", grid);
    CK(cuMemFree(dx));
    CK(cuMemFree(dout));
  }

  /* 2: reduce of 1234 float64 returned to the host, per call, median of many */
  {
    CUdeviceptr dx, dout;
    CK(cuMemAlloc(&dx, SMALL_N * sizeof(double)));
    CK(cuMemAlloc(&dout, sizeof(double)));
    fill_ones(dx, SMALL_N, 1);
    int n = SMALL_N;
    void *args[] = {&dx, &n, &dout};
    double h = 0;
    static double tt[5000];
    const int M = 5000;
    for (int i = -500; i < M; i++) {
      double t0 = now();
      CK(cuLaunchKernel(fsmall, 1, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
      CK(cuMemcpyDtoH(&h, dout, sizeof h));
      if (i >= 0) tt[i] = (now() - t0) * 1e6;
    }
    if (h != SMALL_N) printf("# raw_helpers: sum of 1234 ones gave %g\n", h);
    out("reduce_small_us", median(tt, M));
    CK(cuMemFree(dx));
    CK(cuMemFree(dout));
  }

  /* 3: the plain launch of bump with the block size the occupancy calculator picks (forall's) */
  {
    CUdeviceptr dx;
    CK(cuMemAlloc(&dx, FORALL_N * sizeof(float)));
    CK(cuMemsetD32(dx, 0, FORALL_N));
    int mg = 0, b = 0, n = FORALL_N;
    CK(cuOccupancyMaxPotentialBlockSize(&mg, &b, fbump, NULL, 0, 0));
    unsigned grid = (unsigned)((FORALL_N + b - 1) / b);
    void *args[] = {&dx, &n};
    for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(fbump, grid, 1, 1, b, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    for (int r = 0; r < REPS; r++) {
      double t0 = now();
      for (int i = 0; i < N; i++) CK(cuLaunchKernel(fbump, grid, 1, 1, b, 1, 1, 0, NULL, args, NULL));
      double t1 = now();
      CK(cuCtxSynchronize());
      t[r] = (now() - t0) / N * 1e6;
      e[r] = (t1 - t0) / N * 1e6;
    }
    out("forall_plain_us", median(t, REPS));
    out("diag_forall_plain_enqueue_us", median(e, REPS));
    out("diag_forall_block", b);
    CK(cuMemFree(dx));
  }

  /* 8: a chain of 1000 empty kernels */
  {
    int R = REPS * 4;
    for (int r = -1; r < R; r++) {
      double t0 = now();
      for (int i = 0; i < CHAIN; i++) CK(cuLaunchKernel(fempty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
      CK(cuCtxSynchronize());
      if (r >= 0) t[r] = (now() - t0) / CHAIN * 1e6;
    }
    out("graph_chain_stream_us", median(t, R));
    double tb[64], ti[64];
    for (int r = -1; r < REPS; r++) {
      double t0 = now();
      CUgraph g = build_chain(fempty);
      double t1 = now();
      CUgraphExec x;
      CK(cuGraphInstantiate(&x, g, 0));
      double t2 = now();
      if (r >= 0) { t[r] = (t2 - t0) * 1e3; tb[r] = (t1 - t0) * 1e3; ti[r] = (t2 - t1) * 1e3; }
      CK(cuGraphExecDestroy(x));
      CK(cuGraphDestroy(g));
    }
    out("graph_build_ms", median(t, REPS));
    out("diag_graph_build_nodes_ms", median(tb, REPS));
    out("diag_graph_instantiate_ms", median(ti, REPS));
    CUgraph g = build_chain(fempty);
    CUgraphExec x;
    CK(cuGraphInstantiate(&x, g, 0));
    for (int r = -2; r < R; r++) {
      double t0 = now();
      CK(cuGraphLaunch(x, NULL));
      CK(cuCtxSynchronize());
      if (r >= 0) t[r] = (now() - t0) / CHAIN * 1e6;
    }
    out("graph_replay_us", median(t, R));
    /* the GPU's time for one replay, between events */
    for (int r = 0; r < REPS; r++) {
      CK(cuEventRecord(e0, NULL));
      CK(cuGraphLaunch(x, NULL));
      CK(cuEventRecord(e1, NULL));
      CK(cuEventSynchronize(e1));
      float ms;
      CK(cuEventElapsedTime(&ms, e0, e1));
      t[r] = ms * 1e3 / CHAIN;
    }
    out("diag_graph_replay_events_us", median(t, REPS));
    CK(cuGraphExecDestroy(x));
    CK(cuGraphDestroy(g));
  }

  /* 10: a WHILE conditional node running a small kernel WLOOP times in one launch, its body
     one kernel, then four (bench/helpers.lua builds the same with cudalua) */
  {
    CUdeviceptr dx, dcount;
    CK(cuMemAlloc(&dx, 32 * sizeof(float)));
    CK(cuMemAlloc(&dcount, sizeof(int)));
    int limit = WLOOP;
    out("graph_while_ms", time_while(mod, "tick", 1, dx, dcount, REPS));
    out("graph_while4_ms", time_while(mod, "tick_n", 4, dx, dcount, REPS));
    /* the host loop of bench/helpers.lua in C: each iteration a launch, the flag read back
       into page-locked memory and a stream synchronize (what the hardware allows a loop with
       a host round trip, beside the WHILE node) */
    CUfunction fflag;
    CK(cuModuleGetFunction(&fflag, mod, "tick_flag"));
    CUstream ls;
    CK(cuStreamCreate(&ls, CU_STREAM_DEFAULT));
    CUdeviceptr dflag;
    CK(cuMemAlloc(&dflag, sizeof(int)));
    int *done;
    CK(cuMemAllocHost((void **)&done, sizeof(int)));
    void *fargs[] = {&dx, &dcount, &limit, &dflag};
    int loops = 0;
    for (int r = -1; r < REPS; r++) {
      CK(cuMemsetD32Async(dcount, 0, 1, ls));
      CK(cuMemsetD32Async(dflag, 0, 1, ls));
      CK(cuStreamSynchronize(ls));
      double t0 = now();
      loops = 0;
      do {
        CK(cuLaunchKernel(fflag, 1, 1, 1, 32, 1, 1, 0, ls, fargs, NULL));
        CK(cuMemcpyDtoHAsync(done, dflag, sizeof(int), ls));
        CK(cuStreamSynchronize(ls));
        loops++;
      } while (!*done);
      if (r >= 0) t[r] = (now() - t0) * 1e3;
    }
    if (loops != WLOOP) { fprintf(stderr, PROG ": the host loop ran %d times, not %d\n", loops, WLOOP); exit(1); }
    out("host_loop_ms", median(t, REPS));
    CK(cuMemFreeHost(done));
    CK(cuMemFree(dflag));
    CK(cuStreamDestroy(ls));
    CK(cuMemFree(dx));
    CK(cuMemFree(dcount));
  }

  /* 9: host functions on a stream of its own (cudalua's Lua ones: bench/helpers.lua) */
  {
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int M = N / 50 > 100 ? N / 50 : 100;
    for (int r = -1; r < REPS; r++) {
      double t0 = now();
      for (int i = 0; i < M; i++) {
        CK(cuLaunchHostFunc(s, host_bump, NULL));
        CK(cuStreamSynchronize(s));
      }
      if (r >= 0) t[r] = (now() - t0) / M * 1e6;
    }
    out("hostfn_roundtrip_us", median(t, REPS));
    for (int r = -1; r < REPS; r++) {
      double t0 = now();
      for (int j = 0; j < M / 100; j++) {
        for (int i = 0; i < 100; i++) CK(cuLaunchHostFunc(s, host_bump, NULL));
        CK(cuStreamSynchronize(s));
      }
      if (r >= 0) t[r] = (now() - t0) / (M / 100 * 100) * 1e6;
    }
    out("hostfn_batch_us", median(t, REPS));
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUDA_HOST_NODE_PARAMS hp = {host_bump, NULL};
    CUgraphNode prev = NULL, node;
    for (int i = 0; i < HCHAIN; i++) {
      CK(cuGraphAddHostNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &hp));
      prev = node;
    }
    CUgraphExec x;
    CK(cuGraphInstantiate(&x, g, 0));
    long before = host_calls;
    for (int r = -2; r < REPS; r++) {
      double t0 = now();
      CK(cuGraphLaunch(x, s));
      CK(cuStreamSynchronize(s));
      if (r >= 0) t[r] = (now() - t0) / HCHAIN * 1e6;
    }
    if (host_calls - before != (long)(REPS + 2) * HCHAIN) fprintf(stderr, PROG ": host nodes ran %ld times\n", host_calls - before);
    out("hostfn_graph_replay_us", median(t, REPS));
    CK(cuGraphExecDestroy(x));
    CK(cuGraphDestroy(g));
    CK(cuStreamDestroy(s));
  }

  /* 11: a module variable found and 64 KiB copied into it from pinned memory, on a stream of
     its own, many times (bench/helpers.lua's "module globals": m:get_global + copy_to_device) */
  {
    const char *GSRC = "__device__ float gbuf[16384];\n"
                       "extern \"C\" __global__ void gread(float *o) { o[0] = gbuf[0]; }\n";
    size_t gsz;
    char *gimg = compile(GSRC, arch, &gsz);
    CUmodule gmod;
    CK(cuModuleLoadData(&gmod, gimg));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *h;
    CK(cuMemHostAlloc(&h, 65536, 0));
    memset(h, 0, 65536);
    int M = N / 10 > 1000 ? N / 10 : 1000;
    for (int r = -1; r < REPS; r++) {
      double t0 = now();
      for (int i = 0; i < M; i++) {
        CUdeviceptr p;
        size_t bytes;
        CK(cuModuleGetGlobal(&p, &bytes, gmod, "gbuf"));
        CK(cuMemcpyHtoDAsync(p, h, bytes, s));
      }
      CK(cuStreamSynchronize(s));
      if (r >= 0) t[r] = (now() - t0) / M * 1e6;
    }
    out("get_global_copy_us", median(t, REPS));
    CK(cuMemFreeHost(h));
    CK(cuStreamDestroy(s));
    CK(cuModuleUnload(gmod));
    free(gimg);
  }

  /* 12: textures. A TEX_W x TEX_W float32 CUDA array read with tex2D (point, clamp) and copied
     to linear memory, TEX_K launches between two events; then cuTexObjectCreate +
     cuTexObjectDestroy in a loop (cudalua: cuda.texture(ca) + :close()) */
  {
    size_t tsz;
    char *timg = compile(TEXSRC, arch, &tsz);
    CUmodule tmod;
    CUfunction ftex;
    CK(cuModuleLoadData(&tmod, timg));
    CK(cuModuleGetFunction(&ftex, tmod, "tex_copy"));
    CUDA_ARRAY3D_DESCRIPTOR ad;
    memset(&ad, 0, sizeof ad);
    ad.Width = TEX_W; ad.Height = TEX_W; ad.Format = CU_AD_FORMAT_FLOAT; ad.NumChannels = 1;
    CUarray arr;
    CK(cuArray3DCreate(&arr, &ad));
    CUdeviceptr dout;
    CK(cuMemAlloc(&dout, (size_t)TEX_W * TEX_W * 4));
    fill_ones(dout, (size_t)TEX_W * TEX_W, 0);
    CUDA_MEMCPY3D cp;
    memset(&cp, 0, sizeof cp);
    cp.srcMemoryType = CU_MEMORYTYPE_DEVICE; cp.srcDevice = dout; cp.srcPitch = TEX_W * 4; cp.srcHeight = TEX_W;
    cp.dstMemoryType = CU_MEMORYTYPE_ARRAY; cp.dstArray = arr;
    cp.WidthInBytes = TEX_W * 4; cp.Height = TEX_W; cp.Depth = 1;
    CK(cuMemcpy3D(&cp));
    CUDA_RESOURCE_DESC rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = CU_RESOURCE_TYPE_ARRAY; rd.res.array.hArray = arr;
    CUDA_TEXTURE_DESC td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = CU_TR_ADDRESS_MODE_CLAMP;
    td.filterMode = CU_TR_FILTER_MODE_POINT;
    CUtexObject tex;
    CK(cuTexObjectCreate(&tex, &rd, &td, NULL));
    int w = TEX_W, h = TEX_W;
    void *args[] = {&dout, &tex, &w, &h};
    for (int r = -1; r < REPS; r++) {
      CK(cuEventRecord(e0, NULL));
      for (int k = 0; k < TEX_K; k++)
        CK(cuLaunchKernel(ftex, TEX_W / 16, TEX_W / 16, 1, 16, 16, 1, 0, NULL, args, NULL));
      CK(cuEventRecord(e1, NULL));
      CK(cuEventSynchronize(e1));
      float ms;
      CK(cuEventElapsedTime(&ms, e0, e1));
      if (r >= 0) t[r] = ms * 1e3 / TEX_K;
    }
    out("tex_fetch_us", median(t, REPS));
    CK(cuTexObjectDestroy(tex));
    for (int r = -1; r < REPS; r++) {
      double t0 = now();
      for (int i = 0; i < TEX_M; i++) {
        CK(cuTexObjectCreate(&tex, &rd, &td, NULL));
        CK(cuTexObjectDestroy(tex));
      }
      if (r >= 0) t[r] = (now() - t0) / TEX_M * 1e6;
    }
    out("tex_create_destroy_us", median(t, REPS));
    CK(cuArrayDestroy(arr));
    CK(cuMemFree(dout));
    CK(cuModuleUnload(tmod));
    free(timg);
  }

  CK(cuEventDestroy(e0));
  CK(cuEventDestroy(e1));
  CK(cuModuleUnload(mod));
  free(img);
  return 0;
}
