/* hostfn.c: Lua functions called from the stream (stream:launch_host_func, graph host nodes).
   A lua_State belongs to one thread, and no driver thread is ever made to wait for it: a
   driver callback held until the Lua thread comes by stops the stream's queue after a few
   dozen operations, and the Lua thread then waits in the driver for a thread that waits for
   it (issue 24: 100 copies and host functions, then synchronize, hung). Instead each Lua host
   function owns a word of mapped memory. The stream writes "fired" into it and waits on it
   (cuStreamBatchMemOp: a write, then cuStreamWaitValue32's wait) until "released" is written;
   cudalua runs the function and writes "released". The functions run:
     * on the Lua thread, whenever it waits in cudalua (synchronize, query, blocking copies,
       element reads, frees that wait for the device);
     * on cudalua's helper thread, with the Lua thread's state borrowed, while the Lua thread
       is parked in a driver call that cannot return before the function has run: a queue of
       work full behind a fired function (about a thousand operations), a module load, a
       launch that blocks (CUDA_LAUNCH_BLOCKING=1, compute-sanitizer), or any driver call held
       up by another thread's call that waits for this state's stream. Every driver call of
       cudalua parks (CU() in cl.h) while host functions are pending anywhere: measured, even
       cuStreamDestroy, cuGraphExecDestroy and cuGraphInstantiate blocked while other threads'
       calls waited on a stalled stream. The Lua thread touches nothing while parked, and
       waits for the helper to finish before it goes on.
   The rule for users: a stream with Lua host functions moves on when its Lua state waits in
   cudalua. Inside a host function, releases (close, collection) are put off until it
   returns, and waits for the GPU are refused. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cl.h"

/* ---- words: mapped, page-locked memory every device reaches, a process-wide pool ---- */
#define WPAGE 1024        /* words per page */
#define MAXPAGES 256      /* 262144 host functions pending or in graphs at once */
typedef struct {
  uint32_t *host;         /* the page, seen from the host and (UVA) from every device */
  CUdeviceptr dev;
  CUcontext ctx;          /* the context it was allocated in, to free it */
  uint32_t last[WPAGE];   /* the value each word has once its last user is done */
  cl_hostrec *owner[WPAGE];
} wpage;
static wpage *pages[MAXPAGES];
static int npages;
static int *spare_words, nspare_words, capspare_words;
static pthread_mutex_t words_mu = PTHREAD_MUTEX_INITIALIZER;

static volatile uint32_t *word_host(int w) { return &pages[w / WPAGE]->host[w % WPAGE]; }
static CUdeviceptr word_dev(int w) { return pages[w / WPAGE]->dev + 4 * (CUdeviceptr)(w % WPAGE); }

/* another page of words. The driver is called without words_mu: a host function the helper
   runs meanwhile may free a record (a graph collected there), which takes the lock */
