-- spec/helper.lua: shared by the specs.
--   local H = require "spec.helper"
--   local gpu = H.gpu(it, pending)      -- gpu("does x", fn): an `it` tagged #gpu, reported as
--                                        -- skipped (pending) when no GPU is usable
--   H.rand_table(n, lo, hi, int)         -- random data, never zeros
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local H = { cuda = cuda }

H.has_gpu = cuda.is_available()

function H.gpu(it, pending)
  return function(name, fn)
    name = name .. " #gpu"
    if H.has_gpu then it(name, fn) else pending(name .. " (no GPU: " .. tostring(cuda.driver_error()) .. ")") end
  end
end

function H.rand_table(n, lo, hi, int)
  lo, hi = lo or -100, hi or 100
  local t = {}
  for i = 1, n do
    local v
    repeat
      v = int and math.random(lo, hi) or lo + (hi - lo) * math.random()
    until v ~= 0
    t[i] = v
  end
  return t
end

-- the error raised by fn(...), or nil if it did not raise
function H.err(fn, ...)
  local ok, e = pcall(fn, ...)
  if ok then return nil end
  return tostring(e)
end

return H
