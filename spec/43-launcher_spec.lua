-- The job launcher, build/cudalua-run (tools/cudalua-run.c, issue 30), with stand-in workers:
-- small Lua scripts written to a temporary folder, no CUDA. Every run is under `timeout 60`,
-- so that a launcher that hangs fails its case instead of holding up the suite.
local H = require "spec.helper"
local q = H.q

local ROOT = H.run("pwd"):gsub("%s+$", "")
local RUN = ROOT .. "/build/cudalua-run"
local dir

setup(function()
  local ok, out = H.sh("make -s build/cudalua-run")
  assert(ok, out)
  dir = H.tmpdir()
end)

teardown(function()
  if dir then H.rmrf(dir) end
end)

-- a file in the temporary folder (written when data is given)
local function file(name, data)
  local path = dir .. "/" .. name
  if data then H.write(path, data) end
  return path
end

local function executable(name, data)
  local path = file(name, data)
  os.execute("chmod +x " .. q(path))
  return path
end

-- runs the launcher with args (shell words, quoted) under the watchdog. opts.env: assignments
-- for its environment; opts.lua: the interpreter (default this one). Returns the status,
-- stdout, stderr and the milliseconds the run took.
local function launch(args, opts)
  opts = opts or {}
  local cmd = ("s=$(date +%%s%%N); %s timeout 60 %s --lua %s %s >%s 2>%s; st=$?; e=$(date +%%s%%N); echo $st $(( (e - s) / 1000000 ))")
    :format(opts.env or "", q(RUN), q(opts.lua or H.LUA), args, q(file("stdout")), q(file("stderr")))
  local st, ms = H.run(cmd):match("(%d+) (%d+)")
  return tonumber(st), H.read(file("stdout")), H.read(file("stderr")), tonumber(ms)
end

local function wait_for(cond, seconds)
  for _ = 1, seconds * 20 do
    if cond() then return true end
    os.execute("sleep 0.05")
  end
  return cond()
end

-- no such process, or only its zombie
local function gone(pid)
  local stat = H.read("/proc/" .. pid .. "/stat")
  return not stat or stat:match("^%d+ %b() ([ZX])") ~= nil
end

