/* dlpack.c: DLPack, the C-level exchange of tensors every array library speaks (PyTorch,
   JAX, CuPy, cuda.core). In: a DLManagedTensorVersioned (DLPack 1.x) or a legacy
   DLManagedTensor becomes a view of its memory, whose deleter cudalua calls once no array uses
   it and queued work is done. Out: an array becomes a DLManagedTensor(Versioned) that keeps
   its memory alive until the consumer calls the deleter, from any thread; the state frees the
   memory at its next DLPack call or its close. The structures below are DLPack's ABI (its
   dlpack.h, v1.0), declared here from the specification. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape, *strides;   /* strides in elements; NULL: C order */
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ull << 0)

/* ---- dtypes ---- */
static const struct { uint8_t code, bits; const char *name; } kinds[] = {
  {kDLInt, 8, "int8"}, {kDLInt, 16, "int16"}, {kDLInt, 32, "int32"}, {kDLInt, 64, "int64"},
  {kDLUInt, 8, "uint8"}, {kDLUInt, 16, "uint16"}, {kDLUInt, 32, "uint32"}, {kDLUInt, 64, "uint64"},
  {kDLFloat, 16, "float16"}, {kDLFloat, 32, "float32"}, {kDLFloat, 64, "float64"},
  {kDLBfloat, 16, "bfloat16"}, {kDLComplex, 64, "complex64"}, {kDLComplex, 128, "complex128"},
  {kDLBool, 8, "bool"}};

static const char *dtype_name(DLDataType t) {
  for (size_t i = 0; t.lanes == 1 && i < sizeof kinds / sizeof *kinds; i++)
    if (kinds[i].code == t.code && kinds[i].bits == t.bits) return kinds[i].name;
  return NULL;
}

static int dtype_code(const char *name, DLDataType *t) {
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    if (!strcmp(kinds[i].name, name)) { t->code = kinds[i].code, t->bits = kinds[i].bits, t->lanes = 1; return 1; }
  return 0;
}

/* ---- in ---- */
typedef struct { void *tensor; int versioned; } owned;

/* the last array over a tensor's memory is gone and its queued work done: the deleter, once */
static void release_tensor(void *ud, CUdeviceptr p) {
  (void)p;
  owned *o = ud;
  if (o->versioned) {
    DLManagedTensorVersioned *v = o->tensor;
    if (v->deleter) v->deleter(v);
  } else {
    DLManagedTensor *m = o->tensor;
    if (m->deleter) m->deleter(m);
  }
  free(o);
}

/* the tensor's description checked: its DLTensor (raises, naming where, before anything is taken) */
static DLTensor *tensor_of(lua_State *L, void *tensor, int versioned, uint64_t *flags, const char *where) {
  if (!tensor) cl_error(L, where, "a NULL tensor");
  *flags = 0;
  if (!versioned) return &((DLManagedTensor *)tensor)->dl_tensor;
  DLManagedTensorVersioned *v = tensor;
  if (v->version.major != 1)
    cl_error(L, where, "a DLPack %d.%d tensor: cudalua reads DLPack 1.x", (int)v->version.major, (int)v->version.minor);
  *flags = v->flags;
  return &v->dl_tensor;
}

static void check_layout(lua_State *L, const DLTensor *t, const char *where) {
  if (t->ndim < 0 || t->ndim > CL_MAXDIM) cl_error(L, where, "a tensor of %d dimensions (0 to %d here)", (int)t->ndim, CL_MAXDIM);
  if (t->ndim && !t->shape) cl_error(L, where, "a tensor of %d dimensions without a shape", (int)t->ndim);
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0) cl_error(L, where, "shape[%d] is %I", i + 1, (lua_Integer)t->shape[i]);
    if (t->strides && t->strides[i] <= 0 && t->shape[i] > 1)
      cl_error(L, where, "strides[%d] is %I: cudalua's views step forwards (strides > 0)", i + 1, (lua_Integer)t->strides[i]);
  }
  switch (t->device.device_type) {
  case kDLCUDA: case kDLCUDAHost: case kDLCUDAManaged: break;
  case kDLCPU: cl_error(L, where, "a CPU tensor (kDLCPU): cudalua takes CUDA memory (device, CUDA host or managed)");
    break;   /* (not reached) */
  default: cl_error(L, where, "device type %d: cudalua takes kDLCUDA (2), kDLCUDAHost (3) and kDLCUDAManaged (13)", (int)t->device.device_type);
  }
}

