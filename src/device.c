/* device.c: the system functions of the cuda table: devices, the selected device, peer access,
   synchronize, versions and memory of the driver, and a clock. Entry points over driver.c. */
#include <string.h>
#include <time.h>
#include "cl.h"

/* ---- Lua functions ---- */

static int l_is_available(lua_State *L) {
  lua_pushboolean(L, cl_driver_load());
  return 1;
}

/* cuda.use_cpu(): the CPU device from here on, chosen before the driver is first used (or
   after it was found missing); true. The GPU's driver in use already: an error, as arrays and
   kernels made on the GPU would be mixed with the CPU device's. */
static int l_use_cpu(lua_State *L) {
  if (cl_lib_ok(&cl_libcuda) && cl_cpu_symbol(NULL)) { lua_pushboolean(L, 1); return 1; }
  if (!cl_lib_retry(&cl_libcuda))
    cl_error(L, NULL, "the GPU's driver is in use already: call it before the first use of a device "
             "(or set CUDALUA_DEVICE=cpu)");
  cl_cpu_choose();
  if (!cl_driver_load()) cl_error(L, NULL, "%s", cl_unprefixed(cl_libcuda.err));
  lua_pushboolean(L, 1);
  return 1;
}

/* cuda.launches_block(): do launches return only once their work has run? */
static int l_launches_block(lua_State *L) {
  lua_pushboolean(L, cl_driver_load() && cl_launch_blocks);
  return 1;
}

static int l_driver_error(lua_State *L) {
  if (cl_driver_load()) lua_pushnil(L); else lua_pushstring(L, cl_libcuda.err);
  return 1;
}

static void setint(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v); lua_setfield(L, -2, k);
}

