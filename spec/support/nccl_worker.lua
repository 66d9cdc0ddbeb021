-- spec/support/nccl_worker.lua CASE: one rank of a job that spec/support/nccl_ranks.lua starts
-- (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as cluster launchers set them; each rank its
-- own NCCL_HOSTID, so that ranks on one GPU talk over NCCL's socket transport as machines do).
-- Env: VICTIM (the rank the case kills, -1 none), TIMEOUT (the communicators'), DELAY (seconds
-- before the kill), SEED. Prints "STEP <name>" as it goes, then one of
--   OK <case> <detail>                      the case's work was right
--   FAILED <op> after=<s> msg=<message>     a survivor caught the failure, elapsed since the step began
-- and, after a failure: "USABLE <yes|why>" (arrays and a kernel work) and "REINIT <sum>" (a new
-- communicator of the survivors, at MASTER_PORT + 1, all_reduces their ranks).
package.cpath = "./?.so;" .. package.cpath
package.path = "./?.lua;" .. package.path
local cuda = require "cudalua"
local nccl = require "cudalua.nccl"

local case = arg[1]
local rank, size = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
local victim = tonumber(os.getenv("VICTIM") or "-1")
local timeout = tonumber(os.getenv("TIMEOUT") or "5")
local delay = tonumber(os.getenv("DELAY") or "0.2")
local seed = tonumber(os.getenv("SEED") or "1")
local function say(fmt, ...) io.write(fmt:format(...), "\n"); io.flush() end

local function my_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("n")
  f:close()
  return pid
end
-- SIGKILL for this process after `after` seconds (a shell in the background), or now
local function die(after)
  if after and after > 0 then os.execute(("(sleep %.3f; kill -KILL %d) >/dev/null 2>&1 &"):format(after, my_pid()))
  else os.execute(("kill -KILL %d"):format(my_pid())); cuda.sleep(60) end
end

-- ---- every collective of every kind and dtype, against Lua on seeded random data ----
local DTYPES = { "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64" }
local function values(r, n, dt)   -- rank r's data: small integers, exact in every dtype, sum and product
  local rng, t = seed * 7919 + r * 104729, {}
  for i = 1, n do
    rng = (rng * 1103515245 + 12345) % 2147483648
    -- signed: -2..2; unsigned: 0..3 (a product of 4 ranks stays below 256, uint8's wrap)
    local v = dt:match("^uint") and rng % 4 or rng % 5 - 2
    t[i] = v
  end
  return t
end
local function reduce_ref(n, dt, op)
  local acc
  for r = 0, size - 1 do
    local v = values(r, n, dt)
    if not acc then acc = v
    else
      for i = 1, n do
        local a, b = acc[i], v[i]
        acc[i] = op == "sum" and a + b or op == "prod" and a * b or op == "max" and math.max(a, b) or math.min(a, b)
      end
    end
  end
  return acc
end
local function same(name, got, want)
  for i = 1, #want do
    if got[i] ~= want[i] then error(("%s: element %d is %s, want %s"):format(name, i, tostring(got[i]), tostring(want[i]))) end
  end
end
local function collectives(comm)
  local n, count = 12 * size, 0
  for _, dt in ipairs(DTYPES) do
    local mine = cuda.to_device(cuda.array(values(rank, n, dt), dt))
    local out = cuda.device_array(n, dt)
    for _, op in ipairs { "sum", "prod", "max", "min" } do
      comm:all_reduce(mine, out, op)
      same(dt .. " all_reduce " .. op, out:copy_to_host():totable(), reduce_ref(n, dt, op))
      count = count + 1
    end
    local root = (seed + #dt) % size
    comm:broadcast(mine, out, root)
    same(dt .. " broadcast", out:copy_to_host():totable(), values(root, n, dt))
    comm:reduce(mine, rank == root and out or nil, "sum", root)
    if rank == root then same(dt .. " reduce", out:copy_to_host():totable(), reduce_ref(n, dt, "sum")) end
    local all = cuda.device_array(n * size, dt)
    comm:all_gather(mine, all)
    local want = {}
    for r = 0, size - 1 do for _, v in ipairs(values(r, n, dt)) do want[#want + 1] = v end end
    same(dt .. " all_gather", all:copy_to_host():totable(), want)
    local part = cuda.device_array(n // size, dt)
    comm:reduce_scatter(mine, part, "sum")
    local full, w = reduce_ref(n, dt, "sum"), {}
    for i = 1, n // size do w[i] = full[rank * (n // size) + i] end
    same(dt .. " reduce_scatter", part:copy_to_host():totable(), w)
    -- a ring of send/recv in one group
    local got = cuda.device_array(n, dt)
    nccl.group(function()
      comm:send(mine, (rank + 1) % size)
      comm:recv(got, (rank - 1) % size)
    end)
    same(dt .. " send/recv", got:copy_to_host():totable(), values((rank - 1) % size, n, dt))
    count = count + 5
  end
  return count
end

-- ---- after a failure: the process goes on ----
local function usable()
  local ok, why = pcall(function()
    local k = cuda.kernel('extern "C" __global__ void twice(int *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }', "twice")
    local h = {}
    for i = 1, 1000 do h[i] = i * 3 - 7 end
    local d = cuda.to_device(cuda.array(h, "int32"))
    k[{ 4, 256 }](d, 1000)
    local back = d:copy_to_host()
    for i = 1, 1000 do assert(back[i] == 2 * h[i], "element " .. i) end
  end)
  say("USABLE %s", ok and "yes" or tostring(why))
end
local function reinit()
  local new_rank = rank < victim and rank or rank - 1
  local port = tonumber(os.getenv("MASTER_PORT")) + 1
  local ok, why = pcall(function()
    local c = nccl.init { rank = new_rank, size = size - 1, addr = os.getenv("MASTER_ADDR") .. ":" .. port, timeout = timeout }
    local x = cuda.to_device(cuda.array({ new_rank }, "int64"))
    local y = cuda.device_array(1, "int64")
    c:all_reduce(x, y, "sum")
    local s = y:copy_to_host()[1]
    c:close()
    return s
  end)
  say("REINIT %s", ok and tostring(why) or "failed: " .. tostring(why))
end

-- runs step (a function) and reports its failure; returns true when it raised
local function step(name, f)
  say("STEP %s", name)
  local t0 = cuda.time()
  local ok, err = pcall(f)
  if ok then return false end
  say("FAILED %s after=%.2f msg=%s", name, cuda.time() - t0, tostring(err):gsub("\n", " "))
  return true
end
local function survive() usable(); if victim >= 0 then reinit() end; os.exit(0) end

local comm
local function init() comm = nccl.init { timeout = timeout } end

if case == "collectives" then
  init()
  say("OK collectives %d", collectives(comm))
  comm:close()
  os.exit(0)
end

if case == "file" then   -- meeting through a file rank 0 writes (no address)
  comm = nccl.init { file = os.getenv("IDFILE"), timeout = timeout }
  local x = cuda.to_device(cuda.array({ rank + 1 }, "int64"))
  local y = cuda.device_array(1, "int64")
  comm:all_reduce(x, y, "sum")
  say("OK file sum %d", y:copy_to_host()[1])
  comm:close()
  os.exit(0)
end

if case == "never_join" then
  if rank == victim then os.exit(3) end
  if step("init", init) then survive() end
  say("OK never_join (joined?)")
  os.exit(1)
end

if case == "init_kill" then
  if rank == victim then die(delay) end
  if step("init", init) then survive() end
  local x, y = cuda.device_array(1 << 20, "float32"), cuda.device_array(1 << 20, "float32")
  for i = 1, 1000 do
    if step("all_reduce " .. i, function() comm:all_reduce(x, y); cuda.synchronize() end) then survive() end
  end
  say("OK init_kill (no failure?)")
  os.exit(1)
end

if case == "shrink" then   -- the victim dies before any collective: the others drop it
  init()
  if rank == victim then die() end
  cuda.sleep(0.5)   -- (it is gone by then)
  local ok, err = pcall(function()
    local small = comm:shrink({ victim })
    local x = cuda.to_device(cuda.array({ rank }, "int64"))
    local y = cuda.device_array(1, "int64")
    small:all_reduce(x, y, "sum")
    local got = y:copy_to_host()[1]
    say("OK shrink rank %d of %d sum %d", small:rank(), small:size(), got)
    small:close()
  end)
  if not ok then say("FAILED shrink after=0 msg=%s", tostring(err):gsub("\n", " ")) end
  comm:abort()
  os.exit(ok and 0 or 1)
end

if case == "split" then
  init()
  local sub = comm:split(rank % 2, size - rank)
  local x = cuda.to_device(cuda.array({ rank }, "int64"))
  local y = cuda.device_array(1, "int64")
  sub:all_reduce(x, y, "sum")
  say("OK split color %d rank %d of %d sum %d", rank % 2, sub:rank(), sub:size(), y:copy_to_host()[1])
  assert(comm:split(nil, 0) == nil)   -- a rank of no color joins none (every rank calls it)
  sub:close(); comm:close()
  os.exit(0)
end

if case == "stall" then   -- the victim lives but stops taking part: only the timeout can tell
  init()
  local x, y = cuda.device_array(1024, "float32"), cuda.device_array(1024, "float32")
  comm:all_reduce(x, y)
  cuda.synchronize()
  if rank == victim then cuda.sleep(timeout + 8); os.exit(0) end
  for i = 1, 1000 do
    if step("round " .. i, function() comm:all_reduce(x, y); cuda.synchronize() end) then survive() end
  end
  say("OK stall (no failure?)")
  os.exit(1)
end

if case == "collective_kill" or case == "group_kill" then
  init()
  local n = 1 << 22
  local x, y = cuda.to_device(cuda.array(values(rank, n, "float32"), "float32")), cuda.device_array(n, "float32")
  local all = cuda.device_array(64 * size, "float32")
  comm:all_reduce(x, y)
  cuda.synchronize()
  if rank == victim and case == "collective_kill" then die(delay) end
  for i = 1, 100000 do
    local failed = step("round " .. i, function()
      if case == "group_kill" then
        nccl.group(function()
          if rank == victim and i == 3 then die() end
          comm:all_reduce(x, y)
          comm:all_gather(x:slice(1, 64), all)
        end)
      else
        comm:all_reduce(x, y)
      end
      cuda.synchronize()
    end)
    if failed then survive() end
  end
  say("OK %s (no failure?)", case)
  os.exit(1)
end

error("unknown case " .. tostring(case))
