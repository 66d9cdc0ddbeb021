-- cuda.progress.watch(counter, total, {stream=, label=, interval=, out=, line_interval=}): polls
-- a managed or mapped counter that a running kernel bumps until the stream's work is done,
-- drawing a bar (a terminal) or plain lines (anything else, as the files used here), and
-- returns the last count it read.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local SRC = [[
#include <cudalua/time.cuh>
__device__ unsigned long long now_ns() { return cudalua_globaltimer(); }
// the counter bumped steps times, by one for every thread of the grid, one step every step_ns
// nanoseconds. One thread bumps for all (threads that each waited would run one after another
// on the CPU device)
extern "C" __global__ void bump(unsigned long long *progress, long long steps, long long step_ns) {
  if (blockIdx.x + threadIdx.x != 0) return;
  unsigned long long t0 = now_ns();
  for (long long i = 0; i < steps; i++) {
    atomicAdd(progress, (unsigned long long)gridDim.x * blockDim.x);
    while (now_ns() - t0 < (unsigned long long)((i + 1) * step_ns)) __nanosleep(20000);
  }
}
]]
local mod
local function bump()
  mod = mod or cuda.compile(SRC, { name = "progress.cu" })
  return mod.bump
end

local BLOCKS, THREADS, STEPS, STEP_NS = 4, 32, 100, 3000000 -- 0.3 s, 12800 counts
local TOTAL = BLOCKS * THREADS * STEPS

local function tmpname()
  local p = os.tmpname()
  return p
end

local function read_lines(path)
  local f = assert(io.open(path))
  local lines = {}
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
  return lines
end

-- runs the kernel on stream s (nil: the default stream) and watches it into a file
local function watched(counter, s, opts)
  local path = tmpname()
  local out = assert(io.open(path, "w"))
  opts = opts or {}
  opts.out, opts.stream = out, s
  opts.line_interval = opts.line_interval or 0.02   -- several lines for a kernel of ~0.3 s
  bump()[{ BLOCKS, THREADS, s }](counter, STEPS, STEP_NS)
  local seen = cuda.progress.watch(counter, TOTAL, opts)
  out:close()
  local lines = read_lines(path)
  os.remove(path)
  return seen, lines
end

