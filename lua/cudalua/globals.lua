-- cudalua.globals: the __constant__ and __device__ variables a source declares at namespace
-- scope, read for Module:get_global (their dtype and shape, and the name expression NVRTC
-- lowers to the symbol the driver knows). Only simple declarations are read
-- (`__constant__ float c[17];`, `__device__ int n;`, `__device__ double m[4][8];`, in
-- namespaces and extern "C" blocks); for anything else get_global asks for the dtype.
local M = {}

-- C types of variables and the dtypes they hold (words joined by one space)
local DTYPE = {
  float = "float32", double = "float64", bool = "bool", char = "int8", ["signed char"] = "int8",
  ["unsigned char"] = "uint8", short = "int16", ["short int"] = "int16", ["unsigned short"] = "uint16",
  ["unsigned short int"] = "uint16", int = "int32", ["signed int"] = "int32", signed = "int32",
  unsigned = "uint32", ["unsigned int"] = "uint32", long = "int64", ["long int"] = "int64",
  ["long long"] = "int64", ["long long int"] = "int64", ["unsigned long"] = "uint64",
  ["unsigned long int"] = "uint64", ["unsigned long long"] = "uint64",
  ["unsigned long long int"] = "uint64", size_t = "uint64", int8_t = "int8", uint8_t = "uint8",
  int16_t = "int16", uint16_t = "uint16", int32_t = "int32", uint32_t = "uint32",
  int64_t = "int64", uint64_t = "uint64", __half = "float16", half = "float16",
  __nv_bfloat16 = "bfloat16", nv_bfloat16 = "bfloat16",
}
M.DTYPE = DTYPE
-- words of a declaration that are not its type
local SKIP = { __device__ = true, __constant__ = true, __managed__ = true, static = true,
  const = true, volatile = true, extern = true, __restrict__ = true }

-- the namespace path at each "{" of code: a list per brace (a name, "" for extern "C" and
-- inline parts, false for anything else: a function body, a class, an initializer)
local function scopes(code)
  local opens, stack = {}, {}
  for pos, ch in code:gmatch("()([{}])") do
    if ch == "{" then
      local before = code:sub(math.max(1, pos - 200), pos - 1)
      local ns = before:match("namespace%s+([%a_][%w_:]*)%s*$")
      local plain = before:match('extern%s*"C"%s*$') or before:match("namespace%s*$")
      stack[#stack + 1] = ns or (plain and "") or false
    else
      stack[#stack] = nil
    end
    local copy = {}
    for i, s in ipairs(stack) do copy[i] = s end
    opens[#opens + 1] = { pos = pos, stack = copy }
  end
  return opens
end

-- the namespace of position pos ("" for the global one), or nil inside a body
local function namespace_at(opens, pos)
  local stack = {}
  for _, o in ipairs(opens) do
    if o.pos > pos then break end
    stack = o.stack
  end
  local names = {}
  for _, s in ipairs(stack) do
    if s == false then return nil end
    if s ~= "" then names[#names + 1] = s end
  end
  return table.concat(names, "::")
end

-- where the statement holding position s of code starts: after the ";", "{" or "}" before it
local function statement_start(code, s)
  local i = s - 1
  while i > 0 and not code:find("^[;{}]", i) do i = i - 1 end
  return i + 1
end

-- one declaration, from its first qualifier to its ";": {name=, ctype=, dims=} or nil when it
-- is not a variable; dims nil when an extent is not a number
local function declaration(stmt)
  stmt = stmt:gsub("=.*$", ""):gsub("%s+$", "")   -- (M.parse removed __align__(n))
  if stmt:find("[(,<]") then return nil end   -- functions, several declarators, templates
  local at = stmt:find("[", 1, true) or #stmt + 1
  local head, name = stmt:sub(1, at - 1):match("^(.-)([%a_][%w_]*)%s*$")
  local ext = stmt:sub(at)
  if not name or not ext:match("^[%[%]%w_%s%*%+%-/]*$") then return nil end
  if head:find("[*&]") then return nil end   -- a pointer (or reference): not its pointee's type
  local words = {}
  for w in head:gmatch("[%w_:]+") do
    w = w:gsub("^::", ""):gsub("^std::", "")
    if not SKIP[w] then words[#words + 1] = w end
  end
  local dims = {}
  for e in ext:gmatch("%[([^%]]*)%]") do dims[#dims + 1] = tonumber(e) or false end
  for _, d in ipairs(dims) do if not d or math.type(d) ~= "integer" then dims = nil; break end end
  if dims and #dims == 0 then dims = { 1 } end
  return { name = name, ctype = table.concat(words, " "), dims = dims }
end

-- the variables of code (comments stripped): {[name] = {expr=, dtype=, dims=}}, name as the
-- user writes it ("ns::c" in a namespace); expr is the name expression NVRTC lowers
function M.parse(code)
  local found = {}
  if not (code:find("__constant__", 1, true) or code:find("__device__", 1, true)) then return found end
  code = code:gsub("__align__%s*%b()", " ")   -- (its parentheses would read as a function's)
  local opens = scopes(code)
  for _, kw in ipairs { "__constant__", "__device__" } do
    for s, stmt, term in code:gmatch("()" .. kw .. "([^;{}()]*)([;{(])") do
      local ends = term == ";" or (term == "{" and stmt:find("=", 1, true))   -- {initializer}
      -- a template variable has no one symbol: what its statement starts with is skipped
      -- (read back to the statement's start, for declarations only)
      if ends and code:sub(statement_start(code, s), s - 1):find("template", 1, true) then ends = false end
      local ns = ends and namespace_at(opens, s)
      local d = ns and declaration(stmt)
      if d then
        local full = ns == "" and d.name or ns .. "::" .. d.name
        found[full] = { expr = "&" .. full, dtype = DTYPE[d.ctype], dims = d.dims, ctype = d.ctype }
      end
    end
  end
  return found
end

-- the info entries (key "@" .. name) that carry what parse found and NVRTC lowered through
-- the compile cache; lowered: {expression = symbol}
local function entry(symbol, dtype, dims)
  return { symbol = symbol, codes = "", types = { dtype or "", dims and table.concat(dims, "x") or "" } }
end

function M.to_info(found, lowered, info)
  for name, g in pairs(found) do info["@" .. name] = entry(lowered[g.expr] or name, g.dtype, g.dims) end
end

-- a module's variables ({name = {symbol=, dtype=, dims=}}, from_info's) back into info entries
-- (cuda.link's info, made from its inputs')
function M.put_back(vars, info)
  for name, g in pairs(vars) do info["@" .. name] = info["@" .. name] or entry(g.symbol, g.dtype, g.dims) end
end

-- a module's info split: its kernels, and its variables {name = {symbol=, dtype=, dims=}}
function M.from_info(info)
  local kernels, vars = {}, {}
  for k, e in pairs(info) do
    if k:sub(1, 1) == "@" then
      local dims
      if (e.types[2] or "") ~= "" then
        dims = {}
        for d in e.types[2]:gmatch("%d+") do dims[#dims + 1] = math.tointeger(tonumber(d)) end
      end
      vars[k:sub(2)] = { symbol = e.symbol, dtype = e.types[1] ~= "" and e.types[1] or nil, dims = dims }
    else
      kernels[k] = e
    end
  end
  return kernels, vars
end

return M
