-- cuda.memory_stats, cuda.reset_memory_stats and cuda.set_memory_limit (issue 31): what
-- cudalua holds on a device, as CuPy's MemoryPool says it (used_bytes, free_bytes as
-- cached_bytes, total_bytes, get_limit/set_limit). The sequences of CuPy's tests
-- (cupy/tests/cupy_tests/cuda_tests/test_memory.py: test_used_bytes, test_free_bytes,
-- test_total_bytes, test_total_bytes_stream, test_get_limit, test_set_limit_size,
-- test_set_limit_fraction) are run here with a random unit: cudalua's cache reuses a block of
-- the same size on the same stream only (CuPy splits blocks), so where CuPy's malloc of 1 unit
-- takes part of a cached block, here a block of the cached size is asked for.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)

local function collect() collectgarbage(); collectgarbage() end

-- a fresh start: nothing unreachable left, nothing of this state's cached
local function fresh()
  collect()
  cuda.empty_cache()
  return cuda.memory_stats()
end

-- a float32 array of `units` units (unit bytes each, a multiple of 4)
local function alloc(units, unit, stream)
  return cuda.device_array(units * unit // 4, "float32", stream)
end

describe("cuda.memory_stats", function()
  nogpu("says there is no driver", function()
    C.raises("cuda.memory_stats: no CUDA driver found", cuda.memory_stats)
    C.raises("cuda.set_memory_limit: no CUDA driver found", cuda.set_memory_limit, 1024)
    C.raises("cuda.reset_memory_stats: no CUDA driver found", cuda.reset_memory_stats)
  end)

  gpu("refuses a bad device, naming itself", function()
    local n = #cuda.devices()
    C.raises(("cuda.memory_stats: device id %d out of range (0..%d)"):format(n, n - 1), cuda.memory_stats, n)
    C.raises("cuda.memory_stats: device id -1 out of range", cuda.memory_stats, -1)
    C.raises("cuda.memory_stats: argument 1: expected a device id, got string", cuda.memory_stats, "0")
    C.raises("cuda.reset_memory_stats: argument 1: expected a device id, got table", cuda.reset_memory_stats, {})
    C.raises("cuda.set_memory_limit: argument 2: expected a device id, got boolean", cuda.set_memory_limit, 0, true)
  end)

  gpu("counts arrays in use and blocks cached as CuPy's test_used_bytes, test_free_bytes, test_total_bytes", function()
    local unit = 256 * math.random(1, 64)
    local base = fresh()
    local function delta(field) return cuda.memory_stats()[field] - base[field] end
    local p1 = alloc(2, unit)
    assert.equal(2 * unit, delta("used_bytes"))
    assert.equal(0, delta("cached_bytes"))
    local p2 = alloc(4, unit)
    assert.equal(6 * unit, delta("used_bytes"))
    assert.equal(6 * unit, delta("total_bytes"))
    assert.equal(2, delta("allocations"))
    p2:close()
    assert.equal(2 * unit, delta("used_bytes"))
    assert.equal(4 * unit, delta("cached_bytes"))
    assert.equal(6 * unit, delta("total_bytes"))
    p1:close()
    assert.equal(0, delta("used_bytes"))
    assert.equal(6 * unit, delta("cached_bytes"))
    assert.equal(0, delta("allocations"))
    -- the cached 2-unit block serves the next 2-unit array: one hit, the total unchanged
    local hits = cuda.memory_stats().cache_hits
    local p3 = alloc(2, unit)
    local s = cuda.memory_stats()
    assert.equal(2 * unit, s.used_bytes - base.used_bytes)
    assert.equal(4 * unit, s.cached_bytes - base.cached_bytes)
    assert.equal(s.used_bytes + s.cached_bytes, s.total_bytes)
    assert.equal(hits + 1, s.cache_hits)
    assert.equal(3, s.allocations_total - base.allocations_total)
    p3:close()
    cuda.empty_cache()
    assert.equal(0, delta("cached_bytes"))
    assert.equal(0, delta("total_bytes"))
  end)

  gpu("keeps a block freed on one stream for that stream (CuPy's test_total_bytes_stream)", function()
    local unit = 256 * math.random(1, 64)
    local base = fresh()
    local s = cuda.stream()
    alloc(4, unit):close()
    local p2 = alloc(4, unit, s) -- same size, another stream: not the cached block
    local st = cuda.memory_stats()
    assert.equal(8 * unit, st.total_bytes - base.total_bytes)
    assert.equal(4 * unit, st.cached_bytes - base.cached_bytes)
    assert.equal(base.cache_hits, st.cache_hits)
    p2:close()
    s:synchronize()
    cuda.empty_cache()
  end)

  gpu("counts pinned, mapped and managed memory apart from device arrays", function()
    local base = fresh()
    local n1, n2, n3 = math.random(1, 5000), math.random(1, 5000), math.random(1, 5000)
    local a, b = cuda.pinned_array(n1, "float64"), cuda.mapped_array(n2, "int16")
    local m = cuda.managed_array(n3, "int32")
    local s = cuda.memory_stats()
    assert.equal(n1 * 8 + n2 * 2, s.pinned_bytes - base.pinned_bytes)
    assert.equal(n3 * 4, s.managed_bytes - base.managed_bytes)
    assert.equal(base.used_bytes, s.used_bytes)
    assert.equal(3, s.allocations - base.allocations)
    a:close(); b:close(); m:close()
    s = cuda.memory_stats()
    assert.equal(base.pinned_bytes, s.pinned_bytes)
    assert.equal(base.managed_bytes, s.managed_bytes)
    assert.equal(base.allocations, s.allocations)
  end)

  gpu("keeps the high-water mark until reset_memory_stats", function()
    local base = fresh()
    cuda.reset_memory_stats()
    local s = cuda.memory_stats()
    assert.equal(s.used_bytes, s.peak_used_bytes)
    assert.equal(s.allocations, s.allocations_total)
    assert.equal(0, s.cache_hits)
    local sizes, peak, live = {}, 0, 0
    local arrays = {}
    for i = 1, 12 do
      if #arrays > 0 and math.random() < 0.4 then
        local a = table.remove(arrays, math.random(#arrays))
        live = live - a.nbytes
        a:close()
      else
        sizes[i] = 4 * math.random(1, 100000)
        arrays[#arrays + 1] = cuda.device_array(sizes[i] // 4, "int32")
        live = live + sizes[i]
        peak = math.max(peak, live)
      end
    end
    s = cuda.memory_stats()
    assert.equal(base.used_bytes + live, s.used_bytes)
    assert.equal(base.used_bytes + peak, s.peak_used_bytes)
    -- the driver's pool holds every device array (and the cached blocks)
    assert.is_true(s.pool_used_bytes >= s.total_bytes, "pool " .. s.pool_used_bytes .. " total " .. s.total_bytes)
    assert.is_true(s.reserved_bytes >= s.pool_used_bytes)
    assert.is_true(s.peak_reserved_bytes >= s.reserved_bytes)
    for _, a in ipairs(arrays) do a:close() end
    cuda.reset_memory_stats()
    s = cuda.memory_stats()
    assert.equal(base.used_bytes, s.peak_used_bytes)
    cuda.empty_cache()
  end)

  gpu("does not count an array allocated in a capture: its memory is the graph's, while it runs", function()
    local base = fresh()
    local s = cuda.stream()
    local n = math.random(1, 10000)
    s:begin_capture()
    local a = cuda.device_array(n, "int32", s)
    -- (the driver pool's counts are left out: its query would end the capture)
    local inside = cuda.memory_stats()
    a:fill(3, s)
    a:close()
    local g = s:end_capture()
    assert.equal(base.used_bytes, inside.used_bytes)
    assert.is_nil(inside.pool_used_bytes)
    assert.is_nil(inside.reserved_bytes)
    g:instantiate():launch(s)
    s:synchronize()
    assert.equal(base.used_bytes, cuda.memory_stats().used_bytes)
    assert.equal(base.allocations, cuda.memory_stats().allocations)
  end)
end)

describe("cuda.set_memory_limit", function()
  gpu("sets and reads back the limit as CuPy's test_set_limit_size and test_set_limit_fraction", function()
    local before = cuda.set_memory_limit(1024)
    assert.equal(1024, cuda.memory_stats().limit)
    assert.equal(1024, cuda.set_memory_limit(2 ^ 33 // 1))
    assert.equal(2 ^ 33 // 1, cuda.memory_stats().limit)
    cuda.set_memory_limit(0)
    assert.equal(0, cuda.memory_stats().limit)
    C.raises("cuda.set_memory_limit: bytes must be an integer >= 0 (0 or nil: no limit) or {fraction = f}, got -1",
             cuda.set_memory_limit, -1)
    C.raises("cuda.set_memory_limit: bytes must be an integer >= 0 (0 or nil: no limit) or {fraction = f}, got 1.5",
             cuda.set_memory_limit, 1.5)
    local _, total = cuda.mem_info()
    cuda.set_memory_limit { fraction = 0.5 }
    assert.equal(total // 2, cuda.memory_stats().limit)
    cuda.set_memory_limit { fraction = 1 }
    assert.equal(total, cuda.memory_stats().limit)
    cuda.set_memory_limit { fraction = 0 }
    assert.equal(0, cuda.memory_stats().limit)
    C.raises("cuda.set_memory_limit: fraction must be a number from 0 to 1, got -1", cuda.set_memory_limit, { fraction = -1 })
    C.raises("cuda.set_memory_limit: fraction must be a number from 0 to 1, got 1.1", cuda.set_memory_limit, { fraction = 1.1 })
    C.raises("cuda.set_memory_limit: unknown option 'size' (fraction)", cuda.set_memory_limit, { size = 1 })
    cuda.set_memory_limit(before)
  end)

  gpu("refuses an array past the limit, naming it, after collecting and emptying the cache", function()
    local unit = 256 * math.random(1, 64)
    local base = fresh()
    local held = base.used_bytes
    local before = cuda.set_memory_limit(held + 3 * unit)
    local ok, err = pcall(function()
      local keep = { alloc(2, unit) }
      -- 2 more units would pass it
      C.raises(("cuda.device_array: %d more bytes would pass device %d's memory limit of %d bytes "
        .. "(cuda.set_memory_limit): %d bytes are in use by arrays and 0 cached"):format(2 * unit,
          cuda.current_device(), held + 3 * unit, held + 2 * unit), alloc, 2, unit)
      -- an unreachable array is collected to make room
      assert.equal(2 * unit, keep[1].nbytes)
      keep[1] = nil
      local b = alloc(3, unit)
      assert.equal(held + 3 * unit, cuda.memory_stats().used_bytes)
      b:close()
      -- cached blocks count, and are freed to make room
      assert.equal(3 * unit, cuda.memory_stats().cached_bytes - base.cached_bytes)
      local c = alloc(1, unit)
      assert.equal(0, cuda.memory_stats().cached_bytes - base.cached_bytes)
      -- other kinds of memory are not limited
      local p = cuda.pinned_array(4 * unit // 4, "float32")
      p:close(); c:close()
      -- another device's limit is its own
      if #cuda.devices() > 1 then
        local other = (cuda.current_device() + 1) % #cuda.devices()
        assert.equal(0, cuda.memory_stats(other).limit)
      end
    end)
    cuda.set_memory_limit(before)
    cuda.empty_cache()
    assert(ok, err)
  end)
end)