-- the plain lines: "label: NN% done/total rate/s ETA|in time"; percentages never go back,
-- the last one says 100% ... in
local function check_lines(lines, label)
  assert.is_true(#lines >= 3, "expected several lines, got:\n" .. table.concat(lines, "\n"))
  local last, intermediate = -1, 0
  for i, l in ipairs(lines) do
    local lab, pct, done, total, rate, word, time = l:match("^(.-): +(%d+)%% (%S+)/(%S+) (%S+)/s (%a+) (%S+)$")
    assert(lab, "line " .. i .. " is not a progress line: " .. l)
    assert.equal(label, lab)
    assert.equal("12.8k", total)
    pct = tonumber(pct)
    assert.is_true(pct >= last, "the percentage went back at line " .. i)
    last = pct
    if pct > 0 and pct < 100 then intermediate = intermediate + 1 end
    if i < #lines then
      assert.equal("ETA", word, l)
    else
      assert.equal(100, pct, l)
      assert.equal("12.8k", done)
      assert.equal("in", word, l)
      assert.matches("^%d+%.%ds$", time)
    end
  end
  assert.is_true(intermediate >= 1, "no line between 0% and 100%:\n" .. table.concat(lines, "\n"))
end

it("the kernels of this file compile", function()
  assert.same({ "bump" }, cuda.compile(SRC, { arch = "sm_90", name = "progress.cu" }):kernels())
end)

describe("cuda.progress.watch", function()
  gpu("follows a managed counter bumped by a kernel on a stream, in plain lines", function()
    local counter = cuda.managed_array(1, "uint64")
    local s = cuda.stream()
    local seen, lines = watched(counter, s, { label = "managed run", line_interval = 0.02 })
    assert.equal(TOTAL, seen)
    assert.equal(TOTAL, counter[1])
    check_lines(lines, "managed run")
  end)

  gpu("follows a mapped counter, on the default stream", function()
    local counter = cuda.mapped_array(1, "uint64")
    local seen, lines = watched(counter, nil, { label = "mapped", line_interval = 0.02, interval = 0 })
    assert.equal(TOTAL, seen)
    assert.equal(TOTAL, counter[1])
    check_lines(lines, "mapped")
  end)

  gpu("labels the lines 'progress' by default and draws the final line once the work is done", function()
    local counter = cuda.managed_array(1, "uint64")
    local s = cuda.stream(true)
    local seen, lines = watched(counter, s, { line_interval = 0.02, interval = 0.005 })
    assert.equal(TOTAL, seen)
    check_lines(lines, "progress")
    -- a counter whose work is already done: one final line
    local path = tmpname()
    local out = assert(io.open(path, "w"))
    assert.equal(TOTAL, cuda.progress.watch(counter, TOTAL, { out = out, stream = s }))
    out:close()
    local l = read_lines(path)
    os.remove(path)
    assert.equal(1, #l)
    assert.matches("^progress: 100%% 12%.8k/12%.8k ", l[1])
  end)

  it("rejects counters that are not managed or mapped arrays", function()
    local w = cuda.progress.watch
    C.raises("progress.watch: counter must be a managed or mapped array, got number", w, 5, 10)
    C.raises("progress.watch: counter must be a managed or mapped array, got nil", w, nil, 10)
    C.raises("progress.watch: counter must be a managed or mapped array, got table", w, {}, 10)
    C.raises("progress.watch: counter must be a managed or mapped array (the host reads it while the kernel runs)",
             w, cuda.array(1, "uint64"), 10)
  end)

  gpu("rejects device, pinned and empty counters", function()
    local w = cuda.progress.watch
    local MSG = "progress.watch: counter must be a managed or mapped array (the host reads it while the kernel runs)"
    local e = C.raises(MSG, w, cuda.device_array(1, "uint64"), 10)
    assert.matches("device_array", e, 1, true)
    e = C.raises(MSG, w, cuda.pinned_array(1, "uint64"), 10)
    assert.matches("pinned_array", e, 1, true)
    C.raises("progress.watch: counter is empty", w, cuda.managed_array(0, "uint64"), 10)
  end)

  gpu("rejects totals, intervals and options that make no sense", function()
    local w = cuda.progress.watch
    local c = cuda.managed_array(1, "uint64")
    C.raises("progress.watch: total must be a number > 0, got 0", w, c, 0)
    C.raises("progress.watch: total must be a number > 0, got -5", w, c, -5)
    C.raises("progress.watch: total must be a number > 0, got 10", w, c, "10")
    C.raises("progress.watch: total must be a number > 0, got nil", w, c, nil)
    C.raises("progress.watch: options must be a table", w, c, 10, "fast")
    C.raises("progress.watch: interval must be seconds from 0 to 10", w, c, 10, { interval = -1 })
    C.raises("progress.watch: interval must be seconds from 0 to 10", w, c, 10, { interval = "1ms" })
    C.raises("progress.watch: interval must be seconds from 0 to 10", w, c, 10, { interval = 0 / 0 })
    C.raises("progress.watch: interval must be seconds from 0 to 10", w, c, 10, { interval = 1e308 })
    C.raises("progress.watch: line_interval must be seconds from 0 to 3600", w, c, 10, { line_interval = 0 / 0 })
    -- and it still works
    local m = cuda.mapped_array(1, "uint64")
    local seen = watched(m, cuda.stream(), { line_interval = 10 })
    assert.equal(TOTAL, seen)
  end)

  gpu("rejects a stream option that is not a stream", function()
    -- BUG: {stream = "s"} fails inside the loop with "attempt to call a nil value (method
    -- 'query')" instead of an error naming the option
    local c = cuda.managed_array(1, "uint64")
    C.raises("progress.watch: stream must be a stream", cuda.progress.watch, c, 10, { stream = "s" })
  end)

  gpu("rejects an out option that is not a file", function()
    -- BUG: {out = "log.txt"} raises "bad argument #1 to 'isatty' (FILE* expected, got string)",
    -- and {out = 1} passes the check (a file descriptor) and fails at out:write
    local c = cuda.managed_array(1, "uint64")
    C.raises("progress.watch: out must be a file", cuda.progress.watch, c, 10, { out = "log.txt" })
    C.raises("progress.watch: out must be a file", cuda.progress.watch, c, 10, { out = 1 })
  end)

  gpu("rejects unknown options", function()
    -- BUG: unknown option names are ignored silently ({lable = ...}, {strem = s})
    local c = cuda.managed_array(1, "uint64")
    C.raises("unknown option 'lable'", cuda.progress.watch, c, 10, { lable = "x" })
  end)
end)
