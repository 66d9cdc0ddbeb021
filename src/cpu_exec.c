/* cpu_exec.c: a kernel launch on the CPU device. The blocks are shared out among a pool of OS
   threads (the device's "multiprocessors"); the threads of a block run on the OS thread that
   took the block: as one loop (the kernel library's block function, the kernel inlined into it)
   when the kernel can never reach a barrier or a warp operation, else each as a fiber of its
   own (or, where the library has a coroutine twin of the kernel, as a C++ coroutine of its
   own: a barrier's switch is then the library's call and return). Fibers switch by saving
   the callee-saved registers and the stack pointer (x86-64), or with ucontext elsewhere, straight from the one that waits to the next that can run: a
   barrier counts its arrivals and a warp its waiting lanes, so a switch costs the same
   whatever the block's size. A barrier not every live thread of the block can reach, an
   assert, or __trap ends the block and fails the launch with the block's and thread's
   coordinates. Under ASan and TSan (found in the process, not linked) the switches and the
   barriers are told to the sanitizer; CUDALUA_CPU_CHECK makes barriers and warp operations
   that part of the block or warp skips errors; CUDALUA_CPU_SCHEDULE=<seed> takes blocks,
   threads and fibers in an order drawn from the seed, to shake out races. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <ucontext.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "cpu_dev.h"

#define STACK (64 * 1024)   /* a CUDA thread's stack, and a guard page under it */

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
#endif

typedef struct fib {
  void *sp;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  unsigned mask;        /* at a warp barrier: the lanes it waits for */
  const void *lo;       /* its stack (the runner's: as ASan tells it at the first switch) */
  size_t size;
  void *tsan;           /* TSan's fiber */
} fib;

/* one pool thread's state: the block it runs */
typedef struct worker {
  /* first, as the kernel library reads it (abi.h): the threads at __syncthreads (bar, in
     order: b.nbar of them) and the live ones (b.live) */
  cl_cpu_block b;
  fib *fibs, main;
  char *stacks;         /* STACK bytes per thread, a guard page at the bottom of each */
  int nstacks;
  cl_cpu_thread *ctx;
  int nctx;
  int *ready;           /* the threads that can run (a ring) */
  unsigned rhead, rcount;
  unsigned *order;      /* a no-sync block's thread order, under a seeded schedule */
  int bar_count, bar_result, bar_arrived;   /* arrived: those the last release let go */
  unsigned walive[32], wwait[32], wneed[32];   /* per warp: live lanes, lanes waiting, their masks */
  unsigned char *dyn;
  size_t ndyn;
  int T, failed, fiber_mode;
  int co;               /* the block's threads are coroutines (fiber_mode is set too) */
  int co_ops;           /* a coroutine at the barrier wants its count, and, or (op 1-3) */
  unsigned long rec_seq;   /* the launch whose thread records ctx holds, for rec_n threads */
  int rec_n;
  char *frames;         /* their frames, fsize bytes each, kept for the next blocks */
  size_t nframes, fsize;
  uint64_t rng;         /* the block's, under CUDALUA_CPU_SCHEDULE */
  fib *from;            /* the fiber that switched to the one now running */
  int cur;              /* the thread running (-1: the runner) */
  cpu_launch *l;
  sigjmp_buf jb;
  /* CUDALUA_CPU_CHECK: a fault in the block's code ends the block (cpu_exec's SIGSEGV handler) */
  volatile sig_atomic_t armed;
  void *fault_addr;
  uintptr_t fault_pc;
  void *altstack;
  stack_t old_alt;      /* the thread's alternate signal stack before ours (a sanitizer's) */
  char *os_stack;       /* the lowest byte of this OS thread's stack (coroutines run on it) */
} worker;

static __thread worker *me_w;

/* ---- settings, read once ---- */
static int check_on;                 /* CUDALUA_CPU_CHECK */
static size_t page_size;
static int sched_on;                 /* CUDALUA_CPU_SCHEDULE given */
static int co_off;                   /* CUDALUA_CPU_COROUTINES=0, or ThreadSanitizer (it sees fibers only) */
static uint64_t sched_seed;
/* the sanitizers' fiber calls, when a sanitizer runtime is in the process */
static struct {
  void (*start)(void **fake, const void *lo, size_t size);
  void (*finish)(void *fake, const void **lo, size_t *size);
  void (*unpoison)(const void *p, size_t n);
  void *(*tsan_current)(void);
  void *(*tsan_create)(unsigned flags);
  void (*tsan_destroy)(void *f);
  void (*tsan_switch)(void *f, unsigned flags);
  void (*tsan_acquire)(void *addr);
  void (*tsan_release)(void *addr);
} san;
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

static void read_settings(void) {
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  const char *s = getenv("CUDALUA_CPU_SCHEDULE");
  check_on = cpu_check_on();
  if (s && *s) sched_on = 1, sched_seed = strtoull(s, NULL, 0);
  const char *co = getenv("CUDALUA_CPU_COROUTINES");
  co_off = co && strcmp(co, "0") == 0;
  *(void **)&san.start = dlsym(RTLD_DEFAULT, "__sanitizer_start_switch_fiber");
  *(void **)&san.finish = dlsym(RTLD_DEFAULT, "__sanitizer_finish_switch_fiber");
  *(void **)&san.unpoison = dlsym(RTLD_DEFAULT, "__asan_unpoison_memory_region");
  if (!san.start || !san.finish) san.start = NULL, san.finish = NULL;
  *(void **)&san.tsan_current = dlsym(RTLD_DEFAULT, "__tsan_get_current_fiber");
  *(void **)&san.tsan_create = dlsym(RTLD_DEFAULT, "__tsan_create_fiber");
  *(void **)&san.tsan_destroy = dlsym(RTLD_DEFAULT, "__tsan_destroy_fiber");
  *(void **)&san.tsan_switch = dlsym(RTLD_DEFAULT, "__tsan_switch_to_fiber");
  *(void **)&san.tsan_acquire = dlsym(RTLD_DEFAULT, "__tsan_acquire");
  *(void **)&san.tsan_release = dlsym(RTLD_DEFAULT, "__tsan_release");
  if (!san.tsan_current || !san.tsan_create || !san.tsan_destroy || !san.tsan_switch || !san.tsan_acquire || !san.tsan_release)
    san.tsan_switch = NULL;
  if (san.tsan_switch) co_off = 1;   /* (a block's coroutines are one thread to TSan: no races seen) */
  /* the failed look-ups left a message this thread would keep (LSan: a leak): read, then freed */
  dlerror();
  dlerror();
}