static CUresult add_page(lua_State *L) {
  wpage *p = calloc(1, sizeof *p);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  void *h = NULL;
  CUresult r = CU(cuMemHostAlloc, &h, 4 * WPAGE, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  if (r == CUDA_SUCCESS) r = CU(cuMemHostGetDevicePointer, &p->dev, h, 0);
  if (r != CUDA_SUCCESS) { if (h) CU0(cuMemFreeHost, h); free(p); return r; }
  memset(h, 0, 4 * WPAGE);
  p->host = h;
  CU0(cuCtxGetCurrent, &p->ctx);
  pthread_mutex_lock(&words_mu);
  int *sp = npages < MAXPAGES ? realloc(spare_words, sizeof(int) * (size_t)(capspare_words + WPAGE)) : NULL;
  if (sp) {
    spare_words = sp;
    capspare_words += WPAGE;
    for (int i = WPAGE - 1; i >= 0; i--) spare_words[nspare_words++] = npages * WPAGE + i;
    pages[npages++] = p;
  }
  pthread_mutex_unlock(&words_mu);
  if (!sp) { CU0(cuMemFreeHost, h); free(p); return CUDA_ERROR_OUT_OF_MEMORY; }
  return CUDA_SUCCESS;
}

static int spares(void) {
  pthread_mutex_lock(&words_mu);
  int n = nspare_words;
  pthread_mutex_unlock(&words_mu);
  return n;
}

/* a free word; -1 with *r set when a page cannot be had. Pages are added ahead of need while
   no stream captures: allocating page-locked memory during a capture in the global mode would
   end that capture */
static int word_take(lua_State *L, CUresult *r) {
  *r = CUDA_SUCCESS;
  if (spares() < WPAGE / 4 && !cl_capturing) add_page(L);
  for (;;) {
    pthread_mutex_lock(&words_mu);
    int w = nspare_words ? spare_words[--nspare_words] : -1;
    pthread_mutex_unlock(&words_mu);
    if (w >= 0) return w;
    if ((*r = add_page(L)) != CUDA_SUCCESS) return -1;
  }
}

/* before a capture begins: words for the host functions it may capture */
void cl_host_reserve(lua_State *L) {
  if (spares() < WPAGE / 4) add_page(L);
}

/* ---- records: one Lua host function's place in streams and graphs ---- */
struct cl_hostrec {
  struct cl_hostq *q;
  int ref;                     /* the function, in the registry */
  int word;
  uint32_t fire, release;      /* the stream writes fire, then waits until the word >= release */
  int pending;                 /* firings armed and not yet run */
  unsigned char oneshot;       /* launch_host_func: freed after its one firing */
  unsigned char dropped;       /* its graph is gone: freed once nothing is pending */
  unsigned char listed;        /* in q's list */
  cl_hostrec *prev, *next;     /* q's records with pending firings, oldest armed first */
};

struct cl_hostq {
  pthread_mutex_t mu;          /* the list and counts, against the helper thread */
  pthread_cond_t cv;           /* the helper gives a borrowed state back */
  cl_hostrec *head, *tail;
  int armed;                   /* firings pending (atomic: the helper reads it) */
  int closed;                  /* the state is gone: what fires is released unrun */
  int park;                    /* PARK_NONE, PARK_HELD or PARK_BORROWED (atomic) */
  int park_kind;
  unsigned park_seq, seen_seq; /* the helper borrows a thread parked across two of its looks */
  lua_State *parked;
  int parked_dev;              /* the selected device of the parked thread */
  CUevent order[CL_MAXDEV];    /* recorded after each graph launch with host nodes, per device */
  CUcontext order_ctx[CL_MAXDEV];
  int servicing;               /* service() runs on it (by the thread that owns it now) */
  cl_deferred *later;          /* releases put off (only the state's thread, or the helper
                                  while it has the state borrowed, touches it) */
  int paused;                  /* cuda.defer_cleanup scopes open: every release is put off */
  struct cl_hostq *next;       /* every queue, for the helper */
};
enum { PARK_NONE, PARK_HELD, PARK_BORROWED };

int cl_capturing;   /* streams capturing now, in this process (changed atomically: any thread) */
int cl_capturing_blocking;   /* of them, blocking ones: the legacy stream's work would depend on them */

static const char hostq_key = 0;   /* registry: a userdata holding the state's queue */
static cl_hostq *queues;
static pthread_mutex_t queues_mu = PTHREAD_MUTEX_INITIALIZER;

/* the helper thread: started with the first firing, stopped when the last state closes */
static pthread_t helper;
static int helper_on, helper_stop;
static pthread_mutex_t helper_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cv = PTHREAD_COND_INITIALIZER;

static cl_hostq *queue_of(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &hostq_key);
  cl_hostq **pq = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return pq ? *pq : NULL;
}

static int armed(cl_hostq *q) { return __atomic_load_n(&q->armed, __ATOMIC_ACQUIRE); }
int cl_host_q_armed(cl_hostq *q) { return armed(q); }
cl_hostq *cl_host_queue(lua_State *L) { return queue_of(L); }

static int fired(const cl_hostrec *r) {
  return __atomic_load_n(word_host(r->word), __ATOMIC_ACQUIRE) == r->fire;
}

static void list_add(cl_hostq *q, cl_hostrec *r) {
  r->listed = 1;
  r->next = NULL;
  r->prev = q->tail;
  if (q->tail) q->tail->next = r; else q->head = r;
  q->tail = r;
}

static void list_remove(cl_hostq *q, cl_hostrec *r) {
  if (r->prev) r->prev->next = r->next; else q->head = r->next;
  if (r->next) r->next->prev = r->prev; else q->tail = r->prev;
  r->prev = r->next = NULL;
  r->listed = 0;
}

static void *helper_main(void *unused);

