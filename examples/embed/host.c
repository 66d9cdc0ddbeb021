/* examples/embed/host.c: a C host program that embeds cudalua.
 *   host single   one Lua state: the host's cudaMalloc'd buffer goes to a Lua script that
 *                 launches a kernel on it and runs cuda.reduce; the host checks the result.
 *   host threads  two Lua states in two threads, each on its own cudaStream_t.
 * Each job also hands Lua a DLPack tensor (DLManagedTensorVersioned over a cudaMalloc'd buffer,
 * freed by its deleter once Lua is done) and takes the script's result back as one, reading it
 * in C and calling its deleter before the state closes.
 * Built by `make examples` (build/embed_host), run with examples/embed/script.lua. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include "cudalua.h"

static const char *script = "examples/embed/script.lua";

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); exit(2); } } while (0)

static int released;   /* buffers Lua owned and gave back */
static void release(void *ud, uint64_t ptr) {
  (void)ud;
  cudaFree((void *)(uintptr_t)ptr);
  __atomic_add_fetch(&released, 1, __ATOMIC_SEQ_CST);
}

/* DLPack 1.0's structures (its dlpack.h), declared here from the specification */
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct { void *data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t *shape, *strides; uint64_t byte_offset; } DLTensor;
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct DLMTV { DLPackVersion version; void *manager_ctx; void (*deleter)(struct DLMTV *); uint64_t flags; DLTensor dl_tensor; } DLMTV;

static int tensors_freed;   /* the host's tensors whose deleter cudalua called */
typedef struct { DLMTV t; int64_t shape[1]; } host_tensor;
static void free_tensor(DLMTV *t) {
  cudaFree(t->dl_tensor.data);
  free(t);
  __atomic_add_fetch(&tensors_freed, 1, __ATOMIC_SEQ_CST);
}

/* a float32 tensor of n elements on device dev, owned by whoever takes it */
static DLMTV *new_tensor(float *data, int n, int dev) {
  host_tensor *h = calloc(1, sizeof *h);
  h->shape[0] = n;
  h->t.version = (DLPackVersion){1, 0};
  h->t.deleter = free_tensor;
  h->t.dl_tensor = (DLTensor){data, {2 /* kDLCUDA */, dev}, 1, {2 /* kDLFloat */, 32, 1}, h->shape, NULL, 0};
  return &h->t;
}

static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "cudalua", luaopen_cudalua, 1);
  lua_pop(L, 1);
  return L;
}

typedef struct {
  int id, n, ok;
  cudaStream_t stream;   /* NULL: the legacy default stream */
  double lua_sum;
} job;

