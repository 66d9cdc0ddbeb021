// cudalua/random.cuh: Numba's xoroshiro128+ generators for CUDA C, draw for draw the same as
// numba.cuda.random for the same seed, subsequence start and thread index.
//   #include <cudalua/random.cuh>
//   __global__ void k(xoroshiro128p_state *states, float *out, int n) {
//     int i = blockIdx.x * blockDim.x + threadIdx.x;
//     if (i < n) out[i] = xoroshiro128p_uniform_float32(states, i);
//   }
// The states come from cuda.random.create_xoroshiro128p_states(n, {seed = ...}).
#pragma once

struct xoroshiro128p_state { unsigned long long s0, s1; };

__device__ __forceinline__ unsigned long long cudalua_rotl(unsigned long long x, unsigned k) {
  return (x << k) | (x >> (64u - k));
}

// the next 64 random bits; advances states[index]
__device__ __forceinline__ unsigned long long xoroshiro128p_next(xoroshiro128p_state *states, long long index) {
  unsigned long long s0 = states[index].s0, s1 = states[index].s1;
  unsigned long long result = s0 + s1;
  s1 ^= s0;
  states[index].s0 = cudalua_rotl(s0, 55) ^ s1 ^ (s1 << 14);
  states[index].s1 = cudalua_rotl(s1, 36);
  return result;
}

// advances states[index] by 2^64 draws
__device__ __forceinline__ void xoroshiro128p_jump(xoroshiro128p_state *states, long long index) {
  const unsigned long long jump[2] = {0xbeac0467eba5facbULL, 0xd86b048b86aa9922ULL};
  unsigned long long s0 = 0, s1 = 0;
  for (int i = 0; i < 2; i++)
    for (int b = 0; b < 64; b++) {
      if (jump[i] & (1ULL << b)) { s0 ^= states[index].s0; s1 ^= states[index].s1; }
      xoroshiro128p_next(states, index);
    }
  states[index].s0 = s0;
  states[index].s1 = s1;
}

__device__ __forceinline__ double cudalua_unit_float64(unsigned long long x) {
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

__device__ __forceinline__ float xoroshiro128p_uniform_float32(xoroshiro128p_state *states, long long index) {
  return (float)cudalua_unit_float64(xoroshiro128p_next(states, index));
}

__device__ __forceinline__ double xoroshiro128p_uniform_float64(xoroshiro128p_state *states, long long index) {
  return cudalua_unit_float64(xoroshiro128p_next(states, index));
}

// Box-Muller, keeping the cosine value; two draws
__device__ __forceinline__ float xoroshiro128p_normal_float32(xoroshiro128p_state *states, long long index) {
  float u1 = xoroshiro128p_uniform_float32(states, index);
  float u2 = xoroshiro128p_uniform_float32(states, index);
  const float two_pi = 6.2831854820251465f;  // float32(2 * pi)
  return sqrtf(-2.0f * logf(u1)) * cosf(two_pi * u2);
}

// as Numba: the uniforms are drawn as float32, the rest is computed in double
__device__ __forceinline__ double xoroshiro128p_normal_float64(xoroshiro128p_state *states, long long index) {
  float u1 = xoroshiro128p_uniform_float32(states, index);
  float u2 = xoroshiro128p_uniform_float32(states, index);
  const double two_pi = 6.283185307179586;
  return sqrt(-2.0 * (double)logf(u1)) * cos(two_pi * (double)u2);
}

// used by cuda.random.create_xoroshiro128p_states: state i = jump^(start + i) of the seeded
// state, from the precomputed matrices of jump^(2^k) (128 columns of two words each); only
// there (CUDALUA_RANDOM_INIT): kernels that include this file for the generators do not get it
#ifdef CUDALUA_RANDOM_INIT
extern "C" __global__ void cudalua_xoroshiro128p_init(xoroshiro128p_state *states, long long n,
    long long z_bits, long long start_bits, const long long *mats_bits) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned long long z = (unsigned long long)z_bits,
      *mats = (const unsigned long long *)mats_bits;  // 64-bit patterns, passed as Lua integers
  unsigned long long s0 = z, s1 = z, e = (unsigned long long)start_bits + (unsigned long long)i;
  for (int k = 0; e; k++, e >>= 1) {
    if (!(e & 1)) continue;
    const unsigned long long *m = mats + (size_t)k * 256;
    unsigned long long r0 = 0, r1 = 0;
    for (int j = 0; j < 64; j++) {
      unsigned long long mask = 0ULL - ((s0 >> j) & 1ULL);
      r0 ^= m[2 * j] & mask; r1 ^= m[2 * j + 1] & mask;
    }
    for (int j = 0; j < 64; j++) {
      unsigned long long mask = 0ULL - ((s1 >> j) & 1ULL);
      r0 ^= m[128 + 2 * j] & mask; r1 ^= m[128 + 2 * j + 1] & mask;
    }
    s0 = r0; s1 = r1;
  }
  states[i].s0 = s0;
  states[i].s1 = s1;
}
#endif