/* starts the helper (helper_on is set before it can look at any queue: q_gc reads it to know
   whether it may free a queue itself), or wakes it */
static void helper_kick(void) {
  pthread_mutex_lock(&helper_mu);
  if (!helper_on && !helper_stop) {
    __atomic_store_n(&helper_on, 1, __ATOMIC_SEQ_CST);
    if (pthread_create(&helper, NULL, helper_main, NULL) != 0) __atomic_store_n(&helper_on, 0, __ATOMIC_SEQ_CST);
  }
  pthread_cond_signal(&helper_cv);
  pthread_mutex_unlock(&helper_mu);
}

/* n more firings of r are queued (q's thread owns q) */
static void arm(cl_hostq *q, cl_hostrec *r, int n) {
  pthread_mutex_lock(&q->mu);
  r->pending += n;
  if (!r->listed) list_add(q, r);
  __atomic_add_fetch(&q->armed, n, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&q->mu);
  if (__atomic_fetch_add(&cl_host_pending, (unsigned)n, __ATOMIC_SEQ_CST) == 0) helper_kick();
}

static void rec_free(lua_State *L, cl_hostrec *r) {
  if (L && r->ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, r->ref);
  pthread_mutex_lock(&words_mu);
  pages[r->word / WPAGE]->owner[r->word % WPAGE] = NULL;
  spare_words[nspare_words++] = r->word;
  pthread_mutex_unlock(&words_mu);
  free(r);
}

/* one firing of r is done (ran or released unrun): the stream goes on. L: NULL when the
   state is gone */
static void release(lua_State *L, cl_hostq *q, cl_hostrec *r) {
  __atomic_store_n(word_host(r->word), r->release, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&q->mu);
  r->pending--;
  int done = r->pending == 0;
  if (done) list_remove(q, r);
  __atomic_sub_fetch(&q->armed, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&q->mu);
  __atomic_sub_fetch(&cl_host_pending, 1, __ATOMIC_SEQ_CST);
  if (done && (r->oneshot || r->dropped)) rec_free(L, r);
}

/* a new record for the function at fidx: its word's next two values are fire and release */
static cl_hostrec *rec_new(lua_State *L, cl_hostq *q, int fidx, int oneshot, const char *where) {
  cl_hostrec *r = calloc(1, sizeof *r);
  if (!r) cl_error(L, NULL, "out of host memory");
  CUresult res;
  int w = word_take(L, &res);
  if (w >= 0) {
    pthread_mutex_lock(&words_mu);
    wpage *p = pages[w / WPAGE];
    r->word = w;
    r->fire = p->last[w % WPAGE] + 1;
    r->release = p->last[w % WPAGE] + 2;
    p->last[w % WPAGE] = r->release;
    p->owner[w % WPAGE] = r;
    pthread_mutex_unlock(&words_mu);
  }
  if (w < 0) {
    free(r);
    if (npages == MAXPAGES)
      cl_error(L, where, "too many Lua host functions pending or in graphs (%d)", MAXPAGES * WPAGE);
    cl_check(L, res, where);
  }
  r->q = q;
  r->oneshot = (unsigned char)oneshot;
  lua_pushvalue(L, fidx);
  r->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return r;
}

/* the stream's part of a record: write fire, wait until the word reaches release (a cyclic
   >=, so that a word's later users never leave an earlier wait stuck) */
void cl_hostrec_ops(const cl_hostrec *r, CUstreamBatchMemOpParams op[2]) {
  memset(op, 0, 2 * sizeof *op);
  op[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op[0].writeValue.address = word_dev(r->word);
  op[0].writeValue.value = r->fire;
  op[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op[1].waitValue.address = word_dev(r->word);
  op[1].waitValue.value = r->release;
  op[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
}

/* ---- running host functions ---- */

static __thread cl_hostq *running_q;   /* the queue whose host function runs on this thread */


static void run(lua_State *L, cl_hostq *q, cl_hostrec *r) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->ref);
  cl_in_hostfn++;
  cl_hostq *outer = running_q;
  running_q = q;
  int st = lua_pcall(L, 0, 0, 0);
  /* the error is kept for the next wait to raise, still as inside the function: keeping it may
     start a collection, whose frees must be put off (a free waits, and its wait would run the
     functions again, this one included, before service releases it) */
  if (st != LUA_OK) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, "cudalua.hosterrors");
    lua_insert(L, -2);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_pop(L, 1);
  }
  running_q = outer;
  cl_in_hostfn--;
}

