#!/bin/sh
# tools/nvtx_check.sh LUA: does a profiler see cudalua's NVTX ranges? Nsight Compute (ncu) with
# --nvtx-include profiles only the kernels launched inside the named range: the check passes
# when the kernel inside it is profiled and the one outside it is not. GPU machine only.
LUA=${1:-lua5.4}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
[ -x "$NCU" ] || { echo "nvtx_check: no ncu ($NCU)"; exit 1; }
prog=$(mktemp --suffix=.lua)
trap 'rm -f "$prog"' EXIT
cat >"$prog" <<'LUA'
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local src = [[
extern "C" __global__ void inside_range(float *x) { x[threadIdx.x] += 1; }
extern "C" __global__ void outside_range(float *x) { x[threadIdx.x] *= 2; }]]
local m = cuda.compile(src)
local d = cuda.device_array(32, "float32")
d:fill(1)
m.outside_range[{ 1, 32 }](d)
cuda.nvtx.range("cudalua_check", function() m.inside_range[{ 1, 32 }](d) end)
m.outside_range[{ 1, 32 }](d)
cuda.synchronize()
print("value", d:copy_to_host()[1])
LUA
out=$("$NCU" --nvtx --nvtx-include "cudalua_check/" --metrics gpu__time_duration.sum "$LUA" "$prog" 2>&1)
echo "$out" | grep -E "==PROF==|==ERROR==|==WARNING==|value" | head -20
if echo "$out" | grep -q 'Profiling "inside_range"' && ! echo "$out" | grep -q 'Profiling "outside_range"'; then
  echo "nvtx_check: ncu profiled the kernel inside the range and not the others: it sees cudalua's ranges"
else
  echo "nvtx_check: FAILED"; exit 1
fi
