/* memory.c: the memory blocks behind arrays. A block is reference counted by the arrays and
   views that point into it, remembers the stream that last used it, and is freed in that
   stream's order (device memory) or after that stream is done (host memory), so memory is never
   released while queued work may still use it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>
#include "cl.h"

#define BIG (2u << 20)          /* pageable arrays this large are mmapped with huge pages */
#define REGISTER_MIN (1u << 20) /* and page-locked on their first copy */

/* a failed free is said: through Lua's warning system where a state is at hand (shown once
   warnings are on: lua -W, warn("@on")), else on stderr (a cached block freed for a stream
   that is going away has no state) */
static void warn(lua_State *L, const char *what, CUresult r) {
  char buf[200];
  snprintf(buf, sizeof buf, "cudalua: %s failed while freeing memory: %s", what, cl_errname(r));
  if (L) lua_warning(L, buf, 0);
  else fprintf(stderr, "%s\n", buf);
}

void cl_mem_use(lua_State *L, cl_mem *m, cl_stream *s, CUcontext ctx) {
  if (m->used && m->stream == s && ctx == m->use_ctx) return;
  /* another stream: the legacy stream orders blocking streams, not non-blocking ones; work of
     two devices, or another device's on device memory, is waited for on every device. Never
     back down: that order is still owed */
  int other = m->used ? ctx != m->use_ctx
                      : m->kind != CL_HOST && !m->portable && m->ctx && ctx != m->ctx;
  if (other) m->spread = CL_OTHER_DEVICES;
  else if (m->used && m->spread < CL_OTHER_DEVICES)
    m->spread = m->spread == CL_ANY_STREAMS || (m->stream && !m->stream->blocking) || (s && !s->blocking)
              ? CL_ANY_STREAMS : CL_BLOCKING_STREAMS;
  cl_stream_ref(s);
  /* with the state: the stream's object is mostly still there, but one closed or collected
     makes this the last reference, whose cuStreamDestroy waits on a driver lock a device-wide
     wait of another thread holds (tools/stress.lua hung there): parked, then */
  cl_stream_unref(L, m->stream);
  m->stream = s;
  m->use_ctx = ctx;
  m->used = 1;
}

/* the n blocks work queued on s uses; while s captures, its capture holds them (closing their
   arrays, CUDA arrays or textures before the capture ends then frees nothing the graph uses) */
void cl_mem_use_n(lua_State *L, cl_mem *const *m, int n, cl_stream *s, CUcontext ctx) {
  for (int i = 0; i < n; i++) cl_mem_use(L, m[i], s, ctx);
  if (cl_capturing) cl_mem_capture_use(L, s, m, n);
}

int cl_mem_device(const cl_mem *m) { return m->portable || m->kind == CL_HOST ? -1 : cl_device_of(m->ctx); }

int cl_mem_reachable(const cl_mem *m, CUcontext ctx) {
  return m->ctx == ctx || m->portable || m->kind == CL_HOST || cl_peer_enabled(ctx, m->ctx);
}

void cl_mem_reach(lua_State *L, cl_mem *m, CUcontext ctx, const char *where) {
  if (cl_mem_reachable(m, ctx)) return;
  int a = cl_device_of(ctx), b = cl_device_of(m->ctx);
  cl_error(L, where, "the array is on device %d and the work on device %d "
             "(cuda.enable_peer_access(%d, %d) lets device %d use device %d's memory)", b, a, a, b, a, b);
}

/* waits until no queued work uses m, in the context that queued it; returns a CUDA status,
   never raises */
static CUresult settle(lua_State *L, cl_mem *m) {
  if (!m->used) return CUDA_SUCCESS;
  CUresult r;
  if (m->spread == CL_OTHER_DEVICES) r = cl_sync_all_devices(L);   /* checks for a running host function itself */
  else {   /* in the context that used it: the legacy stream is a context's */
    cl_wait_check(L);   /* before switching: a raise must not leave another context current */
    CUcontext prev = m->use_ctx ? cl_ctx_swap(m->use_ctx) : NULL;
    r = m->spread != CL_ONE_STREAM ? cl_wait_raw(L, CL_WAIT_CTX, NULL)
                                   : cl_wait_raw(L, CL_WAIT_STREAM, m->stream ? m->stream->h : NULL);
    if (prev) cl_ctx_swap(prev);
  }
  if (r == CUDA_SUCCESS) {
    cl_stream_unref(L, m->stream);
    m->stream = NULL; m->used = 0; m->spread = CL_ONE_STREAM;
  }
  return r;
}

void cl_mem_settle(lua_State *L, cl_mem *m) {
  if (!m->used) return;
  cl_wait_result(L, settle(L, m), "waiting for queued work on an array");
  cl_host_raise(L);
}

/* a context's legacy stream orders its own work, not another device's: stream-less work on m
   (finished on return, or ordered after all earlier work) first waits for the other device's */
void cl_mem_order(lua_State *L, cl_mem *m, CUcontext a, CUcontext b) {
  if (m->used && (m->spread == CL_OTHER_DEVICES || (m->use_ctx != a && m->use_ctx != b))) cl_mem_settle(L, m);
}

