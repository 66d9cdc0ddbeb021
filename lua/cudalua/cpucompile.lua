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

function M.identity()
  local c, id = find_compiler()
  return c .. "\0" .. id .. "\0symbolic"   -- (libraries built before -Bsymbolic are not reused)
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
  { "cuda::memcpy_async", "cuda::memcpy_async" }, { "<cooperative_groups", "cooperative groups (not yet on the CPU device)" },
  { "<cub/", "CUB (not yet on the CPU device)" }, { "<thrust/", "Thrust" },
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
-- lowered names come from, and whether the source synchronises
local function footer(exprs, sync)
  local is_probe, kernels, addrs = {}, {}, {}
  for _, e in ipairs(exprs) do
    local k = e:match("^__cudalua_sig<decltype%((.*)%)>$")
    if k then is_probe[k] = true end
  end
  for _, e in ipairs(exprs) do
    if is_probe[e] then kernels[#kernels + 1] = ("  __cl_entry(&%s),"):format(e) end
    addrs[#addrs + 1] = e:sub(1, 1) == "&" and ("  (void *)(%s),"):format(e) or ("  (void *)(&%s),"):format(e)
  end
  return table.concat({ "", '#line 1 "cudalua-cpu-tables"', 'extern "C" {',
    ('__attribute__((visibility("default"))) extern const int __cudalua_cpu_may_sync = %d;'):format(sync and 1 or 0),
    '__attribute__((visibility("default"))) extern const cl_cpu_entry __cudalua_cpu_entries[] = {',
    table.concat(kernels, "\n"), "  {nullptr, nullptr, 0, nullptr, nullptr}};",
    '__attribute__((visibility("default"))) extern void *const __cudalua_cpu_expr[] = {',
    table.concat(addrs, "\n"), "  nullptr};", "}", "" }, "\n")
end

-- the headers the compiler gets: cudalua's own (its CPU ones among them) and the user's
function M.headers(user_names, user)
  local list = {}
  for _, h in ipairs(core.headers) do
    if not h[1]:match("^cudalua/nvrtc/") then list[#list + 1] = { h[1], dynamic_shared(h[2]) } end
  end
  for _, k in ipairs(user_names) do list[#list + 1] = { k, dynamic_shared(user[k]) } end
  return list
end

-- compile(src, name, flags, headers, exprs) -> image, log, lowered | nil, log, why
function M.compile(src, name, flags, headers, exprs)
  refuse_gpu_only(src, name)
  local sync = may_sync(src)
  for _, h in ipairs(headers) do sync = sync or (h[1]:match("^cudalua/cpu/") == nil and may_sync(h[2])) end
  local text = ('#line 1 "%s"\n'):format(name) .. dynamic_shared(src) .. footer(exprs, sync)
  local cxx = find_compiler()
  -- -Bsymbolic: a kernel library's references to its own kernels and globals are its own, not
  -- the process's symbols of the same name (a kernel `step` was libc's step)
  local args = { cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fno-ipa-icf", "-fno-gnu-unique", "-pthread",
                 "-Wl,-Bsymbolic", "-include", "cudalua/cpu/cuda_cpu.h", "-x", "c++" }
  if cxx:match("clang") then args[6], args[7] = "-fno-common", "-fno-common" end   -- (gcc's flags)
  for _, f in ipairs(flags) do args[#args + 1] = f end
  return core.cxx_compile(text, name, args, headers, exprs)
end

return M
