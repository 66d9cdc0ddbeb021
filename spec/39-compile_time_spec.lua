-- Compile time (issue 28): NVRTC's automatic precompiled headers (never changing a result),
-- cuda.compile_all (NVRTC runs in forked child processes), cuda.compile_stats, and a process whose
-- kernels all come from the disk cache loading neither NVRTC nor nvJitLink. Compiling needs no
-- GPU when the arch is given; only the launches are #gpu.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local ARCH = "sm_90"

-- two different sources with the same run of #includes (the PCH's prefix); a warning in each
-- (an unused variable), so that the logs have something to compare
local function cub_source(k, tag)
  return ([[
#include <cub/cub.cuh>
extern "C" __global__ void %s(const int *x, int *out) {
  using R = cub::BlockReduce<int, 128>;
  __shared__ typename R::TempStorage t;
  int unused_%s;
  int s = R(t).Sum(x[threadIdx.x] * %d);
  if (threadIdx.x == 0) *out = s;
}
]]):format(tag, tag, k)
end

local function cg_source(k, tag)
  return ([[
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void %s(const int *x, int *out, int n) {
  auto g = cg::this_thread_block();
  int unused_%s;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = i < n ? x[i] * %d : 0;
  auto w = cg::tiled_partition<32>(g);
  for (int o = 16; o > 0; o /= 2) v += w.shfl_down(v, o);
  if (w.thread_rank() == 0) atomicAdd(out, v);
}
]]):format(tag, tag, k)
end

local NOTE = "cudalua: NVRTC "

-- a child's last line of output
local function last(out) return out:match("([^\n]*)\n*$") end

-- the log less cudalua's closing note on the precompiled header
local function bare(log) return (log:gsub("cudalua: NVRTC [^\n]*precompiled header[^\n]*\n$", "")) end

