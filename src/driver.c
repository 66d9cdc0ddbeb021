/* driver.c: opens libcuda and NVRTC at run time, owns contexts, system functions.
   Nothing links against the CUDA libraries, so the module loads on machines without them. */
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

cl_api cu;
int cl_launch_blocks;   /* CUDA_LAUNCH_BLOCKING (or a sanitizer): launches return once run */
/* no driver use inside a Lua host function (CUDA's rule): hostfn.c sets these, every driver
   call's guard (cl_use_ctx) reads them */
unsigned cl_host_pending;      /* firings pending in the process (atomic) */
__thread int cl_in_hostfn;     /* this thread runs a Lua host function now */

void cl_hostfn_refuse(lua_State *L) {
  luaL_error(L, "cudalua: a Lua host function cannot use the GPU (launches, copies, allocations, waits): "
                "CUDA forbids it, and the stream waits for the function; queue the work after it instead");
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int drv_state;        /* 0 not tried, 1 ok, -1 failed */
static char drv_err[256];

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

int cl_driver_load(void) {
  if (__atomic_load_n(&drv_state, __ATOMIC_ACQUIRE) == 1) return 1;   /* the common case, no lock */
  pthread_mutex_lock(&lock);
  if (drv_state == 0) {
    /* CUDALUA_LIBCUDA names another driver library (the specs hide the driver with it) */
    const char *lib = getenv("CUDALUA_LIBCUDA");
    if (!lib || !*lib) lib = "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      snprintf(drv_err, sizeof drv_err, "cudalua: no CUDA driver found (%s)", lib);
      drv_state = -1;
    } else {
      const char *missing = NULL;
      /* each entry point by the exact name the headers' prototype has (cuMemAlloc_v2, ...): a
         newer variant under the plain name can take other arguments (cuCtxSynchronize_v2) */
#define CL_STR(f) #f
#define CL_XSTR(f) CL_STR(f)
#define CL_GET(f) if (!(*(void **)&cu.f = dlsym(h, CL_XSTR(f))) && !missing) missing = CL_XSTR(f);
      CL_CUDA_FUNCS(CL_GET)
#undef CL_GET
#define CL_GET_OPT(f) *(void **)&cu.f = dlsym(h, CL_XSTR(f));
      CL_CUDA_OPTIONAL(CL_GET_OPT)
#undef CL_GET_OPT
      CUresult r;
      if (missing) {
        snprintf(drv_err, sizeof drv_err, "cudalua: the CUDA driver is too old (it lacks %s)", missing);
        drv_state = -1;
      } else if ((r = CU0(cuInit, 0)) != CUDA_SUCCESS) {
        const char *n = "?"; CU0(cuGetErrorName, r, &n);
        snprintf(drv_err, sizeof drv_err,
                 r == CUDA_ERROR_NO_DEVICE ? "cudalua: no CUDA device"
                                           : "cudalua: cuInit failed: %s", n);
        drv_state = -1;
      } else {
        int n = 0;
        CU0(cuDeviceGetCount, &n);
        dev_count = n > MAXDEV ? MAXDEV : n;
        if (dev_count <= 0) {
          snprintf(drv_err, sizeof drv_err, "cudalua: no CUDA device");
          drv_state = -1;
        } else {
          cl_launch_blocks = launches_block();
          __atomic_store_n(&drv_state, 1, __ATOMIC_RELEASE);
        }
      }
    }
  }
  int ok = drv_state == 1;
  pthread_mutex_unlock(&lock);
  return ok;
}

const char *cl_driver_error(void) { return drv_err; }

/* the NVRTC and nvJitLink libraries looked for, newest first (loading and the cache identity
   use the same lists) */
static const char *nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
static const char *jitlink_names[] = {"libnvJitLink.so.13", "libnvJitLink.so.12", "libnvJitLink.so", NULL};

/* a toolkit library: its state, where it was found, why not, and its entry points */
typedef struct {
  int state;                  /* 0 not tried, 1 ok, -1 failed */
  char path[700], err[1500];
  const char *const *names, *env, *what;
  const char *const *syms;
  void **const *slots;
  const char *optional;       /* an entry point newer libraries have: NULL when missing */
  const char *need;           /* what needs it, for the message */
} toolkit_lib;

