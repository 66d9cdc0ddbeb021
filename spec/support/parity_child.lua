-- spec/support/parity_child.lua SEED: the parity spec's kernels (spec 41), run on whatever
-- device this process has (a GPU, or the CPU device with CUDALUA_DEVICE=cpu); prints one line
-- per result: "name kind v1 v2 ...", integers in decimal, floats as the hex of their bits
-- (string.pack), so the spec can compare bit for bit or within a tolerance.
package.path = "./?.lua;" .. package.path
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local seed = assert(tonumber(arg[1]), "give a seed")
math.randomseed(seed)

local SRC = [[
#include <cudalua/grid.cuh>
#include <cudalua/random.cuh>
extern "C" __global__ void draws(xoroshiro128p_state *s, float *u32, double *u64, float *n32, double *n64, int n) {
  int i = grid(1);
  if (i >= n) return;
  for (int j = 0; j < 4; j++) {
    u32[i * 4 + j] = xoroshiro128p_uniform_float32(s, i);
    u64[i * 4 + j] = xoroshiro128p_uniform_float64(s, i);
    n32[i * 4 + j] = xoroshiro128p_normal_float32(s, i);
    n64[i * 4 + j] = xoroshiro128p_normal_float64(s, i);
  }
}
// integer arithmetic a GPU and a CPU must agree on bit for bit: shifts, wrap-around, division
extern "C" __global__ void mix(const int *x, unsigned *h, long long *q, int n) {
  int i = grid(1);
  if (i >= n) return;
  unsigned v = (unsigned)x[i] * 2654435761u;
  v ^= v >> 13; v = (v << 7) | (v >> 25);
  h[i] = v + __popc(v) + __clz(v | 1) + __ffs(v);
  q[i] = (long long)x[i] * x[(i + 1) % n] / 7 - (x[i] % 5);
}
// a block's sum: shared memory, __syncthreads, then the last warp's shuffles
extern "C" __global__ void block_sum(const int *x, long long *out, int n) {
  __shared__ long long part[256];
  int t = threadIdx.x, i = blockIdx.x * 256 + t;
  part[t] = i < n ? x[i] : 0;
  __syncthreads();
  for (int s = 128; s >= 32; s >>= 1) {
    if (t < s) part[t] += part[t + s];
    __syncthreads();
  }
  if (t < 32) {
    long long v = part[t];
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, d);
    if (t == 0) out[blockIdx.x] = v;
  }
}
// a histogram by atomics, and each warp's ballot of its negative values
extern "C" __global__ void hist(const int *x, unsigned *bins, unsigned *ballots, int n) {
  int i = grid(1);
  bool neg = i < n && x[i] < 0;
  unsigned b = __ballot_sync(0xffffffffu, neg);
  if (i < n) atomicAdd(&bins[((unsigned)x[i]) % 16], 1u);
  if ((threadIdx.x & 31) == 0 && i < n) ballots[i / 32] = b;
}
extern "C" __global__ void saxpy(float *y, const float *x, float a, int n) {
  int i = grid(1);
  if (i < n) y[i] = a * x[i] + y[i];
}
]]

local function ints(name, t)
  local o = {}
  for i = 1, #t do o[i] = ("%d"):format(t[i]) end
  print(name .. " int " .. table.concat(o, " "))
end
local function floats(name, t, fmt)
  local o = {}
  for i = 1, #t do o[i] = (string.pack(fmt, t[i])):gsub(".", function(c) return ("%02x"):format(c:byte()) end) end
  print(name .. " " .. fmt .. " " .. table.concat(o, " "))
end

local m = cuda.compile(SRC, { name = "parity.cu" })
local n = 1000 + math.random(0, 500)
local states = cuda.random.create_xoroshiro128p_states(n, { seed = seed })
local u32, u64 = cuda.device_array(4 * n, "float32"), cuda.device_array(4 * n, "float64")
local n32, n64 = cuda.device_array(4 * n, "float32"), cuda.device_array(4 * n, "float64")
m.draws[{ (n + 127) // 128, 128 }](states, u32, u64, n32, n64, n)
floats("uniform32", u32:copy_to_host(), "<f")
floats("uniform64", u64:copy_to_host(), "<d")
floats("normal32", n32:copy_to_host(), "<f")
floats("normal64", n64:copy_to_host(), "<d")

local xs = {}
for i = 1, n do xs[i] = math.random(-2 ^ 30, 2 ^ 30) end
local x = cuda.to_device(xs, "int32")
local h, q = cuda.device_array(n, "uint32"), cuda.device_array(n, "int64")
m.mix[{ (n + 255) // 256, 256 }](x, h, q, n)
ints("mix_h", h:copy_to_host())
ints("mix_q", q:copy_to_host())
local nb = (n + 255) // 256
local sums = cuda.device_array(nb, "int64")
m.block_sum[{ nb, 256 }](x, sums, n)
ints("block_sum", sums:copy_to_host())
local bins, ballots = cuda.zeros(16, "uint32"), cuda.zeros((n + 31) // 32, "uint32")
m.hist[{ (n + 127) // 128, 128 }](x, bins, ballots, n)
ints("hist", bins:copy_to_host())
ints("ballots", ballots:copy_to_host())

-- the helpers on integer data: reduce and elementwise
local x64 = cuda.to_device(xs, "int64")
ints("reduce", { cuda.reduce("a + b")(x64), cuda.reduce("a > b ? a : b")(x64), cuda.reduce("a < b ? a : b")(x) })
local ew = cuda.elementwise("int64 a, int64 b", "int64 z", "z = a * 3 - b / 5 + (a ^ b)", "parity_ew")
local ys = {}
for i = 1, n do ys[i] = math.random(-2 ^ 40, 2 ^ 40) end
local z = cuda.device_array(n, "int64")
ew(x64, cuda.to_device(ys, "int64"), z)
ints("elementwise", z:copy_to_host())

-- floats: a GPU fuses a*x+y into one rounding (fma), the host compiler may not
local fx, fy = {}, {}
for i = 1, n do fx[i], fy[i] = math.random() * 200 - 100, math.random() * 200 - 100 end
local yf = cuda.to_device(fy, "float32")
m.saxpy[{ (n + 255) // 256, 256 }](yf, cuda.to_device(fx, "float32"), 1.75, n)
floats("saxpy", yf:copy_to_host(), "<f")
print("kind " .. cuda.devices()[1].kind)
