/* cl.h: what the C files of cudalua share with each other (not installed).

   Layers, bottom first: a file calls only the files before it (tools/layers.lua checks this
   against the object files: make layers).
     layers: embedded class loader driver opts hostfn capstate wait memory
             dtype stream event array interop ipc copy config kernel module compile link
             args launch launcher graph capture random progress cache nvtx nccl device embed core
   embedded: the Lua parts and CUDA headers, as data. class: a Lua type's metatable, made from
   one description. loader: opening a library with dlopen from its table (libcuda, NVRTC,
   nvJitLink, NCCL), naming its result codes. driver: the tables of libcuda, NVRTC and
   nvJitLink; contexts; errors. opts: small helpers (options tables, keep sets, hex, hashes).
   hostfn..wait: ordering (what captures, the host-function queue, the releases put off,
   waits). memory: device and host blocks. dtype..link: one file per Lua type, each with its
   metatable, check/push functions and methods; config among them is launch configurations, a
   C struct with no Lua type of its own (the kernel type reads its shared memory sizes).
   args..capture: submitting work (arguments, launches, launchers, graphs, captures). The
   rest: Lua entry points; core.c opens them all, each type before the files that add methods
   to it.
   No upward use is allowed: where a lower file needs what a higher one does (the array check
   takes CUDA Array Interface objects, which interop.c makes views of), the higher one sets a
   function pointer the lower one owns when it opens. */
#ifndef CUDALUA_CL_H
#define CUDALUA_CL_H

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <lua.h>
#include <lauxlib.h>
#include <cuda.h>
#include <cudaProfiler.h>
#include <nvrtc.h>
#include <nvJitLink.h>

#define CUDALUA_VERSION "0.2.0"

/* ---- from class.c: a Lua type, declared once ---- */
typedef struct cl_class {
  const char *name;          /* "cudalua.array": the metatable's registry key and its __name */
  const luaL_Reg *methods;   /* NULL: none. Also kept in the registry as name ".methods" */
  lua_CFunction index;       /* __index as a function (fields besides the methods), given the
                                methods table as upvalue 1; NULL: __index is the methods table */
  const luaL_Reg *meta;      /* the other metamethods: __gc, __close, __tostring, __len... */
} cl_class;
void cl_class_define(lua_State *L, const cl_class *c);   /* makes (or remakes) its metatable */

/* ---- from opts.c: small helpers the files share ---- */
/* raises "where: unknown option 'k' (names...)" for a key of the table at idx not in names */
void cl_check_options(lua_State *L, int idx, const char *where, const char *const names[]);
/* options[key] of the table at idx: nil (-1), or a boolean (0, 1); raises "where: key must be a
   boolean, got T" */
int cl_opt_bool(lua_State *L, int idx, const char *key, const char *where);
/* keeps the value at idx alive with the set at tidx (t[value] = true: keeping it again does not
   grow the set); values that are not collectable need no keeping */
void cl_keep(lua_State *L, int tidx, int idx);
/* handles as text: n bytes as 2n hex digits, and back (0 unless all are hex digits) */
void cl_add_hex(luaL_Buffer *b, const void *p, size_t n);
int cl_hex_decode(const char *s, void *out, size_t n);
/* FNV-1a (64 bits) of n bytes at p, going on from h: CL_FNV_BASIS to begin */
#define CL_FNV_BASIS 0xcbf29ce484222325ULL
#define CL_FNV_PRIME 0x100000001b3ULL
uint64_t cl_fnv1a(uint64_t h, const void *p, size_t n);

typedef struct cl_hostrec cl_hostrec;   /* hostfn.c: a Lua host function's record */
typedef struct cl_hostq cl_hostq;       /* hostfn.c: a state's host-function queue */

/* ---- loader.c: a library opened with dlopen at run time, described by a table ---- */
/* libcuda, NVRTC and nvJitLink (driver.c) and NCCL (nccl.c) are each a cl_lib: where to look,
   which entry points, the messages, the names of its result codes; then the state of loading it,
   which cl_lib_load fills once. Its folders, in order: the library `near` was found in (when by
   a path), then each of `dirs` (a name alone: the loader's path), each with every file name. */
typedef struct { const char *name; void **slot; } cl_sym;   /* an entry point and its pointer */
typedef struct { const char *env, *dir; } cl_libdir;   /* getenv(env) (skipped if unset) + dir */
typedef struct cl_lib {
  const char *env;                /* names the one file to open instead (CUDALUA_NCCL, ...) */
  const char *const *names;       /* file names, newest first */
  const cl_libdir *dirs;          /* ending with {NULL, NULL}; {NULL, ""}: the loader's path */
  struct cl_lib *near;            /* loaded first: the two must come from one toolkit */
  int flags;                      /* dlopen's (RTLD_LOCAL is added) */
  const cl_sym *syms, *optional;  /* each ending with {NULL, NULL}; the optional are NULL when missing */
  /* what the user sees, printf formats given (file, detail): `env` names a file that cannot be
     opened (the file, dlerror), none found (the first name, ""), an entry point is missing (the
     file, the entry point) */
  const char *forced_fail, *not_found, *lacks;
  int (*ready)(struct cl_lib *);  /* once the entry points are in: 0 (err written) fails the load */
  const char *const *results;     /* result code -> name, from 0, `nresults` of them; else */
  int nresults;
  const char *(*result_of)(int);  /* the library's own names (NULL: none for this code) */
  const char *unknown;            /* any other code, or the library not loaded */
  /* the state, under `lock` (`state` also read without it) */
  pthread_mutex_t lock;
  int state;                      /* 0 not tried, 1 ok, -1 failed (not tried again) */
  char path[700], err[1500];      /* where it was found; why not */
} cl_lib;
int cl_lib_load(cl_lib *l);       /* 1 when loaded (at the first call; any thread) */
int cl_lib_ok(cl_lib *l);         /* 1 when loaded, without loading (no lock) */
const char *cl_result_name(cl_lib *l, int r);   /* a result code's name, as the library says it */

