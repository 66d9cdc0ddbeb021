/* cudalua/cpu/f16.h: what the CPU device's cuda_fp16.h and cuda_bf16.h share: rounding a float
   to a 16-bit float in each of CUDA's modes, bit for bit as a GPU's cvt does (NaN becomes the
   canonical 0x7fff; subnormals kept), and the operators CUDA gives both types. */
#ifndef CUDALUA_CPU_F16_H
#define CUDALUA_CPU_F16_H
#include <cstring>
#include <cmath>

enum __cl_round { __cl_rn, __cl_rz, __cl_rd, __cl_ru };
inline unsigned __cl_fbits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __cl_bitsf(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }

/* does dropping rem (of `shift` bits, below the kept value r) round r's magnitude up? */
inline bool __cl_round_up(unsigned r, unsigned rem, unsigned half, bool neg, __cl_round m) {
  if (m == __cl_rn) return rem > half || (rem == half && (r & 1));
  if (m == __cl_rz || rem == 0) return false;
  return (m == __cl_ru) != neg;
}

/* IEEE binary16: 5 exponent bits (bias 15), 10 fraction bits */
inline unsigned short __cl_f2h(float f, __cl_round m) {
  unsigned u = __cl_fbits(f), a = u & 0x7fffffffu;
  unsigned short sign = (unsigned short)((u >> 16) & 0x8000u);
  bool neg = sign != 0;
  if (a > 0x7f800000u) return 0x7fff;
  if (a == 0x7f800000u) return sign | 0x7c00;
  /* the largest finite value, or infinity, for a magnitude past it in mode m */
  unsigned short over = (m == __cl_rn || (m == __cl_ru && !neg) || (m == __cl_rd && neg)) ? 0x7c00 : 0x7bff;
  int e = (int)(a >> 23) - 127;
  if (e > 15) return sign | over;
  unsigned mant = a < 0x00800000u ? a : ((a & 0x7fffffu) | 0x800000u);   /* float subnormals: e = -127 */
  if (a < 0x00800000u) e = -126;
  /* bits of mant below the half's last place: 13 for a normal half, more for a subnormal */
  int shift = 13 + (e < -14 ? -14 - e : 0);
  unsigned r, rem, half;
  if (shift > 31) { r = 0; rem = mant ? 1 : 0; half = 0x80000000u; }   /* far below: only the sign of rem counts */
  else { r = mant >> shift; rem = mant & ((1u << shift) - 1); half = 1u << (shift - 1); }
  if (__cl_round_up(r, rem, half, neg, m)) r++;
  /* a normal half: (biased exponent - 1) << 10 plus r with its leading bit; a carry in r
     steps the exponent (to infinity past the largest) */
  unsigned h = e >= -14 ? ((unsigned)(e + 14) << 10) + r : r;
  if (h >= 0x7c00u) return sign | over;
  return (unsigned short)(sign | h);
}
inline float __cl_h2f(unsigned short h) {
  unsigned sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31) return __cl_bitsf(sign | 0x7f800000u | (m << 13));
  if (e == 0) { float v = std::ldexp((float)m, -24); return sign ? -v : v; }
  return __cl_bitsf(sign | ((e + 112) << 23) | (m << 13));
}

/* bfloat16: a float's upper half */
inline unsigned short __cl_f2bf(float f, __cl_round m) {
  unsigned u = __cl_fbits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  bool neg = (u >> 31) != 0;
  unsigned r = u >> 16, rem = u & 0xffffu;
  /* a carry steps the exponent (to infinity past the largest: only in the modes that give it) */
  if (__cl_round_up(r, rem, 0x8000u, neg, m)) r++;
  return (unsigned short)r;
}
inline float __cl_bf2f(unsigned short b) { return __cl_bitsf((unsigned)b << 16); }

/* T's constructors, conversions and operators (a 16-bit float held in __x), through float
   (exact: a float holds every T and the result of one operation on two, rounded once) */
#define __CL_F16_MEMBERS(T, TO, FROM) \
  T() = default; \
  T(float f) : __x(FROM(f, __cl_rn)) {} \
  T(double f) : __x(FROM((float)f, __cl_rn)) {} \
  T(int v) : __x(FROM((float)v, __cl_rn)) {} \
  T(unsigned v) : __x(FROM((float)v, __cl_rn)) {} \
  T(short v) : __x(FROM((float)v, __cl_rn)) {} \
  T(unsigned short v) : __x(FROM((float)v, __cl_rn)) {} \
  T(long long v) : __x(FROM((float)v, __cl_rn)) {} \
  T(unsigned long long v) : __x(FROM((float)v, __cl_rn)) {} \
  T(long v) : __x(FROM((float)v, __cl_rn)) {} \
  T(unsigned long v) : __x(FROM((float)v, __cl_rn)) {} \
  operator float() const { return TO(__x); } \
  explicit operator bool() const { return (__x & 0x7fff) != 0; } \
  T &operator+=(const T &o) { return *this = T((float)*this + (float)o); } \
  T &operator-=(const T &o) { return *this = T((float)*this - (float)o); } \
  T &operator*=(const T &o) { return *this = T((float)*this * (float)o); } \
  T &operator/=(const T &o) { return *this = T((float)*this / (float)o); } \
  T &operator++() { return *this += T(1.0f); } \
  T &operator--() { return *this -= T(1.0f); } \
  T operator++(int) { T t = *this; ++*this; return t; } \
  T operator--(int) { T t = *this; --*this; return t; }

#define __CL_F16_OPERATORS(T) \
  inline T operator+(const T &a, const T &b) { return T((float)a + (float)b); } \
  inline T operator-(const T &a, const T &b) { return T((float)a - (float)b); } \
  inline T operator*(const T &a, const T &b) { return T((float)a * (float)b); } \
  inline T operator/(const T &a, const T &b) { return T((float)a / (float)b); } \
  inline T operator-(const T &a) { T r = a; r.__x ^= 0x8000; return r; } \
  inline T operator+(const T &a) { return a; } \
  inline bool operator==(const T &a, const T &b) { return (float)a == (float)b; } \
  inline bool operator!=(const T &a, const T &b) { return (float)a != (float)b; } \
  inline bool operator<(const T &a, const T &b) { return (float)a < (float)b; } \
  inline bool operator<=(const T &a, const T &b) { return (float)a <= (float)b; } \
  inline bool operator>(const T &a, const T &b) { return (float)a > (float)b; } \
  inline bool operator>=(const T &a, const T &b) { return (float)a >= (float)b; }
#endif