describe("precompiled headers", function()
  for _, case in ipairs { { "<cub/cub.cuh>", cub_source }, { "<cooperative_groups.h>", cg_source } } do
    local what, make = case[1], case[2]
    it(("for sources including %s: the same image, PTX and diagnostics as without"):format(what), function()
      local tag = "k" .. math.random(1, 1e9)
      local before = cuda.compile_stats()
      for i = 1, 2 do
        local src = make(math.random(2, 99), tag .. "_" .. i)
        for _, arch in ipairs { ARCH, "compute_90" } do
          local off = cuda.compile(src, { arch = arch, cache = false, pch = false })
          local on = cuda.compile(src, { arch = arch, cache = false })
          assert.equal(off:image(), on:image())
          assert.equal(off:ptx(), on:ptx())
          assert.is_nil(off:log():find(NOTE, 1, true))
          assert.truthy(off:log():find("unused_" .. tag .. "_" .. i, 1, true))   -- the warning
          assert.equal(off:log(), bare(on:log()))
          assert.truthy(on:log():find("precompiled header", 1, true))
        end
      end
      local after = cuda.compile_stats()
      -- each include run makes its PCH once in the process (the first file of this kind may
      -- have run before this case): every compile with it on made or used one
      assert.equal(4, (after.pch_made - before.pch_made) + (after.pch_used - before.pch_used))
      assert.truthy(after.pch_used - before.pch_used >= 3)
      assert.truthy(after.nvrtc_runs - before.nvrtc_runs >= 8)
    end)
  end

  it("are not part of the compile cache's key; CUDALUA_PCH=0 turns them off", function()
    local dir = H.tmpdir()
    local out, ok = H.child(([[
      local src = %q
      local a = cuda.compile(src, { arch = "sm_90" })
      local b = cuda.compile(src, { arch = "sm_90", pch = false })
      local st = cuda.compile_stats()
      print(rawequal(a, b), st.cache_memory_hits, st.nvrtc_runs, a:log():find("precompiled", 1, true) ~= nil)
    ]]):format(cub_source(3, "keyed")), { CUDALUA_CACHE_DIR = dir })
    assert.is_true(ok, out)
    assert.equal("true\t1\t1\ttrue", last(out) or out)
    out, ok = H.child(([[
      local m = cuda.compile(%q, { arch = "sm_90", cache = false })
      local st = cuda.compile_stats()
      print(st.pch_made + st.pch_used, m:log():find("precompiled", 1, true) ~= nil)
    ]]):format(cub_source(5, "off")), { CUDALUA_PCH = "0" })
    assert.is_true(ok, out)
    assert.equal("0\tfalse", last(out) or out)
    H.rmrf(dir)
  end)

  it("sources with cudalua's headers only, or none, compile without one", function()
    local before = cuda.compile_stats()
    local m = cuda.compile('#include <cudalua/grid.cuh>\nextern "C" __global__ void g(float *x) { x[grid(1)] = 1; }',
      { arch = ARCH, cache = false })
    local after = cuda.compile_stats()
    assert.equal("", m:log())
    assert.equal(before.pch_made + before.pch_used, after.pch_made + after.pch_used)
  end)

  it("a source including a file of the user's gets none (NVRTC kept using one made before an edit)", function()
    local dir = H.tmpdir()
    H.write(dir .. "/mine.cuh", "#define MINE 1\n")
    local src = '#include <cub/cub.cuh>\n#include "mine.cuh"\nextern "C" __global__ void u(int *x) { *x = MINE; }\n'
    local before = cuda.compile_stats()
    local m = cuda.compile(src, { arch = ARCH, cache = false, include_dirs = { dir } })
    local after = cuda.compile_stats()
    assert.is_nil(m:log():find("precompiled", 1, true))
    assert.equal(before.pch_made + before.pch_used, after.pch_made + after.pch_used)
    H.write(dir .. "/mine.cuh", "#define MINE 2\n")
    assert.matches("mov.u32%s+%%r%d+, 2;", cuda.compile(src, { arch = "compute_90", cache = false, include_dirs = { dir } }):ptx())
    H.rmrf(dir)
  end)

  it("cuda.compile_all makes one for a new #include run two sources share, and none for one alone", function()
    local run = ("#define CUDALUA_SPEC_RUN_%d\n"):format(math.random(1, 1e9))
    local before = cuda.compile_stats()
    local mods, errs = cuda.compile_all({ run .. cub_source(2, "s1"), run .. cub_source(3, "s2"), run .. cub_source(4, "s3") },
      { arch = ARCH, cache = false })
    assert.is_nil(errs)
    local mid = cuda.compile_stats()
    assert.equal(1, mid.pch_made - before.pch_made)
    assert.equal(2, mid.pch_used - before.pch_used)
    assert.truthy(mods[1]:log():find("made a precompiled header", 1, true))
    assert.truthy(mods[3]:log():find("used a precompiled header", 1, true))
    local alone = ("#define CUDALUA_SPEC_ALONE_%d\n"):format(math.random(1, 1e9)) .. cub_source(5, "s4")
    mods = cuda.compile_all({ alone }, { arch = ARCH, cache = false })
    local after = cuda.compile_stats()
    assert.equal(mid.pch_made + mid.pch_used, after.pch_made + after.pch_used)
    assert.equal(cuda.compile(alone, { arch = ARCH, cache = false, pch = false }):image(), mods[1]:image())
  end)

  it("at most CUDALUA_PCH_MAX are made in a process (each is a big file in /tmp); those made go on being used", function()
    local out, ok = H.child(([[
      local function s(tag, k) return ("#define CUDALUA_SPEC_MAX_%%s\n"):format(tag) .. (%q):gsub("KNAME", "k" .. k) end
      local tag1, tag2 = math.random(1, 1e9), math.random(1, 1e9)
      local a = cuda.compile(s(tag1, 1), { arch = "sm_90", cache = false })
      local b = cuda.compile(s(tag2, 2), { arch = "sm_90", cache = false })
      local c = cuda.compile(s(tag1, 3), { arch = "sm_90", cache = false })
      local st = cuda.compile_stats()
      local function note(m) return (m:log():match("NVRTC (%%a+) a precompiled")) or "none" end
      print(note(a), note(b), note(c), st.pch_made, st.pch_used)
    ]]):format('#include <cooperative_groups.h>\nextern "C" __global__ void KNAME(int *x) { *x = 1; }\n'),
      { CUDALUA_PCH_MAX = "1" }, "timeout 300")
    assert.is_true(ok, out)
    assert.equal("made\tnone\tused\t1\t1", last(out))
  end)

  -- (NVRTC's documentation, example "PCH Heap Resizing": a heap too small gives
  -- NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED, nvrtcGetPCHHeapSizeRequired says how much, and a
  -- compile after nvrtcSetPCHHeapSize makes the PCH; cuda.core's Program retries the same way)
  it("a PCH heap too small is grown and the source compiled again: the PCH made, the image unchanged", function()
    local out, ok = H.child(([[
      local src = ("#define CUDALUA_SPEC_HEAP_%%d\n"):format(math.random(1, 1e9)) .. %q
      local a = cuda.compile(src, { arch = "sm_90", cache = false })
      local b = cuda.compile(src .. "\n// another\n", { arch = "sm_90", cache = false })
      local c = cuda.compile(src, { arch = "sm_90", cache = false, pch = false })
      local st = cuda.compile_stats()
      local function note(m) return (m:log():match("NVRTC (%%a+) a precompiled")) or "none" end
      print(note(a), a:log():find("after growing its heap", 1, true) ~= nil, note(b), st.pch_heap_grown,
            a:image() == c:image(), a:ptx() == c:ptx())
    ]]):format('#include <cooperative_groups.h>\nextern "C" __global__ void heap_k(int *x) { *x = 1; }\n'),
      { CUDALUA_PCH_HEAP = "65536" }, "timeout 300")
    assert.is_true(ok, out)
    assert.equal("made\ttrue\tused\t1\ttrue\ttrue", last(out))
  end)

  it("opts.pch must be a boolean", function()
    C.raises("cuda.compile: opts.pch must be a boolean", cuda.compile, "x", { arch = ARCH, pch = 1 })
  end)
end)

describe("cuda.compile_all", function()
  it("gives each source's module in order, as cuda.compile would, and each failure's message", function()
    local tag = "a" .. math.random(1, 1e9)
    local srcs = {}
    for i = 1, 4 do srcs[i] = cub_source(i + 1, tag .. i) end
    srcs[5] = '__global__ void broken( {'
    srcs[6] = { 'extern "C" __global__ void named(int *x) { *x = 1; }', { name = "named.cu" } }
    srcs[7] = { "x", { bogus = true } }
    local mods, errs = cuda.compile_all(srcs, { arch = ARCH, cache = false })
    for i = 1, 4 do
      local one = cuda.compile(srcs[i], { arch = ARCH, cache = false })
      assert.equal(one:image(), mods[i]:image())
      assert.same({ tag .. i }, mods[i]:kernels())
    end
    assert.equal(false, mods[5])
    assert.truthy(errs[5]:find("cudalua_kernel.cu failed to compile (NVRTC_ERROR_COMPILATION)", 1, true))
    assert.equal("cudalua.module<named.cu>", tostring(mods[6]))   -- the item's options join the shared ones
    assert.is_nil(errs[6])
    assert.equal(false, mods[7])
    assert.truthy(errs[7]:find("^unknown option 'bogus'"))
    assert.equal(7, #mods)
  end)

  it("runs each source's NVRTC in a child; children never make a PCH (a licence comment first)", function()
    local out, ok = H.child([[
      local run = ("#define CUDALUA_SPEC_LIC_%d\n"):format(math.random(1, 1e9))
      local lic = "/* licence\n   text */\n// more\n"
      local function s(inc, k) return lic .. run .. "#include <" .. inc .. ">\n"
        .. ('extern "C" __global__ void k%d(int *x) { *x = %d; }\n'):format(k, k) end
      local before = cuda.compile_stats()
      local mods, errs = cuda.compile_all({ s("cub/cub.cuh", 1), s("cooperative_groups.h", 2), s("cub/cub.cuh", 3),
        s("cooperative_groups.h", 4), 'extern "C" __global__ void plain(int *x) { *x = 5; }' }, { arch = "sm_90", cache = false })
      local st = cuda.compile_stats()
      local pid = io.open("/proc/self/stat"):read("a"):match("^(%d+)")
      print(errs == nil and #mods, st.pch_made - before.pch_made, st.pch_used - before.pch_used,
        st.child_runs - before.child_runs, pid)
    ]], nil, "timeout 300")
    assert.is_true(ok, out)
    local n, made, used, children, pid = last(out):match("^(%S+)\t(%d+)\t(%d+)\t(%d+)\t(%d+)$")
    assert.equal("5", n, out)
    -- the first of each #include run made here, the other of each pair used it in a child
    assert.equal("2", made)
    assert.equal("2", used)
    assert.equal("3", children)   -- (the two pairs' second sources and the plain one)
    -- NVRTC deleted the process's PCH folder at its exit: no child made one it did not know
    local left = io.popen("ls -d /tmp/__nvrtc_auto_pch_" .. pid .. "_* 2>/dev/null"):read("a")
    assert.equal("", left)
  end)

  it("a job dropped unread does not hold up the collector (its child is killed)", function()
    local out, ok = H.child([[
      local _, core = debug.getupvalue(package.preload["cudalua.compile"], 2)
      require "cudalua.compile"
      -- (its PTX is about 100 KB: more than a pipe holds, so the child blocks until read)
      local src = '#include <cooperative_groups.h>\nextern "C" __global__ void k(int *x) { *x = 1; }\n'
      local hd = { "-arch=compute_90", "-I/usr/local/cuda/include", "-I/usr/local/cuda/include/cccl" }
      local a = core.nvrtc_start(src, "a.cu", hd, {}, {}, "ptx", false)
      local b = core.nvrtc_start(src, "b.cu", hd, {}, {}, "ptx", false)
      a = nil
      local t0 = cuda.time()
      collectgarbage(); collectgarbage()
      local img = core.nvrtc_wait(b)
      -- (the result is taken once: the job's memory is freed as it is given)
      local again = select(2, pcall(core.nvrtc_wait, b))
      print(type(img), #(img or "") > 65536, cuda.time() - t0 < 30, again)
    ]], nil, "timeout 120")
    assert.is_true(ok, out)
    assert.equal("string\ttrue\ttrue\tcudalua: cuda.compile_all: a compile's result was taken already", last(out))
  end)

  it("keeps to CUDALUA_PCH_MAX: a run two sources share gets none past the cap", function()
    local out, ok = H.child([[
      local function s(run, inc, k) return ("#define CUDALUA_SPEC_CAP_%d\n#include <%s>\n"):format(run, inc)
        .. ('extern "C" __global__ void k%d(int *x) { *x = %d; }\n'):format(k, k) end
      local r1, r2 = math.random(1, 1e9), math.random(1, 1e9)
      local mods, errs = cuda.compile_all({ s(r1, "cub/cub.cuh", 1), s(r1, "cub/cub.cuh", 2),
        s(r2, "cooperative_groups.h", 3), s(r2, "cooperative_groups.h", 4) }, { arch = "sm_90", cache = false })
      local st = cuda.compile_stats()
      print(errs == nil and #mods, st.pch_made, st.pch_used, st.child_runs)
    ]], { CUDALUA_PCH_MAX = "1" }, "timeout 300")
    assert.is_true(ok, out)
    -- the first run's PCH made here and used by its second source; the other pair in children
    -- without one
    assert.equal("4\t1\t1\t3", last(out))
  end)

  it("runs as many children at once as the CPUs the process may use", function()
    local out, ok = H.child([[
      local _, core = debug.getupvalue(package.preload["cudalua.compile"], 2)
      print(core.nprocs())
    ]], nil, "taskset -c 0")
    assert.is_true(ok, out)
    assert.equal("1", last(out))
  end)

  it("a child that gives no result in CUDALUA_COMPILE_TIMEOUT seconds is killed, and says so", function()
    local out, ok = H.child([[
      local src = '#include <cooperative_groups.h>\nextern "C" __global__ void k%d(int *x) { *x = 1; }\n'
      local t0 = cuda.time()
      local mods, errs = cuda.compile_all({ src:format(1), src:format(2) }, { arch = "sm_90", cache = false, pch = false })
      print(mods[1], mods[2], errs and errs[1], cuda.time() - t0 < 5)
    ]], { CUDALUA_COMPILE_TIMEOUT = "0.05" }, "timeout 120")
    assert.is_true(ok, out)
    assert.equal("false\tfalse\tcuda.compile_all: a compile's child process gave no result in 0.05 s "
      .. "(CUDALUA_COMPILE_TIMEOUT): it was killed\ttrue", last(out))
  end)

  it("gives no error table when every source compiles; cache hits come back too", function()
    local src = 'extern "C" __global__ void hit(int *x) { *x = 7; }'
    local first = cuda.compile(src, { arch = ARCH })
    local mods, errs = cuda.compile_all({ src, cub_source(9, "miss" .. math.random(1, 1e9)) }, { arch = ARCH })
    assert.is_nil(errs)
    assert.is_true(rawequal(first, mods[1]))
    assert.equal(2, #mods)
  end)

  it("checks its arguments", function()
    C.raises("cuda.compile_all: argument 1: a list of sources expected, got string", cuda.compile_all, "x")
    C.raises("cuda.compile_all: argument 2: options table expected, got number", cuda.compile_all, {}, 3)
    C.raises("cuda.compile_all: item 2: a source or {source, opts} expected, got number", cuda.compile_all,
      { "x", 5 }, { arch = ARCH })
    C.raises("cuda.compile_all: item 1: a source or {source, opts} expected", cuda.compile_all, { { 5 } })
    local mods, errs = cuda.compile_all({})
    assert.same({}, mods)
    assert.is_nil(errs)
  end)

  H.gpuonly(it, pending, "cooperative groups")("its modules' kernels give what the CPU computes, on random data", function()
    local tag = "r" .. math.random(1, 1e9)
    local ks, srcs = {}, {}
    for i = 1, 6 do ks[i] = math.random(-9, 9); srcs[i] = cg_source(ks[i], tag .. i) end
    local mods = cuda.compile_all(srcs)
    local n = math.random(1, 5000)
    local x = H.rand_table(n, -1000, 1000, true)
    local sum = 0
    for i = 1, n do sum = sum + x[i] end
    local dx = cuda.array(x, "int32")
    for i = 1, 6 do
      local out = cuda.zeros(1, "int32")
      mods[i]:get(tag .. i)[{ (n + 127) // 128, 128 }](dx, out, n)
      assert.equal(sum * ks[i], out:copy_to_host()[1])
    end
  end)
end)

describe("a process whose kernels are all in the disk cache", function()
  it("loads neither NVRTC nor nvJitLink", function()
    local dir = H.tmpdir()
    local code = ([[
      local m = cuda.compile(%q, { arch = "sm_90" })
      local k = cuda.compile(%q, { arch = "sm_90" })
      local maps = io.open("/proc/self/maps"):read("a")
      local st = cuda.compile_stats()
      print(maps:find("libnvrtc", 1, true) ~= nil, maps:find("libnvJitLink", 1, true) ~= nil, st.cache_disk_hits, st.nvrtc_runs)
    ]]):format(cub_source(4, "cold"), 'extern "C" __global__ void plain(int *x) { *x = 2; }')
    local out, ok = H.child(code, { CUDALUA_CACHE_DIR = dir })
    assert.is_true(ok, out)
    assert.truthy((last(out) or ""):find("^true\t"), out)   -- the first process compiled
    out, ok = H.child(code, { CUDALUA_CACHE_DIR = dir })
    assert.is_true(ok, out)
    assert.equal("false\tfalse\t2\t0", last(out) or out)
    H.rmrf(dir)
  end)
end)
