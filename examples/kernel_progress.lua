-- kernel_progress.lua: seed 000's progress bar driven by a running kernel. The kernel bumps a
-- counter in managed memory with atomics (sleeping a little so it takes a while); the host polls
-- the counter and draws a bar on stderr until the kernel is done.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

local slow = cuda.kernel([[
extern "C" __global__ void slow(unsigned long long *progress, long long steps, unsigned int sleep_ns) {
  for (long long i = 0; i < steps; i++) {
    atomicAdd(progress, 1ULL);
    __nanosleep(sleep_ns);
  }
}]], "slow")

local blocks, threads, steps = 64, 32, 2000
local total = blocks * threads * steps
for _, kind in ipairs { "managed_array", "mapped_array" } do
  local progress = cuda[kind](1, cuda.uint64)
  local stream = cuda.stream()
  slow[{blocks, threads, stream}](progress, steps, 20000)
  local seen = cuda.progress.watch(progress, total, { stream = stream, label = "kernel (" .. kind .. ")" })
  stream:synchronize()
  print(("kernel_progress (%s): counter %d, last seen by the bar %d, expected %d"):format(
    kind, progress[1], seen, total))
  if progress[1] ~= total or seen ~= total then os.exit(1, true) end
end
