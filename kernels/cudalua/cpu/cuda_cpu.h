/* cudalua/cpu/cuda_cpu.h: CUDA C++ on the CPU, for cudalua's CPU device. The host C++ compiler
   reads it before a kernel source (-include). A CUDA thread is a call of the kernel function with
   __cl_cur pointing at its coordinates; the threads of a block run on one OS thread (one after
   another, or as fibers when the source synchronises), so __shared__ is thread_local, and blocks
   run on a pool of OS threads, so atomics are real atomics. What a CPU cannot do (inline PTX,
   tensor cores, clusters, textures) is refused before this header is used (cudalua.cpucompile). */
#ifndef CUDALUA_CUDA_CPU_H
#define CUDALUA_CUDA_CPU_H
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <time.h>
#include <cmath>
#include <climits>
#include <cfloat>
#include <utility>
#include <type_traits>
#include <tuple>
#include <algorithm>
#include "cudalua/cpu/abi.h"
#if defined(__cpp_impl_coroutine)
#include <coroutine>
#endif

#define __CUDACC__ 1
#define __CUDA_ARCH__ 0   /* device code (no GPU architecture: feature tests see the oldest) */
#define __CUDALUA_CPU__ 1
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __shared__ static thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __align__(n) alignas(n)
#define __grid_constant__

__attribute__((visibility("hidden"))) inline thread_local cl_cpu_thread *__cl_cur;
/* the fibers of a block share their OS thread's __cl_cur: under ThreadSanitizer its uses are
   atomic, so that only the kernel's own memory is reported */
#if defined(__SANITIZE_THREAD__)
#define __CL_CUR (__atomic_load_n(&__cl_cur, __ATOMIC_RELAXED))
#define __CL_SET_CUR(v) __atomic_store_n(&__cl_cur, (v), __ATOMIC_RELAXED)
#else
#define __CL_CUR __cl_cur
#define __CL_SET_CUR(v) (__cl_cur = (v))
#endif
inline const cl_cpu_rt *__cl_rt;

/* ---- vector types ---- */
#define __CL_VEC2(T, N, A) struct alignas(A) N##2 { T x, y; }; \
  inline N##2 make_##N##2(T a, T b) { return {a, b}; }
#define __CL_VEC3(T, N) struct N##3 { T x, y, z; }; \
  inline N##3 make_##N##3(T a, T b, T c) { return {a, b, c}; }
#define __CL_VEC4(T, N, A) struct alignas(A) N##4 { T x, y, z, w; }; \
  inline N##4 make_##N##4(T a, T b, T c, T d) { return {a, b, c, d}; }
#define __CL_VECS(T, N, S) __CL_VEC2(T, N, 2 * S) __CL_VEC3(T, N) __CL_VEC4(T, N, 4 * S)
__CL_VECS(float, float, 4) __CL_VECS(int, int, 4) __CL_VECS(unsigned, uint, 4)
__CL_VECS(signed char, char, 1) __CL_VECS(unsigned char, uchar, 1) __CL_VECS(short, short, 2)
__CL_VECS(unsigned short, ushort, 2) __CL_VEC2(double, double, 16) __CL_VEC3(double, double)
__CL_VEC2(long long, longlong, 16) __CL_VEC2(unsigned long long, ulonglong, 16)

/* ---- the built-in variables ---- */
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
  constexpr dim3(uint3 u) : x(u.x), y(u.y), z(u.z) {}
};
#define __CL_U3(d) (*reinterpret_cast<const uint3 *>(&(d)))
#define threadIdx __CL_U3(__CL_CUR->tid)
#define blockIdx __CL_U3(__CL_CUR->bid)
#define blockDim (dim3(__CL_U3(__CL_CUR->bdim)))
#define gridDim (dim3(__CL_U3(__CL_CUR->gdim)))
#define warpSize 32

/* ---- barriers and warp operations: the device's calls; after each, other fibers of the
   block have run, so the current thread is set again. Each notes where it is called from
   (__builtin_FILE/LINE as default arguments: the caller's #line), for the checks' messages ---- */