static int l_devices(lua_State *L) {
  cl_need_driver(L);
  int n = cl_ndevices();
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    CUdevice dev; char name[256] = "?"; size_t mem = 0; int ma = 0, mi = 0, sms = 0, pci = 0;
    cl_check(L, CU0(cuDeviceGet, &dev, i), "cuDeviceGet");
    CU0(cuDeviceGetName, name, sizeof name, dev);
    CU0(cuDeviceTotalMem, &mem, dev);
    CU0(cuDeviceGetAttribute, &ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    CU0(cuDeviceGetAttribute, &mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    CU0(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    CU0(cuDeviceGetAttribute, &pci, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    lua_createtable(L, 0, 14);
    setint(L, "id", i);
    lua_pushstring(L, name); lua_setfield(L, -2, "name");
    lua_pushstring(L, cl_cpu_symbol(NULL) ? "cpu" : "gpu"); lua_setfield(L, -2, "kind");
    lua_createtable(L, 2, 0);
    lua_pushinteger(L, ma); lua_rawseti(L, -2, 1);
    lua_pushinteger(L, mi); lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "compute_capability");
    setint(L, "multiprocessors", sms);
    setint(L, "total_memory", (lua_Integer)mem);
    setint(L, "pci_bus_id", pci);
    int v = 0;
    CU0(cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev);
    lua_pushboolean(L, v); lua_setfield(L, -2, "concurrent_managed_access");
    CU0(cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev);
    setint(L, "max_threads_per_block", v);
    CU0(cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, dev);
    setint(L, "max_shared_memory_per_block", v);
    CU0(cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
    setint(L, "max_shared_memory_per_block_optin", v);
    CU0(cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev);
    lua_pushboolean(L, v); lua_setfield(L, -2, "cooperative_launch");
    CU0(cuDeviceGetAttribute, &v, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, dev);
    lua_pushboolean(L, v); lua_setfield(L, -2, "cluster_launch");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int check_device(lua_State *L, int idx) {
  lua_Integer d = cl_checkinteger(L, idx);
  cl_need_driver(L);
  int n = cl_ndevices();
  cl_argcheck(L, d >= 0 && d < n, idx,
                lua_pushfstring(L, "device id %d out of range (0..%d)", (int)d, n - 1));
  return (int)d;
}

static int l_select_device(lua_State *L) {
  int d = check_device(L, 1);
  CUcontext c = cl_device_ctx(L, d);   /* may raise: the selection stays as it was */
  cl_set_current_device(d);
  cl_use_ctx(L, c);
  return 0;
}

/* whether device a's kernels can use device b's memory */
static int can_peer(lua_State *L, int a, int b) {
  int can = 0;
  if (a == b) return 1;
  CUdevice da, db;
  cl_check(L, CU0(cuDeviceGet, &da, a), "cuDeviceGet");
  cl_check(L, CU0(cuDeviceGet, &db, b), "cuDeviceGet");
  cl_check(L, CU(cuDeviceCanAccessPeer, &can, da, db), NULL);
  return can;
}

/* can_access_peer(a, b) -> true when device a's kernels can use device b's memory */
static int l_can_access_peer(lua_State *L) {
  int a = check_device(L, 1), b = check_device(L, 2);
  lua_pushboolean(L, can_peer(L, a, b));
  return 1;
}

/* device a's access to the memory of device b's default pool */
static CUresult pool_access(lua_State *L, int a, int b, CUmemAccess_flags flags) {
  CUdevice db;
  CUmemoryPool pool;
  CUresult r = CU0(cuDeviceGet, &db, b);
  if (r == CUDA_SUCCESS) r = CU(cuDeviceGetDefaultMemPool, &pool, db);
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = a;
  d.flags = flags;
  if (r == CUDA_SUCCESS) r = CU(cuMemPoolSetAccess, pool, &d, 1);
  return r;
}

/* enable_peer_access(a, b): device a's kernels may use device b's memory from now on */
static int l_enable_peer_access(lua_State *L) {
  int a = check_device(L, 1), b = check_device(L, 2);
  if (a == b || cl_peer_enabled_dev(a, b)) return 0;
  if (!can_peer(L, a, b))
    return cl_error(L, "cuda.enable_peer_access", "device %d cannot reach device %d's memory "
                      "(cuda.can_access_peer(%d, %d) is false); copies between them still work", a, b, a, b);
  CUcontext ca = cl_device_ctx(L, a), cb = cl_device_ctx(L, b);
  CUcontext prev = cl_ctx_swap(ca);
  CUresult r = CU(cuCtxEnablePeerAccess, cb, 0);
  cl_ctx_swap(prev);
  if (r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) cl_check(L, r, NULL);
  /* device arrays come from b's stream-ordered pool, which peer access does not cover: its
     memory is opened to device a as well */
  cl_check(L, pool_access(L, a, b, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), "enable_peer_access (memory pool)");
  cl_peer_set(a, b, 1);
  return 0;
}

/* disable_peer_access(a, b) */
static int l_disable_peer_access(lua_State *L) {
  int a = check_device(L, 1), b = check_device(L, 2);
  if (a == b || !cl_peer_enabled_dev(a, b)) return 0;
  CUcontext ca = cl_device_ctx(L, a), cb = cl_device_ctx(L, b);
  CUcontext prev = cl_ctx_swap(ca);
  CUresult r = CU(cuCtxDisablePeerAccess, cb);
  cl_ctx_swap(prev);
  if (r != CUDA_ERROR_PEER_ACCESS_NOT_ENABLED) cl_check(L, r, NULL);
  cl_check(L, pool_access(L, a, b, CU_MEM_ACCESS_FLAGS_PROT_NONE), "disable_peer_access (memory pool)");
  cl_peer_set(a, b, 0);
  return 0;
}

static int l_device_count(lua_State *L) {
  lua_pushinteger(L, cl_ndevices());
  return 1;
}

static int l_current_device(lua_State *L) {
  cl_need_driver(L);
  lua_pushinteger(L, cl_current_device());
  return 1;
}

static int l_synchronize(lua_State *L) {
  if (!lua_isnone(L, 1))
    return cl_error(L, "cuda.synchronize", "takes no arguments, got %s (a stream: stream:synchronize())", luaL_typename(L, 1));
  cl_ctx(L);
  cl_capture_guard(L, NULL, 1, NULL);
  cl_wait(L, CL_WAIT_CTX, NULL, NULL);
  cl_flush_deferred(L);   /* what host functions closed meanwhile: nothing here uses it now */
  return 0;
}

static int l_driver_version(lua_State *L) {
  int v = 0;
  if (!cl_driver_load() || CU0(cuDriverGetVersion, &v) != CUDA_SUCCESS) return 0;
  lua_pushinteger(L, v);
  return 1;
}

static int l_mem_info(lua_State *L) {
  size_t fr = 0, tot = 0;
  cl_ctx(L);
  cl_check(L, CU(cuMemGetInfo, &fr, &tot), "cuMemGetInfo");
  lua_pushinteger(L, (lua_Integer)fr); lua_pushinteger(L, (lua_Integer)tot);
  return 2;
}

/* cuda.time(): a monotonic wall clock in seconds, for timing from Lua (os.clock is CPU time) */
static int l_time(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + ts.tv_nsec * 1e-9);
  return 1;
}


/* cuda.set_limit / cuda.get_limit: the CU_LIMIT_* of the selected device's context, by name.
   Numbers rather than the enum's names, so that cuda.h of an older toolkit compiles this (the
   last three came with CUDA 12.x; the driver refuses what it does not know). */
static const char *const limit_names[] = {
  "stack_size", "printf_fifo_size", "malloc_heap_size", "dev_runtime_sync_depth",
  "dev_runtime_pending_launch_count", "max_l2_fetch_granularity", "persisting_l2_cache_size",
  "shmem_size", "cig_enabled", "cig_shmem_fallback_enabled", NULL};
#define LIMIT_READ_ONLY(i) ((i) == 7 || (i) == 8)   /* shmem_size, cig_enabled: queried only */

static int limit_arg(lua_State *L, const char *where) {
  if (lua_type(L, 1) != LUA_TSTRING)
    return cl_error(L, where, "argument 1: expected a limit's name (\"stack_size\", "
                    "\"dev_runtime_pending_launch_count\"...), got %s", luaL_typename(L, 1));
  const char *name = lua_tostring(L, 1);
  for (int i = 0; limit_names[i]; i++) if (!strcmp(limit_names[i], name)) return i;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; limit_names[i]; i++) {
    if (i) luaL_addstring(&b, ", ");
    luaL_addstring(&b, limit_names[i]);
  }
  luaL_pushresult(&b);
  return cl_error(L, where, "unknown limit '%s' (%s)", name, lua_tostring(L, -1));
}

/* cuda.set_limit(name, value): the driver may round or clamp it; get_limit says what it took */
static int l_set_limit(lua_State *L) {
  int i = limit_arg(L, "cuda.set_limit");
  if (LIMIT_READ_ONLY(i)) return cl_error(L, "cuda.set_limit", "%s can only be read (cuda.get_limit)", limit_names[i]);
  int whole = 0;
  lua_Integer v = lua_type(L, 2) == LUA_TNUMBER ? lua_tointegerx(L, 2, &whole) : 0;
  if (!whole)
    return cl_error(L, "cuda.set_limit", "argument 2: expected an integer (bytes or a count), got %s",
                    lua_type(L, 2) == LUA_TNUMBER ? "a number that is not one" : luaL_typename(L, 2));
  if (v < 0) return cl_error(L, "cuda.set_limit", "%s must be 0 or more, got %I", limit_names[i], v);
  CUcontext ctx = cl_ctx(L);
  /* measured (580.159.04, H100): once a graph had run a kernel that launches kernels, setting
     these never returned, even with the graph closed: refused from the first load of such code */
  if ((i == CU_LIMIT_STACK_SIZE || i == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT ||
       i == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH) && cl_module_devrt_loaded(ctx))
    return cl_error(L, "cuda.set_limit", "%s must be set before code that launches kernels from the device "
                    "(dynamic parallelism) is loaded on this device: the driver can hang otherwise", limit_names[i]);
  cl_check(L, CU(cuCtxSetLimit, (CUlimit)i, (size_t)v), "cuda.set_limit");
  return 0;
}

/* cuda.get_limit(name) -> integer */
static int l_get_limit(lua_State *L) {
  int i = limit_arg(L, "cuda.get_limit");
  size_t v = 0;
  cl_ctx(L);
  cl_check(L, CU(cuCtxGetLimit, &v, (CUlimit)i), "cuda.get_limit");
  lua_pushinteger(L, (lua_Integer)v);
  return 1;
}

void cl_open_device(lua_State *L) {
  static const luaL_Reg f[] = {
    {"is_available", l_is_available}, {"use_cpu", l_use_cpu}, {"driver_error", l_driver_error}, {"launches_block", l_launches_block},
    {"devices", l_devices}, {"select_device", l_select_device},
    {"current_device", l_current_device}, {"synchronize", l_synchronize},
    {"can_access_peer", l_can_access_peer}, {"enable_peer_access", l_enable_peer_access},
    {"disable_peer_access", l_disable_peer_access}, {"device_count", l_device_count},
    {"driver_version", l_driver_version}, {"mem_info", l_mem_info}, {"time", l_time},
    {"set_limit", l_set_limit}, {"get_limit", l_get_limit}, {NULL, NULL}};
  luaL_setfuncs(L, f, 0);
}
