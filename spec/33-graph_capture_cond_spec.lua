-- Conditional nodes made in a stream capture (the capture form of graph:condition and
-- graph:if_then / if_else / while_loop / switch): stream:condition{default = v} and
-- stream:while_loop(cond, function(body_stream) ... end), each body captured on a stream of its
-- own. Ported facts: cuda.core's tests/graph/test_graph_builder_conditional.py (GraphBuilder
-- capture form): an IF body with a fork and a join that adds to a[0] three times and to a[1]
-- once, then one more add to a[0] after the node (true: 4, 1; false: 1, 0); IF/ELSE whose else
-- body adds to a[1] three times (false: 1, 3); a SWITCH of three cases (case 0: a[0] + 3;
-- case 1: a[1] + 2 and a[2] + 1 through a fork; case 2: a[2] + 3; a value of 3 runs none);
-- a WHILE whose body adds to a[0] twice and stops after 10 runs (20; a default of 0: never).
-- Values other than those are random and checked against the CPU.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local SRC = [[
extern "C" __global__ void add_one(int *a) { *a += 1; }
extern "C" __global__ void set_handle(cudaGraphConditionalHandle h, int v) { cudaGraphSetConditional(h, v); }
// the body's last kernel: the loop ends once it ran limit times
extern "C" __global__ void loop_kernel(int *count, int limit, cudaGraphConditionalHandle h) {
  if (++*count >= limit) cudaGraphSetConditional(h, 0);
}
extern "C" __global__ void odd(const int *count, cudaGraphConditionalHandle h) {
  cudaGraphSetConditional(h, *count & 1);
}
extern "C" __global__ void add(float *x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}
]]
local mod
local function K(name)
  mod = mod or cuda.compile(SRC)
  return mod[name]
end
local function ints(n) return cuda.device_array(n, "int32"):fill(0) end
local ONE = { 1, 1 }

-- the graph captured on s by fn(s) (s: a new stream), its stream
local function capture(fn)
  local s = cuda.stream()
  s:begin_capture()
  local ok, e = pcall(fn, s)
  local g = s:end_capture()
  assert(ok, e)
  return g, s
end

-- an add on a (a one-element array) launched on s
local function inc(a, s) K("add_one")[{ 1, 1, s }](a) end

-- cuda.core's split and join: work on a second stream inside the capture, joined back by events
local function fork_join(s, left, right)
  local other = cuda.stream()
  local e1, e2 = cuda.event(), cuda.event()
  e1:record(s)
  other:wait_event(e1)
  left(s)
  right(other)
  e2:record(other)
  s:wait_event(e2)
end

