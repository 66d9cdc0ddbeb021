-- Leaks: create and drop 100k device arrays, events, streams (and copies and launches), closed
-- with <close> or left to the garbage collector; host RSS (/proc/self/statm) and device memory
-- in use (cuda.mem_info) must stay flat after a warm-up. Each loop runs in a fresh process
-- (spec/leaks_child.lua) so that memory pools filled by earlier specs cannot hide a leak.
local H = require "spec.helper"
local gpu = H.gpu(it, pending)
local MiB = 1 << 20
local HOST_SLACK, DEVICE_SLACK = 4 * MiB, 8 * MiB

local LUA = H.LUA

local function child(what, n)
  local p = assert(io.popen(("%s spec/leaks_child.lua %s %d 2>&1"):format(LUA, what, n)))
  local out = p:read("a")
  p:close()
  local host, dev = out:match("growth (%-?%d+) (%-?%d+)")
  assert(host, "the child process failed:\n" .. out)
  return tonumber(host), tonumber(dev)
end

local function flat(what, n)
  local host, dev = child(what, n)
  assert.is_true(host <= HOST_SLACK, ("%s x%d: host RSS grew by %.1f MiB"):format(what, n, host / MiB))
  assert.is_true(dev <= DEVICE_SLACK, ("%s x%d: device memory grew by %.1f MiB"):format(what, n, dev / MiB))
end

describe("the measures", function()
  gpu("see a deliberate leak of device memory", function()
    local _, dev = child("leak_device", 64)
    assert.is_true(dev >= 60 * MiB, ("64 MiB kept, device memory grew by %.1f MiB"):format(dev / MiB))
  end)

  gpu("see a deliberate leak of host memory", function()
    local host = child("leak_host", 64)
    assert.is_true(host >= 60 * MiB, ("64 MiB kept, host RSS grew by %.1f MiB"):format(host / MiB))
  end)
end)

describe("device arrays", function()
  gpu("100k closed with <close> leak nothing", function() flat("device_close", 100000) end)
  gpu("100k collected, with views, leak nothing", function() flat("device_gc", 100000) end)
end)

describe("events", function()
  gpu("100k recorded and closed with <close> leak nothing", function() flat("event_close", 100000) end)
  gpu("100k recorded and collected leak nothing", function() flat("event_gc", 100000) end)
end)

describe("streams", function()
  gpu("100k closed with <close>, memory freed on them later, leak nothing", function() flat("stream_close", 100000) end)
  gpu("100k non-blocking streams collected leak nothing", function() flat("stream_gc", 100000) end)
end)

describe("copies and launches", function()
  gpu("100k round trips through to_device and copy_to_host leak nothing", function() flat("copies", 100000) end)
  gpu("100k launches on a stream leak nothing", function() flat("launches", 100000) end)
  gpu("20k launches with a pageable host array leak nothing", function() flat("host_launches", 20000) end)
end)