#define CL_SYMNAME(f) #f,
#define CL_SYMSLOT(f) (void **)&cu.f,
static const char *const nvrtc_syms[] = {CL_NVRTC_FUNCS(CL_SYMNAME) NULL};
static void **const nvrtc_slots[] = {CL_NVRTC_FUNCS(CL_SYMSLOT)};
static const char *const jitlink_syms[] = {CL_JITLINK_FUNCS(CL_SYMNAME) NULL};
static void **const jitlink_slots[] = {CL_JITLINK_FUNCS(CL_SYMSLOT)};

static toolkit_lib nvrtc_lib = {0, "", "", nvrtc_names, "CUDALUA_NVRTC",
  "NVRTC not found (libnvrtc.so.13 or .12", nvrtc_syms, nvrtc_slots, NULL, ""};
/* nvJitLink is looked for next to NVRTC first: the two must come from one toolkit */
static toolkit_lib jitlink_lib = {0, "", "", jitlink_names, "CUDALUA_NVJITLINK",
  "nvJitLink not found (libnvJitLink.so.13 or .12, from the CUDA toolkit", jitlink_syms, jitlink_slots,
  "nvJitLinkVersion", ": linking and LTO-IR modules need it"};

static void *try_open(toolkit_lib *t, const char *path) {
  void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
  if (h) snprintf(t->path, sizeof t->path, "%s", path);
  return h;
}

/* opens t (lock held): the library its environment variable names, else by its names next to
   `near` (a library already loaded), on the loader's path, then under CUDA_HOME, CUDA_PATH and
   /usr/local/cuda; then its entry points. The library exports the plain names as well as the
   versioned ones the header's inline wrappers call. */
static int open_toolkit_lib(toolkit_lib *t, const char *near) {
  if (t->state) return t->state == 1;
  const char *forced = getenv(t->env);
  void *h = NULL;
  char buf[700];
  if (forced && *forced) {
    if (!(h = try_open(t, forced))) {
      const char *why = dlerror();
      snprintf(t->err, sizeof t->err, "cudalua: %s): %s=%s cannot be opened (%s)%s", t->what, t->env, forced,
               why ? why : "?", t->need);
    }
  } else {
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    const char *slash = near ? strrchr(near, '/') : NULL;
    for (int i = 0; !h && slash && t->names[i]; i++) {
      snprintf(buf, sizeof buf, "%.*s/%s", (int)(slash - near), near, t->names[i]);
      h = try_open(t, buf);
    }
    for (int j = -1; !h && j < 3; j++) {
      if (j >= 0 && (!homes[j] || !*homes[j])) continue;
      for (int i = 0; !h && t->names[i]; i++) {
        if (j < 0) snprintf(buf, sizeof buf, "%s", t->names[i]);
        else snprintf(buf, sizeof buf, "%s/lib64/%s", homes[j], t->names[i]);
        h = try_open(t, buf);
      }
    }
    if (!h) snprintf(t->err, sizeof t->err, "cudalua: %s; set CUDA_HOME or LD_LIBRARY_PATH)%s", t->what, t->need);
  }
  if (h) {
    const char *missing = NULL;
    for (int i = 0; t->syms[i]; i++)
      if (!(*t->slots[i] = dlsym(h, t->syms[i])) && !missing && !(t->optional && !strcmp(t->optional, t->syms[i])))
        missing = t->syms[i];
    if (missing) snprintf(t->err, sizeof t->err, "cudalua: %s lacks %s", t->path, missing);
    else t->state = 1;
  }
  if (t->state != 1) t->state = -1;
  return t->state == 1;
}

int cl_nvrtc_load(void) {
  pthread_mutex_lock(&lock);
  int ok = open_toolkit_lib(&nvrtc_lib, NULL);
  pthread_mutex_unlock(&lock);
  return ok;
}

