/* nccl.c: NCCL collectives on cudalua arrays (require "cudalua.nccl"; the policy is in
   lua/cudalua/nccl.lua). NCCL is opened with dlopen like the CUDA libraries, so cudalua loads
   without it and every NCCL call then raises one message saying why. The few types and
   prototypes used are declared here (NCCL's ABI: nccl.h need not be installed to build).

   Never hanging on a dead peer. A communicator of comm_init_rank is non-blocking
   (ncclConfig_t.blocking = 0): NCCL's calls return ncclInProgress instead of waiting, and
   cudalua waits for them itself, polling with the communicator's timeout (running the
   state's Lua host functions meanwhile); when it passes, the communicator is aborted and the
   call raises, naming the operation, the rank, the time waited and NCCL's last warning.
   What is queued on the GPU is watched too: an event is recorded after each collective, and
   a watchdog thread (one per process, every 100 ms, as PyTorch's) aborts a communicator whose
   oldest collective has not finished within the timeout, or for which NCCL reports an error
   (a peer's connection lost). Aborting ends NCCL's kernels, so a wait for the stream returns;
   the state that made the communicator is told at its next wait (cudalua's waits call
   nccl_told through cl_wait_hook), and at the communicator's next use. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cl.h"

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef int ncclResult_t;                       /* ncclSuccess = 0 */
enum { NCCL_INT8 = 0, NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_UINT32 = 3, NCCL_INT64 = 4, NCCL_UINT64 = 5,
       NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9 };
enum { NCCL_INVALID_ARGUMENT = 4, NCCL_INVALID_USAGE = 5, NCCL_IN_PROGRESS = 7 };
#define NCCL_SPLIT_NOCOLOR (-1)
#define NCCL_SHRINK_ABORT 0x01

/* ncclConfig_t as NCCL 2.26 declared it. NCCL copies min(config->size, its own size) bytes
   over its defaults, so the fields a newer NCCL added keep their defaults (parseCommConfig in
   init.cc); trafficClass is declared so that no padding is read as it. The
   NCCL_CONFIG_UNDEF_INT of every field left to NCCL is INT_MIN. */
typedef struct {
  size_t size;
  unsigned int magic;          /* 0xcafebeef */
  unsigned int version;        /* the NCCL the caller was written for: 2.18.0 */
  int blocking;
  int cgaClusterSize, minCTAs, maxCTAs;
  const char *netName;
  int splitShare, trafficClass;
} ncclConfig_t;

