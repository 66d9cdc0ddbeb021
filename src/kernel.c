/* kernel.c: the kernel type. A kernel is a function of a loaded module (module.c finds it and
   makes the object here), with its parameters' types and the attributes launches check without
   a driver call; its methods describe it (attributes, occupancy). Launching is the layers above
   (args.c, launch.c for k:launch, launcher.c for k[{grid, block}](...) and k:forall), with
   configurations from config.c, below.
   A kernel knows its parameters' types, read by lua/cudalua/compile.lua from the compiler
   itself (or from PTX, a mangled name or a signature the user gives), as one code letter each.
   cl_params lists the letters, each once; the Lua parts read its names (core.param_types):
     a int8  A uint8  s int16  S uint16  i int32  I uint32  l int64  L uint64
     f float  d double  e __half  E __nv_bfloat16  b bool  p pointer  q pointer to const
     c float2 (cuFloatComplex)  C double2 (cuDoubleComplex): a number or {re, im} from Lua
     x anything else, passed by value from a string of its exact size
   and, where only PTX types or sizes are known (modules loaded from files):
     U 8 bytes: an array or an integer address (.u64)   W 4-byte integer of either sign (.u32)
     H 2-byte integer (.u16)   B 1-byte integer or boolean (.u8)
     y a parameter of unknown type: a string of its exact size */
#include <string.h>
#include "cl.h"

#define V CL_PARAM_VALUE
const cl_param_kind cl_params[] = {
  /* code, how, size, dtype, dtype_neg, bools, mangled, declared, ptx */
  {'a', V, 1, CL_I8, -1, 0, "char,signed char", "int8_t", ""},
  {'A', V, 1, CL_U8, -1, 0, "unsigned char", "uint8_t", ""},
  {'s', V, 2, CL_I16, -1, 0, "short", "int16_t", ""},
  {'S', V, 2, CL_U16, -1, 0, "unsigned short", "uint16_t", ""},
  {'i', V, 4, CL_I32, -1, 0, "int", "int32_t", ""},
  {'I', V, 4, CL_U32, -1, 0, "unsigned int", "uint32_t", ""},
  {'l', V, 8, CL_I64, -1, 0, "long,long long", "int64_t,ptrdiff_t,intptr_t,ssize_t", ""},
  {'L', V, 8, CL_U64, -1, 0, "unsigned long,unsigned long long",
   "uint64_t,size_t,uintptr_t,cudaTextureObject_t,cudaSurfaceObject_t,CUtexObject,CUsurfObject", ""},
  {'f', V, 4, CL_F32, -1, 0, "float", "float", "f32"},
  {'d', V, 8, CL_F64, -1, 0, "double", "double", "f64"},
  {'e', V, 2, CL_F16, -1, 0, "__half,_Float16", "__half,half", "f16"},
  {'E', V, 2, CL_BF16, -1, 0, "__nv_bfloat16", "__nv_bfloat16,nv_bfloat16", "bf16"},
  {'b', V, 1, CL_BOOL, -1, 1, "bool", "bool", ""},
  {'c', CL_PARAM_COMPLEX, 8, CL_C64, -1, 0, "float2", "float2,cuFloatComplex,cuComplex", ""},
  {'C', CL_PARAM_COMPLEX, 16, CL_C128, -1, 0, "double2", "double2,cuDoubleComplex", ""},
  {'p', CL_PARAM_ARRAY, 8, -1, -1, 0, "", "", ""},
  {'q', CL_PARAM_CONST_ARRAY, 8, -1, -1, 0, "", "", ""},
  {'x', CL_PARAM_BYTES, 0, -1, -1, 0, "", "", ""},
  /* PTX types say the width, not the sign: either sign's range */
  {'U', CL_PARAM_ADDRESS, 8, -1, -1, 0, "", "", "u64,s64,b64"},
  {'W', V, 4, CL_U32, CL_I32, 0, "", "", "u32,s32,b32"},
  {'H', V, 2, CL_U16, CL_I16, 0, "", "", "u16,s16,b16"},
  {'B', V, 1, CL_U8, CL_I8, 1, "", "", "u8,s8,b8"},
  {'y', CL_PARAM_UNKNOWN, 0, -1, -1, 0, "", "", ""},
  {0, 0, 0, -1, -1, 0, NULL, NULL, NULL}
};
#undef V

