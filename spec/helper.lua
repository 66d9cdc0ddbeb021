-- spec/helper.lua: shared by the specs.
--   local H = require "spec.helper"
--   local gpu = H.gpu(it, pending)      -- gpu("does x", fn): an `it` tagged #gpu, reported as
--                                        -- skipped (pending) when no GPU is usable (with
--                                        -- CUDALUA_DEVICE=cpu, the CPU device runs it)
--   H.gpuonly(it, pending, why)          -- the same, skipped on the CPU device, saying why
--   H.rand_table(n, lo, hi, int)         -- random data, never zeros
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
local H = { cuda = cuda }

H.has_gpu = cuda.is_available()

function H.gpu(it, pending)
  return function(name, fn)
    name = name .. " #gpu"
    if H.has_gpu then it(name, fn) else pending(name .. " (no GPU: " .. tostring(cuda.driver_error()) .. ")") end
  end
end

-- gpuonly(it, pending, why)("does x", fn): a #gpu spec that cudalua's CPU device cannot run
-- (why: what it needs that only a GPU has), skipped there with the reason; on a GPU, a #gpu spec
H.cpu_device = H.has_gpu and cuda.devices()[1].kind == "cpu"
function H.gpuonly(it, pending, why)
  local gpu = H.gpu(it, pending)
  return function(name, fn)
    if H.cpu_device then pending(name .. " #gpu #gpuonly (not on the CPU device: " .. why .. ")")
    else gpu(name .. " #gpuonly", fn) end
  end
end

-- multi(it, pending)("does x", fn): an `it` tagged #multigpu, skipped with fewer than 2 GPUs
H.ngpus = H.has_gpu and #cuda.gpus or 0
function H.multigpu(it, pending)
  return function(name, fn)
    name = name .. " #multigpu"
    if H.ngpus >= 2 then it(name, fn) else pending(name .. (" (%d GPU%s here: it needs 2)"):format(H.ngpus, H.ngpus == 1 and "" or "s")) end
  end
end

function H.rand_table(n, lo, hi, int)
  lo, hi = lo or -100, hi or 100
  local t = {}
  for i = 1, n do
    local v
    repeat
      v = int and math.random(lo, hi) or lo + (hi - lo) * math.random()
    until v ~= 0
    t[i] = v
  end
  return t
end

-- processes and files, for the specs that run children:
--   H.LUA (this interpreter), H.q(s) (shell-quoted), H.run(cmd) -> output, ok,
--   H.tmpdir(), H.rmrf(path), H.write(path, data), H.read(path) -> data or nil,
--   H.child(code, env, wrap) -> output, ok
H.LUA = "lua5.4"
if arg then
  local i = 0
  while arg[i - 1] do i = i - 1 end
  if i < 0 then H.LUA = arg[i] end
end

function H.q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

function H.run(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

-- ok, and stdout and stderr together
function H.sh(cmd)
  local out, ok = H.run(cmd .. " 2>&1")
  return ok, out
end

function H.tmpdir()
  local d = H.run("mktemp -d"):gsub("%s+$", "")
  assert(d ~= "", "mktemp -d failed")
  return d
end

function H.rmrf(path) os.execute("rm -rf " .. H.q(path)) end

function H.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

function H.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local d = f:read("a")
  f:close()
  return d
end

-- H.child(code [, env [, wrap]]) -> output, ok: Lua code run in a child process with cudalua
-- loaded as `cuda`, stdout and stderr together; env: variables for it; wrap: a command it runs
-- under ("timeout 60")
function H.child(code, env, wrap)
  local vars = {}
  for k, v in pairs(env or {}) do vars[#vars + 1] = k .. "=" .. H.q(v) end
  local prog = 'package.cpath = "./?.so;" .. package.cpath\nlocal cuda = require "cudalua"\n' .. code
  return H.run(("env %s %s %s -e %s 2>&1"):format(table.concat(vars, " "), wrap or "", H.LUA, H.q(prog)))
end

-- the error raised by fn(...), or nil if it did not raise
function H.err(fn, ...)
  local ok, e = pcall(fn, ...)
  if ok then return nil end
  return tostring(e)
end

return H
