-- cudalua.compile: runtime compilation with NVRTC, and the modules and kernels it gives.
-- compile() below is the whole pipeline, a step a line; the parts it leans on:
-- cudalua.check (the options), cudalua.system (devices and libraries, asked once),
-- cudalua.headers (what a compile includes), cudalua.cache, cudalua.probe (which kernels are
-- looked up, and their parameter types from the compiler) and cudalua.module (what it gives).
local core = ...
local cache = require "cudalua.cache"
local modules = require "cudalua.module"
local includes = require "cudalua.headers"
local check = require "cudalua.check"
local system = require "cudalua.system"
local probe = require "cudalua.probe"
local globals = require "cudalua.globals"
local cpu = require "cudalua.cpucompile"
local M = {}

-- the type kernel code computes with for a dtype, and the header that declares it: complex
-- numbers as cuda::std::complex (cuComplex's layout, with the arithmetic), the others as their
-- C type
local VALUE = { complex64 = "cuda::std::complex<float>", complex128 = "cuda::std::complex<double>" }
local HEADER = { float16 = "#include <cuda_fp16.h>", bfloat16 = "#include <cuda_bf16.h>",
  complex64 = "#include <cuda/std/complex>", complex128 = "#include <cuda/std/complex>" }
function M.value_type(dtype) return VALUE[dtype.name] or dtype.ctype, HEADER[dtype.name] end

-- bench/cuda_cpp.lua asks it which arch a compile without opts.arch gets
M.device_arch = system.device_arch

local function has_option(options, names)
  for _, o in ipairs(options) do
    for _, n in ipairs(names) do
      if o == n or o:sub(1, #n + 1) == n .. "=" then return true end
    end
  end
  return false
end

-- options that ptxas itself takes, or that make relocatable or debug code: with any of them
-- NVRTC makes the cubin itself
local PTXAS_OPTIONS = { "-Xptxas", "--ptxas-options", "-maxrregcount", "--maxrregcount", "-G",
  "--device-debug", "-rdc", "--relocatable-device-code", "-dc", "--device-c", "-dw", "--device-w",
  "-ewp", "--extensible-whole-program", "-dlto", "--dlink-time-opt", "-dopt", "--dopt", "-Ofc",
  "--Ofast-compile" }

-- the way a cubin is made, as the cache key says it: "nvrtc" (NVRTC makes it), or nvJitLink's
-- identity (for a source with headers, it assembles NVRTC's PTX once the variables nothing
-- uses are out: core.ptx_strip says why). Known without loading either library. Bump PIPELINE
-- when ptx_strip or has_includes changes.
local PIPELINE = "ptx_strip 3"
local function pipeline(opts, options)
  if opts.debug or opts.relocatable or opts.lto or has_option(options, PTXAS_OPTIONS) then return "nvrtc" end
  local jitlink_id = system.jitlink_identity()
  return jitlink_id:match(":none$") and "nvrtc" or PIPELINE .. " " .. jitlink_id
end

-- the source's #include lines, read once: the cache key and the pipeline both need them
local function source_includes(job)
  job.includes = job.includes or includes.read_includes(job.src)
  return job.includes
end

-- the user's files the source includes, as the cache key holds them (headers.user_files), read
-- once per job: the cache key and the PCH choice both ask
local function user_deps(job)
  if not job.deps_read then
    job.deps, job.deps_read = includes.user_files(source_includes(job), job.name, job.options, job.opts.headers or {}), true
  end
  return job.deps
end

-- does the source take headers beyond cudalua's own (where unused module variables come from)?
local function has_includes(job)
  if next(job.opts.headers or {}) or has_option(job.options, { "-include", "--pre-include" }) then return true end
  return source_includes(job).foreign
end

-- nvJitLink assembles NVRTC's PTX only when it is at least as new
local function jitlink_usable()
  local ja, ji = system.jitlink_version()
  local na, ni = system.nvrtc_version()
  return ja and na and ja > 0 and (ja > na or (ja == na and ji >= ni))
end

-- a module from a compile's entry (as the disk cache keeps it)
local function module_of(e, name)
  return modules.new { image = e.image, kind = e.kind, log = e.log, info = e.info, ptx = e.ptx,
                       name = name, arch = e.arch, relocatable = e.relocatable, source = true }
end

---------------------------------------------------------------------------------------------
-- The steps of compile(), in its order. The job (plan) carries what one step finds to the
-- next. Error levels count up to the user's call: a step prepare() runs says 5 when it raises
-- itself (the step, prepare(), compile(), cuda.compile or cuda.kernel, the user), a step
-- finish() runs says 4 (finish() is compile()'s tail call: it takes compile()'s place), and
-- what a step calls one level more.

-- opts, or {} for nil, once every option in it is known and well formed
local COMPILE_OPTS = { options = "table", name = "string", headers = "table", arch = "string",
  name_expressions = "table", cache = "boolean", include_dirs = "table", relocatable = "boolean",
  lto = "boolean", debug = "boolean", lineinfo = "boolean", pch = "boolean" }

local function check_opts(opts)
  local level = 6
  opts = check.table(opts, COMPILE_OPTS, "cuda.compile", level)
  check.strings(opts.options or {}, "opts.options", "cuda.compile", level)
  for k, v in pairs(opts.headers or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      check.error("cuda.compile", level - 1, "opts.headers maps header names to their source text (strings)")
    end
  end
  check.strings(opts.name_expressions or {}, "opts.name_expressions", "cuda.compile", level)
  check.strings(opts.include_dirs or {}, "opts.include_dirs", "cuda.compile", level)
  for i, d in ipairs(opts.include_dirs or {}) do
    local is_dir = select(3, core.file_info(d))
    if not is_dir then check.error("cuda.compile", level - 1, "opts.include_dirs[%d] is not a directory: %s", i, d) end
  end
  check.arch(opts.arch, "cuda.compile", level)
  if opts.lto and opts.arch and opts.arch:match("^compute_") then
    check.error("cuda.compile", level - 1, "lto = true needs an sm_ arch (LTO-IR is linked for a real architecture)")
  end
  return opts
end

-- NVRTC's options: the user's folders first, as with nvcc (they may hold a newer CCCL), then
-- the options opts asks for, the user's own, and the toolkit's folders
local function nvrtc_options(opts)
  local options = {}
  for _, d in ipairs(opts.include_dirs or {}) do options[#options + 1] = "-I" .. d end
  if opts.relocatable then options[#options + 1] = "-rdc=true" end
  if opts.lto then options[#options + 1] = "-dlto" end
  if opts.debug then options[#options + 1] = "-G" end
  if opts.debug or opts.lineinfo then options[#options + 1] = "-lineinfo" end
  local given = opts.options or {}
  for i, o in ipairs(given) do
    -- NVRTC always optimises and knows no -O1..-O3: accepted for nvcc habits, and left out,
    -- unless it is ptxas's, the word after -Xptxas (NVRTC takes the next option as its value)
    local prev = given[i - 1]
    if not o:match("^%-O[123]$") or prev == "-Xptxas" or prev == "--ptxas-options" then
      options[#options + 1] = o
    end
  end
  local tk = includes.toolkit_includes()
  if tk.include then options[#options + 1] = "-I" .. tk.include end
  if tk.cccl then options[#options + 1] = "-I" .. tk.cccl end
  return options, tk.id
end

-- the job: what every step takes, known before anything loads NVRTC (~5 ms) so that the cache
-- is consulted first: without an explicit arch the key holds the device's compute
-- capability, and the arch NVRTC gets is chosen on a miss
local function plan(src, opts)
  local job = { src = src, opts = opts, name = opts.name or "cudalua_kernel.cu" }
  -- the CPU device: the host C++ compiler instead of NVRTC, unless a GPU architecture is asked
  -- for (GPU code, as without a GPU: NVRTC makes it)
  job.cpu = opts.arch == nil and cpu.active()
  if job.cpu then
    job.arch_key, job.options, job.toolkit_id = "cpu", cpu.options(opts), cpu.identity()
  else
    job.arch_key = opts.arch or system.device_cc(6)
    job.options, job.toolkit_id = nvrtc_options(opts)
  end
  job.user_names = {}
  for k in pairs(opts.headers or {}) do job.user_names[#job.user_names + 1] = k end
  table.sort(job.user_names)
  job.way = pipeline(opts, job.options)
  return job
end

-- every input that changes the binary; nil where the compile is not cached (opts.cache =
-- false, or an #include the cache cannot follow)
local function cache_key(job)
  local opts = job.opts
  -- options hold include_dirs as -I: the folders are searched once each
  local deps = opts.cache ~= false and user_deps(job)
  if not deps then return nil end
  local hparts = {}
  for _, k in ipairs(job.user_names) do hparts[#hparts + 1] = #k .. ":" .. k .. #opts.headers[k] .. ":" .. opts.headers[k] end
  return cache.key { job.arch_key, job.name, table.concat(job.options, "\0"), table.concat(hparts),
                     table.concat(opts.name_expressions or {}, "\0"), job.toolkit_id, job.way, deps, job.src }
end

-- the module of key, from the process's memory or the disk cache; a module serves every
-- device it loads on (compile with arch unset: the key holds the device's compute capability)
local function cached(key, name)
  local mod = cache.get_memory(key)
  if mod then return mod end
  local e = cache.get_disk(key)
  if e then
    mod = module_of(e, name)
    cache.put_memory(key, mod)
    return mod
  end
  cache.stats.misses = cache.stats.misses + 1
  return nil
end

-- NVRTC's automatic precompiled headers, where they pay: a source including the toolkit's
-- headers (CCCL, cooperative groups, ...). Its first compile makes a PCH of its
-- run of #includes (~15% slower); a later source of the process starting with the same run
-- skips parsing them (0.16 s instead of 0.7-1 s for <cub/cub.cuh>). The cubin and the log are
-- the same (specs compare them); the cache key does not hold it. opts.pch = false or
-- CUDALUA_PCH=0 turn it off.

-- NVRTC knows the type cudaGraphConditionalHandle but does not declare the device function
-- that sets a graph condition (cuda_device_runtime_api.h does, for nvcc): a source that calls
-- it gets the declaration (cuda.core's tests write it by hand). The driver resolves the call
-- when the module loads: no -rdc, no device runtime library. #line keeps the user's line numbers.
-- (Only the source is searched: a header that calls it declares it itself.)
local SET_CONDITIONAL = 'extern "C" __device__ __cudart_builtin__ void CUDARTAPI '
  .. "cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);\n#line 1\n"
local function declared(job)
  if not job.src:find("cudaGraphSetConditional", 1, true) then return job.src end
  return SET_CONDITIONAL .. job.src
end

-- the PCH NVRTC would make for job's run: its leading preprocessor lines (the #include run a
-- PCH holds), its options and its in-memory headers' names. made[key]: the process has one
local pch_made = {}
-- the directives before the first token of code, comments out and continued lines joined
-- (a licence comment first, a #define over several lines: the review's keys that two runs
-- shared); read once per job
local function pch_lead(job)
  if job.pch_lead then return job.pch_lead end
  local text = modules.strip_comments(declared(job)):gsub("\\\n", " ")
  local lead = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local t = line:match("^%s*(.-)%s*$")
    if t ~= "" and not t:match("^#") then break end
    lead[#lead + 1] = t
  end
  job.pch_lead = table.concat(lead, "\n")
  return job.pch_lead
end

-- (the options can change between a job's runs: -default-device)
local function pch_key(job)
  return pch_lead(job) .. "\0" .. table.concat(job.options, "\0") .. "\0" .. table.concat(job.user_names, "\0")
end

-- Only for sources whose headers are all the toolkit's (or cudalua's): NVRTC took a PCH of a
-- user's header edited a moment before as still good (spec 18's edited header compiled to the
-- old value), so a source including any file of the user's (or an in-memory header) gets none.
-- Each PCH is a file of 100-250 MB in /tmp (tmpfs: memory) until the process ends: at most
-- CUDALUA_PCH_MAX (default 4) are made in a process; past that, only the runs that have one use it.
local pch_count = 0
-- room for one more PCH of key (the cap not reached), or the process has it already
local function pch_room(key)
  return pch_count < (math.tointeger(tonumber(os.getenv("CUDALUA_PCH_MAX") or "")) or 4) or pch_made[key] == true
end

local function pch_wanted(job)
  if job.opts.pch == false or os.getenv("CUDALUA_PCH") == "0" or not source_includes(job).foreign then return false end
  if user_deps(job) ~= "" then return false end
  return pch_room(pch_key(job))
end

-- what the process's compiles cost (cuda.compile_stats)
M.stats = { nvrtc_runs = 0, nvrtc_ms = 0, link_ms = 0, pch_made = 0, pch_used = 0, pch_heap_grown = 0, child_runs = 0 }
local function count_pch(status)
  local st = M.stats
  if status == "used" then st.pch_used = st.pch_used + 1
  elseif status then
    st.pch_made = st.pch_made + 1
    if status ~= "made" then st.pch_heap_grown = st.pch_heap_grown + 1 end
  end
end

-- on a miss: the arch NVRTC compiles for, what it makes, and whether nvJitLink assembles its
-- PTX (sources including headers: CCCL, cooperative groups, libcu++...; others never load
-- nvJitLink)
local function choose_target(job)
  local opts = job.opts
  if job.cpu then
    job.arch, job.output, job.via_ptx, job.nvrtc_output, job.pch = "cpu", "cubin", false, "cubin", false
    return
  end
  local arch = opts.arch or system.device_arch(6)
  if opts.lto and arch:match("^compute_") then
    check.error("cuda.compile", 5, "lto = true needs an sm_ arch; this device's is newer than NVRTC knows")
  end
  local output = opts.lto and "ltoir" or (arch:match("^compute_") and "ptx" or "cubin")
  local via_ptx = output == "cubin" and job.way ~= "nvrtc" and has_includes(job) and jitlink_usable()
  table.insert(job.options, 1, "-arch=" .. (via_ptx and arch:gsub("^sm_", "compute_") or arch))
  job.arch, job.output, job.via_ptx = arch, output, via_ptx
  job.nvrtc_output = via_ptx and "ptx" or output
  job.pch = pch_wanted(job)
end

-- the in-memory headers: the user's win over cudalua's stand-ins of the same name
local function header_list(job)
  local user, headers = job.opts.headers, {}
  if job.cpu then return cpu.headers(job.user_names, user or {}) end
  for _, h in ipairs(includes.shipped()) do
    if not (user and user[h[1]]) then headers[#headers + 1] = h end
  end
  for _, k in ipairs(job.user_names) do headers[#headers + 1] = { k, user[k] } end
  return headers
end

-- one NVRTC run that looks up the kernels of list (see cudalua.probe); the result keeps list
-- (with the name expressions of the variables the source declares, for Module:get_global: a
-- run that fails on some of them, a declaration under #if 0 say, runs again without those, which
-- are then known by their names; the others keep theirs)
local function nvrtc_args(job, list)
  local ex = probe.expressions(list)
  for _, g in pairs(job.globals) do ex[#ex + 1] = g.expr end
  local sig = table.concat(job.options, "\0") .. "\1" .. table.concat(ex, "\0") .. "\1" .. job.nvrtc_output
  return sig, declared(job) .. probe.SOURCE, job.name, job.options, job.headers, ex, job.nvrtc_output, job.pch
end

-- the run of these arguments: the one cuda.compile_all started for them, or one now
local function run_nvrtc(job, list)
  local t0 = core.time()
  local pending = job.pending
  job.pending = nil
  local sig, a, b, c, d, e, f, g = nvrtc_args(job, list)
  local image, log, lowered, ptx, pch, rejected
  if job.cpu then
    image, log, lowered, rejected = cpu.compile(a, b, c, d, e)
  elseif pending and pending.sig == sig then
    image, log, lowered, ptx, pch = core.nvrtc_wait(pending.run)
    M.stats.child_runs = M.stats.child_runs + 1
  else
    image, log, lowered, ptx, pch = core.nvrtc_compile(a, b, c, d, e, f, g)
  end
  local st = M.stats
  st.nvrtc_runs, st.nvrtc_ms = st.nvrtc_runs + 1, st.nvrtc_ms + (core.time() - t0) * 1e3
  count_pch(pch)
  if pch then
    local key = pch_key(job)
    if pch ~= "used" and not pch_made[key] then pch_count = pch_count + 1 end
    pch_made[key] = true
  end
  job.pch_status = pch or job.pch_status
  return image, log, lowered, ptx, rejected
end

local function nvrtc(job, list)
  local image, log, lowered, ptx, rejected = run_nvrtc(job, list)
  if not image then
    local again = false
    for _, g in pairs(job.globals) do
      if g.expr and log:find(g.expr, 1, true) then g.expr, again = nil, true end
    end
    if again then return nvrtc(job, list) end
  end
  return { image = image, log = log, lowered = lowered, ptx = ptx, wanted = list, rejected = rejected }
end

-- NVRTC refuses host functions ("host functions are not allowed in JIT mode"): headers written
-- for nvcc declare them (<cuda.h>, the samples' *_common.h). -default-device makes functions
-- without an execution space device functions, as the message advises; a source with such
-- declarations compiles again with it (explicit __host__ functions still fail: NVRTC's message)
local HOST_IN_JIT = "host functions are not allowed in JIT mode"
local function default_device(job, r, attempt)
  if r.image or not (r.log or ""):find(HOST_IN_JIT, 1, true) or has_option(job.options, { "-default-device" }) then
    return r
  end
  job.options[#job.options + 1] = "-default-device"
  return attempt()
end

-- nvJitLink assembles NVRTC's PTX, with the variables nothing uses out; where it refuses,
-- NVRTC makes the cubin itself (and says what is wrong)
local function assemble(job, r)
  local stripped = core.ptx_strip(r.image)
  local jopts = { "-arch=" .. job.arch }
  if has_option(job.options, { "-lineinfo", "--generate-line-info" }) then jopts[2] = "-lineinfo" end
  local t0 = core.time()
  local cubin, jlog = core.jitlink({ { stripped, job.name } }, jopts, false)
  M.stats.link_ms = M.stats.link_ms + (core.time() - t0) * 1e3
  if cubin then
    r.image, r.log, r.ptx = cubin, r.log .. jlog, stripped
    return r
  end
  job.options[1], job.nvrtc_output = "-arch=" .. job.arch, "cubin"
  return nvrtc(job, r.wanted)
end

-- raises NVRTC's log (level 4: this, compile(), cuda.compile or cuda.kernel, the user). A
-- kernel launching kernels without relocatable = true gets NVRTC's words about "runtime APIs
-- not declared", which do not say what to do: the hint does.
local CDP_HINT = "\n(a kernel that launches kernels, dynamic parallelism, needs relocatable = true: "
  .. "cuda.kernel then links it with the device runtime itself; a module from cuda.compile goes "
  .. "through cuda.link {m})"
local function failed(job, r)
  local msg = (r.log or ""):gsub("%s+$", "")
  if msg:find("device-side kernel launch could not be processed", 1, true) and not job.opts.relocatable then
    msg = msg .. CDP_HINT
  end
  check.error("cuda.compile", 4, "%s failed to compile (%s):\n%s", job.name, r.lowered, msg)
end

-- the module, kept in the cache under key (when there is one)
local function store(job, key, r)
  local listing = job.output == "ptx" and r.image or r.ptx
  local e = { image = r.image, kind = job.output, log = r.log, info = probe.kernel_info(r, listing),
              ptx = r.ptx, arch = job.arch, relocatable = job.opts.relocatable or job.opts.lto or false }
  globals.to_info(job.globals, r.lowered or {}, e.info)
  local mod = module_of(e, job.name)
  modules.fields(mod).pch = job.pch_status   -- (this compile's: m:log() says it; not cached)
  if key then
    cache.put_memory(key, mod)
    cache.put_disk(key, e)
  end
  return mod
end

-- the job of a compile, and its module when the cache has it; on a miss everything the NVRTC
-- runs take is ready. (Called by compile(): its steps' error levels count one more)
local function prepare(src, opts)
  if type(src) ~= "string" then check.error("cuda.compile", 4, "source must be a string, got %s", type(src)) end
  local job = plan(src, check_opts(opts))
  job.key = cache_key(job)
  job.mod = job.key and cached(job.key, job.name)
  if job.mod then return job end
  choose_target(job)
  job.headers = header_list(job)
  job.globals = globals.parse(modules.strip_comments(src))
  job.found = probe.find_kernels(src)
  return job
end

-- the rest of a compile on a miss: the runs (the first one perhaps started already), the module
local function finish(job, quiet)
  local key = job.key
  local function attempt()
    return probe.compile(function(list) return nvrtc(job, list) end, job.found, job.opts.name_expressions)
  end
  local r = default_device(job, attempt(), attempt)
  if r.image and job.via_ptx then r = assemble(job, r) end
  if not r.image then
    if quiet then return nil end
    failed(job, r)
  end
  return store(job, key, r)
end

-- quiet: a failed compile returns nil instead of raising (cuda.kernel's second try)
local function compile(src, opts, quiet)
  local job = prepare(src, opts)
  if job.mod then return job.mod end
  return finish(job, quiet)   -- (a tail call: the levels of its errors are compile's)
end

function M.compile(src, opts)
  local mod = compile(src, opts)
  return mod
end

-- cuda.compile_all: every source's first NVRTC run (usually its only one) in a child process
-- of its own at once (NVRTC runs one compile at a time in a process: src/compile.c), then each
-- finished in order here. items: sources, or {source, opts}
local function item_of(list, i, opts)
  local it = list[i]
  if type(it) == "table" then
    if type(it[1]) ~= "string" or (it[2] ~= nil and type(it[2]) ~= "table") then
      check.error("cuda.compile_all", 3, "item %d: a source or {source, opts} expected", i)
    end
    local o = {}
    for k, v in pairs(opts or {}) do o[k] = v end
    for k, v in pairs(it[2] or {}) do o[k] = v end   -- the item's own win
    return it[1], o
  end
  if type(it) ~= "string" then
    check.error("cuda.compile_all", 3, "item %d: a source or {source, opts} expected, got %s", i, type(it))
  end
  return it, opts
end

-- a source's error as cuda.compile raised it, less the place and the function's name
local function why(e) return (tostring(e):gsub("^[^\n]-cudalua: ", ""):gsub("^cuda%.compile: ", "")) end

function M.compile_all(list, opts)
  if type(list) ~= "table" then
    check.error("cuda.compile_all", 2, "argument 1: a list of sources expected, got %s", type(list))
  end
  if opts ~= nil and type(opts) ~= "table" then
    check.error("cuda.compile_all", 2, "argument 2: options table expected, got %s", type(opts))
  end
  local jobs, mods, errs = {}, {}, nil
  for i = 1, #list do
    local src, o = item_of(list, i, opts)
    local ok, job = pcall(prepare, src, o)
    jobs[i] = ok and job or why(job)
  end
  -- precompiled headers: children only use the process's (several making one at once would
  -- race on its file, as cudf's NVRTC users saw). An #include run the process has none of is
  -- compiled here first when two sources or more share it and the cap leaves room (once: if
  -- that made none, the others go to children without one); a source alone with its run goes
  -- to a child without one
  local share = {}
  for _, job in ipairs(jobs) do
    if type(job) == "table" and not job.mod and job.pch then
      job.pch_key = pch_key(job)
      share[job.pch_key] = (share[job.pch_key] or 0) + 1
    end
  end
  local queue, tried = {}, {}
  for i, job in ipairs(jobs) do
    if type(job) == "table" and not job.mod then
      local key = job.pch_key
      if key and not pch_made[key] and share[key] > 1 and not tried[key] and pch_room(key) then
        tried[key] = true
        local ok, m = pcall(finish, job)
        jobs[i] = ok and { mod = m } or why(m)
      else
        if key and not pch_made[key] then job.pch = false end
        queue[#queue + 1], job.queued = job, true
      end
    end
  end
  -- at most as many children at once as there are CPUs (each takes hundreds of MB), the next
  -- started as each result is taken
  local started, cap = 0, math.max(1, core.nprocs())
  local function start_next()
    started = started + 1
    local job = queue[started]
    if not job then return end
    if job.cpu then return end   -- (the CPU device's compiles run in turn, in finish)
    local sig, a, b, c, d, e, f, g = nvrtc_args(job, probe.first_list(job.found, job.opts.name_expressions))
    local ok, run = pcall(core.nvrtc_start, a, b, c, d, e, f, g)
    if ok then job.pending = { sig = sig, run = run } else job.start_error = why(run) end
  end
  for _ = 1, math.min(cap, #queue) do start_next() end
  -- (results taken in order: the k-th queued job was started when the (k - cap)-th was taken)
  for i, job in ipairs(jobs) do
    local ok, m = true, job
    if type(job) == "table" then
      if job.start_error then ok, m = false, job.start_error
      else ok, m = pcall(function() return job.mod or finish(job) end) end
      if job.queued then start_next() end
    end
    if type(job) == "string" or not ok then
      errs = errs or {}
      errs[i], mods[i] = type(job) == "string" and job or why(m), false
    else
      mods[i] = m
    end
  end
  return mods, errs
end

function M.compile_stats()
  local t = {}
  for k, v in pairs(M.stats) do t[k] = v end
  for k, v in pairs(cache.stats) do t["cache_" .. k] = v end
  return t
end

-- opts with name among its name expressions (opts itself when it is there already)
local function naming(opts, name)
  local o, ex = {}, {}
  for k, v in pairs(opts or {}) do o[k] = v end
  for i, v in ipairs(o.name_expressions or {}) do
    if v == name then return opts end
    ex[i] = v
  end
  ex[#ex + 1] = name
  o.name_expressions = ex
  return o
end

-- cuda.kernel with relocatable = true or lto = true: the module linked on its own (and with
-- the device runtime when it launches kernels), as nvcc -rdc=true links a program of one
-- file; once per module (the compile cache gives the same module for the same source)
local linked_of = setmetatable({}, { __mode = "k" })
local function linked_alone(mod)
  local st = modules.fields(mod)
  if not st.relocatable or st.linked then return mod end
  local l = linked_of[mod]
  if not l then
    l = require("cudalua.link").link_as({ mod }, { name = st.name }, "cuda.kernel", 4)
    linked_of[mod] = l
  end
  return l
end

-- A name the source scan cannot see (a kernel in a namespace, a template instance) is compiled
-- as a name expression, which gives its C++ types: a C++ name ("ns::k", "scale<float>") that
-- way first, any other when the module lacks it. A name NVRTC cannot resolve gets the plain
-- module's message, which lists its kernels.
function M.kernel(src, name, opts)
  if type(name) ~= "string" then check.error("cuda.kernel", 2, "expected the kernel's name as argument 2") end
  local cpp = name:find("[:<]") ~= nil and (opts == nil or type(opts) == "table")
  local mod = cpp and compile(src, naming(opts, name), true) or compile(src, opts)
  if not cpp and not modules.fields(mod).info[name] then
    mod = compile(src, naming(opts, name), true) or mod
  end
  mod = linked_alone(mod)
  local k = modules.get(mod, name, nil, 2)
  return k
end

return M
