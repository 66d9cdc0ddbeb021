/* ipc.c: device memory shared between processes. An array made with
   cuda.device_array(shape, dtype, {ipc = true}) (cuMemAlloc: the stream-ordered pool's memory
   cannot be exported) gives a:ipc_handle(), a string another process passes to
   cuda.open_ipc_array(handle, shape, dtype) to get an array on the same memory. Events do the
   same in event.c (cuda.event{interprocess = true}). */
#include <stdio.h>
#include <string.h>
#include "cl.h"

#define EXPORTED "cudalua.ipc.exported"   /* handles this state made */
#define TAG "cudalua-ipc-mem:"

/* a:ipc_handle() -> "cudalua-ipc-mem:<handle>:<offset>:<bytes>" for this array (a view too) */
static int a_ipc_handle(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  cl_need_contiguous(L, a, "array:ipc_handle", "the array");   /* (the handle names a range of bytes) */
  cl_mem *m = a->mem;
  if (a->kind != CL_DEVICE || m->ipc != CL_IPC_EXPORTABLE)
    return cl_error(L, "array:ipc_handle", "%s", a->kind != CL_DEVICE ? "only device arrays can be shared"
                      : m->ipc == CL_IPC_OPENED ? "this array was opened from another process's handle; share that handle"
                      : "this array's memory comes from the stream-ordered pool, which cannot be shared; "
                        "make it with cuda.device_array(shape, dtype, {ipc = true})");
  CUipcMemHandle h;
  cl_use_ctx(L, m->ctx);
  cl_ipc_need_gpu(L, "array:ipc_handle");
  cl_check(L, CU(cuIpcGetMemHandle, &h, m->dptr), "array:ipc_handle");
  /* remembered: opening it in this process is refused without asking the driver */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, EXPORTED);
  lua_pushlstring(L, (const char *)h.reserved, sizeof h.reserved);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, TAG);
  cl_add_hex(&b, h.reserved, sizeof h.reserved);
  lua_pushfstring(L, ":%I:%I", (lua_Integer)a->offset, (lua_Integer)cl_nbytes(a));
  luaL_addvalue(&b);
  luaL_pushresult(&b);
  return 1;
}

/* open_ipc_array(handle, shape, dtype) -> a device array on another process's memory, in the
   selected device's context (another device reaches it through peer access the driver turns
   on); closed with <close> or by the collector once no queued work uses it */
static int l_open_ipc_array(lua_State *L) {
  size_t n;
  const char *s = cl_checklstring(L, 1, &n);
  int64_t shape[CL_MAXDIM];
  int ndim = cl_parse_shape(L, 2, shape, "cuda.open_ipc_array");
  int dt = cl_checkdtype(L, 3);
  CUipcMemHandle h;
  size_t tag = sizeof TAG - 1, hexn = 2 * sizeof h.reserved;
  long long off = -1, bytes = -1;
  char end = 0;
  if (n < tag + hexn + 4 || strncmp(s, TAG, tag) || !cl_hex_decode(s + tag, h.reserved, sizeof h.reserved) ||
      s[tag + hexn] != ':' || !(s[tag + hexn + 1] >= '0' && s[tag + hexn + 1] <= '9') ||
      sscanf(s + tag + hexn, ":%18lld:%18lld%c", &off, &bytes, &end) != 2 || off < 0 || bytes < 0)
    return cl_argerror(L, 1, "not a memory handle from array:ipc_handle()");
  size_t want = cl_dtypes[dt].size;
  if (!cl_shape_mul(&want, ndim, shape)) return cl_error(L, "cuda.open_ipc_array", "shape too large");
  if (want > (size_t)bytes)
    return cl_error(L, "cuda.open_ipc_array", "the shape and dtype need %I bytes, the handle covers %I",
                      (lua_Integer)want, (lua_Integer)bytes);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, EXPORTED);
  lua_pushlstring(L, (const char *)h.reserved, sizeof h.reserved);
  int mine = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  if (mine)
    return cl_error(L, "cuda.open_ipc_array", "this process made the handle (a handle opens in "
                      "another process, not the one that made it)");
  cl_ipc_need_gpu(L, "cuda.open_ipc_array");
  CUcontext ctx = cl_ctx(L);
  cl_array *a = cl_push_array(L, NULL, (size_t)off, CL_DEVICE, dt, ndim, shape);
  cl_mem *m = cl_mem_record(L, CL_DEVICE, 0, ctx);   /* before the handle is opened: no leak */
  CUresult r = CU(cuIpcOpenMemHandle, &m->dptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    cl_mem_discard(m);
    if (r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_INVALID_DEVICE)
      return cl_error(L, "cuda.open_ipc_array", "%s (a handle opens in another process, not the one "
                        "that made it)", cl_errname(r));
    cl_check(L, r, "cuda.open_ipc_array");
  }
  m->ipc = CL_IPC_OPENED;
  a->mem = m;   /* from here the array closes the handle when it goes */
  CUdeviceptr base = 0;
  size_t size = 0;
  cl_check(L, CU(cuMemGetAddressRange, &base, &size, m->dptr), "cuda.open_ipc_array");
  m->bytes = size;
  if ((unsigned long long)off > size || want > size - (size_t)off || off % cl_dtypes[dt].size)
    return cl_error(L, "cuda.open_ipc_array", "the handle's view (offset %I, %I bytes) does not fit "
                      "its allocation of %I bytes", (lua_Integer)off, (lua_Integer)want, (lua_Integer)size);
  return 1;
}

void cl_open_ipc(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, CL_ARRAY ".methods");
  lua_pushcfunction(L, a_ipc_handle); lua_setfield(L, -2, "ipc_handle");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_open_ipc_array); lua_setfield(L, -2, "open_ipc_array");
}
