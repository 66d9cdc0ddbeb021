-- cpu_device.lua: the CPU device's speed (issue 29's targets). Run it on the CPU device:
--   CUDALUA_DEVICE=cpu lua5.4 bench/cpu_device.lua
-- Rows (one "name value" per line; times are the best of BENCH_REPS, default 5):
--   saxpy_cpu_ms          saxpy over 2^24 floats on the CPU device (no __syncthreads)
--   saxpy_c1_ms           the same loop in C (cc -O2), one thread
--   saxpy_cn_ms           the same loop in C, on as many threads as the CPU device's pool
--   saxpy_ratio           saxpy_cpu_ms / saxpy_cn_ms (target: <= 2)
--   reduce_melem_s        a shared-memory block reduction (256 threads, __syncthreads tree,
--                         then __shfl_down_sync in the last warp): M elements/s
--   reduce_melem_s_core   the same per pool thread (target: >= 6.5)
--   pi_msamples_s         Monte-Carlo pi with cudalua/random.cuh: M samples/s
-- Env: BENCH_REPS, CUDALUA_CPU_THREADS (the pool's size; also the C loop's threads).
package.cpath = "./?.so;" .. package.cpath
package.path = "./?.lua;" .. package.path
local cuda = require "cudalua"

local REPS = tonumber(os.getenv("BENCH_REPS")) or 5
local THREADS = tonumber(os.getenv("CUDALUA_CPU_THREADS")) or nil
local function out(k, v) io.write(("%-22s %.3f\n"):format(k, v)); io.flush() end
local function note(s) io.write("# " .. s .. "\n"); io.flush() end

local function best(f)
  local b = math.huge
  for _ = 1, REPS do
    local t0 = cuda.time()
    f()
    b = math.min(b, cuda.time() - t0)
  end
  return b
end

local function cores()
  if THREADS then return THREADS end
  local p = io.popen("nproc")
  local n = tonumber(p:read("l"))
  p:close()
  return n or 1
end

-- ---- saxpy ----
local N = 1 << 24
local saxpy = cuda.kernel([[
extern "C" __global__ void saxpy(float a, const float *x, const float *y, float *z, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = a * x[i] + y[i];
}]], "saxpy")
local x = cuda.device_array(N, cuda.float32)
local y = cuda.device_array(N, cuda.float32)
local z = cuda.device_array(N, cuda.float32)
x:fill(1.5); y:fill(2)
saxpy[{ N // 256, 256 }](3, x, y, z, N); cuda.synchronize()
local t = best(function() saxpy[{ N // 256, 256 }](3, x, y, z, N); cuda.synchronize() end)
out("saxpy_cpu_ms", t * 1000)

-- the C loop: the same arrays' sizes, first-touched, best of REPS, on 1 and on N threads
local C = [[
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static float *x, *y, *z; static long n; static int nt;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *part(void *a) { long k = (long)a, lo = n * k / nt, hi = n * (k + 1) / nt;
  for (long i = lo; i < hi; i++) z[i] = 3.0f * x[i] + y[i]; return NULL; }
int main(int argc, char **argv) {
  n = atol(argv[1]); nt = atoi(argv[2]); int reps = atoi(argv[3]);
  x = malloc(n * 4); y = malloc(n * 4); z = malloc(n * 4);
  for (long i = 0; i < n; i++) x[i] = 1.5f, y[i] = 2, z[i] = 0;
  double b = 1e9; pthread_t th[1024];
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    for (long k = 0; k < nt; k++) pthread_create(&th[k], NULL, part, (void *)k);
    for (int k = 0; k < nt; k++) pthread_join(th[k], NULL);
    double t = now() - t0; if (t < b) b = t;
  }
  printf("%f %f\n", b * 1000, z[n - 1]);
  return 0;
}]]
local src, exe = os.tmpname() .. ".c", os.tmpname()
local f = assert(io.open(src, "w")); f:write(C); f:close()
local n = cores()
if os.execute(("cc -O2 -pthread -o %s %s"):format(exe, src)) then
  local function c_ms(nt)
    local p = io.popen(("%s %d %d %d"):format(exe, N, nt, REPS))
    local ms = tonumber(p:read("n"))
    p:close()
    return ms
  end
  local c1, cn = c_ms(1), c_ms(n)
  out("saxpy_c1_ms", c1)
  out("saxpy_cn_ms", cn)
  io.write(("info_cpu_threads %d\n"):format(n))
  out("saxpy_ratio", t * 1000 / cn)
else
  note("no C compiler (cc): the C loop's rows left out")
end
os.remove(src); os.remove(exe)
x, y, z = nil, nil, nil
collectgarbage()

-- ---- block reduction ----
local RN = 1 << 22
local bsum = cuda.kernel([[
extern "C" __global__ void bsum(const int *x, int *out, int n) {
  __shared__ int s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0;
  __syncthreads();
  for (int k = blockDim.x / 2; k >= 32; k /= 2) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x < 32) {
    int v = s[threadIdx.x];
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}]], "bsum")
local rx = cuda.device_array(RN, cuda.int32)
rx:fill(1)
local rout = cuda.device_array(RN // 256, cuda.int32)
bsum[{ RN // 256, 256 }](rx, rout, RN); cuda.synchronize()
local h = rout:copy_to_host()
assert(h[1] == 256 and h[#h] == 256, "the block reduction's result is wrong")
local tr = best(function() bsum[{ RN // 256, 256 }](rx, rout, RN); cuda.synchronize() end)
out("reduce_melem_s", RN / tr / 1e6)
out("reduce_melem_s_core", RN / tr / 1e6 / n)
rx, rout = nil, nil

-- ---- Monte-Carlo pi ----
local pi = cuda.kernel([[
#include <cudalua/random.cuh>
extern "C" __global__ void pi(xoroshiro128p_state *states, unsigned long long *inside, int iterations, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long c = 0;
  for (int j = 0; j < iterations; j++) {
    float a = xoroshiro128p_uniform_float32(states, i), b = xoroshiro128p_uniform_float32(states, i);
    if (a * a + b * b <= 1.0f) c++;
  }
  atomicAdd(inside, c);
}]], "pi")
local PN, IT = 64 * 256, 1000
local states = cuda.random.create_xoroshiro128p_states(PN, { seed = 1 })
local inside = cuda.device_array(1, cuda.uint64)
local tp = best(function() inside:fill(0); pi[{ PN // 256, 256 }](states, inside, IT, PN); cuda.synchronize() end)
local est = 4 * inside:copy_to_host()[1] / (PN * IT)
assert(math.abs(est - math.pi) < 0.01, "pi is " .. est)
out("pi_msamples_s", PN * IT / tp / 1e6)
