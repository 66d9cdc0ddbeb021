-- cuda_cpp.lua: what real CUDA C++ costs through cudalua, next to the raw calls in the same
-- process (bench/rawloop.c): a cold compile of a source including <cooperative_groups.h>
-- against raw NVRTC with the same options (the same include folders), its disk cache hit in a
-- new process, NVRTC's precompiled headers and cuda.compile_all (issue 28), a new process's
-- start to its first kernel result, and cluster and cooperative launches against raw
-- cuLaunchKernelEx and cuLaunchCooperativeKernel. Prints "key value" lines like bench/core.lua.
-- Env: BENCH_LAUNCHES, BENCH_REPS, BENCH_SECTIONS (bench/common.lua)
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
package.path = "bench/?.lua;" .. package.path
local B = require "common"
local CC = require "cudalua.compile"
local HD = require "cudalua.headers"
local N, REPS, now, out, median = B.N, B.REPS, B.now, B.out, B.median
local function section(name, f) B.section("cuda_cpp.lua", name, f) end

local CG_SRC = [[
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cg_sum(const float *x, float *out, int n) {
  auto block = cg::this_thread_block();
  auto warp = cg::tiled_partition<32>(block);
  float v = 0;
  for (int i = block.group_index().x * block.size() + block.thread_rank(); i < n; i += gridDim.x * block.size()) v += x[i];
  v = cg::reduce(warp, v, cg::plus<float>());
  if (warp.thread_rank() == 0) atomicAdd(out, v);
}
]]