/* runs the fired functions of q on L (whose thread owns q now); not nested in a running one */
static int service(lua_State *L, cl_hostq *q) {
  if (cl_in_hostfn || q->servicing) return 0;
  int ran = 0;
  q->servicing = 1;   /* never inside itself: a record runs once, and is released once */
  for (cl_hostrec *r = q->head; r;) {
    if (!fired(r)) { r = r->next; continue; }
    run(L, q, r);
    cl_hostrec *next = r->next;   /* read after the run: it may have armed more */
    release(L, q, r);
    ran++;
    r = next;
  }
  q->servicing = 0;
  /* what the functions closed is released by the cudalua call that waited, once it no longer
     uses anything (cl_flush_deferred at its end): not here, in the middle of it */
  return ran;
}

int cl_host_service_q(lua_State *L, cl_hostq *q) { return service(L, q); }

int cl_host_service(lua_State *L) {
  cl_hostq *q = queue_of(L);
  return q && armed(q) ? service(L, q) : 0;
}

int cl_host_armed(lua_State *L) {
  if (!__atomic_load_n(&cl_host_pending, __ATOMIC_RELAXED)) return 0;
  cl_hostq *q = queue_of(L);
  return q ? armed(q) : 0;
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
  /* the message first: an argument that pushes would move index -1 (C leaves the order open) */
  const char *msg = luaL_tolstring(L, -1, NULL);
  cl_error(L, NULL, "a Lua host function failed%s: %s", n > 1 ? lua_pushfstring(L, " (and %I more)", n - 1) : "", msg);
}

/* ---- parking: the Lua thread in a driver call that may wait for a fired function ---- */

static __thread cl_hostq *parked_here;   /* this thread's park, if it is parked */

cl_hostq *cl_host_park_slow(lua_State *L, int kind) {
  /* parked already (a driver call inside a parked one): the helper may have L now, which must
     not be touched (queue_of reads L's registry) nor the park state overwritten */
  if (parked_here) return NULL;
  cl_hostq *q = queue_of(L);
  if (!q || cl_in_hostfn || !armed(q)) return NULL;
  parked_here = q;
  q->parked = L;
  q->parked_dev = cl_current_device();
  q->park_kind = cl_launch_blocks ? CL_PARK_WAIT : kind;
  q->park_seq++;
  __atomic_store_n(&q->park, PARK_HELD, __ATOMIC_SEQ_CST);
  if (q->park_kind == CL_PARK_WAIT) helper_kick();   /* look now, not at the next round */
  return q;
}

