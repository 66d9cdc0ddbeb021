-- NVTX ranges and marks (src/nvtx.c, lua/cudalua/init.lua) and cuda.profile_start/stop.
-- Whether a profiler sees the ranges is checked on the GPU machine by tools/nvtx_check.sh
-- (Nsight Compute profiles only the kernels inside a named range).
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local nvtx = cuda.nvtx
local gpu = H.gpu(it, pending)

describe("cuda.nvtx", function()
  it("push and pop nest, and popping with no range open raises", function()
    local n = math.random(2, 6)
    for i = 1, n do assert.equal(i, nvtx.range_push("range " .. i)) end
    for i = n - 1, 0, -1 do assert.equal(i, nvtx.range_pop()) end
    C.raises("cuda.nvtx.range_pop: no range is open (range_push opens one)", nvtx.range_pop)
  end)

  it("range(name, fn, ...) returns fn's results and ends the range when fn raises", function()
    local a, b = math.random(1, 100), math.random(1, 100)
    local s, t = nvtx.range("sum", function(x, y) return x + y, x * y end, a, b)
    assert.equal(a + b, s)
    assert.equal(a * b, t)
    C.raises_own("boom " .. a, nvtx.range, "raises", function() error("boom " .. a) end)
    C.raises("no range is open", nvtx.range_pop)   -- the failed range was popped
  end)

  it("scope(name) is a <close> guard; mark takes a name", function()
    do
      local _ <close> = nvtx.scope("block")
      assert.equal(2, nvtx.range_push("inner"))   -- inside the scope's range
      nvtx.range_pop()
    end
    C.raises("no range is open", nvtx.range_pop)
    local s = nvtx.scope("closed twice")
    s:close(); s:close()
    C.raises("no range is open", nvtx.range_pop)
    nvtx.mark("a mark")
  end)

  it("misuse raises with the function's name", function()
    C.raises("cuda.nvtx.range_push: expected the range's name (a string), got number", nvtx.range_push, 5)
    C.raises("cuda.nvtx.mark: expected the range's name (a string), got no value", nvtx.mark)
    C.raises("cuda.nvtx.range: expected a function, got string", nvtx.range, "x", "y")
    C.raises("no range is open", nvtx.range_pop)
  end)

  gpu("profile_start and profile_stop bracket work without a profiler", function()
    local t = H.rand_table(100)
    cuda.profile_start()
    local d = cuda.to_device(cuda.array(t, "float64"))
    cuda.profile_stop()
    assert.same(t, d:copy_to_host():totable())
  end)
end)
