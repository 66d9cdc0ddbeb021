-- The stress test of the places where Lua meets the driver's threads (tools/stress.lua, run by
-- tools/stress.c in three Lua states on three threads under a watchdog, through tools/stress.sh):
-- a short run here; `make stress STRESS_SECONDS=600` is the long one.
local H = require "spec.helper"
local gpu = H.gpu(it, pending)

describe("make stress", function()
  it("builds its driver (several states on threads, a watchdog)", function()
    -- make asan's instrumented library needs the sanitizer flags on the driver too
    local ok, out = H.sh(("make -s build/stress CFLAGS=%s"):format(H.q("-O2 -g " .. (os.getenv("CUDALUA_SPEC_CFLAGS") or ""))))
    assert(ok, out)
  end)

  gpu("20 seconds of random sequences: no crash, no hang, no wrong result", function()
    local seed = math.random(1, 99999)
    local ok, out = H.sh(("bash tools/stress.sh 20 3 %d 10"):format(seed))
    local last = out:match("stress: %d+ runs[^\n]*") or out
    assert(ok, out)
    assert.matches("0 crashes, 0 hangs, 0 wrong$", last)
    local seqs = tonumber(last:match("(%d+) sequences"))
    assert(seqs and seqs > 10, "too few sequences ran: " .. last)
  end)
end)
