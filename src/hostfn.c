/* hostfn.c: Lua functions called from the stream (graph host nodes, stream:launch_host_func).
   The driver calls host functions on a thread of its own, but a lua_State belongs to one
   thread. So the driver's thread only queues the call and waits; the Lua thread runs it when
   it next waits in cudalua (synchronize, query, copies that finish on return), then lets the
   driver's thread go on. Stream order holds: work after the host call waits for it.
   The rule for users: a stream with Lua host functions must be waited on through cudalua. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include "cl.h"

typedef struct cl_hostcall {
  struct cl_hostq *q;
  int ref;                    /* the Lua function, in the registry */
  int oneshot;                /* launch_host_func: released after it runs */
  volatile int done;
  struct cl_hostcall *next;
} cl_hostcall;

typedef struct cl_hostq {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  cl_hostcall *head, *tail;   /* calls the driver's threads are waiting on */
  int armed;                  /* calls queued on streams that have not run yet */
  int closed;                 /* the lua_State is gone: calls return at once */
  int running;                /* a host function is running on the Lua thread now */
  lua_State *parked;          /* where launches block: the Lua thread waits in a driver call
                                 that may wait for a host function, which runs on the driver's
                                 thread instead (the Lua thread touches nothing meanwhile) */
  int borrowed;               /* a host function runs on the driver's thread now */
  struct cl_hostq *next;      /* closed queues, freed when the last state closes */
} cl_hostq;

static const char hostq_key = 0;   /* registry key: looked up on every wait */
static cl_hostq *closed_queues;
static pthread_mutex_t closed_mu = PTHREAD_MUTEX_INITIALIZER;

static cl_hostq *queue_of(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &hostq_key);
  cl_hostq **pq = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return pq ? *pq : NULL;
}

static void run_one(lua_State *L, cl_hostq *q, cl_hostcall *c);

static void CUDA_CB trampoline(void *ud) {
  cl_hostcall *c = ud;
  cl_hostq *q = c->q;
  pthread_mutex_lock(&q->mu);
  /* the driver has a thread per context: one at a time runs Lua */
  while (q->borrowed && q->parked && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
  if (!q->closed && q->parked) {
    lua_State *L = q->parked;
    q->borrowed = 1;
    pthread_mutex_unlock(&q->mu);
    run_one(L, q, c);
    pthread_mutex_lock(&q->mu);
    q->borrowed = 0;
  } else if (!q->closed) {
    c->done = 0;
    c->next = NULL;
    if (q->tail) q->tail->next = c; else q->head = c;
    q->tail = c;
    pthread_cond_broadcast(&q->cv);
    while (!c->done && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
  }
  q->armed--;
  int oneshot = c->oneshot;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  if (oneshot) free(c);
}

/* runs one call; its error is kept in the registry list "cudalua.hosterrors" */
static void run_one(lua_State *L, cl_hostq *q, cl_hostcall *c) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->ref);
  q->running++;
  int st = lua_pcall(L, 0, 0, 0);
  q->running--;
  if (st != LUA_OK) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, "cudalua.hosterrors");
    lua_insert(L, -2);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 1);
  }
  if (c->oneshot) luaL_unref(L, LUA_REGISTRYINDEX, c->ref);
}

/* runs the queued calls */
int cl_host_service(lua_State *L) {
  cl_hostq *q = queue_of(L);
  if (!q) return 0;
  pthread_mutex_lock(&q->mu);
  cl_hostcall *c = q->head;
  q->head = q->tail = NULL;
  pthread_mutex_unlock(&q->mu);
  int ran = 0;
  while (c) {
    cl_hostcall *next = c->next;
    run_one(L, q, c);
    pthread_mutex_lock(&q->mu);
    c->done = 1;   /* after this the driver's thread may free a one-shot call */
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    ran++;
    c = next;
  }
  /* memory and modules the host functions dropped that could not be freed inside them */
  if (ran && !q->running) cl_flush_deferred(L);
  return ran;
}

int cl_host_running(lua_State *L) {
  cl_hostq *q = queue_of(L);
  return q && q->running;
}

static int armed(cl_hostq *q) {
  pthread_mutex_lock(&q->mu);
  int a = q->armed;
  pthread_mutex_unlock(&q->mu);
  return a;
}

int cl_host_armed(lua_State *L) {
  cl_hostq *q = queue_of(L);
  return q ? armed(q) : 0;
}

