-- cuda.defer_cleanup (issue 31): frees and destroys asked for inside are put off until the
-- scope ends, as Numba's cuda.defer_cleanup(). Numba's tests (numba-cuda,
-- numba/cuda/tests/cudadrv/test_deallocations.py: test_defer_cleanup, test_nested_defer_cleanup)
-- count the pending deallocations: one more for each array dropped inside, none after the scope,
-- an inner scope's end not freeing while an outer one is open. cuda.pending_cleanup() is that
-- count here.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

-- drops what the caller let go of (arrays are freed by their __gc)
local function collect() collectgarbage(); collectgarbage() end

describe("cuda.defer_cleanup", function()
  it("refuses what is not a function, naming itself", function()
    C.raises("cuda.defer_cleanup: expected a function (or nothing, for a <close> guard), got number", cuda.defer_cleanup, 5)
    C.raises("cuda.defer_cleanup: expected a function (or nothing, for a <close> guard), got string", cuda.defer_cleanup, "f")
  end)

  gpu("puts off the frees of arrays dropped inside until it ends (Numba's test_defer_cleanup)", function()
    collect()
    assert.equal(0, (cuda.pending_cleanup()))
    local host = H.rand_table(5, -100, 100, true)
    local held = { cuda.to_device(host, "int32") }   -- (dropped by clearing their slots)
    local kept
    cuda.defer_cleanup(function()
      held[2] = cuda.to_device(host, "int32")
      held[1] = nil
      collect()
      assert.equal(1, (cuda.pending_cleanup()))
      held[2] = nil
      collect()
      assert.equal(2, (cuda.pending_cleanup()))
      assert.is_nil(next(held))
      -- a wait inside does not run them either (it runs what other causes put off)
      cuda.synchronize()
      assert.equal(2, (cuda.pending_cleanup()))
      kept = cuda.to_device(host, "int32")
    end)
    assert.equal(0, (cuda.pending_cleanup()))
    assert.same(host, kept:copy_to_host():totable())
  end)

  gpu("nests: an inner scope's end frees nothing while an outer one is open (Numba's test_nested_defer_cleanup)", function()
    collect()
    local n = math.random(1, 6)
    local outer_guard <close> = cuda.defer_cleanup()
    do
      local _ <close> = cuda.defer_cleanup()
      for _ = 1, n do local a = cuda.device_array(math.random(1, 1000), "float32"); a:fill(1) end
      collect()
      local pending, open = cuda.pending_cleanup()
      assert.equal(n, pending)
      assert.equal(2, open)
    end
    local pending, open = cuda.pending_cleanup()
    assert.equal(n, pending)
    assert.equal(1, open)
    outer_guard:close()
    assert.same({ 0, 0 }, { cuda.pending_cleanup() })
    outer_guard:close()   -- (twice: once)
    assert.same({ 0, 0 }, { cuda.pending_cleanup() })
  end)

  gpu("puts off streams and events too, and ends when the function raises, with its error", function()
    collect()
    local s, e = cuda.stream(), cuda.event()
    local x = cuda.device_array(64, "int32")
    local ok, err = pcall(cuda.defer_cleanup, function(msg)
      x:fill(7, s)
      e:record(s)
      s, e = nil, nil
      collect()
      assert.equal(2, (cuda.pending_cleanup()))
      error(msg, 0)
    end, "stop here")
    assert.is_false(ok)
    assert.equal("stop here", err)
    assert.same({ 0, 0 }, { cuda.pending_cleanup() })
    local h = x:copy_to_host()
    for i = 1, 64 do assert.equal(7, h[i]) end
  end)

  gpu("returns the function's results, and frees what it dropped once it returns", function()
    collect()
    local a, b, c = cuda.defer_cleanup(function(p, q)
      local held = { cuda.device_array(10, "float64") }
      held[1] = nil
      collect()
      assert.is_nil(next(held))
      return p + q, cuda.pending_cleanup(), nil
    end, 2, 3)
    assert.equal(5, a)
    assert.equal(1, b)
    assert.is_nil(c)
    assert.equal(0, (cuda.pending_cleanup()))
  end)
end)