/* ---- driver.c: libcuda and NVRTC, opened with dlopen at run time ---- */
#define CL_CUDA_FUNCS(X) \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute) \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) \
  X(cuCtxSynchronize) X(cuCtxGetDevice) X(cuMemGetInfo) \
  X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuMemFreeAsync) \
  X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute) X(cuMemPoolTrimTo) \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer) X(cuMemAllocManaged) \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemAdvise) X(cuPointerGetAttribute) \
  X(cuMemcpyAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) \
  X(cuMemsetD8Async) X(cuMemsetD16Async) X(cuMemsetD32Async) X(cuMemsetD2D32Async) \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) \
  X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) \
  X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncGetAttribute) \
  X(cuLaunchKernel) X(cuOccupancyMaxPotentialBlockSize) \
  X(cuFuncSetAttribute) X(cuFuncSetCacheConfig) X(cuLaunchKernelEx) X(cuModuleLoadDataEx) \
  X(cuGraphKernelNodeSetAttribute) X(cuGraphDestroyNode) \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuLaunchHostFunc) \
  X(cuGraphCreate) X(cuGraphDestroy) X(cuGraphAddKernelNode) X(cuGraphAddMemcpyNode) \
  X(cuGraphAddMemsetNode) X(cuGraphAddHostNode) X(cuGraphAddEmptyNode) \
  X(cuGraphAddChildGraphNode) X(cuGraphAddDependencies) X(cuGraphNodeGetDependentNodes) \
  X(cuGraphGetNodes) X(cuGraphInstantiate) X(cuGraphExecDestroy) X(cuGraphLaunch) \
  X(cuGraphUpload) X(cuGraphExecKernelNodeSetParams) X(cuGraphExecMemcpyNodeSetParams) \
  X(cuGraphExecMemsetNodeSetParams) X(cuGraphExecUpdate) X(cuGraphDebugDotPrint) \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing) \
  X(cuMemcpyPeerAsync) X(cuMemcpyPeer) X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess) \
  X(cuCtxDisablePeerAccess) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) \
  X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle) X(cuMemPoolSetAccess) X(cuMemGetAddressRange) \
  X(cuStreamGetCaptureInfo) X(cuStreamBatchMemOp) X(cuGraphAddBatchMemOpNode) \
  X(cuGraphBatchMemOpNodeGetParams) X(cuGraphBatchMemOpNodeSetParams) X(cuGraphChildGraphNodeGetGraph) \
  X(cuGraphNodeGetType) X(cuStreamCreateWithPriority) X(cuStreamGetPriority) X(cuCtxGetStreamPriorityRange)

/* entry points of newer drivers: NULL when missing (cuFuncGetParamInfo 12.4, the module
   function listing 12.4, cuFuncGetName 12.3) */
#define CL_CUDA_OPTIONAL(X) \
  X(cuFuncGetParamInfo) X(cuModuleGetFunctionCount) X(cuModuleEnumerateFunctions) X(cuFuncGetName) \
  X(cuProfilerStart) X(cuProfilerStop)

#define CL_NVRTC_FUNCS(X) \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) \
  X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcGetPTXSize) X(nvrtcGetPTX) \
  X(nvrtcAddNameExpression) X(nvrtcGetLoweredName) X(nvrtcGetNumSupportedArchs) \
  X(nvrtcGetSupportedArchs) X(nvrtcGetLTOIRSize) X(nvrtcGetLTOIR)

/* nvJitLink (cuda.link, LTO-IR modules), also opened at run time */
#define CL_JITLINK_FUNCS(X) \
  X(nvJitLinkCreate) X(nvJitLinkDestroy) X(nvJitLinkAddData) X(nvJitLinkComplete) \
  X(nvJitLinkGetLinkedCubinSize) X(nvJitLinkGetLinkedCubin) X(nvJitLinkGetLinkedPtxSize) \
  X(nvJitLinkGetLinkedPtx) X(nvJitLinkGetErrorLogSize) X(nvJitLinkGetErrorLog) \
  X(nvJitLinkGetInfoLogSize) X(nvJitLinkGetInfoLog)
/* newer: NULL when missing (12.3) */
#define CL_JITLINK_OPTIONAL(X) X(nvJitLinkVersion)

/* cuda.h maps names such as cuMemAlloc to cuMemAlloc_v2; the member takes the mapped name,
   so calls through the table use the same ABI as the prototypes we compile against. */