#define NCCL_FUNCS(X) \
  X(ncclGetVersion, ncclResult_t, (int *)) \
  X(ncclGetUniqueId, ncclResult_t, (ncclUniqueId *)) \
  X(ncclCommInitRank, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int)) \
  X(ncclCommInitAll, ncclResult_t, (ncclComm_t *, int, const int *)) \
  X(ncclCommDestroy, ncclResult_t, (ncclComm_t)) \
  X(ncclCommAbort, ncclResult_t, (ncclComm_t)) \
  X(ncclCommGetAsyncError, ncclResult_t, (ncclComm_t, ncclResult_t *)) \
  X(ncclGetErrorString, const char *, (ncclResult_t)) \
  X(ncclCommCount, ncclResult_t, (ncclComm_t, int *)) \
  X(ncclCommUserRank, ncclResult_t, (ncclComm_t, int *)) \
  X(ncclAllReduce, ncclResult_t, (const void *, void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclBroadcast, ncclResult_t, (const void *, void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclReduce, ncclResult_t, (const void *, void *, size_t, int, int, int, ncclComm_t, CUstream)) \
  X(ncclAllGather, ncclResult_t, (const void *, void *, size_t, int, ncclComm_t, CUstream)) \
  X(ncclReduceScatter, ncclResult_t, (const void *, void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclSend, ncclResult_t, (const void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclRecv, ncclResult_t, (void *, size_t, int, int, ncclComm_t, CUstream)) \
  X(ncclGroupStart, ncclResult_t, (void)) \
  X(ncclGroupEnd, ncclResult_t, (void))
/* a stand-in NCCL for tests without a GPU (spec/support/nccl_stand_in.c: the waits, timeouts
   and the watchdog on the CPU device) says so; newer NCCLs have the last warning (2.13),
   finalizing before destroy and non-blocking communicators (2.14), splitting (2.18),
   shrinking (2.27) */
#define NCCL_OPTIONAL(X) \
  X(cudalua_nccl_stand_in, int, (void)) \
  X(ncclGetLastError, const char *, (ncclComm_t)) \
  X(ncclCommFinalize, ncclResult_t, (ncclComm_t)) \
  X(ncclCommInitRankConfig, ncclResult_t, (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *)) \
  X(ncclCommSplit, ncclResult_t, (ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *)) \
  X(ncclCommShrink, ncclResult_t, (ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int))

#define NCCL_MEMBER(name, ret, args) ret (*name) args;
static struct { NCCL_FUNCS(NCCL_MEMBER) NCCL_OPTIONAL(NCCL_MEMBER) } nc;

#define NCCL_SYM(name, ret, args) {#name, (void **)&nc.name},
static const cl_sym nccl_syms[] = {NCCL_FUNCS(NCCL_SYM) {NULL, NULL}};
static const cl_sym nccl_opt[] = {NCCL_OPTIONAL(NCCL_SYM) {NULL, NULL}};

/* libnccl.so.2: CUDALUA_NCCL names one; else NCCL_HOME/lib, the loader's path, Debian's
   multiarch folder and CUDA_HOME/lib64 */
static const char *const nccl_names[] = {"libnccl.so.2", NULL};
static const cl_libdir nccl_dirs[] = {{"NCCL_HOME", "/lib"}, {NULL, ""}, {NULL, "/usr/lib/x86_64-linux-gnu"},
  {"CUDA_HOME", "/lib64"}, {NULL, NULL}};
/* NCCL has no function naming its results (ncclGetErrorString gives the text) */
static const char *const nccl_results[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
  "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};
static cl_lib nccl = {
  .env = "CUDALUA_NCCL", .names = nccl_names, .dirs = nccl_dirs, .flags = RTLD_NOW,
  .syms = nccl_syms, .optional = nccl_opt,
  .forced_fail = "cudalua.nccl: NCCL not found: CUDALUA_NCCL=%s cannot be opened (%s)",
  .not_found = "cudalua.nccl: NCCL not found (libnccl.so.2; set NCCL_HOME or LD_LIBRARY_PATH)",
  .lacks = "cudalua.nccl: %s lacks %s (too old an NCCL)",
  .results = nccl_results, .nresults = sizeof nccl_results / sizeof nccl_results[0], .unknown = "ncclError",
  .lock = PTHREAD_MUTEX_INITIALIZER};

static void need(lua_State *L) { cl_lib_need(L, &nccl); }

/* a result as messages give it, for "%s (%s)": its name and NCCL's text */
#define RESULT(r) cl_result_name(&nccl, (r)), nc.ncclGetErrorString(r)

/* raises "where: ncclX (NCCL's text)" unless r is ncclSuccess */
static void check(lua_State *L, ncclResult_t r, const char *where) {
  if (r != 0) cl_error(L, where, "%s (%s)", RESULT(r));
}

/* a stand-in NCCL (tests) drives no GPU */
static int stand_in(void) { return cl_lib_load(&nccl) && nc.cudalua_nccl_stand_in && nc.cudalua_nccl_stand_in(); }

/* a communicator drives GPUs through NCCL's own CUDA runtime: the CPU device has none to give */
static void need_gpu(lua_State *L, const char *where) {
  if (cl_driver_load() && cl_cpu_symbol(NULL) && !stand_in())
    cl_error(L, where, "cudalua's CPU device (CUDALUA_DEVICE=cpu) cannot run NCCL communicators: NCCL needs NVIDIA GPUs");
}

static double now_s(void) { return cl_now_us() * 1e-6; }

/* ---- communicators: a record the Lua object and the watchdog share ---- */
#define PEND 1024   /* collectives watched at once per communicator (more: the newest's event moves on) */
typedef struct ncomm {
  pthread_mutex_t lock;         /* around NCCL's calls on c, and the watchdog's look and abort */
  ncclComm_t c;                 /* NULL once closed or aborted */
  CUcontext ctx;
  int rank, size, dev;
  int in_set;                   /* one of several communicators this process drives */
  int nonblocking;              /* made with blocking = 0: waited for with the timeout, watched */
  double timeout;               /* seconds */
  struct { CUevent ev; double t0; const char *op; } pend[PEND];   /* a ring, oldest at head */
  unsigned head, n;
  CUevent pool[PEND];           /* events of finished collectives, for the next ones (an event is
                                   made only when none is pooled and fewer than PEND are pending:
                                   n + npool <= PEND, so every finished one is kept) */
  int npool;
  int aborted;                  /* 1: raised where it happened; 2: by the watchdog, not told yet; 3: told */
  const char *why_op;           /* why it was aborted: the operation, and "rank R of N: what: last warning" */
  char why[768];
  const void *owner;            /* the state that made it (its main thread): told at its next wait */
  int busy;                     /* a wait on the Lua thread has let its lock go (host functions run):
                                   a close or abort from one of them is put off (the record stays) */
  struct ncomm *next;           /* the watchdog's list */
  int listed;
} ncomm;

#define COMM_MT "cudalua.nccl_comm"
typedef struct { ncomm *k; } lcomm;   /* the Lua object: the record is freed at close */

static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;   /* the list; taken before a record's lock */
static pthread_cond_t wd_cond = PTHREAD_COND_INITIALIZER;
static ncomm *wd_list;
static int wd_started, wd_stop;
static pthread_t wd_thread;
static int untold;   /* communicators aborted by the watchdog whose state has not been told (atomic) */

/* "rank R of N: <what>: <NCCL's last warning>" into k->why, read before the abort */
static void describe(ncomm *k, const char *op, const char *fmt, va_list ap) {
  k->why_op = op;
  int n = snprintf(k->why, sizeof k->why, "rank %d of %d: ", k->rank, k->size);
  if (n < 0 || (size_t)n >= sizeof k->why) return;
  vsnprintf(k->why + n, sizeof k->why - (size_t)n, fmt, ap);
  const char *last = k->c && nc.ncclGetLastError ? nc.ncclGetLastError(k->c) : NULL;
  size_t len = strlen(k->why);
  if (last && *last && len + 3 < sizeof k->why) snprintf(k->why + len, sizeof k->why - len, ": %s", last);
}

static void drop_events(ncomm *k) {
  for (; k->n; k->n--, k->head = (k->head + 1) % PEND) CU0(cuEventDestroy, k->pend[k->head].ev);
  for (; k->npool; k->npool--) CU0(cuEventDestroy, k->pool[k->npool - 1]);
}

/* aborts k (its lock held, its context current): NCCL's kernels end, its resources go. how: 1
   the caller raises k->why, 2 the watchdog's (the owner is told at its next wait) */
static void abort_comm(ncomm *k, int how, const char *op, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  describe(k, op, fmt, ap);
  va_end(ap);
  /* marked first: the abort ends NCCL's kernels, and the state's wait that returns then must
     find the mark (its hook waits for wd_lock, which the watchdog holds until the abort ends) */
  k->aborted = how;
  if (how == 2) __atomic_add_fetch(&untold, 1, __ATOMIC_SEQ_CST);
  nc.ncclCommAbort(k->c);
  k->c = NULL;
  /* (its events stay until it is closed, on its state's thread: destroying one may wait for
     the stream's work, as on the CPU device, and that work may be a host function the state's
     thread must run, while it waits for wd_lock, which the watchdog holds here) */
}

/* the collectives at the ring's head that have finished give their events back; 0 when the
   oldest still running has run longer than the timeout */
static int retire(ncomm *k, double now) {
  while (k->n) {
    CUresult r = CU0(cuEventQuery, k->pend[k->head].ev);
    if (r == CUDA_ERROR_NOT_READY) return now - k->pend[k->head].t0 <= k->timeout;
    k->pool[k->npool++] = k->pend[k->head].ev;
    k->head = (k->head + 1) % PEND, k->n--;
  }
  return 1;
}

/* one look at k (the watchdog, wd_lock held): NCCL's asynchronous error, then the oldest
   collective's age. A record whose lock its state holds (a call into NCCL under way) is
   looked at in the next round. */
static void watch_one(ncomm *k, double now) {
  if (pthread_mutex_trylock(&k->lock)) return;
  if (k->c && k->nonblocking) {
    CU0(cuCtxSetCurrent, k->ctx);
    ncclResult_t e = 0;
    const char *op = k->n ? k->pend[k->head].op : "its idle time";
    if (nc.ncclCommGetAsyncError(k->c, &e) == 0 && e != 0 && e != NCCL_IN_PROGRESS)
      abort_comm(k, 2, op, "NCCL reported %s (%s) %.1f s after it was queued", RESULT(e), k->n ? now - k->pend[k->head].t0 : 0.0);
    else if (!retire(k, now))
      abort_comm(k, 2, op, "did not finish on the GPU within the timeout (%.1f s, waited %.1f s): aborted",
                 k->timeout, now - k->pend[k->head].t0);
  }
  pthread_mutex_unlock(&k->lock);
}

static void *watchdog(void *arg) {
  (void)arg;
  pthread_mutex_lock(&wd_lock);
  while (!wd_stop) {
    if (!wd_list) { pthread_cond_wait(&wd_cond, &wd_lock); continue; }
    double now = now_s();
    for (ncomm *k = wd_list; k; k = k->next) watch_one(k, now);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 100 * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&wd_cond, &wd_lock, &until);
  }
  pthread_mutex_unlock(&wd_lock);
  return NULL;
}

/* the last state has closed (core.c): the watchdog ends before the library can be unloaded
   (lua_close unloads it: a thread left in its code would crash the process at exit; the
   stand-in NCCL's spec found it) */
void cl_nccl_shutdown(void) {
  pthread_mutex_lock(&wd_lock);
  int started = wd_started;
  wd_stop = 1;
  pthread_cond_broadcast(&wd_cond);
  pthread_mutex_unlock(&wd_lock);
  if (started) pthread_join(wd_thread, NULL);
  pthread_mutex_lock(&wd_lock);
  wd_started = wd_stop = 0;   /* a state opened later starts it again */
  pthread_mutex_unlock(&wd_lock);
}

/* k joins the watchdog's list (the thread starts with the first) */
static void watch(ncomm *k) {
  pthread_mutex_lock(&wd_lock);
  if (!wd_started) wd_started = pthread_create(&wd_thread, NULL, watchdog, NULL) == 0;
  k->next = wd_list, wd_list = k, k->listed = 1;
  pthread_cond_signal(&wd_cond);
  pthread_mutex_unlock(&wd_lock);
}

/* k leaves it: after this the watchdog never looks at k again */
static void unwatch(ncomm *k) {
  pthread_mutex_lock(&wd_lock);
  for (ncomm **p = &wd_list; *p; p = &(*p)->next)
    if (*p == k) { *p = k->next; break; }
  if (k->listed && k->aborted == 2) __atomic_sub_fetch(&untold, 1, __ATOMIC_SEQ_CST);
  k->listed = 0;
  pthread_mutex_unlock(&wd_lock);
}

/* cl_wait_hook: after each of cudalua's waits, a communicator of this state the watchdog
   aborted is raised, once (the wait returned because the abort ended NCCL's kernels) */
static void nccl_told(lua_State *L, const char *what) {
  if (!__atomic_load_n(&untold, __ATOMIC_SEQ_CST)) return;
  const void *me = cl_state_id(L);
  char why[sizeof ((ncomm *)0)->why];
  const char *op = NULL;
  why[0] = 0;
  pthread_mutex_lock(&wd_lock);
  for (ncomm *k = wd_list; k && !why[0]; k = k->next)
    if (k->owner == me && k->aborted == 2) {
      memcpy(why, k->why, sizeof why);
      op = k->why_op;
      k->aborted = 3;
      __atomic_sub_fetch(&untold, 1, __ATOMIC_SEQ_CST);
    }
  pthread_mutex_unlock(&wd_lock);
  if (why[0]) cl_error(L, what, "an NCCL communicator was aborted during %s: %s", op, why);
}

/* ---- waiting for NCCL on the Lua thread ---- */

/* what k's last call began (r: its result, ncclInProgress on a non-blocking communicator) has
   ended: its result. k's lock is held, and let go between polls (the watchdog looks
   meanwhile). -1: the timeout passed; -2: the watchdog aborted k meanwhile. */
static ncclResult_t settle(lua_State *L, ncomm *k, ncclComm_t c, ncclResult_t r, double t0) {
  double since = cl_now_us();   /* (the pauses between polls: cudalua's waits' own) */
  while (r == NCCL_IN_PROGRESS) {
    ncclResult_t g = nc.ncclCommGetAsyncError(c, &r);
    if (g != 0) return g;
    if (r != NCCL_IN_PROGRESS) break;
    double waited = now_s() - t0;
    if (waited > k->timeout) return -1;
    k->busy++;
    pthread_mutex_unlock(&k->lock);
    cl_poll_pause(L, &since);
    pthread_mutex_lock(&k->lock);
    k->busy--;
    if (!k->c) return -2;
  }
  return r;
}

/* the usage errors NCCL reports leave a communicator as it was; every other failure breaks it */
static int breaks(ncclResult_t r) { return r != 0 && r != NCCL_INVALID_ARGUMENT && r != NCCL_INVALID_USAGE; }

/* raises for k's failed call r (k's lock held: let go here). A timeout or a failure that
   breaks the communicator aborts it first (always: whole, a half-made one of an init). */
static int fail(lua_State *L, ncomm *k, ncclResult_t r, double t0, const char *op, int whole) {
  double waited = now_s() - t0;
  if (r == -2) {   /* the watchdog's abort: its reason */
    if (k->aborted == 2) { k->aborted = 3; __atomic_sub_fetch(&untold, 1, __ATOMIC_SEQ_CST); }
  } else if (r == -1) {
    abort_comm(k, 1, op, "timed out after %.1f s (the communicator's timeout is %.1f s; "
               "a peer may have died or never joined): aborted", waited, k->timeout);
  } else if ((breaks(r) || whole) && k->c) {
    abort_comm(k, 1, op, "failed after %.1f s: %s (%s): aborted", waited, RESULT(r));
  } else {
    const char *last = k->c && nc.ncclGetLastError ? nc.ncclGetLastError(k->c) : NULL;
    pthread_mutex_unlock(&k->lock);
    return cl_error(L, op, "rank %d of %d: %s (%s)%s%s", k->rank, k->size, RESULT(r), last && *last ? ": " : "", last && *last ? last : "");
  }
  char why[sizeof k->why];
  memcpy(why, k->why, sizeof why);
  const char *first = k->why_op;
  pthread_mutex_unlock(&k->lock);
  if (first && strcmp(first, op) != 0) return cl_error(L, op, "the communicator was aborted during %s: %s", first, why);
  return cl_error(L, op, "%s", why);
}

/* k's lock, and k usable: raises when it was closed or aborted (its reason) */
static void enter(lua_State *L, ncomm *k, const char *op) {
  pthread_mutex_lock(&k->lock);
  if (k->c) return;
  char why[sizeof k->why];
  memcpy(why, k->why, sizeof why);
  int aborted = k->aborted;
  const char *first = k->why_op;
  if (k->aborted == 2) { k->aborted = 3; __atomic_sub_fetch(&untold, 1, __ATOMIC_SEQ_CST); }
  pthread_mutex_unlock(&k->lock);
  if (aborted) cl_error(L, op, "the communicator was aborted during %s: %s", first, why);
  cl_error(L, op, "the communicator is closed");
}

/* a collective has been queued on h: an event after it, for the watchdog (not in a capture:
   the work runs when the graph is launched) */
static void track_in(ncomm *k, CUstream h, const char *op, double t0);
static void track(ncomm *k, CUstream h, const char *op, double t0) {
  if (!k->nonblocking || !k->c) return;
  CUcontext prev = cl_ctx_swap(k->ctx);   /* (another device may be current: its event, its stream) */
  track_in(k, h, op, t0);
  cl_ctx_swap(prev);
}
static void track_in(ncomm *k, CUstream h, const char *op, double t0) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (cl_capturing && CU0(cuStreamIsCapturing, h, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE) return;
  if (k->n == PEND) {   /* full: the newest's event moves behind this one */
    unsigned last = (k->head + k->n - 1) % PEND;
    if (CU0(cuEventRecord, k->pend[last].ev, h) == CUDA_SUCCESS) k->pend[last].op = op;
    return;
  }
  CUevent ev = NULL;
  if (k->npool) ev = k->pool[--k->npool];
  else if (CU0(cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return;
  if (CU0(cuEventRecord, ev, h) != CUDA_SUCCESS) { CU0(cuEventDestroy, ev); return; }
  unsigned i = (k->head + k->n++) % PEND;
  k->pend[i].ev = ev, k->pend[i].t0 = t0, k->pend[i].op = op;
}

/* ---- groups: the collectives queued in one are waited for and watched at its end ---- */
static __thread int group_depth;   /* ncclGroupStart calls not yet ended, on this thread */
#define GROUPED 256
static __thread struct { ncomm *k; CUstream h; const char *op; } grouped[GROUPED];
static __thread int ngrouped;

static const char group_keep = 0;   /* registry: arrays a group's collectives use, until it ends */

/* the arrays at the argument indexes stay alive until the group ends: NCCL queues a group's
   work only at ncclGroupEnd, so one collected inside the group must not be freed before */
static void keep_in_group(lua_State *L, int a, int b) {
  if (group_depth == 0) return;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &group_keep) != LUA_TTABLE) {   /* made once, a list */
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &group_keep);
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
  for (int i = a; i <= b; i++)
    if (lua_type(L, i) == LUA_TUSERDATA || lua_type(L, i) == LUA_TTABLE) {
      lua_pushvalue(L, i); lua_rawseti(L, -2, ++n);
    }
  lua_pop(L, 1);
}

/* the group has ended: its arrays may go (the list is emptied, not remade: groups come in
   loops of small collectives) */
static void release_group(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &group_keep) == LUA_TTABLE)
    for (lua_Integer i = (lua_Integer)lua_rawlen(L, -1); i > 0; i--) { lua_pushnil(L); lua_rawseti(L, -2, i); }
  lua_pop(L, 1);
}

/* a collective queued inside a group: remembered (once per communicator and stream) */
static void group_note(ncomm *k, CUstream h, const char *op) {
  for (int i = 0; i < ngrouped; i++) if (grouped[i].k == k && grouped[i].h == h) return;
  if (ngrouped < GROUPED) grouped[ngrouped].k = k, grouped[ngrouped].h = h, grouped[ngrouped++].op = op;
}


/* ---- a collective's frame: the record locked (in a group: from its first collective to the
   group's end, so that the watchdog cannot abort a communicator NCCL's group still holds) ---- */
static __thread ncomm *held[64];
static __thread int nheld;

static int holds(ncomm *k) {
  for (int i = 0; i < nheld; i++) if (held[i] == k) return 1;
  return 0;
}

static ncomm *op_begin(lua_State *L, lcomm *c, const char *op) {
  ncomm *k = c->k;
  if (group_depth && holds(k)) return k;   /* locked by this group already (and not aborted) */
  if (group_depth && nheld == 64) cl_error(L, op, "more than 64 communicators in one nccl.group");
  enter(L, k, op);
  if (group_depth) held[nheld++] = k;
  return k;
}

/* the collective's call returned r: waited for (outside a group), then watched; raises */
static void op_end(lua_State *L, ncomm *k, ncclResult_t r, CUstream h, double t0, const char *op) {
  if (group_depth) {   /* queued at the group's end: waited for and watched there */
    if (r != NCCL_IN_PROGRESS) check(L, r, op);
    group_note(k, h, op);
    return;
  }
  r = settle(L, k, k->c, r, t0);
  if (r != 0) fail(L, k, r, t0, op, 0);
  track(k, h, op, t0);
  pthread_mutex_unlock(&k->lock);
}

static ncclConfig_t config(int nonblocking) {
  ncclConfig_t g = {sizeof g, 0xcafebeef, 22600, nonblocking ? 0 : 1, INT_MIN, INT_MIN, INT_MIN, NULL, INT_MIN, INT_MIN};
  return g;
}

static lcomm *checkcomm(lua_State *L, int idx) {
  lcomm *c = cl_checkudata(L, idx, COMM_MT);
  if (!c->k) cl_argerror(L, idx, "closed communicator");
  return c;
}

/* a new communicator object (its record not yet joined: c NULL) */
static ncomm *push_comm(lua_State *L, CUcontext ctx, double timeout, int nonblocking) {
  lcomm *c = lua_newuserdatauv(L, sizeof *c, 1);
  c->k = NULL;
  luaL_setmetatable(L, COMM_MT);
  ncomm *k = calloc(1, sizeof *k);
  if (!k) cl_error(L, NULL, "out of host memory");
  pthread_mutex_init(&k->lock, NULL);
  k->ctx = ctx, k->timeout = timeout, k->nonblocking = nonblocking, k->owner = cl_state_id(L);
  c->k = k;
  return k;
}

static void fill_info(ncomm *k, int rank, int size, int dev) { k->rank = rank; k->size = size; k->dev = dev; }

/* CUDALUA_NCCL_TIMEOUT, else 600 s (PyTorch's 10 minutes) */
static double default_timeout(void) {
  const char *e = getenv("CUDALUA_NCCL_TIMEOUT");
  double t = e ? strtod(e, NULL) : 0;
  return t > 0 && t <= 1e9 ? t : 600;
}

/* default_timeout() -> seconds: for the Lua side's waits (nccl.init's id file), read here only */
static int l_default_timeout(lua_State *L) {
  lua_pushnumber(L, default_timeout());
  return 1;
}

/* the timeout of options at idx (seconds > 0), else the default */
static double timeout_of(lua_State *L, int idx, const char *where) {
  if (lua_type(L, idx) == LUA_TTABLE && lua_getfield(L, idx, "timeout") != LUA_TNIL) {
    int ok;
    lua_Number t = lua_tonumberx(L, -1, &ok);
    if (!ok || !(t > 0) || t > 1e9) cl_error(L, where, "timeout must be a number of seconds > 0, got %s", luaL_tolstring(L, -1, NULL));
    lua_pop(L, 1);
    return (double)t;
  }
  if (lua_type(L, idx) == LUA_TTABLE) lua_pop(L, 1);
  return default_timeout();
}

/* options at idx: {timeout = seconds, blocking = false [, abort =]} (a non-blocking
   communicator unless blocking = true, or NCCL is older than 2.14) */
typedef struct { double timeout; int nonblocking, abort; } copts;
static copts comm_options(lua_State *L, int idx, const char *where, int with_abort) {
  static const char *const names[] = {"timeout", "blocking", NULL};
  static const char *const names_abort[] = {"timeout", "blocking", "abort", NULL};
  copts o = {default_timeout(), 1, -1};   /* (non-blocking: where NCCL has it, seen once loaded) */
  if (lua_isnoneornil(L, idx)) return o;
  cl_checktype(L, idx, LUA_TTABLE);
  cl_check_options(L, idx, where, with_abort ? names_abort : names);
  o.timeout = timeout_of(L, idx, where);
  if (cl_opt_bool(L, idx, "blocking", where) == 1) o.nonblocking = 0;
  if (with_abort) o.abort = cl_opt_bool(L, idx, "abort", where);
  return o;
}

/* joins k's communicator: init returned r and the handle h (k's lock held); waited for */
static void joined(lua_State *L, ncomm *k, ncclComm_t h, ncclResult_t r, double t0, const char *where) {
  k->c = h;
  r = h ? settle(L, k, h, r, t0) : r;
  if (r != 0) {
    if (k->c) fail(L, k, r, t0, where, 1);
    pthread_mutex_unlock(&k->lock);
    const char *last = nc.ncclGetLastError ? nc.ncclGetLastError(NULL) : NULL;   /* (NCCL's, process-wide) */
    cl_error(L, where, "rank %d of %d: %s (%s)%s%s", k->rank, k->size, RESULT(r),
             last && *last ? ": " : "", last && *last ? last : "");
  }
  int rank = -1, size = 0;   /* (a split's or shrink's: its own, read before the watchdog may abort it) */
  if (nc.ncclCommUserRank(h, &rank) == 0 && nc.ncclCommCount(h, &size) == 0 && rank >= 0) k->rank = rank, k->size = size;
  pthread_mutex_unlock(&k->lock);
  if (k->nonblocking) watch(k);
}

/* ---- library functions ---- */

static int l_available(lua_State *L) {
  if (cl_cpu_symbol(NULL) && !stand_in()) {   /* (chosen, not loaded: the driver is not loaded to ask) */
    lua_pushboolean(L, 0);
    lua_pushstring(L, "cudalua.nccl: cudalua's CPU device (CUDALUA_DEVICE=cpu) has no GPUs for NCCL");
    return 2;
  }
  int ok = cl_lib_load(&nccl);
  lua_pushboolean(L, ok);
  if (ok) return 1;
  lua_pushstring(L, nccl.err);
  return 2;
}

static int l_version(lua_State *L) {
  need(L);
  int v = 0;
  ncclResult_t r = nc.ncclGetVersion(&v);
  check(L, r, "nccl.version");
  lua_pushinteger(L, v);
  return 1;
}

/* unique_id() -> 256 hex characters: pass them to every rank (a file, the environment, argv) */
static int l_unique_id(lua_State *L) {
  need(L);
  ncclUniqueId id;
  ncclResult_t r = nc.ncclGetUniqueId(&id);
  check(L, r, "nccl.unique_id");
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  cl_add_hex(&b, id.internal, sizeof id.internal);
  luaL_pushresult(&b);
  return 1;
}

/* NCCL_COMM_ID while id and the init are made: NCCL then takes addr for its bootstrap's root,
   which rank 0 opens there (ncclCommInitRankDev reads it before the init goes on on a thread
   of its own); put back after. (setenv while another thread reads the environment is a known
   hazard of glibc: NCCL's threads read it at their start, not during an init of this thread.) */
static char *comm_id_set(const char *addr) {
  const char *old = getenv("NCCL_COMM_ID");
  char *keep = old ? strdup(old) : NULL;
  if (addr) setenv("NCCL_COMM_ID", addr, 1);
  return keep;
}
static void comm_id_back(const char *addr, char *keep) {
  if (!addr) return;
  if (keep) setenv("NCCL_COMM_ID", keep, 1);
  else unsetenv("NCCL_COMM_ID");
  free(keep);
}

/* joins n ranks as rank (checked) with id, or at addr (id made there); options at optidx */
static int init_rank(lua_State *L, int n, ncclUniqueId *id, const char *addr, int rank, int optidx, const char *where) {
  if (group_depth) cl_error(L, where, "not inside nccl.group (NCCL would queue the init until the group ends)");
  copts o = comm_options(L, optidx, where, 0);
  need_gpu(L, where);
  need(L);
  CUcontext ctx = cl_ctx(L);
  ncomm *k = push_comm(L, ctx, o.timeout, o.nonblocking);
  fill_info(k, rank, n, cl_current_device());
  ncclComm_t h = NULL;
  double t0 = now_s();
  pthread_mutex_lock(&k->lock);
  char *keep = comm_id_set(addr);
  ncclResult_t r = addr ? nc.ncclGetUniqueId(id) : 0;
  ncclConfig_t cfg = config(1);
  if (!nc.ncclCommInitRankConfig) k->nonblocking = o.nonblocking = 0;   /* NCCL before 2.14 */
  if (r == 0 && o.nonblocking)
    r = CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclCommInitRankConfig(&h, n, *id, rank, &cfg));
  else if (r == 0)
    r = CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclCommInitRank(&h, n, *id, rank));
  comm_id_back(addr, keep);
  joined(L, k, h, r, t0, where);
  return 1;
}

