-- cudalua.signature: kernel parameter types read from mangled names. cuda.compile gets them
-- from its probe instantiations (_Z13__cudalua_sigIF<ret><params>EEvv: the Itanium C++ ABI
-- spelling of decltype(kernel)); a module loaded without source from a C++ kernel's own
-- symbol (_Z<name><params>, as nvcc names it). Only the shapes those names take are read.
local core = ...
local M = {}

local builtin = { v = "void", b = "bool", c = "char", a = "signed char", h = "unsigned char",
  s = "short", t = "unsigned short", i = "int", j = "unsigned int", l = "long",
  m = "unsigned long", x = "long long", y = "unsigned long long", f = "float", d = "double",
  e = "long double", n = "__int128", o = "unsigned __int128", w = "wchar_t", z = "..." }
-- the code letter of each type as a demangled name spells it: src/kernel.c's cl_params
local code_of = core.param_types.mangled
local std_abbrev = { a = "std::allocator", b = "std::basic_string", s = "std::string",
  i = "std::istream", o = "std::ostream", d = "std::iostream" }

---------------------------------------------------------------------------------------------
-- a reader r = {s = the name, pos = where it reads, subs = the substitution candidates so far}
local function fail(r, why)
  error(("cannot read the type signature %s (%s at %d)"):format(r.s, why, r.pos), 0)