#define CL_MEMBER(f) __typeof__(f) *f;
typedef struct cl_api {
  CL_CUDA_FUNCS(CL_MEMBER)
  CL_CUDA_OPTIONAL(CL_MEMBER)
  CL_NVRTC_FUNCS(CL_MEMBER)
  CL_JITLINK_FUNCS(CL_MEMBER)
  CL_JITLINK_OPTIONAL(CL_MEMBER)
} cl_api;
extern cl_api cu;

/* the three libraries (cl_lib_load; .err says why not, .path where) */
extern cl_lib cl_libcuda;          /* loaded: libcuda opened, cuInit succeeded, a device found */
extern cl_lib cl_nvrtc, cl_nvjitlink;
static inline int cl_driver_load(void) { return cl_lib_load(&cl_libcuda); }
CUcontext cl_ctx(lua_State *L);    /* raises unless a GPU is usable; makes its context current */
int cl_device_attr(CUdevice_attribute a);  /* attribute of the current device */
int cl_current_device(void);
void cl_set_current_device(int dev);   /* this thread's selection (the helper thread borrows one) */
#define CL_MAXDEV 64
/* Every object keeps the context of its device, and work on it runs there whatever device is
   selected. These map contexts and devices (primary contexts, one a device) and switch. */
int cl_device_of(CUcontext c);                      /* the device's id, -1 if not ours */
CUcontext cl_device_ctx(lua_State *L, int dev);     /* the device's context (retained once) */
int cl_peer_enabled(CUcontext from, CUcontext to);  /* kernels in `from` may use `to`'s memory */
int cl_ndevices(void);                              /* 0 without a driver */
CUresult cl_sync_all_devices(lua_State *L);         /* every context cudalua uses (runs host functions) */
void cl_idle_devices(void);       /* the last state closed: waits for every context cudalua made */
void cl_release_contexts(void);   /* then trims pools, releases the primary contexts */
/* the host may touch managed memory of context ctx's device while its kernels run */
int cl_concurrent_managed(CUcontext ctx);
/* raises "cudalua: what: CUDA_ERROR_X (text)" when r is not CUDA_SUCCESS */
void cl_check(lua_State *L, CUresult r, const char *what);
/* hostfn.c: this thread runs a Lua host function now. It may not use the GPU (CUDA's rule for
   host functions: the thread that would wait for it may be inside the driver), so every use of
   a context refuses (cl_use_ctx, cl_ctx), and releases are put off. */
extern __thread int cl_in_hostfn;
extern unsigned cl_host_pending;   /* hostfn.c: never 0 while a host function runs (it is pending) */
void cl_hostfn_refuse(lua_State *L);   /* raises */
/* makes c current (cheap when it is: the driver keeps the current context per thread). The
   thread-local (a call in a shared library) is read only while host functions are pending */
static inline void cl_use_ctx(lua_State *L, CUcontext c) {
  if (__builtin_expect(__atomic_load_n(&cl_host_pending, __ATOMIC_RELAXED) != 0, 0) && cl_in_hostfn)
    cl_hostfn_refuse(L);
  CUcontext cur = NULL;
  cu.cuCtxGetCurrent(&cur);
  if (cur != c) cl_check(L, cu.cuCtxSetCurrent(c), "making a device's context current");
}
/* the same without raising, giving back the context that was current: frees and the like
   run in their object's context, then cl_ctx_swap(prev) restores the caller's */
static inline CUcontext cl_ctx_swap(CUcontext c) {
  CUcontext cur = NULL;
  cu.cuCtxGetCurrent(&cur);
  if (cur != c) cu.cuCtxSetCurrent(c);
  return cur;
}
static inline const char *cl_errname(CUresult r) { return cl_result_name(&cl_libcuda, r); }
void cl_open_driver(lua_State *L); /* the toolkit libraries' versions and identities, into the table on top */
void cl_need_driver(lua_State *L);  /* raises the driver's load error */
CUcontext cl_ctx_of_device(int d);  /* its primary context, NULL until made */
int cl_peer_enabled_dev(int a, int b);
void cl_peer_set(int a, int b, int on);
void cl_open_device(lua_State *L); /* device.c: the system functions, into the table on top */
void cl_open_wait(lua_State *L);   /* wait.c: cuda.sleep, into the table on top */
void cl_open_nvtx(lua_State *L);   /* nvtx.c: core.nvtx, profile_start/stop */

/* ---- dtype.c: element types ---- */
enum { CL_F32, CL_F64, CL_I8, CL_I16, CL_I32, CL_I64, CL_U8, CL_U16, CL_U32, CL_U64,
       CL_BOOL, CL_F16, CL_BF16, CL_C64, CL_C128, CL_NDTYPE };
#define CL_MAXITEM 16   /* the largest element (complex128) */
#define cl_is_complex(dt) ((dt) == CL_C64 || (dt) == CL_C128)
typedef struct cl_dtype_info {
  const char *name, *alias;   /* "float32", "f4" */
  int size;
  const char *typestr;        /* CUDA Array Interface, e.g. "<f4" */
  const char *ctype;          /* C type in kernels */
} cl_dtype_info;
extern const cl_dtype_info cl_dtypes[CL_NDTYPE];
int cl_checkdtype(lua_State *L, int idx);      /* dtype object or name */
int cl_optdtype(lua_State *L, int idx, int def);
void cl_pushdtype(lua_State *L, int dt);
void cl_open_dtype(lua_State *L);
/* converts the Lua value at idx into one element at p; raises naming what and where */
void cl_tovalue(lua_State *L, int idx, int dt, void *p, const char *where, lua_Integer index);
/* the same for a real dtype (not complex), raising nothing: what went wrong, for the caller to
   word (kernel arguments); the range checks are these, the elements' and the arguments' */
