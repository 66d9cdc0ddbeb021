-- cudalua.link: modules cuda.compile did not make. cuda.load_module takes a cubin, fatbin, PTX
-- or LTO-IR built elsewhere; cuda.link joins relocatable code, PTX, fatbins and LTO-IR into one
-- module with nvJitLink (src/link.c).
local core = ...
local modules = require "cudalua.module"
local check = require "cudalua.check"
local system = require "cudalua.system"
local M = {}

-- cuda.load_module(path or bytes [, opts]): a cubin, fatbin, PTX or LTO-IR built elsewhere
local LOAD_OPTS = { name = "string", arch = "string" }

-- the bytes of an image given as bytes or as a file's path, its kind and a name for it
local function image_of(v, where, level)
  if type(v) ~= "string" then check.error(where, level, "expected a path or the bytes of an image, got %s", type(v)) end
  local kind = modules.image_kind(v)
  if kind then return v, kind, nil end
  if #v > 4096 or v:find("%z") or v:find("\n") then
    check.error(where, level, "not a cubin, fatbin, PTX or LTO-IR image (it starts with %q)", v:sub(1, 8))
  end
  local f, err = io.open(v, "rb")
  if not f then check.error(where, level, "cannot open %s", err) end
  local data = f:read("a")
  f:close()
  if not data then check.error(where, level, "cannot read %s", v) end
  kind = modules.image_kind(data)
  if not kind then
    check.error(where, level, "%s is not a cubin, fatbin, PTX or LTO-IR image (it starts with %q)", v, data:sub(1, 8))
  end
  return data, kind, v
end

-- LTO-IR is linked into a cubin by nvJitLink before it can be loaded
local function jitlink(inputs, arch, lto, extra, where, level)
  local have, why = system.jitlink_version()
  if not have then check.error(where, level, "%s", check.cause(why)) end
  local options = { "-arch=" .. arch }
  if lto then options[#options + 1] = "-lto" end
  for _, o in ipairs(extra or {}) do options[#options + 1] = o end
  local cubin, log, err = core.jitlink(inputs, options, false)
  if not cubin then
    check.error(where, level, "linking failed (%s):\n%s", err, (log or ""):gsub("%s+$", ""))
  end
  return cubin, log
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

-- cuda.link({inputs}, [opts]): modules made with relocatable = true or lto = true, modules
-- from load_module, and images (paths or bytes) linked into one module by nvJitLink
local LINK_OPTS = { name = "string", arch = "string", options = "table" }

function M.link(inputs, opts)
  if type(inputs) ~= "table" or #inputs == 0 then
    check.error("cuda.link", 2, "expected a list of modules or images, got %s",
      type(inputs) == "table" and "an empty table" or type(inputs))
  end
  check.list(inputs, "the list of inputs", "cuda.link", 3)
  opts = check.table(opts, LINK_OPTS, "cuda.link", 3)
  check.arch(opts.arch, "cuda.link", 3)
  check.strings(opts.options or {}, "opts.options", "cuda.link", 3)
  local list, info, arch, lto = {}, {}, opts.arch, false
  for i, v in ipairs(inputs) do
    local data, kind, name
    if modules.is_module(v) then
      local st = modules.fields(v)
      data, kind, name = st.link_image or st.image, st.link_image and "ltoir" or st.kind, st.name
      for expr, e in pairs(st.info) do info[expr] = info[expr] or e end
      if st.arch and st.arch:match("^sm_") then
        if arch and arch ~= st.arch and not opts.arch then
          check.error("cuda.link", 2, "input %d is for %s, an earlier one for %s: give opts.arch", i, st.arch, arch)
        end
        arch = arch or st.arch
      end
    else
      data, kind, name = image_of(v, ("cuda.link: input %d"):format(i), 3)
      if kind == "ptx" then
        for expr, e in pairs(modules.ptx_entries(data)) do info[expr] = info[expr] or e end
      end
    end
    lto = lto or kind == "ltoir"
    list[#list + 1] = { data, name or ("input " .. i) }
  end
  arch = link_arch(arch, "cuda.link", 3)
  local cubin, log = jitlink(list, arch, lto, opts.options, "cuda.link", 3)
  local elf = modules.elf_info(cubin) or { kernels = {}, nparams = {} }
  return modules.new { image = cubin, kind = "cubin", log = log, info = info, arch = arch,
                       name = opts.name or "<linked>", linked = true, listed = elf.kernels,
                       nparams = elf.nparams }
end

return M
