/* spec/support/embed_harness.c: a C host program built by spec/16-embed_spec.lua against
 * src/cudalua.h and libcudalua.a. It opens cudalua in lua_States of its own with luaL_requiref,
 * gives the script it runs the C API as Lua functions, and reads arrays back through
 * cudalua_to_array (their contents through the host pointer, in C):
 *   embed_harness SCRIPT [N]  runs SCRIPT in a fresh state (N times, one state after another,
 *                             each the last to close); exit 0 when it ran without error
 * Functions the script sees:
 *   c_info(v)                          -> table from cudalua_to_array (values read in C), or false
 *   c_push_device_array(ptr, dtype, ndim, d1, d2, ...)   cudalua_push_device_array, host-owned
 *   c_push_owned(ptr, dtype, n)        the same with a release callback (Lua owns it)
 *   c_released()                       -> how many times the release callback ran
 *   c_push_stream(handle, blocking)    cudalua_push_stream
 *   c_other_state(code)                -> runs code in a second state of its own, returns its
 *                                         result as a string (or raises its error)
 *   c_thread_state(code)               -> the same on a thread of its own, which then ends
 *   c_pid()                            -> the process's id (its threads: /proc/PID/task)
 *   c_dlpack_in(t)                     a DLPack tensor made in C from the table t (ptr, code,
 *                                      bits, lanes, device_type, device_id, versioned,
 *                                      readonly, shape, strides (elements) or nil, version) and
 *                                      pushed with cudalua_push_dlpack; on its error the
 *                                      tensor is freed here and the error raised
 *   c_dl_deleted()                     -> how many such tensors' deleters cudalua called
 *   c_dlpack_out(a, versioned)         -> cudalua_to_dlpack's tensor as a table (its fields read
 *                                         in C) and a handle
 *   c_dlpack_delete(handle, versioned, on_thread)   calls its deleter (on a thread of its own)
 *   c_dlpack_scatter(handles, seed, nthreads)       their deleters (versioned tensors), called by
 *                                      nthreads threads of their own in an order drawn from
 *                                      seed, while the script goes on; c_dlpack_join() waits
 * After the script, the state is closed; "active contexts N" (with a driver: how many devices'
 * primary contexts are still active, cudalua having released its references) and "released N"
 * are printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include "cudalua.h"

static int released;

static void release(void *ud, uint64_t ptr) {
  (void)ptr;
  if (ud == (void *)&released) released++;
}

/* ---- DLPack: the structures of its dlpack.h (v1.0), from the specification ---- */
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct { void *data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t *shape, *strides; uint64_t byte_offset; } DLTensor;
typedef struct DLMT { DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct DLMT *); } DLMT;
typedef struct { uint32_t major, minor; } DLVersion;
typedef struct DLMTV { DLVersion version; void *manager_ctx; void (*deleter)(struct DLMTV *); uint64_t flags; DLTensor dl_tensor; } DLMTV;
typedef struct { union { DLMT m; DLMTV v; } t; int64_t shape[8], strides[8]; int deleted; } made;

static int dl_deleted, dl_twice;
static made *all_made[256];   /* freed at exit: a deleter called twice is counted, not a double free */
static int n_made;
static void made_gone(made *m) {
  if (m->deleted++) { dl_twice++; return; }   /* (a second call is counted, not freed twice) */
  dl_deleted++;
}
static void del_legacy(DLMT *t) { made_gone((made *)t); }
static void del_versioned(DLMTV *t) { made_gone((made *)t); }

static int l_field(lua_State *L, int t, const char *k, lua_Integer d) {
  lua_getfield(L, t, k);
  lua_Integer v = luaL_optinteger(L, -1, d);
  lua_pop(L, 1);
  return (int)v;
}

static int push_made(lua_State *L) {
  made *m = lua_touserdata(L, 1);
  return cudalua_push_dlpack(L, m, (int)lua_tointeger(L, 2));
}