void cl_host_arm(lua_State *L, int n) {
  cl_hostq *q = queue_of(L);
  pthread_mutex_lock(&q->mu);
  q->armed += n;
  pthread_mutex_unlock(&q->mu);
}

/* the releases put off: process-wide, as the capture flag is */
static cl_deferred *later;
static pthread_mutex_t later_mu = PTHREAD_MUTEX_INITIALIZER;

int cl_must_defer(lua_State *L) {
  return cl_capturing || (L && cl_host_running(L));
}

void cl_defer(cl_deferred *d) {
  pthread_mutex_lock(&later_mu);
  d->next = later;
  later = d;
  pthread_mutex_unlock(&later_mu);
}

void cl_flush_deferred(lua_State *L) {
  /* not inside a host function (these releases wait for the device); nothing put off, the
     common case, is seen without the lock or a lookup of the queue */
  if (!__atomic_load_n(&later, __ATOMIC_RELAXED) || (L && cl_host_running(L))) return;
  while (later && !cl_capturing) {
    pthread_mutex_lock(&later_mu);
    cl_deferred *d = later;
    if (d) later = d->next;
    pthread_mutex_unlock(&later_mu);
    if (!d) break;
    d->fn(L, d);
  }
}

/* raises the first error a host function raised, if any */
void cl_host_raise(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, "cudalua.hosterrors") != LUA_TTABLE || lua_rawlen(L, -1) == 0) {
    lua_pop(L, 1);
    return;
  }
  lua_rawgeti(L, -1, 1);
  lua_Integer n = (lua_Integer)lua_rawlen(L, -2);
  lua_newtable(L);
  lua_setfield(L, LUA_REGISTRYINDEX, "cudalua.hosterrors");
  luaL_error(L, "cudalua: a Lua host function failed%s: %s",
             n > 1 ? lua_pushfstring(L, " (and %I more)", n - 1) : "", luaL_tolstring(L, -1, NULL));
}

/* waits up to us microseconds for the driver to queue a call */
static void nap(cl_hostq *q, long us) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += us * 1000;
  if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
  pthread_mutex_lock(&q->mu);
  if (!q->head) pthread_cond_timedwait(&q->cv, &q->mu, &ts);
  pthread_mutex_unlock(&q->mu);
}

/* the stream is stopped at a running host function: waiting for it there would never end */
static void refuse_if_running(lua_State *L, const cl_hostq *q) {
  if (q && q->running)
    luaL_error(L, "cudalua: a Lua host function cannot wait for the GPU (synchronize, blocking copies)");
}

void cl_wait_check(lua_State *L) { refuse_if_running(L, queue_of(L)); }

/* Every blocking wait of cudalua goes through here: with no host call pending it is the plain
   driver call; otherwise it runs host calls while it polls. q: L's queue. */
static CUresult wait_q(lua_State *L, cl_hostq *q, int kind, void *h) {
  refuse_if_running(L, q);
  if (!q || armed(q) == 0) {
    if (kind == CL_WAIT_STREAM) return cu.cuStreamSynchronize((CUstream)h);
    if (kind == CL_WAIT_EVENT) return cu.cuEventSynchronize((CUevent)h);
    return cu.cuCtxSynchronize();
  }
  for (;;) {
    cl_host_service(L);
    CUresult r;
    if (kind == CL_WAIT_STREAM) r = cu.cuStreamQuery((CUstream)h);
    else if (kind == CL_WAIT_EVENT) r = cu.cuEventQuery((CUevent)h);
    else r = armed(q) ? CUDA_ERROR_NOT_READY : cu.cuCtxSynchronize();
    if (r != CUDA_ERROR_NOT_READY) return r;
    nap(q, 200);
  }
}

CUresult cl_wait_raw(lua_State *L, int kind, void *h) { return wait_q(L, queue_of(L), kind, h); }

void cl_wait(lua_State *L, int kind, void *h, const char *what) {
  CUresult r = cl_wait_raw(L, kind, h);
  cl_check(L, r, what);
  cl_host_raise(L);
}

/* a call record for graph host nodes (kept by the graph) or for one launch_host_func */
void *cl_hostcall_new(lua_State *L, int fidx, int oneshot) {
  cl_hostcall *c = calloc(1, sizeof *c);
  if (!c) luaL_error(L, "cudalua: out of host memory");
  c->q = queue_of(L);
  lua_pushvalue(L, fidx);
  c->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  c->oneshot = oneshot;
  return c;
}

