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
                            "cudalua: array[i] =: element 1: not a number", "cudalua: kernel 'add' expects 3 arguments",
                            "cudalua: elementwise 'saxpy': expected 3 inputs", "spec.lua:3: cudalua: module.saxpy: no kernel" } do
      assert(C.prefix(good), good)
    end
    for _, bad in ipairs { "slice: stop out of range", "cuda.copy: sizes differ", "cudalua: no kernel 'x' in module m",
                           "bad argument #1 to 'slice' (number expected)", "cudalua.nccl: comm_init_all: failed",
                           "spec.lua:9: boom 7" } do
      assert.is_nil((C.prefix(bad)), bad)
    end
    -- C.raises fails on an unprefixed message, even one the test gives whole
    assert.has_error(function() C.raises("cuda.copy: sizes differ", error, "cuda.copy: sizes differ", 0) end)
    -- C.raises_own takes a test function's own error exactly, and nothing else
    C.raises_own("boom 7", error, "boom 7")
    assert.has_error(function() C.raises_own("boom", error, "boom 7") end)
  end)

  it("of the C and the Lua parts name what was called, whatever the argument's fault", function()
    local a = cuda.array({ 1, 2, 3 }, "float32")
    -- every call raises, for every kind of bad value (nil included: none takes it)
    local calls = {
      { "cuda.array", function(v) return cuda.array(v, v) end },
      { "cuda.device_array", function(v) return cuda.device_array(v, "float32", "z") end },
      { "cuda.stream", function(v) return cuda.stream(v, v) end },
      { "cuda.compile", function(v) return cuda.compile(v, v) end },
      { "cuda.reduce", function(v) return cuda.reduce(v) end },
      { "cuda.elementwise", function(v) return cuda.elementwise(v, v, v) end },
      { "array:slice", function(v) return a:slice(v, "z") end },
      { "array:fill", function(v) return a:fill(v, "z") end },
    }
    for _, c in ipairs(calls) do
      for _, v in ipairs { 42, "s", {}, true, 2.5, -1 } do
        local e = H.err(c[2], v)
        assert(e, c[1] .. " accepted " .. tostring(v))
        local p = assert(C.prefix(e))
        assert.matches("^cudalua: " .. c[1]:gsub("%p", "%%%0"), p)
      end
    end
    -- one C function registered under two names: the name the call used, the same every run
    -- (the lookup does not hang on the order of a table's keys)
    assert.matches("^cudalua: array:close: ", H.err(a.close, 5))
    assert.matches("^cudalua: cuda.event_elapsed_time: ", H.err(cuda.event_elapsed_time, 1, 2))
  end)
end)
