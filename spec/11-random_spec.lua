-- cuda.random: Numba's xoroshiro128+ generators. create_xoroshiro128p_states(n, seed | opts)
-- makes a {n, 2} uint64 device array: state i is the splitmix64-seeded state jumped 2^64 draws
-- (subsequence_start + i) times; init_xoroshiro128p_states fills an existing one. The states
-- are compared with a CPU reference written here in Lua (Numba's own algorithm, with 64-bit
-- integer arithmetic), and the draws of kernels/cudalua/random.cuh with the same reference.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local R = require "cudalua.random"
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)
local NO_DRIVER = "no CUDA driver found" -- (the library path follows)

---------------------------------------------------------------------------------------------
-- the CPU reference: Numba's init_xoroshiro128p_states, xoroshiro128p_next and _jump
local function rotl(x, k) return (x << k) | (x >> (64 - k)) end

local function next_bits(s) -- s = {s0, s1}, advanced in place
  local s0, s1 = s[1], s[2]
  local result = s0 + s1
  s1 = s1 ~ s0
  s[1] = rotl(s0, 55) ~ s1 ~ (s1 << 14)
  s[2] = rotl(s1, 36)
  return result
end

local JUMP = { 0xbeac0467eba5facb, 0xd86b048b86aa9922 }
local function jump(s)
  local r0, r1 = 0, 0
  for _, w in ipairs(JUMP) do
    for b = 0, 63 do
      if (w >> b) & 1 == 1 then r0, r1 = r0 ~ s[1], r1 ~ s[2] end
      next_bits(s)
    end
  end
  s[1], s[2] = r0, r1
end

local function reference(n, seed, start)
  local z = R.splitmix64(seed)
  local s = { z, z }
  for _ = 1, start or 0 do jump(s) end
  local out = {}
  for i = 1, n do
    if i > 1 then jump(s) end
    out[i] = { s[1], s[2] }
  end
  return out
end

local function unit64(bits) return (bits >> 11) * (1.0 / 9007199254740992.0) end

-- the states on the device as {{s0, s1}, ...} of Lua integers (the bit patterns)
local function states_of(st)
  local h = st:view("int64"):copy_to_host()
  local out = {}
  for i = 1, st.shape[1] do out[i] = { h:get(i, 1), h:get(i, 2) } end
  return out
end

local SRC = [[
#include <cudalua/random.cuh>
extern "C" __global__ void raw(xoroshiro128p_state *s, unsigned long long *out, int n, int per) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) for (int j = 0; j < per; j++) out[(long long)i * per + j] = xoroshiro128p_next(s, i);
}
extern "C" __global__ void uniform64(xoroshiro128p_state *s, double *out, int n, int per) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) for (int j = 0; j < per; j++) out[(long long)i * per + j] = xoroshiro128p_uniform_float64(s, i);
}
extern "C" __global__ void uniform32(xoroshiro128p_state *s, float *out, int n, int per) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) for (int j = 0; j < per; j++) out[(long long)i * per + j] = xoroshiro128p_uniform_float32(s, i);
}
extern "C" __global__ void normal64(xoroshiro128p_state *s, double *out, int n, int per) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) for (int j = 0; j < per; j++) out[(long long)i * per + j] = xoroshiro128p_normal_float64(s, i);
}
extern "C" __global__ void normal32(xoroshiro128p_state *s, float *out, int n, int per) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) for (int j = 0; j < per; j++) out[(long long)i * per + j] = xoroshiro128p_normal_float32(s, i);
}
extern "C" __global__ void jump_all(xoroshiro128p_state *s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) xoroshiro128p_jump(s, i);
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC, { name = "random.cu" })
  return mod:get(name)
end