/* the number of ranks at 1 and the rank at 3, checked */
static void ranks_args(lua_State *L, int *n, int *rank, const char *where) {
  int isint;
  lua_Integer nn = lua_tointegerx(L, 1, &isint);
  if (!isint || nn < 1 || nn > 1 << 20) cl_error(L, where, "argument 1: nranks must be >= 1");
  lua_Integer r = lua_tointegerx(L, 3, &isint);
  if (!isint || r < 0 || r >= nn) cl_error(L, where, "argument 3: rank must be 0..%d", (int)nn - 1);
  *n = (int)nn, *rank = (int)r;
}

/* comm_init_rank(nranks, id, rank [, {timeout =, blocking =}]) -> a communicator on the
   selected device, once every rank has joined (raises when they have not within the timeout) */
static int l_comm_init_rank(lua_State *L) {
  static const char *const where = "nccl.comm_init_rank";   /* a tail call from nccl.lua */
  int n, rank;
  ranks_args(L, &n, &rank, where);
  size_t len;
  const char *hex = lua_tolstring(L, 2, &len);
  ncclUniqueId id;
  if (!hex || len != 2 * sizeof id.internal || !cl_hex_decode(hex, id.internal, sizeof id.internal))
    return cl_error(L, where, "argument 2: not an id from nccl.unique_id() (256 hex characters)");
  return init_rank(L, n, &id, NULL, rank, 4, where);
}