/* happens-before for TSan: what a fiber did before release(x) is seen by one after acquire(x)
   (fibers switch without telling TSan they synchronise: a race between two threads of a
   block is a race) */
static void hb_release(void *x) { if (san.tsan_switch) san.tsan_release(x); }
static void hb_acquire(void *x) { if (san.tsan_switch) san.tsan_acquire(x); }

/* splitmix64: the seeded schedule's numbers */
static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* ---- the pool ---- */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, finished = PTHREAD_COND_INITIALIZER;
#define MAX_POOL 1024
static int npool, running, quitting;
static pthread_t pool_ids[MAX_POOL];
static unsigned long generation;
static cpu_launch *current;
static uint64_t next_block, nblocks_total, perm_a, perm_c;   /* perm: the seeded block order */
static int stop;
static unsigned long launch_seq;   /* one more for each launch (pool_lock) */

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

/* ---- fibers ---- */
/* after a switch, on the fiber that it reached: ASan learns where the one that left was */
static void landed(worker *w, void *fake) {
  if (san.finish) san.finish(fake, &w->from->lo, &w->from->size);
}

/* from the running fiber to another; exiting: from never runs again */
static void fib_switch(worker *w, fib *from, fib *to, int exiting) {
  if (from == to) return;
  void *fake = NULL;
  w->from = from, w->cur = to == &w->main ? -1 : (int)(to - w->fibs);
  if (san.start) san.start(exiting ? NULL : &fake, to->lo, to->size);
  if (san.tsan_switch) san.tsan_switch(to->tsan, 1 /* __tsan_switch_to_fiber_no_sync */);
#if defined(__x86_64__)
  cpu_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
  landed(w, fake);
}

/* the ready fibers: a ring (each fiber is in it once at most, a block has 1024 at most); under
   a seeded schedule the next is drawn from among them */
static void push_ready(worker *w, int t) {
  w->ready[(w->rhead + w->rcount++) & 1023] = t;
}

/* (inlined: every switch takes it) */
static inline __attribute__((always_inline)) int pop_ready(worker *w) {
  if (!w->rcount) return -1;
  if (__builtin_expect(sched_on, 0) && w->rcount > 1) {
    unsigned k = (w->rhead + (unsigned)(mix(&w->rng) % w->rcount)) & 1023;
    int x = w->ready[k];
    w->ready[k] = w->ready[w->rhead], w->ready[w->rhead] = x;
  }
  int t = w->ready[w->rhead];
  w->rhead = (w->rhead + 1) & 1023, w->rcount--;
  return t;
}

/* the running fiber f cannot go on: the next ready one runs (none: back to the block's runner,
   which finds the block finished or stuck) */
static void wait_here(worker *w, fib *f) {
  int n = pop_ready(w);
  fib_switch(w, f, n < 0 ? &w->main : &w->fibs[n], 0);
}

static void thread_done(worker *w, int t);

/* a fiber's start: arg is its thread's record (the worker and the rank in it) */
static void fiber_body(void *arg) {
  cl_cpu_thread *c = arg;
  worker *w = c->block;
  landed(w, NULL);
  hb_acquire(w);
  cpu_launch *l = w->l;
  l->f->mod->run(l->f->e, c, l->args);
  thread_done(w, (int)c->rank);
}

/* room for T threads' records, and the block's dynamic shared memory */
static int room(worker *w, int T, size_t shared) {
  if (!w->ready) {
    w->ready = malloc(1024 * sizeof *w->ready), w->b.bar = malloc(1024 * sizeof *w->b.bar);
    if (!w->ready || !w->b.bar) return 0;
  }
  if (T > w->nctx) {
    cl_cpu_thread *c = realloc(w->ctx, (size_t)T * sizeof *c);
    fib *f = realloc(w->fibs, (size_t)T * sizeof *f);
    unsigned *o = realloc(w->order, (size_t)T * sizeof *o);
    if (c) w->ctx = c;
    if (f) w->fibs = f;
    if (o) w->order = o;
    if (!c || !f || !o) return 0;
    w->nctx = T;
  }
  if (shared > w->ndyn) {
    unsigned char *d = realloc(w->dyn, shared);
    if (!d) return 0;
    w->dyn = d, w->ndyn = shared;
  }
  return 1;
}

/* T stacks, each with a guard page under it, and TSan's fibers for them; kept for the next
   blocks */
