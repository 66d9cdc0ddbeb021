/* cudalua.h: embedding cudalua in a C host program (installed with the module).
 *
 *   lua_State *L = luaL_newstate();
 *   luaL_openlibs(L);
 *   luaL_requiref(L, "cudalua", luaopen_cudalua, 1);   // cudalua is now a global and loaded
 *   lua_pop(L, 1);
 *
 * cudalua works in the device's primary context, the one the CUDA runtime uses, so memory
 * from cudaMalloc and streams from cudaStreamCreate can be handed to Lua; the host may have
 * made its context before or after opening cudalua. Each lua_State may be used by one thread
 * at a time; several states may run in several threads at once. Link with -lcudalua (static
 * libcudalua.a or shared libcudalua.so) and -ldl -lpthread -lm; no CUDA library is needed. */
#ifndef CUDALUA_H
#define CUDALUA_H

#include <stdint.h>
#include <lua.h>

/* the module is built with hidden symbols (its own calls go direct, not through the PLT);
   these are the ones it exports */
#ifndef CUDALUA_API
#define CUDALUA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* opens the module: pushes its table (for luaL_requiref or package.preload) */
CUDALUA_API int luaopen_cudalua(lua_State *L);

/* Pushes a cudalua device array viewing host-owned device memory (ptr: a CUdeviceptr or a
   cudaMalloc'd pointer) of the given dtype ("float32", "int64", ...) and shape. With release
   NULL the host keeps ownership and must keep the memory valid while Lua may use the array;
   otherwise Lua owns it and release(ud, ptr) is called once no array uses it and its queued
   work is done. Returns 1, or raises a Lua error (bad dtype/shape, pointer unknown to the
   driver or too small). */
CUDALUA_API int cudalua_push_device_array(lua_State *L, uint64_t ptr, const char *dtype, int ndim,
                                          const int64_t *shape, void (*release)(void *ud, uint64_t ptr),
                                          void *ud);

/* What cudalua_to_array reads back from any array (or CUDA Array Interface object). */
typedef struct cudalua_array_info {
  uint64_t ptr;            /* device address (0 for pageable host arrays) */
  void *host;              /* host address for host arrays, else NULL */
  int ndim;
  int64_t shape[8];
  const char *dtype;       /* "float32", ... (static string) */
  int itemsize;
  uint64_t nbytes;         /* shape's elements x itemsize (a strided view's span is larger) */
  void *stream;            /* CUstream that last used it (NULL: the legacy default stream) */
  int64_t strides[8];      /* bytes from one index of each axis to the next (a view's own) */
  int contiguous;          /* 1: C order, the elements one after another */
} cudalua_array_info;

/* Fills info from the array at idx; returns 1, or 0 if the value is not an open array. */
CUDALUA_API int cudalua_to_array(lua_State *L, int idx, cudalua_array_info *info);

/* DLPack. cudalua_push_dlpack pushes an array over a DLManagedTensorVersioned (versioned = 1,
   DLPack 1.x) or a legacy DLManagedTensor (versioned = 0) in CUDA device, CUDA host or managed
   memory, with its dtype, shape, strides and read-only flag; cudalua owns the tensor from the
   return and calls its deleter once, when no array uses the memory and queued work is done.
   Returns 1, or raises a Lua error (the tensor still the caller's): a dtype cudalua lacks,
   negative strides, a CPU tensor, memory the driver does not know, a device id that is not the
   memory's. The producer's work on the memory must be finished or ordered before cudalua's.
   cudalua_to_dlpack hands out the array at idx (or CUDA Array Interface object) as a new
   tensor (versioned or legacy) after its queued work is done; the memory stays alive until
   the consumer calls the tensor's deleter (once, from any thread), and the state lets it go at
   its next DLPack call or its close. Raises a Lua error for a non-array or strides that are
   not whole items. A tensor still held when the last cudalua state closes loses its memory
   with the contexts. */
CUDALUA_API int cudalua_push_dlpack(lua_State *L, void *tensor, int versioned);
CUDALUA_API void *cudalua_to_dlpack(lua_State *L, int idx, int versioned);

/* Pushes a cudalua stream for a host-made CUstream/cudaStream_t (not destroyed by cudalua).
   blocking: 1 if it synchronises with the legacy default stream (made without the
   non-blocking flag), which lets cudalua order frees with it. */
CUDALUA_API int cudalua_push_stream(lua_State *L, void *stream, int blocking);

#ifdef __cplusplus
}
#endif
#endif
