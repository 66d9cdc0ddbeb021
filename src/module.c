/* module.c: loaded modules and the kernels in them: module_kernel finds a kernel's function in
   a module, and kernel.c makes the kernel object (its parameters' codes are listed there). */
#define _GNU_SOURCE   /* memmem */
#include <stdlib.h>
#include <string.h>
#include "cl.h"

/* one device's loaded CUmodule; the user's module object is lua/cudalua/module.lua's
   "cudalua.module", which keeps one of these a device */
#define MODULE_MT "cudalua.loaded_module"
typedef struct { CUmodule m; CUcontext ctx; } lmodule;

static void unload(lua_State *L, void *mod, void *ctx) {
  cl_host_drain(L);   /* cuModuleUnload waits for the device: L's host functions run first */
  CUcontext prev = cl_ctx_swap(ctx);
  CU(cuModuleUnload, (CUmodule)mod);
  cl_ctx_swap(prev);
}

static int m_close(lua_State *L) {
  lmodule *m = cl_checkudata(L, 1, MODULE_MT);
  /* kernels keep their module alive through their user value, so this runs only when no
     kernel of it can be launched again; queued launches still finish after unload */
  if (!m->m) return 0;
  /* cuModuleUnload waits for the device: not inside a host function or a capture */
  if (!(cl_must_defer(L) && cl_defer_call(L, 0, unload, m->m, m->ctx))) unload(L, m->m, m->ctx);
  m->m = NULL;
  return 0;
}

/* devices with code loaded that uses the device runtime (dynamic parallelism): cuda.set_limit
   refuses the limits whose change then hung the driver (device.c) */
static int devrt_loaded[CL_MAXDEV];

/* whether the image calls the device runtime: a linked cubin has its functions' names */
static int uses_devrt(const char *img, size_t n) {
  static const char mark[] = "__cudaCDP2";
  return n >= sizeof mark - 1 && memmem(img, n, mark, sizeof mark - 1) != NULL;
}

int cl_module_devrt_loaded(CUcontext ctx) {
  int dev = cl_device_of(ctx);
  return dev >= 0 && dev < CL_MAXDEV && __atomic_load_n(&devrt_loaded[dev], __ATOMIC_RELAXED);
}

/* module_load(image [, hint]) -> module; hint ends the message when the image has no code for
   this device. PTX is compiled by the driver: its log is in the message when that fails. */