end
local function peek(r, n) return r.s:sub(r.pos, r.pos + (n or 1) - 1) end
local function add(r, t) r.subs[#r.subs + 1] = t; return t end

local function source_name(r)
  local len = r.s:match("^%d+", r.pos)
  if not len then fail(r, "expected a name") end
  r.pos = r.pos + #len
  local name = r.s:sub(r.pos, r.pos + tonumber(len) - 1)
  r.pos = r.pos + tonumber(len)
  return name
end

local parse_type

-- template arguments: types, and literals L<type><value>E (n for minus)
local function template_args(r)
  r.pos = r.pos + 1 -- I
  local args = {}
  while peek(r) ~= "E" do
    if r.pos > #r.s then fail(r, "unterminated template arguments") end
    if peek(r) == "L" then
      local e = r.s:find("E", r.pos, true) or fail(r, "bad literal")
      local lit = r.s:sub(r.pos + 1, e - 1) -- <builtin type letter><value>, n for minus
      local v = builtin[lit:sub(1, 1)] and lit:sub(2) or lit
      if lit:sub(1, 1) == "b" then v = v == "1" and "true" or "false" end
      args[#args + 1] = { kind = "literal", name = (v:gsub("^n", "-")) }
      r.pos = e + 1
    else
      args[#args + 1] = parse_type(r)
    end
  end
  r.pos = r.pos + 1
  return args
end

-- t, or t<args> as a new substitution candidate when template arguments follow
local function with_template(r, t)
  if peek(r) == "I" then
    local args = template_args(r)
    local names = {}
    for i, a in ipairs(args) do names[i] = a.name end
    t = add(r, { kind = "class", name = t.name .. "<" .. table.concat(names, ", ") .. ">" })
  end
  return t
end

local function extended_builtin(r) -- D...: _Float16, nullptr's type, _FloatN
  local two = peek(r, 2)
  if two == "Dh" then r.pos = r.pos + 2; return { kind = "builtin", name = "_Float16" } end
  if two == "Dn" then r.pos = r.pos + 2; return { kind = "builtin", name = "decltype(nullptr)" } end
  local bits = r.s:match("^DF(%d+)_", r.pos)
  if bits then r.pos = r.pos + 3 + #bits; return { kind = "builtin", name = "_Float" .. bits } end
  fail(r, "unsupported builtin type")
end

local function qualified(r) -- [rVK]+<type>: restrict, volatile, const
  local q = r.s:match("^[rVK]+", r.pos)
  r.pos = r.pos + #q
  local inner = parse_type(r)
  local words = {}
  if q:find("K") then words[#words + 1] = "const" end
  if q:find("V") then words[#words + 1] = "volatile" end
  local w = table.concat(words, " ")
  -- C spelling: a qualified pointer takes the qualifier after the star
  local name = inner.kind == "ptr" and (inner.name .. " " .. w) or (w .. " " .. inner.name)
  return add(r, { kind = "qual", const = q:find("K") ~= nil, inner = inner, name = name })
end

local function pointer(r, c) -- P: pointer, R and O: references
  r.pos = r.pos + 1
  local inner = parse_type(r)
  return add(r, { kind = c == "P" and "ptr" or "ref", inner = inner,
                  name = inner.name .. (c == "P" and "*" or "&") })
end

local function nested(r) -- N<prefix...>E: a name in namespaces or classes
  r.pos = r.pos + 1
  local parts = {}
  while peek(r) ~= "E" do
    if r.pos > #r.s then fail(r, "unterminated nested name") end
    if peek(r) == "S" then
      parts[#parts + 1] = parse_type(r).name
    else
      parts[#parts + 1] = source_name(r)
      add(r, { kind = "class", name = table.concat(parts, "::") })
      if peek(r) == "I" then
        local t = with_template(r, { name = table.concat(parts, "::") })
        parts = { t.name }
      end
    end
  end
  r.pos = r.pos + 1
  return { kind = "class", name = table.concat(parts, "::") }
end

local function substitution(r) -- St<name>, the std abbreviations, S<seq>_
  local nx = r.s:sub(r.pos + 1, r.pos + 1)
  if nx == "t" then
    r.pos = r.pos + 2
    local t = add(r, { kind = "class", name = "std::" .. source_name(r) })
    return with_template(r, t)
  end
  if std_abbrev[nx] then r.pos = r.pos + 2; return with_template(r, { kind = "class", name = std_abbrev[nx] }) end
  local seq = r.s:match("^S(%w*)_", r.pos) or fail(r, "bad substitution")
  r.pos = r.pos + #seq + 2
  local idx = seq == "" and 1 or tonumber(seq, 36) + 2
  local t = r.subs[idx] or fail(r, "substitution out of range")
  return with_template(r, t)
end

-- the types up to E (or the end of the name), with a lone void meaning none
local function param_list(r, till_end)
  local params = {}
  while (till_end and r.pos <= #r.s) or (not till_end and peek(r) ~= "E") do
    if not till_end and r.pos > #r.s then fail(r, "unterminated function type") end
    params[#params + 1] = parse_type(r)
  end
  if #params == 1 and params[1].name == "void" then params = {} end
  return params
end

local function function_type(r) -- F[Y]<ret><params>E
  r.pos = r.pos + 1
  if peek(r) == "Y" then r.pos = r.pos + 1 end
  local ret = parse_type(r)
  local params = param_list(r, false)
  r.pos = r.pos + 1
  return add(r, { kind = "function", ret = ret, params = params, name = "function" })
end

function parse_type(r)
  local c = peek(r)
  if builtin[c] then r.pos = r.pos + 1; return { kind = "builtin", name = builtin[c] } end
  if c == "D" then return extended_builtin(r) end
  if c == "r" or c == "V" or c == "K" then return qualified(r) end
  if c == "P" or c == "R" or c == "O" then return pointer(r, c) end
  if c:match("%d") then return with_template(r, add(r, { kind = "class", name = source_name(r) })) end
  if c == "N" then return nested(r) end
  if c == "S" then return substitution(r) end
  if c == "F" then return function_type(r) end
  fail(r, "unsupported type")
end

-- the parameter types of a probe's name; mode "function": of a plain mangled function name,
-- _Z<name><params>, as nvcc names C++ kernels
function M.demangle_params(s, mode)
  local r = { s = s, pos = 1, subs = {} }
  if s:sub(1, 2) ~= "_Z" then fail(r, "not a mangled name") end
  r.pos = 3
  if mode == "function" then
    if peek(r) == "N" then parse_type(r) else add(r, { kind = "class", name = source_name(r) }) end
    if peek(r) == "I" then fail(r, "a template function") end
    return param_list(r, true)
  end
  add(r, { kind = "class", name = source_name(r) }) -- the template name is substitution S_
  if peek(r) ~= "I" then fail(r, "expected template arguments") end
  local args = template_args(r)
  if not args[1] or args[1].kind ~= "function" then fail(r, "expected a function type") end
  return args[1].params
end

-- parameter types -> code letters (see src/kernel.c) and C spellings for messages
function M.param_codes(params)
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

-- the types of a C++ kernel from its mangled name, or nil where it cannot be read
function M.demangle_function(sym)
  local ok, params = pcall(M.demangle_params, sym, "function")
  return ok and params or nil
end

return M