static int stacks(worker *w, int T) {
  if (T <= w->nstacks) return 1;
  if (w->stacks) munmap(w->stacks, (size_t)w->nstacks * STACK);
  for (int t = 0; san.tsan_switch && t < w->nstacks; t++) san.tsan_destroy(w->fibs[t].tsan);
  w->stacks = mmap(NULL, (size_t)T * STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (w->stacks == MAP_FAILED) { w->stacks = NULL; w->nstacks = 0; return 0; }
  long page = sysconf(_SC_PAGESIZE);
  for (int t = 0; t < T; t++) {
    mprotect(w->stacks + (size_t)t * STACK, (size_t)page, PROT_NONE);
    w->fibs[t].lo = w->stacks + (size_t)t * STACK + page, w->fibs[t].size = STACK - (size_t)page;
    w->fibs[t].tsan = san.tsan_switch ? san.tsan_create(0) : NULL;
  }
  w->nstacks = T;
  return 1;
}

/* is p on a fiber's guard page, or (a block of coroutines) just under this OS thread's stack:
   a stack overflow */
int cpu_on_guard(const void *p) {
  worker *w = me_w;
  if (w && w->co && w->os_stack && (const char *)p < w->os_stack && (const char *)p >= w->os_stack - 65536) return 1;
  if (!w || !w->stacks || (const char *)p < w->stacks || (const char *)p >= w->stacks + (size_t)w->nstacks * STACK) return 0;
  return (size_t)((const char *)p - w->stacks) % STACK < page_size;
}

static void fiber_init(worker *w, int t) {
  fib *f = &w->fibs[t];
  /* the stacks' tops are 64 KB apart: each starts a few lines lower than the last, so that
     the fibers' frames do not all fall in the same cache sets */
  char *top = w->stacks + (size_t)(t + 1) * STACK - (size_t)(t % 64) * 64;
#if defined(__x86_64__)
  void **sp = (void **)(top - 8);   /* the return address sits where a call would leave it */
  sp[0] = (void *)cpu_fiber_start;
  sp[-1] = NULL;                    /* rbp */
  sp[-2] = (void *)fiber_body;      /* rbx: the function */
  sp[-3] = &w->ctx[t];              /* r12: its argument */
  sp[-4] = sp[-5] = sp[-6] = NULL;  /* r13, r14, r15 */
  f->sp = sp - 6;
#else
  (void)top;
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = (void *)f->lo;
  f->uc.uc_stack.ss_size = f->size;
  f->uc.uc_link = NULL;
  makecontext(&f->uc, (void (*)(void))fiber_body, 1, (void *)&w->ctx[t]);
#endif
}

/* ---- failures ---- */
static void fail_here(worker *w, cl_cpu_thread *t, const char *what) {
  cpu_fail(CUDA_ERROR_LAUNCH_FAILED, "the CPU device: %s, in block (%u, %u, %u) thread (%u, %u, %u)", what,
           t->bid.x, t->bid.y, t->bid.z, t->tid.x, t->tid.y, t->tid.z);
  w->failed = 1;
  __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
}

/* a thread that cannot go on: back to the block's runner for good */
static _Noreturn void abandon(worker *w, cl_cpu_thread *t) {
  if (w->fiber_mode && !w->co) fib_switch(w, &w->fibs[t->rank], &w->main, 1);
  siglongjmp(w->jb, 1);   /* (a coroutine's resume is a call on the runner's stack: jumped over) */
}

static void rt_trap(cl_cpu_thread *t, const char *what, const char *file, int line) {
  worker *w = t->block;
  char buf[300];
  snprintf(buf, sizeof buf, "%s (%s:%d)", what, file, line);
  fail_here(w, t, buf);
  abandon(w, t);
}

/* ---- the checks (CUDALUA_CPU_CHECK): a barrier or warp operation part of the block or of
   the mask skips ---- */
#define WHERE(t) ((t)->file ? (t)->file : "?"), (t)->line
#define TID(t) (t)->tid.x, (t)->tid.y, (t)->tid.z

static void check_fail(worker *w, cl_cpu_thread *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check_fail(worker *w, cl_cpu_thread *t, const char *fmt, ...) {
  char buf[400] = "CUDALUA_CPU_CHECK: ";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + strlen(buf), sizeof buf - strlen(buf), fmt, ap);
  va_end(ap);
  fail_here(w, t, buf);
}

/* a thread's state, from the block's counts (none is kept per thread: a switch writes less):
   done, its lane no longer live; at a warp operation, its lane waiting */
static int is_done(const worker *w, int r) { return !(w->walive[r / 32] >> (r & 31) & 1); }
static int at_warp(const worker *w, int r) { return w->wwait[r / 32] >> (r & 31) & 1; }

static int first_done(worker *w) {
  int d = 0;
  while (d < w->T && !is_done(w, d)) d++;
  return d;
}

/* t at __syncthreads: every thread of the block must come, to this one */
static int check_bar(worker *w, cl_cpu_thread *t) {
  if (w->b.live < w->T) {
    cl_cpu_thread *d = &w->ctx[first_done(w)];
    check_fail(w, t, "__syncthreads (%s:%d) not reached by every thread of the block (thread (%u, %u, %u) has exited)",
               WHERE(t), TID(d));
    return 0;
  }
  cl_cpu_thread *o = w->b.nbar ? &w->ctx[w->b.bar[0]] : NULL;
  if (o && (o->line != t->line || strcmp(o->file ? o->file : "", t->file ? t->file : "") != 0)) {
    check_fail(w, t, "threads of the block wait at different __syncthreads (%s:%d, and %s:%d for thread (%u, %u, %u))",
               WHERE(t), WHERE(o), TID(o));
    return 0;
  }
  return 1;
}

/* t at a warp operation: its own lane in the mask, and no lane of it exited */
static int check_warp(worker *w, cl_cpu_thread *t, unsigned mask) {
  if (!(mask >> t->lane & 1)) {
    check_fail(w, t, "a warp operation (%s:%d) whose mask 0x%08x leaves out the calling lane %u", WHERE(t), mask, t->lane);
    return 0;
  }
  unsigned dead = mask & ~w->walive[t->warp];
  int n = w->T - (int)t->warp * 32;
  if (n < 32) dead &= (1u << n) - 1;   /* (lanes past the block's end are not asked for) */
  if (dead) {
    check_fail(w, t, "a warp operation (%s:%d) whose mask 0x%08x names lane %d, which has exited", WHERE(t), mask,
               __builtin_ctz(dead));
    return 0;
  }
  return 1;
}

/* thread r has exited: none may be waiting for it */
static void check_exit(worker *w, int r) {
  cl_cpu_thread *t = &w->ctx[r];
  if (w->b.nbar) {
    cl_cpu_thread *o = &w->ctx[w->b.bar[0]];
    check_fail(w, o, "__syncthreads (%s:%d) not reached by every thread of the block (thread (%u, %u, %u) has exited)",
               WHERE(o), TID(t));
    return;
  }
  unsigned wi = t->warp, waiting = w->wwait[wi];
  for (unsigned l = 0; l < 32; l++) {
    fib *f = &w->fibs[wi * 32 + l];
    if (waiting >> l & 1 && f->mask >> t->lane & 1) {
      cl_cpu_thread *o = &w->ctx[wi * 32 + l];
      check_fail(w, o, "a warp operation (%s:%d) whose mask 0x%08x names lane %u, which has exited", WHERE(o), f->mask, t->lane);
      return;
    }
  }
}

/* no fiber can run and some have not finished: say which barrier cannot be reached */
static void stuck(worker *w) {
  int t = 0;
  while (is_done(w, t)) t++;
  cl_cpu_thread *c = &w->ctx[t];
  if (!check_on) {
    fail_here(w, c, "a barrier or warp operation some live threads of the block can never reach");
    return;
  }
  for (int r = t; r < w->T; r++) {
    fib *f = &w->fibs[r];
    unsigned wi = (unsigned)r / 32, missing = f->mask & w->walive[wi] & ~w->wwait[wi];
    if (!at_warp(w, r) || !missing) continue;
    cl_cpu_thread *o = &w->ctx[wi * 32 + (unsigned)__builtin_ctz(missing)];
    check_fail(w, &w->ctx[r], "a warp operation (%s:%d) whose mask 0x%08x names lane %u, which never reaches it (it waits at %s:%d)",
               WHERE(&w->ctx[r]), f->mask, o->lane, WHERE(o));
    return;
  }
  int other = t;
  while (other < w->T && !at_warp(w, other)) other++;
  cl_cpu_thread *o = &w->ctx[other < w->T ? other : t];
  check_fail(w, c, "__syncthreads (%s:%d) that thread (%u, %u, %u) never reaches (it waits at a warp operation, %s:%d)",
             WHERE(c), TID(o), WHERE(o));
}

/* ---- barriers: called by the kernel library (cpu_rt) on a thread of the block ---- */
/* everyone at __syncthreads goes on (but self, which is running) */
static void release_block(worker *w, int self) {
  w->bar_result = w->bar_count, w->bar_count = 0, w->bar_arrived = w->b.nbar;
  for (int i = 0; w->co_ops && i < w->b.nbar; i++) {   /* (a coroutine reads its result from its record) */
    cl_cpu_thread *t = &w->ctx[w->b.bar[i]];
    int op = t->warg, r = w->bar_result;
    unsigned long long v = (unsigned long long)(op == 0 ? 0 : op == 1 ? r : op == 2 ? r == w->bar_arrived : r > 0);
    memcpy(t->resp, &v, sizeof v);
  }
  w->co_ops = 0;
  if (w->co && !w->rcount) {
    /* (coroutines: the list of arrivals is the ready ring at once) */
    int *r = w->ready;
    w->ready = w->b.bar, w->b.bar = r;
    w->rhead = 0, w->rcount = (unsigned)w->b.nbar;
  } else {
    for (int i = 0; i < w->b.nbar; i++) if (w->b.bar[i] != self) push_ready(w, w->b.bar[i]);
  }
  w->b.nbar = 0;
}

static void warp_results(worker *w, unsigned wi);
static void release_warp(worker *w, unsigned wi, int self) {
  if (w->co) warp_results(w, wi);
  for (unsigned m = w->wwait[wi]; m; m &= m - 1) {
    int r = (int)(wi * 32 + (unsigned)__builtin_ctz(m));
    if (r != self) push_ready(w, r);
  }
  w->wwait[wi] = w->wneed[wi] = 0;
}

/* the running fiber self released a barrier: it goes on (under a seeded schedule, whichever
   ready fiber the draw picks) */
static void go_on(worker *w, int self) {
  if (sched_on) { push_ready(w, self); wait_here(w, &w->fibs[self]); }
}

/* a barrier or warp operation called as a plain function in a block of coroutines: one in a
   function the kernel calls, which cudalua's reading of the source should have seen */
static void not_co(worker *w, cl_cpu_thread *t) {
  if (!w->co) return;
  fail_here(w, t, "a barrier or warp operation outside the kernel's own body, in a kernel cudalua runs as "
            "coroutines (its reading of the source missed it; CUDALUA_CPU_COROUTINES=0 runs it as fibers)");
  abandon(w, t);
}

static int rt_sync(cl_cpu_thread *t, int op, int pred) {
  worker *w = t->block;
  if (w->T == 1) return pred;   /* a block of one: nothing to wait for */
  not_co(w, t);
  if (!w->fiber_mode) {
    fail_here(w, t, "__syncthreads in a kernel whose source cudalua read as never synchronising");
    abandon(w, t);
  }
  int self = (int)t->rank;
  fib *f = &w->fibs[self];
  hb_release(w->b.bar);
  if (check_on && !check_bar(w, t)) abandon(w, t);
  w->b.bar[w->b.nbar++] = self;
  w->bar_count += pred;
  if (w->b.nbar == w->b.live) { release_block(w, self); go_on(w, self); }
  else wait_here(w, f);
  hb_acquire(w->b.bar);
  int r = w->bar_result;
  /* (and: over the threads that arrived: exited ones count for nothing, as on a GPU) */
  return op == 0 ? 0 : op == 1 ? r : op == 2 ? r == w->bar_arrived : r > 0;
}

static void rt_warp_sync(cl_cpu_thread *t, unsigned mask) {
  worker *w = t->block;
  if (w->T == 1) return;
  not_co(w, t);
  if (!w->fiber_mode) {
    fail_here(w, t, "a warp operation in a kernel whose source cudalua read as never synchronising");
    abandon(w, t);
  }
  int self = (int)t->rank;
  unsigned wi = t->warp;
  fib *f = &w->fibs[self];
  hb_release(&w->wwait[wi]);
  if (check_on && !check_warp(w, t, mask)) abandon(w, t);
  f->mask = mask;
  w->wwait[wi] |= 1u << t->lane, w->wneed[wi] |= mask;
  if (!(w->wneed[wi] & w->walive[wi] & ~w->wwait[wi])) { release_warp(w, wi, self); go_on(w, self); }
  else wait_here(w, f);
  hb_acquire(&w->wwait[wi]);
}

static cl_cpu_thread *rt_lane(cl_cpu_thread *t, unsigned lane) {
  worker *w = t->block;
  unsigned r = t->warp * 32 + lane;
  return lane < 32 && (int)r < w->T ? &w->ctx[r] : NULL;
}

static unsigned rt_active(cl_cpu_thread *t) {
  worker *w = t->block;
  if (w->fiber_mode) return w->walive[t->warp];
  int n = w->T - (int)(t->rank & ~31u);   /* (a loop steps the rank only: its warp's first) */
  return n >= 32 ? ~0u : (1u << n) - 1;
}


/* thread t has returned: what waited for it may go on */
static void thread_exit(worker *w, int t) {
  unsigned wi = (unsigned)t / 32;
  w->b.live--;
  w->walive[wi] &= ~(1u << (t & 31));
  hb_release(w);
  if (check_on) check_exit(w, t);
  if (!w->failed) {
    if (w->b.nbar && w->b.nbar == w->b.live) release_block(w, -1);
    if (w->wwait[wi] && !(w->wneed[wi] & w->walive[wi] & ~w->wwait[wi])) release_warp(w, wi, -1);
  }
}

/* a fiber's thread has returned: the next fiber runs */
static void thread_done(worker *w, int t) {
  thread_exit(w, t);
  int n = w->failed ? -1 : pop_ready(w);
  fib_switch(w, &w->fibs[t], n < 0 ? &w->main : &w->fibs[n], 1);
}

/* ---- coroutines: the same counts as the fibers'. A thread's barrier, warp operation or
   end only counts, and its coroutine returns to the block's runner, which resumes the ready
   threads one after another (run_coros): a loop of resumes carries no chain of dependent
   loads from one thread to the next, as threads that handed over to each other did (the
   next one's record and frame found through the block's ring: 2.5 times slower a switch) ---- */

/* the block's frames, all of one size (one coroutine function), made in rank order: the
   first makes room for every one */
static void *co_frame(cl_cpu_thread *t, unsigned long n) {
  worker *w = t->block;
  size_t size = ((size_t)n + 63) & ~(size_t)63;
  if (t->rank == 0) {
    if (size * (size_t)w->T > w->nframes) {
      free(w->frames);
      w->frames = aligned_alloc(64, size * (size_t)w->T);
      w->nframes = w->frames ? size * (size_t)w->T : 0;
    }
    w->fsize = size;
  }
  if (!w->frames || size > w->fsize) return NULL;
  return w->frames + (size_t)t->rank * w->fsize;
}

static void co_sync(cl_cpu_thread *t, int op, int pred) {
  worker *w = t->block;
  if (check_on && !check_bar(w, t)) abandon(w, t);
  if (op) t->warg = op, w->co_ops |= op;   /* (a plain barrier's result is never read) */
  w->b.bar[w->b.nbar++] = (int)t->rank;
  w->bar_count += pred;
  if (w->b.nbar == w->b.live) release_block(w, -1);
}

static void co_warp(cl_cpu_thread *t, unsigned mask) {
  worker *w = t->block;
  unsigned wi = t->warp;
  if (check_on && !check_warp(w, t, mask)) abandon(w, t);
  w->fibs[t->rank].mask = mask;
  w->wwait[wi] |= 1u << t->lane, w->wneed[wi] |= mask;
  if (!(w->wneed[wi] & w->walive[wi] & ~w->wwait[wi])) release_warp(w, wi, -1);
}

static void co_done(cl_cpu_thread *t) { thread_exit(t->block, (int)t->rank); }

/* the lane whose value lane l reads in a shuffle of t's (l itself when none is) */
static int shfl_from(const cl_cpu_thread *t, int l) {
  int wd = t->wwidth, a = t->warg, s;
  switch (t->wop) {
  case CL_CPU_WIDX: return (l & ~(wd - 1)) + (a & (wd - 1));
  case CL_CPU_WUP: s = (l & (wd - 1)) - a; return s < 0 ? l : l - a;
  case CL_CPU_WDOWN: s = (l & (wd - 1)) + a; return s >= wd ? l : l + a;
  default: s = l ^ a; return s <= (l | (wd - 1)) ? s : l;   /* (xor: a partner past my segment's end gives mine) */
  }
}

/* the warp meets: every waiting lane's result, from the values all of them left (as the
   fibers' two meetings give: a lane that exited votes nothing) */
static void warp_results(worker *w, unsigned wi) {
  for (unsigned m = w->wwait[wi]; m; m &= m - 1) {
    int l = __builtin_ctz(m), r = (int)wi * 32 + l;
    cl_cpu_thread *t = &w->ctx[r];
    unsigned live = w->fibs[r].mask & w->walive[wi], votes = 0;
    if (t->wop == CL_CPU_WSYNC) continue;
    if (t->wop <= CL_CPU_WXOR) {
      int from = shfl_from(t, l);
      const cl_cpu_thread *o = from >= 0 && from < 32 && (int)wi * 32 + from < w->T ? &w->ctx[(int)wi * 32 + from] : t;
      memcpy(t->resp, o->slot, sizeof o->slot);   /* (resp has room for a slot: a copy of fixed size) */
      continue;
    }
    for (unsigned k = live; k; k &= k - 1)
      if (w->ctx[(int)wi * 32 + __builtin_ctz(k)].slot[0]) votes |= 1u << __builtin_ctz(k);
    unsigned long long v = t->wop == CL_CPU_WBALLOT ? votes : t->wop == CL_CPU_WANY ? votes != 0 : votes == live;
    memcpy(t->resp, &v, sizeof v);
  }
}

const cl_cpu_rt cpu_rt = {CL_CPU_ABI, rt_sync, rt_warp_sync, rt_lane, rt_active, rt_trap,
                         co_frame, co_sync, co_warp, co_done};

/* ---- faults: a kernel's access to memory that is no one's ends the block, and the device is
   lost as a GPU's context is (CUDA_ERROR_ILLEGAL_ADDRESS), the process going on. Under
   CUDALUA_CPU_CHECK an access past an allocation's end (cpu_mem.c puts a guard page there) or
   a fiber's stack overflow is a launch failure named afterwards, outside the handler, with the
   source line ---- */
static struct sigaction prev_segv;
static pthread_mutex_t segv_lock = PTHREAD_MUTEX_INITIALIZER;
static int segv_on;   /* on_segv installed (segv_lock; read without it by fault_arm) */

/* a fault that is not a kernel's: to the handler there was before */
static void chain(int sig, siginfo_t *si, void *uc) {
  if (prev_segv.sa_flags & SA_SIGINFO) { if (prev_segv.sa_sigaction) prev_segv.sa_sigaction(sig, si, uc); return; }
  if (prev_segv.sa_handler == SIG_DFL || prev_segv.sa_handler == SIG_IGN) { signal(sig, SIG_DFL); return; }   /* (it faults again) */
  prev_segv.sa_handler(sig);
}

static uintptr_t fault_pc(void *uc) {
#if defined(__x86_64__)
  return (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  return (uintptr_t)((ucontext_t *)uc)->uc_mcontext.pc;
#else
  (void)uc;
  return 0;
#endif
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
  worker *w = me_w;
  uintptr_t pc = fault_pc(uc);
  if (w && w->armed) {   /* the kernel's, or a library function it called (memcpy, printf) */
    w->armed = 0, w->fault_addr = si->si_addr, w->fault_pc = pc;
    siglongjmp(w->jb, 2);
  }
  chain(sig, si, uc);
}

static void install_segv(void) {
  pthread_mutex_lock(&segv_lock);
  if (segv_on) { pthread_mutex_unlock(&segv_lock); return; }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &prev_segv);
  __atomic_store_n(&segv_on, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&segv_lock);
}

/* this pool thread takes faults: the handler, and a stack of its own for it (a fiber's
   overflow leaves no stack to run it on) */
static void fault_arm(worker *w) {
  if (!__atomic_load_n(&segv_on, __ATOMIC_ACQUIRE)) install_segv();
  if (w->altstack) return;
  pthread_attr_t a;
  void *lo = NULL;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &a) == 0) {
    if (pthread_attr_getstack(&a, &lo, &size) == 0) w->os_stack = lo;
    pthread_attr_destroy(&a);
  }
  stack_t st = {.ss_size = 64 * 1024};
  st.ss_sp = w->altstack = malloc(st.ss_size);
  if (st.ss_sp && sigaltstack(&st, &w->old_alt) != 0) { free(w->altstack); w->altstack = NULL; }
}