void cl_host_unpark_slow(lua_State *L, cl_hostq *q) {
  (void)L;
  parked_here = NULL;
  int held = PARK_HELD;
  if (!__atomic_compare_exchange_n(&q->park, &held, PARK_NONE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    /* the helper runs host functions on L: L is its until it gives it back */
    pthread_mutex_lock(&q->mu);
    while (__atomic_load_n(&q->park, __ATOMIC_ACQUIRE) == PARK_BORROWED) pthread_cond_wait(&q->cv, &q->mu);
    __atomic_store_n(&q->park, PARK_NONE, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&q->mu);
    /* what the functions closed stays until the call that parked is done with it (its end
       flushes the releases put off) */
  }
}

/* the helper's look at one queue: a closed state's fired words are released unrun; a thread
   parked long enough (or in a call that waits) has its fired functions run here */
static int helper_visit(cl_hostq *q) {
  if (q->closed) {
    for (cl_hostrec *r = q->head; r;) {
      cl_hostrec *next = r->next;
      if (fired(r)) release(NULL, q, r);
      r = next;
    }
    return 0;
  }
  if (__atomic_load_n(&q->park, __ATOMIC_ACQUIRE) != PARK_HELD || !armed(q)) return 0;
  unsigned seq = q->park_seq;
  int wait = q->park_kind == CL_PARK_WAIT;
  int ripe = wait || seq == q->seen_seq;
  q->seen_seq = seq;
  int held = PARK_HELD;
  if (!ripe || !__atomic_compare_exchange_n(&q->park, &held, PARK_BORROWED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    return wait;
  if (q->park_seq == seq) {   /* still the park it looked at */
    cl_set_current_device(q->parked_dev);
    service(q->parked, q);
  }
  pthread_mutex_lock(&q->mu);
  __atomic_store_n(&q->park, PARK_HELD, __ATOMIC_SEQ_CST);
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return wait;
}

static void free_queue(cl_hostq *q);

/* one round over every queue; frees closed ones with nothing left; 1: a thread waits in a call */
static int helper_round(void) {
  cl_hostq *snap[64], **v = snap;
  int n = 0, cap = 64, waits = 0;
  pthread_mutex_lock(&queues_mu);
  for (cl_hostq *q = queues; q; q = q->next) {
    if (n == cap) {
      cl_hostq **nv = malloc(sizeof *nv * (size_t)cap * 2);
      if (!nv) break;
      memcpy(nv, v, sizeof *nv * (size_t)n);
      if (v != snap) free(v);
      v = nv; cap *= 2;
    }
    v[n++] = q;
  }
  pthread_mutex_unlock(&queues_mu);
  /* only this thread frees queues while it runs: the snapshot stays valid */
  for (int i = 0; i < n; i++) {
    waits |= helper_visit(v[i]);
    if (v[i]->closed && !armed(v[i])) {
      pthread_mutex_lock(&queues_mu);
      for (cl_hostq **p = &queues; *p; p = &(*p)->next)
        if (*p == v[i]) { *p = v[i]->next; break; }
      pthread_mutex_unlock(&queues_mu);
      free_queue(v[i]);
    }
  }
  if (v != snap) free(v);
  return waits;
}

static int any_closed(void) {
  pthread_mutex_lock(&queues_mu);
  int c = 0;
  for (cl_hostq *q = queues; q && !c; q = q->next) c = q->closed;
  pthread_mutex_unlock(&queues_mu);
  return c;
}

/* looks every millisecond while firings are pending anywhere (every 50 us while a thread
   waits in a call), sleeps otherwise */
static void *helper_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&helper_mu);
  while (!helper_stop) {
    if (!__atomic_load_n(&cl_host_pending, __ATOMIC_SEQ_CST) && !any_closed()) {
      pthread_cond_wait(&helper_cv, &helper_mu);
      continue;
    }
    pthread_mutex_unlock(&helper_mu);
    long us = helper_round() ? 50 : 1000;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += us * 1000;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&helper_mu);
    if (!helper_stop) pthread_cond_timedwait(&helper_cv, &helper_mu, &ts);
  }
  pthread_mutex_unlock(&helper_mu);
  return NULL;
}

/* ---- releases put off: inside a host function or while a stream captures ---- */
static unsigned deferred_count;   /* in every state: the common case (none) is one load */

static __thread int releasing;   /* q_gc runs the state's last releases: none is put off again */

int cl_must_defer_now(lua_State *L) {
  (void)L;
  return !releasing && (cl_capturing || cl_in_hostfn);
}

static int paused_states;   /* states with a defer_cleanup scope open (atomic): a release asks its
                               state's queue only then */

int cl_must_defer(lua_State *L) {
  if (cl_must_defer_now(L)) return 1;
  if (!__atomic_load_n(&paused_states, __ATOMIC_RELAXED)) return 0;
  cl_hostq *q = L && !releasing ? queue_of(L) : NULL;
  return q && q->paused;
}

/* (d may be gone once d->fn ran: its flags are set before, never after) */
static void defer(lua_State *L, cl_deferred *d, int capturing_too, int urgent) {
  cl_hostq *q = L ? queue_of(L) : running_q;
  d->capturing_too = capturing_too;
  d->urgent = urgent;
  if (!q) { d->fn(L, d); return; }   /* the state is closing: now */
  d->next = q->later;
  q->later = d;
  __atomic_add_fetch(&deferred_count, 1, __ATOMIC_RELAXED);
}

void cl_defer(lua_State *L, cl_deferred *d) { defer(L, d, 0, 0); }

void cl_defer_urgent(lua_State *L, cl_deferred *d) { defer(L, d, 0, 1); }

/* puts d off to the state's next flush, unless the state is closing (its releases run now,
   and none is put off again): 0 then */
int cl_defer_if_open(lua_State *L, cl_deferred *d) {
  if (releasing || !L || !queue_of(L)) return 0;
  defer(L, d, 0, 0);
  return 1;
}

