-- cudalua.gpus: Numba's cuda.gpus. #cuda.gpus is the number of devices, cuda.gpus[i] (0-based,
-- as CUDA numbers them) one of them, cuda.gpus.current the selected one. A gpu selects itself
-- for a while and then gives the selection back:
--   local g <close> = cuda.gpus[1]:use()      -- until the end of the block
--   cuda.gpus[1]:run(function() ... end)      -- for the call (errors too)
local core = ...

local Gpu = {}
Gpu.__index = Gpu

local cache = {}
local function gpu(i)
  local g = cache[i]
  if not g then
    g = setmetatable({ id = i }, Gpu)
    cache[i] = g
  end
  return g
end

-- name, compute_capability, multiprocessors, ... as cuda.devices() gives them
function Gpu:info() return core.devices()[self.id + 1] end
function Gpu:__tostring() return ("cudalua.gpu<%d: %s>"):format(self.id, self:info().name) end

local Guard = { __name = "cudalua.gpu_guard" }
Guard.__index = Guard
function Guard:__close() self:restore() end
function Guard:restore()
  if self.prev then core.select_device(self.prev); self.prev = nil end
end

-- g:use() -> a guard: this device is selected until the guard is closed (<close>) or restored
function Gpu:use()
  local prev = core.current_device()
  core.select_device(self.id)
  return setmetatable({ prev = prev }, Guard)
end

-- g:run(fn, ...) -> fn(...)'s results, with this device selected for the call
function Gpu:run(fn, ...)
  if type(fn) ~= "function" then error("gpu:run: expected a function, got " .. type(fn), 2) end
  local prev = core.current_device()
  core.select_device(self.id)
  local r = table.pack(pcall(fn, ...))
  core.select_device(prev)
  if not r[1] then error(r[2], 0) end
  return table.unpack(r, 2, r.n)
end

-- g:synchronize(): waits for all work on this device
function Gpu:synchronize()
  self:run(core.synchronize)
end

return setmetatable({}, {
  __len = function() return core.device_count() end,
  __index = function(_, k)
    if k == "current" then return gpu(core.current_device()) end
    if math.type(k) ~= "integer" then
      error(("cuda.gpus: expected a device id (0-based) or 'current', got %s"):format(tostring(k)), 2)
    end
    local n = core.device_count()
    if k < 0 or k >= n then
      error(("cuda.gpus[%d]: device id out of range (%s)"):format(k, n > 0 and ("0.." .. n - 1) or
            "no CUDA device: " .. tostring(core.driver_error())), 2)
    end
    return gpu(k)
  end,
  __newindex = function() error("cuda.gpus is read-only", 2) end,
  __name = "cudalua.gpus",
})