/* the kernel's source line of pc (the library is built with -g under the check): addr2line on
   the library's file */
static void source_line(cpu_launch *l, uintptr_t pc, char *out, size_t n) {
  Dl_info info, kern;
  char cmd[160], line[512] = "";
  snprintf(out, n, "no source line known");
  /* (a pc in another library, a libc function the kernel called: no line of the kernel's) */
  if (!dladdr((void *)pc, &info) || !dladdr(l->f->e->fn, &kern) || info.dli_fbase != kern.dli_fbase) return;
  snprintf(cmd, sizeof cmd, "addr2line -e /proc/%d/fd/%d 0x%lx 2>/dev/null", (int)getpid(), l->f->mod->fd,
           (unsigned long)(pc - (uintptr_t)info.dli_fbase));
  FILE *p = popen(cmd, "r");
  if (!p) return;
  if (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = 0;
    char *d = strstr(line, " (discriminator");
    if (d) *d = 0;
    if (line[0] && strncmp(line, "??", 2) != 0) snprintf(out, n, "%s", line);
  }
  pclose(p);
}

static void fault_report(worker *w) {
  cl_cpu_thread *t = &w->ctx[w->fiber_mode && w->cur >= 0 ? w->cur : 0];
  uintptr_t a = (uintptr_t)w->fault_addr;
  if (!check_on && cpu_on_guard(w->fault_addr)) {   /* (a stack overflow: nothing else was touched) */
    fail_here(w, t, "a thread's stack overflowed (CUDALUA_CPU_CHECK=1 names the source line)");
    return;
  }
  if (!check_on) {
    /* a GPU's illegal address: the device lost. The thread is the block's first in a kernel run
       as a loop (its threads' coordinates are stepped in registers there); what the kernel wrote
       before may have hit the process's own memory */
    char who[64] = "";
    if (w->fiber_mode) snprintf(who, sizeof who, " thread (%u, %u, %u)", t->tid.x, t->tid.y, t->tid.z);
    cpu_lose(CUDA_ERROR_ILLEGAL_ADDRESS, "the CPU device: an illegal memory access at 0x%lx, in block (%u, %u, %u)%s "
             "(memory it wrote before may be damaged; CUDALUA_CPU_CHECK=1 stops at the first access past an "
             "array, naming the thread and the line)", (unsigned long)a, t->bid.x, t->bid.y, t->bid.z, who);
    w->failed = 1;
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    return;
  }
  char where[520], what[800];
  source_line(w->l, w->fault_pc, where, sizeof where);
  cpu_block b;
  if (cpu_on_guard(w->fault_addr))
    snprintf(what, sizeof what, w->co ? "CUDALUA_CPU_CHECK: the thread's stack (its OS thread's, as a coroutine's) overflowed (%s)"
             : "CUDALUA_CPU_CHECK: the thread's stack (64 KB) overflowed (%s)", where);
  else if (cpu_find_past(a, &b))
    snprintf(what, sizeof what, "CUDALUA_CPU_CHECK: an access past the end of an allocation of %zu bytes (its byte %zu, "
             "the allocation at 0x%lx) (%s)", b.size, (size_t)(a - b.base), (unsigned long)b.base, where);
  else
    snprintf(what, sizeof what, "CUDALUA_CPU_CHECK: an invalid memory access at 0x%lx (%s)", (unsigned long)a, where);
  fail_here(w, t, what);
}