int cl_pageable_prepare(lua_State *L, cl_mem *m) {
  if (m->kind != CL_HOST || m->registered != CL_UNREGISTERED || m->bytes < REGISTER_MIN)
    return m->registered == CL_REGISTERED;
  /* page-locking once lets every later copy run at pinned speed; if the system refuses
     (memlock limits), copies go the driver's pageable way */
  m->registered = CU(cuMemHostRegister, m->host, m->bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS
                ? CL_REGISTERED : CL_REGISTER_FAILED;
  return m->registered == CL_REGISTERED;
}

/* Lua's collector sees only the small userdata of an array, not the memory behind it: after
   every so many bytes of GPU-visible memory a full collection frees what is unreachable. One
   count for the process, changed atomically (states on other threads allocate too). */
static size_t pressure;
#define PRESSURE_LIMIT ((size_t)1 << 31)

static void collect(lua_State *L) {
  __atomic_store_n(&pressure, 0, __ATOMIC_RELAXED);
  lua_gc(L, LUA_GCCOLLECT);
}

static void pressure_add(lua_State *L, size_t bytes) {
  if (__atomic_add_fetch(&pressure, bytes, __ATOMIC_RELAXED) > PRESSURE_LIMIT) collect(L);
}

static void pressure_sub(size_t bytes) {
  size_t p = __atomic_load_n(&pressure, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&pressure, &p, p > bytes ? p - bytes : 0, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

/* ---- statistics and limits (cuda.memory_stats, cuda.set_memory_limit), a device each: the
   process's, as the states share the devices and the block cache. Changed atomically; a
   reader sees each count as it was at some moment, not all of them at one. ---- */
typedef struct {
  size_t used, peak;         /* device arrays' bytes (cudalua's allocations), and the highest */
  size_t pinned, managed;    /* pinned and mapped host memory, managed memory, made in its context */
  size_t allocs, total, hits;   /* live allocations, all since the last reset, those the cache served */
  size_t limit;              /* device bytes held (in use and cached) allowed; 0: none */
} mem_stats;
static mem_stats stats[CL_MAXDEV];

static size_t *stat_field(cl_mem *m, mem_stats *st) {
  return m->kind == CL_DEVICE ? &st->used : m->kind == CL_MANAGED ? &st->managed : &st->pinned;
}

/* m was allocated (or taken from the cache) */
static void stat_add(cl_mem *m, int hit) {
  int d = cl_device_of(m->ctx);
  if (d < 0 || m->counted) return;
  mem_stats *st = &stats[d];
  size_t now = __atomic_add_fetch(stat_field(m, st), m->bytes, __ATOMIC_RELAXED);
  size_t peak = __atomic_load_n(&st->peak, __ATOMIC_RELAXED);
  while (m->kind == CL_DEVICE && now > peak &&
         !__atomic_compare_exchange_n(&st->peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  __atomic_add_fetch(&st->allocs, 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&st->total, 1, __ATOMIC_RELAXED);
  if (hit) __atomic_add_fetch(&st->hits, 1, __ATOMIC_RELAXED);
  m->counted = d + 1;
}

/* m is freed, or goes to the cache */
static void stat_sub(cl_mem *m) {
  if (!m->counted) return;
  mem_stats *st = &stats[m->counted - 1];
  __atomic_sub_fetch(stat_field(m, st), m->bytes, __ATOMIC_RELAXED);
  __atomic_sub_fetch(&st->allocs, 1, __ATOMIC_RELAXED);
  m->counted = 0;
}

/* ---- stream handles: memory last used on a stream keeps it (freed in its order after the
   Lua object is gone); the last reference destroys it ---- */

cl_stream *cl_stream_ref(cl_stream *s) { if (s) s->refs++; return s; }

/* queued work still completes after destroy; memory freed on it was ordered before */
static void destroy(lua_State *L, void *p, void *unused) {
  cl_stream *s = p;
  (void)unused;
  if (s->owned) cl_mem_forget_stream(L, s);   /* blocks cached for reuse on it are freed on it */
  if (s->owned && s->h) CU(cuStreamDestroy, s->h);
  free(s);
}

void cl_stream_unref(lua_State *L, cl_stream *s) {
  if (!s || --s->refs > 0) return;
  /* inside a host function (a launcher collected there, say) the driver is not called */
  if (!(cl_in_hostfn && cl_defer_call(NULL, 0, destroy, s, NULL))) destroy(L, s, NULL);
}

/* ---- the block cache ----
   Device blocks freed by arrays are kept a while for the next allocation of the same size on
   the same stream (CuPy's pool does the same): a pool call costs about as much as a whole small
   array does in Lua, and arrays are made and dropped in loops. A block is handed out again only
   in the order of the stream it was freed on, as the driver's pool itself does, so queued work
   that used it is done before new work on that stream touches it. Bounded in blocks and bytes;
   this state's are emptied before an allocation is retried after out-of-memory (another
   state's stay: see below). One cache for the process,
   shared by the states on other threads, but a block is freed only by the state that cached
   it: a free is queued on the block's stream, and another state's stream may be capturing
   (the free would land in its graph and spoil the capture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
   in tools/stress.c, seed 1699, when a thread's eviction raced a capture's beginning). A state
   that finds only others' blocks in a full cache frees its own block at once instead. So a
   stream's blocks are freed only on its own state's thread, the one that destroys it. */
#define SLOTS 32
typedef struct { CUdeviceptr p; size_t bytes; CUcontext ctx; cl_stream *s; const void *owner; } block;
static block cache[SLOTS];      /* oldest first */
static int ncache;
static size_t cached, cache_limit = (size_t)128 << 20;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

/* the state L belongs to (its main thread): the owner of the blocks it caches. NULL (no state:
   the last one is closing) owns every block */
const void *cl_state_id(lua_State *L) {
  if (!L) return NULL;
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  const void *id = lua_topointer(L, -1);
  lua_pop(L, 1);
  return id;
}

static int owns(const void *me, int i) { return !me || cache[i].owner == me; }

/* takes cache[i] out into *out (cache_mu held); it is freed by free_blocks once the lock is
   let go: a free may park the Lua thread (hostfn.c), and a host function run meanwhile may
   allocate */
static void evict(int i, block *out) {
  *out = cache[i];
  cached -= cache[i].bytes;
  memmove(&cache[i], &cache[i + 1], (size_t)(--ncache - i) * sizeof *cache);
}

/* the oldest block of me's into *out; 0 when it has none cached (cache_mu held) */
static int evict_oldest(const void *me, block *out) {
  for (int i = 0; i < ncache; i++)
    if (owns(me, i)) { evict(i, out); return 1; }
  return 0;
}

/* frees evicted blocks in the order of their streams (L may be NULL) */
static void free_blocks(lua_State *L, block *v, int n) {
  for (int i = 0; i < n; i++) {
    CUcontext prev = cl_ctx_swap(v[i].ctx);
    CUresult r = CU(cuMemFreeAsync, v[i].p, v[i].s ? v[i].s->h : NULL);
    if (r != CUDA_SUCCESS) warn(L, "cuMemFreeAsync", r);
    cl_ctx_swap(prev);
  }
}

/* keeps a freed block; 0 when it is not kept (too big, capturing, a stream not ours, or no room
   left once this state's own older blocks are gone) */
static int cache_put(lua_State *L, CUdeviceptr p, size_t bytes, CUcontext ctx, cl_stream *s) {
  if (!L || bytes > cache_limit / 8 || cl_capturing || (s && !s->owned)) return 0;
  const void *me = cl_state_id(L);
  block out[SLOTS];
  int n = 0;
  pthread_mutex_lock(&cache_mu);
  int room = 1;
  if (ncache == SLOTS || cached + bytes > cache_limit) {
    /* full: room once all of this state's blocks were gone? If not, none of them goes for
       nothing (counted only here: every free of a device array comes through) */
    int mine = 0;
    size_t mine_bytes = 0;
    for (int i = 0; i < ncache; i++)
      if (cache[i].owner == me) { mine++; mine_bytes += cache[i].bytes; }
    room = (ncache < SLOTS || mine) && cached - mine_bytes + bytes <= cache_limit;
    while (room && ncache && (ncache == SLOTS || cached + bytes > cache_limit) && evict_oldest(me, &out[n])) n++;
  }
  if (room) {
    cache[ncache++] = (block){p, bytes, ctx, s, me};
    cached += bytes;
  }
  pthread_mutex_unlock(&cache_mu);
  free_blocks(L, out, n);
  return room;
}

static CUdeviceptr cache_get(size_t bytes, CUcontext ctx, cl_stream *s) {
  CUdeviceptr p = 0;
  if (cl_capturing) return 0;   /* allocations in a capture become graph nodes */
  pthread_mutex_lock(&cache_mu);
  for (int i = ncache - 1; i >= 0; i--)
    if (cache[i].bytes == bytes && cache[i].s == s && cache[i].ctx == ctx) {
      p = cache[i].p;
      cached -= bytes;
      memmove(&cache[i], &cache[i + 1], (size_t)(--ncache - i) * sizeof *cache);
      break;
    }
  pthread_mutex_unlock(&cache_mu);
  return p;
}

/* frees the cached blocks of stream s (it is being destroyed), or with s NULL those of L's
   state (all of them with L NULL); with a limit, the oldest of them until at most limit bytes
   are cached */
static void cache_drop(lua_State *L, cl_stream *s, size_t limit) {
  const void *me = s ? NULL : cl_state_id(L);
  block out[SLOTS];
  int n = 0;
  pthread_mutex_lock(&cache_mu);
  if (s) {
    for (int i = ncache - 1; i >= 0; i--)
      if (cache[i].s == s) evict(i, &out[n++]);
  } else {
    while (cached > limit && evict_oldest(me, &out[n])) n++;
  }
  pthread_mutex_unlock(&cache_mu);
  free_blocks(L, out, n);
}

/* s is being destroyed (its state's thread, the only one that frees its blocks): its blocks
   are freed on it first */
void cl_mem_forget_stream(lua_State *L, cl_stream *s) {
  if (__atomic_load_n(&ncache, __ATOMIC_SEQ_CST)) cache_drop(L, s, 0);
}

/* L's state is closing: the blocks it cached (on the legacy stream: its streams are gone) */
void cl_mem_forget_state(lua_State *L) {
  if (__atomic_load_n(&ncache, __ATOMIC_SEQ_CST)) cache_drop(L, NULL, 0);
}

/* cuda.block_cache([max_bytes]) -> bytes cached now, the limit before the call (to restore it
   later); 0 turns the cache off */
static int l_block_cache(lua_State *L) {
  size_t before = cache_limit;
  if (!lua_isnoneornil(L, 1)) {
    int isint;
    lua_Integer v = lua_tointegerx(L, 1, &isint);
    if (!isint || v < 0)
      return cl_error(L, "cuda.block_cache", "max_bytes must be an integer >= 0, got %s", luaL_tolstring(L, 1, NULL));
    pthread_mutex_lock(&cache_mu);
    cache_limit = (size_t)v;
    pthread_mutex_unlock(&cache_mu);
    cache_drop(L, NULL, (size_t)v);
  }
  pthread_mutex_lock(&cache_mu);
  lua_pushinteger(L, (lua_Integer)cached);
  pthread_mutex_unlock(&cache_mu);
  lua_pushinteger(L, (lua_Integer)before);
  return 2;
}

/* cuda.empty_cache(): frees the blocks this state cached, now (the limit stays) */
static int l_empty_cache(lua_State *L) {
  if (ncache) cache_drop(L, NULL, 0);
  return 0;
}

/* bytes the block cache holds on device d */
static size_t cached_on(int d) {
  size_t n = 0;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < ncache; i++)
    if (cl_device_of(cache[i].ctx) == d) n += cache[i].bytes;
  pthread_mutex_unlock(&cache_mu);
  return n;
}

/* a device block of m's size would pass its device's limit (in use and cached) */
#define CL_OVER_LIMIT ((CUresult)0x7ffffff0)
static int over_limit(const cl_mem *m) {
  int d = cl_device_of(m->ctx);
  size_t lim = d < 0 ? 0 : __atomic_load_n(&stats[d].limit, __ATOMIC_RELAXED);
  return lim && __atomic_load_n(&stats[d].used, __ATOMIC_RELAXED) + cached_on(d) + m->bytes > lim;
}

static void over_limit_error(lua_State *L, size_t bytes, int d, const char *what) {
  cl_error(L, what, "%I more bytes would pass device %d's memory limit of %I bytes (cuda.set_memory_limit): "
           "%I bytes are in use by arrays and %I cached", (lua_Integer)bytes, d, (lua_Integer)stats[d].limit,
           (lua_Integer)stats[d].used, (lua_Integer)cached_on(d));
}

/* [device]: an id, else the current device's */
static int stats_device(lua_State *L, int idx, const char *where) {
  cl_need_driver(L);
  int n = cl_ndevices();
  if (lua_isnoneornil(L, idx)) return cl_current_device();
  int isint = 0;
  lua_Integer d = lua_type(L, idx) == LUA_TNUMBER ? lua_tointegerx(L, idx, &isint) : 0;
  if (!isint) return cl_error(L, where, "argument %d: expected a device id, got %s", idx, luaL_typename(L, idx));
  if (d < 0 || d >= n) return cl_error(L, where, "device id %d out of range (0..%d)", (int)d, n - 1);
  return (int)d;
}

/* device d's stream-ordered pool (the one device arrays come from): 0 when the driver has none */
static int pool_of(int d, CUmemoryPool *pool) {
  CUdevice dev;
  return CU0(cuDeviceGet, &dev, d) == CUDA_SUCCESS && CU0(cuDeviceGetDefaultMemPool, pool, dev) == CUDA_SUCCESS;
}

/* the pool's attribute a, 0 where it cannot say */
static lua_Integer pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  return CU0(cuMemPoolGetAttribute, pool, a, &v) == CUDA_SUCCESS ? (lua_Integer)v : 0;
}

static void set_int(lua_State *L, const char *k, size_t v) { lua_pushinteger(L, (lua_Integer)v); lua_setfield(L, -2, k); }

/* cuda.memory_stats([device]) -> a table of the device's counts */
static int l_memory_stats(lua_State *L) {
  int d = stats_device(L, 1, "cuda.memory_stats");
  mem_stats *st = &stats[d];
  size_t used = __atomic_load_n(&st->used, __ATOMIC_RELAXED), cached = cached_on(d);
  lua_createtable(L, 0, 16);
  set_int(L, "device", (size_t)d);
  set_int(L, "used_bytes", used);
  set_int(L, "cached_bytes", cached);
  set_int(L, "total_bytes", used + cached);
  set_int(L, "peak_used_bytes", __atomic_load_n(&st->peak, __ATOMIC_RELAXED));
  set_int(L, "pinned_bytes", __atomic_load_n(&st->pinned, __ATOMIC_RELAXED));
  set_int(L, "managed_bytes", __atomic_load_n(&st->managed, __ATOMIC_RELAXED));
  set_int(L, "allocations", __atomic_load_n(&st->allocs, __ATOMIC_RELAXED));
  set_int(L, "allocations_total", __atomic_load_n(&st->total, __ATOMIC_RELAXED));
  set_int(L, "cache_hits", __atomic_load_n(&st->hits, __ATOMIC_RELAXED));
  set_int(L, "limit", __atomic_load_n(&st->limit, __ATOMIC_RELAXED));
  /* the pool's query ends a stream capture begun in global mode (anywhere in the process: an
     H100 said CUDA_ERROR_STREAM_CAPTURE_INVALIDATED): asked only while none can begin */
  if (cl_ctx_claim()) {
    CUmemoryPool pool = NULL;
    int ok = pool_of(d, &pool);   /* (no pool: every count 0, as before) */
    set_int(L, "reserved_bytes", ok ? (size_t)pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) : 0);
    set_int(L, "peak_reserved_bytes", ok ? (size_t)pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) : 0);
    set_int(L, "pool_used_bytes", ok ? (size_t)pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) : 0);
    set_int(L, "peak_pool_used_bytes", ok ? (size_t)pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) : 0);
    cl_ctx_unclaim();
  }
  return 1;
}

