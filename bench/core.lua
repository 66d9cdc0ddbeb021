-- core.lua: the five measurements of bench/raw.c made through cudalua, with the same kernels,
-- sizes and method. Prints one "key value" line per measurement; keys starting with diag_ are
-- pieces timed apart to show where cudalua's time goes. A section that fails prints a "# ..."
-- line and the others still run.
-- Env: BENCH_LAUNCHES (default 100000), BENCH_REPS (default 5)
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"

package.path = "bench/?.lua;" .. package.path
local B = require "common"
local N, REPS, now, out, median, per_item = B.N, B.REPS, B.now, B.out, B.median, B.per_item
local function section(name, f) B.section("core.lua", name, f) end
local VECADD, core = B.VECADD, B.core

-- keep this source identical to the one in bench/raw.c
local KSRC = 'extern "C" __global__ void empty() {}\n' ..
             'extern "C" __global__ void four(float *a, const float *b, int n, double s) {}\n'

section("info", function()
  local v = cuda.versions()
  local dev = cuda.devices()[cuda.current_device() + 1]
  local nvpath = core and core.nvrtc_version and select(3, core.nvrtc_version())
  print(("info_cudalua %s (sm_%d%d), driver %d, NVRTC %s, cudalua %s, %s"):format(dev.name,
    dev.compute_capability[1], dev.compute_capability[2], v.driver,
    v.nvrtc and table.concat(v.nvrtc, ".") or "?", v.cudalua, nvpath or "?"))
end)