void cl_hostcall_free(lua_State *L, void *call) {
  cl_hostcall *c = call;
  if (!c) return;
  luaL_unref(L, LUA_REGISTRYINDEX, c->ref);
  free(c);
}

CUhostFn cl_host_trampoline(void) { return trampoline; }

int cl_launch_blocks;

/* L's queue when it has armed calls this thread may wait for now: inside a host function or a
   capture no wait may be; nothing armed, nothing to wait for */
static cl_hostq *waitable(lua_State *L) {
  if (cl_capturing) return NULL;
  cl_hostq *q = queue_of(L);
  return q && !q->running && armed(q) ? q : NULL;
}

void cl_host_before_enqueue(lua_State *L, const char *what) {
  cl_hostq *q = waitable(L);
  /* a host function's error is left for the next wait, as without blocking launches */
  if (q) cl_check(L, wait_q(L, q, CL_WAIT_CTX, NULL), what);
}

/* where launches block, so does queueing a host function: it runs on this thread before the
   call returns, and nothing is left pending for a driver call that waits for the device by
   itself (under compute-sanitizer the launch after a pending host function hung in the driver
   before it was queued). Its error is left for the next wait, as without blocking launches. */
void cl_host_after_enqueue(lua_State *L, CUstream h, const char *what) {
  cl_hostq *q = cl_launch_blocks ? waitable(L) : NULL;
  if (q) cl_check(L, wait_q(L, q, CL_WAIT_STREAM, h), what);
}

/* around a driver call that queues host functions where launches block: the call may return
   only once they have run, so they run on the driver's thread while this one waits in it */
void cl_host_park(lua_State *L) {
  if (!cl_launch_blocks) return;
  cl_hostq *q = queue_of(L);
  if (!q || q->running) return;   /* inside a host function: the Lua thread is not parked */
  pthread_mutex_lock(&q->mu);
  q->parked = L;
  pthread_mutex_unlock(&q->mu);
}

void cl_host_unpark(lua_State *L) {
  if (!cl_launch_blocks) return;
  cl_hostq *q = queue_of(L);
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->parked = NULL;
  while (q->borrowed) pthread_cond_wait(&q->cv, &q->mu);   /* L is the driver thread's until then */
  pthread_mutex_unlock(&q->mu);
  if (!q->running) cl_flush_deferred(L);
}

/* stream:launch_host_func(fn) */
int cl_launch_host_func(lua_State *L, CUstream h) {
  luaL_checktype(L, 2, LUA_TFUNCTION);
  CL_BEFORE_ENQUEUE(L, "stream:launch_host_func");
  cl_hostcall *c = cl_hostcall_new(L, 2, 1);
  cl_host_arm(L, 1);
  cl_host_park(L);
  CUresult r = cu.cuLaunchHostFunc(h, trampoline, c);
  cl_host_unpark(L);
  if (r != CUDA_SUCCESS) {
    cl_host_arm(L, -1);
    cl_hostcall_free(L, c);
    cl_check(L, r, "stream:launch_host_func");
  }
  cl_host_after_enqueue(L, h, "stream:launch_host_func");
  return 0;
}

static int q_gc(lua_State *L) {
  cl_hostq **pq = lua_touserdata(L, 1);
  cl_hostq *q = *pq;
  /* the state is closing: let waiting driver threads go; the queue itself stays (a driver
     thread may still touch it) until the last state has closed and every device has finished */
  pthread_mutex_lock(&q->mu);
  q->closed = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  pthread_mutex_lock(&closed_mu);
  q->next = closed_queues;
  closed_queues = q;
  pthread_mutex_unlock(&closed_mu);
  return 0;
}

/* after cl_release_contexts: no driver thread runs a trampoline any more */
void cl_hostfn_release_closed(void) {
  pthread_mutex_lock(&closed_mu);
  while (closed_queues) {
    cl_hostq *q = closed_queues;
    closed_queues = q->next;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
  }
  pthread_mutex_unlock(&closed_mu);
}

void cl_open_hostfn(lua_State *L) {
  cl_hostq *q = calloc(1, sizeof *q);
  if (!q) luaL_error(L, "cudalua: out of host memory");
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  cl_hostq **pq = lua_newuserdatauv(L, sizeof *pq, 0);
  *pq = q;
  lua_newtable(L);
  lua_pushcfunction(L, q_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &hostq_key);
}
