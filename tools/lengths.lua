-- tools/lengths.lua FILE...: lists the functions of C and Lua files longer than 80 lines that
-- have no comment saying why (a comment just above the function with "long:" in it, then the
-- reason: a word such as "long long" in a comment is not one);
-- exits 1 if there is any. A long function is a place a newcomer gets lost in, so each one
-- either gets split into named steps or says why it is better whole. `make lengths` runs it
-- over src/ and lua/; CI runs it.
--
-- C: a definition starts at column 0 with "name(...) {" on one line and ends at a "}" in
-- column 0 (the style of src/). Lua: "function x(" or "local function x(" or "x = function("
-- at any depth, ending at the "end" with the same indentation.
local LIMIT = 80

-- does the comment block just above line i (lines[i - 1], upward) say "long"?
local function says_why(lines, i, comment)
  local j = i - 1
  while j >= 1 and lines[j]:match(comment) do
    if lines[j]:lower():find("long:", 1, true) then return true end
    j = j - 1
  end
  return false
end

local function c_functions(lines, report)
  local start, name
  for n, line in ipairs(lines) do
    if not start and line:match("^[%a_][%w_ %*]*[%s%*][%a_][%w_]*%(.*%)%s*{%s*$") then
      start, name = n, line:match("([%a_][%w_]*)%(")
    elseif start and line:match("^}") then
      -- C comments above a definition: lines of a /* */ block
      if n - start + 1 > LIMIT and not says_why(lines, start, "^%s*/?%*") then report(start, name, n - start + 1) end
      start = nil
    end
  end
end

local function lua_functions(lines, report)
  local open = {}
  for n, line in ipairs(lines) do
    local ind, rest = line:match("^(%s*)(.*)$")
    local name = rest:match("^local function ([%w_.:]+)") or rest:match("^function ([%w_.:]+)")
      or (rest:match("^[%w_.]+%s*=%s*function") and rest:match("^([%w_.]+)"))
    if name then
      -- one that ends on its own line ("local function K(n) return m[n] end") opens nothing
      if not rest:gsub("%s*%-%-.*$", ""):match("%f[%w_]end[%s%),]*$") then open[#open + 1] = { ind = #ind, start = n, name = name } end
    elseif rest == "end" or rest:match("^end[%s%),]") then
      local top = open[#open]
      if top and top.ind == #ind then
        open[#open] = nil
        if n - top.start + 1 > LIMIT and not says_why(lines, top.start, "^%s*%-%-") then
          report(top.start, top.name, n - top.start + 1)
        end
      end
    end
  end
end

local bad = 0
for _, file in ipairs(arg) do
  local lines = {}
  for line in io.lines(file) do lines[#lines + 1] = line end
  local function report(line, name, count)
    print(("%s:%d: %s is %d lines (over %d) with no comment above it saying why"):format(file, line, name, count, LIMIT))
    bad = bad + 1
  end
  if file:match("%.c$") then c_functions(lines, report) else lua_functions(lines, report) end
end
print(("lengths: %d files, %d functions over %d lines without a reason"):format(#arg, bad, LIMIT))
os.exit(bad == 0 and 0 or 1)
