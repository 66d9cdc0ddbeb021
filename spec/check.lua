-- spec/check.lua: misuse checks shared by the specs.
--   local C = require "spec.check"
--   C.raises("index 11 out of range", fn, ...)   -- fn(...) raises an error containing the text
--                                                 -- (plain), prefixed "cudalua: <public name>: ",
--                                                 -- then cudalua still works
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

-- Every cudalua error reads "cudalua: <public name>: <what is wrong>", the public name being
-- what the user called: cuda.copy, array:slice, module.saxpy, array[i] =, kernel 'add' (a
-- kernel's call), elementwise 'saxpy' (an elementwise function's call), reduction 'mean' (a
-- cuda.reduction's call). The message's prefix, or nil and why not.
local NAMED = { "^cudalua: [%a_][%w_]*[%.:%[][^\n]-: ", "^cudalua: kernel '[^']*'", "^cudalua: elementwise '[^']*'",
  "^cudalua: reduction '[^']*'" }
function C.prefix(e)
  local m = e:gsub("^[^\n:]*:%d+: ", "")   -- the position error() adds (a chunk name has no colon)
  for _, p in ipairs(NAMED) do
    local found = m:match(p)
    if found then return found end
  end
  return nil, "no 'cudalua: <public name>: ' prefix in: " .. m
end

function C.raises(msg, fn, ...)
  local e = C.raises_internal(msg, fn, ...)
  assert(C.prefix(e))
  C.alive()
  return e
end

-- an error the test's own function raised, which cudalua passes on as it was (gpu:run's
-- function, nccl.group's, nvtx.range's): exactly msg after error()'s position
function C.raises_own(msg, fn, ...)
  local e = H.err(fn, ...)
  assert(e ~= nil, "expected the error: " .. msg)
  assert.equal(msg, (e:gsub("^[^\n]-:%d+: ", "")))
  C.alive()
  return e
end

-- the same for an internal function a spec reaches past the public API (a parser's own
-- message, which the public function that calls it prefixes)
function C.raises_internal(msg, fn, ...)
  local e = H.err(fn, ...)
  assert(e ~= nil, "expected an error containing: " .. msg)
  assert.matches(msg, e, 1, true)
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
