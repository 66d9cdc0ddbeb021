-- spec/cache_child.lua: run by 13-cache_spec.lua in a fresh process, so that the compile
-- cache's disk side is what serves it (the in-process cache of the spec runner would hide it).
--   CUDALUA_CACHE_DIR=... lua5.4 spec/cache_child.lua ARCH FILE [FILE ...]
-- compiles each FILE's text for ARCH (twice: the second one must come from the process), then
-- prints, for each file in order,
--   module I kernels=K1,K2,... log=BYTES same=true|false
--   refuse I NAME: MESSAGE          (for each kernel that cannot be used, e.g. a reference param)
-- and last
--   stats memory_hits=M disk_hits=D misses=X writes=W
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local cache = require "cudalua.cache"

local arch = assert(arg[1], "usage: cache_child.lua ARCH FILE...")
for i = 2, #arg do
  local f = assert(io.open(arg[i], "rb"))
  local src = f:read("a")
  f:close()
  local mod = cuda.compile(src, { arch = arch, name = "child.cu" })
  local again = cuda.compile(src, { arch = arch, name = "child.cu" })
  local names = mod:kernels()
  print(("module %d kernels=%s log=%d same=%s"):format(i - 1, table.concat(names, ","), #mod:log(),
    tostring(mod == again)))
  for _, name in ipairs(names) do
    local ok, err = pcall(mod.get, mod, name)
    -- without a GPU every kernel stops at the driver (and a GPU of another architecture
    -- cannot load it): only the other refusals are reported
    local e = tostring(err)
    if not ok and not e:find("no CUDA", 1, true) and not e:find("cannot load", 1, true) then
      print(("refuse %d %s: %s"):format(i - 1, name, e))
    end
  end
end
local s = cache.stats
print(("stats memory_hits=%d disk_hits=%d misses=%d writes=%d"):format(s.memory_hits, s.disk_hits,
  s.misses, s.writes))
