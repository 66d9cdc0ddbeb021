-- Every function that takes a flag or options refuses what it does not understand, naming it
-- (issue 24: cuda.stream{priority = -1} was taken for `true`). Found by an audit of every public
-- function that takes a flag, an options table or a list; each case here was accepted before,
-- the option silently lost or misread. None needs a GPU: the arguments are checked first.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

describe("flags and options", function()
  it("array constructors refuse arguments they do not take", function()
    C.raises("cudalua: cuda.array: argument 3 is not taken (it takes values or a shape, and a dtype), got table",
             cuda.array, { 1, 2 }, "float32", { bogus = 1 })
    for _, f in ipairs { "zeros", "pinned_array", "mapped_array", "managed_array" } do
      C.raises(("cudalua: cuda.%s: argument 3 is not taken (host memory takes a shape and a dtype, no stream or options), got table"):format(f),
               cuda[f], 4, "float32", { ipc = true })
      C.raises("argument 3 is not taken", cuda[f], 4, "float32", "junk")
    end
    C.raises("cudalua: cuda.device_array: argument 4 is not taken (a shape, a dtype and a stream or options), got boolean",
             cuda.device_array, 4, "float32", nil, true)
  end)

  it("device_array's ipc option is a boolean", function()
    for _, v in ipairs { "no", 0, {} } do
      C.raises("cuda.device_array: ipc must be a boolean, got " .. type(v), cuda.device_array, 4, "float32", { ipc = v })
    end
  end)

  it("cuda.graph and cuda.synchronize take no arguments", function()
    C.raises("cudalua: cuda.graph: takes no arguments, got table", cuda.graph, { bogus = 1 })
    C.raises("cudalua: cuda.synchronize: takes no arguments, got boolean (a stream: stream:synchronize())",
             cuda.synchronize, true)
  end)

  it("cuda.event takes a boolean or an options table of booleans", function()
    C.raises("cudalua: cuda.event: expected nil, a boolean (timing) or an options table {timing =, interprocess =}, got number",
             cuda.event, 1)
    C.raises("cudalua: cuda.event: timing must be a boolean, got string", cuda.event, { timing = "no" })
    C.raises("cudalua: cuda.event: interprocess must be a boolean, got number", cuda.event, { interprocess = 1 })
  end)

  it("lists in compile and link options hold only their items", function()
    local src = 'extern "C" __global__ void k(int *x) { x[0] = 1; }'
    C.raises("cuda.compile: opts.options is a list; it has the key 'lineinfo' (an option for opts itself?)",
             cuda.compile, src, { arch = "sm_90", options = { lineinfo = true } })
    C.raises("cuda.compile: opts.name_expressions is a list; it has the key 'k'", cuda.compile, src,
             { arch = "sm_90", name_expressions = { k = true } })
    C.raises("cuda.compile: opts.include_dirs is a list; it has the key 'x'", cuda.compile, src,
             { arch = "sm_90", include_dirs = { x = "/nonexistent" } })
    C.raises("cuda.compile: opts.options is a list; it has the key 5", cuda.compile, src,
             { arch = "sm_90", options = { "-O3", [5] = "-G" } })
    local m = cuda.compile(src, { arch = "sm_90", relocatable = true })
    C.raises("cuda.link: the list of inputs is a list; it has the key 'arch' (an option for opts itself?)",
             cuda.link, { m, arch = "sm_90" })
    C.raises("cuda.link: opts.options is a list; it has the key 'lto'", cuda.link, { m }, { options = { lto = true } })
  end)

  it("reduce and elementwise refuse misplaced options", function()
    C.raises("cuda.reduce: unknown key 'preambel' in the expression table (body, preamble; options such as init go in the second argument)",
             cuda.reduce, { body = "return a + b;", preambel = "x" })
    C.raises("unknown key 'init' in the expression table", cuda.reduce, { body = "return a + b;", init = 5 })
    C.raises("cuda.reduce: takes at most 2 arguments, got 3", cuda.reduce, "a + b", { init = 1 }, { x = 1 })
    C.raises("cuda.elementwise: takes at most 4 arguments, got 5", cuda.elementwise, "float32 x", "float32 z", "z = x;",
             "n", { block = 1 })
  end)

  it("random states take options or positions, not both", function()
    C.raises("create_xoroshiro128p_states: with an options table, subsequence_start and stream go in it, not after it",
             cuda.random.create_xoroshiro128p_states, 4, { seed = 1 }, 5)
  end)

  gpu("progress.watch's label is a string", function()
    C.raises("progress.watch: label must be a string, got table", cuda.progress.watch, cuda.mapped_array(1, "uint64"),
             10, { label = {} })
    C.raises("progress.watch: label must be a string, got boolean", cuda.progress.watch, cuda.mapped_array(1, "uint64"),
             10, { label = false })
  end)
end)

-- Every misuse spec checks the form of cudalua's errors through C.raises: "cudalua: <public
-- name>: <what is wrong>" (issue 25). This checks that check, on messages it must take and
-- refuse, and on real errors of cudalua's C and Lua parts.
describe("error messages", function()
  it("name the public function first: C.raises refuses any other form", function()
    for _, good in ipairs { "cudalua: cuda.copy: sizes differ", "cudalua: array:slice: stop out of range",
                            "cudalua: array[i] =: element 1: not a number", "cudalua: kernel 'add': expects 3 arguments",
                            "cudalua: elementwise 'saxpy': expected 3 inputs", "spec.lua:3: cudalua: module.saxpy: no kernel" } do
      assert(C.prefix(good, "x"), good)
    end
    for _, bad in ipairs { "slice: stop out of range", "cuda.copy: sizes differ", "no kernel 'x' in module m",
                           "bad argument #1 to 'slice' (number expected)", "cudalua.nccl: comm_init_all: failed" } do
      assert.is_nil((C.prefix(bad, "x")), bad)
    end
    -- a test function's own error passes through as it is
    assert(C.prefix("spec.lua:9: boom 7", "boom 7"))
    -- and C.raises itself fails on an unprefixed message
    assert.has_error(function() C.raises("sizes differ", error, "cuda.copy: sizes differ", 0) end)
  end)

  it("of the C and the Lua parts have that form, whatever the argument's fault", function()
    local kinds = { 42, "s", {}, true, 2.5, -1 }
    local fns = { { "cuda.array", cuda.array }, { "cuda.device_array", cuda.device_array },
                  { "cuda.stream", cuda.stream }, { "cuda.compile", cuda.compile },
                  { "cuda.reduce", cuda.reduce }, { "cuda.elementwise", cuda.elementwise } }
    local a = cuda.array({ 1, 2, 3 }, "float32")
    fns[#fns + 1] = { "array:slice", function(x) return a:slice(x, "z") end }
    fns[#fns + 1] = { "array:fill", function(x) return a:fill(x, "z") end }
    for _, f in ipairs(fns) do
      local v = kinds[math.random(#kinds)]
      local e = H.err(f[2], v, v)
      if e then
        local p = assert(C.prefix(e, nil))
        assert.matches("^cudalua: " .. f[1]:gsub("%p", "%%%0"), p)
      end
    end
  end)
end)
