-- cudalua.link: modules cuda.compile did not make. cuda.load_module takes a cubin, fatbin, PTX
-- or LTO-IR built elsewhere; cuda.link joins relocatable code, PTX, fatbins and LTO-IR into one
-- module with nvJitLink (src/link.c).
local core = ...
local modules = require "cudalua.module"
local globals = require "cudalua.globals"
local check = require "cudalua.check"
local system = require "cudalua.system"
local M = {}

-- cuda.load_module(path or bytes [, opts]): a cubin, fatbin, PTX or LTO-IR built elsewhere
local LOAD_OPTS = { name = "string", arch = "string" }

-- a static library (an ar archive: libcudadevrt.a, or one made with ar of -rdc cubins)
local ARCHIVE = "!<arch>\n"
local function is_archive(s) return s:sub(1, #ARCHIVE) == ARCHIVE end

-- whether an archive's member headers (60 bytes each, ending "`\n", the size in bytes 49-58,
-- data padded to an even length) run to its end: nvJitLink answers a damaged one with
-- "ERROR 1: library processing" and writes the reason to stderr itself
local function archive_intact(s)
  local pos = #ARCHIVE + 1
  while pos <= #s do
    if pos + 59 > #s or s:sub(pos + 58, pos + 59) ~= "`\n" then return false end
    local size = tonumber(s:sub(pos + 48, pos + 57):match("^%d+"))
    if not size then return false end
    pos = pos + 60 + size + size % 2
  end
  return pos <= #s + 2
end

-- the bytes of an image given as bytes or as a file's path, its kind and a name for it;
-- archives ("library") only where `archives` (cuda.link: load_module has nothing to load them as)
local function image_of(v, where, level, archives)
  if type(v) ~= "string" then check.error(where, level, "expected a path or the bytes of an image, got %s", type(v)) end
  local what = archives and "cubin, fatbin, PTX, LTO-IR image or static library" or "cubin, fatbin, PTX or LTO-IR image"
  local kind = modules.image_kind(v) or (is_archive(v) and "library")
  if kind == "library" and not archives then
    check.error(where, level, "a static library (ar archive) cannot be loaded: give it to cuda.link with the code that uses it")
  end
  if kind == "library" and not archive_intact(v) then
    check.error(where, level, "a damaged static library (its member headers do not fit in it)")
  end
  if kind then return v, kind, nil end
  if #v > 4096 or v:find("%z") or v:find("\n") then
    check.error(where, level, "not a %s (it starts with %q)", what, v:sub(1, 8))
  end
  local f, err = io.open(v, "rb")
  if not f then check.error(where, level, "cannot open %s", err) end
  local data = f:read("a")
  f:close()
  if not data then check.error(where, level, "cannot read %s", v) end
  kind = modules.image_kind(data) or (is_archive(data) and "library")
  if kind == "library" and not archives then
    check.error(where, level, "%s is a static library (ar archive), which cannot be loaded: give it to cuda.link "
      .. "with the code that uses it", v)
  end
  if not kind then
    check.error(where, level, "%s is not a %s (it starts with %q)", v, what, data:sub(1, 8))
  end
  if kind == "library" and not archive_intact(data) then
    check.error(where, level, "%s is a damaged static library (its member headers do not fit in it)", v)
  end
  return data, kind, v
end