describe("conditional nodes in a stream capture", function()
  gpu("if_then and if_else: cuda.core's fork and join in the body, the condition from a kernel", function()
    for _, v in ipairs { 0, 1, math.random(2, 1000) } do
      for _, with_else in ipairs { false, true } do
        local a0, a1 = ints(1), ints(1)
        local g, s = capture(function(s)
          local c = s:condition()
          assert.matches("^cudalua.graph_condition<", tostring(c))
          K("set_handle")[{ 1, 1, s }](c, v)
          local function then_body(b)
            inc(a0, b)
            fork_join(b, function(x) inc(a0, x) end, function(y) inc(a1, y) end)
            inc(a0, b)
          end
          if with_else then
            s:if_else(c, then_body, function(b) for _ = 1, 3 do inc(a1, b) end end)
          else
            s:if_then(c, then_body)
          end
          inc(a0, s)   -- after the node
        end)
        g:launch(s)
        s:synchronize()
        local want0, want1 = 1, 0
        if v ~= 0 then want0, want1 = 4, 1 elseif with_else then want1 = 3 end
        assert.same({ want0, want1 }, { a0[1], a1[1] })
        g:close()
      end
    end
  end)

  gpu("switch runs the case the condition names, none past the last (cuda.core's three cases)", function()
    for v = 0, 3 do
      local a = { ints(1), ints(1), ints(1) }
      local g, s = capture(function(s)
        local c = s:condition()
        K("set_handle")[{ 1, 1, s }](c, v)
        s:switch(c, {
          function(b) for _ = 1, 3 do inc(a[1], b) end end,
          function(b)
            inc(a[2], b)
            fork_join(b, function(x) inc(a[2], x) end, function(y) inc(a[3], y) end)
          end,
          function(b) for _ = 1, 3 do inc(a[3], b) end end,
        })
        inc(a[1], s)
      end)
      g:launch(s)
      s:synchronize()
      local want = ({ [0] = { 4, 0, 0 }, { 1, 2, 1 }, { 1, 0, 3 }, { 1, 0, 0 } })[v]
      assert.same(want, { a[1][1], a[2][1], a[3][1] })
      g:close()
    end
  end)

  gpu("while_loop runs until a body kernel sets 0, from the default at each launch (cuda.core's 20)", function()
    for _, default in ipairs { 1, 0 } do
      local a, count = ints(1), ints(1)
      local g, s = capture(function(s)
        local c = s:condition { default = default }
        s:while_loop(c, function(b)
          inc(a, b); inc(a, b)
          K("loop_kernel")[{ 1, 1, b }](count, 10, c)
        end)
        K("add_one")[{ 1, 1, s }](count)   -- after the loop
      end)
      g:launch(s)
      s:synchronize()
      assert.equal(default == 1 and 20 or 0, a[1])
      assert.equal(default == 1 and 11 or 1, count[1])
      g:close()
    end
  end)

  gpu("a WHILE loop with a nested IF on a body condition, replayed, against the CPU", function()
    local n = math.random(100, 5000)
    local times = math.random(3, 40)
    local x = H.rand_table(n, -100, 100, true)
    local d = cuda.to_device(cuda.array(x, "float32"))
    local count = ints(1)
    local cfg = { (n + 127) // 128, 128 }
    local g, s = capture(function(s)
      count:fill(0, s)   -- a memset node: each launch starts from 0
      local c = s:condition { default = 1 }
      s:while_loop(c, function(b)
        K("add")[{ cfg[1], cfg[2], b }](d, 1, n)        -- every run
        local odd = b:condition()
        K("odd")[{ 1, 1, b }](count, odd)
        b:if_then(odd, function(bb) K("add")[{ cfg[1], cfg[2], bb }](d, 10, n) end)   -- runs 1, 3, ...
        K("loop_kernel")[{ 1, 1, b }](count, times, c)
      end)
    end)
    local exec = g:instantiate()
    local launches = math.random(1, 3)
    for _ = 1, launches do exec:launch(s) end
    s:synchronize()
    -- per launch: `times` runs add 1; the runs where count (before its increment) is odd add 10
    local per = times
    for k = 0, times - 1 do if k % 2 == 1 then per = per + 10 end end
    local h = d:copy_to_host()
    for i = 1, n do assert.equal(x[i] + launches * per, h[i]) end
    assert.equal(times, count[1])
    exec:close(); g:close()
  end)

  gpu("the graph keeps what its bodies use: arrays and kernels dropped after the capture", function()
    local n = math.random(100, 2000)
    local x = H.rand_table(n, -100, 100, true)
    local out = cuda.device_array(n, "float32")
    -- only the graph keeps the module and the array once the capture ended
    local hold = { m = cuda.compile(SRC), tmp = cuda.to_device(cuda.array(x, "float32")) }
    local g, s = capture(function(s)
      local c = s:condition { default = 1 }
      s:if_then(c, function(b)
        hold.m.add[{ (n + 127) // 128, 128, b }](hold.tmp, 5, n)
        cuda.copy(out, hold.tmp, b)
      end)
    end)
    hold.m, hold.tmp = nil, nil
    collectgarbage(); collectgarbage()
    for _ = 1, 3 do g:launch(s) end
    s:synchronize()
    local h = out:copy_to_host()
    for i = 1, n do assert.equal(x[i] + 15, h[i]) end
    g:close()
  end)

  gpu("misuse inside a body is refused by name; the capture goes on", function()
    local a = ints(1)
    local errs = {}
    local other = cuda.stream()
    local g, s = capture(function(s)
      local function cond() return s:condition { default = 1 } end
      other:begin_capture("relaxed")
      local foreign = other:condition()
      K("add_one")[{ 1, 1, other }](a)
      other:end_capture():close()
      errs.foreign = H.err(s.while_loop, s, foreign, function(b) inc(a, b) end)
      errs.launch_foreign = H.err(function() K("set_handle")[{ 1, 1, s }](foreign, 0) end)
      errs.notfn = H.err(s.if_then, s, cond(), 42)
      errs.noswitch = H.err(s.switch, s, cond(), {})
      errs.empty = H.err(s.if_then, s, cond(), function() end)
      errs.own = H.err(s.if_then, s, cond(), function(b) inc(a, b); error("mine", 0) end)
      local used = cond()
      s:if_then(used, function(b) inc(a, b) end)
      errs.reused = H.err(s.while_loop, s, used, function(b) inc(a, b) end)
      s:if_then(cond(), function(b)
        inc(a, b)
        errs.host = H.err(b.launch_host_func, b, function() end)
        errs.alloc = H.err(cuda.device_array, 4, "float32", { stream = b })
        errs.record = H.err(function() cuda.event():record(b, { external = true }) end)
        errs.end_body = H.err(b.end_capture, b)
        errs.end_outer = H.err(s.end_capture, s)
        errs.close_body = H.err(b.close, b)
        errs.close_outer = H.err(s.close, s)
      end)
    end)
    g:close()
    local want = {
      foreign = "cudalua: stream:while_loop: the condition is not this capture's",
      launch_foreign = "a graph condition is an argument only of kernel nodes of its graph",
      notfn = "cudalua: stream:if_then: body 1: expected a function (called with the body's stream), got number",
      noswitch = "cudalua: stream:switch: the list of body functions must have 1 to 4096, got 0",
      empty = "cudalua: stream:if_then: the body's function queued no work on the body's stream",
      own = "mine",
      reused = "cudalua: stream:while_loop: the condition already controls a conditional node",
      host = "cudalua: stream:launch_host_func: a conditional node's body cannot call Lua host functions",
      alloc = "cudalua: cuda.device_array: a conditional node's body cannot allocate memory",
      record = "cudalua: event:record: a conditional node's body cannot have event record nodes",
      end_body = "cudalua: stream:end_capture: the stream captures a conditional node's body",
      end_outer = "cudalua: stream:end_capture: a conditional node's body of this capture is being captured",
      close_body = "cudalua: stream:close: the stream captures a conditional node's body",
      close_outer = "cudalua: stream:close: the stream captures a conditional node's body",
    }
    for k, msg in pairs(want) do
      assert(errs[k], k .. ": no error")
      assert.matches(msg, errs[k], 1, true)
      if k ~= "own" then assert(C.prefix(errs[k])) end
    end
    -- the explicit form refuses a condition's second node the same way
    local eg = cuda.graph()
    local ec = eg:condition { default = 0 }
    eg:if_then(ec):kernel(K("add_one"), ONE, { a })
    C.raises("cudalua: graph:while_loop: the condition already controls a conditional node", eg.while_loop, eg, ec)
    eg:close()
    -- outside any capture
    local idle = cuda.stream()
    C.raises("cudalua: stream:condition: the stream is not capturing", idle.condition, idle)
    C.raises("cudalua: stream:while_loop: the stream is not capturing", idle.while_loop, idle, nil, function() end)
    C.raises("cudalua: stream:condition: the legacy default stream cannot be captured", cuda.default_stream().condition,
      cuda.default_stream())
  end)
end)