/* the row of code c; -1: none */
static int param_row(char c) {
  for (int r = 0; cl_params[r].code; r++)
    if (cl_params[r].code == c) return r;
  return -1;
}

static int func_attr(CUfunction f, CUfunction_attribute a) {
  int v = 0;
  return CU0(cuFuncGetAttribute, &v, a, f) == CUDA_SUCCESS ? v : 0;
}

cl_kernel *cl_kernel_new(lua_State *L, CUfunction fn, CUcontext ctx, int modidx, int infoidx) {
  modidx = lua_absindex(L, modidx);
  infoidx = lua_absindex(L, infoidx);
  cl_kernel *k = lua_newuserdatauv(L, sizeof *k, 3);   /* module, info, last launcher */
  memset(k, 0, sizeof *k);
  luaL_setmetatable(L, CL_KERNEL);
  lua_pushvalue(L, modidx); lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, infoidx); lua_setiuservalue(L, -2, 2);
  k->fn = fn;
  k->ctx = ctx;
  luaL_getmetatable(L, CL_ARRAY);
  k->array_mt = lua_topointer(L, -1);
  lua_pop(L, 1);
  return k;
}

/* no types known: count the parameters by asking for each until the driver says no; their
   codes (U for 8 bytes, y for the others) into codes and sizes into sizes, and said in words
   into the info table's types for messages. known >= 0: the image's count, not asked past */