-- LTO-IR is linked into a cubin by nvJitLink before it can be loaded. try: a failed link gives
-- nil, log, err back (link_with_devrt looks at the log) instead of raising
local function jitlink(inputs, arch, lto, extra, where, level, try)
  local have, why = system.jitlink_version()
  if not have then check.error(where, level, "%s", check.cause(why)) end
  local options = { "-arch=" .. arch }
  if lto then options[#options + 1] = "-lto" end
  for _, o in ipairs(extra or {}) do options[#options + 1] = o end
  local cubin, log, err = core.jitlink(inputs, options, false)
  if not cubin and not try then
    check.error(where, level, "linking failed (%s):\n%s", err, (log or ""):gsub("%s+$", ""))
  end
  return cubin, log, err
end

local function link_arch(arch, where, level)
  arch = arch or system.device_arch(level + 1, where)
  if arch:match("^compute_") then
    check.error(where, level, "linking needs an sm_ arch, got %s", arch)
  end
  return arch
end

function M.load_module(v, opts)
  opts = check.table(opts, LOAD_OPTS, "cuda.load_module", 3)
  check.arch(opts.arch, "cuda.load_module", 3)
  local data, kind, path = image_of(v, "cuda.load_module", 3)
  local name = opts.name or path or ("<" .. modules.holds[kind] .. ">")
  local f = { image = data, kind = kind, log = "", name = name, arch = opts.arch }
  if kind == "ltoir" then
    local arch = link_arch(opts.arch, "cuda.load_module", 3)
    local log
    f.image, log = jitlink({ { data, name } }, arch, true, nil, "cuda.load_module", 3)
    f.kind, f.log, f.arch = "cubin", log, arch
    f.link_image = data   -- cuda.link takes the LTO-IR, not the cubin made from it alone
  end
  if f.kind == "cubin" then
    local elf = modules.elf_info(f.image)
    if elf == false then check.error("cuda.load_module", 2, "%s is a damaged cubin (its ELF tables do not fit in it)", name) end
    if not elf or not elf.cuda then
      check.error("cuda.load_module", 2, "%s is an ELF file but not a CUDA cubin "
        .. "(a host object? build with nvcc -cubin or -fatbin)", name)
    end
    f.listed, f.relocatable, f.nparams = elf.kernels, elf.relocatable, elf.nparams   -- read once
  elseif f.kind == "ptx" then
    f.info = modules.ptx_entries(f.image)
    f.listed = {}
    for n in pairs(f.info) do f.listed[#f.listed + 1] = n end
    table.sort(f.listed)
  end
  return modules.new(f)
end

---------------------------------------------------------------------------------------------
-- The CUDA device runtime (libcudadevrt.a): code that launches kernels from the device
-- (dynamic parallelism, child<<<g, b>>>(...)) calls __cudaCDP2* functions that only this
-- static library defines. cuda.link adds it when the inputs need it, as nvcc -rdc=true does
-- when it links a program.

-- where it is looked for: CUDALUA_CUDADEVRT (the file itself), then next to the NVRTC library
-- in use (a toolkit's lib64, or a pip wheel's lib folder: nvidia/cu13/lib holds both; with
-- CUDA 12's wheels, nvidia/cuda_nvrtc/lib beside nvidia/cuda_runtime/lib), next to nvJitLink,
-- CUDA_HOME, CUDA_PATH, CUDA_DIR and /usr/local/cuda (each's lib64 and lib)
local DEVRT = "libcudadevrt.a"
local function devrt_dirs()
  local dirs, seen = {}, {}
  local function add(d)
    if d and d ~= "" and not seen[d] then seen[d] = true; dirs[#dirs + 1] = d end
  end
  local nvrtc = system.nvrtc_identity():match("^(.*):%d+:%d+$")
  local nvdir = nvrtc and nvrtc:match("^(.*)/[^/]*$")
  add(nvdir)
  add(nvdir and nvdir:match("^(.*)/cuda_nvrtc/lib$") and nvdir:gsub("/cuda_nvrtc/lib$", "/cuda_runtime/lib"))
  add((select(3, system.jitlink_version()) or ""):match("^(.*)/[^/]*$"))
  for _, env in ipairs { "CUDA_HOME", "CUDA_PATH", "CUDA_DIR" } do
    local base = os.getenv(env)
    if base and base ~= "" then add(base .. "/lib64"); add(base .. "/lib") end
  end
  add("/usr/local/cuda/lib64")
  return dirs
end

-- the library's bytes and path, read once a process; raises naming where it looked
local devrt
local function device_runtime(where, level)
  if devrt then return devrt.data, devrt.path end
  local forced = os.getenv("CUDALUA_CUDADEVRT")
  local why = "the code launches kernels from the device (dynamic parallelism), which needs the CUDA "
    .. "device runtime " .. DEVRT
  local tried = forced and forced ~= "" and { forced } or {}
  if #tried == 0 then
    for _, d in ipairs(devrt_dirs()) do tried[#tried + 1] = d .. "/" .. DEVRT end
  end
  for _, path in ipairs(tried) do
    local f, err = io.open(path, "rb")
    local data = f and f:read("a")
    if f then f:close() end
    if data and is_archive(data) and archive_intact(data) then
      devrt = { data = data, path = path }
      return data, path
    end
    if forced and forced ~= "" then
      check.error(where, level, "%s: CUDALUA_CUDADEVRT=%s %s", why, forced,
        f and "is not an intact static library (ar archive)" or ("cannot be opened (" .. tostring(err) .. ")"))
    end
  end
  check.error(where, level, "%s, not found (looked for %s): set CUDALUA_CUDADEVRT to its path "
    .. "(it is in the CUDA toolkit's lib64 folder)", why, table.concat(tried, ", "))
end

-- does an input call the device runtime? Its entry points' names are plain text in PTX and in
-- relocatable cubins; LTO-IR and compressed fatbins hide them (for those, a link that fails on
-- them is tried again with the library: see link below)
local CDP = "__cudaCDP2"
local function calls_devrt(data, kind)
  return kind ~= "library" and kind ~= "ltoir" and data:find(CDP, 1, true) ~= nil
end
local function missed_devrt(log)
  return (log or ""):find(CDP, 1, true) ~= nil
end

-- nvJitLink with the device runtime added when list needs it (found or missed)
local function link_with_devrt(list, arch, lto, extra, where, level, need)
  local function with_devrt()
    local data, path = device_runtime(where, level + 2)
    local l = table.move(list, 1, #list, 1, {})
    l[#l + 1] = { data, path, "library" }
    return l
  end
  local cubin, log, err
  if need then   -- (no tail calls: the error levels count this frame)
    cubin, log = jitlink(with_devrt(), arch, lto, extra, where, level + 1)
    return cubin, log
  end
  cubin, log, err = jitlink(list, arch, lto, extra, where, level + 1, true)
  if cubin then return cubin, log end
  if missed_devrt(log) then
    cubin, log = jitlink(with_devrt(), arch, lto, extra, where, level + 1)
    return cubin, log
  end
  check.error(where, level, "linking failed (%s):\n%s", err, (log or ""):gsub("%s+$", ""))
end

-- cuda.link({inputs}, [opts]): modules made with relocatable = true or lto = true, modules
-- from load_module, and images (paths or bytes) and static libraries linked into one module
-- by nvJitLink. where: the public name (cudalua.compile's kernel() links too)
local LINK_OPTS = { name = "string", arch = "string", options = "table" }

-- an input's bytes, kind and name; the kernels' types it brings go into info; arch: the
-- sm_ arch a compiled input was made for
local function link_input(v, i, info, where, level)
  if modules.is_module(v) then
    local st = modules.fields(v)
    for expr, e in pairs(st.info) do info[expr] = info[expr] or e end
    globals.put_back(st.globals or {}, info)   -- (module.new split its variables out of info)
    local arch = st.arch and st.arch:match("^sm_") and st.arch
    return st.link_image or st.image, st.link_image and "ltoir" or st.kind, st.name, arch
  end
  local data, kind, name = image_of(v, ("%s: input %d"):format(where, i), level, true)
  if kind == "ptx" then
    for expr, e in pairs(modules.ptx_entries(data)) do info[expr] = info[expr] or e end
  end
  return data, kind, name
end

function M.link_as(inputs, opts, where, level)
  if type(inputs) ~= "table" or #inputs == 0 then
    check.error(where, level, "expected a list of modules or images, got %s",
      type(inputs) == "table" and "an empty table" or type(inputs))
  end
  check.list(inputs, "the list of inputs", where, level + 1)
  opts = check.table(opts, LINK_OPTS, where, level + 1)
  check.arch(opts.arch, where, level + 1)
  check.strings(opts.options or {}, "opts.options", where, level + 1)
  local list, info, arch, lto, need, given = {}, {}, opts.arch, false, false, false
  for i, v in ipairs(inputs) do
    local data, kind, name, sm = link_input(v, i, info, where, level + 2)
    if sm then
      if arch and arch ~= sm and not opts.arch then
        check.error(where, level, "input %d is for %s, an earlier one for %s: give opts.arch", i, sm, arch)
      end
      arch = arch or sm
    end
    lto = lto or kind == "ltoir"
    need = need or calls_devrt(data, kind)
    given = given or (kind == "library" and data == (devrt and devrt.data))
    list[#list + 1] = { data, name or ("input " .. i), kind == "library" and "library" or nil }
  end
  arch = link_arch(arch, where, level + 1)
  local cubin, log
  if given then cubin, log = jitlink(list, arch, lto, opts.options, where, level + 1)
  else cubin, log = link_with_devrt(list, arch, lto, opts.options, where, level + 1, need) end
  local elf = modules.elf_info(cubin) or { kernels = {}, nparams = {} }
  return modules.new { image = cubin, kind = "cubin", log = log, info = info, arch = arch,
                       name = opts.name or "<linked>", linked = true, listed = elf.kernels,
                       nparams = elf.nparams }
end

function M.link(inputs, opts)
  local m = M.link_as(inputs, opts, "cuda.link", 3)
  return m
end

return M