---------------------------------------------------------------------------------------------
-- 1, 2: N back-to-back launches on one stream (the legacy stream), then a synchronize
section("launches", function()
  local mod = cuda.compile(KSRC)
  local empty, four = mod.empty, mod.four
  local n, s = 1024, 2.5
  local d_a, d_b = cuda.device_array(n, "float32"), cuda.device_array(n, "float32")
  -- the six forms and the raw loops on the same kernels take turns (medians of 2 * REPS rounds)
  local bodies = {
    empty = function(m) for _ = 1, m do empty[{1, 1}]() end end,
    empty_launcher = function(m)
      local l = empty[{1, 1}]
      for _ = 1, m do l() end
    end,
    four = function(m) for _ = 1, m do four[{1, 1}](d_a, d_b, n, s) end end,
    four_launcher = function(m)
      local l = four[{1, 1}]
      for _ = 1, m do l(d_a, d_b, n, s) end
    end,
    -- the tutorial form without Lua making a table per call: what the binding does each time
    empty_cfg = function(m)
      local cfg = {1, 1}
      for _ = 1, m do empty[cfg]() end
    end,
    four_cfg = function(m)
      local cfg = {1, 1}
      for _ = 1, m do four[cfg](d_a, d_b, n, s) end
    end,
  }
  -- raw cuLaunchKernel loops in this process
  local rawloop, why = B.rawloop()
  if rawloop then
    local he, hf, pa, pb = empty:handle(), four:handle(), d_a:ptr(), d_b:ptr()
    bodies.raw_empty = function(m) rawloop.launch(he, m) end
    bodies.raw_four = function(m) rawloop.launch(hf, m, pa, pb, n, s) end
  else
    B.note(("core.lua: no in-process raw loop (%s)"):format(why))
  end
  -- many short rounds: launch cost drifts within seconds on the GPU machine
  B.out_launches(B.interleaved(bodies, math.max(1, N // 10), REPS * 8))
  -- enqueue time alone (before the synchronize), one form after the other
  for _, name in ipairs { "empty", "four" } do
    out("diag_launch_" .. name .. "_enqueue_us", select(2, per_item(bodies[name])))
  end
  -- the pieces of the tutorial form, without launching: the {1, 1} table, then the launcher
  -- object k[{1, 1}] makes from it; and a Lua-to-C call that does nothing, for scale
  out("diag_config_table_us", (per_item(function(m)
    for _ = 1, m do local t = {1, 1} end
  end)))
  out("diag_make_launcher_us", (per_item(function(m)
    for _ = 1, m do local l = empty[{1, 1}] end
  end)))
  out("diag_lua_c_call_us", (per_item(function(m)
    for _ = 1, m do now() end
  end)))
end)
collectgarbage()

-- NVTX with no profiler attached: each call is a Lua-to-C call and an empty function
section("nvtx", function()
  local mark, push, pop = cuda.nvtx.mark, cuda.nvtx.range_push, cuda.nvtx.range_pop
  local m_us = per_item(function(m) for _ = 1, m do mark("bench") end end)
  local pp_us = per_item(function(m) for _ = 1, m do push("bench"); pop() end end)
  out("nvtx_mark_ns", m_us * 1e3)
  out("nvtx_push_pop_ns", pp_us * 1e3)
  out("nvtx_call_ns", math.max(m_us, pp_us / 2) * 1e3)
end)

---------------------------------------------------------------------------------------------
-- 3: 256 MiB copies, each finished before the clock stops (no stream: copies are synchronous)
local BYTES = 256 << 20
local NEL = BYTES // 4

local function bandwidth(copy)
  copy()   -- warm-up
  local t = {}
  for r = 1, REPS do
    local t0 = now()
    copy()
    t[r] = BYTES / (now() - t0) / 1e9
  end
  return median(t)
end

section("copies", function()
  local d = cuda.device_array(NEL, "float32")
  section("pinned copies", function()
    local p = cuda.pinned_array(NEL, "float32")
    p:fill(1)
    out("h2d_pinned_gbs", bandwidth(function() d:copy_to_device(p) end))
    out("d2h_pinned_gbs", bandwidth(function() d:copy_to_host(p) end))
    p:close()
  end)
  -- default (pageable) host arrays: cudalua page-locks a large one on its first copy, and
  -- later copies reuse that
  section("default array copies", function()
    local h = cuda.array(NEL, "float32")
    h:fill(1)
    out("h2d_default_gbs", bandwidth(function() d:copy_to_device(h) end))
    out("d2h_default_gbs", bandwidth(function() d:copy_to_host(h) end))
    h:close()
  end)
  local function first_copy(h2d)
    local t, tclose, talloc, tfill = {}, {}, {}, {}
    for r = 1, 3 do
      local t0 = now()
      local h = cuda.array(NEL, "float32")
      talloc[r] = (now() - t0) * 1e3
      t0 = now()
      h:fill(1)   -- a user's array holds data: its pages exist before the copy
      tfill[r] = (now() - t0) * 1e3
      t0 = now()
      if h2d then d:copy_to_device(h) else d:copy_to_host(h) end
      t[r] = BYTES / (now() - t0) / 1e9
      t0 = now()
      h:close()
      tclose[r] = (now() - t0) * 1e3
    end
    return median(t), median(tclose), median(talloc), median(tfill)
  end
  -- a 4096 x 4096 block of an 8192 x 8192 float32 matrix (d's 256 MiB) into pinned memory: a
  -- strided view's copy (one cuMemcpy2DAsync) and the raw call, taking turns
  section("strided view copy", function()
    local m = d:reshape(8192, 8192)
    local blk = m:sub({ 1, 4096 }, { 1, 4096 })
    local p = cuda.pinned_array({ 4096, 4096 }, "float32")
    local rawloop = B.rawloop()
    local mine, raw = {}, {}
    local bytes = 4096 * 4096 * 4
    blk:copy_to_host(p)
    if rawloop then rawloop.copy2d(1, p:ptr(), 4096 * 4, blk:ptr(), 8192 * 4, 4096 * 4, 4096) end
    for r = 1, REPS do
      local t0 = now()
      blk:copy_to_host(p)
      mine[r] = bytes / (now() - t0) / 1e9
      if rawloop then
        t0 = now()
        rawloop.copy2d(1, p:ptr(), 4096 * 4, blk:ptr(), 8192 * 4, 4096 * 4, 4096)
        raw[r] = bytes / (now() - t0) / 1e9
      end
    end
    out("d2h_view_2d_gbs", median(mine))
    if rawloop then out("inproc_d2h_2d_gbs", median(raw)) end
    p:close()
  end)
  section("default array first copies", function()
    local bw, tclose, talloc, tfill = first_copy(true)
    out("h2d_default_first_gbs", bw)
    out("diag_default_array_256MiB_new_ms", talloc)
    out("diag_default_array_256MiB_fill_ms", tfill)
    out("diag_default_array_256MiB_close_ms", tclose)
    out("d2h_default_first_gbs", (first_copy(false)))
  end)
  d:close()
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 4: device alloc + free of 1 MiB (stream-ordered, from the pool); every free is counted
-- (the collections that run the finalizers are inside the clock)
section("alloc", function()
  local MIB = 1 << 20
  -- the two forms and the raw pair in C (bench/rawloop.c) take turns
  local bodies = {
    close = function(m)
      for _ = 1, m do local a <close> = cuda.device_array(MIB, "uint8") end
      collectgarbage()
    end,
    gc = function(m)
      for _ = 1, m do local a = cuda.device_array(MIB, "uint8") end
      collectgarbage()
    end,
    -- without cudalua's block cache: every array is a driver pool allocation and free
    nocache = function(m)
      local _, limit = cuda.block_cache(0)
      for _ = 1, m do local a <close> = cuda.device_array(MIB, "uint8") end
      collectgarbage()
      cuda.block_cache(limit)
    end,
  }
  local rawloop = B.rawloop()
  if rawloop then bodies.raw = function(m) rawloop.alloc_free(m, MIB) end end
  local r = B.interleaved(bodies, math.max(1, N // 10), REPS * 8)
  out("alloc_free_close_us", r.close)
  out("alloc_free_gc_us", r.gc)
  out("alloc_free_close_nocache_us", r.nocache)
  if r.raw then out("inproc_alloc_free_us", r.raw) end
  -- the wrapper alone: a 0-byte device array allocates and frees no device memory
  out("diag_alloc_free_0bytes_close_us", (per_item(function(m)
    for _ = 1, m do local a <close> = cuda.device_array(0, "uint8") end
    collectgarbage()
  end)))
  out("diag_alloc_free_0bytes_dtypeobj_close_us", (per_item(function(m)
    local u8 = cuda.uint8
    for _ = 1, m do local a <close> = cuda.device_array(0, u8) end
    collectgarbage()
  end)))
  -- a 0-byte host array: the same userdata and bookkeeping with no driver call at all
  out("diag_host_array_0bytes_close_us", (per_item(function(m)
    for _ = 1, m do local a <close> = cuda.array(0, "uint8") end
    collectgarbage()
  end)))
  out("diag_alloc_free_0bytes_gc_us", (per_item(function(m)
    for _ = 1, m do local a = cuda.device_array(0, "uint8") end
    collectgarbage()
  end)))
  -- the same loops under Lua's generational collector (a program's own choice: cudalua
  -- leaves the collector's mode alone), where short-lived objects cost less to finalize
  collectgarbage("generational")
  out("diag_alloc_free_close_generational_us", (per_item(function(m)
    for _ = 1, m do local a <close> = cuda.device_array(MIB, "uint8") end
    collectgarbage()
  end)))
  out("diag_alloc_free_gc_generational_us", (per_item(function(m)
    for _ = 1, m do local a = cuda.device_array(MIB, "uint8") end
    collectgarbage()
  end)))
  collectgarbage("incremental")
  -- issue 31's statistics: a table of 15 counts, 4 of them the driver pool's attributes
  out("memory_stats_us", (per_item(function(m)
    for _ = 1, m do cuda.memory_stats() end
  end)))
end)
collectgarbage()

---------------------------------------------------------------------------------------------
-- 5: cold compiles: a source no cache has seen (a comment with a counter appended)
local stamp = ("%d %d"):format(os.time(), math.random(1 << 30))
local count = 0
local function unique() count = count + 1; return VECADD .. ("\n// bench %d %s\n"):format(count, stamp) end
local function compile_ms(f)
  f(unique())   -- warm-up
  local t = {}
  for r = 1, REPS do
    local src = unique()
    local t0 = now()
    f(src)
    t[r] = (now() - t0) * 1e3
  end
  return median(t)
end

section("compile", function()
  local rawloop = B.rawloop()
  if not rawloop then
    out("compile_ms", compile_ms(function(src) cuda.compile(src, {arch = "sm_90"}) end))
    return
  end
  -- cuda.compile and the raw NVRTC calls (bench/rawloop.c) take turns, each on a new source
  local t, traw = {}, {}
  for r = 0, REPS * 2 do
    for turn = 1, 2 do
      local src, raw = unique(), (turn + r) % 2 == 0
      local t0 = now()
      if raw then rawloop.compile(src, "sm_90") else cuda.compile(src, {arch = "sm_90"}) end
      local ms = (now() - t0) * 1e3
      if r > 0 then table.insert(raw and traw or t, ms) end   -- round 0: warm-up
    end
  end
  out("compile_ms", median(t))
  out("inproc_compile_ms", median(traw))
end)

-- the same NVRTC work in pieces, through the C core: only -arch (as raw.c), then what
-- cuda.compile adds one by one (the CUDA include path, the shipped headers, the name
-- expressions and the probe template that read the kernel's parameter types)
section("compile pieces", function()
  if not (core and core.nvrtc_compile) then error("no access to the C core") end
  local inc
  for _, base in ipairs { os.getenv("CUDA_HOME") or "", os.getenv("CUDA_DIR") or "", "/usr/local/cuda" } do
    local f = base ~= "" and io.open(base .. "/include/cuda_fp16.h")
    if f then f:close(); inc = base .. "/include"; break end
  end
  local PROBE = '\n#line 1 "cudalua-probe"\ntemplate<typename T> __global__ void __cudalua_sig() {}\n'
  local exprs = { "vecadd", "__cudalua_sig<decltype(vecadd)>" }
  local opts = { "-arch=sm_90" }
  local opts_inc = { "-arch=sm_90", inc and "-I" .. inc or nil }
  out("diag_compile_nvrtc_plain_ms", compile_ms(function(src)
    assert(core.nvrtc_compile(src, "cudalua_kernel.cu", opts, {}, {}, "cubin"))
  end))
  out("diag_compile_nvrtc_include_ms", compile_ms(function(src)
    assert(core.nvrtc_compile(src, "cudalua_kernel.cu", opts_inc, {}, {}, "cubin"))
  end))
  out("diag_compile_nvrtc_headers_ms", compile_ms(function(src)
    assert(core.nvrtc_compile(src, "cudalua_kernel.cu", opts_inc, core.headers, {}, "cubin"))
  end))
  out("diag_compile_nvrtc_probe_ms", compile_ms(function(src)
    assert(core.nvrtc_compile(src .. PROBE, "cudalua_kernel.cu", opts_inc, core.headers, exprs, "cubin"))
  end))
end)
