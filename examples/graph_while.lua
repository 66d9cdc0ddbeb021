-- graph_while.lua: an iterative solver that runs until converged inside ONE graph launch, with
-- a WHILE conditional node (NVIDIA's graphConditionalNodes sample has the loop; the problem is
-- the textbook one). Jacobi iteration for the 1-D Poisson problem -u'' = f on (0, 1), u = 0 at
-- both ends, n interior points: u_i <- (u_{i-1} + u_{i+1} + h^2 f_i) / 2. The body kernel does
-- two sweeps and, in thread 0, stops the loop (cudaGraphSetConditional(cond, 0)) once the
-- largest change is below tol. No host round trip per iteration: checked against the same
-- iteration on the CPU, and timed against a host loop that reads a flag back each time. The
-- same graph is also made by stream capture (stream:condition, stream:while_loop).
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local mod = cuda.compile([[
__device__ double sweep(const double *from, const double *f, int i, int n, double h2) {
  return 0.5 * ((i > 0 ? from[i - 1] : 0.0) + (i < n - 1 ? from[i + 1] : 0.0) + h2 * f[i]);
}
// one block of n threads: u -> v -> u, then the largest change of the second sweep
__device__ bool jacobi2(double *u, double *v, const double *f, int n, double h2, double tol, int *iters) {
  __shared__ unsigned long long change;   // a non-negative double's bits order as integers
  int i = threadIdx.x;
  if (i == 0) change = 0;
  if (i < n) v[i] = sweep(u, f, i, n, h2);
  __syncthreads();
  if (i < n) {
    double w = sweep(v, f, i, n, h2);
    atomicMax(&change, (unsigned long long)__double_as_longlong(fabs(w - u[i])));
    u[i] = w;
  }
  __syncthreads();
  if (i != 0) return false;   // thread 0 alone reads the verdict and counts
  *iters += 1;
  return __longlong_as_double((long long)change) < tol;
}
extern "C" __global__ void step(double *u, double *v, const double *f, int n, double h2, double tol,
                                int *iters, int max_iters, cudaGraphConditionalHandle go_on) {
  bool converged = jacobi2(u, v, f, n, h2, tol, iters);
  if (threadIdx.x == 0 && (converged || *iters >= max_iters)) cudaGraphSetConditional(go_on, 0);
}
// the host loop's kernel: the same step, the verdict in a flag the host reads
extern "C" __global__ void step_flag(double *u, double *v, const double *f, int n, double h2, double tol,
                                     int *iters, int *done) {
  if (jacobi2(u, v, f, n, h2, tol, iters)) *done = 1;
}
]], { options = { "--fmad=false" } })   -- no fused multiply-add: the CPU's arithmetic, step by step

local n, tol, max_iters = 48, 1e-10, 200000
local h = 1 / (n + 1)
math.randomseed(tonumber(os.getenv("SEED") or "") or os.time())
local f = {}
for i = 1, n do f[i] = math.random() * 2 - 1 end

-- the CPU: the same sweeps in the same order
local function cpu()
  local u, v = {}, {}
  for i = 1, n do u[i] = 0 end
  local function sw(from, i) return 0.5 * ((from[i - 1] or 0) + (from[i + 1] or 0) + h * h * f[i]) end
  for it = 1, max_iters do
    for i = 1, n do v[i] = sw(u, i) end
    local change = 0
    local w = {}
    for i = 1, n do w[i] = sw(v, i); change = math.max(change, math.abs(w[i] - u[i])) end
    u = w
    if change < tol then return u, it end
  end
  return u, max_iters
end
local want, want_iters = cpu()

local df = cuda.to_device(cuda.array(f, "float64"))
local u, v = cuda.device_array(n, "float64"), cuda.device_array(n, "float64")
local iters = cuda.device_array(1, "int32")

-- the graph: reset u and the counter, then loop the step while the condition is not 0
local g = cuda.graph()
local go_on = g:condition { default = 1 }
local z1 = g:memset(u, 0)
local z2 = g:memset(iters, 0)
local body = g:while_loop(go_on, { z1, z2 })
body:kernel(mod.step, { 1, 64 }, { u, v, df, n, h * h, tol, iters, max_iters, go_on })
local s = cuda.stream()
g:launch(s); s:synchronize()   -- instantiated here; timed below
local e0, e1 = cuda.event(), cuda.event()
e0:record(s); g:launch(s); e1:record(s); e1:synchronize()
local graph_ms = e0:elapsed_time(e1)
local got, got_iters = u:copy_to_host(), iters[1]
local worst = 0
for i = 1, n do worst = math.max(worst, math.abs(got[i] - want[i])) end
print(("WHILE graph: %d iterations in one launch, %.3f ms; CPU: %d iterations; largest difference %.3g")
  :format(got_iters, graph_ms, want_iters, worst))
assert(got_iters == want_iters, "the GPU and the CPU converged after different numbers of iterations")
assert(worst < 1e-12, "the GPU's solution differs from the CPU's")

-- the same graph from a stream capture: the condition and the WHILE node come from the
-- capturing stream, and the body is captured on the stream handed to its function
s:begin_capture()
u:fill(0, s); iters:fill(0, s)
local cgo_on = s:condition { default = 1 }
s:while_loop(cgo_on, function(b)
  mod.step[{ 1, 64, b }](u, v, df, n, h * h, tol, iters, max_iters, cgo_on)
end)
local captured = s:end_capture()
captured:launch(s); s:synchronize()
got = u:copy_to_host()
worst = 0
for i = 1, n do worst = math.max(worst, math.abs(got[i] - want[i])) end
print(("captured WHILE graph: %d iterations; largest difference from the CPU %.3g"):format(iters[1], worst))
assert(iters[1] == want_iters and worst < 1e-12, "the captured graph's solution differs from the CPU's")
captured:close()

-- the host loop: a launch and a flag read back per iteration
local done = cuda.pinned_array(1, "int32")
local dd = cuda.device_array(1, "int32")
u:fill(0, s); iters:fill(0, s); dd:fill(0, s)
local l = mod.step_flag[{ 1, 64, s }]
e0:record(s)
local k = 0
repeat
  l(u, v, df, n, h * h, tol, iters, dd)
  dd:copy_to_host(done, s)
  s:synchronize()
  k = k + 1
until done[1] == 1 or k >= max_iters
e1:record(s); e1:synchronize()
local loop_ms = e0:elapsed_time(e1)
print(("host loop: %d iterations, %.3f ms: the WHILE graph is %.1fx faster"):format(k, loop_ms, loop_ms / graph_ms))
assert(k == want_iters)
g:close()
