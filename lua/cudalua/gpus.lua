-- cudalua.gpus: Numba's cuda.gpus. #cuda.gpus is the number of devices, cuda.gpus[i] (0-based,
-- as CUDA numbers them) one of them, cuda.gpus.current the selected one; pairs(cuda.gpus)
-- goes through them (ipairs starts at 1: use `for i = 0, #cuda.gpus - 1`). A gpu selects
-- itself for a while and then gives the selection back:
--   local g <close> = cuda.gpus[1]:use()      -- until the end of the block
--   cuda.gpus[1]:run(function() ... end)      -- for the call (errors too)
local core = ...
local check = require "cudalua.check"

local Gpu = {}
local ids = setmetatable({}, { __mode = "k" })   -- gpu object -> its device id (read-only)

local function id_of(g, what)
  local id = ids[g]
  if not id then check.error("gpu:" .. what, 3, "expected a gpu (call it as g:%s())", what) end
  return id
end

local gpu_mt = {
  __index = function(g, k)
    if k == "id" then return ids[g] end
    local m = Gpu[k]
    if m then return m end
    check.error("gpu[k]", 2, "gpus have no field '%s'", tostring(k))
  end,
  __newindex = function() check.error("gpu[k] =", 2, "gpus are read-only") end,
  __tostring = function(g) return ("cudalua.gpu<%d: %s>"):format(ids[g], core.devices()[ids[g] + 1].name) end,
  __name = "cudalua.gpu",
}

local cache = {}
local function gpu(i)
  local g = cache[i]
  if not g then
    g = setmetatable({}, gpu_mt)
    ids[g] = i
    cache[i] = g
  end
  return g
end

-- name, compute_capability, multiprocessors, ... as cuda.devices() gives them
function Gpu.info(g) return core.devices()[id_of(g, "info") + 1] end

local Guard = {}
Guard.__index = Guard
Guard.__name = "cudalua.gpu_guard"
function Guard.restore(self)
  if getmetatable(self) ~= Guard then check.error("guard:restore", 2, "call it as guard:restore()") end
  if self.prev then core.select_device(self.prev); self.prev = nil end
end
Guard.__close = Guard.restore

-- g:use() -> a guard: this device is selected until the guard is closed (<close>) or restored
function Gpu.use(g)
  local id = id_of(g, "use")
  local prev = core.current_device()
  core.select_device(id)
  return setmetatable({ prev = prev }, Guard)
end

-- g:run(fn, ...) -> fn(...)'s results, with this device selected for the call
function Gpu.run(g, fn, ...)
  local id = id_of(g, "run")
  if type(fn) ~= "function" then check.error("gpu:run", 2, "expected a function, got %s", type(fn)) end
  local prev = core.current_device()
  if prev == id then return fn(...) end
  core.select_device(id)
  local r = table.pack(pcall(fn, ...))
  core.select_device(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- g:synchronize(): waits for all work on this device
function Gpu.synchronize(g)
  id_of(g, "synchronize")
  Gpu.run(g, core.synchronize)
end

return setmetatable({}, {
  __len = function() return core.device_count() end,
  __index = function(_, k)
    if k == "current" then return gpu(core.current_device()) end
    if math.type(k) ~= "integer" then
      check.error("cuda.gpus", 2, "expected a device id (0-based) or 'current', got %s", tostring(k))
    end
    local n = core.device_count()
    if k < 0 or k >= n then
      check.error("cuda.gpus[" .. k .. "]", 2, "device id out of range (%s)",
        n > 0 and ("0.." .. n - 1) or "no CUDA device: " .. check.cause(core.driver_error()))
    end
    return gpu(k)
  end,
  __pairs = function()
    local n = core.device_count()
    return function(_, i)
      i = i + 1
      if i < n then return i, gpu(i) end
    end, nil, -1
  end,
  __newindex = function() check.error("cuda.gpus[k] =", 2, "cuda.gpus is read-only") end,
  __name = "cudalua.gpus",
  methods = Gpu,   -- for the reference spec
})
