-- The compile cache (lua/cudalua/cache.lua). In the process, the same source and options give
-- the same module object; on disk (CUDALUA_CACHE_DIR, default ~/.cache/cudalua) a fresh process
-- gets what an earlier one compiled. Corrupt entries are ignored and written again, an unusable
-- directory turns the disk cache off with one warning, CUDALUA_CACHE=0 turns it off. Compiling
-- with an explicit arch needs no GPU: all of this runs everywhere. The disk side is seen through
-- child processes (spec/cache_child.lua), each with the environment it needs.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local cache = require "cudalua.cache"
local ARCH = { arch = "sm_90" }

local LUA = H.LUA

local q, run, tmpdir, rmrf, write, read = H.q, H.run, H.tmpdir, H.rmrf, H.write, H.read

-- the names in dir (dot files included), sorted; nil if dir does not exist
local function listing(dir)
  local out, ok = run("ls -A " .. q(dir) .. " 2>/dev/null")
  if not ok then return nil end
  local t = {}
  for name in out:gmatch("[^\n]+") do t[#t + 1] = name end
  table.sort(t)
  return t
end

local function entries(dir)
  local t = {}
  for _, name in ipairs(listing(dir) or {}) do
    assert(name:match("^%x+%.entry$"), "unexpected file in the cache directory: " .. name)
    t[#t + 1] = name
  end
  return t
end

local nonce = 0
local function source(tag)
  nonce = nonce + 1
  return ([[
#include <cudalua/grid.cuh>
// cache spec %s %d %d %d
extern "C" __global__ void fill(float *x, float v, long long n) {
  for (long long i = grid(1); i < n; i += gridsize(1)) x[i] = v;
}
__global__ void noparams() {}
__global__ void byref(int &r) {}
__global__ void warns() { int unused = 1; }
]]):format(tag or "", os.time(), math.random(1, 1 << 30), nonce)
end
local KERNELS = "byref,fill,noparams,warns"
local REFUSE = "^byref: .*cudalua: kernel 'byref': parameter 1 is a reference %(int&%): kernels take values and pointers$"

-- runs spec/cache_child.lua with the environment settings env (a shell word list) on the given
-- source texts; returns what it printed, parsed
local function child(env, sources, arch)
  local dir = tmpdir()
  local files = {}
  for i, src in ipairs(sources) do
    files[i] = dir .. "/src" .. i .. ".cu"
    write(files[i], src)
  end
  local qf = {}
  for i, f in ipairs(files) do qf[i] = q(f) end
  local errfile = dir .. "/stderr"
  local out, ok = run(("env %s %s spec/cache_child.lua %s %s 2>%s"):format(env, LUA, arch or "sm_90",
    table.concat(qf, " "), q(errfile)))
  local err = read(errfile) or ""
  rmrf(dir)
  local r = { out = out, err = err, modules = {}, refuse = {} }
  for line in out:gmatch("[^\n]+") do
    local k, log, same = line:match("^module %d+ kernels=(%S*) log=(%d+) same=(%a+)$")
    if k then r.modules[#r.modules + 1] = { kernels = k, log = tonumber(log), same = same == "true" } end
    local rest = line:match("^refuse %d+ (.*)$")
    if rest then r.refuse[#r.refuse + 1] = rest end
    local m, d, x, w = line:match("^stats memory_hits=(%d+) disk_hits=(%d+) misses=(%d+) writes=(%d+)$")
    if m then r.stats = { memory_hits = tonumber(m), disk_hits = tonumber(d), misses = tonumber(x), writes = tonumber(w) } end
  end
  assert(ok and r.stats, "the child process failed:\n" .. out .. err)
  return r
end

local function cache_env(dir) return "-u CUDALUA_CACHE CUDALUA_CACHE_DIR=" .. q(dir) end

-- a child that compiled one source and got it from where `how` says
local function check_one(r, how)
  local want = {
    compiled = { memory_hits = 1, disk_hits = 0, misses = 1, writes = 1 },
    disk = { memory_hits = 1, disk_hits = 1, misses = 0, writes = 0 },
    uncached = { memory_hits = 1, disk_hits = 0, misses = 1, writes = 0 },
  }
  assert.same(want[how], r.stats, r.out .. r.err)
  assert.equal(1, #r.modules)
  assert.equal(KERNELS, r.modules[1].kernels)
  assert.is_true(r.modules[1].log > 0) -- the warning about `unused`
  assert.is_true(r.modules[1].same)
  assert.equal(1, #r.refuse, r.out)
  assert.matches(REFUSE, r.refuse[1])
end

local function snapshot()
  local s = {}
  for k, v in pairs(cache.stats) do s[k] = v end
  return s
end

local function with(extra)
  local r = { arch = "sm_90" }
  for k, v in pairs(extra or {}) do r[k] = v end
  return r
end

describe("the compile cache in the process", function()
  it("gives the same module object for the same source and options, counted as a memory hit", function()
    local src = source("same")
    local s0 = snapshot()
    local a = cuda.compile(src, ARCH)
    local s1 = snapshot()
    assert.equal(s0.misses + 1, s1.misses)
    assert.equal(s0.writes + (cache.dir() and 1 or 0), s1.writes)
    local b = cuda.compile(src, with())
    assert.equal(a, b)
    assert.equal(s1.memory_hits + 1, cache.stats.memory_hits)
    assert.equal(s1.misses, cache.stats.misses)
  end)

  it("gives another module for every input that changes the binary", function()
    local src = source("inputs")
    local variants = {
      with(),
      with { arch = "sm_80" },
      with { options = { "-DX=1" } },
      with { options = { "-DX=2" } },
      with { options = { "-DX=1", "-lineinfo" } },
      with { headers = { ["h.h"] = "#define H 1\n" } },
      with { headers = { ["h.h"] = "#define H 2\n" } },
      with { headers = { ["g.h"] = "#define H 1\n" } },
      with { name_expressions = { "noparams" } },
      with { name = "other.cu" },
    }
    local mods = {}
    for i, opts in ipairs(variants) do
      mods[i] = cuda.compile(src, opts)
      for j = 1, i - 1 do assert.are_not.equal(mods[j], mods[i], ("variants %d and %d"):format(j, i)) end
    end
    assert.are_not.equal(mods[1], cuda.compile(src .. "\n", ARCH))
    -- and each one again is the same object
    for i, opts in ipairs(variants) do assert.equal(mods[i], cuda.compile(src, opts), "variant " .. i) end
  end)

  it("with cache = false compiles again and stores nothing", function()
    local src = source("nocache")
    local s0 = snapshot()
    local a = cuda.compile(src, with { cache = false })
    local b = cuda.compile(src, with { cache = false })
    assert.are_not.equal(a, b)
    assert.same(s0, snapshot())
    assert.equal(KERNELS, table.concat(a:kernels(), ","))
    -- not stored: a cached compile of the same source is a miss
    cuda.compile(src, ARCH)
    assert.equal(s0.misses + 1, cache.stats.misses)
  end)
end)

describe("the compile cache on disk", function()
  it("gives a fresh process what an earlier one compiled", function()
    local dir = tmpdir()
    local src = source("fresh")
    check_one(child(cache_env(dir), { src }), "compiled")
    local names = entries(dir)
    assert.equal(1, #names)
    assert.matches("^" .. ("%x"):rep(32) .. "%.entry$", names[1])
    local r2 = child(cache_env(dir), { src })
    check_one(r2, "disk")
    assert.same(names, entries(dir))
    -- another source is another entry
    check_one(child(cache_env(dir), { source("fresh 2") }), "compiled")
    assert.equal(2, #entries(dir))
    rmrf(dir)
  end)

  it("keeps in an entry the kernels, their parameter types, refusals, the log and the image", function()
    local dir = tmpdir()
    child(cache_env(dir), { source("entry") })
    local name = entries(dir)[1]
    local data = read(dir .. "/" .. name)
    local e = cache.decode(name:match("^(%x+)"), data)
    assert.is_table(e)
    assert.equal("\127ELF", e.image:sub(1, 4))
    assert.equal("cubin", e.kind)
    assert.is_false(e.relocatable)
    assert.matches("%.entry%s+fill%(", e.ptx) -- the cubin's PTX, for module:ptx()
    assert.matches('variable "unused" was declared but never referenced', e.log, 1, true)
    assert.same({ "float*", "float", "long long" }, e.info.fill.types)
    assert.equal("pfl", e.info.fill.codes)
    assert.equal("", e.info.noparams.codes)
    assert.same({}, e.info.noparams.types)
    assert.is_nil(e.info.byref.codes)
    assert.matches("parameter 1 is a reference", e.info.byref.error, 1, true)
    assert.is_nil(cache.decode(("0"):rep(32), data)) -- another key's entry
    rmrf(dir)
  end)

  it("ignores a corrupt entry and writes it again", function()
    local dir = tmpdir()
    local src = source("corrupt")
    child(cache_env(dir), { src })
    local name = entries(dir)[1]
    local path = dir .. "/" .. name
    local good = read(path)
    local corruptions = {
      truncated = good:sub(1, #good // 2),
      ["last byte dropped"] = good:sub(1, -2),
      ["byte flipped"] = good:sub(1, #good // 2) .. string.char((good:byte(#good // 2 + 1) + 1) % 256) .. good:sub(#good // 2 + 2),
      ["bytes appended"] = good .. "extra",
      garbage = ("garbage\n"):rep(10),
      empty = "",
    }
    for what, bad in pairs(corruptions) do
      write(path, bad)
      local r = child(cache_env(dir), { src })
      local ok, err = pcall(check_one, r, "compiled")
      assert(ok, what .. ": " .. tostring(err))
      assert.same({ name }, entries(dir), what)
      local again = read(path)
      assert.equal(#good, #again, what .. ": rewritten entry size")
      assert.is_table(cache.decode(name:match("^(%x+)"), again), what .. ": rewritten entry decodes")
      check_one(child(cache_env(dir), { src }), "disk")
    end
    rmrf(dir)
  end)

  it("keeps entries for other architectures apart", function()
    local dir = tmpdir()
    local src = source("arch")
    check_one(child(cache_env(dir), { src }, "sm_90"), "compiled")
    check_one(child(cache_env(dir), { src }, "sm_80"), "compiled")
    assert.equal(2, #entries(dir))
    check_one(child(cache_env(dir), { src }, "sm_80"), "disk")
    check_one(child(cache_env(dir), { src }, "sm_90"), "disk")
    rmrf(dir)
  end)

  it("survives processes writing the same entry at once", function()
    local dir = tmpdir()
    local work = tmpdir()
    local src = source("race")
    write(work .. "/src.cu", src)
    local cmds = {}
    for i = 1, 6 do
      cmds[i] = ("env %s %s spec/cache_child.lua sm_90 %s >%s 2>&1 &"):format(cache_env(dir), LUA,
        q(work .. "/src.cu"), q(work .. "/out" .. i))
    end
    os.execute(table.concat(cmds, " ") .. " wait")
    for i = 1, 6 do
      local out = read(work .. "/out" .. i) or ""
      assert.matches("module 1 kernels=" .. KERNELS, out, 1, true)
      assert.matches("stats memory_hits=1 ", out, 1, true)
    end
    assert.equal(1, #entries(dir)) -- no temporary files left either
    check_one(child(cache_env(dir), { src }), "disk")
    rmrf(dir)
    rmrf(work)
  end)

  it("with a directory it cannot use, compiles without it after exactly one warning", function()
    local file = os.tmpname() -- a regular file: nothing can be made under it
    local r = child(cache_env(file .. "/cache"), { source("unusable 1"), source("unusable 2") })
    assert.same({ memory_hits = 2, disk_hits = 0, misses = 2, writes = 0 }, r.stats)
    assert.equal(2, #r.modules)
    for _, m in ipairs(r.modules) do assert.equal(KERNELS, m.kernels) end
    local warnings = 0
    for line in r.err:gmatch("[^\n]+") do
      assert.matches("^cudalua: warning: compile cache disabled: ", line)
      warnings = warnings + 1
    end
    assert.equal(1, warnings, r.err)
    assert.equal("", read(file))
    os.remove(file)
  end)

  it("is off with CUDALUA_CACHE=0 (or off, false)", function()
    for _, v in ipairs { "0", "off", "false" } do
      local base = tmpdir()
      local dir = base .. "/cache"
      local src = source("off " .. v)
      local env = "CUDALUA_CACHE=" .. v .. " CUDALUA_CACHE_DIR=" .. q(dir)
      check_one(child(env, { src }), "uncached")
      check_one(child(env, { src }), "uncached")
      assert.is_nil(listing(dir), "CUDALUA_CACHE=" .. v .. " made the directory")
      -- and on again: compiled once, then from the disk
      check_one(child(cache_env(dir), { src }), "compiled")
      check_one(child(cache_env(dir), { src }), "disk")
      rmrf(base)
    end
  end)

  it("lives under $HOME/.cache/cudalua without CUDALUA_CACHE_DIR", function()
    local home = tmpdir()
    local src = source("home")
    local env = "-u CUDALUA_CACHE -u CUDALUA_CACHE_DIR HOME=" .. q(home)
    check_one(child(env, { src }), "compiled")
    assert.equal(1, #entries(home .. "/.cache/cudalua"))
    check_one(child(env, { src }), "disk")
    rmrf(home)
  end)
end)

describe("the cache entry format", function()
  local E = {
    image = "\127ELF\0\1\2binary:with:colons\n", kind = "cubin", ptx = ".version 9.0\n.entry k(", relocatable = true, arch = "sm_90a",
    log = "warning: 3:4",
    info = {
      k = { symbol = "k", codes = "pfl", types = { "float*", "float", "long long" } },
      ["t<int>"] = { symbol = "_Z1tIiEvPT_", codes = "p", types = { "int*" } },
      none = { symbol = "none", codes = "", types = {} },
      bad = { symbol = "bad", error = "parameter 1 is a reference (int&)", types = {} },
    },
  }
  local HASH = ("ab"):rep(16)

  it("decodes what it encodes", function()
    local data = cache.encode(HASH, E)
    local e = cache.decode(HASH, data)
    assert.equal(E.image, e.image)
    assert.equal(E.ptx, e.ptx)
    assert.equal(E.kind, e.kind)
    assert.equal("sm_90a", e.arch)
    assert.is_true(e.relocatable)
    assert.equal(E.log, e.log)
    for name, want in pairs(E.info) do
      local got = e.info[name]
      assert.equal(want.symbol, got.symbol, name)
      assert.equal(want.codes, got.codes, name)
      assert.equal(want.error, got.error, name)
      assert.same(want.types, got.types, name)
    end
    local p = cache.decode(HASH, cache.encode(HASH, { image = ".version 8.0", kind = "ptx", log = "", info = {} }))
    assert.equal("ptx", p.kind)
    assert.is_nil(p.ptx)
    assert.is_false(p.relocatable)
    assert.same({}, p.info)
  end)

  it("refuses entries that are damaged or belong to another key", function()
    local data = cache.encode(HASH, E)
    assert.is_nil(cache.decode(("cd"):rep(16), data))
    assert.is_nil(cache.decode(HASH, data:sub(1, -2)))
    assert.is_nil(cache.decode(HASH, data:sub(2)))
    assert.is_nil(cache.decode(HASH, data .. "x"))
    assert.is_nil(cache.decode(HASH, ""))
    assert.is_nil(cache.decode(HASH, ("x"):rep(100)))
    for _, at in ipairs { 1, 20, #data // 2, #data - 40, #data } do
      local b = data:byte(at)
      local bad = data:sub(1, at - 1) .. string.char((b + 1) % 256) .. data:sub(at + 1)
      assert.is_nil(cache.decode(HASH, bad), "byte " .. at .. " changed")
    end
  end)

  it("keys hold every part, unambiguously", function()
    assert.are_not.equal(cache.key { "ab", "c" }, cache.key { "a", "bc" })
    assert.are_not.equal(cache.key { "a" }, cache.key { "a", "" })
    assert.equal(cache.key { "x", "y" }, cache.key { "x", "y" })
  end)
end)