/* ---- a block ---- */
/* a block's counts before its first thread runs: none ready, at a barrier or waiting in a warp */
static void block_counts(worker *w) {
  int T = w->T;
  w->rhead = w->rcount = 0, w->b.nbar = w->bar_count = 0, w->b.live = T, w->co_ops = 0, w->b.fast = 0;
  for (int i = 0; i * 32 < T; i++) {
    w->walive[i] = T - i * 32 >= 32 ? ~0u : (1u << (T - i * 32)) - 1;
    w->wwait[i] = w->wneed[i] = 0;
  }
}

static void run_fibers(worker *w) {
  int T = w->T;
  block_counts(w);
  for (int t = 0; t < T; t++) { fiber_init(w, t); push_ready(w, t); }
  if (san.tsan_switch) {
    /* the library's thread-local block is made at its first use on this OS thread: made here
       (a block of no threads) rather than in a fiber, which TSan would take for a race with
       the next fiber's use of it */
    cl_cpu_thread none = w->ctx[0];
    none.bdim = (cl_cpu_dim){0, 0, 0};
    w->l->f->e->block(&none, w->l->args, NULL);
    w->main.tsan = san.tsan_current();
  }
  hb_release(w);
  fib_switch(w, &w->main, &w->fibs[pop_ready(w)], 0);
  hb_acquire(w);
  if (!w->failed && w->b.live) stuck(w);
  /* fibers left in the middle keep ASan's marks on their stacks: clean for the next block */
  if (w->b.live && san.unpoison) san.unpoison(w->stacks, (size_t)w->nstacks * STACK);
}

