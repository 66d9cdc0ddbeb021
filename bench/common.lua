-- common.lua: what the bench/*.lua scripts share: output lines, medians, sections
-- that fail alone, and the two timing loops.
-- Env: BENCH_LAUNCHES (default 100000), BENCH_REPS (default 5), BENCH_SECTIONS (a Lua pattern:
-- only the sections whose names match run)
local cuda = require "cudalua"

local B = {}
B.N = tonumber(os.getenv("BENCH_LAUNCHES")) or 100000
B.REPS = tonumber(os.getenv("BENCH_REPS")) or 5
B.now = cuda.time   -- monotonic wall clock (os.clock is CPU time)
local now = B.now

function B.out(k, v) io.write(("%s %.4f\n"):format(k, v)); io.flush() end
function B.note(s) io.write("# " .. s .. "\n"); io.flush() end

-- the smallest sample: for times whose noise only adds (a compile on a busy machine)
function B.min(t) return math.min(table.unpack(t)) end

function B.median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

-- runs f; a failure prints a "# ..." line and the caller goes on. BENCH_SECTIONS picks among
-- the outermost sections (a section inside a chosen one always runs)
local only, depth = os.getenv("BENCH_SECTIONS"), 0
function B.section(script, name, f)
  if only and depth == 0 and not name:match(only) then return end
  depth = depth + 1
  local ok, err = pcall(f)
  depth = depth - 1
  if not ok then B.note(("%s: %s failed: %s"):format(script, name, (tostring(err):gsub("\n", " | ")))) end
end

-- the kernel bench/raw.c, bench/core.lua and bench/helpers.lua compile (keep them identical)
B.VECADD = [[
extern "C" __global__ void vecadd(float *z, const float *x, const float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = x[i] + y[i];
}
]]

-- the C core that cuda.compile drives (the loader's second upvalue), for the compile pieces
B.core = select(3, pcall(debug.getupvalue, package.preload["cudalua.compile"], 2))
if type(B.core) ~= "table" then B.core = nil end

-- bench/rawloop.c (built by bench/run.sh into bench/out/): raw C loops in this process, or nil
-- and why not. Loaded on first use, after a compile: it links libcuda and NVRTC.
local rawloop, rawerr
function B.rawloop()
  if rawloop == nil and rawerr == nil then
    package.cpath = "bench/out/?.so;" .. package.cpath
    local ok, m = pcall(require, "rawloop")
    if ok then rawloop = m else rawerr = tostring(m):match("[^\n]*") end
  end
  return rawloop, rawerr
end

-- runs body(count) REPS times after a warm-up, each followed by a synchronize; returns the
-- median µs per item, and the median µs per item before the synchronize (enqueue time)
function B.per_item(body, count)
  count = count or B.N
  body(math.min(1000, count))
  cuda.synchronize()
  local tot, enq = {}, {}
  for r = 1, B.REPS do
    collectgarbage()
    cuda.synchronize()
    local t0 = now()
    body(count)
    local t1 = now()
    cuda.synchronize()
    local t2 = now()
    tot[r], enq[r] = (t2 - t0) / count * 1e6, (t1 - t0) / count * 1e6
  end
  return B.median(tot), B.median(enq)
end

-- bodies: name -> function(count) doing count items. Each runs `rounds` times (default
-- 2 * REPS), each time followed by sync (default cuda.synchronize); returns name -> the median
-- (or stat(samples)) µs per item. The bodies take turns, in an order that rotates every round, so that a drift of
-- the machine's speed hits them all alike.
function B.interleaved(bodies, count, rounds, sync, stat)
  sync, stat = sync or cuda.synchronize, stat or B.median
  local names, res = {}, {}
  for name in pairs(bodies) do names[#names + 1] = name; res[name] = {} end
  table.sort(names)
  for _, name in ipairs(names) do bodies[name](math.min(1000, count)) end
  sync()
  for r = 1, rounds or B.REPS * 2 do
    for i = 0, #names - 1 do
      local name = names[(i + r - 1) % #names + 1]
      collectgarbage()
      sync()
      local t0 = now()
      bodies[name](count)
      sync()
      res[name][r] = (now() - t0) / count * 1e6
    end
  end
  for _, name in ipairs(names) do res[name] = stat(res[name]) end
  return res
end

-- prints B.interleaved's launch timings: raw_x as inproc_launch_x_us, the others as launch_x_us
function B.out_launches(r)
  for name, us in pairs(r) do
    local raw = name:match("^raw_(.*)")
    B.out(raw and "inproc_launch_" .. raw .. "_us" or "launch_" .. name .. "_us", us)
  end
end

return B