static size_t count_params(lua_State *L, cl_kernel *k, int infoidx, const char *sym,
                           lua_Integer known, char *codes, size_t *sizes) {
  if (!cu.cuFuncGetParamInfo)
    cl_error_named(L, "kernel '%s': this driver cannot tell its parameters: give a "
               "signature, module:get(name, \"float*, int\")", sym);
  size_t nc, po, ps;
  int words = lua_getfield(L, infoidx, "types") == LUA_TTABLE;   /* the types, said in words for messages */
  size_t last = known >= 0 ? (size_t)known : CL_MAXPARAMS + 1;   /* known: no asking past it */
  for (nc = 0; nc < last && CU(cuFuncGetParamInfo, k->fn, nc, &po, &ps) == CUDA_SUCCESS; nc++) {
    if (nc == CL_MAXPARAMS) continue;
    codes[nc] = ps == 8 ? 'U' : 'y';
    sizes[nc] = ps;
    if (!words) continue;
    if (ps == 8) lua_pushliteral(L, "8 bytes: an array or an integer address");
    else lua_pushfstring(L, "%d bytes of unknown type", (int)ps);
    lua_rawseti(L, -2, (int)nc + 1);
  }
  lua_pop(L, 1);
  if (nc > CL_MAXPARAMS) cl_error_named(L, "kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
  if (known >= 0 && nc != (size_t)known)
    cl_error_named(L, "kernel '%s': the driver reports %d parameters, the image %d", sym, (int)nc, (int)known);
  return nc;
}

/* the codes into the kernel, each with its size; the driver knows each parameter's size
   (sizes: what counting learned, not asked again): the codes are checked against it */
static void set_params(lua_State *L, cl_kernel *k, const char *sym, const char *codes, size_t nc,
                       const size_t *sizes) {
  int have_info = cu.cuFuncGetParamInfo != NULL;
  k->nparams = (int)nc;
  for (int i = 0; i < (int)nc; i++) {
    size_t po = 0, ps = 0;   /* the offset comes with the size; launches need only the size */
    int r = param_row(codes[i]);
    if (r < 0) cl_error_named(L, "kernel '%s': parameter %d has no type code '%c'", sym, i + 1, codes[i]);
    k->ptype[i] = (unsigned char)r;
    int sz = cl_params[r].size;
    if (have_info) {
      if (sizes) ps = sizes[i];
      else if (CU(cuFuncGetParamInfo, k->fn, i, &po, &ps) != CUDA_SUCCESS)
        cl_error_named(L, "kernel '%s': the driver reports fewer parameters than %d", sym, (int)nc);
      if (sz && (size_t)sz != ps)
        cl_error_named(L, "kernel '%s': parameter %d is %d bytes, the driver says %d",
                   sym, i + 1, sz, (int)ps);
      sz = (int)ps;
    } else if (!sz) {
      cl_error_named(L, "kernel '%s': parameter %d is passed by value and this driver "
                 "cannot tell its size", sym, i + 1);
    }
    k->psize[i] = (unsigned short)sz;
  }
}

void cl_kernel_describe(lua_State *L, cl_kernel *k, int infoidx, const char *sym, const char *codes,
                        size_t nc, lua_Integer known, int verify) {
  char derived[CL_MAXPARAMS];
  size_t sizes[CL_MAXPARAMS];
  if (!codes) {
    nc = count_params(L, k, infoidx, sym, known, derived, sizes);
    set_params(L, k, sym, derived, nc, sizes);
  } else {
    set_params(L, k, sym, codes, nc, NULL);
  }
  if (cu.cuFuncGetParamInfo && verify) {
    size_t po, ps;
    if (CU(cuFuncGetParamInfo, k->fn, (int)nc, &po, &ps) == CUDA_SUCCESS)
      cl_error_named(L, "kernel '%s': the driver reports more parameters than %d", sym, (int)nc);
  }
  /* what launches check without a driver call: shared memory, the binary's architecture and
     compile-time cluster dimensions */
  k->static_shared = func_attr(k->fn, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  k->binary_version = func_attr(k->fn, CU_FUNC_ATTRIBUTE_BINARY_VERSION);
  cl_kernel_refresh(k);
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
  cl_kernel *k = cl_checkudata(L, idx, CL_KERNEL);
  return k;
}

int cl_kernel_at(lua_State *L, int kidx) {
  if (luaL_testudata(L, kidx, CL_LAUNCHER)) { lua_getiuservalue(L, kidx, 1); kidx = lua_gettop(L); }
  return kidx;
}

/* the kernel's name, for messages (slow path only) */
const char *cl_kernel_name(lua_State *L, int kidx) {
  kidx = cl_kernel_at(L, kidx);
  if (lua_getiuservalue(L, kidx, 2) != LUA_TTABLE) return "?";   /* not a kernel */
  lua_getfield(L, -1, "name");
  return lua_isstring(L, -1) ? lua_tostring(L, -1) : "?";
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
  int how = 0;   /* the CPU device: how a block's threads run (a loop, fibers or coroutines) */
  static const char *const hows[] = {"loop", "fibers", "coroutines"};
  if (cl_cpu_symbol(NULL) && CU(cuFuncGetAttribute, &how, CL_CPU_FUNC_THREADS, k->fn) == CUDA_SUCCESS && how >= 0 && how < 3) {
    lua_pushstring(L, hows[how]);
    lua_setfield(L, -2, "cpu_threads");
  }
  return 1;
}

/* raises for a name k:set_attribute does not take, listing those it does */
static int not_writable(lua_State *L, const char *name, int unknown) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t j = 0; j < NFATTRS; j++)
    if (fattrs[j].kind == RW || fattrs[j].kind == RW_NEW) { luaL_addstring(&b, fattrs[j].n); luaL_addstring(&b, ", "); }
  luaL_addstring(&b, "cache_config");
  luaL_pushresult(&b);
  return cl_error(L, "kernel:set_attribute", "%s '%s' (writable: %s)",
                    unknown ? "unknown attribute" : "read-only attribute", name, lua_tostring(L, -1));
}

/* k:set_attribute's value: a boolean for the one flag, integers for the sizes (true is not
   the size 1) */
