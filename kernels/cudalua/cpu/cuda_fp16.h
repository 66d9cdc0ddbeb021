/* cuda_fp16.h for cudalua's CPU device: __half and __half2 as CUDA defines them (16 bits,
   conversions rounding as a GPU's cvt does, arithmetic through float, rounded once) */
#ifndef CUDALUA_CPU_CUDA_FP16_H
#define CUDALUA_CPU_CUDA_FP16_H
#include "cudalua/cpu/f16.h"

struct __half_raw { unsigned short x; };
struct alignas(2) __half {
  unsigned short __x;
  __CL_F16_MEMBERS(__half, __cl_h2f, __cl_f2h)
  __half(const __half_raw &r) : __x(r.x) {}
  operator __half_raw() const { return {__x}; }
};
__CL_F16_OPERATORS(__half)
struct __half2_raw { unsigned short x, y; };
struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  __half2(const __half &a, const __half &b) : x(a), y(b) {}
  __half2(const __half2_raw &r) : x(__half_raw{r.x}), y(__half_raw{r.y}) {}
};
typedef __half half;
typedef __half2 half2;

inline __half __cl_h(unsigned short b) { return __half_raw{b}; }
inline __half __float2half(float f) { return __cl_h(__cl_f2h(f, __cl_rn)); }
inline __half __float2half_rn(float f) { return __cl_h(__cl_f2h(f, __cl_rn)); }
inline __half __float2half_rz(float f) { return __cl_h(__cl_f2h(f, __cl_rz)); }
inline __half __float2half_rd(float f) { return __cl_h(__cl_f2h(f, __cl_rd)); }
inline __half __float2half_ru(float f) { return __cl_h(__cl_f2h(f, __cl_ru)); }
inline float __half2float(__half h) { return __cl_h2f(h.__x); }
/* a double rounds once, as the GPU's cvt.rn.f16.f64: through float only where that is exact */
inline __half __double2half(double d) {
  float f = (float)d;
  if ((double)f != d && !std::isnan(d) && std::fabs(d) < 65520.0) {
    /* the float's last bit keeps what was dropped (round to odd), so the second rounding is right */
    unsigned u = __cl_fbits(f);
    if (std::fabs((double)f) > std::fabs(d)) u--;   /* toward zero first */
    u |= 1;
    f = __cl_bitsf(u);
  }
  return __float2half(f);
}
inline __half __int2half_rn(int i) { return __float2half((float)i); }
inline __half __uint2half_rn(unsigned i) { return __float2half((float)i); }
inline __half __short2half_rn(short i) { return __float2half((float)i); }
inline __half __ushort2half_rn(unsigned short i) { return __float2half((float)i); }
inline __half __ll2half_rn(long long i) { return __float2half((float)i); }
inline int __half2int_rz(__half h) { return (int)__half2float(h); }
inline int __half2int_rn(__half h) { return (int)std::nearbyint(__half2float(h)); }
inline unsigned __half2uint_rz(__half h) { return (unsigned)__half2float(h); }
inline short __half2short_rz(__half h) { return (short)__half2float(h); }
inline long long __half2ll_rz(__half h) { return (long long)__half2float(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __ushort_as_half(unsigned short b) { return __cl_h(b); }
inline __half __short_as_half(short b) { return __cl_h((unsigned short)b); }

inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hneg(__half a) { return -a; }
inline __half __habs(__half a) { return __cl_h(a.__x & 0x7fff); }
inline __half __hfma(__half a, __half b, __half c) {
  return __double2half(std::fma((double)__half2float(a), (double)__half2float(b), (double)__half2float(c)));
}
inline __half __hadd_sat(__half a, __half b) { float r = __half2float(a + b); return __float2half(r < 0 ? 0 : r > 1 ? 1 : r); }
inline bool __heq(__half a, __half b) { return a == b; }
inline bool __hne(__half a, __half b) { return a != b; }
inline bool __hlt(__half a, __half b) { return a < b; }
inline bool __hle(__half a, __half b) { return a <= b; }
inline bool __hgt(__half a, __half b) { return a > b; }
inline bool __hge(__half a, __half b) { return a >= b; }
inline bool __hisnan(__half a) { return (a.__x & 0x7fff) > 0x7c00; }
inline int __hisinf(__half a) { return (a.__x & 0x7fff) == 0x7c00 ? (a.__x & 0x8000 ? -1 : 1) : 0; }
inline __half __hmax(__half a, __half b) { return __float2half(std::fmax(__half2float(a), __half2float(b))); }
inline __half __hmin(__half a, __half b) { return __float2half(std::fmin(__half2float(a), __half2float(b))); }
inline __half hsqrt(__half a) { return __float2half(std::sqrt(__half2float(a))); }
inline __half hrsqrt(__half a) { return __float2half(1.0f / std::sqrt(__half2float(a))); }
inline __half hrcp(__half a) { return __float2half(1.0f / __half2float(a)); }
inline __half hexp(__half a) { return __float2half(std::exp(__half2float(a))); }
inline __half hlog(__half a) { return __float2half(std::log(__half2float(a))); }
inline __half hsin(__half a) { return __float2half(std::sin(__half2float(a))); }
inline __half hcos(__half a) { return __float2half(std::cos(__half2float(a))); }
inline __half htanh(__half a) { return __float2half(std::tanh(__half2float(a))); }
inline __half hfloor(__half a) { return __float2half(std::floor(__half2float(a))); }
inline __half hceil(__half a) { return __float2half(std::ceil(__half2float(a))); }
inline __half htrunc(__half a) { return __float2half(std::trunc(__half2float(a))); }
inline __half hrint(__half a) { return __float2half(std::nearbyint(__half2float(a))); }

inline __half2 make_half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
inline __half2 __half2half2(__half a) { return __half2(a, a); }
inline __half2 __float2half2_rn(float f) { return __half2half2(__float2half(f)); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2(__float2half(a), __float2half(b)); }
inline __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2(a.x, b.x); }
inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2(a.y, b.y); }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(a.x + b.x, a.y + b.y); }
inline __half2 __hsub2(__half2 a, __half2 b) { return __half2(a.x - b.x, a.y - b.y); }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(a.x * b.x, a.y * b.y); }
inline __half2 __h2div(__half2 a, __half2 b) { return __half2(a.x / b.x, a.y / b.y); }
inline __half2 __hneg2(__half2 a) { return __half2(-a.x, -a.y); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)); }
inline __half2 operator+(const __half2 &a, const __half2 &b) { return __hadd2(a, b); }
inline __half2 operator-(const __half2 &a, const __half2 &b) { return __hsub2(a, b); }
inline __half2 operator*(const __half2 &a, const __half2 &b) { return __hmul2(a, b); }
inline __half2 operator/(const __half2 &a, const __half2 &b) { return __h2div(a, b); }

