-- cudalua.headers: the headers a runtime compile sees. The toolkit's (include/ and CCCL in
-- include/cccl), stand-ins for the standard headers NVRTC lacks, <cub/cub.cuh> without its
-- host-side parts, and the user's own header files, read so that the compile cache sees them.
local core = ...
local M = {}

---------------------------------------------------------------------------------------------
-- the toolkit's headers: <cuda_fp16.h> and friends in include/, CCCL (CUB, libcu++, Thrust)
-- in include/cccl. Looked for under CUDA_HOME, CUDA_PATH, CUDA_DIR, next to the NVRTC library
-- in use, then /usr/local/cuda.
local toolkit
local function toolkit_includes()
  if toolkit then return toolkit end
  toolkit = {}
  local nvpath = core.nvrtc_identity():match("^(.*):%d+:%d+$")
  local cands = { os.getenv("CUDA_HOME"), os.getenv("CUDA_PATH"), os.getenv("CUDA_DIR"),
                  nvpath and nvpath:match("^(.*)/lib[^/]*/[^/]*$"),
                  nvpath and nvpath:match("^(.*)/lib[^/]*/[^/]*/[^/]*$"), "/usr/local/cuda" }
  for i = 1, 6 do
    local base = cands[i]
    if base and base ~= "" and core.file_info(base .. "/include/cuda_fp16.h") then
      toolkit.include = base .. "/include"
      if core.file_info(base .. "/include/cccl/cuda/std/version") then toolkit.cccl = base .. "/include/cccl" end
      break
    end
  end
  return toolkit
end
M.toolkit_includes = toolkit_includes

-- NVRTC has no standard library headers: these names stand for libcu++'s counterparts (see
-- kernels/cudalua/nvrtc/std.h), so kernels written for nvcc compile unchanged
local STD = {
  cstdint = "cstdint", ["stdint.h"] = "cstdint", climits = "climits", ["limits.h"] = "climits",
  cfloat = "cfloat", ["float.h"] = "cfloat", cmath = "cmath", ["math.h"] = "cmath",
  cstddef = "cstddef", ["stddef.h"] = "cstddef", cstdlib = "cstdlib", ["stdlib.h"] = "cstdlib",
  cstring = "cstring", ["string.h"] = "cstring", cassert = "cassert", ["assert.h"] = "cassert",
  cstdio = "cstddef", ["stdio.h"] = "cstddef", ctime = "ctime", ["time.h"] = "ctime",
  cstdbool = "cstddef", ["stdbool.h"] = "cstddef", new = "cstddef", initializer_list = "cstddef",
  type_traits = "type_traits", utility = "utility", limits = "limits", array = "array",
  tuple = "tuple", complex = "complex", functional = "functional", algorithm = "functional",
  bit = "bit", numeric = "numeric", optional = "optional", variant = "variant", span = "span",
  mdspan = "mdspan", atomic = "atomic", barrier = "barrier", latch = "latch",
  semaphore = "semaphore", iterator = "iterator", memory = "memory", chrono = "chrono",
  ratio = "ratio", concepts = "concepts", expected = "expected", numbers = "numbers",
  bitset = "bitset", ranges = "ranges", source_location = "source_location", version = "version",
}
local STD_EXTRA = { cfloat = "cudalua/nvrtc/cfloat.h", cmath = "cudalua/nvrtc/cmath.h" }
M.std = STD

-- the in-memory headers every compile gets: cudalua's own, the standard-header stand-ins
-- and, with CCCL, <cub/cub.cuh> without its host-side parts (device-wide algorithms and the
-- caching allocator are host code, which NVRTC cannot compile)
local shipped
local function shipped_headers()
  if shipped then return shipped end
  shipped = {}
  for _, h in ipairs(core.headers) do shipped[#shipped + 1] = h end
  local names = {}
  for name in pairs(STD) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local to = STD[name]
    local text = ("#pragma once\n#include <cuda/std/%s>\n#include <cudalua/nvrtc/std.h>\n"):format(to)
    if STD_EXTRA[to] then text = text .. "#include <" .. STD_EXTRA[to] .. ">\n" end
    shipped[#shipped + 1] = { name, text }
  end
  local cccl = toolkit_includes().cccl
  local f = cccl and io.open(cccl .. "/cub/cub.cuh")
  if f then
    local umbrella = f:read("a"):gsub("\n#include <cub/device/[^\n]*", "\n"):gsub("\n#include <cub/util_allocator.cuh>", "\n")
    f:close()
    shipped[#shipped + 1] = { "cub/cub.cuh", "// cudalua: CUB's umbrella header without its host-side parts\n" .. umbrella }
  end
  return shipped
end

---------------------------------------------------------------------------------------------
-- the user's own header files a source includes (quoted includes next to the including file,
-- and anything in opts.include_dirs), read so that their text is part of the cache key: an
-- edited header compiles again. Toolkit headers are covered by the NVRTC library's identity.
-- Returns the files as "path\0text" pieces, or nil when an include is computed by a macro.
local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end

local function user_headers(src, name, include_dirs)
  if not src:find("#%s*include") then return "" end
  local parts, seen = {}, {}
  local function find(file, dir, quoted)
    if file:sub(1, 1) == "/" then return core.file_info(file) and file or nil end
    if quoted then
      local p = dir .. "/" .. file
      if core.file_info(p) then return p end
    end
    for _, d in ipairs(include_dirs) do
      local p = d .. "/" .. file
      if core.file_info(p) then return p end
    end
  end
  local function scan(text, dir)
    for line in text:gmatch("[^\n]+") do
      local rest = line:match("^%s*#%s*include%s*(.*)")
      if rest then
        local q, a = rest:match('^"([^"]+)"'), rest:match("^<([^>]+)>")
        if not q and not a then return false end -- #include MACRO
        local path = find(q or a, dir, q ~= nil)
        if path and not seen[path] then
          seen[path] = true
          local f = io.open(path, "rb")
          local body = f and f:read("a")
          if f then f:close() end
          if body then
            parts[#parts + 1] = path .. "\0" .. body
            if scan(body, dirname(path)) == false then return false end
          end
        end
      end
    end
  end
  if scan(src, dirname(name)) == false then return nil end
  return table.concat(parts, "\0")
end

M.shipped, M.user_files = shipped_headers, user_headers

return M
