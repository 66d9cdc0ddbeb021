/* cpu_exec.c: a kernel launch on the CPU device. The blocks are shared out among a pool of OS
   threads (the device's "multiprocessors"); the threads of a block run on the OS thread that
   took the block: one call after another when the kernel library's source never synchronises,
   else each as a fiber of its own, switched at barriers and warp operations. Fibers switch by
   saving the callee-saved registers and the stack pointer (x86-64), or with ucontext elsewhere.
   A barrier not every live thread of the block can reach, an assert, or __trap ends the block
   and fails the launch with the block's and thread's coordinates. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "cpu_dev.h"

#define STACK (64 * 1024)   /* a CUDA thread's stack, and a guard page under it */
enum { READY, BAR, WARP, DONE };

#if defined(__x86_64__)
/* cpu_switch(save, to): saves the callee-saved registers on this stack and its pointer in
   *save, then takes to's stack and returns into what was saved there */
void cpu_switch(void **save, void *to);
void cpu_fiber_start(void);
__asm__(".text\n.globl cpu_switch\n.hidden cpu_switch\n.type cpu_switch,@function\ncpu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
        ".size cpu_switch, .-cpu_switch\n"
        /* a new fiber's first return lands here: its function in rbx, its argument in r12 */
        ".globl cpu_fiber_start\n.hidden cpu_fiber_start\n.type cpu_fiber_start,@function\ncpu_fiber_start:\n"
        "  movq %r12, %rdi\n  callq *%rbx\n  ud2\n.size cpu_fiber_start, .-cpu_fiber_start\n");
#else
#include <ucontext.h>
#endif

typedef struct fib {
  void *sp;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  int state, pred;
  unsigned mask;        /* at a warp barrier: the lanes it waits for */
} fib;

/* one pool thread's state: the block it runs */
typedef struct worker {
  fib *fibs;
  char *stacks;         /* STACK bytes per thread, a guard page at the bottom of each */
  int nfibs;
  cl_cpu_thread *ctx;
  int nctx;
  unsigned char *dyn;
  size_t ndyn;
  void *main_sp;
#if !defined(__x86_64__)
  ucontext_t main_uc;
#endif
  int cur, T, failed, bar_result, fiber_mode;
  cpu_launch *l;
  jmp_buf jb;
} worker;

static __thread worker *me_w;

/* ---- the pool ---- */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
static int npool, running;
static unsigned long generation;
static cpu_launch *current;
static uint64_t next_block, nblocks_total;
static int stop;

int cpu_threads(void) {
  static int n;
  if (!n) {
    const char *e = getenv("CUDALUA_CPU_THREADS");
    long v = e ? strtol(e, NULL, 10) : 0;
    n = v > 0 && v <= 1024 ? (int)v : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
  }
  return n;
}

static void switch_to_main(worker *w, fib *f) {
#if defined(__x86_64__)
  cpu_switch(&f->sp, w->main_sp);
#else
  swapcontext(&f->uc, &w->main_uc);
#endif
}

static void switch_to_fiber(worker *w, fib *f) {
#if defined(__x86_64__)
  cpu_switch(&w->main_sp, f->sp);
#else
  swapcontext(&w->main_uc, &f->uc);
#endif
}

static void fiber_body(void *arg) {
  worker *w = me_w;
  int t = (int)(intptr_t)arg;
  cpu_launch *l = w->l;
  l->f->mod->run(l->f->e, &w->ctx[t], l->args);
  w->fibs[t].state = DONE;
  switch_to_main(w, &w->fibs[t]);
}

/* room for T threads' records, fibers and stacks, and the block's dynamic shared memory */
static int room(worker *w, int T, size_t shared) {
  if (T > w->nctx) {
    cl_cpu_thread *c = realloc(w->ctx, (size_t)T * sizeof *c);
    fib *f = realloc(w->fibs, (size_t)T * sizeof *f);
    if (c) w->ctx = c;
    if (f) w->fibs = f;
    if (!c || !f) return 0;
    w->nctx = T;
  }
  if (shared > w->ndyn) {
    unsigned char *d = realloc(w->dyn, shared);
    if (!d) return 0;
    w->dyn = d, w->ndyn = shared;
  }
  return 1;
}

