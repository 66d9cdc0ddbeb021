/* cpu_dev.h: the parts of cudalua's CPU device (src/cpu_*.c) that see each other. The device
   implements the driver entry points cudalua calls (cl.h's CL_CUDA_FUNCS) on the host: memory
   is host memory, every stream's work runs in order on one worker thread (the "GPU"), kernels
   come from libraries the host C++ compiler built (kernels/cudalua/cpu/cuda_cpu.h) and run on
   a pool of threads. cl_cpu_symbol (cpu_driver.c) is how the loader finds these entry points. */
#ifndef CL_CPU_DEV_H
#define CL_CPU_DEV_H
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>
#include "../kernels/cudalua/cpu/abi.h"

/* ---- cpu_mem.c: blocks of memory and what a pointer belongs to ---- */
typedef struct {
  uintptr_t base;
  size_t size;
  int kind;             /* CU_MEMORYTYPE_* */
  void *map;            /* under CUDALUA_CPU_CHECK: its mapping, a guard page at its end */
  size_t maplen;
} cpu_block;
CUresult cpu_alloc(void **p, size_t n, int kind);
CUresult cpu_free(void *p);
int cpu_find(uintptr_t p, cpu_block *out);   /* 1: p lies in a block cudalua allocated */
int cpu_find_past(uintptr_t p, cpu_block *out);   /* 1: p is on the guard page after a block's end */
size_t cpu_mem_used(void);
int cpu_check_on(void);                      /* CUDALUA_CPU_CHECK is set */

/* ---- cpu_queue.c: the work queue every stream shares, events ---- */
typedef struct cpu_op cpu_op;
typedef void (*cpu_work)(cpu_op *op);
struct cpu_capture;
struct cpu_node;
struct cpu_plan;
struct cpu_op {
  cpu_work run;
  cpu_op *next;
  uint64_t seq;
  union {
    /* n bytes a row; h rows (0: 1) dp/sp apart, d slices (0: 1) dz/sz apart */
    struct { void *dst; const void *src; size_t n, h, d, dp, sp, dz, sz; } copy;
    struct { void *dst; uint32_t v; size_t n, pitch, w, h; int size; } fill;
    struct { void (*fn)(void *); void *data; } host;
    struct { struct cpu_event *ev; } rec;
    struct { void *p; } free;
    struct { struct cpu_launch *l; } launch;
    struct { CUstreamBatchMemOpParams *v; unsigned n; } batch;   /* v: malloc'd, the op's */
    struct { struct cpu_plan *p; } graph;
  } u;
};
/* cap: the capture the stream takes part in (cpu_graph.c), its work's dependencies there */
typedef struct cpu_stream {
  uint64_t last; int priority; unsigned flags;
  struct cpu_capture *cap; struct cpu_node **deps; size_t ndeps;
} cpu_stream;
/* cap: the capture it was recorded in (its id), and that capture's dependencies then */
typedef struct cpu_event {
  uint64_t seq; double t; unsigned flags;
  uint64_t cap; struct cpu_node **deps; size_t ndeps;
} cpu_event;
CUresult cpu_enqueue(CUstream s, cpu_op *op);        /* op: malloc'd; the queue frees it */
/* while streams capture (cpu_graph.c sets it): 1 when it took op instead of the queue (*r) */
extern int (*cpu_capture_hook)(CUstream s, cpu_op *op, CUresult *r);
CUresult cpu_wait_seq(uint64_t seq);                 /* until work up to seq is done */
int cpu_queue_shutdown(void);   /* the worker ends once the queue is empty (1: it did; 0: called on it) */
void cpu_drain(uint64_t seq);                        /* the same, leaving a failure to be said */
uint64_t cpu_enqueued(void);                         /* the last sequence number given */
int cpu_done(uint64_t seq);
void cpu_fail(CUresult r, const char *fmt, ...);     /* a launch failed: the next sync says so */
void cpu_lose(CUresult r, const char *fmt, ...);     /* the device lost: every later call says so */
CUresult cpu_lost(void);                             /* that error, or CUDA_SUCCESS */
const char *cpu_error_text(CUresult r);               /* the message of the last failure r */
double cpu_now(void);

/* ---- cpu_exec.c: a launch on the pool ---- */
typedef struct cpu_module {
  void *lib;
  const cl_cpu_entry *entries;
  void (*run)(const cl_cpu_entry *, cl_cpu_thread *, void **);
  int fd;               /* the library's file, open while it is loaded */
  struct cpu_func *funcs;   /* one per entry */
  int nfuncs;
} cpu_module;
typedef struct cpu_func { cpu_module *mod; const cl_cpu_entry *e; int max_dyn, carveout, max_threads; } cpu_func;
typedef struct cpu_launch {
  cpu_func *f;
  cl_cpu_dim grid, block;
  size_t shared;
  void **args;          /* pointers to the values, which follow them */
  size_t size;          /* the allocation's, args and values in it (a graph node copies it) */
} cpu_launch;
void cpu_launch_run(cpu_launch *l);     /* on the queue's worker: every block, then returns */
void cpu_pool_shutdown(void);           /* the pool's threads end (the queue's worker has ended) */
int cpu_threads(void);                  /* the pool's size ("multiprocessors") */
int cpu_runs_co(const cl_cpu_entry *e);   /* its blocks' threads run as coroutines (of more than one) */
int cpu_on_guard(const void *p);        /* p is on a guard page of this thread's fibers' stacks */
extern const cl_cpu_rt cpu_rt;

/* an entry point's table row (cpu_driver.c, cpu_graph.c): the implementation must have the entry
   point's type (the conditional says so at compile time) */
#define CPU_STR(f) #f
#define CPU_XSTR(f) CPU_STR(f)
#define IMPL(f, impl) {CPU_XSTR(f), (void *)(1 ? (impl) : (__typeof__(&f))0)}

/* ---- cpu_driver.c: the ops' runners and makers, which graph nodes reuse ---- */
size_t cpu_device_free(void);   /* what the device's memory has left (CUDALUA_CPU_MEMORY) */
void cpu_run_copy(cpu_op *op);
CUresult cpu_copy_op(const CUDA_MEMCPY3D *p, cpu_op *op);   /* op's copy from p: linear memory */
void cpu_run_fill(cpu_op *op);
void cpu_run_host(cpu_op *op);
void cpu_run_free(cpu_op *op);
void cpu_run_record(cpu_op *op);
void cpu_run_launch(cpu_op *op);    /* frees the launch: a stream's */
void cpu_run_batch(cpu_op *op);     /* frees the array: a stream's */
void cpu_batch_do(const CUstreamBatchMemOpParams *v, unsigned n);
CUresult cpu_batch_copy(const CUstreamBatchMemOpParams *v, unsigned n, CUstreamBatchMemOpParams **out);   /* checked, malloc'd */
cpu_launch *cpu_launch_new(cpu_func *cf, cl_cpu_dim g, cl_cpu_dim b, size_t shared, void **params, CUresult *r);
CUresult cpu_event_record(CUevent e, CUstream s);
void *cpu_driver_symbol(const char *name);   /* NULL name: non-NULL when the CPU device is chosen */

#endif
