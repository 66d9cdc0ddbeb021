// cudalua/reduce.cuh: the kernel behind cuda.reduce. One launch reduces the whole input and
// keeps the order of the elements: the result is x1 op x2 op ... op xn for any associative op,
// commutative or not.
//   * each warp owns a contiguous run of tiles; in a tile each lane reads one 16-byte vector
//     of V contiguous elements (the warp's loads are coalesced), reduces it in order, then the
//     warp combines its lanes in order (adjacent pairs first) and appends the tile to its
//     running value; UN tiles are loaded before the first is reduced, to keep loads in flight;
//   * COMM (an op known to commute, such as a + b): each lane folds its own column of the
//     warp's tiles instead, and the warp combines its lanes once, at the end;
//   * warps, then blocks, are combined in order; the last block to finish (a ticket counter)
//     combines the blocks' values and writes op(init, total); it resets the counter for reuse.
#pragma once

namespace cudalua {

template <typename T>
__device__ __forceinline__ T shfl_down(T v, int o) {
  if constexpr (sizeof(T) % 8 == 0) {   // 8 bytes, or complex128's two 8-byte halves
    unsigned long long u[sizeof(T) / 8];
    memcpy(u, &v, sizeof(T));
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 8); i++) u[i] = __shfl_down_sync(0xffffffffu, u[i], o);
    memcpy(&v, u, sizeof(T));
  } else {
    unsigned int u = 0;
    memcpy(&u, &v, sizeof(T));
    u = __shfl_down_sync(0xffffffffu, u, o);
    memcpy(&v, &u, sizeof(T));
  }
  return v;
}

// lanes [0, k) hold values in order; lane 0 gets their ordered combination
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op, int k) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    T w = shfl_down(v, o);
    if ((lane & (2 * o - 1)) == 0 && lane + o < k) v = op(v, w);
  }
  return v;
}

// like warp_reduce, but any lane may be empty (has == false)
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce_flagged(T v, bool &has, Op op) {
  int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    T w = shfl_down(v, o);
    bool wh = __shfl_down_sync(0xffffffffu, (int)has, o) != 0;
    if ((lane & (2 * o - 1)) == 0 && lane + o < 32 && wh) {
      v = has ? op(v, w) : w;
      has = true;
    }
  }
  return v;
}

template <typename T, int V>
struct alignas(sizeof(T) * V) vec_t { T v[V]; };

constexpr int REDUCE_BLOCK = 256;

// the block's threads hold (v, has) in thread order; thread 0 gets the ordered combination
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce_flagged(T v, bool &has, Op op) {
  __shared__ alignas(16) unsigned char buf[32 * sizeof(T)];
  __shared__ int hbuf[32];
  T *val = reinterpret_cast<T *>(buf);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce_flagged(v, has, op);
  if (lane == 0) { val[warp] = v; hbuf[warp] = has; }
  __syncthreads();
  if (warp == 0) {
    has = lane < REDUCE_BLOCK / 32 ? hbuf[lane] != 0 : false;
    if (has) v = val[lane];
    v = warp_reduce_flagged(v, has, op);
  }
  return v;
}

// tiles t..t+UN-1 of a warp's run (up to t1): lane's 16-byte vector of each, loads in flight at once
template <typename vec, int UN>
__device__ __forceinline__ void load_tiles(vec (&r)[UN], const vec *base, long long t, long long t1,
                                           int lane) {
#pragma unroll
  for (int u = 0; u < UN; u++)
    if (t + u < t1) r[u] = base[(t + u) * 32 + lane];
}

template <typename T, typename Op, int V, int UN, bool COMM = false>
__global__ void __launch_bounds__(REDUCE_BLOCK)
reduce_kernel(const T *x, long long n, T init, int use_init, T *out, T *partials,
              unsigned int *counter) {
  // use_init: bit 0 applies init; the bits above, when not 0, are a value a single-block
  // launch stores in *counter once *out is written, for a host spinning on mapped memory
  Op op;
  constexpr int W = REDUCE_BLOCK / 32;
  constexpr long long TILE = 32LL * V;  // a tile: one 16-byte vector per lane, coalesced
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long gw = (long long)blockIdx.x * W + warp, GW = (long long)gridDim.x * W;
  long long ntiles = n / TILE;
  long long t0 = gw * ntiles / GW, t1 = (gw + 1) * ntiles / GW;
  T acc = T();
  bool has = false;
  typedef vec_t<T, V> vec;
  const vec *base = reinterpret_cast<const vec *>(x);
  if constexpr (COMM) {
    // a commutative op: each lane folds its own column of the warp's tiles, V chains at once,
    // and the warp combines its lanes once at the end (not once per tile)
    if (t0 < t1) {
      vec a = base[t0 * 32 + lane];
      for (long long t = t0 + 1; t < t1; t += UN) {
        vec r[UN];
        load_tiles(r, base, t, t1, lane);
#pragma unroll
        for (int u = 0; u < UN; u++)
          if (t + u < t1) {
#pragma unroll
            for (int j = 0; j < V; j++) a.v[j] = op(a.v[j], r[u].v[j]);
          }
      }
      T s = a.v[0];
#pragma unroll
      for (int j = 1; j < V; j++) s = op(s, a.v[j]);
      acc = warp_reduce(s, op, 32);
      has = true;
    }
  } else {
    for (long long t = t0; t < t1; t += UN) {
      vec r[UN];  // UN tiles' loads in flight before any is reduced
      load_tiles(r, base, t, t1, lane);
#pragma unroll
      for (int u = 0; u < UN; u++) {
        if (t + u >= t1) break;
        T s = r[u].v[0];
#pragma unroll
        for (int j = 1; j < V; j++) s = op(s, r[u].v[j]);
        s = warp_reduce(s, op, 32);
        acc = has ? op(acc, s) : s;
        has = true;
      }
    }
  }
  if (gw == GW - 1 && ntiles * TILE < n) {
    // the elements after the last whole tile (fewer than TILE): a contiguous run per lane
    long long b = ntiles * TILE;
    int rem = (int)(n - b), per = (rem + 31) / 32, k = (rem + per - 1) / per;
    int a = lane * per, e = min(a + per, rem);
    T s = T();
    if (a < e) {
      s = x[b + a];
      for (int j = a + 1; j < e; j++) s = op(s, x[b + j]);
    }
    s = warp_reduce(s, op, k);
    acc = has ? op(acc, s) : s;
    has = true;
  }
  if (lane != 0) has = false;  // lane 0 holds the warp's value
  T v = block_reduce_flagged(acc, has, op);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) {
      *out = has ? ((use_init & 1) ? op(init, v) : v) : init;
      if (use_init >> 1) {  // a host waits on this flag (mapped memory) instead of the stream
        __threadfence_system();
        *(volatile unsigned int *)counter = (unsigned int)(use_init >> 1);
      }
    }
    return;
  }
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = v;  // with several blocks every block has tiles (see reduce.lua)
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // the last block: each thread takes a contiguous run of partials, in order
  int G = gridDim.x, per = (G + REDUCE_BLOCK - 1) / REDUCE_BLOCK;
  int a = threadIdx.x * per, e = min(a + per, G);
  has = false;
  T s = T();
  for (int i = a; i < e; i++) {
    T p = partials[i];  // this block never read them before: no stale cache lines
    s = has ? op(s, p) : p;
    has = true;
  }
  __syncthreads();  // the shared buffers are reused
  v = block_reduce_flagged(s, has, op);
  if (threadIdx.x == 0) {
    *out = (use_init & 1) ? op(init, v) : v;
    *counter = 0;
  }
}

}  // namespace cudalua
