/* driver.c: the tables of libcuda, NVRTC and nvJitLink (loader.c opens them at run time),
   contexts, errors (the system functions are device.c's). Nothing links against the CUDA libraries, so the module
   loads on machines without them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <limits.h>
#include <sys/stat.h>
#include "cl.h"
#include "cpu_dev.h"

cl_api cu;
int cl_launch_blocks;   /* CUDA_LAUNCH_BLOCKING (or a sanitizer): launches return once run */
/* no driver use inside a Lua host function (CUDA's rule): hostfn.c sets these, every driver
   call's guard (cl_use_ctx) reads them */
unsigned cl_host_pending;      /* firings pending in the process (atomic) */
__thread int cl_in_hostfn;     /* this thread runs a Lua host function now */

void cl_hostfn_refuse(lua_State *L) {
  cl_error(L, NULL, "a Lua host function cannot use the GPU (launches, copies, allocations, waits): "
                "CUDA forbids it, and the stream waits for the function; queue the work after it instead");
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;   /* the contexts */

#define MAXDEV CL_MAXDEV
/* primary contexts, retained once per process; written under `lock`, read without it by any
   thread (atomically: a state on another thread may be filling or clearing an entry) */
static CUcontext dev_ctx[MAXDEV];
static int dev_count = -1;
static __thread int tl_dev;          /* the device this thread selected, like the runtime */

static int is_sanitizer(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size; (void)data;
  return info->dlpi_name && strstr(info->dlpi_name, "sanitizer") != NULL;
}

/* do launches return only once their work has run? With CUDA_LAUNCH_BLOCKING=1, and under
   compute-sanitizer, whose library cuInit loads into the process */
static int launches_block(void) {
  const char *b = getenv("CUDA_LAUNCH_BLOCKING");
  if (b && b[0] == '1') return 1;
  return dl_iterate_phdr(is_sanitizer, NULL) != 0;
}

/* libcuda is usable once cuInit succeeded and there is a device (run by the loader, under
   the library's lock, before it says the driver is loaded: dev_count is set by then) */
static int driver_ready(cl_lib *l) {
  CUresult r = CU0(cuInit, 0);
  if (r != CUDA_SUCCESS) {
    const char *n = "?"; CU0(cuGetErrorName, r, &n);
    snprintf(l->err, sizeof l->err,
             r == CUDA_ERROR_NO_DEVICE ? "cudalua: no CUDA device" : "cudalua: cuInit failed: %s", n);
    return 0;
  }
  int n = 0;
  CU0(cuDeviceGetCount, &n);
  dev_count = n > MAXDEV ? MAXDEV : n;
  if (dev_count <= 0) {
    snprintf(l->err, sizeof l->err, "cudalua: no CUDA device");
    return 0;
  }
  cl_launch_blocks = launches_block();
  return 1;
}

static const char *cuda_result(int r) {
  const char *n = NULL;
  return CU0(cuGetErrorName, (CUresult)r, &n) == CUDA_SUCCESS ? n : NULL;
}

/* each entry point of libcuda by the exact name the headers' prototype has (cuMemAlloc_v2,
   ...): a newer variant under the plain name can take other arguments (cuCtxSynchronize_v2).
   NVRTC and nvJitLink by their plain names: those libraries export them as well as the
   versioned ones the header's inline wrappers call. */
#define CL_STR(f) #f
#define CL_XSTR(f) CL_STR(f)
#define CL_CUSYM(f) {CL_XSTR(f), (void **)&cu.f},
#define CL_SYM(f) {#f, (void **)&cu.f},
static const cl_sym cuda_syms[] = {CL_CUDA_FUNCS(CL_CUSYM) {NULL, NULL}};
static const cl_sym cuda_opt[] = {CL_CUDA_OPTIONAL(CL_CUSYM) {NULL, NULL}};
static const cl_sym nvrtc_syms[] = {CL_NVRTC_FUNCS(CL_SYM) {NULL, NULL}};
static const cl_sym nvrtc_opt[] = {CL_NVRTC_OPTIONAL(CL_SYM) {NULL, NULL}};
static const cl_sym jitlink_syms[] = {CL_JITLINK_FUNCS(CL_SYM) {NULL, NULL}};
static const cl_sym jitlink_opt[] = {CL_JITLINK_OPTIONAL(CL_SYM) {NULL, NULL}};

/* CUDALUA_LIBCUDA names another driver library (the specs hide the driver with it) */
static const char *const cuda_names[] = {"libcuda.so.1", NULL};
static const cl_libdir loader_path[] = {{NULL, ""}, {NULL, NULL}};
cl_lib cl_libcuda = {
  .env = "CUDALUA_LIBCUDA", .names = cuda_names, .dirs = loader_path, .flags = RTLD_NOW,
  .syms = cuda_syms, .optional = cuda_opt,
  .forced_fail = "cudalua: no CUDA driver found (%s)", .not_found = "cudalua: no CUDA driver found (%s)",
  .lacks = "cudalua: the CUDA driver is too old (it lacks %.0s%s)",   /* %.0s: not the file */
  .ready = driver_ready, .builtin = cl_cpu_symbol, .result_of = cuda_result, .unknown = "CUDA_ERROR_UNKNOWN",
  .lock = PTHREAD_MUTEX_INITIALIZER};

/* the NVRTC and nvJitLink libraries looked for, newest first (loading and the cache identity
   use the same lists): by the environment's name, else next to NVRTC (nvJitLink), on the
   loader's path, then under CUDA_HOME, CUDA_PATH and /usr/local/cuda */
static const char *const nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
static const char *const jitlink_names[] = {"libnvJitLink.so.13", "libnvJitLink.so.12", "libnvJitLink.so", NULL};
static const cl_libdir toolkit_dirs[] = {{NULL, ""}, {"CUDA_HOME", "/lib64"}, {"CUDA_PATH", "/lib64"},
  {NULL, "/usr/local/cuda/lib64"}, {NULL, NULL}};

static const char *nvrtc_result(int r) { return cu.nvrtcGetErrorString((nvrtcResult)r); }

cl_lib cl_nvrtc = {
  .env = "CUDALUA_NVRTC", .names = nvrtc_names, .dirs = toolkit_dirs, .flags = RTLD_LAZY,
  .syms = nvrtc_syms, .optional = nvrtc_opt,
  .forced_fail = "cudalua: NVRTC not found (libnvrtc.so.13 or .12): CUDALUA_NVRTC=%s cannot be opened (%s)",
  .not_found = "cudalua: NVRTC not found (libnvrtc.so.13 or .12; set CUDA_HOME or LD_LIBRARY_PATH)",
  .lacks = "cudalua: %s lacks %s",
  .result_of = nvrtc_result, .unknown = "NVRTC_ERROR unknown",
  .lock = PTHREAD_MUTEX_INITIALIZER};

/* nvJitLink has no function naming its results: its codes by value (newer libraries add codes
   the headers of older toolkits lack) */
static const char *const jitlink_results[] = {"NVJITLINK_SUCCESS", "NVJITLINK_ERROR_UNRECOGNIZED_OPTION",
  "NVJITLINK_ERROR_MISSING_ARCH", "NVJITLINK_ERROR_INVALID_INPUT", "NVJITLINK_ERROR_PTX_COMPILE",
  "NVJITLINK_ERROR_NVVM_COMPILE", "NVJITLINK_ERROR_INTERNAL", "NVJITLINK_ERROR_THREADPOOL",
  "NVJITLINK_ERROR_UNRECOGNIZED_INPUT", "NVJITLINK_ERROR_FINALIZE", "NVJITLINK_ERROR_NULL_INPUT",
  "NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS", "NVJITLINK_ERROR_INCORRECT_INPUT_TYPE",
  "NVJITLINK_ERROR_ARCH_MISMATCH", "NVJITLINK_ERROR_OUTDATED_LIBRARY", "NVJITLINK_ERROR_MISSING_FATBIN",
  "NVJITLINK_ERROR_UNRECOGNIZED_ARCH", "NVJITLINK_ERROR_UNSUPPORTED_ARCH", "NVJITLINK_ERROR_LTO_NOT_ENABLED"};

/* nvJitLink is looked for next to NVRTC first: the two must come from one toolkit */
cl_lib cl_nvjitlink = {
  .env = "CUDALUA_NVJITLINK", .names = jitlink_names, .dirs = toolkit_dirs, .near = &cl_nvrtc,
  .flags = RTLD_LAZY, .syms = jitlink_syms, .optional = jitlink_opt,
  .forced_fail = "cudalua: nvJitLink not found (libnvJitLink.so.13 or .12, from the CUDA toolkit): "
                 "CUDALUA_NVJITLINK=%s cannot be opened (%s): linking and LTO-IR modules need it",
  .not_found = "cudalua: nvJitLink not found (libnvJitLink.so.13 or .12, from the CUDA toolkit; "
               "set CUDA_HOME or LD_LIBRARY_PATH): linking and LTO-IR modules need it",
  .lacks = "cudalua: %s lacks %s",
  .results = jitlink_results, .nresults = sizeof jitlink_results / sizeof jitlink_results[0],
  .unknown = "NVJITLINK_ERROR", .lock = PTHREAD_MUTEX_INITIALIZER};

void cl_check(lua_State *L, CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return;
  const char *s = NULL;
  if (cu.cuGetErrorString) CU0(cuGetErrorString, r, &s);
  cl_error(L, what, "%s (%s)", cl_errname(r), s ? s : "no description");
}

void cl_need_driver(lua_State *L) {
  cl_lib_need(L, &cl_libcuda);
}

static CUcontext ctx_of(int d) { return __atomic_load_n(&dev_ctx[d], __ATOMIC_ACQUIRE); }
CUcontext cl_ctx_of_device(int d) { return d >= 0 && d < MAXDEV ? ctx_of(d) : NULL; }

/* The primary context, so a host program that uses the runtime API shares memory with us. */
/* (driver calls under `lock` are not parked: a host function the helper ran meanwhile could
   want the lock, making another device's context say) */
static CUcontext primary(lua_State *L, int d) {
  CUcontext have = ctx_of(d);
  if (have) return have;
  pthread_mutex_lock(&lock);
  CUresult r = CUDA_SUCCESS;
  if (!dev_ctx[d]) {
    CUdevice dev; CUcontext c = NULL;
    r = CU0(cuDeviceGet, &dev, d);
    if (r == CUDA_SUCCESS) r = CU0(cuDevicePrimaryCtxRetain, &c, dev);
    if (r == CUDA_SUCCESS) {
      CUcontext old = NULL;
      CU0(cuCtxGetCurrent, &old);
      CU0(cuCtxSetCurrent, c);
      /* keep freed device memory in the pool, up to an eighth of the device, so allocation
         in loops stays cheap without holding memory other processes need */
      CUmemoryPool pool;
      size_t total = 0;
      CU0(cuDeviceTotalMem, &total, dev);
      if (CU0(cuDeviceGetDefaultMemPool, &pool, dev) == CUDA_SUCCESS) {
        cuuint64_t thr = total / 8;
        CU0(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
      }
      CU0(cuCtxSetCurrent, old);
      __atomic_store_n(&dev_ctx[d], c, __ATOMIC_RELEASE);
    }
  }
  CUcontext c = dev_ctx[d];
  pthread_mutex_unlock(&lock);
  cl_check(L, r, "creating the device's primary context");
  return c;
}

CUcontext cl_ctx(lua_State *L) {
  cl_need_driver(L);
  CUcontext want = ctx_of(tl_dev);
  if (!want) want = primary(L, tl_dev);
  cl_use_ctx(L, want);
  return want;
}

int cl_current_device(void) { return tl_dev; }
void cl_set_current_device(int dev) { if (dev >= 0 && dev < MAXDEV) tl_dev = dev; }

int cl_ndevices(void) { return cl_driver_load() ? dev_count : 0; }

int cl_device_of(CUcontext c) {
  for (int d = 0; d < dev_count; d++) if (c && ctx_of(d) == c) return d;
  return -1;
}

CUcontext cl_device_ctx(lua_State *L, int dev) {
  cl_need_driver(L);
  if (dev < 0 || dev >= dev_count) cl_error(L, NULL, "device id %d out of range (0..%d)", dev, dev_count - 1);
  CUcontext c = ctx_of(dev);
  return c ? c : primary(L, dev);
}

/* peer access cudalua enabled: [from][to], kernels in from's context may use to's memory */
static unsigned char peer_on[MAXDEV][MAXDEV];

int cl_peer_enabled_dev(int a, int b) { return peer_on[a][b]; }
void cl_peer_set(int a, int b, int on) { peer_on[a][b] = (unsigned char)on; }

int cl_peer_enabled(CUcontext from, CUcontext to) {
  int a = cl_device_of(from), b = cl_device_of(to);
  return a >= 0 && b >= 0 && peer_on[a][b];
}

int cl_device_attr(CUdevice_attribute a) {
  int v = 0; CUdevice dev;
  if (!cl_lib_ok(&cl_libcuda) || CU0(cuDeviceGet, &dev, tl_dev) != CUDA_SUCCESS) return 0;
  CU0(cuDeviceGetAttribute, &v, a, dev);
  return v;
}

/* of the array's own device (a managed array made on device 1 while device 0 is selected) */
int cl_concurrent_managed(CUcontext ctx) {
  static int cache[MAXDEV];   /* 0 unknown, 1 no, 2 yes; any thread may fill it (the same value) */
  int d = cl_device_of(ctx);
  if (d < 0) d = tl_dev;
  int v = __atomic_load_n(&cache[d], __ATOMIC_RELAXED);
  if (!v) {
    int a = 0;
    CUdevice dev;
    if (cl_lib_ok(&cl_libcuda) && CU0(cuDeviceGet, &dev, d) == CUDA_SUCCESS)
      CU0(cuDeviceGetAttribute, &a, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev);
    v = a ? 2 : 1;
    __atomic_store_n(&cache[d], v, __ATOMIC_RELAXED);
  }
  return v == 2;
}

static int l_nvrtc_version(lua_State *L) {
  int ma = 0, mi = 0;
  if (!cl_lib_load(&cl_nvrtc)) { lua_pushnil(L); lua_pushstring(L, cl_nvrtc.err); return 2; }
  cu.nvrtcVersion(&ma, &mi);
  lua_pushinteger(L, ma); lua_pushinteger(L, mi); lua_pushstring(L, cl_nvrtc.path);
  return 3;
}

/* "path:size:mtime" of the library a compile would use, found without loading it (loading
   NVRTC takes ~10 ms, a disk cache hit must not pay that); what: "nvrtc" or "nvjitlink" */
static void push_identity(lua_State *L, const char *const *names, const char *env, const char *what) {
  const char *forced = getenv(env);
  struct stat st;
  if (forced && *forced) {
    if (stat(forced, &st) == 0) lua_pushfstring(L, "%s:%I:%I", forced, (lua_Integer)st.st_size, (lua_Integer)st.st_mtime);
    else lua_pushfstring(L, "%s:none", what);
    return;
  }
  const char *dirs[8];
  int nd = 0;
  char ldp[4096] = "";
  const char *e = getenv("LD_LIBRARY_PATH");
  if (e) snprintf(ldp, sizeof ldp, "%s", e);
  char *save = NULL;
  for (char *t = strtok_r(ldp, ":", &save); t && nd < 3; t = strtok_r(NULL, ":", &save)) dirs[nd++] = t;
  char h1[600] = "", h2[600] = "";
  if ((e = getenv("CUDA_HOME")) && *e) { snprintf(h1, sizeof h1, "%s/lib64", e); dirs[nd++] = h1; }
  if ((e = getenv("CUDA_PATH")) && *e) { snprintf(h2, sizeof h2, "%s/lib64", e); dirs[nd++] = h2; }
  dirs[nd++] = "/usr/local/cuda/lib64";
  dirs[nd++] = "/usr/lib/x86_64-linux-gnu";
  for (int n = 0; names[n]; n++)
    for (int d = 0; d < nd; d++) {
      char p[1200], rp[PATH_MAX];
      snprintf(p, sizeof p, "%s/%s", dirs[d], names[n]);
      if (stat(p, &st) == 0 && realpath(p, rp)) {
        lua_pushfstring(L, "%s:%I:%I", rp, (lua_Integer)st.st_size, (lua_Integer)st.st_mtime);
        return;
      }
    }
  lua_pushfstring(L, "%s:none", what);
}

static int l_nvrtc_identity(lua_State *L) { push_identity(L, cl_nvrtc.names, cl_nvrtc.env, "nvrtc"); return 1; }
static int l_jitlink_identity(lua_State *L) { push_identity(L, cl_nvjitlink.names, cl_nvjitlink.env, "nvjitlink"); return 1; }

/* jitlink_version() -> major, minor, path | nil, why; major 0 when the library is older than
   nvJitLinkVersion (12.3) */
static int l_jitlink_version(lua_State *L) {
  unsigned ma = 0, mi = 0;
  if (!cl_lib_load(&cl_nvjitlink)) { lua_pushnil(L); lua_pushstring(L, cl_nvjitlink.err); return 2; }
  if (cu.nvJitLinkVersion) cu.nvJitLinkVersion(&ma, &mi);
  lua_pushinteger(L, ma); lua_pushinteger(L, mi); lua_pushstring(L, cl_nvjitlink.path);
  return 3;
}

/* The last Lua state using cudalua has closed: every object has been freed, so nothing of
   cudalua's is left on the devices once each has finished its work. The pools give their spare
   memory back and the primary contexts are released (a host program's runtime keeps its own
   reference); a state opened later retains them again. */
void cl_idle_devices(void) {
  if (!cl_lib_ok(&cl_libcuda)) return;
  CUcontext cur = NULL;
  CU0(cuCtxGetCurrent, &cur);
  for (int d = 0; d < dev_count; d++) {
    CUcontext c = ctx_of(d);
    if (!c) continue;
    CU0(cuCtxSetCurrent, c);
    CU0(cuCtxSynchronize);   /* host functions of closed states are released by the helper */
  }
  CU0(cuCtxSetCurrent, cur);
}

void cl_release_contexts(void) {
  if (!cl_lib_ok(&cl_libcuda)) return;
  pthread_mutex_lock(&lock);
  CUcontext cur = NULL;
  CU0(cuCtxGetCurrent, &cur);
  for (int d = 0; d < dev_count; d++) {
    if (!dev_ctx[d]) continue;
    CUdevice dev;
    CUmemoryPool pool;
    CU0(cuCtxSetCurrent, dev_ctx[d]);   /* idle: cl_idle_devices waited just before */
    if (CU0(cuDeviceGet, &dev, d) == CUDA_SUCCESS) {
      if (CU0(cuDeviceGetDefaultMemPool, &pool, dev) == CUDA_SUCCESS) CU0(cuMemPoolTrimTo, pool, 0);
      if (cur == dev_ctx[d]) cur = NULL;
      CU0(cuCtxSetCurrent, NULL);
      CU0(cuDevicePrimaryCtxRelease, dev);
    }
    __atomic_store_n(&dev_ctx[d], NULL, __ATOMIC_RELEASE);
  }
  memset(peer_on, 0, sizeof peer_on);
  CU0(cuCtxSetCurrent, cur);
  pthread_mutex_unlock(&lock);
}

/* the toolkit libraries' versions and identities (the compile cache's key) */
void cl_open_driver(lua_State *L) {
  static const luaL_Reg f[] = {
    {"nvrtc_version", l_nvrtc_version}, {"jitlink_version", l_jitlink_version},
    {"nvrtc_identity", l_nvrtc_identity}, {"jitlink_identity", l_jitlink_identity}, {NULL, NULL}};
  luaL_setfuncs(L, f, 0);
}