static int l_module_load(lua_State *L) {
  size_t n;
  const char *img = cl_checklstring(L, 1, &n);
  const char *hint = luaL_optstring(L, 2, "compile for this device's architecture (leave arch unset)");
  lmodule *m = lua_newuserdatauv(L, sizeof *m, 0);
  m->m = NULL;
  luaL_setmetatable(L, MODULE_MT);
  m->ctx = cl_ctx(L);
  char log[4096];
  log[0] = 0;
  CUjit_option o[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *v[2] = {log, (void *)(uintptr_t)sizeof log};
  /* loading waits for the device while a stream is stopped at a Lua host function (measured:
     cuModuleLoadData blocked behind a stalled stream): the helper thread may run it meanwhile */
  CUresult r = CL_PARKED(L, CL_PARK_WAIT, cu.cuModuleLoadDataEx(&m->m, img, 2, o, v));
  log[sizeof log - 1] = 0;
  if (r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_NO_BINARY_FOR_GPU ||
      r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_INVALID_PTX)
    return cl_error(L, NULL, "cannot load the module on this device (%s): %s%s%s", cl_errname(r),
                      hint, *log ? "\n" : "", log);
  if (r != CUDA_SUCCESS && *log) return cl_error(L, NULL, "loading a module: %s\n%s", cl_errname(r), log);
  cl_check(L, r, "loading a module");
  int dev = cl_device_of(m->ctx);
  if (dev >= 0 && dev < CL_MAXDEV && uses_devrt(img, n)) __atomic_store_n(&devrt_loaded[dev], 1, __ATOMIC_RELAXED);
  return 1;
}

/* module_functions(module) -> {names of its kernels} | nil when the driver cannot list them */
static int l_module_functions(lua_State *L) {
  lmodule *m = cl_checkudata(L, 1, MODULE_MT);
  if (!m->m) return cl_error(L, NULL, "module is closed");
  unsigned n = 0;
  if (!cu.cuModuleGetFunctionCount || !cu.cuModuleEnumerateFunctions || !cu.cuFuncGetName) return 0;
  cl_use_ctx(L, m->ctx);
  if (CU(cuModuleGetFunctionCount, &n, m->m) != CUDA_SUCCESS) return 0;
  CUfunction *f = lua_newuserdatauv(L, sizeof *f * (n ? n : 1), 0);
  if (n) cl_check(L, CU(cuModuleEnumerateFunctions, f, n, m->m), "listing a module's kernels");
  lua_createtable(L, (int)n, 0);
  for (unsigned i = 0; i < n; i++) {
    const char *name = NULL;
    if (CU(cuFuncGetName, &name, f[i]) == CUDA_SUCCESS && name) {
      lua_pushstring(L, name);
      lua_rawseti(L, -2, (int)lua_rawlen(L, -2) + 1);
    }
  }
  return 1;
}

/* module_kernel(module, symbol, codes, info [, verify]) -> kernel; info = {name=, types={...}}.
   codes nil: the parameters' sizes come from the driver (U for 8 bytes, y for the others).
   verify true: codes are the user's word (a signature string) and nothing else says how many
   parameters there are, so the driver is asked whether the kernel has more; an integer: the
   count the image gives, checked already. Asking past the last parameter fails, and checkers
   such as compute-sanitizer report every failed call: it is the last resort */
static int l_module_kernel(lua_State *L) {
  lmodule *m = cl_checkudata(L, 1, MODULE_MT);
  const char *sym = cl_checklstring(L, 2, NULL);
  size_t nc = 0;
  const char *codes = cl_optlstring(L, 3, NULL, &nc);
  cl_checktype(L, 4, LUA_TTABLE);
  lua_Integer known = lua_isinteger(L, 5) ? lua_tointeger(L, 5) : -1;   /* the image's count */
  int verify = known < 0 && lua_toboolean(L, 5);
  if (known > CL_MAXPARAMS) return cl_error_named(L, "kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
  if (!m->m) return cl_error(L, NULL, "module is closed");
  if (nc > CL_MAXPARAMS) return cl_error_named(L, "kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
  cl_use_ctx(L, m->ctx);
  CUfunction fn;
  CUresult r = CU(cuModuleGetFunction, &fn, m->m, sym);
  if (r == CUDA_ERROR_NOT_FOUND) return cl_error(L, NULL, "no kernel '%s' in the module", sym);
  cl_check(L, r, "cuModuleGetFunction");
  cl_kernel *k = cl_kernel_new(L, fn, m->ctx, 1, 4);   /* keeps the module and the info */
  cl_kernel_describe(L, k, 4, sym, codes, nc, known, verify);
  return 1;
}

/* module_global(module, symbol, dtype [, shape]) -> array view | nil (no such variable) |
   false, bytes (the variable's size is not dtype x shape; no shape: not a whole number of
   elements). The view's memory is the module's: never freed by it, and its first user value
   keeps this loaded module (whose __gc unloads it) alive as long as the view lives. */
static int l_module_global(lua_State *L) {
  lmodule *m = cl_checkudata(L, 1, MODULE_MT);
  const char *sym = cl_checklstring(L, 2, NULL);
  int dt = cl_checkdtype(L, 3);
  if (!m->m) return cl_error(L, NULL, "module is closed");
  cl_use_ctx(L, m->ctx);
  CUdeviceptr p = 0;
  size_t bytes = 0;
  CUresult r = CU(cuModuleGetGlobal, &p, &bytes, m->m, sym);
  if (r == CUDA_ERROR_NOT_FOUND) return 0;
  cl_check(L, r, "module:get_global");
  int64_t shape[CL_MAXDIM];
  int ndim = 1;
  size_t isz = (size_t)cl_dtypes[dt].size, n = 1;
  if (lua_isnoneornil(L, 4)) shape[0] = (int64_t)(bytes / isz);
  else ndim = cl_parse_shape(L, 4, shape, "module:get_global");
  if (!cl_shape_mul(&n, ndim, shape) || n * isz != bytes) {
    lua_pushboolean(L, 0);
    lua_pushinteger(L, (lua_Integer)bytes);
    return 2;
  }
  cl_array *a = cl_push_array(L, NULL, 0, CL_FOREIGN, dt, ndim, shape);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  cl_mem *mem = cl_mem_record(L, CL_FOREIGN, bytes, m->ctx);
  mem->dptr = p;
  a->mem = mem;
  return 1;
}

void cl_open_module(lua_State *L) {
  static const luaL_Reg meta[] = {{"__gc", m_close}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){MODULE_MT, NULL, NULL, meta, NULL});
  lua_pushcfunction(L, l_module_load); lua_setfield(L, -2, "module_load");
  lua_pushcfunction(L, l_module_kernel); lua_setfield(L, -2, "module_kernel");
  lua_pushcfunction(L, l_module_functions); lua_setfield(L, -2, "module_functions");
  lua_pushcfunction(L, l_module_global); lua_setfield(L, -2, "module_global");
}
