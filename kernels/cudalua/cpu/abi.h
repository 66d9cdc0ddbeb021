/* cudalua/cpu/abi.h: what a kernel library built for cudalua's CPU device and the device
   (src/cpu_*.c) share. C, so both sides read it. A kernel library exports
     void __cudalua_cpu_bind(const cl_cpu_rt *rt)       the device's calls, given once at load
     const cl_cpu_entry __cudalua_cpu_entries[]         its kernels (fn NULL last)
     void __cudalua_cpu_run(const cl_cpu_entry *, cl_cpu_thread *, void **args)
                                                        one CUDA thread of a kernel, to its end
     const int __cudalua_cpu_abi                        CL_CPU_ABI, as the library was built
   An entry whose kernel can never reach a barrier or a warp operation (sync 0) runs a block as
   one call of its block function: the loop over the threads is the library's, so the compiler
   inlines the kernel into it; the others run each thread as a fiber (run), or, where the
   library has a coroutine twin of the kernel (co_start), each thread as a C++ coroutine whose
   barriers and warp operations are co_await: a switch is then a call and a return on the OS
   thread's own stack, a fraction of a fiber's. */
#ifndef CUDALUA_CPU_ABI_H
#define CUDALUA_CPU_ABI_H
#define CL_CPU_ABI 4

typedef struct { unsigned x, y, z; } cl_cpu_dim;

/* one CUDA thread: its coordinates, and the exchange slot of warp operations. What a block of
   coroutines touches at each barrier comes first, in one cache line: a block of 256 threads
   switches among 256 records, more than a core's first-level cache holds */
typedef struct cl_cpu_thread {
  cl_cpu_dim tid;
  unsigned rank;              /* x + y * bdim.x + z * bdim.x * bdim.y */
  const char *file;           /* where its last barrier or warp operation is (checks' messages) */
  int line;
  /* a coroutine's (co_start): its handle; its warp operation (CL_CPU_W*, the lane, delta or
     xor mask, width and the value's size) whose result the device writes at resp when the warp
     meets, as it writes a barrier's count there (warg: the barrier's op; a coroutine suspends
     once per operation) */
  int warg;
  void *co;
  void *block;                /* the device's */
  unsigned lane, warp;
  int wop, wwidth, wsize;
  cl_cpu_dim bid, bdim, gdim;
  void *dyn_shared;           /* the block's dynamic shared memory */
  unsigned long long slot[2]; /* this lane's value in a warp operation (16 bytes at most) */
  void *resp;                 /* where a coroutine wants its result (16 bytes: its awaiter's) */
} cl_cpu_thread;

enum { CL_CPU_WSYNC, CL_CPU_WIDX, CL_CPU_WUP, CL_CPU_WDOWN, CL_CPU_WXOR, CL_CPU_WBALLOT, CL_CPU_WANY, CL_CPU_WALL };

/* what a block of coroutines shares with the kernel library, first in the record's block: a
   thread that reaches a plain __syncthreads and is not the last live one to, while nothing is
   checked (fast), counts its arrival itself (its rank at the end of bar) without a call */
typedef struct cl_cpu_block {
  int *bar;                   /* the ranks at the barrier, in order: nbar of them */
  int nbar, live, fast;
} cl_cpu_block;

typedef struct cl_cpu_rt {
  int abi;
  /* __syncthreads; with op 1/2/3: the count / and / or of pred over the block */
  int (*sync)(cl_cpu_thread *me, int op, int pred);
  /* every lane of mask (of those that exist) reaches it before any goes on */
  void (*warp_sync)(cl_cpu_thread *me, unsigned mask);
  /* lane `lane` of my warp (NULL: no such lane in this block) */
  cl_cpu_thread *(*lane)(cl_cpu_thread *me, unsigned lane);
  /* the lanes of my warp that exist and have not returned */
  unsigned (*active)(cl_cpu_thread *me);
  /* assert / __trap: the launch fails with this message; does not return */
  void (*trap)(cl_cpu_thread *me, const char *what, const char *file, int line);
  /* coroutines: the memory of my frame (NULL: none); my arrival at a barrier, a warp operation
     or my end (after it I never run again), counted before my coroutine suspends and returns to
     the block's runner (which called co_resume, and resumes the threads that can run) */
  void *(*co_frame)(cl_cpu_thread *me, unsigned long size);
  void (*co_sync)(cl_cpu_thread *me, int op, int pred);
  void (*co_warp)(cl_cpu_thread *me, unsigned mask);
  void (*co_done)(cl_cpu_thread *me);
} cl_cpu_rt;

typedef struct cl_cpu_entry {
  void *fn;                               /* the kernel, as dlsym finds it */
  void (*call)(void *fn, void **args);    /* calls it with the launch's argument pointers */
  /* every thread of a block, one after another, on t (the block's one record: its tid, rank,
     lane and warp are stepped); order: the ranks in the order to run them, or NULL */
  void (*block)(cl_cpu_thread *t, void **args, const unsigned *order);
  int nparams;
  const unsigned short *size, *align;     /* each parameter's */
  int sync;                               /* 1: it may reach a barrier or a warp operation */
  /* the kernel's coroutine twin (NULL: none): makes thread t's coroutine (in t->co, NULL when no
     memory), suspended before its first line; and resumes one */
  void (*co_start)(cl_cpu_thread *t, void **args);
  void (*co_resume)(cl_cpu_thread *t);
} cl_cpu_entry;
#endif
