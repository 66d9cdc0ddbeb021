-- The developer tools' behaviour that needs no GPU: tools/sanitize.sh (make sanitize), run with a
-- stand-in for Lua (which says a GPU is there) and for compute-sanitizer (which only waits).
local H = require "spec.helper"

local function alive(pid) return os.execute("kill -0 " .. pid .. " 2>/dev/null") == true end

local function wait_for(cond, seconds)
  for _ = 1, seconds * 10 do
    if cond() then return true end
    os.execute("sleep 0.1")
  end
  return cond()
end

describe("tools/sanitize.sh", function()
  it("ends the runs it started when it is stopped (each run is in a process group of its own)", function()
    -- BUG: each run's timeout(1) made a process group of its own, so a Ctrl-C or a timeout
    -- around make sanitize ended the script but not the runs: they kept the GPU busy for up to
    -- SANITIZE_TIMEOUT seconds (a bench started after one was measured beside them)
    local dir = H.tmpdir()
    H.write(dir .. "/lua", "#!/bin/sh\nexit 0\n")   -- "cudalua is available"
    H.write(dir .. "/cs", "#!/bin/sh\necho $$ >> " .. H.q(dir .. "/pids") .. "\nexec sleep 60\n")
    os.execute("chmod +x " .. H.q(dir .. "/lua") .. " " .. H.q(dir .. "/cs"))
    local env = table.concat({
      "SANITIZE_LOG=" .. H.q(dir .. "/log"), "SANITIZER=" .. H.q(dir .. "/cs"),
      "SANITIZE_EXAMPLES='examples/vecadd.lua examples/pi.lua'", "SANITIZE_TOOLS='memcheck racecheck'",
      "SANITIZE_JOBS=4", "SANITIZE_ALONE=none" }, " ")
    local pid = H.run(("%s bash tools/sanitize.sh %s >%s 2>&1 & echo $!"):format(
      env, H.q(dir .. "/lua"), H.q(dir .. "/out"))):gsub("%s+$", "")
    local function started()
      local t = {}
      for p in (H.read(dir .. "/pids") or ""):gmatch("%d+") do t[#t + 1] = p end
      return t
    end
    assert.is_true(wait_for(function() return #started() >= 4 end, 20), "4 runs did not start")
    os.execute("kill -TERM " .. pid)
    local runs = started()
    local ended = wait_for(function()
      for _, p in ipairs(runs) do if alive(p) then return false end end
      return true
    end, 10)
    for _, p in ipairs(runs) do os.execute("kill -KILL " .. p .. " 2>/dev/null") end
    wait_for(function() return not alive(pid) end, 10)
    local out = H.read(dir .. "/out") or ""
    H.rmrf(dir)
    assert.is_true(ended, "runs still going after the script was stopped")
    assert.matches("sanitize: stopped", out)
  end)
end)
