-- cudalua.probe: the kernels a compile looks up, and what NVRTC says of them. Each kernel found
-- in the source and each of the user's name expressions gets a probe instantiation
-- __cudalua_sig<decltype(kernel)>, whose mangled name spells the kernel's parameter types
-- (cudalua.signature reads it): the types come from the compiler, not from signature strings.
local modules = require "cudalua.module"
local signature = require "cudalua.signature"
local M = {}

local PROBE = modules.PROBE
-- appended to every source: the template the probes instantiate
M.SOURCE = '\n#line 1 "cudalua-probe"\ntemplate<typename T> __global__ void ' .. PROBE .. '() {}\n'

local function probe_of(expr) return PROBE .. "<decltype(" .. expr .. ")>" end

---------------------------------------------------------------------------------------------
-- finding the kernels in a source: names of non-template __global__ functions
local skip_attr = { __launch_bounds__ = true, __maxnreg__ = true, __cluster_dims__ = true,
  __noinline__ = true, __forceinline__ = true, static = true, inline = true, void = true,
  __attribute__ = true, __declspec = true }

-- a template kernel (template<...> before __global__ in the same declaration) is reached
-- through name expressions instead
local function in_template(code, at)
  local before = code:sub(1, at - 1)
  local decl_start = math.max((before:match(".*()[;}{]") or 0), 0)
  return before:sub(decl_start):find("template%s*<") ~= nil
end

-- where the parenthesised arguments that open at pos end
local function after_parens(code, pos)
  local depth, i = 0, pos
  repeat
    local ch = code:sub(i, i)
    if ch == "(" then depth = depth + 1 elseif ch == ")" then depth = depth - 1 end
    i = i + 1
  until depth == 0 or i > #code
  return i
end

-- the kernel's name in what follows __global__: the first word before "(" that is no attribute
local function declared_name(code, pos)
  while true do
    local ident, after = code:match("^%s*([%a_][%w_]*)%s*()", pos)
    if not ident then return nil end
    if code:sub(after, after) ~= "(" then pos = after
    elseif skip_attr[ident] then pos = after_parens(code, after)
    else return ident end
  end
end

function M.find_kernels(src)
  local names, seen = {}, {}
  local code = modules.strip_comments(src)
  local from = 1
  while true do
    local s, e = code:find("__global__", from, true)
    if not s then break end
    from = e + 1
    local name = not in_template(code, s) and declared_name(code, e + 1)
    if name and not seen[name] then names[#names + 1] = name; seen[name] = true end
  end
  return names
end

---------------------------------------------------------------------------------------------
-- the name expressions NVRTC lowers for a list of kernels: each, and its probe
function M.expressions(list)
  local ex = {}
  for _, e in ipairs(list) do ex[#ex + 1] = e; ex[#ex + 1] = probe_of(e) end
  return ex
end

-- the kernels to look up: the given scanned ones, then the user's name expressions (the list
-- M.compile's first run takes: cuda.compile_all starts that run ahead)
local function with_user(kernels, user)
  local w = {}
  for _, k in ipairs(kernels) do w[#w + 1] = k end
  for _, e in ipairs(user or {}) do w[#w + 1] = e end
  return w
end
M.first_list = with_user

-- did a run fail on the probe of a scanned kernel (overloaded, in a namespace, ...)? A run
-- that says which expressions it failed on (r.rejected: the CPU device's compiler) did when it
-- names a scanned one and none of the user's (those fail the compile, as NVRTC's do)
local function probe_failed(r, found, user)
  if r.image or #found == 0 then return false end
  if not r.rejected then return r.log:find(PROBE, 1, true) ~= nil end
  for _, e in ipairs(user or {}) do if r.rejected[e] then return false end end
  return next(r.rejected) ~= nil
end

-- the scanned kernels a failed run's log does not name, and whether it named any
local function unnamed_in(r, found)
  local keep, dropped = {}, false
  for _, k in ipairs(found) do
    local pat = "decltype ( " .. k .. " )"
    local named = r.rejected and r.rejected[k] or
      not r.rejected and (r.log:find(pat, 1, true) or r.log:find('was: " ' .. k .. ' "', 1, true))
    if named then dropped = true else keep[#keep + 1] = k end
  end
  return keep, dropped
end

-- the run that looks up the scanned kernels found and the user's name expressions, through
-- attempt(list) (one NVRTC run: {image=, log=, lowered=, ptx=, wanted = list}). A kernel
-- found that cannot be probed fails the whole run: it runs again without the kernels the log
-- names, then without any scanned one (those left out are still listed from the PTX)
function M.compile(attempt, found, user)
  local r = attempt(with_user(found, user))
  if probe_failed(r, found, user) then
    local keep, dropped = unnamed_in(r, found)
    if dropped then
      local r2 = attempt(with_user(keep, user))
      if r2.image or r2.rejected then r = r2 end
    end
  end
  if probe_failed(r, found, user) then r = attempt(with_user({}, user)) end
  return r
end

---------------------------------------------------------------------------------------------
-- each kernel looked up: its symbol, and its parameters' codes and C types (or why a
-- parameter cannot be passed)
local function probed(wanted, lowered)
  local info = {}
  for _, e in ipairs(wanted) do
    local sym, sig = lowered[e], lowered[probe_of(e)]
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
  return info
end

-- what a successful run r says of its kernels, by name expression; kernels no scan or name
-- expression names (made by a macro, in a namespace, overloaded) from the PTX listing, by
-- symbol, with the types of its .param lines
function M.kernel_info(r, listing)
  local info = probed(r.wanted, r.lowered)
  if listing then
    local named = {}
    for _, en in pairs(info) do named[en.symbol] = true end
    for sym, en in pairs(modules.ptx_entries(listing)) do
      if not named[sym] and not info[sym] then info[sym] = en end
    end
  end
  return info
end

return M
