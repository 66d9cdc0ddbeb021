-- cudalua.check: the checks of arguments and option tables that the Lua parts share, so that
-- cuda.compile, cuda.link, cuda.load_module, cuda.reduce, cuda.elementwise and progress.watch
-- refuse the same mistakes with the same words. level: as error()'s, counted from the caller.
local M = {}

-- every error cudalua raises reads `cudalua: <public name>: <what is wrong>`, the public name
-- being what the user wrote (cuda.compile, progress.watch, module:get); as the C side's cl_error
-- (src/error.c). level: as error()'s, counted from the caller.
function M.error(where, level, fmt, ...)
  error(("cudalua: %s: " .. fmt):format(where, ...), level and level > 0 and level + 1 or level)
end

-- a message cudalua made (a library's "cudalua: no CUDA driver found", a nested call's
-- "cudalua: cuda.compile: ...") without its "cudalua: ", to follow another call's name
function M.cause(e) return (tostring(e):gsub("^cudalua: ", "")) end

-- a cudalua stream? (each caller says what it expected in its own words)
function M.is_stream(v)
  local mt = getmetatable(v)
  return type(mt) == "table" and rawget(mt, "__name") == "cudalua.stream"
end

-- raises for the option k, not one of names (a list, in the order the message gives them)
function M.unknown(k, names, where, level)
  M.error(where, level, "unknown option '%s' (%s)", tostring(k), table.concat(names, ", "))
end

-- every key of opts is one of names (a list)
function M.options(opts, names, where, level)
  for k in pairs(opts) do
    local known = false
    for i = 1, #names do
      if names[i] == k then known = true; break end
    end
    if not known then M.unknown(k, names, where, level + 1) end
  end
end

-- opts, or {} for nil; known maps each option to its Lua type
function M.table(opts, known, where, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then M.error(where, level, "opts must be a table, got %s", type(opts)) end
  for k, v in pairs(opts) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      M.unknown(k, names, where, level + 1)
    end
    if type(v) ~= known[k] then
      M.error(where, level, "opts.%s must be a %s, got %s", k, known[k], type(v))
    end
  end
  return opts
end

-- a list of strings and nothing else: a named key in it ({lineinfo = true} given as an option
-- string) would be lost without a word
function M.list(list, what, where, level)
  local n = #list
  for k in pairs(list) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      local key = type(k) == "string" and ("'" .. k .. "'") or tostring(k)
      M.error(where, level, "%s is a list; it has the key %s (an option for opts itself?)", what, key)
    end
  end
end

function M.strings(list, what, where, level)
  M.list(list, what, where, level + 1)
  for i = 1, #list do
    if type(list[i]) ~= "string" then M.error(where, level, "%s[%d] must be a string", what, i) end
  end
end

function M.arch(arch, where, level)
  if arch and not arch:match("^sm_%d+[af]?$") and not arch:match("^compute_%d+[af]?$") then
    M.error(where, level, "arch must look like \"sm_90\" or \"compute_90\", got %q", arch)
  end
end

return M
