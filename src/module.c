/* module.c: loaded modules and the kernels in them. A kernel knows its parameters' types, read
   by lua/cudalua/compile.lua from the compiler itself, as one code letter each:
     a int8  A uint8  s int16  S uint16  i int32  I uint32  l int64  L uint64
     f float  d double  e __half  E __nv_bfloat16  b bool  p pointer  q pointer to const
     x anything else, passed by value from a string of its exact size */
#include <string.h>
#include "cl.h"

#define MODULE_MT "cudalua.module"
typedef struct { CUmodule m; CUcontext ctx; } lmodule;

static int m_close(lua_State *L) {
  lmodule *m = luaL_checkudata(L, 1, MODULE_MT);
  /* kernels keep their module alive through their user value, so this runs only when no
     kernel of it can be launched again; queued launches still finish after unload */
  if (m->m) {
    CUcontext cur = NULL;
    cu.cuCtxGetCurrent(&cur);
    if (cur != m->ctx) cu.cuCtxSetCurrent(m->ctx);
    cu.cuModuleUnload(m->m);
    if (cur != m->ctx) cu.cuCtxSetCurrent(cur);
    m->m = NULL;
  }
  return 0;
}

/* module_load(image) -> module */
static int l_module_load(lua_State *L) {
  size_t n;
  const char *img = luaL_checklstring(L, 1, &n);
  lmodule *m = lua_newuserdatauv(L, sizeof *m, 0);
  m->m = NULL;
  luaL_setmetatable(L, MODULE_MT);
  m->ctx = cl_ctx(L);
  CUresult r = cu.cuModuleLoadData(&m->m, img);
  if (r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_NO_BINARY_FOR_GPU ||
      r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
    return luaL_error(L, "cudalua: cannot load the compiled module on this device (%s): compile "
                      "for this device's architecture (leave arch unset)", cl_errname(r));
  cl_check(L, r, "loading a compiled module");
  return 1;
}

static int code_size(char c) {
  switch (c) {
    case 'a': case 'A': case 'b': return 1;
    case 's': case 'S': case 'e': case 'E': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'l': case 'L': case 'd': case 'p': case 'q': return 8;
  }
  return 0;
}

/* module_kernel(module, symbol, codes, info) -> kernel; info = {name=, types={...}} */
static int l_module_kernel(lua_State *L) {
  lmodule *m = luaL_checkudata(L, 1, MODULE_MT);
  const char *sym = luaL_checkstring(L, 2);
  size_t nc;
  const char *codes = luaL_checklstring(L, 3, &nc);
  luaL_checktype(L, 4, LUA_TTABLE);
  if (!m->m) return luaL_error(L, "cudalua: module is closed");
  if (nc > CL_MAXPARAMS) return luaL_error(L, "cudalua: kernel '%s' has more than %d parameters", sym, CL_MAXPARAMS);
  cl_ctx(L);
  cl_kernel *k = lua_newuserdatauv(L, sizeof *k, 3);   /* module, info, last launcher */
  memset(k, 0, sizeof *k);
  luaL_setmetatable(L, CL_KERNEL);
  lua_pushvalue(L, 1); lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, 4); lua_setiuservalue(L, -2, 2);
  CUresult r = cu.cuModuleGetFunction(&k->fn, m->m, sym);
  if (r == CUDA_ERROR_NOT_FOUND) return luaL_error(L, "cudalua: no kernel '%s' in the module", sym);
  cl_check(L, r, "cuModuleGetFunction");
  k->ctx = m->ctx;
  k->nparams = (int)nc;
  luaL_getmetatable(L, CL_ARRAY);
  k->array_mt = lua_topointer(L, -1);
  lua_pop(L, 1);
  /* the driver knows each parameter's size and offset: check the codes against it */
  int have_info = cu.cuFuncGetParamInfo != NULL;
  size_t off = 0;
  for (int i = 0; i < (int)nc; i++) {
    size_t po = 0, ps = 0;
    k->ptype[i] = codes[i];
    int sz = code_size(codes[i]);
    if (have_info) {
      if (cu.cuFuncGetParamInfo(k->fn, i, &po, &ps) != CUDA_SUCCESS)
        return luaL_error(L, "cudalua: kernel '%s': the driver reports fewer parameters than %d", sym, (int)nc);
      if (sz && (size_t)sz != ps)
        return luaL_error(L, "cudalua: kernel '%s': parameter %d is %d bytes, the driver says %d",
                          sym, i + 1, sz, (int)ps);
      sz = (int)ps;
    } else if (!sz) {
      return luaL_error(L, "cudalua: kernel '%s': parameter %d is passed by value and this driver "
                        "cannot tell its size", sym, i + 1);
    } else {
      po = (off + sz - 1) / sz * sz;
    }
    k->psize[i] = (unsigned short)sz;
    k->poff[i] = (unsigned short)po;
    off = po + sz;
  }
  if (have_info) {
    size_t po, ps;
    if (cu.cuFuncGetParamInfo(k->fn, (int)nc, &po, &ps) == CUDA_SUCCESS)
      return luaL_error(L, "cudalua: kernel '%s': the driver reports more parameters than %d", sym, (int)nc);
  }
  k->argbytes = off;
  return 1;
}