/* cuda.reset_memory_stats([device]): the peaks become what is used now (the driver's pool's
   too), the counts since the last reset start again */
static int l_reset_memory_stats(lua_State *L) {
  int d = stats_device(L, 1, "cuda.reset_memory_stats");
  mem_stats *st = &stats[d];
  __atomic_store_n(&st->peak, __atomic_load_n(&st->used, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
  __atomic_store_n(&st->total, __atomic_load_n(&st->allocs, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
  __atomic_store_n(&st->hits, 0, __ATOMIC_RELAXED);
  CUmemoryPool pool;
  cuuint64_t zero = 0;   /* (the driver takes 0 only: the mark becomes the current value) */
  if (!cl_ctx_claim()) return 0;   /* (a capture runs: as memory_stats, the pool is left alone) */
  if (pool_of(d, &pool)) {
    CU0(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
    CU0(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
  }
  cl_ctx_unclaim();
  return 0;
}

/* {fraction = f}: that part of device d's memory, as CuPy's set_limit(fraction=) */
static lua_Integer limit_fraction(lua_State *L, int d) {
  const char *where = "cuda.set_memory_limit";
  cl_check_options(L, 1, where, (const char *const[]){"fraction", NULL});
  lua_getfield(L, 1, "fraction");
  int isnum;
  lua_Number f = lua_tonumberx(L, -1, &isnum);
  if (!isnum || !(f >= 0 && f <= 1)) cl_error(L, where, "fraction must be a number from 0 to 1, got %s", luaL_tolstring(L, -1, NULL));
  CUdevice dev;
  size_t total = 0;
  if (CU0(cuDeviceGet, &dev, d) != CUDA_SUCCESS || CU0(cuDeviceTotalMem, &total, dev) != CUDA_SUCCESS)
    cl_error(L, where, "the device's memory size is unknown");
  lua_pop(L, 1);
  return (lua_Integer)(f * (lua_Number)total);
}

/* cuda.set_memory_limit(bytes | {fraction = f} [, device]) -> the limit before (0: none); 0 or
   nil: no limit */
static int l_set_memory_limit(lua_State *L) {
  lua_Integer v = 0;
  int d = stats_device(L, 2, "cuda.set_memory_limit");
  if (lua_istable(L, 1)) {
    v = limit_fraction(L, d);
  } else if (!lua_isnoneornil(L, 1)) {
    int isint;
    v = lua_tointegerx(L, 1, &isint);
    if (!isint || v < 0)
      return cl_error(L, "cuda.set_memory_limit", "bytes must be an integer >= 0 (0 or nil: no limit) or {fraction = f}, got %s",
                      luaL_tolstring(L, 1, NULL));
  }
  lua_pushinteger(L, (lua_Integer)__atomic_exchange_n(&stats[d].limit, (size_t)v, __ATOMIC_RELAXED));
  return 1;
}

void cl_open_memory(lua_State *L) {
  lua_pushcfunction(L, l_block_cache); lua_setfield(L, -2, "block_cache");
  lua_pushcfunction(L, l_empty_cache); lua_setfield(L, -2, "empty_cache");
  lua_pushcfunction(L, l_memory_stats); lua_setfield(L, -2, "memory_stats");
  lua_pushcfunction(L, l_reset_memory_stats); lua_setfield(L, -2, "reset_memory_stats");
  lua_pushcfunction(L, l_set_memory_limit); lua_setfield(L, -2, "set_memory_limit");
}

/* on out-of-memory: collect, let queued frees finish, give the pool's spare memory back */
void cl_mem_reclaim(lua_State *L) {
  collect(L);
  collect(L);   /* finalizers of the first pass free the memory */
  if (cl_capturing) return;
  if (ncache) cache_drop(L, NULL, 0);
  cl_wait_raw(L, CL_WAIT_CTX, NULL);
  CUmemoryPool pool;
  CUdevice dev;
  if (CU0(cuCtxGetDevice, &dev) == CUDA_SUCCESS && CU(cuDeviceGetDefaultMemPool, &pool, dev) == CUDA_SUCCESS)
    CU(cuMemPoolTrimTo, pool, 0);
}

static CUresult alloc_gpu(lua_State *L, cl_mem *m, cl_stream *s, int zero) {
  CUresult r = CUDA_SUCCESS;
  int hit = 0;
  size_t b = m->bytes ? m->bytes : 1;
  if (m->ipc == CL_IPC_EXPORTABLE) {   /* the stream-ordered pool's memory cannot be shared */
    r = CU(cuMemAlloc, &m->dptr, b);
  } else if (m->kind == CL_PINNED || m->kind == CL_MAPPED) {
    r = CU(cuMemHostAlloc, &m->host, b, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS) r = CU(cuMemHostGetDevicePointer, &m->dptr, m->host, 0);
    if (r == CUDA_SUCCESS && zero) memset(m->host, 0, b);
  } else if (m->kind == CL_MANAGED) {
    /* the host zeroes it, and without concurrent managed access no kernel may run meanwhile.
       Waited for before the allocation: the wait is refused while a stream captures, and there
       is then nothing to free (freeing managed memory waits for the whole device, which would
       end that capture) */
    if (zero && !cl_concurrent_managed(m->ctx)) r = cl_wait_raw(L, CL_WAIT_CTX, NULL);
    if (r == CUDA_SUCCESS) r = CU(cuMemAllocManaged, &m->dptr, b, CU_MEM_ATTACH_GLOBAL);
    m->host = (void *)(uintptr_t)m->dptr;
    if (r == CUDA_SUCCESS && zero) memset(m->host, 0, b);
  } else if (m->bytes) {   /* CL_DEVICE */
    m->dptr = ncache ? cache_get(m->bytes, m->ctx, s) : 0;
    hit = m->dptr != 0;
    if (!m->dptr) r = over_limit(m) ? CL_OVER_LIMIT : CU(cuMemAllocAsync, &m->dptr, m->bytes, s ? s->h : NULL);
    if (r == CUDA_SUCCESS) cl_mem_use(L, m, s, m->ctx);
    if (r == CUDA_SUCCESS && cl_capturing && s) cl_mem_captured(L, m, s);
  }
  if (r != CUDA_SUCCESS && m->host && m->kind != CL_MANAGED) CU(cuMemFreeHost, m->host);
  if (r != CUDA_SUCCESS) { m->host = NULL; m->dptr = 0; }
  if (r == CUDA_SUCCESS && !m->gmem) stat_add(m, hit);   /* (a capture's: the graph's memory, not an array's) */
  return r;
}

/* memory block records are reused: arrays are made and dropped in hot loops. One list for the
   process (a list per thread was lost when its thread ended), emptied when the last state
   closes; a spin lock, as the list is only ever held for a pointer swap */
static cl_mem *spare;
static int nspare, spare_lock;

static void spare_acquire(void) {
  while (__atomic_exchange_n(&spare_lock, 1, __ATOMIC_ACQUIRE))
    while (__atomic_load_n(&spare_lock, __ATOMIC_RELAXED)) {}
}
static void spare_release(void) { __atomic_store_n(&spare_lock, 0, __ATOMIC_RELEASE); }

static cl_mem *mem_alloc(void) {
  spare_acquire();
  cl_mem *m = spare;
  if (m) { spare = m->next; nspare--; }
  spare_release();
  if (m) { memset(m, 0, sizeof *m); return m; }
  return calloc(1, sizeof *m);
}

static void mem_free(cl_mem *m) {
  spare_acquire();
  if (nspare < 64) { m->next = spare; spare = m; nspare++; m = NULL; }
  spare_release();
  free(m);
}

/* every block's record, cl_mem_new's and those of memory made elsewhere (interop.c, ipc.c) */
cl_mem *cl_mem_record(lua_State *L, int kind, size_t bytes, CUcontext ctx) {
  cl_mem *m = mem_alloc();
  if (!m) cl_error(L, NULL, "out of host memory");
  m->refs = 1; m->kind = kind; m->bytes = bytes; m->ctx = ctx;
  return m;
}

void cl_mem_discard(cl_mem *m) { mem_free(m); }

cl_mem *cl_mem_handle_try(lua_State *L, CUcontext ctx, size_t bytes, void (*release)(void *, CUdeviceptr),
                          void *ud, CUdeviceptr h) {
  cl_mem *m = mem_alloc();
  if (!m) return NULL;
  m->refs = 1; m->kind = CL_HANDLE; m->bytes = bytes; m->ctx = ctx;
  m->release = release; m->ud = ud; m->dptr = h;
  pressure_add(L, bytes);
  return m;
}

cl_mem *cl_mem_new(lua_State *L, int kind, size_t bytes, cl_stream *s, int flags) {
  if (cl_capture_in_body(L, s))
    cl_error(L, NULL, "a conditional node's body cannot allocate memory (CUDA refuses memory nodes in "
               "bodies): allocate before the capture, or before the conditional node on the capturing stream");
  int zero = flags & CL_ZERO;
  if (kind != CL_HOST) pressure_add(L, bytes);
  /* the device first: choosing it may raise (no driver), and nothing is allocated yet */
  CUcontext ctx = NULL;
  if (kind != CL_HOST) {
    if (s) { cl_use_ctx(L, s->ctx); ctx = s->ctx; } else ctx = cl_ctx(L);
  }
  cl_mem *m = cl_mem_record(L, kind, bytes, ctx);   /* ctx NULL for pageable host memory */
  if (kind == CL_HOST) {
    if (bytes >= BIG) {
      void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) p = NULL;
      else madvise(p, bytes, MADV_HUGEPAGE);   /* fewer pages to lock and to walk */
      m->host = p;
    } else {
      m->host = calloc(1, bytes ? bytes : 1);
    }
    if (!m->host) {
      mem_free(m);
      cl_error(L, NULL, "out of host memory (%I bytes)", (lua_Integer)bytes);
    }
    return m;
  }
  m->portable = kind == CL_PINNED || kind == CL_MAPPED || kind == CL_MANAGED;
  m->ipc = kind == CL_DEVICE && (flags & CL_IPC) ? CL_IPC_EXPORTABLE : CL_IPC_NONE;
  const char *what = kind == CL_PINNED ? "cuda.pinned_array" : kind == CL_MAPPED ? "cuda.mapped_array"
                   : kind == CL_MANAGED ? "cuda.managed_array" : "cuda.device_array";
  CUresult r = alloc_gpu(L, m, s, zero);
  if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CL_OVER_LIMIT) {   /* unreachable arrays and the cache go first */
    cl_mem_reclaim(L);
    r = alloc_gpu(L, m, s, zero);
  }
  if (r != CUDA_SUCCESS) {
    cl_stream_unref(L, m->stream);
    int d = cl_device_of(m->ctx);
    mem_free(m);
    if (r == CL_OVER_LIMIT) over_limit_error(L, bytes, d, what);
    char buf[160];
    snprintf(buf, sizeof buf, "%s of %zu bytes", what, bytes);
    cl_wait_result(L, r, buf);   /* (a managed array's zeroing waits for the device) */
  }
  return m;
}

cl_mem *cl_mem_ref(cl_mem *m) { if (m) m->refs++; return m; }

/* A graph's blocks (cl_hold): each once, with a reference. Closing an array a graph uses then
   leaves its memory to the graph, and every launch of an executable graph marks its blocks used
   on the launch's stream, so that they are freed in that stream's order when the last of the
   graph, the executable graph and the arrays goes: a graph dropped while its launch still runs
   frees nothing under it. An index (open addressing) finds a block already held once the list
   is long (a graph of many nodes over the same few arrays adds them again and again). */
static size_t hold_hash(const cl_mem *m, int cap) {
  return (size_t)(((uintptr_t)m >> 4) * 0x9E3779B97F4A7C15ULL) & (size_t)(cap - 1);
}

static int hold_index(cl_hold *h) {
  int cap = h->cap ? 2 * h->cap : 64;
  cl_mem **slot = calloc((size_t)cap, sizeof *slot);
  if (!slot) return 0;
  for (int i = 0; i < h->n; i++) {
    size_t j = hold_hash(h->v[i], cap);
    while (slot[j]) j = (j + 1) & (size_t)(cap - 1);
    slot[j] = h->v[i];
  }
  free(h->slot);
  h->slot = slot; h->cap = cap;
  return 1;
}

static int held(cl_hold *h, const cl_mem *m) {
  if (h->n <= 8) {
    for (int i = 0; i < h->n; i++) if (h->v[i] == m) return 1;
    return 0;
  }
  for (size_t j = hold_hash(m, h->cap); h->slot[j]; j = (j + 1) & (size_t)(h->cap - 1))
    if (h->slot[j] == m) return 1;
  return 0;
}

void cl_hold_add(lua_State *L, cl_hold *h, cl_mem *m) {
  if (!m || m->gmem || held(h, m)) return;   /* a graph's own allocation is the graph's */
  if (h->n == h->nv) {
    int nv = h->nv ? 2 * h->nv : 4;
    cl_mem **v = realloc(h->v, sizeof *v * (size_t)nv);
    if (!v) cl_error(L, NULL, "out of host memory");
    h->v = v; h->nv = nv;
  }
  if (h->n >= 8 && 2 * (h->n + 1) > h->cap && !hold_index(h)) cl_error(L, NULL, "out of host memory");
  h->v[h->n++] = cl_mem_ref(m);
  if (h->n > 8) {
    size_t j = hold_hash(m, h->cap);
    while (h->slot[j]) j = (j + 1) & (size_t)(h->cap - 1);
    h->slot[j] = m;
  }
}

void cl_hold_merge(lua_State *L, cl_hold *dst, const cl_hold *src) {
  if (dst != src) for (int i = 0; i < src->n; i++) cl_hold_add(L, dst, src->v[i]);
}

void cl_hold_release(lua_State *L, cl_hold *h) {
  cl_mem **v = h->v;
  int n = h->n;
  free(h->slot);
  memset(h, 0, sizeof *h);   /* first: a free below may wait, and run host functions meanwhile */
  for (int i = 0; i < n; i++) cl_mem_unref(L, v[i]);
  free(v);
}

/* Memory dropped while it cannot be freed now is put off (cl_defer): while a stream captures
   (a free would be captured, or refused), and inside a Lua host function: a free may wait for
   the GPU (the stream waits for that very function), and the cudalua call the function runs
   in (a wait, or a driver call the helper thread runs it during) may still use the block.
   Freed at the end of the capture, and when the waiting call is done. */
static int must_defer(lua_State *L, const cl_mem *m) {
  if (!cl_must_defer(L)) return 0;   /* (never at the state's close) */
  return cl_in_hostfn || ((m->kind != CL_HOST || m->registered == CL_REGISTERED) && m->kind != CL_FOREIGN);
}

static void free_later(lua_State *L, cl_deferred *d) {
  cl_mem *m = CL_DEFERRED_OWNER(d, cl_mem, later);
  m->refs = 1;
  cl_mem_unref(L, m);
}

/* the release waits for the whole device: memory several streams used is settled with a
   device-wide wait (but a device block only blocking streams used is freed on the legacy one) */
static int waits_for_device(const cl_mem *m) {
  if (!m->used || m->spread == CL_ONE_STREAM) return 0;
  return m->spread >= CL_ANY_STREAMS || m->kind != CL_DEVICE || m->ipc != CL_IPC_NONE;
}

static void release(lua_State *L, cl_mem *m);

/* ---- a graph's allocations ----
   cuMemAllocAsync on a capturing stream is an allocation node: the address exists only while
   the graph runs, and the graph must free it (a graph that allocates without freeing cannot be
   launched again: CUDA_ERROR_INVALID_VALUE, as the issue saw). So closing such an array inside
   its capture is a free node, on the stream that used it last; one still open (or used on
   several streams) is freed by cudalua at the end of the capture, on the capturing stream,
   after everything joined it. The capture's keep table holds a box with one reference to the
   record until then. The record never frees anything itself, and never enters the block cache. */
#define GMEM_BOX "cudalua.graph_memory"

static int gmem_box_gc(lua_State *L) {
  cl_mem **b = lua_touserdata(L, 1);
  cl_mem *m = *b;
  *b = NULL;
  if (m) { m->gmem |= CL_GMEM_FREED; cl_mem_unref(L, m); }   /* the capture is gone */
  return 0;
}

/* the free node for m, on s, while s still captures m's capture */
static int gmem_free_on(lua_State *L, cl_mem *m, cl_stream *s) {
  if (!s || cl_capture_id(L, s) != m->graph) return 0;
  CUcontext prev = cl_ctx_swap(m->ctx);
  CUresult r = CU(cuMemFreeAsync, m->dptr, s->h);
  cl_ctx_swap(prev);
  if (r != CUDA_SUCCESS) return 0;
  m->gmem |= CL_GMEM_FREED;
  return 1;
}

static void gmem_unref(lua_State *L, cl_mem *m) {
  if (--m->refs > 0) {
    /* only the capture's box is left: the arrays are closed, so is the memory (in the graph) */
    if (m->refs == 1 && (m->gmem & CL_GMEM_KIND) == CL_GMEM_CAPTURED && !(m->gmem & CL_GMEM_FREED) &&
        cl_capturing && m->spread == CL_ONE_STREAM)
      gmem_free_on(L, m, m->stream);
    return;
  }
  if ((m->gmem & CL_GMEM_KIND) == CL_GMEM_CAPTURED) pressure_sub(m->bytes);   /* counted by cl_mem_new */
  cl_stream_unref(L, m->stream);
  mem_free(m);
}

void cl_mem_captured(lua_State *L, cl_mem *m, cl_stream *s) {
  cuuint64_t id = cl_capture_id(L, s);
  if (!id) return;
  /* the graph's, whatever follows: never cached, never freed outside it */
  m->gmem = CL_GMEM_CAPTURED;
  m->graph = id;
  if (!cl_capture_push_keep(L, s)) return;   /* (no keep table: another state's capture) */
  cl_mem **b = lua_newuserdatauv(L, sizeof *b, 0);
  *b = cl_mem_ref(m);
  if (luaL_newmetatable(L, GMEM_BOX)) { lua_pushcfunction(L, gmem_box_gc); lua_setfield(L, -2, "__gc"); }
  lua_setmetatable(L, -2);
  cl_capture_add(L, -2, CL_CAPTURE_GMEM, -1);
  lua_pop(L, 2);
}

void cl_mem_capture_ending(lua_State *L, int keepidx, cl_stream *s) {
  if (lua_getfield(L, keepidx, CL_CAPTURE_GMEM) != LUA_TTABLE) { lua_pop(L, 1); return; }
  for (lua_Integer i = 1, n = (lua_Integer)lua_rawlen(L, -1); i <= n; i++) {
    lua_rawgeti(L, -1, i);
    cl_mem **b = lua_touserdata(L, -1);
    cl_mem *m = b ? *b : NULL;
    if (m && !(m->gmem & CL_GMEM_FREED)) gmem_free_on(L, m, s);
    if (m) { m->gmem |= CL_GMEM_FREED; *b = NULL; cl_mem_unref(L, m); }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* ---- what a capture's work uses ----
   The keep table keeps the Lua objects a captured launch or copy took, but an object closed
   before the capture ends has let go of its block: the capture holds the blocks themselves, in
   a box of the keep table (the graph merges them into its hold at end_capture) */
#define HOLD_BOX "cudalua.capture_hold"

static int hold_box_gc(lua_State *L) {
  cl_hold_release(L, lua_touserdata(L, 1));
  return 0;
}

void cl_mem_capture_hold(lua_State *L, int keepidx, cl_mem *const *m, int n) {
  keepidx = lua_absindex(L, keepidx);
  if (lua_getfield(L, keepidx, HOLD_BOX) != LUA_TUSERDATA) {
    lua_pop(L, 1);
    memset(lua_newuserdatauv(L, sizeof(cl_hold), 0), 0, sizeof(cl_hold));
    if (luaL_newmetatable(L, HOLD_BOX)) { lua_pushcfunction(L, hold_box_gc); lua_setfield(L, -2, "__gc"); }
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, keepidx, HOLD_BOX);
  }
  cl_hold *h = lua_touserdata(L, -1);
  for (int i = 0; i < n; i++) if (m[i]) cl_hold_add(L, h, m[i]);
  lua_pop(L, 1);
}

void cl_mem_capture_use(lua_State *L, cl_stream *s, cl_mem *const *m, int n) {
  if (!cl_capturing || !cl_capture_push_keep(L, s)) return;
  cl_mem_capture_hold(L, -1, m, n);
  lua_pop(L, 1);
}

cl_hold *cl_mem_capture_held(lua_State *L, int keepidx) {
  lua_getfield(L, keepidx, HOLD_BOX);
  cl_hold *h = lua_touserdata(L, -1);   /* (the keep table keeps it) */
  lua_pop(L, 1);
  return h;
}

void cl_mem_graph_use(lua_State *L, const cl_mem *m, cl_stream *s, const char *where) {
  if (!m->gmem) return;
  cuuint64_t id = cl_capturing && s ? cl_capture_id(L, s) : 0;
  if (id && (m->gmem & CL_GMEM_KIND) == CL_GMEM_CAPTURED && cl_capture_within(L, s, m->graph)) {
    if (!(m->gmem & CL_GMEM_FREED)) return;
    cl_error(L, where, "the array was closed in this capture (its graph frees it there)");
  }
  if (id && (m->gmem & CL_GMEM_KIND) == CL_GMEM_CAPTURED)
    cl_error(L, where, "the array was allocated in another stream capture: only that capture's work may use it");
  if (id)
    cl_error(L, where, "the array is from graph:alloc: only its graph's nodes may use it");
  cl_error(L, where, "the array's memory is a graph's (allocated in a stream capture or by "
             "graph:alloc): it exists only while that graph runs, so only that graph's work may use it");
}

void cl_mem_unref(lua_State *L, cl_mem *m) {
  if (!m) return;
  if (m->gmem) { gmem_unref(L, m); return; }
  if (--m->refs > 0) return;
  m->later.fn = free_later;
  if (must_defer(L, m)) {
    cl_defer(L, &m->later);
    return;
  }
  /* no capture may begin during that wait (src/hostfn.c): while one runs, put off */
  int claimed = waits_for_device(m);
  if (claimed && !cl_ctx_claim_or_defer(L, &m->later)) return;
  release(L, m);
  if (claimed) cl_ctx_unclaim();
}

/* a driver object's (CL_HANDLE) or another library's block (CL_FOREIGN): destroyed once no
   queued work uses it. 0: put off again (the record stays); 1: done, or left to the driver */
static int release_object(lua_State *L, cl_mem *m) {
  CUresult r = settle(L, m);
  if (r != CUDA_SUCCESS && cl_capturing && cl_defer_if_open(L, &m->later)) {
    /* the wait was refused: another thread's capture began since the release was let
       through. Queued work may still read the object (a texture's handle, reused by the next
       texture made, read another array: tools/stress.lua): put off again */
    return 0;
  }
  if (r != CUDA_SUCCESS) warn(L, "waiting for queued work", r);
  /* (a failed context): a driver object is left to the driver, not destroyed under queued
     work; another library's block goes back to its owner, which must be told (embed.c) */
  if (r != CUDA_SUCCESS && m->kind == CL_HANDLE) return 1;
  /* cuArrayDestroy and cuSurfObjectDestroy wait for the whole device, as cuMemFree does
     (tools/stress.lua hung there behind this state's own host function): those run first, and
     the call is parked (another thread's may fire meanwhile) */
  cl_host_drain(L);
  struct cl_hostq *pk = cl_host_park(L, CL_PARK_WAIT);
  m->release(m->ud, m->dptr);
  cl_host_unpark(L, pk);
  return 1;
}

static void release(lua_State *L, cl_mem *m) {
  CUresult r = CUDA_SUCCESS;
  if (m->kind == CL_HOST) {
    if (m->registered == CL_REGISTERED) {
      r = settle(L, m);
      cl_host_drain(L);   /* it waits for the whole device */
      if (r == CUDA_SUCCESS) r = CU(cuMemHostUnregister, m->host);
      if (r != CUDA_SUCCESS) warn(L, "unregistering host memory", r);
    }
    if (m->bytes >= BIG) munmap(m->host, m->bytes); else free(m->host);
    cl_stream_unref(L, m->stream);
    mem_free(m);
    return;
  }
  if (m->kind == CL_FOREIGN || m->kind == CL_HANDLE) {
    CUcontext prev = cl_ctx_swap(m->ctx);
    int done = !m->release || release_object(L, m);
    cl_ctx_swap(prev);
    if (!done) return;   /* put off again: the record stays, and still counts */
    if (m->kind == CL_HANDLE) pressure_sub(m->bytes);   /* (another library's does not count) */
    cl_stream_unref(L, m->stream);
    mem_free(m);
    return;
  }
  /* freed memory no longer counts toward the next collection */
  pressure_sub(m->bytes);
  stat_sub(m);
  /* used on one stream (or on blocking ones, which the legacy stream orders): kept for reuse */
  if (m->kind == CL_DEVICE && m->dptr && m->spread < CL_ANY_STREAMS && m->ipc == CL_IPC_NONE &&
      cache_put(L, m->dptr, m->bytes, m->ctx, m->spread == CL_ONE_STREAM ? m->stream : NULL)) {
    cl_stream_unref(L, m->stream);
    mem_free(m);
    return;
  }
  CUcontext prev = cl_ctx_swap(m->ctx);
  if (m->kind == CL_DEVICE && m->ipc != CL_IPC_NONE) {
    /* shared with other processes: freed (or closed) once nothing here uses it */
    r = settle(L, m);
    cl_host_drain(L);   /* these wait for the whole device */
    int mine = m->ipc == CL_IPC_EXPORTABLE;
    if (r == CUDA_SUCCESS && m->dptr) r = mine ? CU(cuMemFree, m->dptr) : CU(cuIpcCloseMemHandle, m->dptr);
    if (r != CUDA_SUCCESS) warn(L, mine ? "cuMemFree" : "cuIpcCloseMemHandle", r);
  } else if (m->kind == CL_DEVICE) {
    if (m->dptr) {
      CUstream h = NULL;
      int idle = 0;
      if (m->spread == CL_OTHER_DEVICES) idle = (r = cl_sync_all_devices(L)) == CUDA_SUCCESS;
      else if (m->spread == CL_ANY_STREAMS) idle = (r = cl_wait_raw(L, CL_WAIT_CTX, NULL)) == CUDA_SUCCESS;
      else if (m->spread == CL_BLOCKING_STREAMS) h = CU_STREAM_LEGACY;   /* ordered after each of them */
      else if (m->stream) h = m->stream->h;
      /* once nothing queued uses it, the block may be reused on any stream */
      if (r == CUDA_SUCCESS && !(idle && cache_put(L, m->dptr, m->bytes, m->ctx, NULL)))
        r = CU(cuMemFreeAsync, m->dptr, h);
      if (r != CUDA_SUCCESS) warn(L, "cuMemFreeAsync", r);
    }
  } else {
    r = settle(L, m);
    cl_host_drain(L);   /* cuMemFree and cuMemFreeHost wait for the whole device */
    if (r == CUDA_SUCCESS)
      r = m->kind == CL_MANAGED ? CU(cuMemFree, m->dptr) : CU(cuMemFreeHost, m->host);
    if (r != CUDA_SUCCESS) warn(L, "freeing host-visible memory", r);
  }
  cl_ctx_swap(prev);
  cl_stream_unref(L, m->stream);
  mem_free(m);
}

void cl_mem_release_all(void) {
  if (ncache) cache_drop(NULL, NULL, 0);
  spare_acquire();
  while (spare) { cl_mem *m = spare; spare = m->next; free(m); }
  nspare = 0;
  spare_release();
}
