-- Installing with LuaRocks: `luarocks make` of cudalua-scm-1.rockspec into a tree of its own
-- (one install for the whole file: it builds the module), then fresh lua5.4 processes that
-- know only that tree find cudalua there, with its Lua parts and kernel headers inside.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local nogpu = C.nogpu(it, pending)

local LUA = H.LUA

local q = H.q

local run = H.sh

local have_luarocks = os.execute("command -v luarocks >/dev/null 2>&1")
local function with_luarocks(name, fn)
  if have_luarocks then it(name, fn) else pending(name .. " (luarocks is not installed here)") end
end
local function nogpu_with_luarocks(name, fn)
  if have_luarocks then nogpu(name, fn) else pending(name .. " (luarocks is not installed here)") end
end

local tree, log
local function install()
  if tree then return tree end
  tree = H.tmpdir()
  local ok
  ok, log = run(("luarocks --lua-version=5.4 make --tree %s cudalua-scm-1.rockspec"):format(q(tree)))
  assert(ok, "luarocks make failed:\n" .. log)
  return tree
end

-- runs Lua code in a fresh process that knows only the tree, from another directory (so that
-- the source tree's ./cudalua.so cannot be found)
local function fresh(code)
  local t = install()
  local prog = ("package.cpath = %q .. package.cpath\n%s"):format(t .. "/lib/lua/5.4/?.so;", code)
  local env = ("env -i PATH=%s HOME=%s"):format(q(os.getenv("PATH") or "/usr/bin:/bin"), q(t))
  for _, v in ipairs { "LD_LIBRARY_PATH", "CUDALUA_LIBCUDA", "CUDA_HOME", "CUDA_PATH", "CUDA_DIR",
                       "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS" } do   -- the last: make asan
    local val = os.getenv(v)
    if val and val ~= "" then env = env .. (" %s=%s"):format(v, q(val)) end
  end
  return run(("cd / && %s %s -e %s"):format(env, LUA, q(prog)))
end

describe("luarocks make", function()
  with_luarocks("installs cudalua into a tree: the module, the C API header and libraries", function()
    local t = install()
    assert.matches("cudalua scm%-1 is now installed", log)
    local ok, out = run(("luarocks --lua-version=5.4 --tree %s list --porcelain"):format(q(t)))
    assert(ok, out)
    assert.matches("cudalua\tscm%-1\tinstalled", out)
    ok, out = run(("find %s -name cudalua.so -o -name cudalua.h -o -name libcudalua.a"):format(q(t)))
    assert(ok, out)
    assert.matches("/lib/lua/5%.4/cudalua%.so\n", out)
    assert.matches("/cudalua%.h\n", out)
    assert.matches("/libcudalua%.a\n", out)
  end)

  with_luarocks("installs the job launcher into the tree's bin/, where it runs", function()
    local t = install()
    H.write(t .. "/hello.lua", 'print("hello from " .. os.getenv("RANK") .. " of " .. os.getenv("WORLD_SIZE"))')
    local ok, out = run(("cd / && timeout 60 %s -n 2 --lua %s %s"):format(q(t .. "/bin/cudalua-run"), q(LUA), q(t .. "/hello.lua")))
    assert(ok, out)
    assert.matches("[rank 0] hello from 0 of 2\n", out, 1, true)
    assert.matches("[rank 1] hello from 1 of 2\n", out, 1, true)
  end)

  with_luarocks("lets a fresh process require it and compile a kernel using its headers", function()
    local ok, out = fresh([[
local cuda = require "cudalua"
print("from " .. package.searchpath("cudalua", package.cpath))
print("version " .. cuda.__version)
local m = cuda.compile('#include <cudalua/grid.cuh>\n#include <cudalua/random.cuh>\n' ..
  'extern "C" __global__ void k(float *x, xoroshiro128p_state *s) { x[grid(1)] = xoroshiro128p_uniform_float32(s, grid(1)); }',
  { arch = "sm_90" })
print("kernels " .. table.concat(m:kernels(), ","))
print("image " .. m:image():sub(2, 4))
print("reduce " .. tostring(cuda.reduce("a + b")(cuda.array({ 1, 2, 3, 4 }, "float64"):slice(5))))
]])
    assert(ok, "the fresh process failed:\n" .. out)
    assert.matches("from " .. install() .. "/lib/lua/5.4/cudalua.so\n", out, 1, true)
    assert.matches("version " .. cuda.__version .. "\n", out, 1, true)
    assert.matches("kernels k\n", out, 1, true)
    assert.matches("image ELF\n", out, 1, true)
    assert.matches("reduce 0.0\n", out, 1, true)
  end)

  with_luarocks("the installed module reports compile errors as the source tree's does", function()
    local ok, out = fresh([[
local cuda = require "cudalua"
local ok, e = pcall(cuda.compile, '#include <cudalua/nothere.cuh>\n__global__ void k() {}', { arch = "sm_90" })
print(ok, e)
ok, e = pcall(cuda.compile, "__global__ void k() {}", { arch = "gfx90a" })
print(ok, e)
]])
    assert(ok, "the fresh process failed:\n" .. out)
    assert.matches('cannot open source file "cudalua/nothere.cuh"', out, 1, true)
    assert.matches('arch must look like "sm_90" or "compute_90", got "gfx90a"', out, 1, true)
  end)

  nogpu_with_luarocks("the installed module says there is no driver where there is none", function()
    local ok, out = fresh([[
local cuda = require "cudalua"
print(cuda.is_available(), pcall(cuda.device_array, 4, "float32"))
]])
    assert(ok, "the fresh process failed:\n" .. out)
    assert.matches("false\tfalse\tcudalua: cuda.device_array: no CUDA driver found", out, 1, true)
  end)
end)

teardown(function()
  if tree then H.rmrf(tree) end
end)

describe("the release rockspec", function()
  it("has the version cuda.__version says", function()
    local newest
    for name in H.run("ls rockspecs | sort -V"):gmatch("[^\n]+") do   -- as tools/release.sh picks
      local v = name:match("^cudalua%-(%d+%.%d+%.%d+)%-%d+%.rockspec$")
      if v then newest = v end
    end
    assert(newest, "no versioned rockspec in rockspecs/")
    assert.equal(newest, H.cuda.__version)
    assert.matches("## " .. newest:gsub("%.", "%%."), H.read("CHANGELOG.md"))
  end)
end)