static int attribute_value(lua_State *L, const char *name) {
  int isint;
  lua_Integer x;
  if (!strcmp(name, "non_portable_cluster_size_allowed")) {
    if (lua_type(L, 3) == LUA_TBOOLEAN) return lua_toboolean(L, 3);
    x = lua_tointegerx(L, 3, &isint);
    if (!isint || (x != 0 && x != 1))
      cl_error_named(L, "kernel:set_attribute('%s'): expected a boolean (or 0 or 1), got %s", name,
                 luaL_tolstring(L, 3, NULL));
    return (int)x;
  }
  x = lua_tointegerx(L, 3, &isint);
  if (!isint || x < -1 || x > 0x7fffffff)
    cl_error_named(L, "kernel:set_attribute('%s'): expected an integer >= -1, got %s", name,
               luaL_tolstring(L, 3, NULL));
  return (int)x;
}

/* k:set_attribute(name, value): the writable function attributes, and cache_config */
static int k_set_attribute(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  const char *name = cl_checklstring(L, 2, NULL);
  cl_kernel_ctx(L, k);
  if (!strcmp(name, "cache_config")) {
    int c = cl_checkoption(L, 3, NULL, cache_configs);
    cl_check(L, CU(cuFuncSetCacheConfig, k->fn, cache_values[c]), "kernel:set_attribute('cache_config')");
    k->cache_config = (unsigned char)c;
    __atomic_fetch_add(&cl_fattr_gen, 1, __ATOMIC_RELAXED);
    cl_kernel_refresh(k);
    return 0;
  }
  size_t i = 0;
  while (i < NFATTRS && strcmp(fattrs[i].n, name)) i++;
  if (i == NFATTRS || fattrs[i].kind == RO || fattrs[i].kind == RO_NEW) return not_writable(L, name, i == NFATTRS);
  int v = attribute_value(L, name);
  CUresult r = CU(cuFuncSetAttribute, k->fn, fattrs[i].a, v);
  if (r != CUDA_SUCCESS) cl_check(L, r, lua_pushfstring(L, "kernel:set_attribute('%s', %d)", name, v));
  __atomic_fetch_add(&cl_fattr_gen, 1, __ATOMIC_RELAXED);   /* occupancy depends on these */
  cl_kernel_refresh(k);
  return 0;
}

/* dynamic shared memory over what the kernel may use now (48 KiB less its static shared
   memory, to begin with): the kernel is opted in for that size, once, up to the device's
   opt-in limit */
