-- cudalua.cpucompile: compiles for the CPU device (CUDALUA_DEVICE=cpu). The host C++ compiler
-- (CXX, else c++, g++ or clang++ on the PATH) builds a kernel library from the CUDA C++
-- source with kernels/cudalua/cpu/cuda_cpu.h read first; this file chooses the compiler and
-- its flags, refuses what the CPU cannot run, rewrites dynamic shared memory, and adds the
-- tables the CPU device calls the kernels through (see kernels/cudalua/cpu/abi.h). The C side
-- (src/cxx.c) runs the compiler. The result takes the place of NVRTC's: the library's bytes
-- as the image, the log, and the lowered names of the name expressions.
local core = ...
local check = require "cudalua.check"
local M = {}

function M.active() return core.is_cpu_device() end

-- the compiler: CXX, else the first of c++, g++, clang++ the PATH has; and what it says it is
-- (its --version line: the compile cache's key holds it)
local compiler, identity
local function find_compiler()
  if compiler then return compiler, identity end
  local candidates = os.getenv("CXX") and { os.getenv("CXX") } or { "c++", "g++", "clang++" }
  for _, c in ipairs(candidates) do
    local p = io.popen(("%s --version 2>/dev/null"):format(c))
    local line = p and p:read("l")
    if p then p:close() end
    if line and line ~= "" then compiler, identity = c, line; return c, line end
  end
  check.error("cuda.compile", 0, "the CPU device compiles kernels with a C++ compiler, and none was found "
    .. "(set CXX, or install g++ or clang++)")
end

-- a GPU contracts a * b + c into one fused multiply-add (NVRTC's default, --fmad=true): the
-- CPU does too where it has the instruction, so that results round as a GPU's do. Whether it
-- has it is in the cache key (a cache folder shared with an older CPU)
local fma
local function host_fma()
  if fma == nil then
    local f = io.open("/proc/cpuinfo")
    local text = f and f:read("a") or ""
    if f then f:close() end
    fma = text:find("%f[%w_]fma%f[^%w_]") ~= nil
  end
  return fma
end

-- (FORMAT: the kernel library's tables as this file writes them, in the cache key so that a
-- library cached by another cudalua is compiled again: raise it when the footer changes)
local FORMAT = 2
function M.identity()
  local c, id = find_compiler()
  return c .. "\0" .. id .. (host_fma() and "\0fma" or "") .. "\0format" .. FORMAT
end

-- the flags NVRTC's options become: definitions, folders and the language standard carry
-- over, -G debugs; the rest (architectures, ptxas's, fast math) is a GPU's
function M.options(opts)
  local out = {}
  for _, d in ipairs(opts.include_dirs or {}) do out[#out + 1] = "-I" .. d end
  local given = opts.options or {}
  for _, o in ipairs(given) do
    if o:match("^%-[DUI].") or o:match("^%-%-?std=c%+%+%d%d$") then out[#out + 1] = o:gsub("^%-%-std", "-std") end
    if o == "-G" or o == "--device-debug" then out[#out + 1] = "-g" end
    if o:match("^%-%-?fmad=false$") then out[#out + 1] = "-ffp-contract=off" end
  end
  if opts.debug then out[#out + 1] = "-g" end
  return out
end

-- GPU-only constructs, each with the words naming it
local GPU_ONLY = {
  { "%f[%w_]asm%s*%(", "inline PTX (asm)" }, { "%f[%w_]asm%s+volatile", "inline PTX (asm)" },
  { "%f[%w_]wmma::", "tensor cores (wmma)" }, { "<mma%.h>", "tensor cores (mma.h)" },
  { "__cluster_dims__", "thread block clusters (__cluster_dims__)" },
  { "%f[%w_]cluster_group", "thread block clusters (cluster_group)" },
  { "%f[%w_]tex[123]D%w*%s*[<(]", "textures" }, { "%f[%w_]surf[123]D%w*%s*[<(]", "surfaces" },
  { "%f[%w_]cp%.async", "asynchronous copies (cp.async)" }, { "cuda::barrier", "cuda::barrier" },
  { "cuda::memcpy_async", "cuda::memcpy_async" }, { "<cooperative_groups", "cooperative groups" },
  { "<cub/", "CUB" }, { "<thrust/", "Thrust" }, { "<<<", "dynamic parallelism (a launch from device code)" },
}

local function line_of(src, at)
  local n = 1
  for _ in src:sub(1, at):gmatch("\n") do n = n + 1 end
  return n
end

local function refuse_gpu_only(src, name)
  for _, g in ipairs(GPU_ONLY) do
    local at = src:find(g[1])
    if at then
      check.error("cuda.compile", 0, "%s:%d uses %s, which cudalua's CPU device cannot run (it runs on a GPU only)",
        name, line_of(src, at), g[2])
    end
  end
end

-- `extern __shared__ T name[];` (the block's dynamic shared memory) as a name for the block's
-- buffer: a macro, so that it works at file scope and in a function alike; and an alignment
-- after __shared__ put before it (C++ wants attributes ahead of `static thread_local`)
local function dynamic_shared(src)
  src = src:gsub("__shared__%s+(alignas%s*%b())", "%1 __shared__"):gsub("__shared__%s+(__align__%s*%b())", "%1 __shared__")
  return (src:gsub("extern%s+__shared__%s+([^;%[]-)%s*([%a_][%w_]*)%s*%[%s*%]%s*;", function(decl, name)
    local t = decl:gsub("__align__%s*%b()", ""):gsub("alignas%s*%b()", ""):gsub("^%s+", ""):gsub("%s+$", "")
    return ("\n#define %s ((%s *)__cl_cur->dyn_shared)\n"):format(name, t)
  end))
end

-- a source with a barrier or a warp operation runs its threads as fibers
local SYNCS = { "__syncthreads", "__syncwarp", "_sync%s*%(", "%.sync%s*%(", "__activemask" }
local function may_sync(text)
  for _, p in ipairs(SYNCS) do if text:find(p) then return true end end
  return false
end

-- the table of kernels (each name expression that has a probe is a kernel), the addresses the
-- lowered names come from, and whether the source synchronises; each expression's lines are
-- its own (owner: line -> the kernel expression it serves), so that a compile failing on one
-- names it (see rejected)
local FOOTER_NAME = "cudalua-cpu-tables"

-- __launch_bounds__(N, ...) ahead of a kernel's name, by the name: the most threads a block of
-- it takes, which launches and k:occupancy answer to as on a GPU (cuda_cpu.h drops the
-- attribute itself). A bound that is no plain number (a template's parameter) is left out.
local function launch_bounds(src)
  local b = {}
  for arg, name in src:gmatch("__launch_bounds__%s*(%b())%s*([%a_][%w_]*)%s*[%(<]") do
    b[name] = tonumber(arg:match("^%(%s*(%d+)%s*[,%)]"))
  end
  return b
end

local function footer(exprs, sync, bounds)
  local is_probe = {}
  for _, e in ipairs(exprs) do
    local k = e:match("^__cudalua_sig<decltype%((.*)%)>$")
    if k then is_probe[k] = true end
  end
  local lines, owner = { "", ('#line 1 "%s"'):format(FOOTER_NAME), 'extern "C" {',
    ('__attribute__((visibility("default"))) extern const int __cudalua_cpu_may_sync = %d;'):format(sync and 1 or 0),
    '__attribute__((visibility("default"))) extern const cl_cpu_entry __cudalua_cpu_entries[] = {' }, {}
  -- (lines[3] is the footer's line 1: #line says so)
  local function add(text, e) lines[#lines + 1] = text; owner[#lines - 2] = e end
  for _, e in ipairs(exprs) do
    if is_probe[e] then add(("  __cl_entry(&%s),"):format(e), e) end
  end
  add("  {nullptr, nullptr, 0, nullptr, nullptr}};")
  -- each kernel's bound, in the table's order (0: none); a kernel by its name without its
  -- namespace or template arguments
  add('__attribute__((visibility("default"))) extern const int __cudalua_cpu_max_threads[] = {')
  for _, e in ipairs(exprs) do
    if is_probe[e] then
      local base = e:gsub("%b<>", ""):match("([%a_][%w_]*)%s*$")
      add(("  %d,"):format(base and bounds[base] or 0), e)
    end
  end
  add("  0};")
  add('__attribute__((visibility("default"))) extern void *const __cudalua_cpu_expr[] = {')
  for _, e in ipairs(exprs) do
    add(e:sub(1, 1) == "&" and ("  (void *)(%s),"):format(e) or ("  (void *)(&%s),"):format(e),
      e:match("^__cudalua_sig<decltype%((.*)%)>$") or e)
  end
  add("  nullptr};")
  add("}")
  return table.concat(lines, "\n") .. "\n", owner
end

-- the expressions whose footer lines the compiler's log names (an error there, or an
-- instantiation it required): the set cudalua.probe leaves out of the next try
local function rejected(log, owner)
  local set
  for line in log:gmatch(FOOTER_NAME:gsub("%-", "%%-") .. ":(%d+):") do
    local e = owner[tonumber(line)]
    if e then set = set or {}; set[e] = true end
  end
  return set
end

-- the CUDA headers kernels include, by their CUDA names: the CPU device's versions
-- (kernels/cudalua/cpu/), headers whose declarations cuda_cpu.h makes (empty here), and
-- libcu++'s <cuda/std/X> as the host's <X>
local CUDA_HEADERS = { "cuda_fp16.h", "cuda_bf16.h", "cuComplex.h", "math_constants.h" }
local AS_CUDA_CPU = { "cuda_runtime.h", "cuda_runtime_api.h", "cuda.h", "vector_types.h", "vector_functions.h",
  "device_launch_parameters.h", "device_functions.h", "cuda_device_runtime_api.h", "sm_20_atomic_functions.h",
  "sm_60_atomic_functions.h", "crt/math_functions.h", "math_functions.h", "builtin_types.h", "host_defines.h" }
local CUDA_STD = { "complex", "cstdint", "cstddef", "climits", "cfloat", "cmath", "cstdlib", "cstring", "cassert",
  "limits", "type_traits", "utility", "array", "tuple", "functional", "algorithm", "bit", "numeric", "optional",
  "variant", "atomic", "chrono", "ratio", "iterator", "initializer_list", "version", "numbers" }
local function cuda_headers(list)
  for _, n in ipairs(CUDA_HEADERS) do list[#list + 1] = { n, ('#include "cudalua/cpu/%s"\n'):format(n) } end
  for _, n in ipairs(AS_CUDA_CPU) do list[#list + 1] = { n, "/* cudalua's CPU device: cudalua/cpu/cuda_cpu.h declares it */\n" } end
  for _, n in ipairs(CUDA_STD) do
    list[#list + 1] = { "cuda/std/" .. n, ("#include <%s>\n#include \"cudalua/cpu/cuda_std.h\"\n"):format(n) }
  end
end

-- the headers the compiler gets: cudalua's own (its CPU ones among them), the CUDA ones and
-- the user's (written last: a user's header of a CUDA name wins)
function M.headers(user_names, user)
  local list = {}
  for _, h in ipairs(core.headers) do
    if not h[1]:match("^cudalua/nvrtc/") then list[#list + 1] = { h[1], dynamic_shared(h[2]) } end
  end
  cuda_headers(list)
  for _, k in ipairs(user_names) do list[#list + 1] = { k, dynamic_shared(user[k]) } end
  return list
end

-- compile(src, name, flags, headers, exprs) -> image, log, lowered | nil, log, why, rejected (a set
-- of the expressions the log blames, or nil)
function M.compile(src, name, flags, headers, exprs)
  refuse_gpu_only(src, name)
  local sync = may_sync(src)
  for _, h in ipairs(headers) do sync = sync or (h[1]:match("^cudalua/cpu/") == nil and may_sync(h[2])) end
  local tables, owner = footer(exprs, sync, launch_bounds(src))
  local text = ('#line 1 "%s"\n'):format(name) .. dynamic_shared(src) .. tables
  local cxx = find_compiler()
  -- -Bsymbolic: the library's own names are its own (a kernel named raw took ncurses' raw(),
  -- loaded by the interpreter before it: the table held that function's address)
  local args = { cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fno-ipa-icf", "-fno-gnu-unique", "-pthread",
                 "-include", "cudalua/cpu/cuda_cpu.h", "-Wl,-Bsymbolic", "-x", "c++" }
  if cxx:match("clang") then args[6], args[7] = "-fno-common", "-fno-common" end   -- (gcc's flags)
  if host_fma() then args[#args + 1], args[#args + 2] = "-mfma", "-ffp-contract=fast" end
  for _, f in ipairs(flags) do args[#args + 1] = f end
  local image, log, lowered = core.cxx_compile(text, name, args, headers, exprs)
  if image then return image, log, lowered end
  return nil, log, lowered, rejected(log, owner)
end

return M
