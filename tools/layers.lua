-- tools/layers.lua CL_H OBJ...: checks that every C file calls only downward. The layers are
-- the "layers:" lines at the top of src/cl.h, bottom first; a file may use what the files
-- before it define (functions and variables, read from the object files with nm), never what
-- a file after it defines, except the uses listed there on "allow: FILE SYMBOL" lines.
-- Also checks src/cl.h's headings: each function and variable declared there sits under a
-- "/* ---- from X.c: ... ---- */" heading naming the file that defines it, in layer order.
-- Prints each upward use (LAYERS_VERBOSE=1: every pair of files with what one uses of the
-- other) and each misplaced declaration; exits 1 if there is any, or if an object's file is
-- missing from the list.
-- `make layers` runs it; CI runs it after the build.
local clh = assert(arg[1], "usage: lua tools/layers.lua src/cl.h build/*.o")

local order, rank, allowed = {}, {}, {}
local reading = false
for line in io.lines(clh) do
  local from, sym = line:match("^%s*allow: ([%w_]+) ([%w_]+)")
  if from then allowed[from .. " " .. sym] = true end
  local rest = line:match("^%s*layers:(.*)") or (reading and line:match("^%s+([%w_ ]+)$"))
  reading = rest ~= nil
  for name in (rest or ""):gmatch("[%w_]+") do
    order[#order + 1] = name
    rank[name] = #order
  end
end
assert(#order > 0, clh .. ": no 'layers:' lines")

local function nm(flags, obj)
  local p = assert(io.popen(("nm %s %q"):format(flags, obj)))
  local out = p:read("a")
  p:close()
  return out
end

local defined, uses, files = {}, {}, {}
for i = 2, #arg do
  local file = arg[i]:match("([%w_]+)%.o$")
  files[#files + 1] = file
  for kind, sym in nm("-g --defined-only", arg[i]):gmatch("%x+ (%u) ([%w_]+)") do
    if kind ~= "U" then defined[sym] = file end
  end
  uses[file] = {}
  for sym in nm("-u", arg[i]):gmatch("U ([%w_]+)") do uses[file][#uses[file] + 1] = sym end
end

local bad = 0
for _, f in ipairs(files) do
  if not rank[f] then
    print(("layers: %s.c is not in the layers of %s"):format(f, clh))
    bad = bad + 1
  end
end

-- pairs of files, in layer order, with the symbols one uses of the other
local pairs_seen, upward = {}, {}
for _, f in ipairs(files) do
  for _, sym in ipairs(uses[f]) do
    local to = defined[sym]
    if to and to ~= f then
      local key = f .. " -> " .. to
      pairs_seen[key] = pairs_seen[key] or { from = f, to = to, syms = {} }
      table.insert(pairs_seen[key].syms, sym)
      if rank[f] and rank[to] and rank[to] > rank[f] and not allowed[f .. " " .. sym] then
        upward[#upward + 1] = ("%s uses %s of %s"):format(f, sym, to)
      end
    end
  end
end
local list = {}
for _, p in pairs(pairs_seen) do list[#list + 1] = p end
table.sort(list, function(a, b)
  local ra, rb = rank[a.from] or 0, rank[b.from] or 0
  if ra ~= rb then return ra < rb end
  return (rank[a.to] or 0) < (rank[b.to] or 0)
end)
if os.getenv("LAYERS_VERBOSE") then
  for _, p in ipairs(list) do
    table.sort(p.syms)
    print(("%-10s -> %-10s %s"):format(p.from, p.to, table.concat(p.syms, " ")))
  end
end
table.sort(upward)
for _, u in ipairs(upward) do print("layers: upward: " .. u) end
bad = bad + #upward

-- cl.h's headings: each function and variable it declares (outside braces and #defines) sits
-- under a "/* ---- from X.c: ... ---- */" heading naming the file whose object defines it, and
-- the headings' files follow the layers
local misplaced, heading, last, depth, stmt, comment, macro = 0, nil, 0, 0, {}, false, false
local function declared(st, lineno)
  local name = st:match("([%w_]+)%s*%(") or st:match("([%w_]+)%s*%b[]%s*$") or st:match("([%w_]+)%s*$")
  local from = heading and heading:match("^from ([%w_]+)%.c")
  if name and defined[name] and defined[name] ~= from then
    print(("layers: %s:%d: %s (%s.c) is under the heading %q"):format(clh, lineno, name, defined[name],
                                                                   heading or "(none)"))
    misplaced = misplaced + 1
  end
end
local lineno = 0
for line in io.lines(clh) do
  lineno = lineno + 1
  local h = line:match("^/%* %-%-%-%- (.-) %-%-%-%- %*/")
  if h then
    heading = h
    local f = h:match("^from ([%w_]+)%.c")
    if not (f and rank[f] and rank[f] >= last) then
      print(("layers: %s:%d: the heading %q does not follow the layers"):format(clh, lineno, h))
      misplaced = misplaced + 1
    end
    last = f and rank[f] or last
  end
  local in_macro = macro or line:match("^%s*#") ~= nil
  macro = in_macro and line:match("\\%s*$") ~= nil
  local code = ""
  while line ~= "" and not in_macro do   -- the line without its comments
    local at = line:find(comment and "*/" or "/*", 1, true)
    if not comment then code = code .. line:sub(1, at and at - 1) end
    line = at and line:sub(at + 2) or ""
    comment = at and not comment or (not at and comment)
  end
  for c in code:gmatch(".") do
    if c == "{" or c == "}" then
      depth = depth + (c == "{" and 1 or -1)
      stmt = {}   -- a struct's or an inline function's body: no declaration of a defined symbol
    elseif depth == 0 and c == ";" then
      declared(table.concat(stmt), lineno)
      stmt = {}
    elseif depth == 0 then
      stmt[#stmt + 1] = c
    end
  end
  stmt[#stmt + 1] = " "
end
bad = bad + misplaced
print(("layers: %d files in %d layers, %d calls between files, %d upward, %d declarations under the wrong heading")
      :format(#files, #order, #list, #upward, misplaced))
os.exit(bad == 0 and 0 or 1)
