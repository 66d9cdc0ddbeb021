/* embed.c: the C embedding API declared in cudalua.h. */
#include <stdlib.h>
#include <string.h>
#include "cl.h"
#include "cudalua.h"


typedef struct { void (*release)(void *, uint64_t); void *ud; } host_release;

static void release_tramp(void *ud, CUdeviceptr p) {
  host_release *r = ud;
  r->release(r->ud, (uint64_t)p);
  free(r);
}

int cudalua_push_device_array(lua_State *L, uint64_t ptr, const char *dtype, int ndim,
                              const int64_t *shape, void (*release)(void *ud, uint64_t ptr),
                              void *ud) {
  if (ndim < 1 || ndim > CL_MAXDIM) return cl_error(L, "cudalua_push_device_array", "ndim must be 1..%d", CL_MAXDIM);
  lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.foreign_array");
  lua_pushinteger(L, (lua_Integer)ptr);
  lua_pushstring(L, dtype ? dtype : "?");
  lua_createtable(L, ndim, 0);
  for (int i = 0; i < ndim; i++) { lua_pushinteger(L, shape[i]); lua_rawseti(L, -2, i + 1); }
  lua_pushboolean(L, 0);
  lua_pushnil(L);
  lua_call(L, 5, 1);            /* validates the pointer with the driver */
  cl_array *a = lua_touserdata(L, -1);
  if (release) {
    host_release *r = malloc(sizeof *r);
    if (!r) return cl_error(L, NULL, "out of host memory");
    r->release = release; r->ud = ud;
    a->mem->release = release_tramp;
    a->mem->ud = r;
  }
  return 1;
}

int cudalua_to_array(lua_State *L, int idx, cudalua_array_info *info) {
  idx = lua_absindex(L, idx);
  cl_array *a = cl_toarray(L, idx);
  if (!a && luaL_getmetafield(L, idx, "__cuda_array_interface") != LUA_TNIL) {
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.as_cuda_array");
    lua_pushvalue(L, idx);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) { lua_pop(L, 1); return 0; }
    a = cl_toarray(L, -1);
    lua_pop(L, 1);   /* the view stays alive through the object's cache */
  }
  if (!a || !a->mem) return 0;
  memset(info, 0, sizeof *info);
  info->ptr = (uint64_t)cl_devptr(a);
  info->host = cl_hostptr(a);
  info->ndim = a->ndim;
  for (int i = 0; i < a->ndim; i++) info->shape[i] = a->shape[i];
  info->dtype = cl_dtypes[a->dtype].name;
  info->itemsize = cl_dtypes[a->dtype].size;
  info->nbytes = cl_nbytes(a);
  for (int i = 0; i < a->ndim; i++) info->strides[i] = a->strides[i];
  info->contiguous = a->contig;
  info->stream = a->mem->used && a->mem->spread == CL_ONE_STREAM && a->mem->stream ? (void *)a->mem->stream->h : NULL;
  return 1;
}

int cudalua_push_stream(lua_State *L, void *stream, int blocking) {
  return cl_push_foreign_stream(L, (CUstream)stream, blocking);
}

int cudalua_push_dlpack(lua_State *L, void *tensor, int versioned) {
  return cl_dlpack_push(L, tensor, versioned, "cudalua_push_dlpack");
}

void *cudalua_to_dlpack(lua_State *L, int idx, int versioned) {
  return cl_dlpack_export(L, lua_absindex(L, idx), versioned, "cudalua_to_dlpack");
}
