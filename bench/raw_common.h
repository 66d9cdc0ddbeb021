/* raw_common.h: what bench/raw.c and bench/raw_helpers.c share: error checks, a wall clock,
   medians, output lines and an NVRTC compile. Define PROG (the program's name, for messages)
   before including it. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <cuda.h>
#include <nvrtc.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
  cuGetErrorName(r_, &n_); fprintf(stderr, PROG ": %s: %s (line %d)\n", #x, n_, __LINE__); exit(1); } } while (0)
#define NK(x) do { nvrtcResult r_ = (x); if (r_ != NVRTC_SUCCESS) { \
  fprintf(stderr, PROG ": %s: %s (line %d)\n", #x, nvrtcGetErrorString(r_), __LINE__); exit(1); } } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmpd);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void out(const char *key, double v) { printf("%s %.4f\n", key, v); fflush(stdout); }

static int envint(const char *name, int def) {
  const char *s = getenv(name);
  return s && atoi(s) > 0 ? atoi(s) : def;
}

/* device 0's primary context made current (as cudalua uses it); its "sm_XY" into arch */
static CUdevice init_device(char arch[16]) {
  CUdevice dev;
  CUcontext ctx;
  int ma, mi;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuDeviceGetAttribute(&ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CK(cuDeviceGetAttribute(&mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  snprintf(arch, 16, "sm_%d%d", ma, mi);
  return dev;
}

/* a fresh NVRTC program each call: create, compile, read the CUBIN, destroy */
static char *compile(const char *src, const char *arch, size_t *size) {
  nvrtcProgram prog;
  char opt[32];
  snprintf(opt, sizeof opt, "-arch=%s", arch);
  const char *opts[] = {opt};
  NK(nvrtcCreateProgram(&prog, src, PROG ".cu", 0, NULL, NULL));
  nvrtcResult r = nvrtcCompileProgram(prog, 1, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = malloc(n + 1);
    nvrtcGetProgramLog(prog, log);
    fprintf(stderr, PROG ": compile failed: %s\n%s\n", nvrtcGetErrorString(r), log);
    exit(1);
  }
  NK(nvrtcGetCUBINSize(prog, size));
  char *img = malloc(*size);
  NK(nvrtcGetCUBIN(prog, img));
  NK(nvrtcDestroyProgram(&prog));
  return img;
}