/* comm_init_at(nranks, "host:port", rank [, options]) -> the same, the ranks meeting at the
   address (rank 0 listens there): no id to hand round. NCCL 2.22 or newer (before, the id
   made from the address held a random part, different on every rank). */
static int l_comm_init_at(lua_State *L) {
  static const char *const where = "nccl.comm_init_at";
  int n, rank;
  ranks_args(L, &n, &rank, where);
  const char *addr = lua_tostring(L, 2);
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  if (!addr || !colon || colon == addr || atoi(colon + 1) <= 0 || atoi(colon + 1) > 65535)
    return cl_error(L, where, "argument 2: expected \"host:port\" (the port 1..65535), got %s", addr ? addr : luaL_typename(L, 2));
  need(L);
  int v = 0;
  nc.ncclGetVersion(&v);
  if (v < 22200) return cl_error(L, where, "NCCL %d is older than 2.22: pass an id from nccl.unique_id() (comm_init_rank)", v);
  ncclUniqueId id;
  return init_rank(L, n, &id, addr, rank, 4, where);
}

/* comm_init_all({devices}) -> {communicators}, one per device, ranks in that order; their
   collectives go inside nccl.group (one thread drives them all). Blocking communicators: one
   process has no peer to lose. */
static int l_comm_init_all(lua_State *L) {
  static const char *const where = "nccl.comm_init_all";
  cl_checktype(L, 1, LUA_TTABLE);
  int n = (int)lua_rawlen(L, 1);
  if (n < 1 || n > 64) return cl_error(L, where, "expected a list of 1 to 64 device ids, got %d", (int)n);
  if (group_depth) cl_error(L, where, "not inside nccl.group (NCCL would queue the init until the group ends)");
  need_gpu(L, where);
  int devs[64];
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 1, i + 1);
    int isint;
    lua_Integer d = lua_tointegerx(L, -1, &isint);
    if (!isint || d < 0 || d >= cl_ndevices())
      return cl_error(L, where, "device %s is not one of this machine's (0..%d)", luaL_tolstring(L, -1, NULL), cl_ndevices() - 1);
    devs[i] = (int)d;
    lua_pop(L, 1);
    for (int j = 0; j < i; j++)
      if (devs[j] == devs[i]) return cl_error(L, where, "device %d given twice", devs[i]);
  }
  need(L);
  ncclComm_t h[64] = {0};
  CUcontext ctx[64];
  for (int i = 0; i < n; i++) ctx[i] = cl_device_ctx(L, devs[i]);   /* before NCCL's own runtime calls */
  lua_createtable(L, n, 0);
  int list = lua_gettop(L);
  for (int i = 0; i < n; i++) {   /* the objects first: an error after init leaks nothing */
    ncomm *k = push_comm(L, ctx[i], default_timeout(), 0);
    k->in_set = n > 1;
    fill_info(k, i, n, devs[i]);
    lua_pushvalue(L, list); lua_setiuservalue(L, -2, 1);
    lua_rawseti(L, list, i + 1);
  }
  CUcontext cur = NULL;
  CU0(cuCtxGetCurrent, &cur);
  ncclResult_t r = nc.ncclCommInitAll(h, n, devs);
  CU0(cuCtxSetCurrent, cur);
  check(L, r, where);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, list, i + 1);
    ((lcomm *)lua_touserdata(L, -1))->k->c = h[i];
    lua_pop(L, 1);
  }
  return 1;
}