-- a new process: the context first, then cuda.kernel on a source an earlier process compiled
if arg[1] == "--compile-child" then
  cuda.synchronize()
  local t0 = now()
  local m = cuda.compile(CG_SRC .. ("\n// cuda_cpp %s\n"):format(arg[2]))
  local t1 = now()
  local k = m:get("cg_sum")
  local ms = (now() - t0) * 1e3
  assert(k)
  print(("%.4f %d %.4f %d %d"):format(ms, require("cudalua.cache").stats.disk_hits, (t1 - t0) * 1e3,
    #m:image(), #m:ptx()))
  os.exit(0)
end

section("info", function()
  local v = cuda.versions()
  print(("info_cuda_cpp NVRTC %s, nvJitLink %s, toolkit headers %s, CCCL %s"):format(
    v.nvrtc and table.concat(v.nvrtc, ".") or "?", v.nvjitlink and table.concat(v.nvjitlink, ".") or "?",
    HD.toolkit_includes().include or "?", HD.toolkit_includes().cccl or "?"))
end)

---------------------------------------------------------------------------------------------
-- cold compiles of the cooperative-groups source: cuda.compile (cache on, each source new) and
-- raw NVRTC with -arch and the same -I folders take turns
section("cg compile", function()
  local arch = CC.device_arch()
  if not arch:match("^sm_") then error("NVRTC does not know this device's arch: " .. arch) end
  local tk = HD.toolkit_includes()
  local stamp = ("%d %d"):format(os.time(), math.random(1 << 30))
  local count = 0
  local function unique() count = count + 1; return CG_SRC .. ("\n// cold %d %s\n"):format(count, stamp) end
  local rawloop, why = B.rawloop()
  -- cudalua's own part of each compile: its time less NVRTC's (the C core's call, timed here)
  local own, in_nvrtc = {}, 0
  local bodies = { cudalua = function(m)
    for _ = 1, m do
      in_nvrtc = 0
      local t0 = now()
      cuda.compile(unique(), { pch = false })   -- (a cold compile: the PCH rows are below)
      own[#own + 1] = (now() - t0 - in_nvrtc) * 1e3
    end
  end }
  local nvrtc_compile = B.core and B.core.nvrtc_compile
  if nvrtc_compile then
    B.core.nvrtc_compile = function(...)
      local t0 = now()
      local r = table.pack(nvrtc_compile(...))
      in_nvrtc = in_nvrtc + (now() - t0)
      return table.unpack(r, 1, r.n)
    end
  end
  if rawloop then
    bodies.raw = function(m) for _ = 1, m do rawloop.compile(unique(), arch, "-I" .. tk.include, "-I" .. tk.cccl) end end
  end
  -- a cold compile takes about a second, nearly all of it in NVRTC, whose own time varied from
  -- 1.0 to 1.8 s between identical compiles on the GPU machine (cudalua's own part, timed
  -- apart, was 1.5 ms). That noise only adds, so each side's fastest compile is compared: a
  -- median of ten took either side's bad luck for cudalua's cost (B.interleaved gives µs)
  local ok, cold = pcall(B.interleaved, bodies, 1, math.max(10, 2 * REPS), nil, B.min)
  if nvrtc_compile then B.core.nvrtc_compile = nvrtc_compile end
  if not ok then error(cold, 0) end
  if nvrtc_compile then
    table.remove(own, 1)   -- B.interleaved's warm-up call
    out("diag_cg_compile_outside_nvrtc_ms", median(own))
  end
  out("cg_compile_ms", cold.cudalua / 1e3)
  if rawloop then out("inproc_cg_compile_ms", cold.raw / 1e3) else B.note("no raw NVRTC loop: " .. why) end

  -- the disk cache hit, in new processes (the parent wrote the entry)
  local hits, looks, sizes = {}, {}, ""
  for r = 1, REPS do
    local nonce = stamp .. " child " .. r
    cuda.compile(CG_SRC .. ("\n// cuda_cpp %s\n"):format(nonce))
    local p = assert(io.popen(("%s bench/cuda_cpp.lua --compile-child %q"):format(arg[-1] or "lua5.4", nonce)))
    local line = p:read("a")
    p:close()
    local ms, disk, lookup, cubin, ptx = line:match("^(%S+) (%d+) (%S+) (%d+) (%d+)")
    if tonumber(disk) ~= 1 then error("the child did not hit the disk cache: " .. line) end
    hits[r], looks[r] = tonumber(ms), tonumber(lookup)
    sizes = ("%s bytes of cubin, %s of PTX"):format(cubin, ptx)
  end
  out("cg_compile_disk_child_ms", median(hits))
  out("diag_cg_compile_disk_child_lookup_ms", median(looks))
  B.note("the cooperative-groups entry: " .. sizes)
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- issue 28: NVRTC's precompiled headers (cudalua makes and uses them for sources including the
-- toolkit's or CCCL's headers). For CUB and for cooperative groups: a first compile whose run
-- of #includes is new to the process (a #define of its own before them: the PCH is made), then
-- a second, different source with the same run (the PCH used), and raw NVRTC without a PCH on
-- the first one's source, in turns; the fastest of four each (NVRTC's time varies by tens of
-- percent between identical compiles)
local CUB_SRC = [[
#include <cub/cub.cuh>
extern "C" __global__ void cub_sum(const int *x, int *out) {
  using R = cub::BlockReduce<int, 128>;
  __shared__ typename R::TempStorage t;
  int s = R(t).Sum(x[threadIdx.x]);
  if (threadIdx.x == 0) *out = s;
}
]]
local pch_n = 0
local function another(body)   -- a different source: one more kernel
  pch_n = pch_n + 1
  return body .. ('extern "C" __global__ void other_%d(int *x) { *x = %d; }\n'):format(pch_n, pch_n)
end

-- (raw NVRTC: the C core's NVRTC call, without the PCH, on exactly what cudalua gave NVRTC for
-- the second source: the same text, options and in-memory headers; plain NVRTC on the bare
-- source fails, <cub/cub.cuh> needing cudalua's stand-in headers)
section("pch", function()
  -- each first compile below makes a PCH of its own: 9 in the process, past the default cap
  if (tonumber(os.getenv("CUDALUA_PCH_MAX") or "") or 4) < 9 then
    error("set CUDALUA_PCH_MAX=9 or more (bench/run.sh does): these rows make 9 precompiled headers", 0)
  end
  local nvrtc_compile = assert(B.core and B.core.nvrtc_compile, "the C core is not reachable")
  local last
  B.core.nvrtc_compile = function(...) last = table.pack(...); return nvrtc_compile(...) end
  local ok, err = pcall(function()
    for _, case in ipairs { { "cub", CUB_SRC }, { "cg", CG_SRC } } do
      local name, body = case[1], case[2]
      local first, second, raw = math.huge, math.huge, math.huge
      for r = 1, 4 do
        local src = ("#define CUDALUA_BENCH_PCH_%d_%d\n"):format(r, math.random(1 << 30)) .. body
        local t0 = now()
        local m = cuda.compile(src, { cache = false })
        first = math.min(first, now() - t0)
        assert(m:log():find("made a precompiled header", 1, true), "no PCH made: " .. m:log())
        t0 = now()
        m = cuda.compile(another(src), { cache = false })
        second = math.min(second, now() - t0)
        assert(m:log():find("used a precompiled header", 1, true), "the PCH not used: " .. m:log())
        local a = last
        a[7] = false
        t0 = now()
        assert(nvrtc_compile(table.unpack(a, 1, 7)), "raw NVRTC failed")
        raw = math.min(raw, now() - t0)
      end
      out(("pch_%s_first_ms"):format(name), first * 1e3)
      out(("pch_%s_second_ms"):format(name), second * 1e3)
      out(("inproc_pch_%s_raw_ms"):format(name), raw * 1e3)
    end
  end)
  B.core.nvrtc_compile = nvrtc_compile
  if not ok then error(err, 0) end
  -- 8 different CUB sources, one by one with cuda.compile and at once with cuda.compile_all,
  -- in turns, the PCH made beforehand (the steady state); then the same without PCHs
  for _, pch in ipairs { true, false } do
    cuda.compile(another(CUB_SRC), { cache = false, pch = pch })
    local seq, par = math.huge, math.huge
    for _ = 1, 2 do
      local list = {}
      for i = 1, 8 do list[i] = another(CUB_SRC) end
      local t0 = now()
      for i = 1, 8 do cuda.compile(list[i], { cache = false, pch = pch }) end
      seq = math.min(seq, now() - t0)
      for i = 1, 8 do list[i] = another(CUB_SRC) end
      t0 = now()
      local mods, errs = cuda.compile_all(list, { cache = false, pch = pch })
      par = math.min(par, now() - t0)
      assert(not errs and #mods == 8)
    end
    local tag = pch and "" or "_nopch"
    out("compile_8_seq" .. tag .. "_ms", seq * 1e3)
    out("compile_8_all" .. tag .. "_ms", par * 1e3)
  end
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- issue 28: a new process whose kernel is in the disk cache, from the `lua` command's start
-- to the kernel's result read back (timed by this process around it); and the same process
-- stopping after require "cudalua" and making the context (the driver's own start)
local COLD_SRC = 'extern "C" __global__ void cold_fill(int *x, int v) { x[threadIdx.x] = v; }\n'
local COLD_CHILD = [[
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
cuda.synchronize()
if arg[1] == "ctx" then print("ok") os.exit(0, true) end
local x = cuda.device_array(32, "int32")
cuda.compile(%q).cold_fill[{ 1, 32 }](x, 7)
print(x[32] == 7 and "ok" or "wrong", require("cudalua.cache").stats.disk_hits)
os.exit(0, true)
]]
section("cold start", function()
  cuda.compile(COLD_SRC)   -- the disk cache entry the children find
  local lua = arg[-1] or "lua5.4"
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(COLD_CHILD:format(COLD_SRC))
  f:close()
  -- a new process's run: its milliseconds, from popen to its end; its output must say ok
  local function timed(cmd, who)
    local t0 = now()
    local p = assert(io.popen(cmd))
    local line = p:read("a")
    p:close()
    local dt = (now() - t0) * 1e3
    if not line:find("^ok") then error(who .. ": " .. line) end
    return dt, line
  end
  local function child(what)
    local dt, line = timed(("%s %s %s"):format(lua, path, what), "the child")
    if what == "run" and not line:find("^ok\t1") then error("the child did not hit the disk cache: " .. line) end
    return dt
  end
  -- the same in C (bench/cold_start.c, built by bench/run.sh): the context, the cubin loaded
  -- from a file, the launch, the result
  local exe = "bench/out/cold_start"
  local cubin = os.tmpname()
  f = assert(io.open(cubin, "wb"))
  f:write(cuda.compile(COLD_SRC):image())
  f:close()
  local function raw(how) return (timed(("%s %s %s"):format(exe, cubin, how), "bench/cold_start")) end
  local have_raw = io.open(exe) ~= nil
  if not have_raw then B.note("no bench/out/cold_start (bench/run.sh builds it)") end
  -- (the driver's context creation varies from 115 to 200 ms between processes: nine turns)
  local full, ctx, rawt, rawa = {}, {}, {}, {}
  for r = 1, math.max(9, REPS) do
    full[r] = child("run")
    ctx[r] = child("ctx")
    if have_raw then rawt[r], rawa[r] = raw(""), raw("async") end
  end
  os.remove(path)
  os.remove(cubin)
  out("cold_start_result_ms", median(full))
  out("cold_start_context_ms", median(ctx))
  if have_raw then
    out("cold_start_raw_ms", median(rawt))
    out("cold_start_raw_async_ms", median(rawa))
  end
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- cluster launches (grid 8, block 32, clusters of 2) and cooperative launches (one block per
-- multiprocessor, block 32) of an empty kernel taking one pointer; cudalua's launcher made
-- once, its k[cfg] form with the table kept, and the raw loops take turns
section("cluster and cooperative launches", function()
  local mod = cuda.compile('extern "C" __global__ void empty1(int *x) {}\n')
  local k = mod.empty1
  local d = cuda.device_array(32, "int32")
  local rawloop, why = B.rawloop()
  local sms = cuda.gpus.current:info().multiprocessors
  local ccfg = { 8, 32, cluster = 2 }
  local pcfg = { sms, 32, cooperative = true }
  local bodies = {
    cluster_launcher = function(m)
      local l = k[ccfg]
      for _ = 1, m do l(d) end
    end,
    cluster_cfg = function(m) for _ = 1, m do k[ccfg](d) end end,
    coop_launcher = function(m)
      local l = k[pcfg]
      for _ = 1, m do l(d) end
    end,
    coop_cfg = function(m) for _ = 1, m do k[pcfg](d) end end,
  }
  if rawloop then
    local h, p = k:handle(), d:ptr()
    bodies.raw_cluster = function(m) rawloop.launch_ex(h, m, 8, 32, 2, p) end
    bodies.raw_coop = function(m) rawloop.launch_coop(h, m, sms, 32, p) end
  else
    B.note("no raw launch loop: " .. why)
  end
  B.out_launches(B.interleaved(bodies, math.max(1, N // 10), REPS * 8))
end)
