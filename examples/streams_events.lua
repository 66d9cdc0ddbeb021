-- streams_events.lua: seed 004's streams and events exercise. A pinned host array of 16M
-- int32 goes to the device, through a kernel and back, all queued on one stream between two
-- events; the CPU counts how often it finds the work unfinished while it waits.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local N = 16 * 1024 * 1024
local work = cuda.kernel([[
#include <cudalua/grid.cuh>
extern "C" __global__ void work(int *a, long long n) {
  for (long long i = grid(1); i < n; i += gridsize(1)) {
    a[i] = 2 * a[i] + 1;
  }
}]], "work")

local host = cuda.pinned_array(N, cuda.int32)
for i = 1, N do host[i] = math.random(-1000000, 1000000) end
local orig = host:totable()

local stream = cuda.stream()
local start, stop = cuda.event(), cuda.event()
local t0 = os.clock()
start:record(stream)
local d = cuda.to_device(host, stream)
work[{1024, 256, stream}](d, N)
d:copy_to_host(host, stream)
stop:record(stream)
local iterations = 0
while not stop:query() do iterations = iterations + 1 end
local cpu_ms = (os.clock() - t0) * 1000
local gpu_ms = start:elapsed_time(stop)
print(("GPU time %.3f ms, CPU time %.3f ms, %d iterations while waiting"):format(gpu_ms, cpu_ms, iterations))

-- check every element
local bad = 0
for i = 1, N do
  if host[i] ~= 2 * orig[i] + 1 then bad = bad + 1 end
end
print(("streams_events: %d elements, %d mismatches"):format(N, bad))
if bad > 0 then os.exit(1, true) end