static int stacks(worker *w, int T) {
  if (T <= w->nfibs) return 1;
  if (w->stacks) munmap(w->stacks, (size_t)w->nfibs * STACK);
  w->stacks = mmap(NULL, (size_t)T * STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (w->stacks == MAP_FAILED) { w->stacks = NULL; w->nfibs = 0; return 0; }
  long page = sysconf(_SC_PAGESIZE);
  for (int t = 0; t < T; t++) mprotect(w->stacks + (size_t)t * STACK, (size_t)page, PROT_NONE);
  w->nfibs = T;
  return 1;
}

static void fiber_init(worker *w, int t) {
  fib *f = &w->fibs[t];
  f->state = READY;
  char *top = w->stacks + (size_t)(t + 1) * STACK;
#if defined(__x86_64__)
  void **sp = (void **)(top - 8);   /* the return address sits where a call would leave it */
  sp[0] = (void *)cpu_fiber_start;
  sp[-1] = NULL;                    /* rbp */
  sp[-2] = (void *)fiber_body;      /* rbx: the function */
  sp[-3] = (void *)(intptr_t)t;     /* r12: its argument */
  sp[-4] = sp[-5] = sp[-6] = NULL;  /* r13, r14, r15 */
  f->sp = sp - 6;
#else
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = top - STACK + sysconf(_SC_PAGESIZE);
  f->uc.uc_stack.ss_size = STACK - sysconf(_SC_PAGESIZE);
  f->uc.uc_link = NULL;
  makecontext(&f->uc, (void (*)(void))fiber_body, 1, (void *)(intptr_t)t);
#endif
}

/* ---- barriers: called by the kernel library (cpu_rt) on a thread of the block ---- */
static void fail_here(worker *w, cl_cpu_thread *t, const char *what) {
  cpu_fail(CUDA_ERROR_LAUNCH_FAILED, "the CPU device: %s, in block (%u, %u, %u) thread (%u, %u, %u)", what,
           t->bid.x, t->bid.y, t->bid.z, t->tid.x, t->tid.y, t->tid.z);
  w->failed = 1;
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
}

/* a thread that cannot go on: back to the block's runner for good */
static void abandon(worker *w, cl_cpu_thread *t) {
  if (w->fiber_mode) switch_to_main(w, &w->fibs[t->rank]);
  longjmp(w->jb, 1);
}

static int rt_sync(cl_cpu_thread *t, int op, int pred) {
  worker *w = me_w;
  if (w->T == 1) return op == 1 ? pred : pred;   /* a block of one: nothing to wait for */
  if (!w->fiber_mode) {
    fail_here(w, t, "__syncthreads in a kernel whose source cudalua read as never synchronising");
    abandon(w, t);
  }
  fib *f = &w->fibs[t->rank];
  f->state = BAR, f->pred = pred;
  switch_to_main(w, f);
  return op == 0 ? 0 : op == 1 ? w->bar_result : op == 2 ? w->bar_result == w->T : w->bar_result > 0;
}

static void rt_warp_sync(cl_cpu_thread *t, unsigned mask) {
  worker *w = me_w;
  if (w->T == 1) return;
  if (!w->fiber_mode) {
    fail_here(w, t, "a warp operation in a kernel whose source cudalua read as never synchronising");
    abandon(w, t);
  }
  fib *f = &w->fibs[t->rank];
  f->state = WARP, f->mask = mask;
  switch_to_main(w, f);
}

static cl_cpu_thread *rt_lane(cl_cpu_thread *t, unsigned lane) {
  worker *w = me_w;
  unsigned r = t->warp * 32 + lane;
  return lane < 32 && (int)r < w->T ? &w->ctx[r] : NULL;
}

static unsigned rt_active(cl_cpu_thread *t) {
  worker *w = me_w;
  unsigned m = 0;
  for (unsigned l = 0; l < 32; l++) {
    int r = (int)(t->warp * 32 + l);
    if (r < w->T && (!w->fiber_mode || w->fibs[r].state != DONE)) m |= 1u << l;
  }
  return m;
}

static void rt_trap(cl_cpu_thread *t, const char *what, const char *file, int line) {
  worker *w = me_w;
  char buf[300];
  snprintf(buf, sizeof buf, "%s (%s:%d)", what, file, line);
  fail_here(w, t, buf);
  abandon(w, t);
}

const cl_cpu_rt cpu_rt = {CL_CPU_ABI, rt_sync, rt_warp_sync, rt_lane, rt_active, rt_trap};

/* ---- a block ---- */
/* the warps whose waiting lanes all have every live lane of their masks waiting: released */
static int release_warps(worker *w) {
  int released = 0;
  for (int base = 0; base < w->T; base += 32) {
    unsigned waiting = 0, alive = 0;
    for (int l = 0; l < 32 && base + l < w->T; l++) {
      int s = w->fibs[base + l].state;
      if (s != DONE) alive |= 1u << l;
      if (s == WARP) waiting |= 1u << l;
    }
    if (!waiting) continue;
    int ok = 1;
    for (int l = 0; l < 32 && ok; l++)
      if (waiting >> l & 1) ok = (w->fibs[base + l].mask & alive & ~waiting) == 0;
    if (!ok) continue;
    for (int l = 0; l < 32; l++) if (waiting >> l & 1) w->fibs[base + l].state = READY;
    released = 1;
  }
  return released;
}

/* every live thread at __syncthreads: all go on, with the predicates' count */
static int release_block(worker *w) {
  int live = 0, count = 0;
  for (int t = 0; t < w->T; t++) {
    if (w->fibs[t].state == DONE) continue;
    if (w->fibs[t].state != BAR) return 0;
    live++;
    count += w->fibs[t].pred;
  }
  if (!live) return 0;
  w->bar_result = count;
  for (int t = 0; t < w->T; t++) if (w->fibs[t].state == BAR) w->fibs[t].state = READY;
  return 1;
}

static void run_fibers(worker *w) {
  for (int t = 0; t < w->T; t++) fiber_init(w, t);
  for (;;) {
    int live = 0;
    for (int t = 0; t < w->T && !w->failed; t++) {
      if (w->fibs[t].state == READY) switch_to_fiber(w, &w->fibs[t]);
      if (w->fibs[t].state != DONE) live = 1;
    }
    if (w->failed || !live) return;
    if (release_warps(w) || release_block(w)) continue;
    int t = 0;
    while (w->fibs[t].state == DONE) t++;
    fail_here(w, &w->ctx[t], "a barrier or warp operation some live threads of the block can never reach");
    return;
  }
}

static void run_block(worker *w, cpu_launch *l, uint64_t b) {
  cl_cpu_dim g = l->grid, d = l->block;
  cl_cpu_dim bid = {(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / ((uint64_t)g.x * g.y))};
  int T = (int)(d.x * d.y * d.z);
  w->T = T, w->l = l, w->failed = 0;
  w->fiber_mode = l->f->mod->may_sync && T > 1;
  if (!room(w, T, l->shared) || (w->fiber_mode && !stacks(w, T))) {
    cpu_fail(CUDA_ERROR_OUT_OF_MEMORY, "the CPU device: no memory for a block of %d threads", T);
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int r = 0; r < T; r++) {
    cl_cpu_thread *c = &w->ctx[r];
    c->tid = (cl_cpu_dim){(unsigned)r % d.x, (unsigned)r / d.x % d.y, (unsigned)r / (d.x * d.y)};
    c->bid = bid, c->bdim = d, c->gdim = g;
    c->dyn_shared = w->dyn, c->rank = (unsigned)r, c->lane = (unsigned)r % 32, c->warp = (unsigned)r / 32;
    c->block = w;
  }
  if (w->fiber_mode) { run_fibers(w); return; }
  volatile int r = 0;
  if (setjmp(w->jb)) return;   /* a trap: the block ends there */
  for (; r < T; r++) l->f->mod->run(l->f->e, &w->ctx[r], l->args);
}

/* ---- the pool: every thread takes blocks until none are left ---- */
static void take_blocks(worker *w, cpu_launch *l) {
  for (;;) {
    if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) return;
    uint64_t b = __atomic_fetch_add(&next_block, 1, __ATOMIC_RELAXED);
    if (b >= nblocks_total) return;
    run_block(w, l, b);
  }
}

