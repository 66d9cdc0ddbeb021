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
-- Itanium C++ ABI demangling, for the one shape we generate: _Z13__cudalua_sigIF<ret><params>EEvv
local builtin = { v = "void", b = "bool", c = "char", a = "signed char", h = "unsigned char",
  s = "short", t = "unsigned short", i = "int", j = "unsigned int", l = "long",
  m = "unsigned long", x = "long long", y = "unsigned long long", f = "float", d = "double",
  e = "long double", n = "__int128", o = "unsigned __int128", w = "wchar_t", z = "..." }
local code_of = { bool = "b", char = "a", ["signed char"] = "a", ["unsigned char"] = "A",
  short = "s", ["unsigned short"] = "S", int = "i", ["unsigned int"] = "I", long = "l",
  ["unsigned long"] = "L", ["long long"] = "l", ["unsigned long long"] = "L", float = "f",
  double = "d", __half = "e", _Float16 = "e", __nv_bfloat16 = "E",
  float2 = "c", double2 = "C" }   -- cuFloatComplex and cuDoubleComplex: {re, im} from Lua
local std_abbrev = { a = "std::allocator", b = "std::basic_string", s = "std::string",
  i = "std::istream", o = "std::ostream", d = "std::iostream" }

-- mode "function": a plain mangled function name, _Z<name><params>, as nvcc names C++ kernels
local function demangle_params(s, mode)
  local pos, subs = 1, {}
  local function fail(why) error(("cannot read the type signature %s (%s at %d)"):format(s, why, pos), 0) end
  local function peek(n) return s:sub(pos, pos + (n or 1) - 1) end
  local parse_type, template_args
  local function source_name()
    local len = s:match("^%d+", pos)
    if not len then fail("expected a name") end
    pos = pos + #len
    local name = s:sub(pos, pos + tonumber(len) - 1)
    pos = pos + tonumber(len)
    return name
  end
  local function add(t) subs[#subs + 1] = t; return t end
  local function with_template(t)
    if peek() == "I" then
      local args = template_args()
      local names = {}
      for i, a in ipairs(args) do names[i] = a.name end
      t = add { kind = "class", name = t.name .. "<" .. table.concat(names, ", ") .. ">" }
    end
    return t
  end
  function template_args()
    pos = pos + 1 -- I
    local args = {}
    while peek() ~= "E" do
      if pos > #s then fail("unterminated template arguments") end
      if peek() == "L" then -- literal: L<type><value>E
        local e = s:find("E", pos, true) or fail("bad literal")
        local lit = s:sub(pos + 1, e - 1) -- <builtin type letter><value>, n for minus
        local v = builtin[lit:sub(1, 1)] and lit:sub(2) or lit
        if lit:sub(1, 1) == "b" then v = v == "1" and "true" or "false" end
        args[#args + 1] = { kind = "literal", name = (v:gsub("^n", "-")) }
        pos = e + 1
      else
        args[#args + 1] = parse_type()
      end
    end
    pos = pos + 1
    return args
  end
  function parse_type()
    local c = peek()
    if builtin[c] then pos = pos + 1; return { kind = "builtin", name = builtin[c] } end
    if c == "D" then
      local two = peek(2)
      if two == "Dh" then pos = pos + 2; return { kind = "builtin", name = "_Float16" } end
      if two == "Dn" then pos = pos + 2; return { kind = "builtin", name = "decltype(nullptr)" } end
      local bits = s:match("^DF(%d+)_", pos)
      if bits then pos = pos + 3 + #bits; return { kind = "builtin", name = "_Float" .. bits } end
      fail("unsupported builtin type")
    end
    if c == "r" or c == "V" or c == "K" then
      local q = s:match("^[rVK]+", pos)
      pos = pos + #q
      local inner = parse_type()
      local words = {}
      if q:find("K") then words[#words + 1] = "const" end
      if q:find("V") then words[#words + 1] = "volatile" end
      local w = table.concat(words, " ")
      -- C spelling: a qualified pointer takes the qualifier after the star
      local name = inner.kind == "ptr" and (inner.name .. " " .. w) or (w .. " " .. inner.name)
      return add { kind = "qual", const = q:find("K") ~= nil, inner = inner, name = name }
    end
    if c == "P" or c == "R" or c == "O" then
      pos = pos + 1
      local inner = parse_type()
      return add { kind = c == "P" and "ptr" or "ref", inner = inner,
                   name = inner.name .. (c == "P" and "*" or "&") }
    end
    if c:match("%d") then
      local t = add { kind = "class", name = source_name() }
      return with_template(t)
    end
    if c == "N" then
      pos = pos + 1
      local parts = {}
      while peek() ~= "E" do
        if pos > #s then fail("unterminated nested name") end
        if peek() == "S" then
          parts[#parts + 1] = parse_type().name
        else
          parts[#parts + 1] = source_name()
          add { kind = "class", name = table.concat(parts, "::") }
          if peek() == "I" then
            local t = with_template { name = table.concat(parts, "::") }
            parts = { t.name }
          end
        end
      end
      pos = pos + 1
      return { kind = "class", name = table.concat(parts, "::") }
    end
    if c == "S" then
      local nx = s:sub(pos + 1, pos + 1)
      if nx == "t" then
        pos = pos + 2
        local t = add { kind = "class", name = "std::" .. source_name() }
        return with_template(t)
      end
      if std_abbrev[nx] then pos = pos + 2; return with_template { kind = "class", name = std_abbrev[nx] } end
      local seq = s:match("^S(%w*)_", pos) or fail("bad substitution")
      pos = pos + #seq + 2
      local idx = seq == "" and 1 or tonumber(seq, 36) + 2
      local t = subs[idx] or fail("substitution out of range")
      return with_template(t)
    end
    if c == "F" then
      pos = pos + 1
      if peek() == "Y" then pos = pos + 1 end
      local ret = parse_type()
      local params = {}
      while peek() ~= "E" do
        if pos > #s then fail("unterminated function type") end
        params[#params + 1] = parse_type()
      end
      pos = pos + 1
      if #params == 1 and params[1].name == "void" then params = {} end
      return add { kind = "function", ret = ret, params = params, name = "function" }
    end
    fail("unsupported type")
  end
  -- _Z <len>__cudalua_sig I F ... E E v v
  if s:sub(1, 2) ~= "_Z" then fail("not a mangled name") end
  pos = 3
  if mode == "function" then
    if peek() == "N" then parse_type() else add { kind = "class", name = source_name() } end
    if peek() == "I" then fail("a template function") end
    local params = {}
    while pos <= #s do params[#params + 1] = parse_type() end
    if #params == 1 and params[1].name == "void" then params = {} end
    return params
  end
  add { kind = "class", name = source_name() } -- the template name is substitution S_
  if peek() ~= "I" then fail("expected template arguments") end
  local args = template_args()
  if not args[1] or args[1].kind ~= "function" then fail("expected a function type") end
  return args[1].params
end

-- parameter types -> code letters (see src/module.c) and C spellings for messages
local function param_codes(params)
  local codes, types = {}, {}
  for i, p in ipairs(params) do
    local t = p
    while t.kind == "qual" do t = t.inner end -- top-level qualifiers do not change passing
    if t.kind == "ptr" then
      local pointee = t.inner
      codes[i] = (pointee.kind == "qual" and pointee.const) and "q" or "p"
    elseif t.kind == "ref" then
      error(("parameter %d is a reference (%s): kernels take values and pointers"):format(i, p.name), 0)
    else
      codes[i] = code_of[t.name] or "x"
    end
    types[i] = p.name
  end
  return table.concat(codes), types
end
M.demangle_params, M.param_codes = demangle_params, param_codes
-- the types of a C++ kernel from its mangled name, or nil where it cannot be read
function M.demangle_function(sym)
  local ok, params = pcall(demangle_params, sym, "function")
  return ok and params or nil
end

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

modules.demangle_function, modules.param_codes = M.demangle_function, param_codes

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
      local ok, params = pcall(demangle_params, sig)
      local entry = { symbol = sym }
      if ok then
        local ok2, codes, types = pcall(param_codes, params)
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