enum { CL_CONV_OK, CL_CONV_TYPE /* not a number */, CL_CONV_RANGE, CL_CONV_NOTINT };
int cl_convert(lua_State *L, int idx, int dt, void *p);
void cl_complex_parts(int dt, const void *p, double *re, double *im);
void cl_pushvalue(lua_State *L, int dt, const void *p);
float cl_half_to_float(uint16_t h);
uint16_t cl_float_to_half(float f);
float cl_bf16_to_float(uint16_t h);
uint16_t cl_float_to_bf16(float f);

/* ---- stream.c: streams, events ---- */
typedef struct cl_stream {
  int refs;            /* the Lua object and every memory block that last used it */
  int capture_ref;     /* while capturing: registry ref of the table keeping captured objects alive */
  CUstream h;          /* NULL: the legacy default stream */
  CUcontext ctx;       /* its device's context */
  int owned;           /* destroy the handle with the last reference */
  int blocking;        /* synchronises with the legacy stream */
  int freeing;         /* its cached blocks being freed by any thread now (atomic, memory.c):
                          its destruction waits for them */
} cl_stream;
cl_stream *cl_stream_ref(cl_stream *s);
void cl_stream_unref(lua_State *L, cl_stream *s);   /* L: the state dropping it, or NULL */
/* the stream at idx: nil/0/default stream -> NULL (legacy); raises for other values */
cl_stream *cl_tostream(lua_State *L, int idx, const char *where);
cl_stream *cl_stream_of(lua_State *L, int idx, int *is_default);
int cl_push_foreign_stream(lua_State *L, CUstream h, int blocking);   /* a stream object for h, not owned */
cl_stream *cl_checkstream(lua_State *L, int idx);   /* a method's self: NULL for the default stream */
CUstream cl_stream_use(lua_State *L, cl_stream *s);  /* its context made current; its handle */
void cl_open_event(lua_State *L);   /* event.c: events, and stream:wait_event */
CUevent cl_checkevent(lua_State *L, int idx);
/* s (NULL: the legacy stream of ctx) may carry work of context ctx; raises naming both devices */
void cl_stream_check(lua_State *L, cl_stream *s, CUcontext ctx, const char *where, const char *what);
void cl_open_stream(lua_State *L);

/* releases asked for inside a Lua host function or while a stream captures (frees, module
   unloads, destroys): the caller fills in fn and keeps the node's memory until fn runs, which
   cl_flush_deferred does once neither is under way. Each Lua state has its own list: another
   state's thread must not touch its objects. L: the state (NULL: the one whose host function
   runs on this thread; none: fn runs now) */
typedef struct cl_deferred {
  void (*fn)(lua_State *L, struct cl_deferred *d);
  struct cl_deferred *next;
  int capturing_too;   /* it ends a capture: it runs at the next flush even while one runs */
} cl_deferred;
int cl_must_defer(lua_State *L);
void cl_defer(lua_State *L, cl_deferred *d);
/* the common case: fn(L, a, b) later (0: no memory for it, the caller does it now) */
int cl_defer_call(lua_State *L, int ends_capture, void (*fn)(lua_State *L, void *a, void *b), void *a, void *b);
/* the record a deferred node is the member `member` of */
#define CL_DEFERRED_OWNER(d, type, member) ((type *)(void *)((char *)(d) - offsetof(type, member)))
void cl_flush_deferred(lua_State *L);

/* ---- from memory.c: the memory blocks behind arrays ---- */
enum { CL_HOST, CL_PINNED, CL_MAPPED, CL_MANAGED, CL_DEVICE, CL_FOREIGN };   /* kinds */
/* cl_mem.spread: where the queued work that uses a block is (with used). Each covers the ones
   before it, and a block never goes back down while used: that order is still owed. */
typedef enum {
  CL_ONE_STREAM,         /* its stream only: waited for there, freed in its order */
  CL_BLOCKING_STREAMS,   /* several streams, all blocking: the legacy stream orders them */
  CL_ANY_STREAMS,        /* non-blocking ones too: the whole context is waited for */
  CL_OTHER_DEVICES       /* another device's work too (or on another device's memory): every
                            device is waited for */
} cl_mem_spread;
typedef enum {           /* cl_mem.ipc: device memory shared with other processes */
  CL_IPC_NONE,
  CL_IPC_EXPORTABLE,     /* made with cuMemAlloc (the pool's memory cannot be exported) */
  CL_IPC_OPENED          /* another process's, opened from its handle: closed, not freed */
} cl_mem_ipc;
typedef enum {           /* cl_mem.registered: pageable host memory page-locked for copies */
  CL_REGISTER_FAILED = -1,   /* the system refused (memlock limits): copies go the pageable way */
  CL_UNREGISTERED = 0,
  CL_REGISTERED = 1          /* with cuMemHostRegister: unregistered before it is freed */
} cl_mem_registered;
typedef struct cl_mem {
  int refs;            /* arrays (and views) that point into it */
  int kind;
  void *host;          /* host address, host kinds */
  CUdeviceptr dptr;    /* device address, where kernels may use it */
  size_t bytes;
  CUcontext ctx;
  cl_stream *stream;   /* last stream that used it (NULL with used: legacy) */
  int used;            /* used by queued work */
  cl_mem_spread spread;   /* on which streams and devices */
  cl_mem_registered registered;
  int portable;        /* host-visible memory every device reaches (pinned, mapped, managed) */
  CUcontext use_ctx;   /* the context whose work used it last (with used) */
  cl_mem_ipc ipc;
  void (*release)(void *ud, CUdeviceptr p);  /* foreign memory */
  void *ud;
  struct cl_mem *next; /* in the list of spare records (memory.c) */
  cl_deferred later;   /* a free put off (memory.c) */
} cl_mem;
enum { CL_ZERO = 1, CL_IPC = 2 };                 /* cl_mem_new's and cl_newarray's flags */
cl_mem *cl_mem_new(lua_State *L, int kind, size_t bytes, cl_stream *s, int flags);
/* a block's record, one reference and the rest zero (cl_mem_new's, and those of memory made
   elsewhere: foreign views, handles opened from other processes); raises when out of host
   memory. cl_mem_discard gives back one never attached to an array. */
