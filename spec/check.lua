-- spec/check.lua: misuse checks shared by the specs.
--   local C = require "spec.check"
--   C.raises("index 11 out of range", fn, ...)   -- fn(...) raises an error containing the text
--                                                 -- (plain), then cudalua still works
--   C.nogpu(it, pending)("name", fn)              -- runs only where no GPU is usable (driver-less
--                                                 -- behaviour); pending on a GPU machine
--   C.f32(x)                                      -- x rounded to float32, as the GPU stores it
local H = require "spec.helper"
local assert = require "luassert"
local cuda = H.cuda
local C = {}

-- a normal operation: host arrays, and the device when there is one
function C.alive()
  local a = cuda.array({ 1, 2, 3 }, "int32")
  a[2] = 5
  assert.same({ 1, 5, 3 }, a:totable())
  if H.has_gpu then
    local d = cuda.to_device(a)
    assert.same({ 1, 5, 3 }, d:copy_to_host():totable())
  end
end

function C.raises(msg, fn, ...)
  local e = H.err(fn, ...)
  assert(e ~= nil, "expected an error containing: " .. msg)
  assert.matches(msg, e, 1, true)
  C.alive()
  return e
end

function C.nogpu(it, pending)
  return function(name, fn)
    name = name .. " #nogpu"
    if H.has_gpu then pending(name .. " (a GPU is usable here)") else it(name, fn) end
  end
end

function C.f32(x) return (string.unpack("<f", string.pack("<f", x))) end

return C