static void *pool_main(void *arg) {
  (void)arg;
  me_w = calloc(1, sizeof *me_w);
  unsigned long seen = 0;
  pthread_mutex_lock(&pool_lock);
  for (;;) {
    while (generation == seen) pthread_cond_wait(&go, &pool_lock);
    seen = generation;
    cpu_launch *l = current;
    pthread_mutex_unlock(&pool_lock);
    if (me_w) take_blocks(me_w, l);
    pthread_mutex_lock(&pool_lock);
    if (--running == 0) pthread_cond_signal(&finished);
  }
  return NULL;
}

void cpu_launch_run(cpu_launch *l) {
  if (!me_w) me_w = calloc(1, sizeof *me_w);
  uint64_t n = (uint64_t)l->grid.x * l->grid.y * l->grid.z;
  pthread_mutex_lock(&pool_lock);
  while (npool < cpu_threads() - 1 && n > 1) {   /* the queue's worker is one of the pool */
    pthread_t t;
    if (pthread_create(&t, NULL, pool_main, NULL)) break;
    pthread_detach(t);
    npool++;
  }
  current = l, next_block = 0, nblocks_total = n, stop = 0;
  int helpers = n > 1 ? npool : 0;
  if (helpers) { running = helpers; generation++; pthread_cond_broadcast(&go); }
  pthread_mutex_unlock(&pool_lock);
  if (me_w) take_blocks(me_w, l);
  pthread_mutex_lock(&pool_lock);
  while (helpers && running) pthread_cond_wait(&finished, &pool_lock);
  pthread_mutex_unlock(&pool_lock);
}
