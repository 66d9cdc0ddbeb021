-- Jobs past one machine (issue 30): starting as cluster launchers start one (nccl.init reads
-- their variables; nccl.comm_init_at meets at an address), and never hanging on a dead peer.
-- The #nccl specs run jobs of 2 to 4 ranks on this machine's one GPU, each rank a "machine" of
-- its own over NCCL's socket transport (spec/support/nccl_ranks.lua), with a rank killed
-- during an init, during a collective and inside a group, a rank that never joins and one
-- that stops taking part: every survivor must raise within the timeout + 5 s naming what
-- failed, stay usable, and make a new communicator with the other survivors. The launcher
-- variables' parsing runs without a GPU. Many seeded fault runs: tools/nccl_faults.lua.
local H = require "spec.helper"
local C = require "spec.check"
local nccl = require "cudalua.nccl"
local ranks = require "spec.support.nccl_ranks"

local function env_of(t) return function(k) return t[k] end end

describe("nccl.launch_info and nccl.init's checks (no GPU needed)", function()
  it("reads the variables of torchrun/cudalua-run, Open MPI, PMI and Slurm, the most specific first", function()
    local i = nccl.launch_info(env_of { RANK = "3", WORLD_SIZE = "8", LOCAL_RANK = "1" })
    assert.same({ rank = 3, size = 8, local_rank = 1, launcher = "torchrun / cudalua-run" }, i)
    i = nccl.launch_info(env_of { OMPI_COMM_WORLD_RANK = "5", OMPI_COMM_WORLD_SIZE = "6", OMPI_COMM_WORLD_LOCAL_RANK = "2",
                                  SLURM_PROCID = "0", SLURM_NTASKS = "1" })
    assert.same({ rank = 5, size = 6, local_rank = 2, launcher = "Open MPI" }, i)   -- mpirun inside an allocation
    i = nccl.launch_info(env_of { SLURM_PROCID = "7", SLURM_NTASKS = "16", SLURM_LOCALID = "3" })
    assert.same({ rank = 7, size = 16, local_rank = 3, launcher = "Slurm" }, i)
    i = nccl.launch_info(env_of { PMI_RANK = "2", PMI_SIZE = "4" })
    assert.same({ rank = 2, size = 4, launcher = "PMI (MPICH, Intel MPI)" }, i)
    assert.is_nil(nccl.launch_info(env_of {}))
    assert.is_nil(nccl.launch_info(env_of { RANK = "1" }))   -- a rank without a size is no launcher's
  end)

  it("misuse: bad variables, bad options, no rank, no meeting place, a bad address", function()
    C.raises("nccl.launch_info: RANK=x is not a whole number >= 0", nccl.launch_info, env_of { RANK = "x", WORLD_SIZE = "2" })
    C.raises("nccl.launch_info: RANK=4 and WORLD_SIZE=4: the rank must be below the size", nccl.launch_info, env_of { RANK = "4", WORLD_SIZE = "4" })
    C.raises("nccl.launch_info: expected a function like os.getenv, got table", nccl.launch_info, {})
    C.raises("nccl.launch_info: PMI_RANK=true is not a whole number >= 0", nccl.launch_info, env_of { PMI_RANK = true, PMI_SIZE = "2" })
    C.raises("nccl.init: unknown option 'ranks'", nccl.init, { ranks = 2 })
    C.raises("nccl.init: expected a table of options, got string", nccl.init, "x")
    local out = H.child([[local nccl = require "cudalua.nccl"
      local ok, e = pcall(nccl.init); io.write(e, "\n")
      ok, e = pcall(nccl.init, { rank = 0, size = 2 }); io.write(e, "\n")
      ok, e = pcall(nccl.init, { rank = 2, size = 2, addr = "h:1" }); io.write(e, "\n")]],
      { RANK = "", WORLD_SIZE = "", MASTER_ADDR = "", MASTER_PORT = "", SLURM_PROCID = "", OMPI_COMM_WORLD_RANK = "", PMI_RANK = "" })
    assert.matches("nccl.init: no rank and size: give {rank =, size =}, or start the job with a launcher", out, 1, true)
    assert.matches("nccl.init: no meeting place: give addr = \"host:port\" or file = path", out, 1, true)
    assert.matches("nccl.init: rank 2 of size 2: the rank must be a whole number 0..size-1", out, 1, true)
    C.raises("nccl.comm_init_at: argument 2: expected \"host:port\" (the port 1..65535), got localhost", nccl.comm_init_at, 2, "localhost", 0)
    C.raises("nccl.comm_init_at: argument 2: expected \"host:port\" (the port 1..65535), got h:0", nccl.comm_init_at, 2, "h:0", 0)
    C.raises("nccl.comm_init_at: argument 3: rank must be 0..1", nccl.comm_init_at, 2, "h:1", 2)
    C.raises("nccl.comm_init_rank: timeout must be a number of seconds > 0, got -1", nccl.comm_init_rank, 2, ("0"):rep(256), 0, { timeout = -1 })
    C.raises("nccl.comm_init_rank: unknown option 'time'", nccl.comm_init_rank, 2, ("0"):rep(256), 0, { time = 1 })
  end)
end)

-- a job on this machine's GPU (skipped without one; NCCL must be there with a GPU)
local job = H.gpuonly(it, pending, "NCCL")
local TIMEOUT = 3