/* the group's end returned r: each communicator of it waited for (its lock held since its
   first collective), its collectives watched, its lock let go. The first failure is raised
   once every lock is let go (the others' failures abort them: their reasons are kept). */
static void group_settle(lua_State *L, ncclResult_t r, double t0, int quiet) {
  ncomm **ks = held;
  int nk = nheld;
  ncomm *bad = NULL;
  ncclResult_t badr = 0;
  for (int i = 0; i < nk; i++) {
    ncomm *k = ks[i];
    ncclResult_t rk = k->c ? settle(L, k, k->c, r, t0) : -2;
    if (rk == 0) {
      for (int j = 0; j < ngrouped; j++) if (grouped[j].k == k) track(k, grouped[j].h, grouped[j].op, t0);
    } else if (!bad) {
      bad = k, badr = rk;
      continue;   /* raised below, its lock held */
    } else if (rk == -1 || breaks(rk)) {
      if (k->c) abort_comm(k, 1, "nccl.group", rk == -1 ? "timed out: aborted" : "failed: aborted");
    }
    pthread_mutex_unlock(&k->lock);
  }
  nheld = 0, ngrouped = 0;
  if (bad && quiet) {   /* fn's error goes up: this one's communicator aborted as fail would */
    if ((badr == -1 || breaks(badr)) && bad->c) abort_comm(bad, 1, "nccl.group", "failed while the group's function raised: aborted");
    pthread_mutex_unlock(&bad->lock);
    return;
  }
  if (bad) fail(L, bad, badr, t0, "nccl.group", 0);
  if (r != NCCL_IN_PROGRESS && !quiet) check(L, r, "nccl.group");
}

/* group(fn, ...) -> fn's results: fn's collectives queued as one group; the group ends when
   fn raises too, and the error is raised after */
static int l_group(lua_State *L) {
  if (lua_type(L, 1) != LUA_TFUNCTION) return cl_error(L, "nccl.group", "expected a function, got %s", luaL_typename(L, 1));
  need(L);
  int base = lua_gettop(L) - 1;   /* below fn */
  ncclResult_t r = nc.ncclGroupStart();
  check(L, r, "nccl.group");
  if (group_depth++ == 0) nheld = 0, ngrouped = 0;
  int st = lua_pcall(L, base, LUA_MULTRET, 0);
  group_depth--;
  double t0 = now_s();
  r = CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclGroupEnd());
  if (group_depth == 0) {
    release_group(L);
    group_settle(L, r, t0, st != LUA_OK);
    cl_flush_deferred(L);   /* communicators closed inside it */
  } else if (r != NCCL_IN_PROGRESS && st == LUA_OK) {
    check(L, r, "nccl.group");
  }
  if (st != LUA_OK) { lua_settop(L, 1); return lua_error(L); }
  return lua_gettop(L);
}

/* cl_wait_hook: no wait inside a group while it holds communicators (the watchdog could not
   abort one whose collective hangs); after a wait, the watchdog's aborts are told */
static void wait_hook(lua_State *L, const char *what, int after) {
  if (after) { nccl_told(L, what); return; }
  if (group_depth && nheld)
    cl_error(L, what, "no waiting inside nccl.group(...) once it has queued collectives: "
             "NCCL queues them at the group's end (wait after it)");
}

/* ---- communicators ---- */

