-- Streams and events: creation, synchronize, query, wait_event, record, elapsed_time, close.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local N = 1037

local SRC = [[
#include <cudalua/time.cuh>
__device__ unsigned long long now_ns() { return cudalua_globaltimer(); }
// waits ns nanoseconds, then y[i] = x[i] + 1. One thread waits and does every element
// (threads that each waited would run one after another on the CPU device)
extern "C" __global__ void slow_inc(int *y, const int *x, int n, long long ns) {
  if (blockIdx.x + threadIdx.x != 0) return;
  unsigned long long t0 = now_ns();
  while (now_ns() - t0 < (unsigned long long)ns) {}
  for (int i = 0; i < n; i++) y[i] = x[i] + 1;
}
]]
local mod
local function kernels()
  mod = mod or cuda.compile(SRC)
  return mod
end
local MS = 1000000 -- nanoseconds

it("the kernels of this file compile", function()
  assert.same({ "slow_inc" }, cuda.compile(SRC, { arch = "sm_90" }):kernels())
end)

describe("cuda.stream", function()
  gpu("makes streams that order their own work", function()
    local s = cuda.stream()
    assert.matches("^cudalua%.stream<0x%x+ on device %d+>$", tostring(s))
    assert.equal("integer", math.type(s:handle()))
    assert.is_true(s:handle() ~= 0)
    local t = H.rand_table(N, -1000, 1000, true)
    local x = cuda.to_device(t, "int32", s)
    local y = cuda.device_array(N, "int32", s)
    kernels().slow_inc[{ (N + 127) // 128, 128, s }](y, x, N, 1 * MS)
    local h = cuda.pinned_array(N, "int32")
    y:copy_to_host(h, s)
    s:synchronize()
    for i = 1, N do assert.equal(t[i] + 1, h[i]) end
  end)

  gpu("cuda.stream(true) makes a non-blocking stream", function()
    local s = cuda.stream(true)
    local d = cuda.device_array(N, "int32", s)
    d:fill(5, s)
    s:synchronize()
    assert.equal(5, d[N])
  end)

  gpu("rejects use after close", function()
    local s = cuda.stream()
    s:close()
    s:close() -- twice is fine
    assert.equal("cudalua.stream<closed>", tostring(s))
    C.raises("closed stream", s.synchronize, s)
    C.raises("closed stream", s.query, s)
    C.raises("closed stream", s.handle, s)
    C.raises("closed stream", s.wait_event, s, cuda.event())
    C.raises("kernel[{grid, block}]: closed stream", function()
      return kernels().slow_inc[{ 1, 1, s }]
    end)
  end)

  -- issue 24: cuda.stream{priority = -1} was taken for `true` (a non-blocking stream, no priority)
  it("refuses what is not a flag or its options, naming it", function()
    C.raises("cudalua: cuda.stream: expected nil, a boolean (non_blocking) or an options table {non_blocking =, priority =}, got number",
             cuda.stream, 1)
    C.raises("got string", cuda.stream, "true")
    C.raises("cudalua: cuda.stream: unknown option 'prio' (non_blocking, priority)", cuda.stream, { prio = -1 })
    C.raises("cudalua: cuda.stream: non_blocking must be a boolean, got number", cuda.stream, { non_blocking = 1 })
    C.raises("cudalua: cuda.stream: priority must be an integer (see cuda.stream_priority_range()), got 0.5",
             cuda.stream, { priority = 0.5 })
    C.raises("priority must be an integer", cuda.stream, { priority = "high" })
  end)

  -- CuPy test_stream.py test_create_with_priority (0, -1, -3 read back) and cuda.core
  -- test_stream.py test_stream_priority (a priority out of range raises)
  gpu("priorities: read back as given, refused outside the device's range", function()
    local least, greatest = cuda.stream_priority_range()
    assert.equal("integer", math.type(least))
    assert.is_true(greatest <= least)
    assert.equal(0, cuda.stream().priority)
    assert.equal(0, cuda.default_stream().priority)
    for p = greatest, least do
      local s = cuda.stream { priority = p }
      assert.equal(p, s.priority)
      assert.is_false(s.non_blocking)
      assert.equal(p, cuda.stream({ priority = p, non_blocking = true }).priority)
    end
    assert.is_true(cuda.stream({ non_blocking = true }).non_blocking)
    assert.is_true(cuda.stream(true).non_blocking)
    assert.is_false(cuda.stream(false).non_blocking)
    C.raises(("cudalua: cuda.stream: priority %d is outside device %d's range %d (highest) to %d (lowest, the default)")
             :format(least + 1, cuda.current_device(), greatest, least), cuda.stream, { priority = least + 1 })
    C.raises("is outside device", cuda.stream, { priority = greatest - 1 })
    local s = cuda.stream { priority = greatest }
    s:close()
    C.raises("cudalua: stream.priority: closed stream", function() return s.priority end)
    C.raises("cudalua: stream[k]: streams have no field 'priorty'", function() return s.priorty end)
  end)

  -- a stream of the highest priority gets multiprocessors as soon as blocks of lower-priority
  -- work end, before the rest of that work: its one block starts before the last block of a
  -- grid of ten waves queued ahead of it on a default-priority stream
  H.gpuonly(it, pending, "one in-order queue runs every stream's work")("the block scheduler serves a higher-priority stream first", function()
    local least, greatest = cuda.stream_priority_range()
    if greatest == least then return end -- no priorities on this device
    local k = cuda.kernel([[
      #include <cudalua/time.cuh>
      __device__ unsigned long long now() { return cudalua_globaltimer(); }
      extern "C" __global__ void spin(unsigned long long *t, long long ns) {
        unsigned long long t0 = now();
        if (threadIdx.x == 0) t[blockIdx.x] = t0;
        while (now() - t0 < (unsigned long long)ns) {}
      }]], "spin")
    local sms = cuda.devices()[cuda.current_device() + 1].multiprocessors
    local nlow = sms * 2 * 10 -- blocks of 1024 threads: two per multiprocessor, ten waves
    local low, high = cuda.stream(), cuda.stream { priority = greatest }
    local tl, th = cuda.device_array(nlow, "uint64"), cuda.device_array(1, "uint64")
    k[{ nlow, 1024, low }](tl, 1000000)
    k[{ 1, 1024, high }](th, 1000000)
    cuda.synchronize()
    local starts, last = tl:copy_to_host():totable(), 0
    for _, v in ipairs(starts) do last = math.max(last, v) end
    assert.is_true(th[1] < last, "the high-priority block waited for every lower-priority block")
  end)

  gpu("a <close> stream is closed at the end of its block", function()
    local keep
    do
      local s <close> = cuda.stream()
      cuda.device_array(N, "int32", s):fill(1, s)
      keep = s
    end
    assert.equal("cudalua.stream<closed>", tostring(keep))
  end)
end)

describe("cuda.default_stream", function()
  it("is the legacy stream, handle 0, the same object each time", function()
    local s = cuda.default_stream()
    assert.equal(s, cuda.default_stream())
    assert.equal("cudalua.stream<default>", tostring(s))
    assert.equal(0, s:handle())
    s:close() -- closing the default stream does nothing
    assert.equal("cudalua.stream<default>", tostring(s))
  end)

  gpu("synchronizes, queries and is accepted wherever a stream is", function()
    local s = cuda.default_stream()
    local d = cuda.to_device({ 1, 2, 3 }, "int32", s)
    d:fill(9, s)
    s:synchronize()
    assert.is_true(s:query())
    assert.same({ 9, 9, 9 }, d:copy_to_host(nil, s):totable())
    local d0 = cuda.device_array(3, "int32", 0) -- 0 also means the default stream
    d0:fill(4, 0)
    assert.same({ 4, 4, 4 }, d0:copy_to_host():totable())
  end)

  it("methods reject what is not a stream", function()
    local s = cuda.default_stream()
    C.raises("cudalua.stream expected, got number", s.synchronize, 5)
    C.raises("cudalua.stream expected, got table", s.query, {})
    C.raises("cudalua.event expected, got number", s.wait_event, s, 5)
    C.raises("cudalua.event expected, got no value", s.wait_event, s)
  end)
end)

describe("stream:query", function()
  gpu("is false while work runs and true once it is done", function()
    local s = cuda.stream()
    local x = cuda.device_array(N, "int32", s)
    x:fill(1, s)
    collectgarbage() -- a finalizer that waits (memory other specs dropped) must not run between
    kernels().slow_inc[{ (N + 255) // 256, 256, s }](x, x, N, 300 * MS)
    local busy = s:query() -- before anything allocates (assert.is_false's lookup may collect)
    assert.is_false(busy)
    s:synchronize()
    assert.is_true(s:query())
    assert.equal(2, x[N])
  end)
end)

describe("stream:wait_event", function()
  gpu("makes one stream wait for an event recorded on another", function()
    local k = kernels().slow_inc
    local s1, s2 = cuda.stream(true), cuda.stream(true)
    local t = H.rand_table(N, -1000, 1000, true)
    local x = cuda.to_device(t, "int32")
    local y, z = cuda.device_array(N, "int32", s1), cuda.device_array(N, "int32", s2)
    local e = cuda.event()
    local g = (N + 127) // 128
    k[{ g, 128, s1 }](y, x, N, 200 * MS) -- y = x + 1, late
    e:record(s1)
    s2:wait_event(e)
    k[{ g, 128, s2 }](z, y, N, 0) -- z = y + 1, only once y is written
    s2:synchronize()
    local h = z:copy_to_host()
    for i = 1, N do assert.equal(t[i] + 2, h[i]) end
  end)
end)

describe("cuda.event", function()
  gpu("record, query and synchronize", function()
    local s = cuda.stream()
    local e = cuda.event()
    assert.matches("^cudalua%.event<0x%x+>$", tostring(e))
    local x = cuda.device_array(N, "int32", s)
    x:fill(1, s)
    collectgarbage()
    kernels().slow_inc[{ (N + 127) // 128, 128, s }](x, x, N, 300 * MS)
    e:record(s)
    local busy = e:query()
    assert.is_false(busy)
    e:synchronize()
    assert.is_true(e:query())
    assert.equal(2, x[1])
    local e2 = cuda.event(false)
    e2:record() -- on the default stream
    e2:synchronize()
    assert.is_true(e2:query())
  end)

  gpu("elapsed_time measures milliseconds between two events", function()
    local s = cuda.stream()
    local e0, e1 = cuda.event(), cuda.event()
    local x = cuda.device_array(N, "int32", s)
    e0:record(s)
    kernels().slow_inc[{ 1, 32, s }](x, x, 32, 50 * MS)
    e1:record(s)
    e1:synchronize()
    local ms = e0:elapsed_time(e1)
    assert.equal("float", math.type(ms))
    assert.is_true(ms >= 45 and ms < 5000, "elapsed " .. ms)
    assert.equal(ms, cuda.event_elapsed_time(e0, e1))
    assert.is_true(e1:elapsed_time(e0) <= -45)
  end)

  gpu("elapsed_time rejects events never recorded, not done, or without timing", function()
    local e0, e1 = cuda.event(), cuda.event()
    C.raises("cudalua: event:elapsed_time: an event was never recorded", e0.elapsed_time, e0, e1)
    local s = cuda.stream()
    local x = cuda.device_array(32, "int32", s)
    e0:record(s)
    kernels().slow_inc[{ 1, 32, s }](x, x, 32, 300 * MS)
    e1:record(s)
    C.raises("cudalua: event:elapsed_time: an event has not completed (synchronize it first)", e0.elapsed_time, e0, e1)
    s:synchronize()
    local nt = cuda.event(false)
    nt:record(s)
    nt:synchronize()
    C.raises("cudalua: event:elapsed_time: an event was created without timing", e0.elapsed_time, e0, nt)
    C.raises("cudalua: event:elapsed_time: an event was created without timing", cuda.event_elapsed_time, nt, e1)
  end)

  gpu("rejects use after close and bad streams", function()
    local e = cuda.event()
    C.raises("event:record: expected a stream, got string", e.record, e, "s")
    local s = cuda.stream()
    s:close()
    C.raises("event:record: closed stream", e.record, e, s)
    e:close()
    e:close() -- twice is fine
    assert.equal("cudalua.event<closed>", tostring(e))
    C.raises("closed event", e.record, e)
    C.raises("closed event", e.query, e)
    C.raises("closed event", e.synchronize, e)
    C.raises("closed event", cuda.event_elapsed_time, e, cuda.event())
    C.raises("closed event", cuda.default_stream().wait_event, cuda.default_stream(), e)
  end)

  gpu("a <close> event is closed at the end of its block", function()
    local keep
    do
      local e <close> = cuda.event()
      e:record()
      keep = e
    end
    assert.equal("cudalua.event<closed>", tostring(keep))
  end)

  it("event_elapsed_time rejects what is not an event", function()
    C.raises("cudalua.event expected, got number", cuda.event_elapsed_time, 1, 2)
    C.raises("cudalua.event expected, got no value", cuda.event_elapsed_time)
  end)
end)