static int c_dlpack_in(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  made *m = calloc(1, sizeof *m);
  int versioned = l_field(L, 1, "versioned", 1);
  DLTensor *t = versioned ? &m->t.v.dl_tensor : &m->t.m.dl_tensor;
  lua_getfield(L, 1, "ptr");
  t->data = (void *)(uintptr_t)lua_tointeger(L, -1);
  lua_pop(L, 1);
  t->dtype = (DLDataType){(uint8_t)l_field(L, 1, "code", 2), (uint8_t)l_field(L, 1, "bits", 32), (uint16_t)l_field(L, 1, "lanes", 1)};
  t->device = (DLDevice){l_field(L, 1, "device_type", 2), l_field(L, 1, "device_id", 0)};
  lua_getfield(L, 1, "shape");
  t->ndim = (int32_t)lua_rawlen(L, -1);
  for (int i = 0; i < t->ndim && i < 8; i++) { lua_rawgeti(L, -1, i + 1); m->shape[i] = lua_tointeger(L, -1); lua_pop(L, 1); }
  lua_pop(L, 1);
  t->shape = m->shape;
  if (lua_getfield(L, 1, "strides") == LUA_TTABLE) {
    for (int i = 0; i < t->ndim && i < 8; i++) { lua_rawgeti(L, -1, i + 1); m->strides[i] = lua_tointeger(L, -1); lua_pop(L, 1); }
    t->strides = m->strides;
  }
  lua_pop(L, 1);
  if (versioned) {
    m->t.v.version = (DLVersion){(uint32_t)l_field(L, 1, "version", 1), 0};
    m->t.v.flags = l_field(L, 1, "readonly", 0) ? 1 : 0;
    m->t.v.deleter = del_versioned;
  } else m->t.m.deleter = del_legacy;
  lua_pushcfunction(L, push_made);
  lua_pushlightuserdata(L, m);
  lua_pushinteger(L, versioned);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) { free(m); return lua_error(L); }   /* (still ours: freed) */
  if (n_made < 256) all_made[n_made++] = m;
  return 1;
}

static int c_dl_deleted(lua_State *L) {
  lua_pushinteger(L, dl_deleted);
  lua_pushinteger(L, dl_twice);
  return 2;
}

static int c_dlpack_out(lua_State *L) {
  int versioned = lua_toboolean(L, 2);
  void *p = cudalua_to_dlpack(L, 1, versioned);
  DLTensor *t = versioned ? &((DLMTV *)p)->dl_tensor : &((DLMT *)p)->dl_tensor;
  lua_createtable(L, 0, 12);
  lua_pushinteger(L, (lua_Integer)(uintptr_t)t->data); lua_setfield(L, -2, "ptr");
  lua_pushinteger(L, t->device.device_type); lua_setfield(L, -2, "device_type");
  lua_pushinteger(L, t->device.device_id); lua_setfield(L, -2, "device_id");
  lua_pushinteger(L, t->dtype.code); lua_setfield(L, -2, "code");
  lua_pushinteger(L, t->dtype.bits); lua_setfield(L, -2, "bits");
  lua_pushinteger(L, t->dtype.lanes); lua_setfield(L, -2, "lanes");
  lua_pushinteger(L, (lua_Integer)t->byte_offset); lua_setfield(L, -2, "byte_offset");
  lua_createtable(L, t->ndim, 0);
  for (int i = 0; i < t->ndim; i++) { lua_pushinteger(L, t->shape[i]); lua_rawseti(L, -2, i + 1); }
  lua_setfield(L, -2, "shape");
  lua_createtable(L, t->ndim, 0);
  for (int i = 0; t->strides && i < t->ndim; i++) { lua_pushinteger(L, t->strides[i]); lua_rawseti(L, -2, i + 1); }
  lua_setfield(L, -2, "strides");
  if (versioned) {
    lua_pushinteger(L, (lua_Integer)((DLMTV *)p)->flags); lua_setfield(L, -2, "flags");
    lua_pushinteger(L, ((DLMTV *)p)->version.major); lua_setfield(L, -2, "version");
  }
  lua_pushlightuserdata(L, p);
  return 2;
}

static void *delete_on_thread(void *arg) {
  void **a = arg;
  if (a[1]) ((DLMTV *)a[0])->deleter(a[0]); else ((DLMT *)a[0])->deleter(a[0]);
  return NULL;
}

/* the scattered deleters: a shuffled list taken from by several threads at once */
static void *scatter_items[4096];
static int scatter_n, scatter_next, scatter_threads;
static pthread_t scatter_ids[16];
static void *scatter_main(void *arg) {
  (void)arg;
  for (;;) {
    int i = __atomic_fetch_add(&scatter_next, 1, __ATOMIC_SEQ_CST);
    if (i >= scatter_n) return NULL;
    DLMTV *t = scatter_items[i];
    if (i % 7 == 0) usleep(50);   /* (some late, while the state exports and collects) */
    t->deleter(t);
  }
}

