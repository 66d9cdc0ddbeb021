/* cuComplex.h for cudalua's CPU device: complex numbers as float2 and double2, with CUDA's
   functions (division and the absolute value scaled as CUDA's are, against overflow) */
#ifndef CUDALUA_CPU_CUCOMPLEX_H
#define CUDALUA_CPU_CUCOMPLEX_H
#include <cmath>

#define __CL_CUCOMPLEX(T, V, S, MAX) \
  inline T cuCreal##S(V x) { return x.x; } \
  inline T cuCimag##S(V x) { return x.y; } \
  inline V make_cu##S##Complex_(T r, T i) { V v; v.x = r; v.y = i; return v; } \
  inline V cuConj##S(V x) { return make_cu##S##Complex_(x.x, -x.y); } \
  inline V cuCadd##S(V a, V b) { return make_cu##S##Complex_(a.x + b.x, a.y + b.y); } \
  inline V cuCsub##S(V a, V b) { return make_cu##S##Complex_(a.x - b.x, a.y - b.y); } \
  inline V cuCmul##S(V a, V b) { return make_cu##S##Complex_(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); } \
  inline V cuCdiv##S(V a, V b) { \
    T s = std::fabs(b.x) + std::fabs(b.y), oos = (T)1 / s; \
    T ars = a.x * oos, ais = a.y * oos, brs = b.x * oos, bis = b.y * oos; \
    s = brs * brs + bis * bis; oos = (T)1 / s; \
    return make_cu##S##Complex_((ars * brs + ais * bis) * oos, (ais * brs - ars * bis) * oos); \
  } \
  inline T cuCabs##S(V x) { \
    T a = std::fabs(x.x), b = std::fabs(x.y), v = a > b ? a : b, w = a > b ? b : a; \
    if (v == 0 || v > MAX || w > MAX) return v + w; \
    T t = w / v; \
    return v * std::sqrt((T)1 + t * t); \
  } \
  inline V cuCfma##S(V x, V y, V d) { \
    T re = (x.x * y.x) + d.x, im = (x.x * y.y) + d.y; \
    return make_cu##S##Complex_(-(x.y * y.y) + re, (x.y * y.x) + im); \
  }

typedef float2 cuFloatComplex;
typedef double2 cuDoubleComplex;
typedef cuFloatComplex cuComplex;
__CL_CUCOMPLEX(float, cuFloatComplex, f, 3.402823466e38f)
__CL_CUCOMPLEX(double, cuDoubleComplex, , 1.79769313486231570e+308)
inline cuFloatComplex make_cuFloatComplex(float r, float i) { return make_cufComplex_(r, i); }
inline cuDoubleComplex make_cuDoubleComplex(double r, double i) { return make_cuComplex_(r, i); }
inline cuComplex make_cuComplex(float r, float i) { return make_cuFloatComplex(r, i); }
inline cuDoubleComplex cuComplexFloatToDouble(cuFloatComplex c) { return make_cuDoubleComplex(c.x, c.y); }
inline cuFloatComplex cuComplexDoubleToFloat(cuDoubleComplex c) { return make_cuFloatComplex((float)c.x, (float)c.y); }
#endif