void cl_kernel_shared(lua_State *L, cl_kernel *k, int kidx, unsigned shared) {
  if (shared <= k->dyn_max) return;
  cl_kernel_ctx(L, k);
  int optin = 0;
  CUdevice dev;
  if (CU0(cuCtxGetDevice, &dev) == CUDA_SUCCESS)
    CU0(cuDeviceGetAttribute, &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  if ((long long)shared + k->static_shared > optin)
    cl_error_named(L, "kernel '%s': %d bytes of dynamic shared memory asked for; with its %d "
               "bytes of static shared memory this device allows at most %d (its opt-in limit per block is %d)",
               cl_kernel_name(L, kidx), (int)shared, k->static_shared,
               optin > k->static_shared ? optin - k->static_shared : 0, optin);
  /* the attribute belongs to the function, which other kernel objects (the same symbol got
     with another signature) share: it is only ever raised */
  int now = 0;
  CU(cuFuncGetAttribute, &now, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k->fn);
  if ((unsigned)now < shared) {
    CUresult r = CU(cuFuncSetAttribute, k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shared);
    if (r != CUDA_SUCCESS)
      cl_error_named(L, "kernel '%s': cannot opt in to %d bytes of dynamic shared memory: %s",
                 cl_kernel_name(L, kidx), (int)shared, cl_errname(r));
    now = (int)shared;
  }
  k->dyn_max = (unsigned)now;
  k->occ_block = 0;
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
  lua_Integer shared = cl_optinteger(L, 2, 0);
  cl_argcheck(L, shared >= 0 && shared <= 0x7fffffff, 2, "shared memory size must be >= 0");
  cl_kernel_shared(L, k, 1, (unsigned)shared);
  cl_kernel_occupancy(L, k, (size_t)shared);
  lua_pushinteger(L, k->occ_grid);
  lua_pushinteger(L, k->occ_block);
  return 2;
}

/* k:max_blocks_per_sm(block [, shared]) */
static int k_max_blocks(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  lua_Integer b = cl_checkinteger(L, 2);
  unsigned shared = cl_launch_shared(L, 3, NULL);
  cl_argcheck(L, b >= 1 && b <= 1024, 2, "block size must be 1..1024");
  int nb = 0;
  cl_kernel_shared(L, k, 1, shared);
  cl_kernel_ctx(L, k);
  cl_check(L, CU(cuOccupancyMaxActiveBlocksPerMultiprocessor, &nb, k->fn, (int)b, shared),
           NULL);
  lua_pushinteger(L, nb);
  return 1;
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
  cl_checkudata(L, 1, CL_KERNEL);
  lua_pushfstring(L, "cudalua.kernel<%s>", cl_kernel_name(L, 1));
  return 1;
}

/* k(...) without a configuration */
static int k_call(lua_State *L) {
  if (!luaL_testudata(L, 1, CL_KERNEL))
    return cl_error(L, "kernel:__call", "expected a kernel, got %s", luaL_typename(L, 1));
  return cl_error_named(L, "kernel '%s' needs a launch configuration: k[{grid, block}](...)",
                    cl_kernel_name(L, 1));
}

/* the methods, then k.name; launcher.c puts its own __index in front of this one for
   k[{grid, block}] */
int cl_kernel_index(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TNIL) return 1;
  if (lua_type(L, 2) == LUA_TSTRING && !strcmp(lua_tostring(L, 2), "name")) {
    cl_kernel_name(L, 1);
    return 1;
  }
  return cl_error(L, NULL, "kernels have no field '%s' (launch with k[{grid, block}](...))",
                    luaL_tolstring(L, 2, NULL));
}

/* core.param_types: {mangled = {name = code}, declared = ..., ptx = ...}, the names of
   cl_params's three columns, for the Lua parts that read types (signature.lua, module.lua) */
static void push_param_names(lua_State *L) {
  static const char *const columns[] = {"mangled", "declared", "ptx"};
  lua_createtable(L, 0, 3);
  for (int col = 0; col < 3; col++) {
    lua_newtable(L);
    for (const cl_param_kind *k = cl_params; k->code; k++) {
      const char *s = col == 0 ? k->mangled : col == 1 ? k->declared : k->ptx;
      while (*s) {
        const char *e = strchr(s, ',');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        lua_pushlstring(L, s, n);
        lua_pushlstring(L, &k->code, 1);
        lua_rawset(L, -3);
        s += n + (e != NULL);
      }
    }
    lua_setfield(L, -2, columns[col]);
  }
}

void cl_open_kernel(lua_State *L) {
  push_param_names(L);
  lua_setfield(L, -2, "param_types");
  static const luaL_Reg mt[] = {{"__tostring", k_tostring}, {"__call", k_call}, {NULL, NULL}};
  static const luaL_Reg methods[] = {
    {"attributes", k_attributes}, {"set_attribute", k_set_attribute}, {"occupancy", k_occupancy}, {"info", k_info},
    {"handle", k_handle}, {"max_blocks_per_sm", k_max_blocks}, {NULL, NULL}};
  /* kernel methods live in a table Lua can extend (launch.c and launcher.c add theirs), kept in
     the registry as CL_KERNEL ".methods", where cl_kernel_index reads them (launcher.c's
     __index, put in front of this one, calls it rather than taking it as an upvalue) */
  cl_class_define(L, &(cl_class){CL_KERNEL, methods, cl_kernel_index, mt, NULL});
  lua_getfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_setfield(L, -2, "kernel_methods");
}
