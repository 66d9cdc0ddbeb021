/* cpu_queue.c: the CPU device's work queue. Every stream's work runs in the order it was
   given on one worker thread, the device: stream order, event order and the legacy stream's
   waits all hold at once, and the host goes on while the device works, as with a GPU. Host
   functions run on the worker, as the driver runs them on a thread of its own. A launch that
   fails (an assert, a barrier not every thread reaches) makes the next wait return its error
   once; the device goes on with the work after it. Like a GPU's, the queue holds a bounded
   amount of work (QUEUE_DEPTH operations): a host that queues faster than the device works
   waits in the call that queues, rather than piling up work and the memory it holds. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "cpu_dev.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t more = PTHREAD_COND_INITIALIZER, progress = PTHREAD_COND_INITIALIZER;
static cpu_op *head, *tail;
static uint64_t given, done;
static int started;
static CUresult failed;
static CUresult lost;   /* a kernel's illegal address: every later wait and queuing fails with it */
static char failed_text[512];
static pthread_t worker;
#define QUEUE_DEPTH 1024

double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int quitting;

static void *work(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!head && !quitting) pthread_cond_wait(&more, &lock);
    if (!head) break;
    cpu_op *op = head;
    head = op->next;
    if (!head) tail = NULL;
    pthread_mutex_unlock(&lock);
    op->run(op);
    uint64_t seq = op->seq;
    free(op);
    pthread_mutex_lock(&lock);
    done = seq;
    pthread_cond_broadcast(&progress);
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* the last state closed: the worker does what is queued, then ends, joined (asleep in this
   library's code, it would outlive the library once Lua unloads it). The next queuing starts
   another. Not from the worker itself (a host function closing the last state): it is left
   to end with the process. 1: no worker is left. */
int cpu_queue_shutdown(void) {
  pthread_mutex_lock(&lock);
  if (started && pthread_equal(pthread_self(), worker)) { pthread_mutex_unlock(&lock); return 0; }
  if (!started) { pthread_mutex_unlock(&lock); return 1; }
  quitting = 1;
  pthread_cond_signal(&more);
  pthread_mutex_unlock(&lock);
  pthread_join(worker, NULL);
  pthread_mutex_lock(&lock);
  started = quitting = 0;
  pthread_mutex_unlock(&lock);
  return 1;
}

int (*cpu_capture_hook)(CUstream s, cpu_op *op, CUresult *r);

CUresult cpu_enqueue(CUstream s, cpu_op *op) {
  CUresult r;
  int (*hook)(CUstream, cpu_op *, CUresult *) = __atomic_load_n(&cpu_capture_hook, __ATOMIC_ACQUIRE);
  if (hook && hook(s, op, &r)) return r;   /* a capture's node now */
  pthread_mutex_lock(&lock);
  if (!started) {
    if (pthread_create(&worker, NULL, work, NULL)) { pthread_mutex_unlock(&lock); free(op); return CUDA_ERROR_OUT_OF_MEMORY; }
    started = 1;
  }
  /* full: wait for room (not on the worker itself, which would wait for itself) */
  while (given - done >= QUEUE_DEPTH && !pthread_equal(pthread_self(), worker)) pthread_cond_wait(&progress, &lock);
  op->seq = ++given;
  op->next = NULL;
  if ((uintptr_t)s > 2) ((cpu_stream *)s)->last = op->seq;   /* 0, 1, 2: the legacy and per-thread streams */
  if (tail) tail->next = op; else head = op;
  tail = op;
  pthread_cond_signal(&more);
  r = lost;
  pthread_mutex_unlock(&lock);
  return r;
}

CUresult cpu_wait_seq(uint64_t seq) {
  pthread_mutex_lock(&lock);
  while (done < seq) pthread_cond_wait(&progress, &lock);
  CUresult r = lost ? lost : failed;
  failed = CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  return r;
}

/* a kernel touched memory that is no one's: as a GPU's context, the device is lost for the
   process (every later wait, queuing and free says so; the work still queued runs) */
void cpu_lose(CUresult r, const char *fmt, ...) {
  pthread_mutex_lock(&lock);
  if (!lost) {
    lost = failed = r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failed_text, sizeof failed_text, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&lock);
}

CUresult cpu_lost(void) {
  pthread_mutex_lock(&lock);
  CUresult r = lost;
  pthread_mutex_unlock(&lock);
  return r;
}

/* until work up to seq is done, a launch's failure left for the next wait that reports: a free,
   an event's destruction or a module's unload is no place to hear of it (it was lost there) */
void cpu_drain(uint64_t seq) {
  pthread_mutex_lock(&lock);
  while (done < seq) pthread_cond_wait(&progress, &lock);
  pthread_mutex_unlock(&lock);
}

uint64_t cpu_enqueued(void) {
  pthread_mutex_lock(&lock);
  uint64_t g = given;
  pthread_mutex_unlock(&lock);
  return g;
}

int cpu_done(uint64_t seq) {
  pthread_mutex_lock(&lock);
  int d = done >= seq;
  pthread_mutex_unlock(&lock);
  return d;
}

void cpu_fail(CUresult r, const char *fmt, ...) {
  pthread_mutex_lock(&lock);
  if (failed == CUDA_SUCCESS) {
    failed = r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failed_text, sizeof failed_text, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&lock);
}

/* the text of the last failure (kept after the wait that returned it, for cuGetErrorString) */
const char *cpu_error_text(CUresult r) {
  (void)r;
  return failed_text[0] ? failed_text : NULL;
}