static int c_dlpack_scatter(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  unsigned seed = (unsigned)luaL_checkinteger(L, 2);
  int nt = (int)luaL_checkinteger(L, 3);
  scatter_n = (int)lua_rawlen(L, 1);
  if (scatter_n > 4096 || nt < 1 || nt > 16) return luaL_error(L, "c_dlpack_scatter: too many");
  for (int i = 0; i < scatter_n; i++) { lua_rawgeti(L, 1, i + 1); scatter_items[i] = lua_touserdata(L, -1); lua_pop(L, 1); }
  for (int i = scatter_n - 1; i > 0; i--) {   /* the seed's order */
    int k = (int)(rand_r(&seed) % (unsigned)(i + 1));
    void *x = scatter_items[i]; scatter_items[i] = scatter_items[k]; scatter_items[k] = x;
  }
  scatter_next = 0, scatter_threads = nt;
  for (int i = 0; i < nt; i++) pthread_create(&scatter_ids[i], NULL, scatter_main, NULL);
  return 0;
}

static int c_dlpack_join(lua_State *L) {
  for (int i = 0; i < scatter_threads; i++) pthread_join(scatter_ids[i], NULL);
  scatter_threads = 0;
  (void)L;
  return 0;
}

static int c_dlpack_delete(lua_State *L) {
  void *a[2] = {lua_touserdata(L, 1), (void *)(uintptr_t)lua_toboolean(L, 2)};
  if (lua_toboolean(L, 3)) {
    pthread_t th;
    pthread_create(&th, NULL, delete_on_thread, a);
    pthread_join(th, NULL);
  } else delete_on_thread(a);
  return 0;
}

static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "cudalua", luaopen_cudalua, 1);   /* a global, and in package.loaded */
  lua_pop(L, 1);
  return L;
}

static void push_value(lua_State *L, const char *dt, const char *p) {
  if (!strcmp(dt, "float32")) { float v; memcpy(&v, p, 4); lua_pushnumber(L, v); }
  else if (!strcmp(dt, "float64")) { double v; memcpy(&v, p, 8); lua_pushnumber(L, v); }
  else if (!strcmp(dt, "int8")) { int8_t v; memcpy(&v, p, 1); lua_pushinteger(L, v); }
  else if (!strcmp(dt, "int16")) { int16_t v; memcpy(&v, p, 2); lua_pushinteger(L, v); }
  else if (!strcmp(dt, "int32")) { int32_t v; memcpy(&v, p, 4); lua_pushinteger(L, v); }
  else if (!strcmp(dt, "int64")) { int64_t v; memcpy(&v, p, 8); lua_pushinteger(L, v); }
  else if (!strcmp(dt, "uint8")) { uint8_t v; memcpy(&v, p, 1); lua_pushinteger(L, v); }
  else if (!strcmp(dt, "uint16")) { uint16_t v; memcpy(&v, p, 2); lua_pushinteger(L, v); }
  else if (!strcmp(dt, "uint32")) { uint32_t v; memcpy(&v, p, 4); lua_pushinteger(L, v); }
  else lua_pushnil(L);
}

static int c_info(lua_State *L) {
  cudalua_array_info in;
  memset(&in, 0x5a, sizeof in);
  lua_settop(L, 1);
  if (!cudalua_to_array(L, 1, &in)) { lua_pushboolean(L, 0); return 1; }
  lua_newtable(L);
  lua_pushinteger(L, (lua_Integer)in.ptr); lua_setfield(L, -2, "ptr");
  lua_pushboolean(L, in.host != NULL); lua_setfield(L, -2, "has_host");
  lua_pushinteger(L, in.ndim); lua_setfield(L, -2, "ndim");
  lua_createtable(L, in.ndim, 0);
  int64_t count = 1;
  for (int i = 0; i < in.ndim; i++) { lua_pushinteger(L, in.shape[i]); lua_rawseti(L, -2, i + 1); count *= in.shape[i]; }
  lua_setfield(L, -2, "shape");
  lua_pushstring(L, in.dtype); lua_setfield(L, -2, "dtype");
  lua_pushinteger(L, in.itemsize); lua_setfield(L, -2, "itemsize");
  lua_pushinteger(L, (lua_Integer)in.nbytes); lua_setfield(L, -2, "nbytes");
  lua_pushinteger(L, (lua_Integer)(uintptr_t)in.stream); lua_setfield(L, -2, "stream");
  if (in.host) {
    lua_createtable(L, (int)count, 0);
    for (int64_t i = 0; i < count; i++) {
      push_value(L, in.dtype, (const char *)in.host + i * in.itemsize);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "values");
  }
  return 1;
}