#define __CL_AT const char *__cl_file = __builtin_FILE(), int __cl_line = __builtin_LINE()
#define __CL_HERE(me) ((me)->file = __cl_file, (me)->line = __cl_line)
inline int __cl_sync(int op, int p, const char *file, int line) {
  cl_cpu_thread *me = __CL_CUR;
  me->file = file, me->line = line;
  int r = __cl_rt->sync(me, op, p != 0);
  __CL_SET_CUR(me);
  return r;
}
inline void __syncthreads(__CL_AT) { __cl_sync(0, 0, __cl_file, __cl_line); }
inline int __syncthreads_count(int p, __CL_AT) { return __cl_sync(1, p, __cl_file, __cl_line); }
inline int __syncthreads_and(int p, __CL_AT) { return __cl_sync(2, p, __cl_file, __cl_line); }
inline int __syncthreads_or(int p, __CL_AT) { return __cl_sync(3, p, __cl_file, __cl_line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, __CL_AT) {
  cl_cpu_thread *me = __CL_CUR;
  __CL_HERE(me);
  __cl_rt->warp_sync(me, mask);
  __CL_SET_CUR(me);
}
inline unsigned __activemask() { return __cl_rt->active(__CL_CUR); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* every lane of mask writes its value, all meet, each reads the lane it wants, all meet again
   (so that no lane overwrites its slot before the others have read it) */
template <class T, class F> inline T __cl_exchange(unsigned mask, T v, F pick, const char *__cl_file, int __cl_line) {
  static_assert(sizeof(T) <= 16, "a warp operation's value is at most 16 bytes");
  cl_cpu_thread *me = __CL_CUR;
  __CL_HERE(me);
  std::memcpy(me->slot, &v, sizeof(T));
  __cl_rt->warp_sync(me, mask);
  int from = pick((int)me->lane);
  cl_cpu_thread *o = from >= 0 ? __cl_rt->lane(me, (unsigned)from) : nullptr;
  T r = v;
  if (o) std::memcpy(&r, o->slot, sizeof(T));
  __cl_rt->warp_sync(me, mask);
  __CL_SET_CUR(me);
  return r;
}
template <class T> inline T __shfl_sync(unsigned m, T v, int src, int w = 32, __CL_AT) {
  return __cl_exchange(m, v, [=](int l) { return (l & ~(w - 1)) + (src & (w - 1)); }, __cl_file, __cl_line);
}
template <class T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32, __CL_AT) {
  return __cl_exchange(m, v, [=](int l) { int s = (l & (w - 1)) - (int)d; return s < 0 ? l : l - (int)d; }, __cl_file, __cl_line);
}
template <class T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32, __CL_AT) {
  return __cl_exchange(m, v, [=](int l) { int s = (l & (w - 1)) + (int)d; return s >= w ? l : l + (int)d; }, __cl_file, __cl_line);
}
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int x, int w = 32, __CL_AT) {
  /* PTX's butterfly: a partner past the end of my segment gives my own value (one before it is read) */
  return __cl_exchange(m, v, [=](int l) { int s = l ^ x; return s <= (l | (w - 1)) ? s : l; }, __cl_file, __cl_line);
}
/* the predicate of every lane of mask, as bits; *alive: the lanes of mask that voted (read
   while they all wait here: once they go on, lanes may return before this one reads) */
inline unsigned __cl_vote(unsigned mask, int p, unsigned *alive, const char *__cl_file, int __cl_line) {
  cl_cpu_thread *me = __CL_CUR;
  __CL_HERE(me);
  me->slot[0] = p != 0;
  __cl_rt->warp_sync(me, mask);
  unsigned r = 0, live = mask & __cl_rt->active(me);   /* (a lane that returned votes nothing) */
  for (unsigned l = 0; l < 32; l++) {
    cl_cpu_thread *o = (live >> l) & 1 ? __cl_rt->lane(me, l) : nullptr;
    if (o && o->slot[0]) r |= 1u << l;
  }
  *alive = live;
  __cl_rt->warp_sync(me, mask);
  __CL_SET_CUR(me);
  return r;
}
inline unsigned __ballot_sync(unsigned m, int p, __CL_AT) { unsigned a; return __cl_vote(m, p, &a, __cl_file, __cl_line); }
inline int __any_sync(unsigned m, int p, __CL_AT) { unsigned a; return __cl_vote(m, p, &a, __cl_file, __cl_line) != 0; }
inline int __all_sync(unsigned m, int p, __CL_AT) {
  unsigned a, r = __cl_vote(m, p, &a, __cl_file, __cl_line);
  return r == a;
}
/* the lanes of mask holding my value; *alive as __cl_vote's */
template <class T> inline unsigned __cl_match(unsigned mask, T v, unsigned *alive, const char *__cl_file, int __cl_line) {
  cl_cpu_thread *me = __CL_CUR;
  __CL_HERE(me);
  std::memcpy(me->slot, &v, sizeof(T));
  __cl_rt->warp_sync(me, mask);
  unsigned r = 0, live = mask & __cl_rt->active(me);
  for (unsigned l = 0; l < 32; l++) {
    cl_cpu_thread *o = (live >> l) & 1 ? __cl_rt->lane(me, l) : nullptr;
    if (o && std::memcmp(o->slot, &v, sizeof(T)) == 0) r |= 1u << l;
  }
  *alive = live;
  __cl_rt->warp_sync(me, mask);
  __CL_SET_CUR(me);
  return r;
}
template <class T> inline unsigned __match_any_sync(unsigned mask, T v, __CL_AT) {
  unsigned a;
  return __cl_match(mask, v, &a, __cl_file, __cl_line);
}
template <class T> inline unsigned __match_all_sync(unsigned mask, T v, int *pred, __CL_AT) {
  unsigned all, same = __cl_match(mask, v, &all, __cl_file, __cl_line);
  *pred = same == all;
  return same == all ? all : 0;
}
inline unsigned __lanemask_lt() { return (1u << (__CL_CUR->rank & 31)) - 1; }

