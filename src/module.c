/* module.c: loaded modules and the kernels in them. A kernel knows its parameters' types, read
   by lua/cudalua/compile.lua from the compiler itself (or from PTX, a mangled name or a
   signature the user gives), as one code letter each:
     a int8  A uint8  s int16  S uint16  i int32  I uint32  l int64  L uint64
     f float  d double  e __half  E __nv_bfloat16  b bool  p pointer  q pointer to const
     c float2 (cuFloatComplex)  C double2 (cuDoubleComplex): a number or {re, im} from Lua
     x anything else, passed by value from a string of its exact size
   and, where only PTX types or sizes are known (modules loaded from files):
     U 8 bytes: an array or an integer address (.u64)   W 4-byte integer of either sign (.u32)
     H 2-byte integer (.u16)   B 1-byte integer or boolean (.u8)
     y a parameter of unknown type: a string of its exact size */
#include <stdlib.h>
#include <string.h>
#include "cl.h"

#define MODULE_MT "cudalua.module"
typedef struct { CUmodule m; CUcontext ctx; } lmodule;

static void unload(lua_State *L, void *mod, void *ctx) {
  cl_host_drain(L);   /* cuModuleUnload waits for the device: L's host functions run first */
  CUcontext prev = cl_ctx_swap(ctx);
  CU(cuModuleUnload, (CUmodule)mod);
  cl_ctx_swap(prev);
}

static int m_close(lua_State *L) {
  lmodule *m = luaL_checkudata(L, 1, MODULE_MT);
  /* kernels keep their module alive through their user value, so this runs only when no
     kernel of it can be launched again; queued launches still finish after unload */
  if (!m->m) return 0;
  /* cuModuleUnload waits for the device: not inside a host function or a capture */
  if (!(cl_must_defer(L) && cl_defer_call(L, 0, unload, m->m, m->ctx))) unload(L, m->m, m->ctx);
  m->m = NULL;
  return 0;
}

/* module_load(image [, hint]) -> module; hint ends the message when the image has no code for
   this device. PTX is compiled by the driver: its log is in the message when that fails. */
static int l_module_load(lua_State *L) {
  size_t n;
  const char *img = luaL_checklstring(L, 1, &n);
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
    return luaL_error(L, "cudalua: cannot load the module on this device (%s): %s%s%s", cl_errname(r),
                      hint, *log ? "\n" : "", log);
  if (r != CUDA_SUCCESS && *log) return luaL_error(L, "cudalua: loading a module: %s\n%s", cl_errname(r), log);
  cl_check(L, r, "loading a module");
  return 1;
}