static int c_push_device_array(lua_State *L) {
  uint64_t ptr = (uint64_t)luaL_checkinteger(L, 1);
  const char *dt = luaL_checkstring(L, 2);
  int ndim = (int)luaL_checkinteger(L, 3);
  int64_t shape[16] = {0};
  for (int i = 0; i < 16; i++) shape[i] = luaL_optinteger(L, 4 + i, 1);
  return cudalua_push_device_array(L, ptr, dt, ndim, shape, NULL, NULL);
}

static int c_push_owned(lua_State *L) {
  uint64_t ptr = (uint64_t)luaL_checkinteger(L, 1);
  const char *dt = luaL_checkstring(L, 2);
  int64_t shape[1] = {luaL_checkinteger(L, 3)};
  return cudalua_push_device_array(L, ptr, dt, 1, shape, release, &released);
}

static int c_released(lua_State *L) {
  lua_pushinteger(L, released);
  return 1;
}

static int c_push_stream(lua_State *L) {
  void *h = (void *)(uintptr_t)luaL_checkinteger(L, 1);
  return cudalua_push_stream(L, h, lua_toboolean(L, 2));
}

static int c_other_state(lua_State *L) {
  const char *code = luaL_checkstring(L, 1);
  lua_State *L2 = new_state();
  int ok = luaL_dostring(L2, code) == LUA_OK;
  lua_pushstring(L, luaL_tolstring(L2, -1, NULL));
  lua_close(L2);
  if (!ok) return lua_error(L);
  return 1;
}

typedef struct { const char *code; char *result; int ok; } job;

static void *thread_main(void *arg) {
  job *j = arg;
  lua_State *L2 = new_state();
  j->ok = luaL_dostring(L2, j->code) == LUA_OK;
  j->result = strdup(luaL_tolstring(L2, -1, NULL));
  lua_close(L2);
  return NULL;
}

static int c_pid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

static int c_thread_state(lua_State *L) {
  job j = {luaL_checkstring(L, 1), NULL, 0};
  pthread_t t;
  if (pthread_create(&t, NULL, thread_main, &j) != 0) return luaL_error(L, "pthread_create failed");
  pthread_join(t, NULL);
  lua_pushstring(L, j.result ? j.result : "(out of memory)");
  free(j.result);
  if (!j.ok) return lua_error(L);
  return 1;
}

/* SCRIPT run in a fresh state, closed after */
static int run_script(const char *path) {
  lua_State *L = new_state();
  lua_register(L, "c_info", c_info);
  lua_register(L, "c_push_device_array", c_push_device_array);
  lua_register(L, "c_push_owned", c_push_owned);
  lua_register(L, "c_released", c_released);
  lua_register(L, "c_push_stream", c_push_stream);
  lua_register(L, "c_other_state", c_other_state);
  lua_register(L, "c_thread_state", c_thread_state);
  lua_register(L, "c_pid", c_pid);
  lua_register(L, "c_dlpack_in", c_dlpack_in);
  lua_register(L, "c_dl_deleted", c_dl_deleted);
  lua_register(L, "c_dlpack_out", c_dlpack_out);
  lua_register(L, "c_dlpack_delete", c_dlpack_delete);
  lua_register(L, "c_dlpack_scatter", c_dlpack_scatter);
  lua_register(L, "c_dlpack_join", c_dlpack_join);
  int status = luaL_dofile(L, path);
  if (status != LUA_OK) fprintf(stderr, "script error: %s\n", lua_tostring(L, -1));
  lua_close(L);
  return status;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s SCRIPT [N]\n", argv[0]); return 2; }
  int times = argc > 2 ? atoi(argv[2]) : 1, status = LUA_OK;
  for (int i = 0; i < times && status == LUA_OK; i++) status = run_script(argv[1]);
  /* the driver as this program sees it, cudalua's state gone (dlopen: no link to libcuda) */
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) { dlerror(); dlerror(); }   /* the message read, then freed (LSan: a leak at exit) */
  int (*count)(int *) = cuda ? (int (*)(int *))dlsym(cuda, "cuDeviceGetCount") : NULL;
  int (*state)(int, unsigned *, int *) = cuda ? (int (*)(int, unsigned *, int *))dlsym(cuda, "cuDevicePrimaryCtxGetState") : NULL;
  int n = 0, active = 0;
  if (count && state && count(&n) == 0) {
    for (int d = 0; d < n; d++) {
      unsigned flags; int on = 0;
      if (state(d, &flags, &on) == 0 && on) active++;
    }
    printf("active contexts %d\n", active);
  }
  printf("released %d\n", released);
  for (int i = 0; i < n_made; i++) free(all_made[i]);
  return status == LUA_OK ? 0 : 1;
}
