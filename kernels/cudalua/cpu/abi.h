/* cudalua/cpu/abi.h: what a kernel library built for cudalua's CPU device and the device
   (src/cpu_*.c) share. C, so both sides read it. A kernel library exports
     void __cudalua_cpu_bind(const cl_cpu_rt *rt)       the device's calls, given once at load
     const cl_cpu_entry __cudalua_cpu_entries[]         its kernels (fn NULL last)
     void __cudalua_cpu_run(const cl_cpu_entry *, cl_cpu_thread *, void **args)
                                                        one CUDA thread of a kernel, to its end
     const int __cudalua_cpu_abi                        CL_CPU_ABI, as the library was built
   An entry whose kernel can never reach a barrier or a warp operation (sync 0) runs a block as
   one call of its block function: the loop over the threads is the library's, so the compiler
   inlines the kernel into it; the others run each thread as a fiber (run). */
#ifndef CUDALUA_CPU_ABI_H
#define CUDALUA_CPU_ABI_H
#define CL_CPU_ABI 2

typedef struct { unsigned x, y, z; } cl_cpu_dim;

/* one CUDA thread: its coordinates, and the exchange slot of warp operations */
typedef struct cl_cpu_thread {
  cl_cpu_dim tid, bid, bdim, gdim;
  void *dyn_shared;           /* the block's dynamic shared memory */
  unsigned lane, warp, rank;  /* rank: x + y * bdim.x + z * bdim.x * bdim.y */
  void *block;                /* the device's */
  unsigned long long slot[2]; /* this lane's value in a warp operation (16 bytes at most) */
  const char *file;           /* where its last barrier or warp operation is (checks' messages) */
  int line;
} cl_cpu_thread;

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
} cl_cpu_entry;
#endif
