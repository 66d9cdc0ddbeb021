// tools/while_repro.cu: the driver fault behind src/gexec.c's conditional lane, in plain CUDA C
// (no cudalua). Each step makes a new graph (a memset, then a WHILE node whose body kernel
// counts down), instantiates it and launches it 1 to 3 times on one of STREAMS streams.
//   nvcc -arch=sm_90 -o build/while_repro tools/while_repro.cu
//   build/while_repro STEPS STREAMS SEED MODE [ITERS]
// MODE 0: as said; 1: every WHILE graph ordered after the one before (one event across the
// streams: what cudalua does); 2: as 1, with a plain kernel on a random stream after each launch.
// On driver 580.159.04 (H100, CUDA 13.0), 1500 3 SEED: MODE 0 fails (unspecified launch
// failure) within 17 to 380 steps, MODE 1 runs clean, MODE 2 fails within a few hundred steps.
// One stream (1500 1 SEED 0) runs clean.
// ITERS: every WHILE loop runs that many times (default 1 to 40 at random).
// WHILE_REPRO_KIND=if in the environment: an IF node (its body runs once) instead of WHILE.
// Under compute-sanitizer 2025.3.1's memcheck (same driver), even one stream fails: 3 1 1 0 40
// and 3 1 1 1 6000 stop with an illegal address at the synchronize and no record of an access
// (they run clean without it): the fault examples/graph_while.lua meets there at times. IF nodes
// too: WHILE_REPRO_KIND=if, 200 1 SEED 0 40 stops at step 17 (seeds 1 to 3; cudaGraphInstantiate),
// and with WHILE_REPRO_LIVE=4 at step 6; without the sanitizer 1500 3 1 1 runs clean.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("step %d: %s: %s\n", i, #x, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void add(int *x, int v, int n) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) x[j] += v;
}

__global__ void count_down(int *x, int v, int n, int *left, cudaGraphConditionalHandle h) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) x[j] += v;
  if (j == 0 && --*left <= 0) cudaGraphSetConditional(h, 0);
}

int main(int argc, char **argv) {
  int i = 0;
  if (argc != 5 && argc != 6) { fprintf(stderr, "usage: while_repro STEPS STREAMS SEED MODE [ITERS]\n"); return 2; }
  int steps = atoi(argv[1]), ns = atoi(argv[2]), mode = atoi(argv[4]), iters = argc == 6 ? atoi(argv[5]) : 0;
  if (ns < 1 || ns > 8) { fprintf(stderr, "STREAMS: 1 to 8\n"); return 2; }
  srand((unsigned)atoi(argv[3]));
  const char *kind = getenv("WHILE_REPRO_KIND");
  // WHILE_REPRO_LIVE=K: only the last K graphs (and their executable graphs) stay (K < 64)
  int keep_live = getenv("WHILE_REPRO_LIVE") ? atoi(getenv("WHILE_REPRO_LIVE")) : 0;
  if (keep_live >= 64) keep_live = 63;
  cudaGraphExec_t execs[64];
  cudaGraph_t graphs[64];
  cudaGraphConditionalNodeType ctype = kind && kind[0] == 'i' ? cudaGraphCondTypeIf : cudaGraphCondTypeWhile;
  cudaStream_t st[8];
  int *d[8], n[8];
  for (int k = 0; k < ns; k++) {
    CK(cudaStreamCreate(&st[k]));
    n[k] = (rand() % 8 + 1) * 128 + rand() % 128;
    CK(cudaMalloc(&d[k], n[k] * sizeof(int)));
    CK(cudaMemset(d[k], 0, n[k] * sizeof(int)));
  }
  cudaEvent_t last;
  CK(cudaEventCreateWithFlags(&last, cudaEventDisableTiming));
  int last_stream = -1;
  for (i = 1; i <= steps; i++) {
    int l = rand() % ns, v = rand() % 19 - 9, count = iters > 0 ? iters : rand() % 40 + 1, runs = rand() % 3 + 1;
    int *left;
    CK(cudaMallocAsync((void **)&left, sizeof(int), st[l]));
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    cudaMemsetParams mp = {};
    mp.dst = left; mp.value = (unsigned)count; mp.elementSize = 4; mp.width = 1; mp.height = 1;
    cudaGraphNode_t ms, loop, body_kernel;
    CK(cudaGraphAddMemsetNode(&ms, g, nullptr, 0, &mp));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h; cp.conditional.type = ctype; cp.conditional.size = 1;
    CK(cudaGraphAddNode(&loop, g, &ms, nullptr, 1, &cp));
    void *args[] = {&d[l], &v, &n[l], &left, &h};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)count_down; kp.gridDim = dim3((n[l] + 127) / 128); kp.blockDim = dim3(128);
    kp.kernelParams = args;
    CK(cudaGraphAddKernelNode(&body_kernel, cp.conditional.phGraph_out[0], nullptr, 0, &kp));
    cudaGraphExec_t e;
    CK(cudaGraphInstantiate(&e, g, 0));
    for (int r = 0; r < runs; r++) {
      if (mode && last_stream >= 0 && last_stream != l) CK(cudaStreamWaitEvent(st[l], last, 0));
      CK(cudaGraphLaunch(e, st[l]));
      if (mode) { CK(cudaEventRecord(last, st[l])); last_stream = l; }
      if (mode == 2) { int o = rand() % ns; add<<<(n[o] + 127) / 128, 128, 0, st[o]>>>(d[o], 0, n[o]); }
    }
    CK(cudaFreeAsync(left, st[l]));
    if (keep_live > 0 && i > keep_live) {   // the graph made keep_live steps ago goes
      CK(cudaGraphExecDestroy(execs[(i - keep_live) % 64]));
      CK(cudaGraphDestroy(graphs[(i - keep_live) % 64]));
    }
    execs[i % 64] = e; graphs[i % 64] = g;
  }
  CK(cudaDeviceSynchronize());
  printf("ok: %d steps on %d streams\n", steps, ns);
  return 0;
}
