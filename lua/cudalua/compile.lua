-- cudalua.compile: runtime compilation with NVRTC, and the modules and kernels it gives.
-- Parameter types are read from the compiler, not from signature strings: every kernel found
-- in the source (and every name expression) gets a probe instantiation
-- __cudalua_sig<decltype(kernel)>, whose mangled name spells the kernel's parameter types.
local core = ...
local cache = require "cudalua.cache"
local modules = require "cudalua.module"
local includes = require "cudalua.headers"
local check = require "cudalua.check"
local system = require "cudalua.system"
local signature = require "cudalua.signature"
local M = {}

-- the type kernel code computes with for a dtype, and the header that declares it: complex
-- numbers as cuda::std::complex (cuComplex's layout, with the arithmetic), the others as their
-- C type
local VALUE = { complex64 = "cuda::std::complex<float>", complex128 = "cuda::std::complex<double>" }
local HEADER = { float16 = "#include <cuda_fp16.h>", bfloat16 = "#include <cuda_bf16.h>",
  complex64 = "#include <cuda/std/complex>", complex128 = "#include <cuda/std/complex>" }
function M.value_type(dtype) return VALUE[dtype.name] or dtype.ctype, HEADER[dtype.name] end

local PROBE = modules.PROBE
local PROBE_SRC = '\n#line 1 "cudalua-probe"\ntemplate<typename T> __global__ void ' .. PROBE .. '() {}\n'

---------------------------------------------------------------------------------------------
-- finding the kernels in a source: names of non-template __global__ functions
local skip_attr = { __launch_bounds__ = true, __maxnreg__ = true, __cluster_dims__ = true,
  __noinline__ = true, __forceinline__ = true, static = true, inline = true, void = true,
  __attribute__ = true, __declspec = true }

local function find_kernels(src)
  local names, seen = {}, {}
  local code = modules.strip_comments(src)
  local from = 1
  while true do
    local s, e = code:find("__global__", from, true)
    if not s then break end
    from = e + 1
    -- a template kernel (template<...> before __global__ in the same declaration) is reached
    -- through name expressions instead
    local before = code:sub(1, s - 1)
    local decl_start = math.max((before:match(".*()[;}{]") or 0), 0)
    local is_template = before:sub(decl_start):find("template%s*<") ~= nil
    local pos = e + 1
    while not is_template do
      local ident, after = code:match("^%s*([%a_][%w_]*)%s*()", pos)
      if not ident then break end
      if code:sub(after, after) == "(" then
        if skip_attr[ident] then -- skip its parenthesised arguments
          local depth, i = 0, after
          repeat
            local ch = code:sub(i, i)
            if ch == "(" then depth = depth + 1 elseif ch == ")" then depth = depth - 1 end
            i = i + 1
          until depth == 0 or i > #code
          pos = i
        else
          if not seen[ident] then names[#names + 1] = ident; seen[ident] = true end
          break
        end
      else
        pos = after
      end
    end
  end
  return names
end
M.find_kernels = find_kernels

-- bench/cuda_cpp.lua asks it which arch a compile without opts.arch gets
M.device_arch = system.device_arch

local COMPILE_OPTS = { options = "table", name = "string", headers = "table", arch = "string",
  name_expressions = "table", cache = "boolean", include_dirs = "table", relocatable = "boolean",
  lto = "boolean", debug = "boolean", lineinfo = "boolean" }


-- error levels count from the user's call of cuda.compile or cuda.kernel, both of which call
-- compile() below, which calls this
local function check_opts(opts)
  local level = 5
  opts = check.table(opts, COMPILE_OPTS, "cuda.compile", level)
  check.strings(opts.options or {}, "opts.options", "cuda.compile", level)
  for k, v in pairs(opts.headers or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error("cuda.compile: opts.headers maps header names to their source text (strings)", level - 1)
    end
  end
  check.strings(opts.name_expressions or {}, "opts.name_expressions", "cuda.compile", level)
  check.strings(opts.include_dirs or {}, "opts.include_dirs", "cuda.compile", level)
  for i, d in ipairs(opts.include_dirs or {}) do
    local is_dir = select(3, core.file_info(d))
    if not is_dir then error(("cuda.compile: opts.include_dirs[%d] is not a directory: %s"):format(i, d), level - 1) end
  end
  check.arch(opts.arch, "cuda.compile", level)
  if opts.lto and opts.arch and opts.arch:match("^compute_") then
    error("cuda.compile: lto = true needs an sm_ arch (LTO-IR is linked for a real architecture)", level - 1)
  end
  return opts
end

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
-- a module from a compile's entry (as the disk cache keeps it)
local function module_of(e, name)
  return modules.new { image = e.image, kind = e.kind, log = e.log, info = e.info, ptx = e.ptx,
                       name = name, arch = e.arch, relocatable = e.relocatable, source = true }
end

local function pipeline(opts, options)
  if opts.debug or opts.relocatable or opts.lto or has_option(options, PTXAS_OPTIONS) then return "nvrtc" end
  local jitlink_id = system.jitlink_identity()
  return jitlink_id:match(":none$") and "nvrtc" or PIPELINE .. " " .. jitlink_id
end

-- does the source take headers beyond cudalua's own (where unused module variables come from)?
local function has_includes(src, opts, options)
  if next(opts.headers or {}) or has_option(options, { "-include", "--pre-include" }) then return true end
  for name in src:gmatch("#%s*include%s*[<\"]([^>\"]+)") do
    if name:sub(1, 8) ~= "cudalua/" then return true end
  end
  return false
end

-- nvJitLink assembles NVRTC's PTX only when it is at least as new
local function jitlink_usable()
  local ja, ji = system.jitlink_version()
  local na, ni = system.nvrtc_version()
  return ja and na and ja > 0 and (ja > na or (ja == na and ji >= ni))
end

-- quiet: a failed compile returns nil instead of raising (cuda.kernel's second try)
local function compile(src, opts, quiet)
  if type(src) ~= "string" then error("cuda.compile: source must be a string, got " .. type(src), 3) end
  opts = check_opts(opts)
  -- the cache is consulted before anything loads NVRTC (~5 ms): without an explicit arch the
  -- key holds the device's compute capability, and the arch NVRTC gets is chosen on a miss
  local arch = opts.arch
  local arch_key = arch or system.device_cc(4)
  local name = opts.name or "cudalua_kernel.cu"
  local output = opts.lto and "ltoir" or nil
  -- the user's folders first, as with nvcc: they may hold a newer CCCL
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
  local user_names = {}
  for k in pairs(opts.headers or {}) do user_names[#user_names + 1] = k end
  table.sort(user_names)
  local way = pipeline(opts, options)

  local key
  -- options hold include_dirs as -I: the folders are searched once each
  local deps = opts.cache ~= false and includes.user_files(src, name, options, opts.headers or {})
  if deps then
    local hparts = {}
    for _, k in ipairs(user_names) do hparts[#hparts + 1] = #k .. ":" .. k .. #opts.headers[k] .. ":" .. opts.headers[k] end
    key = cache.key { arch_key, name, table.concat(options, "\0"), table.concat(hparts),
                      table.concat(opts.name_expressions or {}, "\0"), tk.id, way, deps, src }
    -- a module serves every device it loads on (compile with arch unset: the key holds the
    -- device's compute capability)
    local mod = cache.get_memory(key)
    if mod then return mod end
    local e = cache.get_disk(key)
    if e then
      mod = module_of(e, name)
      cache.put_memory(key, mod)
      return mod
    end
    cache.stats.misses = cache.stats.misses + 1
  end
  arch = arch or system.device_arch(4)
  if opts.lto and arch:match("^compute_") then
    error("cuda.compile: lto = true needs an sm_ arch; this device's is newer than NVRTC knows", 3)
  end
  if not output then output = arch:match("^compute_") and "ptx" or "cubin" end
  -- sources including headers (CCCL, cooperative groups, libcu++...) get the PTX path below;
  -- others never load nvJitLink
  local via_ptx = output == "cubin" and way ~= "nvrtc" and has_includes(src, opts, options) and jitlink_usable()
  table.insert(options, 1, "-arch=" .. (via_ptx and arch:gsub("^sm_", "compute_") or arch))
  local nvrtc_output = via_ptx and "ptx" or output
  -- the headers: the user's win over cudalua's stand-ins of the same name
  local headers = {}
  for _, h in ipairs(includes.shipped()) do
    if not (opts.headers and opts.headers[h[1]]) then headers[#headers + 1] = h end
  end
  for _, k in ipairs(user_names) do headers[#headers + 1] = { k, opts.headers[k] } end

  local found = find_kernels(src)
  -- the kernels to look up: the given scanned ones, then the user's name expressions
  local function with_user(kernels)
    local w = {}
    for _, k in ipairs(kernels) do w[#w + 1] = k end
    for _, e in ipairs(opts.name_expressions or {}) do w[#w + 1] = e end
    return w
  end
  local wanted = with_user(found)
  local function exprs_for(list)
    local ex = {}
    for _, e in ipairs(list) do ex[#ex + 1] = e; ex[#ex + 1] = PROBE .. "<decltype(" .. e .. ")>" end
    return ex
  end
  local function run(list)
    return core.nvrtc_compile(src .. PROBE_SRC, name, options, headers, exprs_for(list), nvrtc_output)
  end
  local image, log, lowered, ptx = run(wanted)
  if not image and #found > 0 and log:find(PROBE, 1, true) then
    -- leave out the scanned kernels the log names (overloaded, in a namespace, ...)
    local keep, dropped = {}, false
    for _, k in ipairs(found) do
      local pat = "decltype ( " .. k .. " )"
      if log:find(pat, 1, true) or log:find('was: " ' .. k .. ' "', 1, true) then dropped = true
      else keep[#keep + 1] = k end
    end
    if dropped then
      local w = with_user(keep)
      local i2, l2, x2, p2 = run(w)
      if i2 then image, log, lowered, ptx, wanted, found = i2, l2, x2, p2, w, keep end
    end
  end
  if not image and #found > 0 and log:find(PROBE, 1, true) then
    -- a kernel found by scanning could not be probed (overloaded, in a namespace): compile
    -- again with only the user's name expressions
    wanted = with_user({})
    image, log, lowered, ptx = run(wanted)
  end
  local function failed()
    local msg = (log or ""):gsub("%s+$", "")
    error(("cuda.compile: %s failed to compile (%s):\n%s"):format(name, lowered, msg), 4)
  end
  if not image then
    if quiet then return nil end
    failed()
  end
  if via_ptx then
    local stripped = core.ptx_strip(image)
    local jopts = { "-arch=" .. arch }
    if has_option(options, { "-lineinfo", "--generate-line-info" }) then jopts[2] = "-lineinfo" end
    local cubin, jlog = core.jitlink({ { stripped, name } }, jopts, false)
    if cubin then
      image, log, ptx = cubin, log .. jlog, stripped
    else
      -- nvJitLink refused what NVRTC made: NVRTC makes the cubin itself (and says what is wrong)
      options[1], nvrtc_output = "-arch=" .. arch, "cubin"
      image, log, lowered, ptx = run(wanted)
      if not image then
        if quiet then return nil end
        failed()
      end
    end
  end
  local info = {}
  for _, e in ipairs(wanted) do
    local sym, sig = lowered[e], lowered[PROBE .. "<decltype(" .. e .. ")>"]
    if sym and sig then
      local ok, params = pcall(signature.demangle_params, sig)
      local entry = { symbol = sym }
      if ok then
        local ok2, codes, types = pcall(signature.param_codes, params)
        if ok2 then entry.codes, entry.types = codes, types else entry.error = codes end
      else
        entry.error = params
      end
      info[e] = entry
    end
  end
  -- kernels no scan or name expression names (made by a macro, in a namespace, overloaded):
  -- the PTX lists them by symbol, with the types of its .param lines
  local listing = output == "ptx" and image or ptx
  if listing then
    local named = {}
    for _, en in pairs(info) do named[en.symbol] = true end
    for sym, en in pairs(modules.ptx_entries(listing)) do
      if not named[sym] and not info[sym] then info[sym] = en end
    end
  end
  local e = { image = image, kind = output, log = log, info = info, ptx = ptx, arch = arch,
              relocatable = opts.relocatable or opts.lto or false }
  local mod = module_of(e, name)
  if key then
    cache.put_memory(key, mod)
    cache.put_disk(key, e)
  end
  return mod
end

function M.compile(src, opts)
  local mod = compile(src, opts)
  return mod
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

-- A name the source scan cannot see (a kernel in a namespace, a template instance) is compiled
-- as a name expression, which gives its C++ types: a C++ name ("ns::k", "scale<float>") that
-- way first, any other when the module lacks it. A name NVRTC cannot resolve gets the plain
-- module's message, which lists its kernels.
function M.kernel(src, name, opts)
  if type(name) ~= "string" then error("cuda.kernel: expected the kernel's name as argument 2", 2) end
  local cpp = name:find("[:<]") ~= nil and (opts == nil or type(opts) == "table")
  local mod = cpp and compile(src, naming(opts, name), true) or compile(src, opts)
  if not cpp and not modules.fields(mod).info[name] then
    mod = compile(src, naming(opts, name), true) or mod
  end
  local k = modules.get(mod, name, nil, 2)
  return k
end

return M
