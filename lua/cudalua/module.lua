-- cudalua.module: modules and the kernels in them, whatever made them: NVRTC (cuda.compile),
-- files or bytes built elsewhere (cuda.load_module: cubin, fatbin, PTX, LTO-IR) or nvJitLink
-- (cuda.link). A module is loaded on the device when a kernel of it is first asked for.
-- Parameter types, in the order tried: what the compiler said (cuda.compile's probe), a
-- signature the user gives (m:get("k", "float*, int")), the PTX .param list, a C++ mangled
-- name, the driver's parameter sizes.
local core = ...
local signature = require "cudalua.signature"
local check = require "cudalua.check"
local globals = require "cudalua.globals"
local M = {}

-- cuda.compile's probe kernel template: its instances are never listed
M.PROBE = "__cudalua_sig"
local PROBE_SYMBOL = "_Z" .. #M.PROBE .. M.PROBE

-- C and C++ comments blanked (newlines kept: line numbers stay)
function M.strip_comments(src)
  src = src:gsub("/%*.-%*/", function(c) return (c:gsub("[^\n]", " ")) end)
  return (src:gsub("//[^\n]*", ""))
end

---------------------------------------------------------------------------------------------
-- what an image is, from its first bytes
local function image_kind(s)
  local head = s:sub(1, 4)
  if head == "\127ELF" then return "cubin" end
  if head == "\80\237\85\186" then return "fatbin" end   -- 0xBA55ED50, little-endian
  if head == "\237\67\78\127" then return "ltoir" end     -- 0x7F4E43ED
  local text = s:sub(1, 8192)
  if not text:find("%z") and text:find("%.version%s+%d") and text:find("%.target%s") then return "ptx" end
  return nil
end
M.image_kind = image_kind

-- the kernels of a cubin: ELF function symbols marked as entries (STO_CUDA_ENTRY, 0x10);
-- also whether it is relocatable (ET_REL) and its machine is CUDA's (EM_CUDA, 190). b: where
-- the ELF starts in s (0: at its start; a fatbin holds several). Raises on a damaged file
-- (elf_info catches it).
local function read_elf(s, b)
  local len = #s - b   -- what follows the ELF's start
  if len < 64 or s:sub(b + 1, b + 4) ~= "\127ELF" or s:byte(b + 5) ~= 2 then return nil end
  local etype, machine = string.unpack("<I2I2", s, b + 17)
  local shoff = string.unpack("<I8", s, b + 0x28 + 1)
  local shentsize, shnum = string.unpack("<I2I2", s, b + 0x3A + 1)
  local shstrndx = string.unpack("<I2", s, b + 0x3E + 1)
  local info = { relocatable = etype == 1, cuda = machine == 190, kernels = {}, nparams = {} }
  if shentsize < 64 or shoff < 0 or shoff + shnum * shentsize > len then error("bad section table") end
  local function section(i)
    local o = b + shoff + i * shentsize + 1
    local name, typ, _, _, off, size, link, _, _, entsize = string.unpack("<I4I4I8I8I8I8I4I4I8I8", s, o)
    return typ, off, size, link, entsize, name
  end
  local _, namesoff, namessize = section(shstrndx < shnum and shstrndx or 0)
  if namesoff < 0 or namesoff + namessize > len then namessize = 0 end
  for i = 0, shnum - 1 do
    local typ, off, size, link, entsize, name = section(i)
    -- .nv.info.<kernel>: attribute records (format, attribute, 16-bit value or payload size);
    -- one EIATTR_KPARAM_INFO (0x17) per parameter: the count, without asking the driver
    local sname = name < namessize and s:match("^[^%z]*", b + namesoff + name + 1) or ""
    local kernel = sname:match("^%.nv%.info%.(.+)$")
    if kernel and off >= 0 and off + size <= len then
      local n, o = 0, off
      while o + 4 <= off + size do
        local fmt, attr, v = string.unpack("<BBI2", s, b + o + 1)
        if fmt == 4 and attr == 0x17 then n = n + 1 end
        o = o + 4 + (fmt == 4 and v or 0)   -- EIFMT_SVAL: v bytes follow
      end
      info.nparams[kernel] = n
    end
    if typ == 2 and entsize >= 24 and off >= 0 and off + size <= len and link < shnum then -- SHT_SYMTAB
      local _, stroff, strsize = section(link)
      if stroff < 0 or stroff + strsize > len then error("bad string table") end
      for o = off, off + size - entsize, entsize do
        local symname, stinfo, other = string.unpack("<I4BB", s, b + o + 1)
        if stinfo & 0xf == 2 and other & 0x10 ~= 0 and symname < strsize then
          local sym = s:match("^[^%z]*", b + stroff + symname + 1)
          if sym ~= "" and sym:sub(1, #PROBE_SYMBOL) ~= PROBE_SYMBOL then info.kernels[#info.kernels + 1] = sym end
        end
      end
    end
  end
  table.sort(info.kernels)
  return info
end

-- nil for what is not an ELF file; false for a damaged one. at: where it starts in s (1-based,
-- default 1), so that a fatbin's images are read in place
local function elf_info(s, at)
  local ok, info = pcall(read_elf, s, (at or 1) - 1)
  if ok then return info end
  return false
end
M.elf_info = elf_info

---------------------------------------------------------------------------------------------
-- PTX: the .entry list and each entry's .param types, as code letters (src/kernel.c's
-- cl_params says which)
local ptx_code = core.param_types.ptx

local function ptx_entries(ptx)
  local entries = {}
  local code = M.strip_comments(ptx)
  for name, after in code:gmatch("%.entry%s+([%w_$.]+)%s*()") do
    local params = code:match("^%b()", after) or "()"
    if name:sub(1, #PROBE_SYMBOL) ~= PROBE_SYMBOL then
      local codes, types = {}, {}
      for p in params:sub(2, -2):gmatch("[^,]+") do
        local t = p:match("%.param%s.-%.([usbf]%d+)%s") or p:match("%.param%s.-%.(bf16)%s")
        local count = p:match("%[(%d+)%]%s*$")
        if count and t then
          local bytes = tonumber(t:match("%d+")) // 8 * tonumber(count)
          codes[#codes + 1], types[#types + 1] = "x", ("%d bytes (.%s[%s])"):format(bytes, t, count)
        elseif t and ptx_code[t] then
          codes[#codes + 1] = ptx_code[t]
          types[#types + 1] = t:match("64$") and t ~= "f64" and ".u64 (array or integer address)" or "." .. t
        else
          codes[#codes + 1], types[#types + 1] = "y", "unknown PTX type"
        end
      end
      entries[name] = { symbol = name, codes = table.concat(codes), types = types }
    end
  end
  return entries
end
M.ptx_entries = ptx_entries

---------------------------------------------------------------------------------------------
-- signatures the user gives: "float*, const float *x, int n"
-- the one-word type names a signature may give, and builtin integer types by their demangled
-- spelling: src/kernel.c's cl_params
local named, mangled = core.param_types.declared, core.param_types.mangled
local int_word = { signed = true, unsigned = true, short = true, long = true, char = true, int = true }
local qualifier = { const = true, volatile = true, __restrict__ = true, restrict = true,
  __restrict = true, struct = true, class = true, union = true, enum = true, __grid_constant__ = true }

-- the code of a builtin integer type spelt in any order of its words ("long unsigned int")
local function int_code(words)
  local n = {}
  for _, w in ipairs(words) do
    if not int_word[w] then return nil end
    n[w] = (n[w] or 0) + 1
  end
  local u = n.unsigned and "unsigned " or ""
  if n.char then return mangled[n.unsigned and "unsigned char" or "signed char"] end   -- plain char is signed on x86-64
  if n.short then return mangled[u .. "short"] end
  if n.long then return mangled[u .. "long"] end   -- long and long long: 8 bytes here
  return mangled[u .. "int"]
end

local function parse_signature(sig)
  if type(sig) ~= "string" then error("expected a signature string such as \"float*, int\"", 0) end
  local codes, types = {}, {}
  if sig:match("^%s*$") or sig:match("^%s*void%s*$") then return "", types end
  for part in (sig .. ","):gmatch("([^,]*),") do
    local i = #codes + 1
    local p = part:gsub("^%s+", ""):gsub("%s+$", "")
    if p == "" then error(("empty parameter %d in the signature %q"):format(i, sig), 0) end
    if p:find("&") then error(("parameter %d is a reference (%s): kernels take values and pointers"):format(i, p), 0) end
    if p:find("[%[%]()<>]") then error(("cannot read parameter %d (%s): use plain C types"):format(i, p), 0) end
    local stars = select(2, p:gsub("%*", ""))
    local const = false
    local words = {}
    for w in p:match("^([^*]*)"):gmatch("[%w_:]+") do
      w = w:gsub("^::", ""):gsub("^std::", "")
      if w == "const" then const = true end
      if not qualifier[w] then words[#words + 1] = w end
    end
    -- a trailing parameter name: the last of two or more words, when not part of the type
    if stars == 0 and #words > 1 and not int_word[words[#words]] and not named[words[#words]] then
      table.remove(words)
    end
    if #words == 0 then error(("cannot read parameter %d (%s)"):format(i, p), 0) end
    if stars > 0 then
      codes[i] = const and "q" or "p"
    else
      codes[i] = int_code(words) or (#words == 1 and named[words[1]]) or "x"
    end
    types[i] = p
  end
  return table.concat(codes), types
end
M.parse_signature = parse_signature

---------------------------------------------------------------------------------------------
local Module = {}
local state = setmetatable({}, { __mode = "k" }) -- module -> private fields

local function fields(mod, what)
  local st = state[mod]
  if not st then check.error("module:" .. what, 3, "expected a module (call it as m:%s())", what) end
  return st
end

-- the module loaded on the current device (loaded there on first use: one image serves every
-- device of its architecture)
local function load(mod, level, by, where)
  local st = state[mod]
  if st.relocatable then
    check.error(where or (by and "module." .. by or "module:get"), level + 1, "module %s holds relocatable code "
      .. "(relocatable = true, lto = true or an -rdc object): link it first, cuda.link{...}", st.name)
  end
  local dev = core.is_available() and core.current_device() or 0
  local h = st.handles[dev]
  if not h and not core.is_available() then   -- (said here: under pcall the C side cannot name us)
    check.error(where or (by and "module." .. by or "module:get"), level + 1, "%s", check.cause(core.driver_error()))
  end
  if not h then
    local ok, r = pcall(core.module_load, st.image, st.source and "compile for this device's architecture (leave arch unset)"
      or "this image was not built for this device's architecture (build for it, or ship PTX the driver can compile)")
    if not ok then error(r, level + 1) end
    h = r
    st.handles[dev] = h
  end
  return h, dev
end

local function no_kernel(st, expr, names, level, by)
  check.error(by and "module." .. by or "module:get", level + 1, "no kernel '%s' in module %s (kernels: %s)", expr,
    st.name, #names > 0 and table.concat(names, ", ") or "none found")
end

-- names of the kernels a module has, as m:get takes them (shared: callers copy)
local function kernel_names(mod, level)
  local st = state[mod]
  if not st.names then
    local names, seen = {}, {}
    local function add(n) if not seen[n] then seen[n] = true; names[#names + 1] = n end end
    for n in pairs(st.info) do add(n) end
    local symbols = {}
    for _, e in pairs(st.info) do if e.symbol then symbols[e.symbol] = true end end
    if not st.listed and st.kind == "fatbin" and not st.relocatable then
      local listed = core.module_functions((load(mod, level + 1)))   -- a fatbin's: the driver lists them
      st.listed, st.unlisted = listed or {}, listed == nil
    end
    for _, n in ipairs(st.listed or {}) do
      if not symbols[n] and n:sub(1, #PROBE_SYMBOL) ~= PROBE_SYMBOL then add(n) end
    end
    table.sort(names)
    st.names = names
  end
  return st.names
end

-- a C++ kernel asked for by its plain name: the one mangled symbol that spells it
local function mangled_match(st, name)
  local prefix, hit = "_Z" .. #name .. name, nil
  for _, sym in ipairs(st.listed or {}) do
    if sym:sub(1, #prefix) == prefix and sym:sub(#prefix + 1, #prefix + 1):match("[^%d]") then
      if hit then return nil end -- overloaded: ambiguous
      hit = sym
    end
  end
  return hit
end

-- what is known of kernel expr of a module with no source: the symbol, and types from its
-- PTX or its mangled name where they can be read
local function lookup(st, mod, expr, level, by)
  local known = false
  for _, n in ipairs(kernel_names(mod, level + 1)) do if n == expr then known = true end end
  local symbol = known and expr or mangled_match(st, expr)
  if not symbol then
    -- the image lists every kernel: the driver is not asked for one it does not have
    if st.listed and not st.unlisted then no_kernel(st, expr, kernel_names(mod, level + 1), level + 1, by) end
    return { symbol = expr }
  end
  if st.info[symbol] then return st.info[symbol] end   -- types from the PTX
  local params = signature.demangle_function(symbol)
  if params then
    local ok, codes, types = pcall(signature.param_codes, params)
    if ok then return { symbol = symbol, codes = codes, types = types } end
  end
  return { symbol = symbol }   -- the driver's sizes
end

-- how many parameters kernel symbol has, read from the image (a cubin's or a fatbin's ELF
-- attributes, or the PTX), so that a signature is checked without a failing driver call; nil
-- when the image does not say (compressed fatbins, for one)
local function param_count(st, symbol, ptx_codes)
  if ptx_codes then return #ptx_codes end
  if not st.nparams then
    st.nparams = {}
    if st.kind == "cubin" then
      local elf = elf_info(st.image)
      if elf then st.nparams = elf.nparams end
    elseif st.kind == "fatbin" then   -- every ELF image in the container that can be read
      local at = 1
      while true do
        at = st.image:find("\127ELF\2", at, true)
        if not at then break end
        local elf = elf_info(st.image, at)
        if elf then for k, n in pairs(elf.nparams) do st.nparams[k] = st.nparams[k] or n end end
        at = at + 5
      end
    end
  end
  return st.nparams[symbol]
end
M.param_count = param_count

-- by: the kernel's name when the user wrote m.name (nil: m:get(name)), for messages
local function get_kernel(mod, expr, sig, level, by)
  local st = state[mod]
  local dev = core.is_available() and core.current_device() or 0
  local per = st.kernels[dev]
  if not per then per = {}; st.kernels[dev] = per end
  local cache_key = sig and (expr .. "\0" .. sig) or expr
  local k = per[cache_key]
  if k then return k end
  local info = st.info[expr]
  if not info and not st.source then info = lookup(st, mod, expr, level + 1, by) end
  if not info then no_kernel(st, expr, kernel_names(mod, level + 1), level + 1, by) end
  local codes, types = info.codes, info.types
  -- a count the image gives: the driver is then never asked past the last parameter
  local count = (sig or not codes) and param_count(st, info.symbol, info.codes) or nil
  if sig then
    local ok, c, t = pcall(parse_signature, sig)
    if not ok then check.error("module:get", level + 1, "kernel '%s': %s", expr, c) end
    if count and count ~= #c then
      check.error("module:get", level + 1, "kernel '%s': the signature %q has %d parameters, the kernel %d",
        expr, sig, #c, count)
    end
    codes, types = c, t
  elseif info.error then
    check.error("kernel '" .. expr .. "'", level + 1, "%s", info.error)
  end
  local handle = load(mod, level + 1, by)
  -- without codes, module_kernel takes the sizes from the driver and fills in types; with a
  -- signature and no count, it asks the driver whether there are more parameters
  local ok, kern = pcall(core.module_kernel, handle, info.symbol, codes,
    { name = expr, types = types or {}, symbol = info.symbol }, count or sig ~= nil)
  if not ok then
    if tostring(kern):find("no kernel '", 1, true) then no_kernel(st, expr, kernel_names(mod, level + 1), level + 1, by) end
    error(sig and ("%s (signature %q)"):format(kern, sig) or kern, level + 1)
  end
  per[cache_key] = kern
  return kern
end
M.get = get_kernel

function Module.get(mod, expr, sig)
  fields(mod, "get")
  if type(expr) ~= "string" then check.error("module:get", 2, "expected a kernel name or name expression") end
  if sig ~= nil and type(sig) ~= "string" then
    check.error("module:get", 2, "the signature must be a string such as \"float*, const float*, int\", got %s", type(sig))
  end
  local k = get_kernel(mod, expr, sig, 2)
  return k
end

function Module.kernels(mod)
  fields(mod, "kernels")
  local t = {}
  for i, n in ipairs(kernel_names(mod, 2)) do t[i] = n end
  return t
end
function Module.image(mod) return fields(mod, "image").image end
-- NVRTC's log; then, for the compile that made the module, what NVRTC's precompiled headers did
-- (cudalua.compile strips NVRTC's own lines about them, so that the log is the same either way)
local PCH_NOTE = { used = "cudalua: NVRTC used a precompiled header of the source's #include lines\n",
  made = "cudalua: NVRTC made a precompiled header of the source's #include lines (kept for this process)\n",
  ["made after growing the heap"] = "cudalua: NVRTC made a precompiled header of the source's #include "
    .. "lines (kept for this process), after growing its heap\n" }
function Module.log(mod)
  local st = fields(mod, "log")
  return st.log .. (PCH_NOTE[st.pch] or "")
end
function Module.kind(mod) return fields(mod, "kind").kind end

M.holds = { cubin = "a cubin", fatbin = "a fatbin", ltoir = "LTO-IR", ptx = "PTX" }
local holds = M.holds

function Module.ptx(mod)
  local st = fields(mod, "ptx")
  if st.kind == "ptx" then return st.image end
  if st.ptx then return st.ptx end
  check.error("module:ptx", 2, "module %s has no PTX (it holds %s%s)", st.name, holds[st.kind],
    st.linked and " made by cuda.link" or st.source and "" or " loaded as it was built")
end

function Module.cubin(mod)
  local st = fields(mod, "cubin")
  if st.kind == "cubin" then return st.image end
  check.error("module:cubin", 2, "module %s holds %s, not a cubin%s", st.name, holds[st.kind],
    st.kind == "ptx" and " (compile with an sm_ arch, or with arch unset, for one)" or "")
end

---------------------------------------------------------------------------------------------
-- __constant__ and __device__ variables: an array view of the module's memory (the view keeps
-- the loaded module). dtype and shape from the declaration (cudalua.globals) where the source
-- was compiled here, else given; the size the driver reports must be dtype x shape.
local function no_variable(st, name, where)
  local known = {}
  for k in pairs(st.globals) do known[#known + 1] = k end
  table.sort(known)
  check.error(where, 3, "no variable '%s' in module %s%s", name, st.name,
    #known > 0 and " (variables: " .. table.concat(known, ", ") .. ")" or "")
end

function Module.get_global(mod, name, dtype, shape)
  local st = fields(mod, "get_global")
  local where = "module:get_global"
  if type(name) ~= "string" then check.error(where, 2, "expected a variable's name, got %s", type(name)) end
  if shape ~= nil and dtype == nil then check.error(where, 2, "a shape needs a dtype: m:get_global(name, dtype, shape)") end
  local g = st.globals[name] or {}
  local dt = dtype or g.dtype
  if not dt then
    -- (a name the module lacks is said as such, not as a missing dtype: asked as bytes)
    if core.module_global(load(mod, 2, nil, where), g.symbol or name, "uint8") == nil then no_variable(st, name, where) end
    check.error(where, 2, "the type of '%s' is not known (%s): give its dtype, m:get_global(%q, \"float32\" [, shape])",
      name, g.symbol and "its declaration was not read" or "module " .. st.name .. " has no source here", name)
  end
  if dtype ~= nil and not pcall(core.dtype, dtype) then check.error(where, 2, "unknown dtype %s", tostring(dtype)) end
  shape = shape or (dtype == nil and g.dims) or nil
  local handle, dev = load(mod, 2, nil, where)
  -- the declaration's view, made once a device (a copy into a global each step of a loop is
  -- the common use: bench/helpers.lua); views with a dtype or shape given are made each time
  local cache = dtype == nil and (st.views[dev] or {})
  if cache then st.views[dev] = cache end
  local kept = cache and cache[name]
  if kept and not kept.closed then return kept end
  local view, bytes = core.module_global(handle, g.symbol or name, dt, shape)
  if cache and view then cache[name] = view end
  if view == nil then no_variable(st, name, where)
  elseif not view then
    local dname = type(dt) == "string" and dt or tostring(dt)
    check.error(where, 2, "'%s' has %d bytes, not %s%s", name, bytes, dname,
      shape and (" x {" .. table.concat(type(shape) == "table" and shape or { shape }, ", ") .. "}") or
      " elements (not a whole number of them)")
  end
  return view
end

-- the toolkit's disassemblers, found on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin
local function find_tool(name)
  local dirs = {}
  for d in (os.getenv("PATH") or ""):gmatch("[^:]+") do dirs[#dirs + 1] = d end
  for _, v in ipairs { "CUDA_HOME", "CUDA_PATH" } do
    if os.getenv(v) then dirs[#dirs + 1] = os.getenv(v) .. "/bin" end
  end
  dirs[#dirs + 1] = "/usr/local/cuda/bin"
  for _, d in ipairs(dirs) do
    local p = d .. "/" .. name
    local size, _, is_dir = core.file_info(p)
    if size and not is_dir then return p end
  end
  return nil
end
M.find_tool = find_tool

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- m:sass(): the module's machine code as text, from nvdisasm (a cubin) or cuobjdump -sass (a
-- cubin or a fatbin)
function Module.sass(mod)
  local st = fields(mod, "sass")
  if st.kind ~= "cubin" and st.kind ~= "fatbin" then
    check.error("module:sass", 2, "module %s holds %s, not machine code%s", st.name, holds[st.kind],
      st.kind == "ptx" and " (compile with an sm_ arch, or with arch unset)" or "")
  end
  local nvdisasm = st.kind == "cubin" and find_tool("nvdisasm")
  local tool = nvdisasm or find_tool("cuobjdump")
  if not tool then
    check.error("module:sass", 2, "neither %scuobjdump was found (on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin "
      .. "or /usr/local/cuda/bin): install the CUDA toolkit's %s", st.kind == "cubin" and "nvdisasm nor " or "",
      st.kind == "cubin" and "cuda-nvdisasm" or "cuda-cuobjdump")
  end
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(st.image)
  f:close()
  local p = io.popen(quote(tool) .. (nvdisasm and " " or " -sass ") .. quote(path) .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  os.remove(path)
  if not ok then check.error("module:sass", 2, "%s failed: %s", tool, out:gsub("%s+$", "")) end
  return out
end

local module_mt = {
  __index = function(mod, key)
    local m = Module[key]
    if m then return m end
    if type(key) ~= "string" then
      check.error("module[k]", 2, "modules are indexed by kernel names, got %s", type(key))
    end
    if not state[mod] then check.error("module[k]", 2, "expected a module") end
    local k = get_kernel(mod, key, nil, 2, key)
    return k
  end,
  __newindex = function() check.error("module[k] =", 2, "modules are read-only") end,
  __tostring = function(mod) return "cudalua.module<" .. fields(mod, "__tostring").name .. ">" end,
  __name = "cudalua.module",
}

-- fields: image, kind ("cubin", "ptx", "fatbin", "ltoir"), log, info ({expr = {symbol=,
-- codes=, types=, error=}}), name, ptx (a cubin's PTX), arch, relocatable, source (made by
-- cuda.compile), linked, listed (symbol names found in the image), link_image (what
-- cuda.link takes when it is not the image: a module loaded from LTO-IR keeps the LTO-IR)
function M.new(f)
  local mod = setmetatable({}, module_mt)
  f.kernels, f.handles, f.views = {}, {}, {}
  f.info, f.globals = globals.from_info(f.info or {})
  state[mod] = f
  return mod
end

M.methods = Module   -- for the reference spec
function M.is_module(v) return state[v] ~= nil end
function M.fields(mod) return state[mod] end

return M