/* atomics on 16 bits: a compare-and-swap loop */
inline __half atomicAdd(__half *p, __half v) {
  unsigned short *q = &p->__x, o = __atomic_load_n(q, __ATOMIC_RELAXED), n;
  do { n = (__cl_h(o) + v).__x; } while (!__atomic_compare_exchange_n(q, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return __cl_h(o);
}
inline __half2 atomicAdd(__half2 *p, __half2 v) {
  unsigned *q = reinterpret_cast<unsigned *>(p), o = __atomic_load_n(q, __ATOMIC_RELAXED), n;
  __half2 a, r;
  do { std::memcpy(&a, &o, 4); r = a + v; std::memcpy(&n, &r, 4); }
  while (!__atomic_compare_exchange_n(q, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  std::memcpy(&a, &o, 4);
  return a;
}
#define CUDART_INF_FP16 __ushort_as_half((unsigned short)0x7c00U)
#define CUDART_NAN_FP16 __ushort_as_half((unsigned short)0x7fffU)
#define CUDART_ZERO_FP16 __ushort_as_half((unsigned short)0x0000U)
#define CUDART_ONE_FP16 __ushort_as_half((unsigned short)0x3c00U)
#define CUDART_MAX_NORMAL_FP16 __ushort_as_half((unsigned short)0x7bffU)
#endif
