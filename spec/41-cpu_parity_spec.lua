-- The CPU device against a GPU (issue 29): the same kernels and helpers, on random data, in a
-- process on each (spec/support/parity_child.lua); integer results, the random states' uniform
-- draws and the helpers on integer data must be the same bits. Floats that go through the
-- math library (the normal draws: logf, cosf) or that a GPU fuses into one rounding (a*x+y
-- as an fma) are compared within a few units in the last place. Runs where a GPU is: it
-- compares the two.
local H = require "spec.helper"

local function results(seed, env)
  local out, ok = H.run(("%s %s timeout 600 %s spec/support/parity_child.lua %d 2>&1"):format(
    "CUDALUA_CACHE_DIR=" .. H.q(os.getenv("CUDALUA_CACHE_DIR") or "/tmp/cudalua-parity-cache"), env, H.LUA, seed))
  assert(ok, out)
  local r = {}
  for line in out:gmatch("[^\n]+") do
    local name, kind, rest = line:match("^(%S+) (%S+) ?(.*)$")
    if name then
      local vals = {}
      for v in rest:gmatch("%S+") do vals[#vals + 1] = v end
      r[name] = { kind = kind, vals = vals }
    end
  end
  return r, out
end

-- a float's bits (hex, little-endian) as the integer that orders floats: ulps apart = difference
local function ordered(hex, fmt)
  local bytes = hex:gsub("%x%x", function(b) return string.char(tonumber(b, 16)) end)
  local i = string.unpack(fmt == "<f" and "<i4" or "<i8", bytes)
  -- negative floats count down from zero (-0.0 and +0.0 both 0)
  if i < 0 then i = (fmt == "<f" and -(1 << 31) or math.mininteger) - i end
  return i
end

local function ulps(a, b, fmt) return math.abs(ordered(a, fmt) - ordered(b, fmt)) end

local EXACT = { "uniform32", "uniform64", "mix_h", "mix_q", "block_sum", "hist", "ballots", "reduce", "elementwise" }
local NEAR = { normal32 = 4, saxpy = 1 }   -- at most these ulps apart, and mostly the same bits
-- normal64 takes the float logf of a uniform draw: within a few float ulps (relative 2^-21)
local function near64(a, b)
  local x = string.unpack("<d", (a:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)))
  local y = string.unpack("<d", (b:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)))
  return math.abs(x - y) <= 2 ^ -21 * math.abs(x) + 1e-300
end

describe("the CPU device against a GPU", function()
  local run = H.has_gpu and not H.cpu_device and it or function(name)
    pending(name .. " #gpu (it compares a GPU with the CPU device: no GPU here)")
  end
  run("gives the same bits for integer kernels, uniform draws, reduce and elementwise; floats within ulps #gpu", function()
    local seed = math.random(1, 2 ^ 30)
    local gpu, gout = results(seed, "")
    local cpu, cout = results(seed, "CUDALUA_DEVICE=cpu")
    assert.equal("gpu", gpu.kind and gpu.kind.kind, gout)
    assert.equal("cpu", cpu.kind and cpu.kind.kind, cout)
    for _, name in ipairs(EXACT) do
      assert(gpu[name] and cpu[name], name .. " missing:\n" .. gout .. "\n" .. cout)
      assert.is_true(#gpu[name].vals > 0, name)
      assert.same(gpu[name].vals, cpu[name].vals, ("%s differs (seed %d)"):format(name, seed))
    end
    for name, limit in pairs(NEAR) do
      local g, c = gpu[name].vals, cpu[name].vals
      assert.equal(#g, #c, name)
      local worst, same = 0, 0
      for i = 1, #g do
        local d = ulps(g[i], c[i], gpu[name].kind)
        worst = math.max(worst, d)
        if d == 0 then same = same + 1 end
      end
      assert.is_true(worst <= limit, ("%s: %d ulps apart at worst (seed %d)"):format(name, worst, seed))
      assert.is_true(same >= #g // 2, ("%s: only %d of %d the same bits (seed %d)"):format(name, same, #g, seed))
    end
    local g, c = gpu.normal64.vals, cpu.normal64.vals
    assert.equal(#g, #c)
    for i = 1, #g do assert(near64(g[i], c[i]), ("normal64 %d: %s against %s (seed %d)"):format(i, g[i], c[i], seed)) end
  end)
end)