int cl_jitlink_load(void) {
  pthread_mutex_lock(&lock);
  if (!nvrtc_lib.state) open_toolkit_lib(&nvrtc_lib, NULL);
  int ok = open_toolkit_lib(&jitlink_lib, nvrtc_lib.state == 1 ? nvrtc_lib.path : NULL);
  pthread_mutex_unlock(&lock);
  return ok;
}

const char *cl_nvrtc_error(void) { return nvrtc_lib.err; }
const char *cl_nvrtc_path(void) { return nvrtc_lib.path; }
const char *cl_jitlink_error(void) { return jitlink_lib.err; }

const char *cl_errname(CUresult r) {
  const char *n = NULL;
  if (drv_state != 1 || CU0(cuGetErrorName, r, &n) != CUDA_SUCCESS || !n) return "CUDA_ERROR_UNKNOWN";
  return n;
}

void cl_check(lua_State *L, CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return;
  const char *s = NULL;
  if (cu.cuGetErrorString) CU0(cuGetErrorString, r, &s);
  luaL_error(L, "cudalua: %s: %s (%s)", what, cl_errname(r), s ? s : "no description");
}

void cl_need_driver(lua_State *L) {
  if (!cl_driver_load()) luaL_error(L, "%s", drv_err);
}

static CUcontext ctx_of(int d) { return __atomic_load_n(&dev_ctx[d], __ATOMIC_ACQUIRE); }
CUcontext cl_ctx_of_device(int d) { return d >= 0 && d < MAXDEV ? ctx_of(d) : NULL; }

/* The primary context, so a host program that uses the runtime API shares memory with us. */
/* (driver calls under `lock` are not parked: a host function the helper ran meanwhile could
   want the lock, compiling with NVRTC say) */
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
  if (dev < 0 || dev >= dev_count) luaL_error(L, "cudalua: device id %d out of range (0..%d)", dev, dev_count - 1);
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
  if (drv_state != 1 || CU0(cuDeviceGet, &dev, tl_dev) != CUDA_SUCCESS) return 0;
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
    if (drv_state == 1 && CU0(cuDeviceGet, &dev, d) == CUDA_SUCCESS)
      CU0(cuDeviceGetAttribute, &a, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev);
    v = a ? 2 : 1;
    __atomic_store_n(&cache[d], v, __ATOMIC_RELAXED);
  }
  return v == 2;
}

static int l_nvrtc_version(lua_State *L) {
  int ma = 0, mi = 0;
  if (!cl_nvrtc_load()) { lua_pushnil(L); lua_pushstring(L, nvrtc_lib.err); return 2; }
  cu.nvrtcVersion(&ma, &mi);
  lua_pushinteger(L, ma); lua_pushinteger(L, mi); lua_pushstring(L, nvrtc_lib.path);
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

static int l_nvrtc_identity(lua_State *L) { push_identity(L, nvrtc_names, "CUDALUA_NVRTC", "nvrtc"); return 1; }
static int l_jitlink_identity(lua_State *L) { push_identity(L, jitlink_names, "CUDALUA_NVJITLINK", "nvjitlink"); return 1; }

/* jitlink_version() -> major, minor, path | nil, why; major 0 when the library is older than
   nvJitLinkVersion (12.3) */
static int l_jitlink_version(lua_State *L) {
  unsigned ma = 0, mi = 0;
  if (!cl_jitlink_load()) { lua_pushnil(L); lua_pushstring(L, jitlink_lib.err); return 2; }
  if (cu.nvJitLinkVersion) cu.nvJitLinkVersion(&ma, &mi);
  lua_pushinteger(L, ma); lua_pushinteger(L, mi); lua_pushstring(L, jitlink_lib.path);
  return 3;
}

/* cuda.sleep(seconds) */
/* The last Lua state using cudalua has closed: every object has been freed, so nothing of
   cudalua's is left on the devices once each has finished its work. The pools give their spare
   memory back and the primary contexts are released (a host program's runtime keeps its own
   reference); a state opened later retains them again. */
void cl_idle_devices(void) {
  if (drv_state != 1) return;
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
  if (drv_state != 1) return;
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