/* the NCCL type of a cudalua dtype */
static int nccl_type(lua_State *L, int dt, const char *where) {
  switch (dt) {
    case CL_I8: return NCCL_INT8;
    case CL_U8: return NCCL_UINT8;
    case CL_I32: return NCCL_INT32;
    case CL_U32: return NCCL_UINT32;
    case CL_I64: return NCCL_INT64;
    case CL_U64: return NCCL_UINT64;
    case CL_F16: return NCCL_FLOAT16;
    case CL_BF16: return NCCL_BFLOAT16;
    case CL_F32: return NCCL_FLOAT32;
    case CL_F64: return NCCL_FLOAT64;
  }
  return cl_error(L, where, "NCCL has no %s (int8, uint8, int32, uint32, int64, uint64, "
                    "float16, bfloat16, float32, float64)", cl_dtypes[dt].name);
}

/* the array at idx, device memory the communicator's device reaches */
static cl_array *buffer(lua_State *L, ncomm *k, int idx, const char *where) {
  cl_array *a = cl_checkarray(L, idx);
  cl_need_contiguous(L, a, where, "the buffer");
  if (a->kind == CL_HOST || a->kind == CL_PINNED || a->kind == CL_MAPPED)
    cl_error(L, where, "NCCL works on device memory, got a %s", cl_kind_names[a->kind]);
  if (!cl_mem_reachable(a->mem, k->ctx))
    cl_error(L, where, "the array is on device %d and the communicator on device %d",
               cl_device_of(a->mem->ctx), k->dev);
  return a;
}

static int op_of(lua_State *L, int idx) {
  static const char *const ops[] = {"sum", "prod", "max", "min", "avg", NULL};
  return cl_checkoption(L, idx, "sum", ops);
}

/* what every collective does before it is queued: the context, the stream, the group rule */
static CUstream prepare(lua_State *L, ncomm *k, int sidx, cl_stream **ps, const char *where) {
  cl_stream *s = cl_tostream(L, sidx, where);
  cl_stream_check(L, s, k->ctx, where, "communicator");
  if (k->in_set && group_depth == 0)
    cl_error(L, where, "this communicator is one of several this process drives "
               "(comm_init_all): queue their collectives inside nccl.group(function() ... end)");
  keep_in_group(L, 1, 3);   /* (the communicator too: its record's lock is the group's) */
  CL_BEFORE_ENQUEUE(L, where);
  *ps = s;   /* NCCL selects the communicator's device itself */
  return s ? s->h : NULL;
}

/* (in a capture, the capture holds the block: the array may be closed before it ends) */
static void used(lua_State *L, cl_array *a, cl_stream *s, ncomm *k) {
  if (!a) return;
  cl_mem_use_n(L, &a->mem, 1, s, k->ctx);
}

/* a graph's memory (graph:alloc, a capture's allocation) may be used by that graph's work only:
   a collective on a stream capturing it (raises otherwise) */
static void graph_mem(lua_State *L, cl_array *a, cl_array *b, cl_stream *s, const char *where) {
  if (a && a->mem->gmem) cl_mem_graph_use(L, a->mem, s, where);
  if (b && b->mem->gmem) cl_mem_graph_use(L, b->mem, s, where);
}

static void same(lua_State *L, cl_array *a, cl_array *b, size_t factor_b, size_t factor_a, const char *where) {
  if (a->dtype != b->dtype)
    cl_error(L, where, "dtype mismatch (%s and %s)", cl_dtypes[a->dtype].name, cl_dtypes[b->dtype].name);
  if (a->size * factor_a != b->size * factor_b)
    cl_error(L, where, "the receiving array needs %I elements, it has %I",
               (lua_Integer)(a->size * factor_a / factor_b), (lua_Integer)b->size);
}

/* one collective, its arguments checked: queued, waited for and watched; a and b used on st */
#define COLLECTIVE(L, c, w, h, st, a, b, call) do { \
    double t0_ = now_s(); \
    ncomm *k_ = op_begin(L, c, w); \
    ncclResult_t r_ = CL_PARKED(L, CL_PARK_ENQUEUE, call); \
    op_end(L, k_, r_, h, t0_, w); \
    used(L, a, st, k_); used(L, b, st, k_); \
  } while (0)

/* comm:all_reduce(send, recv [, op [, stream]]) and comm:reduce_scatter(send, recv [, op
   [, stream]]): with scatter, rank i gets block i of the reduction */
static int reduction(lua_State *L, int scatter) {
  lcomm *c = checkcomm(L, 1);
  ncomm *k = c->k;
  const char *w = scatter ? "comm:reduce_scatter" : "comm:all_reduce";
  cl_array *s = buffer(L, k, 2, w), *r = buffer(L, k, 3, w);
  same(L, s, r, scatter ? (size_t)k->size : 1, 1, w);
  int op = op_of(L, 4), t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, k, 5, &st, w);
  graph_mem(L, s, r, st, w);
  void *sp = (void *)cl_devptr(s), *rp = (void *)cl_devptr(r);
  if (scatter) COLLECTIVE(L, c, w, h, st, s, r, nc.ncclReduceScatter(sp, rp, r->size, t, op, k->c, h));
  else COLLECTIVE(L, c, w, h, st, s, r, nc.ncclAllReduce(sp, rp, s->size, t, op, k->c, h));
  return 0;
}
static int c_all_reduce(lua_State *L) { return reduction(L, 0); }
static int c_reduce_scatter(lua_State *L) { return reduction(L, 1); }

/* comm:broadcast(send, recv, root [, stream]): send matters on root only */
static int c_broadcast(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  ncomm *k = c->k;
  const char *w = "comm:broadcast";
  cl_array *s = buffer(L, k, 2, w), *r = buffer(L, k, 3, w);
  same(L, s, r, 1, 1, w);
  lua_Integer root = cl_checkinteger(L, 4);
  cl_argcheck(L, root >= 0 && root < k->size, 4, lua_pushfstring(L, "root must be 0..%d", k->size - 1));
  int t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, k, 5, &st, w);
  graph_mem(L, s, r, st, w);
  COLLECTIVE(L, c, w, h, st, s, r, nc.ncclBroadcast((void *)cl_devptr(s), (void *)cl_devptr(r), r->size, t, (int)root, k->c, h));
  return 0;
}

/* comm:reduce(send, recv, op, root [, stream]): recv matters on root only (nil elsewhere) */
static int c_reduce(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  ncomm *k = c->k;
  const char *w = "comm:reduce";
  cl_array *s = buffer(L, k, 2, w), *r = NULL;
  int op = op_of(L, 4);
  lua_Integer root = cl_checkinteger(L, 5);
  cl_argcheck(L, root >= 0 && root < k->size, 5, lua_pushfstring(L, "root must be 0..%d", k->size - 1));
  if (!lua_isnil(L, 3) || root == k->rank) { r = buffer(L, k, 3, w); same(L, s, r, 1, 1, w); }
  int t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, k, 6, &st, w);
  graph_mem(L, s, r, st, w);
  COLLECTIVE(L, c, w, h, st, s, r, nc.ncclReduce((void *)cl_devptr(s), r ? (void *)cl_devptr(r) : NULL, s->size, t, op, (int)root, k->c, h));
  return 0;
}

/* comm:all_gather(send, recv [, stream]): recv holds every rank's send, in rank order */
static int c_all_gather(lua_State *L) {
  lcomm *c = checkcomm(L, 1);
  ncomm *k = c->k;
  const char *w = "comm:all_gather";
  cl_array *s = buffer(L, k, 2, w), *r = buffer(L, k, 3, w);
  same(L, s, r, 1, (size_t)k->size, w);
  int t = nccl_type(L, s->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, k, 4, &st, w);
  graph_mem(L, s, r, st, w);
  COLLECTIVE(L, c, w, h, st, s, r, nc.ncclAllGather((void *)cl_devptr(s), (void *)cl_devptr(r), s->size, t, k->c, h));
  return 0;
}

