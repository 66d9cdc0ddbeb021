-- tools/layers.lua CL_H OBJ...: checks that every C file calls only downward. The layers are
-- the "layers:" lines at the top of src/cl.h, bottom first; a file may use what the files
-- before it define (functions and variables, read from the object files with nm), never what
-- a file after it defines, except the uses listed there on "allow: FILE SYMBOL" lines.
-- Prints each upward use (LAYERS_VERBOSE=1: every pair of files with what one uses of the
-- other); exits 1 if there is any, or if an object's file is missing from the list.
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
print(("layers: %d files in %d layers, %d calls between files, %d upward"):format(#files, #order, #list, #upward))
os.exit(bad == 0 and 0 or 1)