/* a block of coroutines: each made, suspended before its first line, then the ready ones
   resumed in turn until none is left */
static void run_coros(worker *w) {
  int T = w->T;
  const cl_cpu_entry *e = w->l->f->e;
  block_counts(w);
  w->b.fast = !check_on;
  for (int t = 0; t < T; t++) {
    e->co_start(&w->ctx[t], w->l->args);
    if (!w->ctx[t].co) {
      cpu_fail(CUDA_ERROR_OUT_OF_MEMORY, "the CPU device: no memory for a block of %d threads", T);
      w->failed = 1;
      __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
      return;
    }
    push_ready(w, t);
  }
  for (int n; !w->failed && (n = pop_ready(w)) >= 0;) {
    w->cur = n;
    e->co_resume(&w->ctx[n]);
  }
  w->cur = -1;
  if (!w->failed && w->b.live) stuck(w);
}

/* a kernel that never synchronises: the library's loop over the block's threads, on one
   record (in a drawn order under a seeded schedule) */
static void run_loop(worker *w, cpu_launch *l) {
  const unsigned *order = NULL;
  if (sched_on) {
    for (int i = 0; i < w->T; i++) w->order[i] = (unsigned)i;
    for (int i = w->T - 1; i > 0; i--) {
      int k = (int)(mix(&w->rng) % (uint64_t)(i + 1));
      unsigned x = w->order[i];
      w->order[i] = w->order[k], w->order[k] = x;
    }
    order = w->order;
  }
  l->f->e->block(&w->ctx[0], l->args, order);
}

