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
  core.drop_sanitizer_preload()
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

-- the compiler's identity, whether it fuses (above), a digest of the CPU headers (a library
-- built against another cuda_cpu.h, another ABI, is not taken from the cache) and FORMAT: the
-- tables this file writes (raise it when the footer changes)
local FORMAT = 3
local cpu_digest
function M.identity()
  local c, id = find_compiler()
  if not cpu_digest then
    local h = 0
    for _, hd in ipairs(core.headers) do
      if hd[1]:match("^cudalua/cpu/") then
        for i = 1, #hd[2] do h = (h * 31 + hd[2]:byte(i)) & 0xffffffff end
      end
    end
    cpu_digest = ("%08x"):format(h)
  end
  return c .. "\0" .. id .. (host_fma() and "\0fma" or "") .. "\0" .. cpu_digest .. "\0format" .. FORMAT
end

-- Debugging kernels on the CPU device (a recipe for the README):
--   gdb: CUDALUA_CPU_DEBUG=1 builds kernels with -g -O0; a kernel is a plain function of the
--   library the process loads, so gdb stops in it at the user's source line:
--     CUDALUA_DEVICE=cpu CUDALUA_CPU_DEBUG=1 CUDALUA_CPU_THREADS=1 gdb -batch \
--       -ex 'set breakpoint pending on' -ex 'break saxpy' -ex run -ex bt \
--       --args lua5.4 script.lua
--   (CUDALUA_CPU_THREADS=1: one OS thread runs every block; CUDALUA_CACHE=0 if an earlier run
--   cached the kernel without -g.)
--   AddressSanitizer: CUDALUA_CPU_SANITIZE=address builds kernels with -fsanitize=address; its
--   runtime must be in the process from the start:
--     LD_PRELOAD=$(g++ -print-file-name=libasan.so) CUDALUA_DEVICE=cpu \
--       CUDALUA_CPU_SANITIZE=address lua5.4 script.lua
--   (ASAN_OPTIONS=detect_leaks=0 if lua5.4's own allocations at exit are not wanted)
--   ThreadSanitizer: CUDALUA_CPU_SANITIZE=thread; the threads of a block are fibers switched
--   without synchronising, so two threads of a block touching the same memory with no
--   __syncthreads between them are reported as a race, with the kernel's source lines:
--     LD_PRELOAD=$(g++ -print-file-name=libtsan.so) CUDALUA_DEVICE=cpu \
--       CUDALUA_CPU_SANITIZE=thread lua5.4 script.lua
--   UndefinedBehaviorSanitizer: CUDALUA_CPU_SANITIZE=undefined (its runtime is loaded with the
--   kernels; no preload).
--   CUDALUA_CPU_CHECK=1 (kernels with -g): barriers part of a block skips, warp masks naming
--   lanes that exited, and accesses past the end of an allocation are errors naming the block,
--   thread and source line. CUDALUA_CPU_SCHEDULE=<seed>: blocks, threads and fibers run in an
--   order drawn from the seed (the same seed, the same order), to shake out races.
local SANITIZERS = { address = { "__asan_init", "libasan.so" }, thread = { "__tsan_init", "libtsan.so" },
                     undefined = {} }

-- the flags the environment asks for (CUDALUA_CPU_DEBUG, _CHECK, _SANITIZE): part of the compile
-- cache's key, as every flag is
local function env_flags(out)
  local function on(v) v = os.getenv(v); return v ~= nil and v ~= "" and v ~= "0" end
  if on("CUDALUA_CPU_DEBUG") then out[#out + 1] = "-g"; out[#out + 1] = "-O0"
  elseif on("CUDALUA_CPU_CHECK") then out[#out + 1] = "-g" end
  if on("CUDALUA_CPU_CHECK") then out[#out + 1] = "-D__CUDALUA_CPU_CHECK__=1" end
  local san = os.getenv("CUDALUA_CPU_SANITIZE")
  if san and san ~= "" then
    local want = SANITIZERS[san]
    if not want then
      check.error("cuda.compile", 0, "CUDALUA_CPU_SANITIZE is %s: it takes address, thread or undefined", san)
    end
    -- (a kernel library built so, loaded without its runtime, would abort the process)
    if want[1] and not core.has_symbol(want[1]) then
      check.error("cuda.compile", 0, "CUDALUA_CPU_SANITIZE=%s needs the sanitizer's runtime in the process from its start: "
        .. "run with LD_PRELOAD=$(g++ -print-file-name=%s)", san, want[2])
    end
    out[#out + 1] = "-fsanitize=" .. san
    out[#out + 1] = "-fno-omit-frame-pointer"
    out[#out + 1] = "-g"   -- (the reports' source lines)
  end
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
  env_flags(out)
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
  -- (the text after the declaration keeps its line: #line says it, for the compiler's and the
  -- checks' messages)
  return (src:gsub("()(extern%s+__shared__%s+([^;%[]-)%s*([%a_][%w_]*)%s*%[%s*%]%s*;)", function(at, whole, decl, name)
    local t = decl:gsub("__align__%s*%b()", ""):gsub("alignas%s*%b()", ""):gsub("^%s+", ""):gsub("%s+$", "")
    local _, before = src:sub(1, at - 1):gsub("\n", "")
    local _, inside = whole:gsub("\n", "")
    return ("\n#define %s ((%s *)__CL_CUR->dyn_shared)\n#line %d\n"):format(name, t, before + inside + 1)
  end))
end

-- which kernels may synchronise. A kernel that can never reach a barrier or a warp operation
-- runs a block as one loop (its threads one after another, the kernel inlined); the others run
-- each thread as a fiber. Read from the text: a function syncs when its body (lambdas and
-- local classes in it included) has a barrier or warp operation, or names a function that
-- syncs; a kernel syncs when a function of its name does. Where that reading cannot follow
-- (a barrier outside any named function's body: a macro, an operator(), a lambda at file
-- scope; a syncing function named other than as a call at file scope: a pointer to it kept)
-- every kernel counts as syncing.
local SYNCS = { "__syncthreads", "__syncwarp", "_sync%s*%(", "%.sync%s*%(", "__activemask" }
local function has_sync(text)
  for _, p in ipairs(SYNCS) do if text:find(p) then return true end end
  return false
end

-- the text with comments, strings and character literals blanked (same length, lines kept)
local function code_only(text)
  local out, i, n = {}, 1, #text
  while true do
    local at = text:find("[/\"']", i)
    if not at then out[#out + 1] = text:sub(i); break end
    local c, nxt, stop = text:sub(at, at), text:sub(at + 1, at + 1), nil
    if c == "/" and nxt == "/" then stop = (text:find("\n", at, true) or n + 1) - 1
    elseif c == "/" and nxt == "*" then stop = select(2, text:find("*/", at + 2, true)) or n
    elseif c ~= "/" then
      local j = at + 1
      while j <= n do
        local d = text:sub(j, j)
        if d == "\\" then j = j + 2 elseif d == c or d == "\n" then break else j = j + 1 end
      end
      stop = math.min(j, n)
    end
    if stop then
      out[#out + 1] = text:sub(i, at - 1) .. text:sub(at, stop):gsub("[^\n]", " ")
      i = stop + 1
    else
      out[#out + 1] = text:sub(i, at)
      i = at + 1
    end
  end
  return table.concat(out)
end

local CONTROL = { ["if"] = true, ["for"] = true, ["while"] = true, ["switch"] = true, ["catch"] = true,
                  ["return"] = true, ["sizeof"] = true, ["decltype"] = true, ["alignas"] = true,
                  ["__attribute__"] = true, ["__launch_bounds__"] = true, ["__align__"] = true, ["throw"] = true }

-- the name of the function whose body opens at `at` ('{'), false for a lambda or a statement's
-- block (part of the function around it), nil for anything else (a class, a namespace, data)
local function body_name(code, at)
  -- (what comes before, within reach: a parameter list longer than that reads as unknown)
  local before = code:sub(math.max(1, at - 4000), at - 1):gsub("[%s]+$", "")
  before = before:gsub("%f[%w_]const%s*$", ""):gsub("%f[%w_]noexcept%s*$", ""):gsub("%f[%w_]override%s*$", "")
                 :gsub("%f[%w_]mutable%s*$", ""):gsub("%s+$", "")
  if not before:find("%)$") then
    local word = before:match("([%w_]+)$")
    return (word == "else" or word == "do" or word == "try" or before:find("[;{}]$")) and false or nil
  end
  local depth, i = 0, #before
  while i > 0 do
    local c = before:sub(i, i)
    if c == ")" then depth = depth + 1 elseif c == "(" then depth = depth - 1; if depth == 0 then break end end
    i = i - 1
  end
  local head = before:sub(1, i - 1):gsub("%s+$", "")
  if head:find("%]$") or head:find("%>$") then return false end   -- a lambda (or a template's: kept whole)
  local name = head:match("([%a_][%w_]*)$")
  if not name or CONTROL[name] then return false end
  return name
end

-- the functions a text defines (at file scope, in a namespace or a class), each with its
-- body's span; what is inside a function is its own
local function functions(code)
  local found, stack, infn = {}, {}, 0
  for i in code:gmatch("()[{}]") do
    if code:byte(i) == 123 then   -- {
      local name = infn == 0 and body_name(code, i) or nil
      stack[#stack + 1] = { at = i, name = name or nil }
      if infn > 0 or name then infn = infn + 1 end
    elseif #stack > 0 then
      local s = table.remove(stack)
      if infn > 0 then infn = infn - 1 end
      if s.name and infn == 0 then found[#found + 1] = { name = s.name, from = s.at, to = i } end
    end
  end
  return found
end

-- words that come before a call, not a declaration's type
local CALLERS = { ["return"] = true, ["else"] = true, ["do"] = true, ["case"] = true, ["throw"] = true,
                  ["co_return"] = true, ["co_await"] = true, ["sizeof"] = true, ["decltype"] = true }

-- sync_names(texts) -> {name = true: may synchronise, false: never}, true (all may) or false
-- (none)
local function sync_names(texts)
  local any = false
  for _, t in ipairs(texts) do any = any or has_sync(t) end
  if not any then return false end
  local bodies, outside = {}, {}
  for _, text in ipairs(texts) do
    local code = code_only(text)
    local fns = functions(code)
    local rest = code
    for _, f in ipairs(fns) do
      local body = code:sub(f.from, f.to)
      bodies[#bodies + 1] = { name = f.name, sync = has_sync(body), body = body }
      rest = rest:sub(1, f.from - 1) .. (" "):rep(f.to - f.from + 1) .. rest:sub(f.to + 1)
    end
    if has_sync(rest) then return true end
    outside[#outside + 1] = rest
  end
  local names, grew = {}, true
  for _, b in ipairs(bodies) do names[b.name] = names[b.name] or b.sync end
  while grew do
    grew = false
    for _, b in ipairs(bodies) do
      if not names[b.name] then
        for w in b.body:gmatch("[%a_][%w_]*") do
          if names[w] == true then names[b.name] = true; grew = true; break end
        end
      end
    end
  end
  -- at file scope a syncing function named other than in a declaration: kept somewhere, or
  -- called from a body the scan does not follow (an operator(), a lambda): then all may sync. A
  -- declaration has a type (or its class's name) before the name; a call does not
  for _, rest in ipairs(outside) do
    for at, w in rest:gmatch("()([%a_][%w_]*)") do   -- (what follows read, not taken: it may be a name)
      local after = rest:match("^%s*(.?)", at + #w)
      if names[w] == true and rest:sub(at - 1, at - 1) ~= "." then
        local head = rest:sub(math.max(1, at - 64), at - 1)
        local before, word = head:match("(%S)%s*$"), head:match("([%a_][%w_]*)%s*$")
        local typed = before and before:match("[%w_%*&:>]") and not CALLERS[word]
        if after ~= "(" or not typed then return true end
      end
    end
  end
  return names
end
M.sync_names = sync_names

-- Coroutine twins (cuda_cpu.h, co_on.h): a kernel at file scope whose barriers and warp
-- operations are all calls, in its own body, of the ones co_on.h turns into co_await gets a
-- copy of itself as a coroutine, __cl_co_<name>, written after it; the device then runs each of
-- its threads as a coroutine rather than a fiber (a switch costs a call and a return). Not for
-- a body the reading cannot be sure of: a lambda or a local class in it (their bodies cannot
-- co_await), a function it names that syncs (itself: a recursive call), a sync it takes other
-- than as a call.
local CO_CALLS = { __syncthreads = true, __syncthreads_count = true, __syncthreads_and = true,
  __syncthreads_or = true, __syncwarp = true, __shfl_sync = true, __shfl_up_sync = true, __shfl_down_sync = true,
  __shfl_xor_sync = true, __ballot_sync = true, __any_sync = true, __all_sync = true }
local CO_NOT = { class = true, struct = true, union = true, co_await = true, co_return = true, co_yield = true,
  __cl_me = true }

local function co_ready(body, names)
  if body:find("%.%s*sync%s*%(") or body:find("%[[^%]]*%]%s*[%(%{]") or body:find("%]%s*mutable") then return false end
  local calls = 0
  for at, w in body:gmatch("()([%a_][%w_]*)") do
    if CO_NOT[w] then return false end
    if CO_CALLS[w] then
      if not body:find("^%s*%(", at + #w) then return false end
      calls = calls + 1
    elseif w:find("_sync$") or names[w] == true then   -- (itself too: a call from the twin is the original's)
      return false
    end
  end
  return calls > 0
end

-- the span of the parameter list (inside the parentheses) of the function whose body opens at `at`
local function params_span(code, at)
  local close = code:sub(1, at - 1):find("%)%s*$")
  if not close then return nil end
  local depth = 0
  for i = close, 1, -1 do
    local c = code:sub(i, i)
    if c == ")" then depth = depth + 1 elseif c == "(" then depth = depth - 1; if depth == 0 then return i + 1, close - 1 end end
  end
end

-- whether twins may be written: not where the reading cannot see every function (a header it
-- has not read), nor in builds where GCC does not make a coroutine's hand-over a tail call (the
-- OS thread's stack would grow with every switch: -O0, -Og, the sanitizers)
local function twins_allowed(names, unread, flags)
  if type(names) ~= "table" or unread or os.getenv("CUDALUA_CPU_COROUTINES") == "0" then return false end
  for _, v in ipairs { "CUDALUA_CPU_DEBUG", "CUDALUA_CPU_SANITIZE" } do
    local e = os.getenv(v)
    if e and e ~= "" and e ~= "0" then return false end
  end
  for _, f in ipairs(flags) do
    if f == "-O0" or f == "-Og" or f:match("^%-fsanitize") then return false end
  end
  return true
end

-- co_twins(text, name, exprs, names) -> the text with the twins written in, {expression = true}
-- for the kernels that have one
local function co_twins(text, name, exprs, names)
  local code = code_only(text)
  local fns, count = functions(code), {}
  for _, f in ipairs(fns) do count[f.name] = (count[f.name] or 0) + 1 end
  local want = {}
  for _, e in ipairs(exprs) do
    local k = e:match("^__cudalua_sig<decltype%(([%a_][%w_]*)%)>$")
    if k and names[k] and count[k] == 1 then want[k] = true end
  end
  local inserts, twins = {}, {}
  for _, f in ipairs(fns) do
    local body = want[f.name] and code:sub(f.from, f.to)
    local open, shut, opens, shuts
    if body and co_ready(body, names) then
      open, shut = params_span(code, f.from)
      opens, shuts = select(2, code:sub(1, f.from - 1):gsub("{", "")), select(2, code:sub(1, f.from - 1):gsub("}", ""))
    end
    if open and opens == shuts then
      local params = text:sub(open, shut)
      if params:match("^%s*void%s*$") or params:match("^%s*$") then params = "" else params = ", " .. params end
      -- the body as written, its returns the coroutine's (found in the code, so none in a string)
      local parts, last = {}, f.from
      for at in body:gmatch("()%f[%w_]return%f[^%w_]") do
        parts[#parts + 1] = text:sub(last, f.from + at - 2) .. "co_return"
        last = f.from + at - 1 + #"return"
      end
      -- (and a co_return last: a body whose barriers the preprocessor drops is a coroutine still)
      parts[#parts + 1] = text:sub(last, f.to - 1) .. " co_return; }"
      local _, l1 = text:sub(1, f.from):gsub("\n", "")
      local _, l2 = text:sub(1, f.to):gsub("\n", "")
      inserts[#inserts + 1] = { at = f.to, text = ('\n#include "cudalua/cpu/co_on.h"\n'
        .. 'static __cl_co_task __cl_co_%s(cl_cpu_thread *__cl_me%s)\n'
        .. '#line %d "%s"\n%s\n#include "cudalua/cpu/co_off.h"\n#line %d "%s"\n'):format(f.name, params, l1 + 1, name,
        table.concat(parts), l2 + 1, name) }
      twins["__cudalua_sig<decltype(" .. f.name .. ")>"] = true
    end
  end
  for i = #inserts, 1, -1 do
    local ins = inserts[i]
    text = text:sub(1, ins.at) .. ins.text .. text:sub(ins.at + 1)
  end
  return text, twins
end

-- does the kernel of name expression e ("k", "ns::k<int>") synchronise
local function kernel_syncs(names, e)
  if names == true or names == false then return names end
  local base = e:gsub("<.*$", ""):match("([%a_][%w_]*)%s*$")
  return not base or names[base] ~= false
end

-- the table of kernels (each name expression that has a probe is a kernel), each with whether
-- it may synchronise, the addresses the lowered names come from, and each kernel's
-- __launch_bounds__; each expression's lines are its own (owner: line -> the kernel expression
-- it serves), so that a compile failing on one names it (see rejected)
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

local function footer(exprs, names, bounds, twins)
  local is_probe = {}
  for _, e in ipairs(exprs) do
    local k = e:match("^__cudalua_sig<decltype%((.*)%)>$")
    if k then is_probe[k] = true end
  end
  local lines, owner = { "", ('#line 1 "%s"'):format(FOOTER_NAME), 'extern "C" {',
    '__attribute__((visibility("default"))) extern const cl_cpu_entry __cudalua_cpu_entries[] = {' }, {}
  -- (lines[3] is the footer's line 1: #line says so)
  local function add(text, e) lines[#lines + 1] = text; owner[#lines - 2] = e end
  for _, e in ipairs(exprs) do
    if is_probe[e] and twins["__cudalua_sig<decltype(" .. e .. ")>"] then
      add(("  __cl_entry_co<&%s, &__cl_co_%s>(),"):format(e, e), e)
    elseif is_probe[e] then
      add(("  __cl_entry<&%s>(%d),"):format(e, kernel_syncs(names, e) and 1 or 0), e)
    end
  end
  add("  {}};")
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
  -- the texts the source includes, itself first (every header given would take the kernels
  -- of a source that includes none of cudalua's own for syncing ones: reduce.cuh syncs)
  local by_name, texts, seen = {}, { src }, {}
  for _, h in ipairs(headers) do
    if not h[1]:match("^cudalua/cpu/") then by_name[h[1]] = h[2] end
  end
  local i, unread = 1, false   -- unread: a header in quotes this reading does not have (a path)
  while texts[i] do
    for q, inc in texts[i]:gmatch('#%s*include%s*([<"])([^>"]+)[>"]') do
      if by_name[inc] and not seen[inc] then seen[inc] = true; texts[#texts + 1] = by_name[inc] end
      unread = unread or (q == '"' and not by_name[inc])
    end
    i = i + 1
  end
  -- (headers found through include folders are not read here: with any, every kernel may sync)
  local folders = false
  for _, fl in ipairs(flags) do folders = folders or fl:match("^%-I") ~= nil end
  local names = folders or sync_names(texts)
  local body, twins = dynamic_shared(src), {}
  if twins_allowed(names, unread, flags) then body, twins = co_twins(body, name, exprs, names) end
  local tables, owner = footer(exprs, names, launch_bounds(src), twins)
  local text = ('#line 1 "%s"\n'):format(name) .. body .. tables
  local cxx, id = find_compiler()
  -- -Bsymbolic: the library's own names are its own (a kernel named raw took ncurses' raw(),
  -- loaded by the interpreter before it: the table held that function's address)
  local args = { cxx, next(twins) and "-std=c++20" or "-std=c++17", "-O2", "-fPIC", "-fno-semantic-interposition",
                 "-shared", "-fno-ipa-icf", "-fno-gnu-unique", "-pthread", "-include", "cudalua/cpu/cuda_cpu.h",
                 "-Wl,-Bsymbolic", "-x", "c++" }
  if id:match("clang") then args[7], args[8] = "-fno-common", "-fno-common" end   -- (gcc's flags)
  if host_fma() then args[#args + 1], args[#args + 2] = "-mfma", "-ffp-contract=fast" end
  for _, f in ipairs(flags) do args[#args + 1] = f end
  local image, log, lowered = core.cxx_compile(text, name, args, headers, exprs)
  if image then return image, log, lowered end
  if next(twins) then   -- (a compiler without coroutines, or a body a twin cannot take: the fibers')
    args[2] = "-std=c++17"
    tables, owner = footer(exprs, names, launch_bounds(src), {})
    image, log, lowered = core.cxx_compile(('#line 1 "%s"\n'):format(name) .. dynamic_shared(src) .. tables, name, args,
      headers, exprs)
    if image then return image, log, lowered end
  end
  return nil, log, lowered, rejected(log, owner)
end

return M
