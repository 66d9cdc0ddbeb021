-- cudalua.system: what compiles and links run with and for, asked once a process: each
-- device's compute capability and the arch NVRTC compiles for it, NVRTC's and nvJitLink's
-- identities and versions. None of them changes under a running process (a library, once
-- loaded or refused, stays so: src/driver.c), and the compile path asks on every call.
local core = ...
local check = require "cudalua.check"
local M = {}

-- "cc90": the current device's compute capability, for cache keys (needs no NVRTC)
-- also returns the device and its compute_capability {major, minor}; level: as error()'s
local cc_of, cap_of = {}, {}
function M.device_cc(level, what)
  if not core.is_available() then
    check.error(what or "cuda.compile", level or 3, "%s; give opts.arch (e.g. \"sm_90\") to compile without a GPU",
      check.cause(core.driver_error()))
  end
  local dev = core.current_device()
  if not cc_of[dev] then
    local cc = core.devices()[dev + 1].compute_capability
    cc_of[dev], cap_of[dev] = ("cc%d%d"):format(cc[1], cc[2]), cc
  end
  return cc_of[dev], dev, cap_of[dev]
end

-- the arch NVRTC compiles for: the device's own (sm_90 on Hopper), or PTX of the newest NVRTC
-- knows for a newer device
local arch_of = {}
function M.device_arch(level, what)
  local _, dev, cc = M.device_cc((level or 3) + 1, what)
  if arch_of[dev] then return arch_of[dev] end
  local want = cc[1] * 10 + cc[2]
  local archs = core.nvrtc_archs()
  local best = 0
  for _, a in ipairs(archs) do
    if a == want then arch_of[dev] = "sm_" .. want; return arch_of[dev] end
    if a <= want and a > best then best = a end
  end
  if want == 0 and core.is_cpu_device() then
    check.error(what or "cuda.compile", level or 3, "cudalua's CPU device has no GPU architecture: NVRTC's "
      .. "code for a GPU (PTX, LTO-IR, cubins and the linking of them) runs on a GPU only")
  end
  if best == 0 then
    check.error(what or "cuda.compile", level or 3, "NVRTC cannot compile for compute capability %d.%d", cc[1], cc[2])
  end
  arch_of[dev] = "compute_" .. best -- PTX the driver compiles for the newer device
  return arch_of[dev]
end

-- the libraries' identities ("path:size:mtime" of the library a compile would use, found
-- without loading it: a disk cache hit must not pay for loading NVRTC) and versions (major,
-- minor, path, or nil and why not; these load the library): the first answer, kept
local answers = {}
local function once(name)
  return function()
    local r = answers[name] or table.pack(core[name]())
    answers[name] = r
    return table.unpack(r, 1, r.n)
  end
end
M.nvrtc_identity, M.jitlink_identity = once "nvrtc_identity", once "jitlink_identity"
M.nvrtc_version, M.jitlink_version = once "nvrtc_version", once "jitlink_version"

return M