static void thread_records(worker *w, cpu_launch *l, cl_cpu_dim bid, int n) {
  if (n > 1 && w->rec_seq == launch_seq && w->rec_n == n) {   /* (dyn is the launch's: room() made it at its first block) */
    /* (the launch's last block on this thread: only the block is another; a block of one runs
       as a loop that steps its record: written whole) */
    for (int r = 0; r < n; r++) w->ctx[r].bid = bid, w->ctx[r].file = NULL, w->ctx[r].line = 0;
    return;
  }
  w->rec_seq = launch_seq, w->rec_n = n;
  cl_cpu_dim d = l->block;
  for (int r = 0; r < n; r++) {
    cl_cpu_thread *c = &w->ctx[r];
    c->tid = (cl_cpu_dim){(unsigned)r % d.x, (unsigned)r / d.x % d.y, (unsigned)r / (d.x * d.y)};
    c->bid = bid, c->bdim = d, c->gdim = l->grid;
    c->dyn_shared = w->dyn, c->rank = (unsigned)r, c->lane = (unsigned)r % 32, c->warp = (unsigned)r / 32;
    c->block = w, c->file = NULL, c->line = 0;
  }
}

/* its threads run as coroutines (settings read) */
static int runs_co(const cl_cpu_entry *e) { return e->sync && e->co_start && !co_off; }

static void run_block(worker *w, cpu_launch *l, uint64_t b) {
  cl_cpu_dim g = l->grid, d = l->block;
  cl_cpu_dim bid = {(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / ((uint64_t)g.x * g.y))};
  int T = (int)(d.x * d.y * d.z);
  w->T = T, w->l = l, w->failed = 0;
  w->fiber_mode = l->f->e->sync && T > 1;
  w->co = w->fiber_mode && runs_co(l->f->e);
  if (!room(w, T, l->shared) || (w->fiber_mode && !w->co && !stacks(w, T))) {
    cpu_fail(CUDA_ERROR_OUT_OF_MEMORY, "the CPU device: no memory for a block of %d threads", T);
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    return;
  }
  if (sched_on) w->rng = sched_seed ^ (b + 1) * 0xd1342543de82ef95ull;
  thread_records(w, l, bid, w->fiber_mode ? T : 1);
  w->cur = -1;
  /* a trap (1) or, under the check, a fault (2): the block ends there */
  w->fault_pc = 0;
  if (sigsetjmp(w->jb, 0)) { w->armed = 0; if (w->fault_pc) fault_report(w); return; }
  w->armed = 1;   /* a fault in the kernel ends the block, the check on or not */
  if (w->co) run_coros(w);
  else if (w->fiber_mode) run_fibers(w);
  else run_loop(w, l);
  w->armed = 0;
}

