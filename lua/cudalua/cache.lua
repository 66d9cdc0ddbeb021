-- cudalua.cache: the compile cache. In the process, the same source and options give the same
-- module object; on disk (CUDALUA_CACHE_DIR, default ~/.cache/cudalua; CUDALUA_CACHE=0 turns it
-- off) a compiled image survives the process. The key holds everything that changes the binary:
-- source, options, extra headers, cudalua's own headers, architecture, NVRTC and cudalua
-- versions. Entries are written atomically (a temporary file renamed into place) and carry a
-- checksum: a corrupt or truncated entry is ignored and written again.
local core = ...
local system = require "cudalua.system"
local M = {}

local MAGIC = "cudalua-cache-3"
local memory, nmemory = {}, 0 -- modules stay while the process runs (at most 512 of them)
local warned = false
M.stats = { memory_hits = 0, disk_hits = 0, misses = 0, writes = 0 }

local function dir()
  local v = os.getenv("CUDALUA_CACHE")
  if v == "0" or v == "false" or v == "off" then return nil end
  local d = os.getenv("CUDALUA_CACHE_DIR")
  if d and d ~= "" then return d end
  local home = os.getenv("HOME")
  if not home or home == "" then return nil end
  return home .. "/.cache/cudalua"
end
M.dir = dir

local function warn(msg)
  if warned then return end
  warned = true
  io.stderr:write("cudalua: warning: compile cache disabled: " .. msg .. "\n")
end

-- cudalua's own headers and versions, digested once
local fixed
local function fixed_part()
  if not fixed then
    -- build_id digests cudalua's Lua parts and kernel headers: a new cudalua, new keys
    local h = { MAGIC, core.build_id, system.nvrtc_identity() }
    fixed = core.hash(table.concat(h, "\0"))
  end
  return fixed
end

-- the key: every input that changes the binary, as one string
function M.key(parts)
  local buf = { fixed_part() }
  for _, p in ipairs(parts) do buf[#buf + 1] = p end
  for i, s in ipairs(buf) do buf[i] = #s .. ":" .. s end -- length-prefixed: no ambiguity
  return table.concat(buf)
end

function M.get_memory(key)
  local m = memory[key]
  if m then M.stats.memory_hits = M.stats.memory_hits + 1 end
  return m
end

function M.put_memory(key, mod)
  if nmemory >= 512 then memory, nmemory = {}, 0 end
  if not memory[key] then nmemory = nmemory + 1 end
  memory[key] = mod
end

-- entry = {image=, kind= ("cubin", "ptx", "ltoir"), ptx= (a cubin's PTX or nil),
--          relocatable=, arch= ("sm_90"), log=, info={expr={symbol=, codes=, types=, error=}}}
local function encode(hash, e)
  local f = { MAGIC, hash, e.kind, e.relocatable and "1" or "0", e.arch or "", e.log or "" }
  local names = {}
  for expr in pairs(e.info) do names[#names + 1] = expr end
  table.sort(names)
  f[#f + 1] = tostring(#names)
  for _, expr in ipairs(names) do
    local i = e.info[expr]
    f[#f + 1] = expr
    f[#f + 1] = i.symbol or ""
    f[#f + 1] = i.codes or ""
    f[#f + 1] = i.error or ""
    f[#f + 1] = table.concat(i.types or {}, "\0")
  end
  f[#f + 1] = e.image
  f[#f + 1] = e.ptx or ""
  for i, s in ipairs(f) do f[i] = #s .. ":" .. s end
  local body = table.concat(f)
  return body .. core.hash(body)
end

local function decode(hash, data)
  if #data < 33 then return nil end
  local body, sum = data:sub(1, -33), data:sub(-32)
  if core.hash(body) ~= sum then return nil end
  local pos, fields = 1, {}
  while pos <= #body do
    local len, colon = body:match("^(%d+)():", pos)
    if not len then return nil end
    len = tonumber(len)
    fields[#fields + 1] = body:sub(colon + 1, colon + len)
    pos = colon + 1 + len
  end
  if fields[1] ~= MAGIC or fields[2] ~= hash then return nil end
  local e = { kind = fields[3], relocatable = fields[4] == "1", arch = fields[5] ~= "" and fields[5] or nil,
              log = fields[6], info = {} }
  local n, at = tonumber(fields[7]), 8
  if not n then return nil end
  for _ = 1, n do
    local expr, sym, codes, err, types = table.unpack(fields, at, at + 4)
    if not types then return nil end
    local t = {}
    if types ~= "" then for s in (types .. "\0"):gmatch("(.-)%z") do t[#t + 1] = s end end
    -- a kernel without parameters has codes "": only an error entry has no codes
    e.info[expr] = { symbol = sym, codes = err == "" and codes or nil,
                     error = err ~= "" and err or nil, types = t }
    at = at + 5
  end
  e.image = fields[at]
  e.ptx = fields[at + 1] ~= "" and fields[at + 1] or nil
  if not e.image or not fields[at + 1] or fields[at + 2] then return nil end
  return e
end

function M.get_disk(key)
  local d = dir()
  if not d then return nil end
  local hash = core.hash(key)
  local f = io.open(d .. "/" .. hash .. ".entry", "rb")
  if not f then return nil end
  local data = f:read("a")
  f:close()
  local e = data and decode(hash, data)
  if e then M.stats.disk_hits = M.stats.disk_hits + 1 end
  return e
end

function M.put_disk(key, e)
  local d = dir()
  if not d then return end
  local ok, err = core.mkdir_p(d)
  if not ok then return warn(err) end
  local hash = core.hash(key)
  local final = d .. "/" .. hash .. ".entry"
  local tmp = ("%s/.tmp-%s-%x"):format(d, hash, math.random(0, 0x7fffffff))
  local f, ferr = io.open(tmp, "wb")
  if not f then return warn(ferr) end
  local wok, werr = f:write(encode(hash, e))
  local cok = f:close()
  if not wok or not cok then os.remove(tmp); return warn(werr or "cannot write " .. tmp) end
  local rok, rerr = os.rename(tmp, final)
  if not rok then os.remove(tmp); return warn(rerr) end
  M.stats.writes = M.stats.writes + 1
end

M.encode, M.decode = encode, decode
return M
