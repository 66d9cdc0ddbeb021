/* random.c: host-side precomputation for cuda.random. xoroshiro128+ is linear over GF(2), so
   jumping 2^64 draws ahead is a 128x128 bit matrix J; the device initialises state i as
   J^(start+i) applied to the seeded state, using the matrices J^(2^k) made here. */
#include <string.h>
#include "cl.h"

typedef struct { uint64_t s0, s1; } st;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void next(st *s) {
  uint64_t s0 = s->s0, s1 = s->s1 ^ s0;
  s->s0 = rotl(s0, 55) ^ s1 ^ (s1 << 14);
  s->s1 = rotl(s1, 36);
}

static st jump(st s) {
  static const uint64_t J[2] = {0xbeac0467eba5facbULL, 0xd86b048b86aa9922ULL};
  st r = {0, 0};
  for (int i = 0; i < 2; i++)
    for (int b = 0; b < 64; b++) {
      if (J[i] & (1ULL << b)) { r.s0 ^= s.s0; r.s1 ^= s.s1; }
      next(&s);
    }
  return r;
}

/* column j of a matrix is the image of the state with only bit j set */
static st apply(const uint64_t *m, st s) {
  st r = {0, 0};
  for (int j = 0; j < 128; j++) {
    uint64_t bit = j < 64 ? (s.s0 >> j) & 1 : (s.s1 >> (j - 64)) & 1;
    if (bit) { r.s0 ^= m[2 * j]; r.s1 ^= m[2 * j + 1]; }
  }
  return r;
}

/* xoroshiro_jump_matrices(k) -> string holding J^(2^0) .. J^(2^(k-1)), 256 uint64 each */
static int l_jump_matrices(lua_State *L) {
  lua_Integer k = cl_checkinteger(L, 1);
  cl_argcheck(L, k >= 1 && k <= 64, 1, "1..64 matrices");
  luaL_Buffer b;
  uint64_t *m = (uint64_t *)luaL_buffinitsize(L, &b, (size_t)k * 256 * 8);
  for (int j = 0; j < 128; j++) {
    st e = {j < 64 ? 1ULL << j : 0, j >= 64 ? 1ULL << (j - 64) : 0};
    st c = jump(e);
    m[2 * j] = c.s0; m[2 * j + 1] = c.s1;
  }
  for (lua_Integer i = 1; i < k; i++) {   /* J^(2^i) = J^(2^(i-1)) squared */
    const uint64_t *p = m + (i - 1) * 256;
    uint64_t *q = m + i * 256;
    for (int j = 0; j < 128; j++) {
      st c = {p[2 * j], p[2 * j + 1]};
      st r = apply(p, c);
      q[2 * j] = r.s0; q[2 * j + 1] = r.s1;
    }
  }
  luaL_pushresultsize(&b, (size_t)k * 256 * 8);
  return 1;
}

void cl_open_random(lua_State *L) {
  lua_pushcfunction(L, l_jump_matrices);
  lua_setfield(L, -2, "xoroshiro_jump_matrices");
}