/* comm:send(buf, peer [, stream]) and comm:recv(buf, peer [, stream]) */
static int point(lua_State *L, int recv) {
  lcomm *c = checkcomm(L, 1);
  ncomm *k = c->k;
  const char *w = recv ? "comm:recv" : "comm:send";
  cl_array *a = buffer(L, k, 2, w);
  lua_Integer peer = cl_checkinteger(L, 3);
  cl_argcheck(L, peer >= 0 && peer < k->size, 3, lua_pushfstring(L, "peer must be 0..%d", k->size - 1));
  int t = nccl_type(L, a->dtype, w);
  cl_stream *st;
  CUstream h = prepare(L, k, 4, &st, w);
  graph_mem(L, a, NULL, st, w);
  void *p = (void *)cl_devptr(a);
  if (recv) COLLECTIVE(L, c, w, h, st, a, NULL, nc.ncclRecv(p, a->size, t, (int)peer, k->c, h));
  else COLLECTIVE(L, c, w, h, st, a, NULL, nc.ncclSend(p, a->size, t, (int)peer, k->c, h));
  return 0;
}
static int c_send(lua_State *L) { return point(L, 0); }
static int c_recv(lua_State *L) { return point(L, 1); }

static int c_rank(lua_State *L) { lua_pushinteger(L, checkcomm(L, 1)->k->rank); return 1; }
static int c_size(lua_State *L) { lua_pushinteger(L, checkcomm(L, 1)->k->size); return 1; }
static int c_device(lua_State *L) { lua_pushinteger(L, checkcomm(L, 1)->k->dev); return 1; }
static int c_handle(lua_State *L) { lua_pushinteger(L, (lua_Integer)(uintptr_t)checkcomm(L, 1)->k->c); return 1; }

/* comm:timeout() -> seconds; comm:set_timeout(seconds) (NCCL's calls and each collective) */
static int c_timeout(lua_State *L) { lua_pushnumber(L, checkcomm(L, 1)->k->timeout); return 1; }
/* k's lock for a look (not when this thread's group holds it already): 1 when taken */
static int look(ncomm *k) {
  if (group_depth && holds(k)) return 0;
  pthread_mutex_lock(&k->lock);
  return 1;
}

static int c_set_timeout(lua_State *L) {
  ncomm *k = checkcomm(L, 1)->k;
  lua_Number t = cl_checknumber(L, 2);
  cl_argcheck(L, t > 0 && t <= 1e9, 2, "seconds must be > 0");
  int locked = look(k);
  k->timeout = (double)t;
  if (locked) pthread_mutex_unlock(&k->lock);
  return 0;
}

/* comm:pending() -> how many of its collectives the GPU has not finished (polls; Lua goes on) */
static int c_pending(lua_State *L) {
  ncomm *k = checkcomm(L, 1)->k;
  int locked = look(k);
  if (k->c) retire(k, now_s());
  int n = (int)k->n;
  if (locked) pthread_mutex_unlock(&k->lock);
  lua_pushinteger(L, n);
  return 1;
}

/* the communicator's asynchronous error, if any: nil when there is none (or aborted: why) */
static int c_async_error(lua_State *L) {
  ncomm *k = checkcomm(L, 1)->k;
  int locked = look(k);
  ncclResult_t e = 0, r = k->c && locked ? nc.ncclCommGetAsyncError(k->c, &e) : 0;   /* (in its group: not yet queued) */
  if (!k->c && k->aborted) lua_pushfstring(L, "aborted during %s: %s", k->why_op, k->why);
  else if (r == 0 && e != 0) lua_pushfstring(L, "%s (%s)", RESULT(e));
  else if (r != 0) lua_pushfstring(L, "%s (%s)", RESULT(r));
  else lua_pushnil(L);
  if (locked) pthread_mutex_unlock(&k->lock);
  return 1;
}

/* a split or shrink of k returned r: NCCL makes the new communicator on a thread of its own and
   fills in its handle at the end, which the parent's state tells (ncclSuccess once it is
   made, even while it is running: NCCL issue 1472) */
static ncclResult_t made(lua_State *L, ncomm *k, ncclResult_t r, double t0) {
  if (r != 0 && r != NCCL_IN_PROGRESS) return r;
  return k->nonblocking ? settle(L, k, k->c, NCCL_IN_PROGRESS, t0) : 0;
}

/* a communicator made from k (split, shrink): h and r as NCCL gave them (k's lock held: let
   go); waited for with the timeout. NULL h with r 0: none for this rank (pushes nil) */
static int derived(lua_State *L, ncomm *k, ncclComm_t h, double t0, double timeout, const char *where) {
  int parent_rank = k->rank, parent_size = k->size;
  pthread_mutex_unlock(&k->lock);
  if (!h) { lua_pushnil(L); return 1; }
  ncomm *n = push_comm(L, k->ctx, timeout, k->nonblocking);
  fill_info(n, parent_rank, parent_size, k->dev);   /* (its messages until it is made) */
  pthread_mutex_lock(&n->lock);
  joined(L, n, h, 0, t0, where);   /* (its caller raised for a failed split or shrink) */
  return 1;
}

/* comm:split(color, key [, {timeout =, blocking =}]) -> the communicator of the ranks that gave
   this color, ranked by key (then by rank); color nil: this rank joins none (nil). Every rank
   of comm calls it. */
static int c_split(lua_State *L) {
  static const char *const where = "comm:split";
  lcomm *c = checkcomm(L, 1);
  int color = lua_isnil(L, 2) ? NCCL_SPLIT_NOCOLOR : (int)cl_checkinteger(L, 2);
  cl_argcheck(L, lua_isnil(L, 2) || color >= 0, 2, "color must be >= 0 (or nil: none)");
  int key = (int)cl_checkinteger(L, 3);
  need(L);
  if (!nc.ncclCommSplit) cl_error(L, where, "this NCCL has no ncclCommSplit (2.18 or newer needed)");
  if (group_depth) cl_error(L, where, "not inside nccl.group");
  copts o = comm_options(L, 4, where, 0);
  ncomm *k = op_begin(L, c, where);
  ncclConfig_t cfg = config(o.nonblocking && k->nonblocking);
  ncclComm_t h = NULL;
  double t0 = now_s();
  ncclResult_t r = CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclCommSplit(k->c, color, key, &h, &cfg));
  r = made(L, k, r, t0);
  if (r != 0) fail(L, k, r, t0, where, 0);
  return derived(L, k, h, t0, o.timeout, where);
}

/* the ranks of the list at idx: 0..size-1, each once, not all */
static int rank_list(lua_State *L, int idx, ncomm *k, int *out, const char *where) {
  cl_checktype(L, idx, LUA_TTABLE);
  int n = (int)lua_rawlen(L, idx);
  if (n < 1 || n >= k->size) cl_error(L, where, "expected a list of 1 to %d ranks to drop, got %d", k->size - 1, n);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, idx, i + 1);
    int isint;
    lua_Integer r = lua_tointegerx(L, -1, &isint);
    if (!isint || r < 0 || r >= k->size) cl_error(L, where, "rank %s is not one of 0..%d", luaL_tolstring(L, -1, NULL), k->size - 1);
    for (int j = 0; j < i; j++) if (out[j] == r) cl_error(L, where, "rank %d given twice", (int)r);
    if (r == k->rank) cl_error(L, where, "rank %d (this one) cannot drop itself", (int)r);
    out[i] = (int)r;
    lua_pop(L, 1);
  }
  return n;
}

/* comm:shrink(ranks [, {timeout =, blocking =, abort =}]) -> a communicator of the ranks not
   listed (ranked in their order): every rank that stays calls it. abort (by default when NCCL
   reports an error on comm): NCCL_SHRINK_ABORT, comm's work in flight abandoned first. comm
   stays open: close it. */
static int c_shrink(lua_State *L) {
  static const char *const where = "comm:shrink";
  lcomm *c = checkcomm(L, 1);
  need(L);
  if (!nc.ncclCommShrink) cl_error(L, where, "this NCCL has no ncclCommShrink (2.27 or newer needed)");
  if (group_depth) cl_error(L, where, "not inside nccl.group");
  int *drop = lua_newuserdatauv(L, sizeof(int) * (size_t)c->k->size, 0);
  lua_insert(L, 2);   /* (kept below the arguments: freed with the call) */
  int n = rank_list(L, 3, c->k, drop, where);
  copts o = comm_options(L, 4, where, 1);
  ncomm *k = op_begin(L, c, where);
  ncclResult_t e = 0;
  nc.ncclCommGetAsyncError(k->c, &e);
  int flags = o.abort == 1 || (o.abort == -1 && e != 0 && e != NCCL_IN_PROGRESS) ? NCCL_SHRINK_ABORT : 0;
  ncclConfig_t cfg = config(o.nonblocking && k->nonblocking);
  ncclComm_t h = NULL;
  double t0 = now_s();
  ncclResult_t r = CL_PARKED(L, CL_PARK_ENQUEUE, nc.ncclCommShrink(k->c, drop, n, &h, &cfg, flags));
  r = made(L, k, r, t0);
  if (r != 0) fail(L, k, r, t0, where, 0);
  return derived(L, k, h, t0, o.timeout, where);
}

