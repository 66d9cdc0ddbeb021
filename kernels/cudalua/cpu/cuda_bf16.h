/* cuda_bf16.h for cudalua's CPU device: __nv_bfloat16 and __nv_bfloat162 as CUDA defines them
   (a float's upper 16 bits, conversions rounding as a GPU's cvt does, arithmetic through float) */
#ifndef CUDALUA_CPU_CUDA_BF16_H
#define CUDALUA_CPU_CUDA_BF16_H
#include "cudalua/cpu/f16.h"

struct __nv_bfloat16_raw { unsigned short x; };
struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
  __CL_F16_MEMBERS(__nv_bfloat16, __cl_bf2f, __cl_f2bf)
  __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
  operator __nv_bfloat16_raw() const { return {__x}; }
};
__CL_F16_OPERATORS(__nv_bfloat16)
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  __nv_bfloat162(const __nv_bfloat16 &a, const __nv_bfloat16 &b) : x(a), y(b) {}
};
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 __cl_bf(unsigned short b) { return __nv_bfloat16_raw{b}; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __cl_bf(__cl_f2bf(f, __cl_rn)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __cl_bf(__cl_f2bf(f, __cl_rn)); }
inline __nv_bfloat16 __float2bfloat16_rz(float f) { return __cl_bf(__cl_f2bf(f, __cl_rz)); }
inline __nv_bfloat16 __float2bfloat16_rd(float f) { return __cl_bf(__cl_f2bf(f, __cl_rd)); }
inline __nv_bfloat16 __float2bfloat16_ru(float f) { return __cl_bf(__cl_f2bf(f, __cl_ru)); }
inline float __bfloat162float(__nv_bfloat16 b) { return __cl_bf2f(b.__x); }
/* a double rounds once: to odd in float first, so that the second rounding is right */
inline __nv_bfloat16 __double2bfloat16(double d) {
  float f = (float)d;
  if ((double)f != d && !std::isnan(d) && !std::isinf(f)) {
    unsigned u = __cl_fbits(f);
    if (std::fabs((double)f) > std::fabs(d)) u--;   /* toward zero first */
    f = __cl_bitsf(u | 1);
  }
  return __float2bfloat16(f);
}
inline __nv_bfloat16 __int2bfloat16_rn(int i) { return __float2bfloat16((float)i); }
inline int __bfloat162int_rz(__nv_bfloat16 b) { return (int)__bfloat162float(b); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 b) { return (short)b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return __cl_bf(b); }
inline __nv_bfloat16 __short_as_bfloat16(short b) { return __cl_bf((unsigned short)b); }

inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return a - b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return a / b; }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return -a; }
inline __nv_bfloat16 __habs(__nv_bfloat16 a) { return __cl_bf(a.__x & 0x7fff); }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __double2bfloat16(std::fma((double)__bfloat162float(a), (double)__bfloat162float(b), (double)__bfloat162float(c)));
}
inline bool __heq(__nv_bfloat16 a, __nv_bfloat16 b) { return a == b; }
inline bool __hne(__nv_bfloat16 a, __nv_bfloat16 b) { return a != b; }
inline bool __hlt(__nv_bfloat16 a, __nv_bfloat16 b) { return a < b; }
inline bool __hle(__nv_bfloat16 a, __nv_bfloat16 b) { return a <= b; }
inline bool __hgt(__nv_bfloat16 a, __nv_bfloat16 b) { return a > b; }
inline bool __hge(__nv_bfloat16 a, __nv_bfloat16 b) { return a >= b; }
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fff) > 0x7f80; }
inline int __hisinf(__nv_bfloat16 a) { return (a.__x & 0x7fff) == 0x7f80 ? (a.__x & 0x8000 ? -1 : 1) : 0; }
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(std::fmax((float)a, (float)b)); }
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(std::fmin((float)a, (float)b)); }
inline __nv_bfloat16 hsqrt(__nv_bfloat16 a) { return __float2bfloat16(std::sqrt((float)a)); }
inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __float2bfloat16(std::exp((float)a)); }
inline __nv_bfloat16 hlog(__nv_bfloat16 a) { return __float2bfloat16(std::log((float)a)); }

inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return __nv_bfloat162(__float2bfloat16(a), __float2bfloat16(b)); }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return __floats2bfloat162_rn(a, a); }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return make_float2((float)h.x, (float)h.y); }
inline float __low2float(__nv_bfloat162 h) { return (float)h.x; }
inline float __high2float(__nv_bfloat162 h) { return (float)h.y; }
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(a.x + b.x, a.y + b.y); }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162(a.x * b.x, a.y * b.y); }

inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v) {
  unsigned short *q = &p->__x, o = __atomic_load_n(q, __ATOMIC_RELAXED), n;
  do { n = (__cl_bf(o) + v).__x; } while (!__atomic_compare_exchange_n(q, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return __cl_bf(o);
}
#define CUDART_INF_BF16 __ushort_as_bfloat16((unsigned short)0x7f80U)
#define CUDART_NAN_BF16 __ushort_as_bfloat16((unsigned short)0x7fffU)
#endif