cl_mem *cl_mem_record(lua_State *L, int kind, size_t bytes, CUcontext ctx);
void cl_mem_discard(cl_mem *m);
int cl_mem_device(const cl_mem *m);               /* its device, -1 for host memory any reaches */
/* an array a kernel or copy in context ctx may use: raises naming both devices otherwise */
void cl_mem_reach(lua_State *L, cl_mem *m, CUcontext ctx, const char *where);
int cl_mem_reachable(const cl_mem *m, CUcontext ctx);
cl_mem *cl_mem_ref(cl_mem *m);
void cl_mem_unref(lua_State *L, cl_mem *m);       /* never raises */
void cl_mem_use(cl_mem *m, cl_stream *s, CUcontext ctx);  /* queued work on s, in ctx, uses m */
void cl_mem_settle(lua_State *L, cl_mem *m);      /* waits for queued work that uses m */
/* before stream-less work on m in context a or b: waits for any other device's work on m */
void cl_mem_order(lua_State *L, cl_mem *m, CUcontext a, CUcontext b);
void cl_mem_forget_stream(lua_State *L, cl_stream *s);   /* s is being destroyed */
void cl_mem_forget_state(lua_State *L);   /* its state closes: the blocks it cached are freed */
void cl_open_memory(lua_State *L);
void cl_mem_release_all(void);                  /* the last state closed: block cache emptied */
int cl_pageable_prepare(lua_State *L, cl_mem *m);               /* page-locks pageable memory for copies */

/* ---- from array.c: host and device arrays ---- */
#define CL_MAXDIM 8
typedef struct cl_array {
  cl_mem *mem;         /* NULL once closed */
  size_t offset;       /* bytes into mem: views */
  int kind, dtype, ndim, readonly;
  int64_t shape[CL_MAXDIM];
  size_t size;         /* elements */
} cl_array;
#define CL_ARRAY "cudalua.array"
cl_array *cl_toarray(lua_State *L, int idx);      /* NULL unless a cudalua array */
cl_array *cl_checkarray(lua_State *L, int idx);   /* raises if not an open array */
extern cl_array *(*cl_foreign_array)(lua_State *L, int idx);   /* set by interop.c: see array.c */
size_t cl_nbytes(const cl_array *a);
CUdeviceptr cl_devptr(const cl_array *a);         /* 0 for pageable host arrays */
void *cl_hostptr(const cl_array *a);              /* NULL for device arrays */
cl_array *cl_newarray(lua_State *L, int kind, int dt, int ndim, const int64_t *shape,
                      cl_stream *s, int flags);
void cl_open_array(lua_State *L);
extern const char *const cl_kind_names[];     /* "array", "pinned_array", ... */
int cl_is_host(const cl_array *a);                /* memory the CPU can read */
void cl_host_access(lua_State *L, cl_array *a);   /* waits if managed memory needs it */
void cl_still_open(lua_State *L, cl_array *a, const char *where);   /* after a wait: not closed meanwhile */
int cl_l_array(lua_State *L);                     /* cuda.array */
int cl_parse_shape(lua_State *L, int idx, int64_t *shape, const char *where);
/* *n times the extents of shape; 0 when that would pass 2^50 (no array is that large, and
   byte counts of such products cannot overflow) */
int cl_shape_mul(size_t *n, int ndim, const int64_t *shape);
cl_array *cl_push_array(lua_State *L, cl_mem *m, size_t offset, int kind, int dt, int ndim,
                        const int64_t *shape);      /* a new array object on m (not referenced) */
void cl_push_shape(lua_State *L, cl_array *a);

/* ---- from interop.c: the CUDA Array Interface ---- */
void cl_open_interop(lua_State *L);
/* a value with __cuda_array_interface at idx is replaced by a view of its memory; NULL (stack
   unchanged) for a value without one; raises for a bad interface */
cl_array *cl_cai_view(lua_State *L, int idx);
void cl_wait_cai_stream(lua_State *L, lua_Integer h, lua_Integer ptr);   /* an interface's stream field */

/* ---- from copy.c: the arrays' copies ---- */
void cl_open_copy(lua_State *L);   /* the arrays' copy methods, cuda.to_device and cuda.copy */
void cl_copy(lua_State *L, cl_array *dst, cl_array *src, cl_stream *s, int sync, const char *where);