/* pushes a view of the tensor's memory; owns the tensor from its return (its deleter called
   once no array uses the memory). Raises, the tensor still the caller's, for what does not fit. */
int cl_dlpack_push(lua_State *L, void *tensor, int versioned, const char *where) {
  uint64_t flags;
  DLTensor *t = tensor_of(L, tensor, versioned, &flags, where);
  check_layout(L, t, where);
  const char *dt = dtype_name(t->dtype);
  if (!dt) cl_error(L, where, "dtype code %d, %d bits, %d lanes has no cudalua dtype", (int)t->dtype.code,
                    (int)t->dtype.bits, (int)t->dtype.lanes);
  int nd = t->ndim ? t->ndim : 1, isz = (t->dtype.bits + 7) / 8;
  int64_t one = 1;
  lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.foreign_array");
  lua_pushinteger(L, (lua_Integer)(uintptr_t)((char *)t->data + t->byte_offset));
  lua_pushstring(L, dt);
  lua_createtable(L, nd, 0);
  for (int i = 0; i < nd; i++) { lua_pushinteger(L, t->ndim ? t->shape[i] : one); lua_rawseti(L, -2, i + 1); }
  lua_pushboolean(L, (flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
  lua_pushnil(L);
  if (t->strides && t->ndim) {
    lua_createtable(L, nd, 0);
    for (int i = 0; i < nd; i++) { lua_pushinteger(L, t->strides[i] * isz); lua_rawseti(L, -2, i + 1); }
  } else lua_pushnil(L);
  lua_call(L, 6, 1);   /* (the driver confirms the memory) */
  cl_array *a = lua_touserdata(L, -1);
  int dev = cl_mem_device(a->mem);
  if (t->device.device_type == kDLCUDA && dev != t->device.device_id)
    cl_error(L, where, "the tensor says CUDA device %d, its memory is %s %d's", (int)t->device.device_id,
             dev < 0 ? "no one device's: not device" : "device", dev);
  owned *o = malloc(sizeof *o);
  if (!o) cl_error(L, where, "out of host memory");
  o->tensor = tensor, o->versioned = versioned;
  a->mem->release = release_tensor;
  a->mem->ud = o;
  return 1;
}

/* ---- out ---- */
/* an array handed out: the tensor first (the consumer's pointer is the record's), the memory's
   reference, the state it belongs to (cl_state_id; NULL once that state closed) */
typedef struct exported {
  union { DLManagedTensorVersioned v; DLManagedTensor m; } t;
  int versioned, done;
  cl_mem *mem;
  const void *owner;     /* cl_state_id */
  struct exported *next;
  int64_t shape[CL_MAXDIM], strides[CL_MAXDIM];
} exported;

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static exported *handed;   /* every record not freed yet (out_lock) */

/* the consumer is done (any thread): freed by its state later, or now if that state closed
   (its memory then stays until the last state's close) */
static void finish(exported *x) {
  pthread_mutex_lock(&out_lock);
  x->done = 1;
  int orphan = x->owner == NULL;
  if (orphan) {
    for (exported **p = &handed; *p; p = &(*p)->next) if (*p == x) { *p = x->next; break; }
  }
  pthread_mutex_unlock(&out_lock);
  if (orphan) free(x);
}
static void delete_versioned(DLManagedTensorVersioned *v) { finish((exported *)v); }
static void delete_legacy(DLManagedTensor *m) { finish((exported *)m); }

/* L's records the consumers are done with: their memory let go */
static void collect(lua_State *L) {
  const void *me = cl_state_id(L);
  exported *mine = NULL;
  pthread_mutex_lock(&out_lock);
  for (exported **p = &handed; *p;) {
    exported *x = *p;
    if (x->done && x->owner == me) { *p = x->next; x->next = mine; mine = x; }
    else p = &x->next;
  }
  pthread_mutex_unlock(&out_lock);
  while (mine) { exported *x = mine; mine = x->next; cl_mem_unref(L, x->mem); free(x); }
}

/* L closes: what the consumers are done with is let go; what they still hold is left to them
   (its memory until the last state's close frees every context's) */
void cl_dlpack_close(lua_State *L) {
  collect(L);
  const void *me = cl_state_id(L);
  pthread_mutex_lock(&out_lock);
  for (exported *x = handed; x; x = x->next) if (x->owner == me) x->owner = NULL;
  pthread_mutex_unlock(&out_lock);
}

/* where the tensor's memory is (its device type and id) and its data pointer */
static void device_of(cl_array *a, DLTensor *t) {
  int dev = cl_mem_device(a->mem);
  switch (a->kind) {
  case CL_HOST: t->device = (DLDevice){kDLCPU, 0}; t->data = cl_hostptr(a); return;
  case CL_PINNED: case CL_MAPPED: t->device = (DLDevice){kDLCUDAHost, 0}; t->data = cl_hostptr(a); return;
  case CL_MANAGED: t->device = (DLDevice){kDLCUDAManaged, 0}; break;
  default: t->device = (DLDevice){dev < 0 ? kDLCUDAHost : kDLCUDA, dev < 0 ? 0 : dev}; break;
  }
  t->data = (void *)(uintptr_t)cl_devptr(a);
}

/* the array at idx handed out as a new tensor (the consumer calls its deleter once); its
   queued work is waited for first, as the consumer may use it on any stream */
void *cl_dlpack_export(lua_State *L, int idx, int versioned, const char *where) {
  collect(L);
  cl_array *a = cl_checkarray(L, idx);
  if (a->mem->gmem) cl_error(L, where, "the array's memory is a graph's (it exists only while that graph runs)");
  DLDataType dt;
  if (!dtype_code(cl_dtypes[a->dtype].name, &dt)) cl_error(L, where, "%s has no DLPack dtype", cl_dtypes[a->dtype].name);
  int isz = cl_dtypes[a->dtype].size;
  for (int i = 0; i < a->ndim; i++)
    if (a->strides[i] % isz)
      cl_error(L, where, "strides[%d] is %I bytes, not a whole number of %d-byte items (DLPack counts items)", i + 1,
               (lua_Integer)a->strides[i], isz);
  if (a->mem->used) cl_mem_settle(L, a->mem);
  cl_still_open(L, a, where);
  exported *x = calloc(1, sizeof *x);
  if (!x) cl_error(L, where, "out of host memory");
  DLTensor *t = versioned ? &x->t.v.dl_tensor : &x->t.m.dl_tensor;
  device_of(a, t);
  t->ndim = a->ndim, t->dtype = dt, t->shape = x->shape, t->strides = x->strides;
  for (int i = 0; i < a->ndim; i++) x->shape[i] = a->shape[i], x->strides[i] = a->strides[i] / isz;
  if (versioned) {
    x->t.v.version = (DLPackVersion){1, 0};
    x->t.v.deleter = delete_versioned;
    x->t.v.flags = a->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  } else {
    x->t.m.deleter = delete_legacy;
  }
  x->versioned = versioned, x->mem = cl_mem_ref(a->mem), x->owner = cl_state_id(L);
  pthread_mutex_lock(&out_lock);
  x->next = handed, handed = x;
  pthread_mutex_unlock(&out_lock);
  return x;
}

/* a:to_dlpack([versioned]) -> a light userdata: a DLManagedTensorVersioned (DLPack 1.0; false:
   a legacy DLManagedTensor) the consumer owns */
static int a_to_dlpack(lua_State *L) {
  int versioned = lua_isnoneornil(L, 2) ? 1 : lua_toboolean(L, 2);
  lua_pushlightuserdata(L, cl_dlpack_export(L, 1, versioned, "array:to_dlpack"));
  return 1;
}

/* cuda.from_dlpack(p [, versioned]) -> an array over the tensor p points to, which it owns */
static int l_from_dlpack(lua_State *L) {
  if (lua_type(L, 1) != LUA_TLIGHTUSERDATA) return cl_typeerror(L, 1, "light userdata (a DLManagedTensor pointer)");
  int versioned = lua_isnoneornil(L, 2) ? 1 : lua_toboolean(L, 2);
  collect(L);
  return cl_dlpack_push(L, lua_touserdata(L, 1), versioned, "cuda.from_dlpack");
}

void cl_open_dlpack(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, CL_ARRAY ".methods");
  lua_pushcfunction(L, a_to_dlpack);
  lua_setfield(L, -2, "to_dlpack");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_from_dlpack);
  lua_setfield(L, -2, "from_dlpack");
}