/* ---- closing ---- */

/* finalizes k (its lock held): NCCL's work on it flushed; 0 when that failed or timed out */
static int finalize(lua_State *L, ncomm *k) {
  if (!nc.ncclCommFinalize) return 1;
  double t0 = now_s();
  ncclResult_t r = nc.ncclCommFinalize(k->c);
  if (k->nonblocking) r = settle(L, k, k->c, r, t0);
  return r == 0;
}

/* closes the communicators cs (a list of comm_init_all, or one): out of the watchdog's sight
   first; a broken one is aborted; healthy ones are finalized (together, in a group: one thread
   drives them all), then destroyed, and their records freed. Never raises: it runs from __gc. */
static void close_comms(lua_State *L, ncomm **cs, int n, int broken) {
  cl_host_drain(L);   /* finalizing waits for the device: L's host functions run first */
  CUcontext cur = NULL;
  CU0(cuCtxGetCurrent, &cur);
  for (int i = 0; i < n; i++) unwatch(cs[i]);
  /* one broken communicator of a list (or an abort asked for): finalizing the others would
     wait for it forever */
  for (int i = 0; i < n; i++) {
    ncclResult_t e = 0;
    CU0(cuCtxSetCurrent, cs[i]->ctx);
    if (cs[i]->c && (nc.ncclCommGetAsyncError(cs[i]->c, &e) != 0 || (e && e != NCCL_IN_PROGRESS))) broken = 1;
  }
  if (!broken && n > 1) nc.ncclGroupStart();
  for (int i = 0; i < n && !broken; i++) {
    CU0(cuCtxSetCurrent, cs[i]->ctx);
    pthread_mutex_lock(&cs[i]->lock);
    if (cs[i]->c && n == 1 && !finalize(L, cs[i])) broken = 1;
    else if (cs[i]->c && n > 1 && nc.ncclCommFinalize) nc.ncclCommFinalize(cs[i]->c);
    pthread_mutex_unlock(&cs[i]->lock);
  }
  if (n > 1 && !broken) nc.ncclGroupEnd();
  for (int i = 0; i < n; i++) {
    ncomm *k = cs[i];
    CU0(cuCtxSetCurrent, k->ctx);
    if (k->c) (broken ? nc.ncclCommAbort : nc.ncclCommDestroy)(k->c);
    k->c = NULL;
    drop_events(k);
    pthread_mutex_destroy(&k->lock);
    free(k);
  }
  CU0(cuCtxSetCurrent, cur);
}

/* communicators dropped inside a host function or a capture (finalizing and destroying wait
   for the device), inside nccl.group (NCCL would queue the finalize until the group's end), or
   while a wait of this thread has let go of their lock (it goes on with the record): closed
   later (cl_defer; nccl.group flushes at its end); abort: aborted then */
typedef struct { cl_deferred later; int n, abort; ncomm *c[]; } closing;
static void close_later(lua_State *L, cl_deferred *d) {
  closing *k = CL_DEFERRED_OWNER(d, closing, later);
  close_comms(L, k->c, k->n, k->abort);
  free(k);
}

/* whether closing cs now must wait (see closing) */
static int must_defer(lua_State *L, ncomm **cs, int n) {
  int busy = 0;
  for (int i = 0; i < n; i++) busy |= cs[i]->busy;
  return busy || group_depth || cl_must_defer_now(L);   /* (never for cuda.defer_cleanup: other ranks wait) */
}

/* closes cs now or later; raises nothing */
static void close_or_defer(lua_State *L, ncomm **cs, int n, int abort) {
  closing *k = must_defer(L, cs, n) ? malloc(sizeof *k + n * sizeof(ncomm *)) : NULL;
  if (!k) { close_comms(L, cs, n, abort); return; }
  k->later.fn = close_later;
  k->n = n, k->abort = abort;
  memcpy(k->c, cs, n * sizeof(ncomm *));
  cl_defer_urgent(L, &k->later);   /* (other ranks may wait for it: never held by cuda.defer_cleanup) */
}

/* comm:close(): a communicator of comm_init_all closes with all the others of its list */
static int c_close(lua_State *L) {
  lcomm *c = cl_checkudata(L, 1, COMM_MT);
  ncomm *cs[64];
  int n = 0;
  if (lua_getiuservalue(L, 1, 1) == LUA_TTABLE) {
    int len = (int)lua_rawlen(L, -1);
    for (int i = 1; i <= len && n < 64; i++) {
      lua_rawgeti(L, -1, i);
      lcomm *o = luaL_testudata(L, -1, COMM_MT);
      if (o && o->k) { cs[n++] = o->k; o->k = NULL; }
      lua_pop(L, 1);
    }
  } else if (c->k) { cs[n++] = c->k; c->k = NULL; }
  lua_pop(L, 1);
  if (n) close_or_defer(L, cs, n, 0);
  return 0;
}

/* comm:abort(): ends the communicator now, whatever is queued (after an error); inside a host
   function that runs while this thread waits for it, once that wait has let go */
static int c_abort(lua_State *L) {
  lcomm *c = cl_checkudata(L, 1, COMM_MT);
  ncomm *k = c->k;
  if (!k) return 0;
  if (group_depth && holds(k))
    cl_error(L, "comm:abort", "not inside the nccl.group that queued its collectives (abort it after the group)");
  c->k = NULL;
  if (k->busy || cl_must_defer_now(L)) close_or_defer(L, &k, 1, 1);
  else close_comms(L, &k, 1, 1);   /* (as a broken list's close: aborted, and the context before put back) */
  return 0;
}

static int c_tostring(lua_State *L) {
  lcomm *c = cl_checkudata(L, 1, COMM_MT);
  if (!c->k) lua_pushliteral(L, "cudalua.nccl_comm<closed>");
  else if (!c->k->c) lua_pushfstring(L, "cudalua.nccl_comm<aborted: rank %d of %d>", c->k->rank, c->k->size);
  else lua_pushfstring(L, "cudalua.nccl_comm<rank %d of %d, device %d>", c->k->rank, c->k->size, c->k->dev);
  return 1;
}

int luaopen_cudalua_nccl_core(lua_State *L) {
  static const luaL_Reg m[] = {
    {"all_reduce", c_all_reduce}, {"broadcast", c_broadcast}, {"reduce", c_reduce},
    {"all_gather", c_all_gather}, {"reduce_scatter", c_reduce_scatter}, {"send", c_send},
    {"recv", c_recv}, {"rank", c_rank}, {"size", c_size}, {"device", c_device},
    {"handle", c_handle}, {"async_error", c_async_error}, {"close", c_close}, {"abort", c_abort},
    {"timeout", c_timeout}, {"set_timeout", c_set_timeout}, {"pending", c_pending},
    {"split", c_split}, {"shrink", c_shrink}, {NULL, NULL}};
  static const luaL_Reg f[] = {
    {"available", l_available}, {"version", l_version}, {"unique_id", l_unique_id},
    {"comm_init_rank", l_comm_init_rank}, {"comm_init_at", l_comm_init_at}, {"comm_init_all", l_comm_init_all},
    {"group", l_group}, {"default_timeout", l_default_timeout}, {NULL, NULL}};
  static const luaL_Reg meta[] = {
    {"__gc", c_close}, {"__close", c_close}, {"__tostring", c_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){COMM_MT, m, NULL, meta, NULL});
  cl_wait_hook = wait_hook;
  luaL_newlib(L, f);
  return 1;
}