/* ---- compile.c, link.c, ipc.c, module.c and the entry points ---- */
void cl_open_compile(lua_State *L);
void cl_open_link(lua_State *L);
void cl_open_ipc(lua_State *L);
void cl_open_module(lua_State *L);
void cl_open_random(lua_State *L);
void cl_open_progress(lua_State *L);
void cl_open_cache(lua_State *L);
void cl_open_hostfn(lua_State *L);   /* the state's host-function queue; cuda.sleep into the table on top */
void cl_open_graph(lua_State *L);
void cl_open_capture(lua_State *L);   /* capture.c: the stream's capture methods */
/* graph.c: a graph object for h (pushed); a host function's record the graph now runs */
void *cl_push_graph(lua_State *L, CUgraph h, CUcontext ctx);
void cl_graph_add_hostrec(lua_State *L, int gidx, cl_hostrec *r);

/* ---- hostfn.c: Lua host functions, and waits that run them ---- */
enum { CL_WAIT_STREAM, CL_WAIT_EVENT, CL_WAIT_CTX, CL_WAIT_HOSTFNS };   /* HOSTFNS: until L's have run */
CUresult cl_wait_raw(lua_State *L, int kind, void *h);
void cl_wait_check(lua_State *L);   /* raises where no wait may be (in a running host function) */
void cl_wait(lua_State *L, int kind, void *h, const char *what);  /* raises */
void cl_wait_result(lua_State *L, CUresult r, const char *what);  /* raises a wait's failure */
void cl_host_drain(lua_State *L);   /* before a driver call that waits for the whole device */
/* device-wide waits (cuCtxSynchronize) and captures exclude each other: a claim is held around
   such a wait; a capture begins once none is held, and none is given while one runs */
int cl_ctx_claim(void);     /* 1: claimed; 0: a stream captures (then no device-wide wait) */
void cl_ctx_unclaim(void);
int cl_ctx_claim_or_defer(lua_State *L, cl_deferred *d);   /* 0: d was put off instead */
void cl_capture_enter(lua_State *L);   /* counted in cl_capturing once no claim is held */
int cl_host_service(lua_State *L);   /* runs L's fired host functions */
int cl_host_service_q(lua_State *L, cl_hostq *q);
cl_hostq *cl_host_queue(lua_State *L);   /* NULL once the state closes */
int cl_host_q_armed(cl_hostq *q);       /* its firings pending */
int cl_defer_if_open(lua_State *L, cl_deferred *d);   /* 0: the state is closing, not put off */
int cl_host_armed(lua_State *L);     /* L's host functions queued and not yet run */
void cl_host_raise(lua_State *L);
void cl_host_enqueue(lua_State *L, CUstream h, int fidx, const char *where);   /* the function at fidx */
/* graph host nodes: a record per node, owned by a userdata the graph keeps (pushed) */
cl_hostrec *cl_hostrec_new(lua_State *L, int fidx, const char *where);
cl_hostrec *cl_hostrec_copy(lua_State *L, const cl_hostrec *r, const char *where);
cl_hostrec *cl_hostrec_at(CUdeviceptr a);   /* the record a memop node's address belongs to */
cl_hostrec *cl_hostrec_of_box(lua_State *L, int idx);
void cl_hostrec_ops(const cl_hostrec *r, CUstreamBatchMemOpParams op[2]);   /* its stream part */
/* around a graph launch with host nodes: arms them and orders the launch (returns a token for
   end); end records the order, or disarms when the launch was not queued */
int cl_host_graph_begin(lua_State *L, cl_hostrec *const *recs, int n, CUcontext ctx, CUstream h,
                        const char *where);
void cl_host_graph_end(lua_State *L, cl_hostrec *const *recs, int n, int token, CUstream h, int ok,
                       const char *where);
void cl_hostfn_shutdown(void);   /* the last state closed and the devices are idle */
void cl_host_reserve(lua_State *L);   /* before a capture: words for the host functions it may take */
void cl_host_dump(void *file);   /* a FILE *: every queue's state, for hang reports */
/* launches that return only once their work has run (CUDA_LAUNCH_BLOCKING=1, compute-sanitizer):
   work queued behind a Lua host function that has not run would block in the driver, so such
   work first waits for the host functions (set when the driver loads) */
extern int cl_launch_blocks;
void cl_host_before_enqueue(lua_State *L, const char *what);
#define CL_BEFORE_ENQUEUE(L, what) do { if (cl_launch_blocks) cl_host_before_enqueue(L, what); } while (0)
void cl_host_after_enqueue(lua_State *L, CUstream h, const char *what);   /* launches block */
/* A driver call that may not return before one of L's fired host functions has run (work
   queued behind it when the queue is full, launches that block) parks the Lua thread: the
   helper thread may then run them on L. Free when nothing is pending in the process (one
   load). The call between park and unpark must not touch L nor raise. ENQUEUE: the helper
   steps in after about a millisecond; WAIT: at once. */