typedef struct { cl_deferred later; void (*fn)(lua_State *, void *, void *); void *a, *b; } call_later;

static void run_call(lua_State *L, cl_deferred *d) {
  call_later *c = CL_DEFERRED_OWNER(d, call_later, later);
  c->fn(L, c->a, c->b);
  free(c);
}

int cl_defer_call(lua_State *L, int ends_capture, void (*fn)(lua_State *, void *, void *), void *a, void *b) {
  call_later *c = malloc(sizeof *c);
  if (!c) return 0;
  c->later.fn = run_call; c->fn = fn; c->a = a; c->b = b;
  defer(L, &c->later, ends_capture, 0);
  return 1;
}

/* runs q's releases; while a stream captures, only those that end a capture (the capture
   they end is what holds the others) */
static void flush_queue(lua_State *L, cl_hostq *q) {
  for (cl_deferred **p = &q->later; *p;) {
    cl_deferred *d = *p;
    if ((cl_capturing && !d->capturing_too) || (q->paused && !d->urgent)) { p = &d->next; continue; }
    *p = d->next;
    __atomic_sub_fetch(&deferred_count, 1, __ATOMIC_RELAXED);
    d->fn(L, d);
    p = &q->later;   /* fn may have put off more */
  }
}

void cl_flush_deferred(lua_State *L) {
  if (!__atomic_load_n(&deferred_count, __ATOMIC_RELAXED) || cl_in_hostfn) return;
  cl_hostq *q = queue_of(L);
  if (q) flush_queue(L, q);
}

/* cuda.defer_cleanup: a scope opens (1) or closes (-1); the last to close runs what was put
   off. The scopes open, and the releases put off now */
int cl_cleanup_pause(lua_State *L, int delta, int *pending) {
  cl_hostq *q = queue_of(L);
  if (!q) return 0;
  if (delta > 0 && q->paused++ == 0) __atomic_add_fetch(&paused_states, 1, __ATOMIC_RELAXED);
  else if (delta < 0 && q->paused > 0 && --q->paused == 0) {
    __atomic_sub_fetch(&paused_states, 1, __ATOMIC_RELAXED);
    cl_flush_deferred(L);
  }
  /* counted only when asked (cuda.pending_cleanup: delta 0): a scope's opening and closing
     need not walk a list that grows with every release the outer scope put off */
  int n = 0;
  for (cl_deferred *d = delta == 0 ? q->later : NULL; d; d = d->next) n++;
  *pending = n;
  return q->paused;
}

/* ---- stream:launch_host_func and graph host nodes ---- */

static cl_hostq *need_queue(lua_State *L) {
  cl_hostq *q = queue_of(L);
  if (!q) cl_error(L, NULL, "this Lua state is closing");
  return q;
}

/* queues the host function at fidx on h: a record, its word's two operations, armed */
void cl_host_enqueue(lua_State *L, CUstream h, int fidx, const char *where) {
  cl_hostq *q = need_queue(L);
  CUstreamBatchMemOpParams op[2];
  cl_hostrec *r = rec_new(L, q, fidx, 1, where);
  cl_hostrec_ops(r, op);
  arm(q, r, 1);
  CUresult res = CU(cuStreamBatchMemOp, h, 2, op, 0);
  if (res != CUDA_SUCCESS) {
    release(L, q, r);   /* never queued: nothing will write the word */
    cl_check(L, res, where);
  }
}

/* graph host nodes: a record owned by a box userdata (pushed), which the graph keeps */
typedef struct { cl_hostrec *r; } hostbox;
#define HOSTBOX_MT "cudalua.hostrec"

static int box_gc(lua_State *L) {
  hostbox *b = lua_touserdata(L, 1);
  cl_hostrec *r = b->r;
  if (!r) return 0;
  b->r = NULL;
  pthread_mutex_lock(&r->q->mu);
  int idle = r->pending == 0;
  r->dropped = 1;
  pthread_mutex_unlock(&r->q->mu);
  if (idle) rec_free(L, r);   /* else when its last pending firing is done */
  return 0;
}

cl_hostrec *cl_hostrec_new(lua_State *L, int fidx, const char *where) {
  fidx = lua_absindex(L, fidx);
  cl_hostq *q = need_queue(L);
  hostbox *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->r = NULL;
  luaL_setmetatable(L, HOSTBOX_MT);
  b->r = rec_new(L, q, fidx, 0, where);
  return b->r;
}