/* ---- atomics (blocks run at once on several OS threads) ---- */
#define __CL_ATOMIC_INT(T) \
  inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
  inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
  inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
  inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
  inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); } \
  inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); } \
  inline T atomicCAS(T *p, T c, T v) { __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return c; } \
  inline T atomicMin(T *p, T v) { T o = __atomic_load_n(p, __ATOMIC_RELAXED); \
    while (v < o && !__atomic_compare_exchange_n(p, &o, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} return o; } \
  inline T atomicMax(T *p, T v) { T o = __atomic_load_n(p, __ATOMIC_RELAXED); \
    while (v > o && !__atomic_compare_exchange_n(p, &o, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} return o; }
__CL_ATOMIC_INT(int) __CL_ATOMIC_INT(unsigned) __CL_ATOMIC_INT(unsigned long long) __CL_ATOMIC_INT(long long)
inline unsigned short atomicCAS(unsigned short *p, unsigned short c, unsigned short v) {
  __atomic_compare_exchange_n(p, &c, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return c;
}
inline unsigned atomicInc(unsigned *p, unsigned lim) {
  unsigned o = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &o, o >= lim ? 0 : o + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return o;
}
inline unsigned atomicDec(unsigned *p, unsigned lim) {
  unsigned o = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &o, (o == 0 || o > lim) ? lim : o - 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return o;
}
/* floating point: a compare-and-swap loop on the bits */
template <class F, class B, class Op> inline F __cl_atomic_float(F *p, Op op) {
  B *q = reinterpret_cast<B *>(p);
  B o = __atomic_load_n(q, __ATOMIC_RELAXED), n;
  F of;
  do { std::memcpy(&of, &o, sizeof of); F nf = op(of); std::memcpy(&n, &nf, sizeof n); }
  while (!__atomic_compare_exchange_n(q, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return of;
}
inline float atomicAdd(float *p, float v) { return __cl_atomic_float<float, uint32_t>(p, [=](float a) { return a + v; }); }
inline double atomicAdd(double *p, double v) { return __cl_atomic_float<double, uint64_t>(p, [=](double a) { return a + v; }); }
inline float atomicExch(float *p, float v) { return __cl_atomic_float<float, uint32_t>(p, [=](float) { return v; }); }
inline float atomicMin(float *p, float v) { return __cl_atomic_float<float, uint32_t>(p, [=](float a) { return std::fmin(a, v); }); }
inline float atomicMax(float *p, float v) { return __cl_atomic_float<float, uint32_t>(p, [=](float a) { return std::fmax(a, v); }); }
inline double atomicMin(double *p, double v) { return __cl_atomic_float<double, uint64_t>(p, [=](double a) { return std::fmin(a, v); }); }
inline double atomicMax(double *p, double v) { return __cl_atomic_float<double, uint64_t>(p, [=](double a) { return std::fmax(a, v); }); }
/* the scoped forms act as the plain ones here */
#define __CL_SCOPED(op) template <class... A> inline auto op##_block(A... a) { return op(a...); } \
  template <class... A> inline auto op##_system(A... a) { return op(a...); }
__CL_SCOPED(atomicAdd) __CL_SCOPED(atomicSub) __CL_SCOPED(atomicExch) __CL_SCOPED(atomicMin)
__CL_SCOPED(atomicMax) __CL_SCOPED(atomicCAS) __CL_SCOPED(atomicAnd) __CL_SCOPED(atomicOr) __CL_SCOPED(atomicXor)

/* ---- math: the standard functions are <cmath>'s; CUDA's own ---- */
using std::sqrt; using std::exp; using std::log; using std::sin; using std::cos; using std::fabs;
using std::floor; using std::ceil; using std::pow; using std::fmin; using std::fmax; using std::abs;
/* CUDA's min and max take any two arithmetic values (std's want one type) */
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float sinpif(float x) { return std::sin(x * 3.14159265358979323846f); }
inline float cospif(float x) { return std::cos(x * 3.14159265358979323846f); }
inline double sinpi(double x) { return std::sin(x * 3.14159265358979323846); }
inline double cospi(double x) { return std::cos(x * 3.14159265358979323846); }
inline void __sincosf(float x, float *s, float *c) { *s = std::sin(x); *c = std::cos(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
inline double __longlong_as_double(long long x) { double f; std::memcpy(&f, &x, 8); return f; }
inline long long __double_as_longlong(double f) { long long x; std::memcpy(&x, &f, 8); return x; }
inline float __int2float_rn(int x) { return (float)x; }
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline unsigned __float2uint_rn(float x) { return (unsigned)std::nearbyint(x); }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline double __ull2double_rn(unsigned long long x) { return (double)x; }
inline float __ull2float_rn(unsigned long long x) { return (float)x; }
template <class T> inline T __ldg(const T *p) { return *p; }
template <class T> inline T __ldcs(const T *p) { return *p; }
template <class T> inline void __stcs(T *p, T v) { *p = v; }

inline long long clock64() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000ll + t.tv_nsec;
}
inline unsigned long long __globaltimer() { return (unsigned long long)clock64(); }
inline void __nanosleep(unsigned) {}

/* ---- graph conditions: a handle is the address of the condition's word, which the CPU
   device owns (src/cpu_graph.c). cudalua.compile declares the function for sources that call
   it, as for NVRTC (CUDARTAPI, __cudart_builtin__): that declaration matches this one. ---- */
#define __cudart_builtin__
#define CUDARTAPI
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" inline void cudaGraphSetConditional(cudaGraphConditionalHandle h, unsigned int value) {
  __atomic_store_n(reinterpret_cast<unsigned int *>(static_cast<uintptr_t>(h)), value, __ATOMIC_RELEASE);
}

/* ---- assert and __trap: a Lua error naming the block and thread; the process goes on ---- */
[[noreturn]] inline void __cl_trap(const char *what, const char *file, int line) {
  __cl_rt->trap(__CL_CUR, what, file, line);
  __builtin_unreachable();
}
#undef assert
#define assert(e) ((e) ? (void)0 : __cl_trap("assertion failed: " #e, __FILE__, __LINE__))
#define __trap() __cl_trap("__trap()", __FILE__, __LINE__)
#define __brkpt() ((void)0)

/* ---- coroutine twins: cudalua.cpucompile writes one of a kernel whose barriers and warp
   operations are all in its own body, as __cl_co_<name>(thread, parameters) with those calls
   made co_await of the awaiters below (macros around the twin) and its returns co_return.
   Each thread is then a coroutine: its frame from the device (co_frame: the block's frames
   are reused block after block); at a barrier it counts its arrival and returns to the block's
   runner, which resumes the next thread that can run (__cl_co_resume: the OS thread's current
   record is set first, for the functions the body calls): a call and a return instead of a
   fiber's stack switch. ---- */
#if defined(__cpp_impl_coroutine)
struct __cl_co_task {
  void *h;
  struct promise_type {
    cl_cpu_thread *me;
    template <class... A> promise_type(cl_cpu_thread *m, A &...) noexcept : me(m) {}
    template <class... A> static void *operator new(std::size_t n, cl_cpu_thread *m, A &...) noexcept {
      return __cl_rt->co_frame(m, n);
    }
    static void operator delete(void *) noexcept {}   /* (the device's memory) */
    static __cl_co_task get_return_object_on_allocation_failure() noexcept { return {nullptr}; }
    __cl_co_task get_return_object() noexcept {
      return {std::coroutine_handle<promise_type>::from_promise(*this).address()};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }   /* (resumed by __cl_co_resume) */
    struct end {
      cl_cpu_thread *me;
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<>) noexcept { __cl_rt->co_done(me); }
      void await_resume() noexcept {}
    };
    end final_suspend() noexcept { return {me}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::abort(); }
  };
};
/* a warp operation. Everything it hands the device is its own until it suspends
   (two in one expression are both made before either suspends): the record is written in
   await_suspend, and the device writes the result into this awaiter (res), which may be read
   after another suspension of the same expression */
template <class T> struct __cl_co_wait {
  cl_cpu_thread *me;
  const char *file;
  int line, wop, warg, wwidth, wsize;
  unsigned mask;
  unsigned long long val[2], res[2];
  bool await_ready() noexcept { return false; }
  void await_suspend(std::coroutine_handle<>) noexcept {
    me->file = file, me->line = line, me->resp = res;
    me->wop = wop, me->warg = warg, me->wwidth = wwidth, me->wsize = wsize;
    /* (the value's own bytes, as they were stored: a 16-byte copy of a 4-byte value just
       stored waits for the store to reach the cache, a third of a shuffle's time) */
    if constexpr (!std::is_void_v<T>) {
      if (wop <= CL_CPU_WXOR) std::memcpy(me->slot, val, sizeof(T));
      else me->slot[0] = val[0];
    }
    __cl_rt->co_warp(me, mask);
  }
  T await_resume() noexcept {
    T r;
    std::memcpy(&r, res, sizeof r);
    return r;
  }
};
template <> inline void __cl_co_wait<void>::await_resume() noexcept {}
/* a barrier's: the same, smaller (most kernels' only switches) */
struct __cl_co_bar_wait {
  cl_cpu_thread *me;
  const char *file;
  int line, op, pred;
  unsigned long long res;
  bool await_ready() noexcept { return false; }
  void await_suspend(std::coroutine_handle<>) noexcept {
    cl_cpu_block *b = static_cast<cl_cpu_block *>(me->block);
    if (b->fast && !op && b->nbar + 1 < b->live) { b->bar[b->nbar++] = (int)me->rank; return; }   /* (abi.h) */
    me->file = file, me->line = line, me->resp = &res;
    __cl_rt->co_sync(me, op, pred);
  }
  int await_resume() noexcept { return (int)res; }
};
inline __cl_co_bar_wait __cl_co_bar(cl_cpu_thread *me, const char *file, int line, int op, int p = 0) {
  return {me, file, line, op, p != 0, 0};
}
inline __cl_co_wait<void> __cl_co_syncwarp(cl_cpu_thread *me, const char *file, int line, unsigned mask = 0xffffffffu) {
  return {me, file, line, CL_CPU_WSYNC, 0, 32, 0, mask, {0, 0}, {0, 0}};
}
template <int K, class T> inline __cl_co_wait<T> __cl_co_shfl(cl_cpu_thread *me, const char *file, int line, unsigned mask, T v, int arg, int w = 32) {
  static_assert(sizeof(T) <= 16, "a warp operation's value is at most 16 bytes");
  __cl_co_wait<T> a = {me, file, line, K, arg, w, (int)sizeof(T), mask, {0, 0}, {0, 0}};
  std::memcpy(a.val, &v, sizeof(T));
  return a;
}
template <int K, class R> inline __cl_co_wait<R> __cl_co_vote(cl_cpu_thread *me, const char *file, int line, unsigned mask, int p) {
  return {me, file, line, K, 0, 32, 0, mask, {(unsigned long long)(p != 0), 0}, {0, 0}};
}
/* an entry's twin: the arguments unpacked into a new coroutine for thread t */
template <auto C, class... A, std::size_t... I>
inline void __cl_co_start_with(__cl_co_task (*)(cl_cpu_thread *, A...), cl_cpu_thread *t, void **args, std::index_sequence<I...>) {
  t->co = C(t, *static_cast<std::remove_reference_t<A> *>(args[I])...).h;
}
template <auto C, class... A> inline void __cl_co_start_of(__cl_co_task (*c)(cl_cpu_thread *, A...), cl_cpu_thread *t, void **args) {
  __cl_co_start_with<C>(c, t, args, std::index_sequence_for<A...>{});
}
template <auto C> inline void __cl_co_start(cl_cpu_thread *t, void **args) { __cl_co_start_of<C>(C, t, args); }
inline void __cl_co_resume(cl_cpu_thread *t) {
  __CL_SET_CUR(t);
  std::coroutine_handle<>::from_address(t->co).resume();
}
#endif

/* ---- what cudalua's device needs of the library ---- */
/* an entry: the kernel's address and a caller that unpacks the launch's argument pointers */
template <class... A, std::size_t... I>
inline void __cl_call_with(void (*f)(A...), void **args, std::index_sequence<I...>) {
  f(*static_cast<std::remove_reference_t<A> *>(args[I])...);
}
template <class... A> inline void __cl_call(void *fn, void **args) {
  __cl_call_with(reinterpret_cast<void (*)(A...)>(fn), args, std::index_sequence_for<A...>{});
}
template <class... A> constexpr std::size_t __cl_nparams(void (*)(A...)) { return sizeof...(A); }
template <class... A> struct __cl_sizes {
  static constexpr unsigned short size[sizeof...(A) + 1] = {(unsigned short)sizeof(A)..., 0};
  static constexpr unsigned short align[sizeof...(A) + 1] = {(unsigned short)alignof(A)..., 0};
};
/* under CUDALUA_CPU_CHECK a fault names the thread from its record: written before the kernel
   runs, not later (the compiler may otherwise sink the stores past the kernel's loads) */
#if defined(__CUDALUA_CPU_CHECK__)
#define __CL_STEPPED() __asm__ __volatile__("" ::: "memory")
#else
#define __CL_STEPPED() ((void)0)
#endif
/* a block of a kernel that never synchronises: the arguments unpacked once, then the kernel
   (F, known here, so inlined) once per thread with t's coordinates stepped */
template <auto F, class... A, std::size_t... I>
__attribute__((flatten)) inline void __cl_block_with(void (*)(A...), cl_cpu_thread *t, void **args, const unsigned *order, std::index_sequence<I...>) {
  std::tuple<std::remove_cv_t<std::remove_reference_t<A>>...> a(*static_cast<std::remove_reference_t<A> *>(args[I])...);
  __CL_SET_CUR(t);
  const unsigned nx = t->bdim.x, ny = t->bdim.y, nz = t->bdim.z;
  if (order) {
    for (unsigned i = 0, n = nx * ny * nz; i < n; i++) {
      unsigned r = order[i];
      t->tid = {r % nx, r / nx % ny, r / (nx * ny)};
      t->rank = r;
      __CL_STEPPED();
      F(std::get<I>(a)...);
    }
    return;
  }
  /* (per thread only its x and rank are stored: lane and warp are the rank's, and what reads
     them in a block run as a loop, __activemask and __lanemask_lt, takes them from the rank) */
  unsigned r = 0;
  for (unsigned z = 0; z < nz; z++) {
    t->tid.z = z;
    for (unsigned y = 0; y < ny; y++) {
      t->tid.y = y;
      for (unsigned x = 0; x < nx; x++, r++) {
        t->tid.x = x, t->rank = r;
        __CL_STEPPED();
        F(std::get<I>(a)...);
      }
    }
  }
}
template <auto F> inline void __cl_block(cl_cpu_thread *t, void **args, const unsigned *order) {
  __cl_block_with<F>(F, t, args, order, std::make_index_sequence<__cl_nparams(F)>{});
}
template <auto F, class... A> inline constexpr cl_cpu_entry __cl_entry_of(void (*f)(A...), int sync) {
  return {reinterpret_cast<void *>(f), &__cl_call<A...>, &__cl_block<F>, (int)sizeof...(A), __cl_sizes<A...>::size,
          __cl_sizes<A...>::align, sync, nullptr, nullptr};
}
template <auto F> inline constexpr cl_cpu_entry __cl_entry(int sync) {
  return __cl_entry_of<F>(F, sync);
}
#if defined(__cpp_impl_coroutine)
/* a kernel with a coroutine twin C */
template <auto F, auto C> inline constexpr cl_cpu_entry __cl_entry_co() {
  cl_cpu_entry e = __cl_entry_of<F>(F, 1);
  e.co_start = &__cl_co_start<C>;
  e.co_resume = &__cl_co_resume;
  return e;
}
#endif
extern "C" {
__attribute__((visibility("default"))) extern const int __cudalua_cpu_abi = CL_CPU_ABI;
__attribute__((visibility("default"))) void __cudalua_cpu_bind(const cl_cpu_rt *rt) { __cl_rt = rt; }
__attribute__((visibility("default"))) void __cudalua_cpu_run(const cl_cpu_entry *e, cl_cpu_thread *t, void **args) {
  __CL_SET_CUR(t);
  e->call(e->fn, args);
}
}
#endif