enum { CL_PARK_ENQUEUE, CL_PARK_WAIT };
struct cl_hostq;
struct cl_hostq *cl_host_park_slow(lua_State *L, int kind);
void cl_host_unpark_slow(lua_State *L, struct cl_hostq *q);
static inline struct cl_hostq *cl_host_park(lua_State *L, int kind) {
  return L && __atomic_load_n(&cl_host_pending, __ATOMIC_RELAXED) ? cl_host_park_slow(L, kind) : NULL;
}
static inline void cl_host_unpark(lua_State *L, struct cl_hostq *q) { if (q) cl_host_unpark_slow(L, q); }
#define CL_PARKED(L, kind, call) __extension__ ({ struct cl_hostq *pk_ = cl_host_park(L, kind); \
  __typeof__(call) r_ = (call); cl_host_unpark(L, pk_); r_; })
/* Every driver call of cudalua: CU(cuMemAlloc, &p, n) is cu.cuMemAlloc(&p, n), parked for the
   Lua state L in scope (any driver call may block while another thread's call waits for a
   stream stopped at a host function). CU0: not parked, where no state is at hand, a lock of
   cudalua's is held (a host function the helper runs could want it), or the call only reads
   state (the current context, attributes, error names). */
#define CU(f, ...) CL_PARKED(L, CL_PARK_ENQUEUE, cu.f(__VA_ARGS__))
#define CU0(f, ...) (cu.f(__VA_ARGS__))

/* ---- from config.c: launch configurations ---- */
/* a launch configuration: k[{...}], k:launch{...}, forall, graph kernel nodes */
typedef struct cl_launch {
  unsigned g[3], b[3], shared;
  unsigned cluster[3];           /* thread block cluster; {0, 0, 0}: none given */
  int cooperative;               /* grid-wide synchronisation (cuLaunchKernelEx attribute) */
  cl_stream *s;
} cl_launch;
enum { CL_CFG_LAUNCH, CL_CFG_GRAPH, CL_CFG_FORALL };
/* the configuration table at idx ({grid, block [, stream [, shared]]} and the keys grid, block,
   stream, shared, cooperative, cluster); unknown keys raise. Messages about a bad grid or block
   start with prefix; where names the caller. Graph nodes take no stream; forall's options
   (stream, shared, cooperative, cluster) take no grid or block. */
void cl_launch_parse(lua_State *L, int idx, cl_launch *c, int mode, const char *where,
                     const char *prefix);
/* k[{...}]'s configuration: the table at 2 (the kernel's __index key, nothing above it); the
   plain {grid, block [, stream [, shared]]} without a pass of cl_launch_parse */
void cl_launch_bracket(lua_State *L, cl_launch *c);
unsigned cl_launch_shared(lua_State *L, int idx);   /* a dynamic shared memory size; nil: 0 */
/* does the cluster tile the grid? (a 0 in the cluster: no cluster in that dimension) Made
   configurations are checked (config.c); a kernel's own cluster at its launches (launch.c) */
static inline int cl_tiles(const unsigned g[3], const unsigned cl[3]) {
  for (int d = 0; d < 3; d++) if (cl[d] && g[d] % cl[d]) return 0;
  return 1;
}

/* ---- from kernel.c: the kernel type ---- */
#define CL_MAXPARAMS 64
/* the kinds of kernel parameters, one row each (kernel.c's cl_params, its comment says them):
   the Lua parts map type names to code letters through it (core.param_types), kernels keep a
   row per parameter and args.c converts each argument by its row */
enum { CL_PARAM_VALUE,       /* a scalar: converted by cl_convert with the row's dtype */
       CL_PARAM_COMPLEX,     /* a number or {re, im}: cl_tovalue with the row's dtype */
       CL_PARAM_ARRAY, CL_PARAM_CONST_ARRAY,   /* T* and const T*: an array */
       CL_PARAM_ADDRESS,     /* 8 bytes from PTX: an array or an integer address */
       CL_PARAM_BYTES,       /* by value, of a type cudalua does not convert: a string */
       CL_PARAM_UNKNOWN };   /* of a type not known at all: a string */
typedef struct cl_param_kind {
  char code;                  /* the letter the Lua parts give for it */
  unsigned char how;          /* CL_PARAM_* */
  unsigned char size, align;  /* bytes; 0: as the driver says */
  signed char dtype;          /* the cl_dtypes entry a Lua value converts through; -1: none */
  signed char dtype_neg;      /* PTX widths say no sign: negative integers convert through this */
  unsigned char bools;        /* Lua booleans taken too, converted as bool */
  const char *mangled;        /* its spellings in demangled names, ',' between them */
  const char *declared;       /* the one-word names a signature string may give for it */
  const char *ptx;            /* the PTX .param types */
} cl_param_kind;
extern const cl_param_kind cl_params[];
/* bumped by every k:set_attribute: kernel objects that share a CUfunction (the same symbol got
   with another signature) then read the function's attributes again before they use them */
extern unsigned cl_fattr_gen;
#define CL_KERNEL_FRESH(k) \
  do { if ((k)->fattr_gen != __atomic_load_n(&cl_fattr_gen, __ATOMIC_RELAXED)) cl_kernel_refresh(k); } while (0)