/* module_functions(module) -> {names of its kernels} | nil when the driver cannot list them */
static int l_module_functions(lua_State *L) {
  lmodule *m = luaL_checkudata(L, 1, MODULE_MT);
  if (!m->m) return luaL_error(L, "cudalua: module is closed");
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

static int code_size(char c) {
  switch (c) {
    case 'a': case 'A': case 'b': case 'B': return 1;
    case 's': case 'S': case 'e': case 'E': case 'H': return 2;
    case 'i': case 'I': case 'f': case 'W': return 4;
    case 'l': case 'L': case 'd': case 'p': case 'q': case 'U': case 'c': return 8;
    case 'C': return 16;
  }
  return 0;
}

static int func_attr(CUfunction f, CUfunction_attribute a) {
  int v = 0;
  return CU0(cuFuncGetAttribute, &v, a, f) == CUDA_SUCCESS ? v : 0;
}

/* module_kernel(module, symbol, codes, info [, verify]) -> kernel; info = {name=, types={...}}.
   codes nil: the parameters' sizes come from the driver (U for 8 bytes, y for the others).
   verify true: codes are the user's word (a signature string) and nothing else says how many
   parameters there are, so the driver is asked whether the kernel has more; an integer: the
   count the image gives, checked already. Asking past the last parameter fails, and checkers
   such as compute-sanitizer report every failed call: it is the last resort */
static int l_module_kernel(lua_State *L) {
  lmodule *m = luaL_checkudata(L, 1, MODULE_MT);
  const char *sym = luaL_checkstring(L, 2);
  size_t nc = 0;
  const char *codes = luaL_optlstring(L, 3, NULL, &nc);
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_Integer known = lua_isinteger(L, 5) ? lua_tointeger(L, 5) : -1;   /* the image's count */
  int verify = known < 0 && lua_toboolean(L, 5);
  if (known > CL_MAXPARAMS) return luaL_error(L, "cudalua: kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
  if (!m->m) return luaL_error(L, "cudalua: module is closed");
  if (nc > CL_MAXPARAMS) return luaL_error(L, "cudalua: kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
  cl_use_ctx(L, m->ctx);
  cl_kernel *k = lua_newuserdatauv(L, sizeof *k, 3);   /* module, info, last launcher */
  memset(k, 0, sizeof *k);
  luaL_setmetatable(L, CL_KERNEL);
  lua_pushvalue(L, 1); lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 4); lua_setiuservalue(L, -2, 2);
  CUresult r = CU(cuModuleGetFunction, &k->fn, m->m, sym);
  if (r == CUDA_ERROR_NOT_FOUND) return luaL_error(L, "cudalua: no kernel '%s' in the module", sym);
  cl_check(L, r, "cuModuleGetFunction");
  k->ctx = m->ctx;
  luaL_getmetatable(L, CL_ARRAY);
  k->array_mt = lua_topointer(L, -1);
  lua_pop(L, 1);
  int have_info = cu.cuFuncGetParamInfo != NULL;
  char derived[CL_MAXPARAMS];
  size_t dps[CL_MAXPARAMS];   /* the sizes the counting learned: not asked again */
  if (!codes) {
    /* no types known: count the parameters by asking for each until the driver says no */
    if (!have_info)
      return luaL_error(L, "cudalua: kernel '%s': this driver cannot tell its parameters: give a "
                        "signature, module:get(name, \"float*, int\")", sym);
    size_t po, ps;
    int words = lua_getfield(L, 4, "types") == LUA_TTABLE;   /* the types, said in words for messages */
    size_t last = known >= 0 ? (size_t)known : CL_MAXPARAMS + 1;   /* known: no asking past it */
    for (nc = 0; nc < last && CU(cuFuncGetParamInfo, k->fn, nc, &po, &ps) == CUDA_SUCCESS; nc++) {
      if (nc == CL_MAXPARAMS) continue;
      derived[nc] = ps == 8 ? 'U' : 'y';
      dps[nc] = ps;
      if (!words) continue;
      if (ps == 8) lua_pushliteral(L, "8 bytes: an array or an integer address");
      else lua_pushfstring(L, "%d bytes of unknown type", (int)ps);
      lua_rawseti(L, -2, (int)nc + 1);
    }
    lua_pop(L, 1);
    if (nc > CL_MAXPARAMS) return luaL_error(L, "cudalua: kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
    if (known >= 0 && nc != (size_t)known)
      return luaL_error(L, "cudalua: kernel '%s': the driver reports %d parameters, the image %d", sym, (int)nc, (int)known);
    codes = derived;
  }
  k->nparams = (int)nc;
  /* the driver knows each parameter's size: check the codes against it */
  for (int i = 0; i < (int)nc; i++) {
    size_t po = 0, ps = 0;   /* the offset comes with the size; launches need only the size */
    k->ptype[i] = codes[i];
    int sz = code_size(codes[i]);
    if (have_info) {
      if (codes == derived) ps = dps[i];
      else if (CU(cuFuncGetParamInfo, k->fn, i, &po, &ps) != CUDA_SUCCESS)
        return luaL_error(L, "cudalua: kernel '%s': the driver reports fewer parameters than %d", sym, (int)nc);
      if (sz && (size_t)sz != ps)
        return luaL_error(L, "cudalua: kernel '%s': parameter %d is %d bytes, the driver says %d",
                          sym, i + 1, sz, (int)ps);
      sz = (int)ps;
    } else if (!sz) {
      return luaL_error(L, "cudalua: kernel '%s': parameter %d is passed by value and this driver "
                        "cannot tell its size", sym, i + 1);
    }
    k->psize[i] = (unsigned short)sz;
  }
  if (have_info && verify) {
    size_t po, ps;
    if (CU(cuFuncGetParamInfo, k->fn, (int)nc, &po, &ps) == CUDA_SUCCESS)
      return luaL_error(L, "cudalua: kernel '%s': the driver reports more parameters than %d", sym, (int)nc);
  }
  /* what launches check without a driver call: shared memory, the binary's architecture and
     compile-time cluster dimensions */
  k->static_shared = func_attr(k->fn, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  k->binary_version = func_attr(k->fn, CU_FUNC_ATTRIBUTE_BINARY_VERSION);
  cl_kernel_refresh(k);
  return 1;
}

unsigned cl_fattr_gen;

/* the settable attributes launches check without a driver call, read again; the occupancy
   caches start over */
void cl_kernel_refresh(cl_kernel *k) {
  k->fattr_gen = __atomic_load_n(&cl_fattr_gen, __ATOMIC_RELAXED);
  k->dyn_max = (unsigned)func_attr(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
  k->req_cluster[0] = (unsigned)func_attr(k->fn, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH);
  k->req_cluster[1] = (unsigned)func_attr(k->fn, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT);
  k->req_cluster[2] = (unsigned)func_attr(k->fn, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH);
  k->occ_block = 0;
  k->coop_threads = 0;
}

cl_kernel *cl_checkkernel(lua_State *L, int idx) {
  cl_kernel *k = luaL_checkudata(L, idx, CL_KERNEL);
  return k;
}

/* the function attributes, by the names k:attributes() and k:set_attribute() use; newer ones
   (cluster attributes: CUDA 11.8) are left out where the driver does not know them */
enum { RO, RW, RO_NEW, RW_NEW };
static const struct { const char *n; CUfunction_attribute a; int kind; } fattrs[] = {
  {"max_threads_per_block", CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, RO},
  {"shared_size_bytes", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, RO},
  {"const_size_bytes", CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, RO},
  {"local_size_bytes", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, RO},
  {"num_regs", CU_FUNC_ATTRIBUTE_NUM_REGS, RO},
  {"ptx_version", CU_FUNC_ATTRIBUTE_PTX_VERSION, RO},
  {"binary_version", CU_FUNC_ATTRIBUTE_BINARY_VERSION, RO},
  {"cache_mode_ca", CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, RO},
  {"max_dynamic_shared_size_bytes", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, RW},
  {"preferred_shared_memory_carveout", CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, RW},
  {"cluster_size_must_be_set", CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET, RO_NEW},
  {"required_cluster_width", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, RW_NEW},
  {"required_cluster_height", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, RW_NEW},
  {"required_cluster_depth", CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH, RW_NEW},
  {"non_portable_cluster_size_allowed", CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, RW_NEW},
  {"cluster_scheduling_policy_preference", CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, RW_NEW}};
#define NFATTRS (sizeof fattrs / sizeof fattrs[0])
static const char *const cache_configs[] = {"prefer_none", "prefer_shared", "prefer_l1", "prefer_equal", NULL};
static const CUfunc_cache cache_values[] = {CU_FUNC_CACHE_PREFER_NONE, CU_FUNC_CACHE_PREFER_SHARED,
                                            CU_FUNC_CACHE_PREFER_L1, CU_FUNC_CACHE_PREFER_EQUAL};

/* k:attributes() -> {name = value}: registers, memory sizes, versions, shared memory and
   cluster settings, and the cache preference last set */
static int k_attributes(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  cl_kernel_ctx(L, k);
  lua_createtable(L, 0, NFATTRS + 1);
  for (size_t i = 0; i < NFATTRS; i++) {
    int v = 0;
    CUresult r = CU(cuFuncGetAttribute, &v, fattrs[i].a, k->fn);
    if (r == CUDA_ERROR_INVALID_VALUE && fattrs[i].kind >= RO_NEW) continue;
    cl_check(L, r, "kernel:attributes");
    lua_pushinteger(L, v);
    lua_setfield(L, -2, fattrs[i].n);
  }
  lua_pushstring(L, cache_configs[k->cache_config]);
  lua_setfield(L, -2, "cache_config");
  return 1;
}

/* k:set_attribute(name, value): the writable function attributes, and cache_config */
static int k_set_attribute(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  const char *name = luaL_checkstring(L, 2);
  cl_kernel_ctx(L, k);
  if (!strcmp(name, "cache_config")) {
    int c = luaL_checkoption(L, 3, NULL, cache_configs);
    cl_check(L, CU(cuFuncSetCacheConfig, k->fn, cache_values[c]), "kernel:set_attribute('cache_config')");
    k->cache_config = (unsigned char)c;
    __atomic_fetch_add(&cl_fattr_gen, 1, __ATOMIC_RELAXED);
    cl_kernel_refresh(k);
    return 0;
  }
  size_t i = 0;
  while (i < NFATTRS && strcmp(fattrs[i].n, name)) i++;
  if (i == NFATTRS || fattrs[i].kind == RO || fattrs[i].kind == RO_NEW) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t j = 0; j < NFATTRS; j++)
      if (fattrs[j].kind == RW || fattrs[j].kind == RW_NEW) { luaL_addstring(&b, fattrs[j].n); luaL_addstring(&b, ", "); }
    luaL_addstring(&b, "cache_config");
    luaL_pushresult(&b);
    return luaL_error(L, "cudalua: kernel:set_attribute: %s '%s' (writable: %s)",
                      i == NFATTRS ? "unknown attribute" : "read-only attribute", name, lua_tostring(L, -1));
  }
  int v;
  /* a boolean for the one flag, integers for the sizes (true is not the size 1) */
  int flag = !strcmp(name, "non_portable_cluster_size_allowed");
  if (flag) {
    if (lua_type(L, 3) == LUA_TBOOLEAN) v = lua_toboolean(L, 3);
    else {
      int isint;
      lua_Integer x = lua_tointegerx(L, 3, &isint);
      if (!isint || (x != 0 && x != 1))
        return luaL_error(L, "cudalua: kernel:set_attribute('%s'): expected a boolean (or 0 or 1), got %s", name,
                          luaL_tolstring(L, 3, NULL));
      v = (int)x;
    }
  } else {
    int isint;
    lua_Integer x = lua_tointegerx(L, 3, &isint);
    if (!isint || x < -1 || x > 0x7fffffff)
      return luaL_error(L, "cudalua: kernel:set_attribute('%s'): expected an integer >= -1, got %s", name,
                        luaL_tolstring(L, 3, NULL));
    v = (int)x;
  }
  CUresult r = CU(cuFuncSetAttribute, k->fn, fattrs[i].a, v);
  if (r != CUDA_SUCCESS) cl_check(L, r, lua_pushfstring(L, "kernel:set_attribute('%s', %d)", name, v));
  __atomic_fetch_add(&cl_fattr_gen, 1, __ATOMIC_RELAXED);   /* occupancy depends on these */
  cl_kernel_refresh(k);
  return 0;
}

/* the occupancy calculator's grid and block for a dynamic shared size, cached per kernel */
void cl_kernel_occupancy(lua_State *L, cl_kernel *k, size_t shared) {
  CL_KERNEL_FRESH(k);
  if (k->occ_block && k->occ_shared == shared) return;
  int g = 0, b = 0;
  cl_kernel_ctx(L, k);
  cl_check(L, CU(cuOccupancyMaxPotentialBlockSize, &g, &b, k->fn, NULL, shared, 0),
           "cuOccupancyMaxPotentialBlockSize");
  k->occ_grid = g; k->occ_block = b; k->occ_shared = shared;
}

/* occupancy(k, shared) -> min grid size, block size */
static int k_occupancy(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  lua_Integer shared = luaL_optinteger(L, 2, 0);
  luaL_argcheck(L, shared >= 0 && shared <= 0x7fffffff, 2, "shared memory size must be >= 0");
  cl_kernel_shared(L, k, 1, (unsigned)shared);
  cl_kernel_occupancy(L, k, (size_t)shared);
  lua_pushinteger(L, k->occ_grid);
  lua_pushinteger(L, k->occ_block);
  return 2;
}

static int k_info(lua_State *L) {
  cl_checkkernel(L, 1);
  lua_getiuservalue(L, 1, 2);
  return 1;
}

/* the CUfunction, as an integer, for C code that launches the kernel itself */
static int k_handle(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  lua_pushinteger(L, (lua_Integer)(uintptr_t)k->fn);
  return 1;
}

static int k_tostring(lua_State *L) {
  luaL_checkudata(L, 1, CL_KERNEL);
  lua_pushfstring(L, "cudalua.kernel<%s>", cl_kernel_name(L, 1));
  return 1;
}


void cl_open_module(lua_State *L) {
  luaL_newmetatable(L, MODULE_MT);
  lua_pushcfunction(L, m_close); lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, CL_KERNEL);
  lua_pushcfunction(L, cl_kernel_index); lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, k_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  static const luaL_Reg methods[] = {
    {"attributes", k_attributes}, {"set_attribute", k_set_attribute}, {"occupancy", k_occupancy}, {"info", k_info},
    {"handle", k_handle}, {NULL, NULL}};
  /* kernel methods live in a table Lua can extend (methods are added from launch.c) */
  luaL_newlib(L, methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_setfield(L, -2, "kernel_methods");
  lua_pushcfunction(L, l_module_load); lua_setfield(L, -2, "module_load");
  lua_pushcfunction(L, l_module_kernel); lua_setfield(L, -2, "module_kernel");
  lua_pushcfunction(L, l_module_functions); lua_setfield(L, -2, "module_functions");
}