cl_hostrec *cl_hostrec_of_box(lua_State *L, int idx) {
  hostbox *b = cl_checkudata(L, idx, HOSTBOX_MT);
  return b->r;
}

/* the record whose word is at address a (a memop node's parameters), else NULL */
cl_hostrec *cl_hostrec_at(CUdeviceptr a) {
  cl_hostrec *r = NULL;
  pthread_mutex_lock(&words_mu);
  for (int i = 0; i < npages && !r; i++)
    if (a >= pages[i]->dev && a < pages[i]->dev + 4 * WPAGE) r = pages[i]->owner[(a - pages[i]->dev) / 4];
  pthread_mutex_unlock(&words_mu);
  return r;
}

/* a new record (box pushed) with r's function: a second copy of a host node */
cl_hostrec *cl_hostrec_copy(lua_State *L, const cl_hostrec *r, const char *where) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->ref);
  cl_hostrec *c = cl_hostrec_new(L, -1, where);
  lua_remove(L, -2);
  return c;
}

/* a graph launch: its host nodes' records armed once each (as often as they appear), ordered
   after the state's last graph launch with host nodes on this device: executable graphs of
   one graph share words, so two of them must not run at once */
int cl_host_graph_begin(lua_State *L, cl_hostrec *const *recs, int n, CUcontext ctx, CUstream h,
                        const char *where) {
  cl_hostq *q = need_queue(L);
  /* a graph of a context that is not cudalua's (a foreign stream's capture) is not ordered:
     its events would be another context's */
  int d = cl_device_of(ctx);
  if (d >= 0 && q->order[d]) {
    CUresult r = CU(cuStreamWaitEvent, h, q->order[d], 0);
    cl_check(L, r, where);
  }
  for (int i = 0; i < n; i++) arm(q, recs[i], 1);
  return d;
}

/* after the launch (ok: it was queued); records the order event */
void cl_host_graph_end(lua_State *L, cl_hostrec *const *recs, int n, int d, CUstream h, int ok,
                       const char *where) {
  cl_hostq *q = need_queue(L);
  if (!ok) {   /* never queued */
    for (int i = 0; i < n; i++) release(L, q, recs[i]);
    return;
  }
  if (d < 0) return;
  if (!q->order[d]) {
    CU0(cuCtxGetCurrent, &q->order_ctx[d]);
    cl_check(L, CU(cuEventCreate, &q->order[d], CU_EVENT_DISABLE_TIMING), where);
  }
  cl_check(L, CU(cuEventRecord, q->order[d], h), where);
}

/* what every queue holds now, for tools that report a hang (tools/stress.c) */
void cl_host_dump(void *file) {
  FILE *f = file;
  pthread_mutex_lock(&queues_mu);
  fprintf(f, "host functions pending in the process: %u, helper %s\n", cl_host_pending, helper_on ? "on" : "off");
  for (cl_hostq *q = queues; q; q = q->next) {
    fprintf(f, "  queue %p: armed %d, closed %d, park %d (kind %d, seq %u)\n", (void *)q, q->armed,
            q->closed, q->park, q->park_kind, q->park_seq);
    int k = 0;
    for (cl_hostrec *r = q->head; r && k < 8; r = r->next, k++)
      fprintf(f, "    record %p: word %u, fire %u, release %u, pending %d%s\n", (void *)r, *word_host(r->word),
              r->fire, r->release, r->pending, r->oneshot ? ", one-shot" : "");
  }
  pthread_mutex_unlock(&queues_mu);
}

/* ---- the state's queue ---- */

/* frees a closed queue: on the helper thread too, so no driver call here (see q_gc) */
static void free_queue(cl_hostq *q) {
  for (cl_hostrec *r = q->head; r;) {   /* left over after a failed context */
    cl_hostrec *next = r->next;
    if (r->oneshot || r->dropped) rec_free(NULL, r);
    r = next;
  }
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  free(q);
}

