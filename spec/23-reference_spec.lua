-- The API reference (docs/API.md, written from docs/api.lua by tools/apidoc.lua) names every
-- public function, method, field and option key of require "cudalua", and is up to date.
local H = require "spec.helper"
local cuda = H.cuda
local nccl = require "cudalua.nccl"
local gpu = H.gpu(it, pending)

local REF = assert(H.read("docs/API.md"), "docs/API.md is missing")

-- the reference's entry for a heading text (up to the next heading of any level)
local function entry(heading)
  local at = REF:find("`" .. heading, 1, true)
  if not at then return nil end
  local stop = REF:find("\n#", at, true) or #REF
  return REF:sub(at, stop)
end

local function missing_from(names, where)
  local miss = {}
  for _, n in ipairs(names) do
    if not REF:find(where(n), 1, true) then miss[#miss + 1] = n end
  end
  table.sort(miss)
  return miss
end

local function keys(t, want)
  local list = {}
  for k, v in pairs(t) do
    if type(k) == "string" and (not want or want(k, v)) then list[#list + 1] = k end
  end
  return list
end

-- the accepted keys an "unknown option 'zz' (a, b, c)" error names
local function accepted(fn, ...)
  local e = H.err(fn, ...)
  assert(e, "an unknown option was accepted")
  local list = e:match("unknown %a+ '?zz'? [^(]*%(([^)]*)%)")
  assert(list, "no list of accepted keys in: " .. tostring(e))
  local out = {}
  for k in list:gmatch("[%a_]+") do
    if k ~= "or" then out[#out + 1] = k end
  end
  return out
end

local function options_documented(heading, list)
  local text = assert(entry(heading), "no entry for " .. heading .. " in docs/API.md")
  local miss = {}
  for _, k in ipairs(list) do
    if not text:find("`" .. k .. "`", 1, true) then miss[#miss + 1] = k end
  end
  assert.same({}, miss, heading .. ": option keys missing from its entry")
end

describe("the API reference (docs/API.md)", function()
  it("is what tools/apidoc.lua writes from docs/api.lua", function()
    local tmp = os.tmpname()
    local out, ok = H.run(("%s tools/apidoc.lua docs/api.lua %s 2>&1"):format(H.LUA, H.q(tmp)))
    assert(ok, out)
    local fresh = H.read(tmp)
    os.remove(tmp)
    assert(fresh == REF, "docs/API.md is out of date: run make docs")
  end)

  it("names every function and table of the module", function()
    local dtypes = keys(cuda, function(_, v) return type(v) == "userdata" end)
    assert(#dtypes >= 10, "the dtypes were not found")
    assert.same({}, missing_from(dtypes, function(n) return "`" .. n .. "`" end), "dtypes")
    local fns = keys(cuda, function(_, v) return type(v) ~= "userdata" end)
    assert(#fns > 40)
    assert.same({}, missing_from(fns, function(n) return "`cuda." .. n end), "cuda.*")
    assert.same({}, missing_from(keys(cuda.random), function(n) return "`cuda.random." .. n .. "(" end), "cuda.random.*")
    assert.same({}, missing_from(keys(cuda.progress), function(n) return "`cuda.progress." .. n .. "(" end), "cuda.progress.*")
    assert.same({}, missing_from(keys(nccl), function(n) return "`nccl." .. n .. "(" end), "nccl.*")
    assert.same({}, missing_from(keys(cuda.nvtx), function(n) return "`cuda.nvtx." .. n .. "(" end), "cuda.nvtx.*")
    assert.same({}, missing_from(keys(cuda.graph), function(n) return "`cuda.graph." .. n .. "(" end), "cuda.graph.*")
  end)

  it("names every method and field of each object type", function()
    local reg = debug.getregistry()
    local types = {
      Array = keys(reg["cudalua.array.methods"]), Kernel = keys(reg["cudalua.kernel.methods"]),
      Stream = keys(reg["cudalua.stream.methods"]), Event = keys(reg["cudalua.event"].__index),
      Graph = keys(reg["cudalua.graph"].__index), GraphExec = keys(reg["cudalua.graph_exec"].__index),
      Comm = keys(reg["cudalua.nccl_comm"].__index),
      Module = keys(require("cudalua.module").methods), Gpu = keys(getmetatable(cuda.gpus).methods),
      Node = keys(getmetatable(cuda.graph.empty()).__index),
    }
    for t, names in pairs(types) do
      assert(#names > 0, t .. ": no methods found")
      assert.same({}, missing_from(names, function(n) return "`" .. t .. ":" .. n .. "(" end), t .. " methods")
    end
    -- fields read through __index (an array's and a dtype's, without a GPU)
    local fields = {
      Array = { "shape", "dtype", "ndim", "size", "nbytes", "itemsize", "kind", "device", "closed" },
      Dtype = { "name", "itemsize", "typestr", "ctype", "is_float", "is_complex" },
      Stream = { "priority", "non_blocking" },
    }
    for _, f in ipairs(fields.Array) do
      local ok = pcall(function() return cuda.array({ 1 })[f] end)
      assert(ok, "array field " .. f)
    end
    for _, f in ipairs(fields.Dtype) do assert.is_not_nil(cuda.float32[f], "dtype field " .. f) end
    if H.has_gpu then
      for _, f in ipairs(fields.Stream) do assert.is_not_nil(cuda.default_stream()[f], "stream field " .. f) end
    end
    for t, names in pairs(fields) do
      assert.same({}, missing_from(names, function(n) return "`" .. t .. "." .. n .. "`" end), t .. " fields")
    end
  end)

  it("names every option key of the functions that take options", function()
    options_documented("cuda.compile(", accepted(cuda.compile, "x", { zz = 1 }))
    options_documented("cuda.load_module(", accepted(cuda.load_module, "x", { zz = 1 }))
    options_documented("cuda.link(", accepted(cuda.link, { "x" }, { zz = 1 }))
    options_documented("cuda.reduce(", accepted(cuda.reduce, "a + b", { zz = 1 }))
    options_documented("cuda.reduce(", accepted(cuda.reduce("a + b"), cuda.array({ 1, 2 }), { zz = 1 }))
    options_documented("cuda.random.create_xoroshiro128p_states(", accepted(cuda.random.create_xoroshiro128p_states, 4, { zz = 1 }))
    options_documented("cuda.event(", accepted(cuda.event, { zz = 1 }))
    options_documented("cuda.stream(", accepted(cuda.stream, { zz = 1 }))
    options_documented("cuda.device_array(", accepted(cuda.device_array, 4, "float32", { zz = 1 }))
    local watch = H.read("lua/cudalua/progress.lua"):match('check%.options%(opts, {([^}]*)}, "cuda%.progress%.watch"')
    local list = {}
    for k in assert(watch, "progress.watch's option list"):gmatch("[%a_]+") do list[#list + 1] = k end
    options_documented("cuda.progress.watch(", list)
  end)

  gpu("names every launch configuration and forall option key", function()
    local k = cuda.kernel('extern "C" __global__ void k(int *x) { }', "k")
    options_documented("Kernel", accepted(function() return k[{ 1, 1, zz = 1 }] end))
    options_documented("Kernel:forall(", accepted(k.forall, k, 4, { zz = 1 }))
  end)
end)