/* runs the script on a host buffer of n random floats; checks x -> 2x + 1 and the sum */
static void run_job(job *j) {
  int n = j->n;
  float *h = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
  unsigned seed = 12345u + (unsigned)j->id;
  for (int i = 0; i < n; i++) h[i] = (float)(rand_r(&seed) % 2001 - 1000) / 8.0f;
  float *d;
  CHECK(cudaMalloc((void **)&d, sizeof(float) * n));
  CHECK(cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice));

  lua_State *L = new_state();
  int64_t shape[1] = {n};
  cudalua_push_device_array(L, (uint64_t)(uintptr_t)d, "float32", 1, shape, NULL, NULL);
  lua_setglobal(L, "buf");                                /* the host keeps ownership */
  if (j->stream) { cudalua_push_stream(L, j->stream, 0); lua_setglobal(L, "stream"); }
  /* a second buffer whose ownership goes to Lua: freed through release() */
  float *owned;
  CHECK(cudaMalloc((void **)&owned, sizeof(float) * 16));
  int64_t s16[1] = {16};
  cudalua_push_device_array(L, (uint64_t)(uintptr_t)owned, "float32", 1, s16, release, NULL);
  lua_setglobal(L, "owned");
  lua_pushinteger(L, j->id); lua_setglobal(L, "job");
  /* a DLPack tensor in: a copy of h, which cudalua owns from here (its deleter frees it) */
  float *dl;
  int dev;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaMalloc((void **)&dl, sizeof(float) * n));
  CHECK(cudaMemcpy(dl, h, sizeof(float) * n, cudaMemcpyHostToDevice));
  cudalua_push_dlpack(L, new_tensor(dl, n, dev), 1);
  lua_setglobal(L, "dl_in");

  if (luaL_dofile(L, script) != LUA_OK) {
    fprintf(stderr, "job %d: %s\n", j->id, lua_tostring(L, -1));
    j->ok = 0;
    lua_close(L);
    return;
  }
  j->lua_sum = lua_tonumber(L, -1);
  /* the array comes back to C with its pointer, shape and dtype */
  lua_getglobal(L, "buf");
  cudalua_array_info info;
  int is_array = cudalua_to_array(L, -1, &info);
  /* a DLPack tensor out: the script's `tripled` (3 h), read here, then given back */
  lua_getglobal(L, "tripled");
  DLMTV *out = cudalua_to_dlpack(L, -1, 1);
  float *tri = malloc(sizeof(float) * n);
  int dl_ok = out->dl_tensor.ndim == 1 && out->dl_tensor.shape[0] == n && out->dl_tensor.dtype.code == 2 &&
              out->dl_tensor.dtype.bits == 32 && out->dl_tensor.device.device_type == 2;
  CHECK(cudaMemcpy(tri, out->dl_tensor.data, sizeof(float) * n, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n && dl_ok; i++) dl_ok = tri[i] == 3.0f * h[i];
  out->deleter(out);   /* (before the state closes) */
  free(tri);
  lua_close(L);   /* Lua lets go of `owned` here */

  CHECK(cudaStreamSynchronize(j->stream));
  CHECK(cudaMemcpy(back, d, sizeof(float) * n, cudaMemcpyDeviceToHost));
  int bad = 0;
  double sum = 0;
  for (int i = 0; i < n; i++) {
    float want = 2.0f * h[i] + 1.0f;
    if (back[i] != want) bad++;
    sum += want;
  }
  double rel = fabs(j->lua_sum - sum) / (fabs(sum) > 1 ? fabs(sum) : 1);
  j->ok = bad == 0 && rel < 1e-4 && is_array && dl_ok && info.ptr == (uint64_t)(uintptr_t)d &&
          info.shape[0] == n && strcmp(info.dtype, "float32") == 0;
  printf("job %d: %d elements on %s, %d wrong, Lua's cuda.reduce sum %.6g, CPU %.6g (rel. diff %.1e), "
         "array read back: %s, DLPack round trip: %s\n", j->id, n, j->stream ? "its own stream" : "the default stream", bad,
         j->lua_sum, sum, rel, is_array ? info.dtype : "no", dl_ok ? "3x, as the CPU" : "WRONG");
  cudaFree(d);
  free(h); free(back);
}

static void *thread_main(void *p) { run_job(p); return NULL; }

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "single";
  if (argc > 2) script = argv[2];
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("embed: no GPU on this machine\n");
    return 2;
  }
  CHECK(cudaFree(0));   /* the host makes its (primary) context first; cudalua shares it */
  int ok = 1;
  if (strcmp(mode, "threads") == 0) {
    job jobs[2] = {{.id = 1, .n = 1 << 20}, {.id = 2, .n = 3 << 18}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(cudaStreamCreateWithFlags(&jobs[i].stream, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_main, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) { ok = ok && jobs[i].ok; cudaStreamDestroy(jobs[i].stream); }
  } else {
    job j = {.id = 0, .n = 1000003};
    run_job(&j);
    ok = j.ok;
  }
  int expect = strcmp(mode, "threads") == 0 ? 2 : 1;
  ok = ok && released == expect && tensors_freed == expect;
  printf("embed %s: %s (buffers released by Lua: %d of %d; DLPack tensors freed by their deleter: %d of %d)\n", mode,
         ok ? "ok" : "FAILED", released, expect, tensors_freed, expect);
  return ok ? 0 : 1;
}
