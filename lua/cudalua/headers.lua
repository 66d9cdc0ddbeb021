-- cudalua.headers: the headers a runtime compile sees. The toolkit's (include/ and CCCL in
-- include/cccl), stand-ins for the standard headers NVRTC lacks, <cub/cub.cuh> without its
-- host-side parts, and the user's own header files, read so that the compile cache sees them.
local core = ...
local system = require "cudalua.system"
local M = {}

---------------------------------------------------------------------------------------------
-- the toolkit's headers: <cuda_fp16.h> and friends in include/, CCCL (CUB, libcu++, Thrust)
-- in include/cccl. Looked for under CUDA_HOME, CUDA_PATH, CUDA_DIR, next to the NVRTC library
-- in use, then /usr/local/cuda.
local toolkit
local function toolkit_includes()
  if toolkit then return toolkit end
  toolkit = {}
  local nvpath = system.nvrtc_identity():match("^(.*):%d+:%d+$")
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
  -- what identifies these headers in the compile cache's key: they need not be the NVRTC
  -- library's own toolkit
  local id = { toolkit.include or "no toolkit headers" }
  for _, f in ipairs { "/cuda_fp16.h", "/cccl/cuda/std/version" } do
    local size, mtime = core.file_info((toolkit.include or "") .. f)
    id[#id + 1] = tostring(size) .. ":" .. tostring(mtime)
  end
  toolkit.id = table.concat(id, " ")
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
  -- <cuda_profiler_api.h> declares only host functions (cudaProfilerStart/Stop), which NVRTC
  -- refuses: kernels written for nvcc include it for the host part of their file
  shipped[#shipped + 1] = { "cuda_profiler_api.h", "#pragma once\n// cudalua: host functions only, left out\n" }
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
-- the user's own header files a source includes, read so that their text is part of the cache
-- key (as a digest): an edited header compiles again. Searched as NVRTC does: the in-memory headers, quoted
-- includes next to the including file, then the -I folders; anything under the toolkit's
-- folders is left out (the toolkit's identity is in the key). Returns the files as
-- "path\0digest" pieces, or nil when the set cannot be known (an include computed by a macro).
local MAX_FILES = 4096

-- a/./b, a//b and a/x/../b are the same file as a/b: one key piece each, and no endless walk
-- through include cycles that go up and down folders
local function normalize(path)
  local abs = path:sub(1, 1) == "/"
  local parts = {}
  for p in path:gmatch("[^/]+") do
    if p == ".." and #parts > 0 and parts[#parts] ~= ".." then parts[#parts] = nil
    elseif p ~= "." and not (p == ".." and abs) then parts[#parts + 1] = p end
  end
  local r = table.concat(parts, "/")
  return abs and "/" .. r or (r == "" and "." or r)
end

local function dirname(path) return path:match("^(.*)/[^/]*$") or "." end

-- the folders and forced includes that options given to NVRTC add
local function from_options(options)
  local dirs, roots = {}, {}
  local i = 1
  while options[i] do
    local o = options[i]
    local d = o:match("^%-I(.+)$") or o:match("^%-%-include%-path=(.+)$")
    local f = o:match("^%-%-pre%-include=(.+)$") or o:match("^%-include=(.+)$")
    if (o == "-I" or o == "--include-path") and options[i + 1] then d = options[i + 1]; i = i + 1 end
    if (o == "-include" or o == "--pre-include") and options[i + 1] then f = options[i + 1]; i = i + 1 end
    if d then dirs[#dirs + 1] = d end
    if f then roots[#roots + 1] = f end
    i = i + 1
  end
  return dirs, roots
end

-- a text's #include lines, read once for the cache key and for the way a cubin is made: list,
-- the files the lines name in order ({name =, quoted =}), up to one whose file a macro computes
-- (macro = true: nothing after it can be known); foreign, whether the text names a header
-- beyond cudalua's own anywhere on a line (a commented-out #include counts: the way a cubin
-- is made has always counted it)
function M.read_includes(text)
  local found = { list = {}, foreign = false }
  if not text:find("#%s*include") then return found end
  for line in text:gmatch("[^\n]+") do
    for name in line:gmatch("#%s*include%s*[<\"]([^>\"]+)") do
      if name:sub(1, 8) ~= "cudalua/" then found.foreign = true end
    end
    local rest = not found.macro and line:match("^%s*#%s*include%s*(.*)")
    if rest then
      local q, a = rest:match('^"([^"]+)"'), rest:match("^<([^>]+)>")
      if q or a then found.list[#found.list + 1] = { name = q or a, quoted = q ~= nil }
      else found.macro = true end
    end
  end
  return found
end

local warned
local function uncacheable(why)
  if not warned then
    warned = true
    io.stderr:write("cudalua: note: a source is compiled without the cache: " .. why .. "\n")
  end
  return nil
end

-- the user's headers a source includes (through options' -I folders, quoted includes next to
-- the including file, forced includes, in-memory headers mem), as paths and content hashes;
-- found: the source's read_includes
local function user_headers(found, name, options, mem)
  local opt_dirs, roots = from_options(options)
  if #found.list == 0 and not found.macro and #roots == 0 then return "" end
  local dirs = {}
  for _, d in ipairs(opt_dirs) do dirs[#dirs + 1] = normalize(d) end
  local tk = toolkit_includes()
  local function in_toolkit(path)
    for _, t in ipairs { tk.include, tk.cccl } do
      if t and path:sub(1, #t + 1) == t .. "/" then return true end
    end
  end
  local parts, seen, nfiles = {}, {}, 0
  local walk
  local function visit(path, text, dir)
    if seen[path] then return true end
    seen[path] = true
    nfiles = nfiles + 1
    if nfiles > MAX_FILES then return false end
    parts[#parts + 1] = path .. "\0" .. core.hash(text)
    return walk(M.read_includes(text), dir)
  end
  local function read(path)
    local f = io.open(path, "rb")
    local body = f and f:read("a")
    if f then f:close() end
    return body
  end
  local function file(p)
    p = normalize(p)
    if in_toolkit(p) or not core.file_info(p) then return nil end
    return p
  end
  -- visits what #include FILE (quoted or not) names from a file in dir
  local function include(name_, dir, quoted)
    if mem[name_] then return visit("<header " .. name_ .. ">", mem[name_], dir) end
    local p
    if name_:sub(1, 1) == "/" then p = file(name_)
    else
      if quoted then p = file(dir .. "/" .. name_) end
      for _, d in ipairs(dirs) do
        if p then break end
        p = file(d .. "/" .. name_)
      end
    end
    if not p then return true end  -- the toolkit's, cudalua's own, or not there (NVRTC says so)
    local body = read(p)
    if not body then return true end
    return visit(p, body, dirname(p))
  end
  function walk(included, dir)
    for _, inc in ipairs(included.list) do
      if not include(inc.name, dir, inc.quoted) then return false end
    end
    return not included.macro
  end
  local base = dirname(name)
  for _, r in ipairs(roots) do
    if not include(r, base, true) then return uncacheable("an include file could not be followed") end
  end
  if not walk(found, base) then
    return uncacheable(nfiles > MAX_FILES and ("it includes more than " .. MAX_FILES .. " files")
                       or "an #include is computed by a macro")
  end
  return table.concat(parts, "\0")
end

M.shipped, M.user_files = shipped_headers, user_headers

return M