cl_kernel *cl_checkkernel(lua_State *L, int idx) {
  cl_kernel *k = luaL_checkudata(L, idx, CL_KERNEL);
  return k;
}

static int k_attributes(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  static const struct { const char *n; CUfunction_attribute a; } at[] = {
    {"max_threads_per_block", CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
    {"shared_size_bytes", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
    {"const_size_bytes", CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES},
    {"local_size_bytes", CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES},
    {"num_regs", CU_FUNC_ATTRIBUTE_NUM_REGS},
    {"ptx_version", CU_FUNC_ATTRIBUTE_PTX_VERSION},
    {"binary_version", CU_FUNC_ATTRIBUTE_BINARY_VERSION}};
  cl_ctx(L);
  lua_createtable(L, 0, 8);
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    int v = 0;
    cl_check(L, cu.cuFuncGetAttribute(&v, at[i].a, k->fn), "kernel:attributes");
    lua_pushinteger(L, v);
    lua_setfield(L, -2, at[i].n);
  }
  return 1;
}

/* makes the kernel's context current (its device's, whichever device is selected) */
void cl_kernel_ctx(lua_State *L, cl_kernel *k) {
  CUcontext cur = NULL;
  cu.cuCtxGetCurrent(&cur);
  if (cur != k->ctx) cl_check(L, cu.cuCtxSetCurrent(k->ctx), "making the kernel's context current");
}

/* the occupancy calculator's grid and block for a dynamic shared size, cached per kernel */
void cl_kernel_occupancy(lua_State *L, cl_kernel *k, size_t shared) {
  if (k->occ_block && k->occ_shared == shared) return;
  int g = 0, b = 0;
  cl_kernel_ctx(L, k);
  cl_check(L, cu.cuOccupancyMaxPotentialBlockSize(&g, &b, k->fn, NULL, shared, 0),
           "cuOccupancyMaxPotentialBlockSize");
  k->occ_grid = g; k->occ_block = b; k->occ_shared = shared;
}

/* occupancy(k, shared) -> min grid size, block size */
static int k_occupancy(lua_State *L) {
  cl_kernel *k = cl_checkkernel(L, 1);
  lua_Integer shared = luaL_optinteger(L, 2, 0);
  luaL_argcheck(L, shared >= 0, 2, "shared memory size must be >= 0");
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
  lua_getiuservalue(L, 1, 2);
  lua_getfield(L, -1, "name");
  lua_pushfstring(L, "cudalua.kernel<%s>", lua_tostring(L, -1));
  return 1;
}

int cl_kernel_index(lua_State *L);   /* launch.c: k[{grid, block}] and methods */

void cl_open_module(lua_State *L) {
  luaL_newmetatable(L, MODULE_MT);
  lua_pushcfunction(L, m_close); lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newmetatable(L, CL_KERNEL);
  lua_pushcfunction(L, cl_kernel_index); lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, k_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  static const luaL_Reg methods[] = {
    {"attributes", k_attributes}, {"occupancy", k_occupancy}, {"info", k_info},
    {"handle", k_handle}, {NULL, NULL}};
  /* kernel methods live in a table Lua can extend (methods are added from launch.c) */
  luaL_newlib(L, methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, CL_KERNEL ".methods");
  lua_setfield(L, -2, "kernel_methods");
  lua_pushcfunction(L, l_module_load); lua_setfield(L, -2, "module_load");
  lua_pushcfunction(L, l_module_kernel); lua_setfield(L, -2, "module_kernel");
}
