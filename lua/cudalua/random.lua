-- cudalua.random: Numba's xoroshiro128+ generators. States are made on the GPU in parallel:
-- state i is the seeded state jumped 2^64 draws (start + i) times, computed from precomputed
-- powers of the jump matrix (src/random.c) instead of a serial host loop.
local core = ...
local gpus = require "cudalua.gpus"
local check = require "cudalua.check"
local M = {}

local init_kernel, matrices = {}, {}   -- per device

local function splitmix(seed)   -- seed: an integer (launch's is checked by check_int)
  -- Lua integers wrap around like uint64 arithmetic
  local z = seed + 0x9E3779B97F4A7C15
  z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9
  z = (z ~ (z >> 27)) * 0x94D049BB133111EB
  return z ~ (z >> 31)
end
function M.splitmix64(seed)
  if math.type(seed) ~= "integer" then
    check.error("cuda.random.splitmix64", 2, "seed must be an integer, got %s", (math.type(seed) or type(seed)))
  end
  return splitmix(seed)
end

local function cuda() return require "cudalua" end

-- the kernel and the jump matrices on the selected device dev
local function prepare(dev)
  if not init_kernel[dev] then
    local mod = cuda().compile("#define CUDALUA_RANDOM_INIT\n#include <cudalua/random.cuh>\n", {
      name = "cudalua_random.cu", name_expressions = { "cudalua_xoroshiro128p_init" } })
    init_kernel[dev] = mod:get("cudalua_xoroshiro128p_init")
  end
  if not matrices[dev] then
    local bytes = core.xoroshiro_jump_matrices(64)
    local n = #bytes // 8
    local host = cuda().array(n, "int64")
    for i = 1, n do host[i] = string.unpack("<i8", bytes, (i - 1) * 8 + 1) end
    matrices[dev] = cuda().to_device(host)
  end
  return init_kernel[dev], matrices[dev]
end

local function check_int(v, what, where)
  if math.type(v) ~= "integer" then
    if type(v) == "number" and v == math.floor(v) and v >= 0 and v < 2 ^ 64 then
      return v >= 2 ^ 63 and math.tointeger(v - 2 ^ 64) or math.tointeger(v)
    end
    check.error(where, 3, "%s must be an integer, got %s", what, tostring(v))
  end
  return v
end

-- the states' initialisation, on their device dev (selected)
local function launch(dev, states, count, seed, sub, stream)
  local kernel, m = prepare(dev)
  local block = 256
  kernel[{ (count + block - 1) // block, block, stream }](states, count, splitmix(seed), sub, m)
end

-- init_xoroshiro128p_states(states, seed [, subsequence_start [, stream]])
function M.init_xoroshiro128p_states(states, seed, subsequence_start, stream)
  local n, dtype, kind, _, dev, contig = core.array_info(states)
  if not n or kind ~= "device_array" or tostring(dtype) ~= "uint64" or states.shape[2] ~= 2 then
    check.error("cuda.random.init_xoroshiro128p_states", 2, "states must be a device array of uint64 with shape {n, 2}")
  end
  if not contig then
    check.error("cuda.random.init_xoroshiro128p_states", 2, "states is a strided view: this needs a contiguous array")
  end
  seed = check_int(seed, "seed", "cuda.random.init_xoroshiro128p_states")
  subsequence_start = check_int(subsequence_start or 0, "subsequence_start", "cuda.random.init_xoroshiro128p_states")
  local count = n // 2
  if count == 0 then return states end
  -- on the states' device, whichever is selected
  gpus[dev]:run(launch, dev, states, count, seed, subsequence_start, stream)
  return states
end

-- create_xoroshiro128p_states(n, seed [, subsequence_start [, stream]])
-- create_xoroshiro128p_states(n, {seed =, subsequence_start =, stream =})
function M.create_xoroshiro128p_states(n, seed, subsequence_start, stream)
  if math.type(n) ~= "integer" or n < 0 then
    check.error("cuda.random.create_xoroshiro128p_states", 2, "n must be an integer >= 0, got %s", tostring(n))
  end
  if type(seed) == "table" then
    if subsequence_start ~= nil or stream ~= nil then
      check.error("cuda.random.create_xoroshiro128p_states", 2,
        "with an options table, subsequence_start and stream go in it, not after it")
    end
    local o = seed
    check.options(o, { "seed", "subsequence_start", "stream" }, "cuda.random.create_xoroshiro128p_states", 3)
    seed, subsequence_start, stream = o.seed, o.subsequence_start, o.stream
  end
  if seed == nil then -- as Numba: no seed, a random one
    seed = (os.time() * 1000003) ~ math.floor(core.time() * 1e9)
  end
  local states = cuda().device_array({ math.max(n, 0), 2 }, "uint64", stream)
  local ok, err = pcall(M.init_xoroshiro128p_states, states, seed, subsequence_start, stream)
  if not ok then
    local called = "cudalua: cuda.random.create_xoroshiro128p_states"   -- the function the user called
    error((tostring(err):gsub("^cudalua: cuda%.random%.init_xoroshiro128p_states", called)), 2)
  end
  return states
end

return M