-- per draws of kernel `name` from each of the states (n of them), on the host
local function draws(name, states, per, dtype)
  local n = states.shape[1]
  local out = cuda.device_array(n * per, dtype)
  K(name)[{ (n + 127) // 128, 128 }](states, out, n, per)
  return out:copy_to_host()
end

local function moments(a)
  local n, s, s2, within = #a, 0, 0, 0
  for i = 1, n do
    local v = a[i]
    s, s2 = s + v, s2 + v * v
    if v > -1 and v < 1 then within = within + 1 end
  end
  local mean = s / n
  return mean, math.sqrt(s2 / n - mean * mean), within / n
end

it("the kernels of this file compile", function()
  assert.same({ "jump_all", "normal32", "normal64", "raw", "uniform32", "uniform64" },
              cuda.compile(SRC, { arch = "sm_90", name = "random.cu" }):kernels())
end)

describe("the CPU reference of this file", function()
  it("gives the states and draws of Numba's algorithm", function()
    -- values computed independently with Numba's code (in Python, uint64 arithmetic)
    assert.equal(0xe220a8397b1dcdaf, R.splitmix64(0))
    assert.equal(0x910a2dec89025cc1, R.splitmix64(1))
    assert.equal(0x22118258a9d111a0, R.splitmix64(12345))
    assert.equal(0xe4d971771b652c20, R.splitmix64(-1)) -- 2^64 - 1
    assert.same({ { 0x910a2dec89025cc1, 0x910a2dec89025cc1 }, { 0x73c19a5348fc9098, 0x6c96c932f21d71ee },
                  { 0x0b3d0cd6ddfa7a4c, 0xd3c2c33e9b8e707a } }, reference(3, 1, 0))
    assert.same({ { 0xef6261e44fd8abc9, 0x0c6ebfa4759a0f22 }, { 0x965712e7ac28b9b1, 0xc5fdd9c6a44f58a6 },
                  { 0x83301600d4232c74, 0xe168d4fc5d8ee374 } }, reference(3, 42, 3))
    local s = reference(2, 1, 0)[2]
    assert.equal(0xe05863863b1a0286, next_bits(s))
    assert.equal(0x35d4f476e08d5559, next_bits(s))
    assert.equal(0.21028068449282, unit64(0x35d4f476e08d5559))
  end)
end)

describe("create_xoroshiro128p_states", function()
  it("rejects n that is not an integer >= 0", function()
    local f = cuda.random.create_xoroshiro128p_states
    C.raises("create_xoroshiro128p_states: n must be an integer >= 0, got -1", f, -1, 1)
    C.raises("create_xoroshiro128p_states: n must be an integer >= 0, got 1.5", f, 1.5, 1)
    C.raises("create_xoroshiro128p_states: n must be an integer >= 0, got 4", f, "4", 1)
    C.raises("create_xoroshiro128p_states: n must be an integer >= 0, got nil", f, nil, 1)
  end)

  it("rejects unknown options and streams that are not streams", function()
    local f = cuda.random.create_xoroshiro128p_states
    C.raises("create_xoroshiro128p_states: unknown option 'sed'", f, 4, { sed = 1 })
    C.raises("create_xoroshiro128p_states: unknown option 'subsequence'", f, 4, { seed = 1, subsequence = 2 })
    C.raises("expected a stream, got string", f, 4, { seed = 1, stream = "s" })
  end)

  nogpu("needs the driver", function()
    C.raises(NO_DRIVER, cuda.random.create_xoroshiro128p_states, 4, 1)
    C.raises(NO_DRIVER, cuda.random.create_xoroshiro128p_states, 4, { seed = 1, subsequence_start = 2 })
  end)

  gpu("makes {n, 2} uint64 device arrays equal to the CPU reference", function()
    for _, c in ipairs { { 20, 1, 0 }, { 20, 1, 3 }, { 20, 0x7eadbeef, 0 }, { 1, 42, 3 }, { 257, -5, 0 } } do
      local n, seed, start = c[1], c[2], c[3]
      local st = cuda.random.create_xoroshiro128p_states(n, { seed = seed, subsequence_start = start })
      assert.same({ n, 2 }, st.shape)
      assert.equal("uint64", tostring(st.dtype))
      assert.equal("device_array", st.kind)
      local want = reference(math.min(n, 40), seed, start)
      local got = states_of(st)
      for i = 1, #want do assert.same(want[i], got[i], ("seed %d start %d state %d"):format(seed, start, i)) end
      if n > 40 then -- the rest: each one the previous one jumped
        local s = { got[40][1], got[40][2] }
        for i = 41, n do
          jump(s)
          assert.same(s, got[i], "state " .. i)
        end
      end
      -- the positional form gives the same states
      assert.same(got, states_of(cuda.random.create_xoroshiro128p_states(n, seed, start)))
    end
  end)

  gpu("subsequence_start shifts the states: far starts agree with each other", function()
    local f = cuda.random.create_xoroshiro128p_states
    local a = states_of(f(20, { seed = 9 }))
    local b = states_of(f(5, { seed = 9, subsequence_start = 3 }))
    for i = 1, 5 do assert.same(a[i + 3], b[i]) end
    local far = 1 << 40
    local x = states_of(f(4, { seed = 9, subsequence_start = far }))
    local y = states_of(f(2, { seed = 9, subsequence_start = far + 2 }))
    assert.same(x[3], y[1])
    assert.same(x[4], y[2])
    local s = { x[1][1], x[1][2] }
    jump(s)
    assert.same(x[2], s)
    assert.are_not.same(a[1], x[1])
  end)

  gpu("takes a stream, and n = 0", function()
    local s = cuda.stream(true)
    local st = cuda.random.create_xoroshiro128p_states(20, { seed = 3, subsequence_start = 1, stream = s })
    s:synchronize()
    assert.same(reference(20, 3, 1), states_of(st))
    local st2 = cuda.random.create_xoroshiro128p_states(20, 3, 1, s)
    s:synchronize()
    assert.same(reference(20, 3, 1), states_of(st2))
    local empty = cuda.random.create_xoroshiro128p_states(0, 1)
    assert.same({ 0, 2 }, empty.shape)
  end)

  gpu("takes seeds as integers, integral floats and uint64 values past 2^63", function()
    local f = cuda.random.create_xoroshiro128p_states
    assert.same(states_of(f(3, 5)), states_of(f(3, 5.0)))
    assert.same(reference(3, math.mininteger, 0), states_of(f(3, 2.0 ^ 63)))
    assert.same(reference(3, -1, 0), states_of(f(3, { seed = -1 })))
  end)

  gpu("same seed, same states; other seeds, other states; no seed, a random one", function()
    local f = cuda.random.create_xoroshiro128p_states
    assert.same(states_of(f(8, 77)), states_of(f(8, 77)))
    assert.are_not.same(states_of(f(8, 77)), states_of(f(8, 78)))
    local a, b = states_of(f(8)), states_of(f(8))
    assert.are_not.same(a, b)
    assert.are_not.same(a[1], reference(1, 0, 0)[1])
  end)

  gpu("rejects seeds and starts that are not integers", function()
    local f = cuda.random.create_xoroshiro128p_states
    C.raises("create_xoroshiro128p_states: seed must be an integer, got 1.5", f, 4, 1.5)
    C.raises("create_xoroshiro128p_states: seed must be an integer, got x", f, 4, { seed = "x" })
    C.raises("create_xoroshiro128p_states: seed must be an integer, got 1.844674407371e+19", f, 4, 2.0 ^ 64)
    C.raises("create_xoroshiro128p_states: subsequence_start must be an integer, got 0.5", f, 4,
             { seed = 1, subsequence_start = 0.5 })
    C.raises("create_xoroshiro128p_states: subsequence_start must be an integer, got 0.5", f, 4, 1, 0.5)
  end)
end)

describe("init_xoroshiro128p_states", function()
  it("rejects what is not a {n, 2} uint64 device array", function()
    local f = cuda.random.init_xoroshiro128p_states
    local MSG = "init_xoroshiro128p_states: states must be a device array of uint64 with shape {n, 2}"
    C.raises(MSG, f, 42, 1)
    C.raises(MSG, f, nil, 1)
    C.raises(MSG, f, {}, 1)
    C.raises(MSG, f, cuda.zeros({ 4, 2 }, "uint64"), 1)
  end)

  gpu("fills an existing array, as create does, and returns it", function()
    local st = cuda.device_array({ 20, 2 }, "uint64")
    assert.equal(st, cuda.random.init_xoroshiro128p_states(st, 11))
    assert.same(reference(20, 11, 0), states_of(st))
    assert.equal(st, cuda.random.init_xoroshiro128p_states(st, 12, 3))
    assert.same(reference(20, 12, 3), states_of(st))
    local s = cuda.stream()
    cuda.random.init_xoroshiro128p_states(st, 13, 0, s)
    s:synchronize()
    assert.same(states_of(cuda.random.create_xoroshiro128p_states(20, 13)), states_of(st))
    -- a view of rows is a {n, 2} array too
    local v = st:slice(5, 9)
    cuda.random.init_xoroshiro128p_states(v, 14)
    local got = states_of(st)
    assert.same(reference(5, 14, 0), { got[5], got[6], got[7], got[8], got[9] })
    assert.same(reference(4, 13, 0), { got[1], got[2], got[3], got[4] })
  end)

  gpu("rejects device arrays of another dtype or shape, and bad seeds", function()
    local f = cuda.random.init_xoroshiro128p_states
    local MSG = "init_xoroshiro128p_states: states must be a device array of uint64 with shape {n, 2}"
    C.raises(MSG, f, cuda.device_array({ 4, 2 }, "int64"), 1)
    C.raises(MSG, f, cuda.device_array({ 4, 3 }, "uint64"), 1)
    C.raises(MSG, f, cuda.device_array(8, "uint64"), 1)
    C.raises(MSG, f, cuda.pinned_array({ 4, 2 }, "uint64"), 1)
    C.raises("init_xoroshiro128p_states: seed must be an integer, got 2.5", f, cuda.device_array({ 4, 2 }, "uint64"), 2.5)
    C.raises("init_xoroshiro128p_states: seed must be an integer, got nil", f, cuda.device_array({ 4, 2 }, "uint64"))
  end)
end)

describe("cudalua/random.cuh", function()
  gpu("draws the reference's bits, uniform float64 and float32 values", function()
    for _, start in ipairs { 0, 3 } do
      local n, per = 20, 8
      local f = cuda.random.create_xoroshiro128p_states
      local ref = reference(n, 2024, start)
      local bits = draws("raw", f(n, { seed = 2024, subsequence_start = start }), per, "uint64")
      local u64 = draws("uniform64", f(n, { seed = 2024, subsequence_start = start }), per, "float64")
      local u32 = draws("uniform32", f(n, { seed = 2024, subsequence_start = start }), per, "float32")
      local bits_i = bits:view("int64")
      for i = 1, n do
        local s = { ref[i][1], ref[i][2] }
        for j = 1, per do
          local b = next_bits(s)
          local k = (i - 1) * per + j
          assert.equal(b, bits_i[k], ("bits, state %d draw %d"):format(i, j))
          assert.equal(unit64(b), u64[k], ("float64, state %d draw %d"):format(i, j))
          assert.equal(C.f32(unit64(b)), u32[k], ("float32, state %d draw %d"):format(i, j))
        end
      end
    end
  end)

  gpu("xoroshiro128p_jump on the device matches the reference's jump", function()
    local st = cuda.random.create_xoroshiro128p_states(20, 31)
    K("jump_all")[{ 1, 32 }](st, 20)
    local ref = reference(21, 31, 0)
    local got = states_of(st)
    for i = 1, 20 do assert.same(ref[i + 1], got[i], "state " .. i) end
  end)

  gpu("uniform draws lie in [0, 1) (float32: [0, 1]) with mean 1/2 and variance 1/12", function()
    local st = cuda.random.create_xoroshiro128p_states(1024, 5)
    for _, c in ipairs { { "uniform64", "float64" }, { "uniform32", "float32" } } do
      local a = draws(c[1], st, 1024, c[2])
      local lo, hi = math.huge, -math.huge
      for i = 1, #a do
        local v = a[i]
        if v < lo then lo = v end
        if v > hi then hi = v end
      end
      assert.is_true(lo >= 0 and lo < 1e-4, c[1] .. " min " .. lo)
      if c[2] == "float64" then assert.is_true(hi < 1, c[1] .. " max " .. hi) end
      assert.is_true(hi <= 1 and hi > 1 - 1e-4, c[1] .. " max " .. hi)
      local mean, sd = moments(a)
      assert.is_true(math.abs(mean - 0.5) < 0.005, c[1] .. " mean " .. mean)
      assert.is_true(math.abs(sd * sd - 1 / 12) < 0.002, c[1] .. " variance " .. sd * sd)
    end
  end)

  gpu("normal draws have mean 0, standard deviation 1 and 68% within one of it", function()
    local st = cuda.random.create_xoroshiro128p_states(1024, { seed = 6, subsequence_start = 1 })
    for _, c in ipairs { { "normal64", "float64" }, { "normal32", "float32" } } do
      local a = draws(c[1], st, 1024, c[2])
      local mean, sd, within = moments(a)
      assert.is_true(math.abs(mean) < 0.01, c[1] .. " mean " .. mean)
      assert.is_true(math.abs(sd - 1) < 0.01, c[1] .. " sd " .. sd)
      assert.is_true(math.abs(within - 0.6827) < 0.005, c[1] .. " within one sd " .. within)
    end
  end)

  gpu("the same seed gives the same draws, other seeds other draws", function()
    local f = cuda.random.create_xoroshiro128p_states
    local a = draws("uniform32", f(256, 100), 16, "float32"):totable()
    local b = draws("uniform32", f(256, 100), 16, "float32"):totable()
    local c = draws("uniform32", f(256, 101), 16, "float32"):totable()
    assert.same(a, b)
    local differ = 0
    for i = 1, #a do if a[i] ~= c[i] then differ = differ + 1 end end
    assert.is_true(differ > #a * 0.99, differ .. " of " .. #a .. " differ")
    -- draws advance the states: a second round differs from the first
    local st = f(256, 100)
    local r1 = draws("uniform32", st, 16, "float32"):totable()
    local r2 = draws("uniform32", st, 16, "float32"):totable()
    assert.same(a, r1)
    assert.are_not.same(r1, r2)
  end)
end)
