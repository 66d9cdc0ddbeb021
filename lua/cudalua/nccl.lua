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

-- nccl.comm_init_rank(nranks, id, rank [, {timeout = s, blocking = false}]) -> a communicator
-- on the selected device, once every rank has joined. Non-blocking by default: NCCL's calls
-- and each collective on the GPU are waited for with the timeout (CUDALUA_NCCL_TIMEOUT, else
-- 600 s); when it passes, or NCCL reports a lost peer, the communicator is aborted and a Lua
-- error names the operation, the rank, the time waited and NCCL's last warning.
function M.comm_init_rank(nranks, id, rank, opts)
  if type(id) ~= "string" then check.error("nccl.comm_init_rank", 2, "id must be the string nccl.unique_id() gave, got %s", type(id)) end
  return C.comm_init_rank(nranks, id, rank, opts)   -- a tail call: errors point at the caller
end

-- nccl.comm_init_at(nranks, "host:port", rank [, options]) -> the same, every rank meeting at
-- the address (rank 0 listens there): nothing to hand round
M.comm_init_at = C.comm_init_at

-- the variables cluster launchers set, most specific first: an mpirun inside a Slurm
-- allocation keeps the allocation's SLURM_PROCID (0) in every rank, so Slurm's come last
local LAUNCHERS = {
  { "torchrun / cudalua-run", "RANK", "WORLD_SIZE", "LOCAL_RANK" },
  { "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK" },
  { "PMI (MPICH, Intel MPI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID" },
  { "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID" },
}

local function int_var(getenv, name, where)
  local v = getenv(name)
  if v == nil or v == "" then return nil end   -- (set empty: unset, as shells see it)
  local n = type(v) == "string" and math.tointeger(tonumber(v)) or nil
  if not n or n < 0 then check.error(where, 4, "%s=%s is not a whole number >= 0", name, tostring(v)) end
  return n
end

local function launch_info(getenv, where)
  for _, l in ipairs(LAUNCHERS) do
    local rank, size = int_var(getenv, l[2], where), int_var(getenv, l[3], where)
    if rank and size then
      if size < 1 or rank >= size then
        check.error(where, 3, "%s=%d and %s=%d: the rank must be below the size", l[2], rank, l[3], size)
      end
      return { rank = rank, size = size, local_rank = int_var(getenv, l[4], where), launcher = l[1] }
    end
  end
  return nil
end

-- nccl.launch_info([getenv]) -> {rank =, size =, local_rank =, launcher =} from the launcher's
-- variables (nil: none set). getenv: os.getenv, or a function standing in for it (tests).
function M.launch_info(getenv)
  if getenv ~= nil and type(getenv) ~= "function" then
    check.error("nccl.launch_info", 2, "expected a function like os.getenv, got %s", type(getenv))
  end
  return launch_info(getenv or os.getenv, "nccl.launch_info")
end

-- rank 0 writes the id to path (whole: written aside, then renamed); the others wait for it
local function id_by_file(path, rank, timeout)
  if rank == 0 then
    local tmp = path .. ".tmp" .. tostring(os.time())
    local f = assert(io.open(tmp, "w"))
    f:write(C.unique_id())
    f:close()
    assert(os.rename(tmp, path))
  end
  local t0 = core.time()
  while true do
    local f = io.open(path)
    local id = f and f:read("a")
    if f then f:close() end
    if id and #id == 256 then return id end
    if core.time() - t0 > timeout then
      check.error("nccl.init", 3, "rank %d: no id in %s after %.1f s (rank 0 writes it)", rank, path, timeout)
    end
    core.sleep(0.02)
  end
end

-- nccl.init([{rank =, size =, local_rank =, device =, addr = "host:port", file = path,
-- timeout = s, blocking = false}]) -> a communicator of the job, started the way cluster
-- launchers start one. What is not given comes from the launcher's variables (launch_info):
-- the device is local_rank modulo this machine's GPUs (selected for the caller); the ranks
-- meet at addr, else MASTER_ADDR:MASTER_PORT (NCCL's bootstrap, rank 0 listening there), else
-- through file (CUDALUA_NCCL_ID_FILE: rank 0 writes the id there; a path all ranks see).
local INIT_OPTIONS = { rank = true, size = true, local_rank = true, device = true, addr = true,
  file = true, timeout = true, blocking = true }
function M.init(opts)
  opts = opts or {}
  if type(opts) ~= "table" then check.error("nccl.init", 2, "expected a table of options, got %s", type(opts)) end
  for k in pairs(opts) do
    if not INIT_OPTIONS[k] then check.error("nccl.init", 2, "unknown option '%s'", tostring(k)) end
  end
  local info = launch_info(os.getenv, "nccl.init") or {}
  local rank, size = opts.rank or info.rank, opts.size or info.size
  if not rank or not size then
    check.error("nccl.init", 2, "no rank and size: give {rank =, size =}, or start the job with a launcher "
      .. "(cudalua-run, torchrun, srun, mpirun: RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_*, PMI_*)")
  end
  if math.type(rank) ~= "integer" or math.type(size) ~= "integer" or size < 1 or rank < 0 or rank >= size then
    check.error("nccl.init", 2, "rank %s of size %s: the rank must be a whole number 0..size-1", tostring(rank), tostring(size))
  end
  local comm_opts = { timeout = opts.timeout, blocking = opts.blocking }
  local addr, file = opts.addr, opts.file
  local function var(name) local v = os.getenv(name); return v ~= "" and v or nil end
  local host, port = var("MASTER_ADDR"), var("MASTER_PORT")
  -- torchrun's own store listens on MASTER_PORT: NCCL's root takes the next port
  if port and var("TORCHELASTIC_RUN_ID") and math.tointeger(tonumber(port)) then port = tostring(math.tointeger(tonumber(port)) + 1) end
  if not addr and not file and host and port then addr = host .. ":" .. port end
  file = file or var("CUDALUA_NCCL_ID_FILE")
  if not addr and not file then
    check.error("nccl.init", 2, "no meeting place: give addr = \"host:port\" or file = path, or set MASTER_ADDR "
      .. "and MASTER_PORT (cudalua-run and torchrun do) or CUDALUA_NCCL_ID_FILE")
  end
  local ngpu = core.device_count()
  if ngpu < 1 then check.error("nccl.init", 2, "%s", check.cause(core.driver_error())) end
  core.select_device(opts.device or (opts.local_rank or info.local_rank or rank) % ngpu)
  if addr then return C.comm_init_at(size, addr, rank, comm_opts) end
  local timeout = opts.timeout or C.default_timeout()   -- (CUDALUA_NCCL_TIMEOUT, read by the C side only)
  local comm = C.comm_init_rank(size, id_by_file(file, rank, timeout), rank, comm_opts)
  -- every rank has read the id once the communicator is made: rank 0 removes the file, so
  -- that the next job's ranks cannot read this one's
  if rank == 0 then os.remove(file) end
  return comm
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