-- every survivor raised in time, named the failure (one of the plain texts in `names`),
-- stayed usable and joined the others again
local function survived(res, n, victim, names)
  local want = (n - 2) * (n - 1) // 2
  for r = 0, n - 1 do
    local x = res[r + 1]
    if r ~= victim then
      assert.equal(0, x.status, "rank " .. r .. ":\n" .. x.out)
      assert.is_table(x.failed, "rank " .. r .. " never raised:\n" .. x.out)
      assert.is_true(x.failed.after <= TIMEOUT + 5, ("rank %d raised after %.2f s"):format(r, x.failed.after))
      assert.matches(("rank %d of %d"):format(r, n), x.failed.msg, 1, true)
      local named = false
      for _, t in ipairs(names) do named = named or x.failed.msg:find(t, 1, true) ~= nil end
      assert.is_true(named, "rank " .. r .. "'s message names none of " .. table.concat(names, ", ") .. ": " .. x.failed.msg)
      assert.equal("yes", x.usable, x.out)
      assert.equal(tostring(want), x.reinit, x.out)
    end
  end
end

describe("NCCL jobs of several ranks, each a machine of its own on one GPU #nccl", function()
  job("every collective of every dtype over the socket transport, 2 and 4 ranks, against Lua", function()
    assert.is_true(nccl.is_available())
    for _, n in ipairs { 2, 4 } do
      local res = ranks.run("collectives", n, { timeout = 60, seed = n })
      for r = 1, n do
        assert.equal(0, res[r].status, res[r].out)
        assert.equal("collectives 90", res[r].ok, res[r].out)
      end
    end
  end)

  job("nccl.init meets through a file rank 0 writes, when given one", function()
    local dir = H.tmpdir()
    local res = ranks.run("file", 3, { timeout = 30, seed = 18, env = "IDFILE=" .. dir .. "/id" })
    for r = 1, 3 do
      assert.equal(0, res[r].status, res[r].out)
      assert.equal("file sum 6", res[r].ok, res[r].out)
    end
    H.rmrf(dir)
  end)

  job("a rank that never joins: the others' init raises after the timeout", function()
    local res = ranks.run("never_join", 3, { victim = 2, timeout = TIMEOUT, seed = 11 })
    assert.equal(3, res[3].status)
    survived(res, 3, 2, { "nccl.comm_init_at: rank ", " of 3: timed out after ", "(the communicator's timeout is 3.0 s" })
    for r = 1, 2 do assert.is_true(res[r].failed.after >= TIMEOUT - 0.5, res[r].out) end
  end)

  job("a rank killed during the init", function()
    local res = ranks.run("init_kill", 3, { victim = 1, timeout = TIMEOUT, delay = 0.05, seed = 12 })
    assert.equal(137, res[2].status, res[2].out)
    survived(res, 3, 1, { "timed out after", "NCCL reported" })
  end)

  job("a rank killed during a collective: the survivors' wait ends in an error naming NCCL's warning", function()
    local res = ranks.run("collective_kill", 3, { victim = 1, timeout = TIMEOUT, delay = 0.4, seed = 13 })
    assert.equal(137, res[2].status, res[2].out)
    -- (the wait, the watchdog, or the next collective's own call when NCCL saw the death first)
    survived(res, 3, 1, { "aborted during comm:all_reduce: ", "NCCL reported ncclRemoteError",
                          "comm:all_reduce: rank 0 of 3: failed after", "comm:all_reduce: rank 2 of 3: failed after" })
  end)

  job("a rank killed inside a group", function()
    local res = ranks.run("group_kill", 2, { victim = 0, timeout = TIMEOUT, seed = 14 })
    assert.equal(137, res[1].status, res[1].out)
    survived(res, 2, 0, { "aborted during comm:all_reduce", "aborted during comm:all_gather", "nccl.group" })
  end)

  job("comm:shrink drops a rank that died before any collective; split makes sub-communicators", function()
    local res = ranks.run("shrink", 3, { victim = 2, timeout = TIMEOUT, seed = 16 })
    assert.equal(137, res[3].status, res[3].out)
    for r = 0, 1 do   -- the survivors' ranks in order, and the sum of their old ranks
      assert.equal(0, res[r + 1].status, res[r + 1].out)
      assert.equal(("shrink rank %d of 2 sum 1"):format(r), res[r + 1].ok, res[r + 1].out)
    end
    res = ranks.run("split", 4, { timeout = 30, seed = 17 })
    for r = 0, 3 do
      assert.equal(0, res[r + 1].status, res[r + 1].out)
      -- colors by parity, keys reversed: the even ranks {0, 2} become ranks {1, 0}; odd {1, 3} the same
      local color, want_rank = r % 2, r < 2 and 1 or 0
      assert.equal(("split color %d rank %d of 2 sum %d"):format(color, want_rank, color == 0 and 2 or 4), res[r + 1].ok, res[r + 1].out)
    end
  end)

  job("a rank that stops taking part without dying: the watchdog's timeout ends the wait", function()
    local res = ranks.run("stall", 2, { victim = 1, timeout = TIMEOUT, seed = 15 })
    assert.equal(0, res[2].status, res[2].out)
    survived(res, 2, 1, { "did not finish on the GPU within the timeout" })
    assert.is_true(res[1].failed.after >= TIMEOUT - 0.5 and res[1].failed.after <= TIMEOUT + 2, res[1].out)
  end)
end)