static int q_gc(lua_State *L) {
  cl_hostq **pq = lua_touserdata(L, 1);
  cl_hostq *q = *pq;
  if (!q) return 0;
  *pq = NULL;   /* finalizers after this one find no queue: no host function runs any more */
  cl_deferred *d = q->later;   /* taken before the helper may free the queue */
  q->later = NULL;
  if (q->paused) __atomic_sub_fetch(&paused_states, 1, __ATOMIC_RELAXED), q->paused = 0;   /* (a scope left open) */
  /* the graph launches' order events go here, on the state's thread: the helper, which frees
     the queue once nothing is pending, must never call the driver. A driver call there waited
     for the lock of another thread's cuMemFreeHost, which waited for the device, which waited
     for a host function only the helper could run (a hang in spec 30's stress, seed 8572) */
  for (int i = 0; i < CL_MAXDEV; i++)
    if (q->order[i]) {
      CUcontext prev = cl_ctx_swap(q->order_ctx[i]);
      CU0(cuEventDestroy, q->order[i]);   /* one still pending is released once it completes */
      cl_ctx_swap(prev);
      q->order[i] = NULL;
    }
  /* closed: what fires from now on is released unrun by the helper, which frees the queue
     once nothing is pending; without a helper and with nothing pending it is freed here (the
     helper looks at queues only through the list, under queues_mu) */
  pthread_mutex_lock(&queues_mu);
  pthread_mutex_lock(&q->mu);
  q->closed = 1;
  pthread_mutex_unlock(&q->mu);
  int mine = !__atomic_load_n(&helper_on, __ATOMIC_SEQ_CST) && !armed(q);
  if (mine)
    for (cl_hostq **p = &queues; *p; p = &(*p)->next)
      if (*p == q) { *p = q->next; break; }
  pthread_mutex_unlock(&queues_mu);
  if (!mine) helper_kick();
  /* what is still put off goes now (no later wait of this state will), even while another
     state's stream captures; without the queue, releases asked for meanwhile run at once */
  releasing++;
  /* first those that end a capture of this state's: the others' frees may wait for the whole
     device, which waits for every capture to end (cl_ctx_claim_or_defer) */
  for (int pass = 0; pass < 2; pass++)
    for (cl_deferred **p = &d; *p;) {
      cl_deferred *e = *p;
      if (pass == 0 && !e->capturing_too) { p = &e->next; continue; }
      *p = e->next;
      __atomic_sub_fetch(&deferred_count, 1, __ATOMIC_RELAXED);
      e->fn(L, e);
    }
  releasing--;
  if (mine) free_queue(q);
  return 0;
}

/* the last state has closed and the devices are idle: the helper stops, closed queues and the
   words' pages are freed (before the contexts they were allocated in are released) */
void cl_hostfn_shutdown(void) {
  pthread_mutex_lock(&helper_mu);
  int on = helper_on;
  helper_stop = 1;
  pthread_cond_signal(&helper_cv);
  pthread_mutex_unlock(&helper_mu);
  if (on) pthread_join(helper, NULL);
  pthread_mutex_lock(&queues_mu);
  while (queues) {
    cl_hostq *q = queues;
    queues = q->next;
    free_queue(q);
  }
  pthread_mutex_unlock(&queues_mu);
  pthread_mutex_lock(&words_mu);
  for (int i = 0; i < npages; i++) {
    CUcontext prev = cl_ctx_swap(pages[i]->ctx);
    CU0(cuMemFreeHost, pages[i]->host);
    cl_ctx_swap(prev);
    free(pages[i]);
  }
  npages = 0;
  free(spare_words);
  spare_words = NULL;
  nspare_words = capspare_words = 0;
  pthread_mutex_unlock(&words_mu);
  pthread_mutex_lock(&helper_mu);
  helper_on = helper_stop = 0;
  pthread_mutex_unlock(&helper_mu);
}

/* the state's queue and the type of graph host nodes' boxes (once per state) */
void cl_open_hostfn(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &hostq_key) != LUA_TNIL) { lua_pop(L, 1); return; }
  lua_pop(L, 1);
  static const luaL_Reg box_meta[] = {{"__gc", box_gc}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){HOSTBOX_MT, NULL, NULL, box_meta, NULL});
  cl_hostq *q = calloc(1, sizeof *q);
  if (!q) cl_error(L, NULL, "out of host memory");
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  cl_hostq **pq = lua_newuserdatauv(L, sizeof *pq, 0);
  *pq = q;
  lua_newtable(L);
  lua_pushcfunction(L, q_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &hostq_key);
  pthread_mutex_lock(&queues_mu);
  q->next = queues;
  queues = q;
  pthread_mutex_unlock(&queues_mu);
}