typedef struct cl_kernel {
  CUfunction fn;
  CUcontext ctx;
  int nparams;
  const void *array_mt;          /* the array metatable of this Lua state: fast type checks */
  unsigned char ptype[CL_MAXPARAMS];   /* each parameter's kind: its row of cl_params */
  unsigned short psize[CL_MAXPARAMS];
  int occ_block, occ_grid;       /* occupancy cache for shared == occ_shared */
  size_t occ_shared;
  unsigned coop_threads, coop_shared;   /* the block and shared size coop_per was found for */
  unsigned coop_per, coop_sms;         /* co-resident blocks per multiprocessor, multiprocessors */
  unsigned dyn_max;              /* dynamic shared memory a launch may ask for without opting in */
  int static_shared, binary_version;
  unsigned req_cluster[3];       /* __cluster_dims__ of the kernel; 0: none */
  unsigned char cache_config;    /* the preference k:set_attribute set last */
  unsigned fattr_gen;            /* cl_fattr_gen when the cached attributes above were read */
} cl_kernel;
void cl_kernel_refresh(cl_kernel *k);
#define CL_KERNEL "cudalua.kernel"
/* a kernel with a launch configuration (launcher.c); its first user value is the kernel. The
   functions below that take a kernel's stack index kidx take a launcher's too, for messages */
#define CL_LAUNCHER "cudalua.launcher"
cl_kernel *cl_checkkernel(lua_State *L, int idx);
/* module_kernel's new kernel object (pushed) for fn of the module at modidx, in ctx: it keeps
   the module and the info table at infoidx ({name=, types={...}}) as its user values */
cl_kernel *cl_kernel_new(lua_State *L, CUfunction fn, CUcontext ctx, int modidx, int infoidx);
/* then its parameters: codes (nc of them; NULL: their sizes asked of the driver, in words into
   the info table's types) checked against the driver; known: the image's count (-1: none);
   verify: the driver is asked whether there are more. sym names it in messages. Then the
   attributes launches check without a driver call */
void cl_kernel_describe(lua_State *L, cl_kernel *k, int infoidx, const char *sym, const char *codes,
                        size_t nc, lua_Integer known, int verify);
#define cl_kernel_ctx(L, k) cl_use_ctx(L, (k)->ctx)        /* its context made current */
void cl_kernel_occupancy(lua_State *L, cl_kernel *k, size_t shared);   /* fills k->occ_* */
/* dynamic shared memory over 48 KiB: opts the kernel in (once per size), or raises with the
   device's limit */
void cl_kernel_shared(lua_State *L, cl_kernel *k, int kidx, unsigned shared);
int cl_kernel_at(lua_State *L, int kidx);   /* the kernel's index: kidx, or a launcher's kernel pushed */
const char *cl_kernel_name(lua_State *L, int kidx);      /* pushes it; slow path only */
int cl_kernel_index(lua_State *L);   /* the kernel's __index: methods and k.name */
void cl_open_kernel(lua_State *L);   /* the kernel type; core.kernel_methods into the table on top */

/* ---- from args.c: kernel arguments converted for the driver ---- */
typedef struct cl_args {
  uint64_t slots[CL_MAXPARAMS][2];
  void *params[CL_MAXPARAMS];
  cl_mem *used[CL_MAXPARAMS];
  int nused;
  struct { cl_array *a; CUdeviceptr d; int back; void *slot; void *host; size_t n; } tmp[CL_MAXPARAMS];
  int ntmp;
} cl_args;
/* converts stack values first..first+nargs-1; pageable host arrays are refused unless
   allow_pageable (then listed in tmp for the caller to copy) */
void cl_marshal(lua_State *L, cl_kernel *k, int kidx, int first, int nargs, cl_args *a,
                int allow_pageable);

/* ---- from launch.c: launches ---- */
/* the kernel k (at kidx: it or its launcher) launched with c and the arguments from first to the
   top of the stack */
int cl_kernel_launch(lua_State *L, cl_kernel *k, int kidx, int first, const cl_launch *c);
void cl_open_launch(lua_State *L);     /* adds k:launch */

/* ---- from launcher.c: launchers ---- */
void cl_open_launcher(lua_State *L);   /* the launcher type; adds k[{grid, block}] and k:forall */

/* ---- capstate.c: what captures, and each capture's keep table ---- */
/* hostfn.c counts them (the layers below read the counts) */
extern int cl_capturing;            /* streams capturing now, in this process (atomic) */
extern int cl_capturing_blocking;   /* blocking streams capturing: the legacy stream is refused */
/* raises where a capture forbids the use: the legacy stream s NULL, or a wait (waits) */
void cl_capture_guard(lua_State *L, cl_stream *s, int waits, const char *where);
cuuint64_t cl_capture_id(lua_State *L, cl_stream *s);   /* 0: s is not capturing */
void cl_capture_begun(lua_State *L, cl_stream *s);    /* its keep table made and registered */
void cl_capture_ended(lua_State *L, cl_stream *s, cuuint64_t id);   /* and dropped */
/* pushes the table that keeps what a capture of s uses alive (s the capture's stream or one
   joined to it) and returns 1; 0 (nothing pushed) when s is not capturing */
int cl_capture_push_keep(lua_State *L, cl_stream *s);
#define CL_CAPTURE_HOSTRECS "cudalua.hostrecs"   /* in a keep table: its host nodes' boxes */
void cl_capture_add_hostrec(lua_State *L, int keepidx, int boxidx);   /* a captured host node */
int cl_capture_abandon(lua_State *L, cl_stream *s);   /* s closes while capturing: 1, ended */

/* ---- nccl.c ---- */
int luaopen_cudalua_nccl_core(lua_State *L);   /* the NCCL functions (core.nccl) */

#endif
