-- cudalua.gpus: Numba's cuda.gpus. #cuda.gpus is the number of devices, cuda.gpus[i] (0-based,
-- as CUDA numbers them) one of them, cuda.gpus.current the selected one; pairs(cuda.gpus)
-- goes through them (ipairs starts at 1: use `for i = 0, #cuda.gpus - 1`). A gpu selects
-- itself for a while and then gives the selection back:
--   local g <close> = cuda.gpus[1]:use()      -- until the end of the block
--   cuda.gpus[1]:run(function() ... end)      -- for the call (errors too)
local core = ...

local Gpu = {}
local ids = setmetatable({}, { __mode = "k" })   -- gpu object -> its device id (read-only)

local function check(g, what)
  local id = ids[g]
  if not id then error(("cudalua: gpu:%s: expected a gpu (call it as g:%s())"):format(what, what), 3) end
  return id
end

local gpu_mt = {
  __index = function(g, k)
    if k == "id" then return ids[g] end
    local m = Gpu[k]
    if m then return m end
    error(("cudalua: gpu[k]: gpus have no field '%s'"):format(tostring(k)), 2)
  end,
  __newindex = function() error("cudalua: gpu[k] =: gpus are read-only", 2) end,
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
function Gpu.info(g) return core.devices()[check(g, "info") + 1] end

local Guard = {}
Guard.__index = Guard
Guard.__name = "cudalua.gpu_guard"
function Guard.restore(self)
  if getmetatable(self) ~= Guard then error("cudalua: guard:restore: call it as guard:restore()", 2) end
  if self.prev then core.select_device(self.prev); self.prev = nil end
end
Guard.__close = Guard.restore

-- g:use() -> a guard: this device is selected until the guard is closed (<close>) or restored
function Gpu.use(g)
  local id = check(g, "use")
  local prev = core.current_device()
  core.select_device(id)
  return setmetatable({ prev = prev }, Guard)
end

-- g:run(fn, ...) -> fn(...)'s results, with this device selected for the call
function Gpu.run(g, fn, ...)
  local id = check(g, "run")
  if type(fn) ~= "function" then error("cudalua: gpu:run: expected a function, got " .. type(fn), 2) end
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
  check(g, "synchronize")
  Gpu.run(g, core.synchronize)
end

return setmetatable({}, {
  __len = function() return core.device_count() end,
  __index = function(_, k)
    if k == "current" then return gpu(core.current_device()) end
    if math.type(k) ~= "integer" then
      error(("cudalua: cuda.gpus: expected a device id (0-based) or 'current', got %s"):format(tostring(k)), 2)
    end
    local n = core.device_count()
    if k < 0 or k >= n then
      error(("cudalua: cuda.gpus[%d]: device id out of range (%s)"):format(k, n > 0 and ("0.." .. n - 1) or
            "no CUDA device: " .. tostring(core.driver_error())), 2)
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
  __newindex = function() error("cudalua: cuda.gpus is read-only", 2) end,
  __name = "cudalua.gpus",
  methods = Gpu,   -- for the reference spec
})
