-- cudalua.nccl: NCCL collectives on cudalua arrays and CUDA Array Interface objects, across the
-- GPUs of one process (comm_init_all) or one process per GPU, on one machine or many
-- (comm_init_rank with an id passed around). NCCL is opened at run time (libnccl.so.2:
-- CUDALUA_NCCL, NCCL_HOME/lib, the loader's path); without it this module still loads and
-- every call raises saying so.
--   local nccl = require "cudalua.nccl"
--   local comms = nccl.comm_init_all()                  -- every GPU, one communicator each
--   nccl.group(function()
--     for i, c in ipairs(comms) do c:all_reduce(send[i], recv[i], "sum") end
--   end)
local core = ...
local C = core.nccl
local check = require "cudalua.check"
local M = {}

-- nccl.is_available() -> true | false, why
M.is_available = C.available

-- nccl.version() -> e.g. 22703 for 2.27.3
M.version = C.version

-- nccl.unique_id() -> 256 hex characters every rank passes to comm_init_rank
M.unique_id = C.unique_id

-- nccl.comm_init_rank(nranks, id, rank) -> a communicator on the selected device; blocks until
-- every rank has joined
function M.comm_init_rank(nranks, id, rank)
  if type(id) ~= "string" then check.error("nccl.comm_init_rank", 2, "id must be the string nccl.unique_id() gave, got %s", type(id)) end
  return C.comm_init_rank(nranks, id, rank)   -- a tail call: errors point at the caller
end

local Comms = {}
Comms.__index = Comms
Comms.__name = "cudalua.nccl_comms"
function Comms:close()   -- closes them all (one member's close closes its whole list)
  if getmetatable(self) ~= Comms then check.error("comms:close", 2, "call it as comms:close()") end
  for _, c in ipairs(self) do c:close() end
end
Comms.__close = Comms.close

-- nccl.comm_init_all([devices]) -> a list of communicators, rank i on devices[i] (all GPUs
-- by default); comms:close() (or <close>) ends them together
function M.comm_init_all(devices)
  if devices == nil then
    devices = {}
    for i = 0, core.device_count() - 1 do devices[#devices + 1] = i end
    if #devices == 0 then check.error("nccl.comm_init_all", 2, "%s", check.cause(core.driver_error())) end
  elseif type(devices) ~= "table" then
    check.error("nccl.comm_init_all", 2, "expected a list of device ids, got %s", type(devices))
  end
  local ok, list = pcall(C.comm_init_all, devices)
  if not ok then error(list, 2) end
  return setmetatable(list, Comms)
end

-- nccl.group(fn, ...): fn's collectives are queued as one group (ncclGroupStart/End); the
-- group ends even when fn raises, and the error is raised after it
M.group = C.group   -- in C: it runs in loops of small collectives

return M