/* ---- the pool: every thread takes blocks until none are left ---- */
static uint64_t chunk;   /* blocks taken at once: fewer trips to the shared counter */
static void take_blocks(worker *w, cpu_launch *l) {
  fault_arm(w);
  for (;;) {
    if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) break;
    uint64_t b = __atomic_fetch_add(&next_block, chunk, __ATOMIC_RELAXED);
    if (b >= nblocks_total) break;
    uint64_t end = b + chunk < nblocks_total ? b + chunk : nblocks_total;
    for (; b < end && !__atomic_load_n(&stop, __ATOMIC_RELAXED); b++)
      run_block(w, l, sched_on ? (uint64_t)(((unsigned __int128)perm_a * b + perm_c) % nblocks_total) : b);
  }
}

/* a thread's worker and what it holds, freed on that thread as it ends (a thread-specific
   value's destructor: the pool's threads and the queue's worker alike). The alternate signal
   stack before ours goes back first: a sanitizer unmaps the one it finds at the thread's end,
   and ASan's check failed on ours (heap memory) */
static void worker_free(void *p) {
  worker *w = p;
  if (w->altstack) {
    sigaltstack(&w->old_alt, NULL);
    free(w->altstack);
  }
  if (w->stacks) munmap(w->stacks, (size_t)w->nstacks * STACK);
  for (int t = 0; san.tsan_switch && t < w->nstacks; t++) san.tsan_destroy(w->fibs[t].tsan);
  free(w->fibs), free(w->ctx), free(w->ready), free(w->b.bar), free(w->order), free(w->dyn), free(w->frames);
  free(w);
}

static pthread_key_t worker_key;
static pthread_once_t worker_key_once = PTHREAD_ONCE_INIT;
static void make_worker_key(void) { pthread_key_create(&worker_key, worker_free); }

/* this thread's worker, made on its first launch */
static worker *worker_new(void) {
  pthread_once(&worker_key_once, make_worker_key);
  worker *w = calloc(1, sizeof *w);
  if (w && pthread_setspecific(worker_key, w) != 0) { free(w); w = NULL; }
  return w;
}

static void *pool_main(void *arg) {
  (void)arg;
  me_w = worker_new();
  unsigned long seen = 0;
  pthread_mutex_lock(&pool_lock);
  for (;;) {
    while (generation == seen && !quitting) pthread_cond_wait(&go, &pool_lock);
    if (quitting) break;
    seen = generation;
    cpu_launch *l = current;
    pthread_mutex_unlock(&pool_lock);
    if (me_w) take_blocks(me_w, l);
    pthread_mutex_lock(&pool_lock);
    if (--running == 0) pthread_cond_signal(&finished);
  }
  pthread_mutex_unlock(&pool_lock);
  return NULL;   /* (its worker goes with it: worker_free) */
}

/* the last state closed, the queue's worker ended (cpu_queue_shutdown): the pool's threads end,
   joined, so that none is left asleep in this library's code once Lua unloads it; the fault
   handler goes back to the one before it for the same reason. The next launch starts them
   again. */
void cpu_pool_shutdown(void) {
  pthread_mutex_lock(&pool_lock);
  int n = npool;
  quitting = 1;
  pthread_cond_broadcast(&go);
  pthread_mutex_unlock(&pool_lock);
  for (int i = 0; i < n; i++) pthread_join(pool_ids[i], NULL);
  pthread_mutex_lock(&pool_lock);
  npool = 0, quitting = 0;
  pthread_mutex_unlock(&pool_lock);
  pthread_mutex_lock(&segv_lock);
  if (segv_on) sigaction(SIGSEGV, &prev_segv, NULL), __atomic_store_n(&segv_on, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&segv_lock);
}

int cpu_runs_co(const cl_cpu_entry *e) {
  pthread_once(&settings_once, read_settings);
  return runs_co(e);
}

static uint64_t gcd(uint64_t a, uint64_t b) { while (b) { uint64_t t = a % b; a = b, b = t; } return a; }

/* the seeded block order: b -> (a b + c) mod n, a prime to n, drawn from the seed */
static void block_order(uint64_t n) {
  uint64_t s = sched_seed;
  perm_c = n ? mix(&s) % n : 0;
  do perm_a = n > 1 ? 1 + mix(&s) % (n - 1) : 1; while (gcd(perm_a, n) != 1);
}

void cpu_launch_run(cpu_launch *l) {
  pthread_once(&settings_once, read_settings);
  if (!me_w) me_w = worker_new();
  uint64_t n = (uint64_t)l->grid.x * l->grid.y * l->grid.z;
  pthread_mutex_lock(&pool_lock);
  while (npool < cpu_threads() - 1 && npool < MAX_POOL && n > 1) {   /* the queue's worker is one of the pool */
    if (pthread_create(&pool_ids[npool], NULL, pool_main, NULL)) break;
    npool++;
  }
  current = l, next_block = 0, nblocks_total = n, stop = 0, launch_seq++;
  chunk = n / ((uint64_t)cpu_threads() * 64) + 1;   /* (a few dozen rounds each: the load still evens out) */
  if (sched_on) block_order(n);
  int helpers = n > 1 ? npool : 0;
  if (helpers) { running = helpers; generation++; pthread_cond_broadcast(&go); }
  pthread_mutex_unlock(&pool_lock);
  if (me_w) take_blocks(me_w, l);
  pthread_mutex_lock(&pool_lock);
  while (helpers && running) pthread_cond_wait(&finished, &pool_lock);
  pthread_mutex_unlock(&pool_lock);
}