-- the pids written to the files named
local function pids(...)
  local t = {}
  for _, name in ipairs { ... } do t[#t + 1] = (H.read(file(name)) or ""):match("%d+") end
  return t
end

-- a worker printing its environment as NAME=value words
local ENV_WORKER = [[
local t = {}
for _, k in ipairs { "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                     "MASTER_PORT", "CUDALUA_RUN" } do
  t[#t + 1] = k .. "=" .. tostring(os.getenv(k))
end
print(table.concat(t, " "))
]]

-- the environment each rank printed, by rank
local function by_rank(out)
  local ranks, n = {}, 0
  for line in out:gmatch("[^\n]+") do
    local r, rest = line:match("^%[rank (%d+)%] (.*)$")
    assert(r, "a line without its rank: " .. line)
    local vars = {}
    for k, v in rest:gmatch("([%u_]+)=(%S+)") do vars[k] = v end
    ranks[tonumber(r)] = vars
    n = n + 1
  end
  return ranks, n
end

describe("cudalua-run", function()
  it("gives each rank its place: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT", function()
    local st, out, err = launch("-n 3 " .. q(file("env.lua", ENV_WORKER)))
    assert.equal(0, st, err)
    local ranks, n = by_rank(out)
    assert.equal(3, n, out)
    local port = ranks[0].MASTER_PORT
    assert.matches("^%d+$", port)
    assert.is_true(tonumber(port) >= 1 and tonumber(port) <= 65535, port)
    for r = 0, 2 do
      assert.same({ RANK = tostring(r), WORLD_SIZE = "3", LOCAL_RANK = tostring(r), LOCAL_WORLD_SIZE = "3",
                    GROUP_RANK = "0", MASTER_ADDR = "127.0.0.1", MASTER_PORT = port, CUDALUA_RUN = "1" }, ranks[r])
    end
  end)

  it("with --nnodes and --node-rank, gives global ranks (and --nproc-per-node is -n)", function()
    local st, out, err = launch("--nproc-per-node 2 --nnodes 3 --node-rank 2 --master-addr 10.1.2.3 --master-port=29511 "
      .. q(file("env.lua", ENV_WORKER)))
    assert.equal(0, st, err)
    local ranks, n = by_rank(out)
    assert.equal(2, n, out)
    for local_rank, r in ipairs { 4, 5 } do
      assert.same({ RANK = tostring(r), WORLD_SIZE = "6", LOCAL_RANK = tostring(local_rank - 1), LOCAL_WORLD_SIZE = "2",
                    GROUP_RANK = "2", MASTER_ADDR = "10.1.2.3", MASTER_PORT = "29511", CUDALUA_RUN = "1" }, ranks[r])
    end
  end)

  -- ported from PyTorch's launcher tests (test/distributed/launcher/run_test.py,
  -- test_launch_user_script_python and the failing variant, with bin/test_script.py): every
  -- worker touches a file named by its global RANK and the folder then holds exactly 0..world-1;
  -- a variable the parent set (TEST_SENTINEL_PARENT=FOOBAR) reaches every worker; with
  -- --fail every worker raises and the launch fails
  it("ported from torchrun's tests: each of 4 workers touches its RANK; the parent's environment reaches them; --fail fails the job", function()
    local touched = dir .. "/touched"
    os.execute("mkdir -p " .. q(touched))
    local script = file("touch.lua", [[
      assert(os.getenv("TEST_SENTINEL_PARENT") == "FOOBAR", "the parent's variable is missing")
      for _, k in ipairs { "LOCAL_RANK", "RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT" } do
        assert(os.getenv(k), k .. " is not set")
      end
      if arg[1] == "--fail" then error("raising since --fail was given") end
      assert(io.open(arg[2] .. "/" .. os.getenv("RANK"), "w")):close()]])
    local st, _, err = launch("-n 4 " .. q(script) .. " --touch " .. q(touched), { env = "TEST_SENTINEL_PARENT=FOOBAR" })
    assert.equal(0, st, err)
    local names = {}
    for name in H.run("ls " .. q(touched)):gmatch("%S+") do names[#names + 1] = name end
    table.sort(names)
    assert.same({ "0", "1", "2", "3" }, names)
    st, _, err = launch("-n 4 " .. q(script) .. " --fail " .. q(touched), { env = "TEST_SENTINEL_PARENT=FOOBAR" })
    assert.is_true(st ~= 0, "the job succeeded although every worker raised")
    assert.matches("raising since --fail was given", err, 1, true)
    assert.matches("cudalua%-run: rank %d exited with status 1\n", err)
  end)

  it("passes the script's arguments as they are (spaces, quotes, empty, options of its own)", function()
    local script = file("args.lua", 'local t = {} for i = 1, #arg do t[i] = "<" .. arg[i] .. ">" end print(#arg, table.concat(t))')
    local st, out, err = launch("-n 2 " .. q(script) .. " 'a b' \"it's\" '' -n --grace")
    assert.equal(0, st, err)
    for r = 0, 1 do
      assert.matches("[rank " .. r .. "] 5\t<a b><it's><><-n><--grace>\n", out, 1, true)
    end
  end)

  it("prefixes each line of stdout and stderr with the rank; a last line without newline gets one", function()
    local script = file("lines.lua", [[
      io.stdout:setvbuf("no")   -- every piece a write of its own: the launcher puts lines together
      local r = os.getenv("RANK")
      for i = 1, 50 do io.stdout:write("line ", i, " of ") io.stdout:write("rank ", r) io.stdout:write("\n") end
      io.stderr:write("warning from ", r, "\n")
      io.stdout:write("tail of ", r)]])
    local st, out, err = launch("-n 3 " .. q(script))
    assert.equal(0, st, err)
    local count = {}
    for line in out:gmatch("([^\n]*)\n") do
      local r, body = line:match("^%[rank (%d)%] (.*)$")
      assert(r, "an unprefixed or mixed line: " .. line)
      assert(body:match("^line %d+ of rank " .. r .. "$") or body == "tail of " .. r, "a mixed line: " .. line)
      count[r] = (count[r] or 0) + 1
    end
    assert.same({ ["0"] = 51, ["1"] = 51, ["2"] = 51 }, count)
    assert.equal("\n", out:sub(-1))
    for r = 0, 2 do
      assert.matches("[rank " .. r .. "] tail of " .. r .. "\n", out, 1, true)
      assert.matches("[rank " .. r .. "] warning from " .. r .. "\n", err, 1, true)
    end
    assert.not_matches("warning", out)
    st, out = launch("-n 1 --no-prefix " .. q(script))
    assert.equal(0, st)
    assert.matches("^line 1 of rank 0\n", out)
    assert.matches("\ntail of 0\n$", out)
  end)

  it("exits with the first failing rank's status and stops the others at once", function()
    local script = file("fail.lua", ([[
      local r = os.getenv("RANK")
      if r == "1" then
        while not (io.open(%q) and io.open(%q)) do os.execute("sleep 0.05") end
        print("failing") os.exit(3)
      end
      os.execute("echo $$ > %s/sib" .. r .. "; exec sleep 60")]]):format(file("sib0"), file("sib2"), dir))
    local st, out, err, ms = launch("-n 3 " .. q(script))
    assert.equal(3, st, err)
    assert.matches("[rank 1] failing\n", out, 1, true)
    assert.matches("cudalua-run: rank 1 exited with status 3\n", err, 1, true)
    assert.is_true(ms < 6000, ms .. " ms: not stopped within the grace (5 s) + 1 s")
    for _, pid in ipairs(pids("sib0", "sib2")) do
      assert.is_true(wait_for(function() return gone(pid) end, 1), "a sibling's sleep 60 is still running")
    end
  end)

  it("reports a rank killed by a signal, and exits 128 + the signal", function()
    local script = file("killed.lua", 'if os.getenv("RANK") == "0" then os.execute("kill -KILL $PPID") end os.execute("sleep 60")')
    local st, _, err, ms = launch("-n 2 " .. q(script))
    assert.equal(137, st, err)
    assert.matches("cudalua-run: rank 0 was killed by signal SIGKILL\n", err, 1, true)
    assert.is_true(ms < 6000, ms .. " ms")
  end)

  it("gives a rank that ignores SIGTERM SIGKILL after --grace", function()
    -- rank 1's interpreter starts with SIGTERM ignored (an ignored signal stays so across exec)
    local lua = executable("ignoring", ('#!/bin/sh\nif [ "$RANK" = 1 ]; then trap "" TERM; fi\nexec %s "$@"\n'):format(q(H.LUA)))
    local script = file("stubborn.lua", ([[
      if os.getenv("RANK") == "0" then
        while not io.open(%q) do os.execute("sleep 0.05") end
        os.exit(3)
      end
      local f = io.open(%q, "w") f:write(io.open("/proc/self/stat"):read("l"):match("^%%d+")) f:close()
      os.execute("sleep 60")]]):format(file("stubborn"), file("stubborn")))
    local st, _, err, ms = launch("-n 2 --grace 1 " .. q(script), { lua = lua })
    assert.equal(3, st, err)
    assert.matches("cudalua-run: rank 0 exited with status 3\n", err, 1, true)
    assert.is_true(ms >= 1000 and ms < 4000, ms .. " ms: not the 1 s grace")
    local pid = pids("stubborn")[1]
    assert.is_true(wait_for(function() return gone(pid) end, 1), "the rank ignoring SIGTERM is still running")
  end)

  it("passes SIGTERM sent to it on to every rank and exits 143", function()
    local script = file("wait.lua", ('os.execute("echo $$ > %s/w" .. os.getenv("RANK") .. "; exec sleep 60")'):format(dir))
    os.execute(("(timeout 60 sh -c %s >%s 2>%s; echo $? >%s) >/dev/null 2>&1 &"):format(
      q(("echo $$ > %s; exec %s -n 3 --lua %s %s"):format(q(file("lpid")), q(RUN), q(H.LUA), q(script))),
      q(file("sig.out")), q(file("sig.err")), q(file("sig.status"))))
    assert.is_true(wait_for(function() return #pids("lpid", "w0", "w1", "w2") == 4 end, 20), "the ranks did not start")
    local ranks = pids("w0", "w1", "w2")
    os.execute("kill -TERM " .. pids("lpid")[1])
    assert.is_true(wait_for(function() return H.read(file("sig.status")) end, 10), "the launcher did not end")
    assert.equal("143", H.read(file("sig.status")):match("%d+"))
    assert.matches("cudalua-run: SIGTERM: stopping the ranks", H.read(file("sig.err")), 1, true)
    for _, pid in ipairs(ranks) do
      assert.is_true(wait_for(function() return gone(pid) end, 1), "a rank is still running")
    end
  end)

  it("is not held by a rank's background child that keeps its stdout, and ends that child", function()
    local script = file("bg.lua", ('os.execute("sh -c \'echo $$ > %s/bg; exec sleep 30\' &") print("done")'):format(dir))
    local st, out, err, ms = launch("-n 2 " .. q(script))
    assert.equal(0, st, err)
    assert.matches("[rank 0] done\n", out, 1, true)
    assert.matches("[rank 1] done\n", out, 1, true)
    assert.is_true(ms < 3000, ms .. " ms: held by the background child")
    local pid = pids("bg")[1]
    assert.is_true(wait_for(function() return gone(pid) end, 2), "the background child is still running")
  end)

  it("waits for a rank that closed its stdout and stderr, and gives its status", function()
    local lua = executable("closing", "#!/bin/sh\nexec >&- 2>&-\nsleep 1\nexit 4\n")
    local st, out, err, ms = launch("-n 2 " .. q(file("env.lua", ENV_WORKER)), { lua = lua })
    assert.equal(4, st, err)
    assert.equal("", out)
    assert.matches("^cudalua%-run: rank [01] exited with status 4\n$", err)
    assert.is_true(ms >= 1000 and ms < 4000, ms .. " ms")
  end)

  it("refuses bad usage with status 2, naming the problem", function()
    local script = q(file("env.lua", ENV_WORKER))
    for args, message in pairs {
      [script] = "-n N is needed",
      ["-n 0 " .. script] = "-n must be a whole number from 1 to 1024, got '0'",
      ["-n 1025 " .. script] = "-n must be a whole number from 1 to 1024, got '1025'",
      ["-n two " .. script] = "-n must be a whole number from 1 to 1024, got 'two'",
      ["-n 2"] = "no script given",
      ["-n 2 --frobnicate " .. script] = "unknown option '--frobnicate'",
      ["-n 2 --nnodes 2 " .. script] = "--master-port is needed with several nodes",
      ["-n 2 --nnodes 2 --node-rank 2 --master-port 1 " .. script] = "--node-rank 2 must be below --nnodes 2",
      ["-n 2 --master-port 70000 " .. script] = "--master-port must be a whole number from 1 to 65535",
      ["-n 2 --grace -1 " .. script] = "--grace must be a number of seconds",
      ["-n 2 --hosts a,,b " .. script] = "--hosts has an empty host name",
      ["-n 2 --hosts a,b --nnodes 3 " .. script] = "--nnodes 3 but --hosts names 2 hosts",
      ["-n 2 --grace"] = "option --grace needs a value",
    } do
      local st, out, err = launch(args)
      assert.equal(2, st, args .. ": " .. err)
      assert.equal("", out)
      assert.matches("cudalua-run: " .. message, err, 1, true)
    end
    local st, out = launch("--help")
    assert.equal(0, st)
    assert.matches("^usage: cudalua%-run %-n N", out)
  end)

  it("--hosts: starts a launcher per host through CUDALUA_RUN_SSH, ranks numbered across them", function()
    -- the stand-in for ssh notes the host and runs the command here, as the far shell would
    local ssh = executable("ssh", ('#!/bin/sh\necho "$1" >> %s\nshift\nexec sh -c "$*"\n'):format(q(file("hosts"))))
    local env = ("CUDALUA_RUN_SSH=%s CUDALUA_RUN_REMOTE=%s"):format(q(ssh), q(RUN))
    local st, out, err = launch("-n 2 --hosts nodeA,nodeB " .. q(file("env.lua", ENV_WORKER)), { env = env })
    assert.equal(0, st, err)
    local ranks, n = by_rank(out)
    assert.equal(4, n, out)
    for r = 0, 3 do
      assert.same({ RANK = tostring(r), WORLD_SIZE = "4", LOCAL_RANK = tostring(r % 2), LOCAL_WORLD_SIZE = "2",
                    GROUP_RANK = tostring(r // 2), MASTER_ADDR = "nodeA", MASTER_PORT = "29500", CUDALUA_RUN = "1" }, ranks[r])
    end
    local hosts = {}
    for h in H.read(file("hosts")):gmatch("%S+") do hosts[#hosts + 1] = h end
    table.sort(hosts)
    assert.same({ "nodeA", "nodeB" }, hosts)
    -- a rank failing on one node stops the other node
    local script = file("hostfail.lua", 'if os.getenv("RANK") == "3" then os.exit(5) end os.execute("sleep 60")')
    local ms
    st, out, err, ms = launch("-n 2 --hosts nodeA,nodeB " .. q(script), { env = env })
    assert.equal(5, st, err)
    assert.matches("cudalua-run: rank 3 exited with status 5\n", err, 1, true)
    assert.matches("cudalua-run: node 1 (nodeB) exited with status 5\n", err, 1, true)
    assert.is_true(ms < 6000, ms .. " ms")
  end)

  it("starts and ends 4 ranks of a trivial script in under 3 s (the launcher's own share: milliseconds)", function()
    local script = file("trivial.lua", "os.exit(0)")
    local st, _, err, ms = launch("-n 4 " .. q(script))
    assert.equal(0, st, err)
    assert.is_true(ms < 3000, ms .. " ms")
  end)
end)
