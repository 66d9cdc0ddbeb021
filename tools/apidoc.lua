-- tools/apidoc.lua IN OUT: writes the Markdown reference (docs/API.md) from the LDoc comments
-- of docs/api.lua, so that the HTML (make docs, LDoc) and the Markdown GitHub shows say the
-- same. Understands what docs/api.lua uses: a "---" summary line and "--" lines after it,
-- @section, @type, @table, @param, @return, @usage; then the function or field it documents.
local src, dst = assert(arg[1], "usage: apidoc.lua IN OUT"), assert(arg[2], "usage: apidoc.lua IN OUT")
local out = {}
local function emit(s) out[#out + 1] = s end

local block = nil   -- the comment lines collected for the next item

local function flush_item(item)
  if not block then return end
  local text, params, returns, usage, tag, tagname = {}, {}, {}, {}, nil, nil
  for _, l in ipairs(block) do
    local t, rest = l:match("^@(%w+)%s*(.*)$")
    if t == "section" or t == "type" or t == "table" or t == "module" then tag, tagname = t, rest
    elseif t == "param" then params[#params + 1] = rest
    elseif t == "return" then returns[#returns + 1] = rest
    elseif t == "usage" then usage[#usage + 1] = rest
    elseif not t then text[#text + 1] = l end
  end
  block = nil
  if tag == "module" then
    emit("# `" .. tagname .. "`: the API reference"); emit("")
    emit("<!-- written by tools/apidoc.lua from docs/api.lua (make docs): edit that file -->"); emit("")
    emit(table.concat(text, " ")); emit("")
    for _, u in ipairs(usage) do emit("```lua"); emit(u); emit("```"); emit("") end
    return
  elseif tag == "section" then
    emit("## " .. table.concat(text, " ")); emit("")
    return
  elseif tag == "type" or tag == "table" then
    local name = tag == "table" and ("cuda." .. tagname) or tagname
    emit("### " .. (tag == "type" and "type " or "") .. "`" .. name .. "`"); emit("")
    emit(table.concat(text, " ")); emit("")
    return
  end
  if not item then return end
  emit("#### `" .. item .. "`"); emit("")
  emit(table.concat(text, " ")); emit("")
  for _, p in ipairs(params) do
    local n, d = p:match("^(%S+)%s*(.*)$")
    emit("* `" .. n .. "`: " .. d)
  end
  for _, r in ipairs(returns) do emit("* returns " .. r) end
  if #params + #returns > 0 then emit("") end
end

for line in io.lines(src) do
  local first = line:match("^%-%-%-%s?(.*)$")
  local more = line:match("^%-%-%s?(.*)$")
  if first then
    flush_item(nil)
    block = { first }
  elseif more and block then
    block[#block + 1] = more
  elseif block then
    local fn = line:match("^function%s+([%w_.:]+%b())")
    local field = line:match("^([%w_.]+)%s*=")
    if fn then flush_item(fn)
    elseif field and not line:match("^local") then flush_item(field)
    else flush_item(nil) end
  end
end
flush_item(nil)
local f = assert(io.open(dst, "w"))
f:write((table.concat(out, "\n"):gsub("\n\n\n+", "\n\n")), "\n")
f:close()
