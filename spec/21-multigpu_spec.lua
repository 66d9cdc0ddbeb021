-- Many GPUs: every object keeps its device and works there whatever device is selected
-- (arrays, streams, events, modules and kernels, graphs, reducers, random states), cuda.gpus,
-- peer access and copies between devices, and NCCL across the GPUs of one process and of one
-- process per GPU. Tagged #multigpu: skipped with fewer than 2 GPUs.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local multi = H.multigpu(it, pending)

local SRC = [[
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void spin_then_add(float *y, float v, int n, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += v;
}]]
local mod
local function K(name) mod = mod or cuda.compile(SRC); return mod:get(name) end
local N = 4099

-- runs fn with device d selected, then goes back to device 0
local function on(d, fn, ...) return cuda.gpus[d]:run(fn, ...) end

local function data(n) return H.rand_table(n or N, -100, 100, true) end   -- exact in float32
local function same(want, arr, what)
  local h = arr:copy_to_host()
  for i = 1, #want do assert.equal(want[i], h[i], (what or "") .. " element " .. i) end
end

before_each(function() if H.ngpus >= 2 then cuda.select_device(0) end end)

describe("objects keep their device", function()
  multi("arrays: copies, fill and elements work whichever device is selected", function()
    local x = data()
    local d0 = on(0, cuda.to_device, x, "float32")
    assert.equal(0, d0.device)
    cuda.select_device(1)
    same(x, d0, "copy_to_host with device 1 selected:")
    d0:fill(3)
    assert.equal(3, d0[7])
    d0[7] = 5
    assert.equal(5, d0:copy_to_host()[7])
    d0:copy_to_device(cuda.array(x, "float32"))
    same(x, d0, "copy_to_device with device 1 selected:")
    local d1 = cuda.device_array(N, "float32")
    assert.equal(1, d1.device)
    assert.is_nil(cuda.pinned_array(4, "float32").device)   -- every device reaches it
  end)

  multi("streams and events work on their device, and mixing devices says which", function()
    local x, y = data(), data()
    local s0 = on(0, cuda.stream)
    local s1 = on(1, cuda.stream)
    assert.equal(0, s0:device())
    assert.equal(1, s1:device())
    local d0 = on(0, cuda.to_device, y, "float32")
    local x0 = on(0, cuda.to_device, x, "float32")
    local k0 = on(0, K, "axpy")
    cuda.select_device(1)
    local e0a, e0b = on(0, cuda.event), on(0, cuda.event)
    e0a:record(s0)
    k0[{ (N + 127) // 128, 128, s0 }](d0, x0, 2, N)
    e0b:record(s0)
    s0:synchronize()
    assert.is_true(s0:query())
    assert.is_true(e0b:query())
    assert.is_true(e0a:elapsed_time(e0b) >= 0)
    local want = {}
    for i = 1, N do want[i] = y[i] + 2 * x[i] end
    same(want, d0)
    -- a device-1 stream waits for a device-0 event
    local e1 = cuda.event()
    s1:wait_event(e0b)
    e1:record(s1)
    e1:synchronize()
    C.raises("cudalua: kernel 'axpy': the stream is on device 1 and the kernel on device 0",
             k0[{ 1, 32, s1 }], d0, x0, 1, 1)
    C.raises("cudalua: event:record: the stream is on device 0 and the event on device 1", e1.record, e1, s0)
    C.raises("cudalua: event:elapsed_time: the events are on devices 0 and 1", e0a.elapsed_time, e0a, e1)
    C.raises("cudalua: array:fill: the stream is on device 0 and the array on device 1", cuda.device_array(4, "float32").fill,
             cuda.device_array(4, "float32"), 1, s0)
  end)

  multi("a module gives each device its own kernels; a kernel runs on its device", function()
    local m = cuda.compile(SRC .. "\n// per device\n")
    local k0 = on(0, function() return m.axpy end)
    local k1 = on(1, function() return m.axpy end)
    assert.are_not.equal(k0, k1)
    local x, y = data(), data()
    local y1, x1 = on(1, cuda.to_device, y, "float32"), on(1, cuda.to_device, x, "float32")
    k1[{ (N + 255) // 256, 256 }](y1, x1, -1, N)   -- device 0 selected
    local want = {}
    for i = 1, N do want[i] = y[i] - x[i] end
    same(want, y1)
    local y0 = on(0, cuda.to_device, y, "float32")
    C.raises("kernel 'axpy' argument 1 (float*): the array is on device 0 and the kernel on device 1 " ..
             "(cuda.enable_peer_access(1, 0) lets device 1's kernels use device 0's memory)", k1[{ 1, 32 }], y0, x1, 1, 1)
  end)

  multi("reduce and random states work on their arrays' devices", function()
    local sum = cuda.reduce("a + b")
    local t0, t1 = data(50000), data(70001)
    local d0 = on(0, cuda.to_device, t0, "int64")
    local want0, want1 = 0, 0
    for i = 1, #t0 do want0 = want0 + t0[i] end
    for i = 1, #t1 do want1 = want1 + t1[i] end
    assert.equal(want0, sum(d0))
    cuda.select_device(1)
    local d1 = cuda.to_device(t1, "int64")
    assert.equal(want1, sum(d1))
    assert.equal(want0, sum(d0))            -- a device-0 array with device 1 selected
    assert.equal(1, cuda.current_device())  -- and the selection given back
    C.raises("does not compile", cuda.reduce("a +"), d0)
    assert.equal(1, cuda.current_device())  -- after an error too
    cuda.select_device(0)
    assert.equal(want1, sum(d1))
    assert.equal(0, cuda.current_device())
    local r1 = on(1, cuda.device_array, 1, "int64")
    sum(d1, { res = r1 })
    assert.equal(want1, r1:copy_to_host()[1])
    C.raises("reduce: res is on device 1 and the input on device 0", sum, d0, { res = r1 })
    -- the same random states on either device
    local a = on(1, cuda.random.create_xoroshiro128p_states, 1000, { seed = 7 })
    local b = on(0, cuda.random.create_xoroshiro128p_states, 1000, { seed = 7 })
    assert.equal(1, a.device)
    local want_states = b:copy_to_host():totable()
    assert.same(want_states, a:copy_to_host():totable())
    a:fill(0)
    cuda.random.init_xoroshiro128p_states(a, 7)   -- device 0 selected, states on device 1
    assert.equal(0, cuda.current_device())
    assert.same(want_states, a:copy_to_host():totable())
  end)

  multi("graphs are built, instantiated and launched on their device", function()
    local x, y = data(), data()
    cuda.select_device(1)
    local y1, x1 = cuda.to_device(y, "float32"), cuda.to_device(x, "float32")
    local g = cuda.graph()
    g:kernel(K("axpy"), { (N + 127) // 128, 128 }, { y1, x1, 3, N })
    local exec = g:instantiate()
    exec:launch()
    cuda.synchronize()
    local want = {}
    for i = 1, N do want[i] = y[i] + 3 * x[i] end
    same(want, y1, "built and launched on device 1:")
    cuda.select_device(0)
    exec:launch()                      -- device 0 selected: still runs on device 1
    cuda.gpus[1]:synchronize()
    for i = 1, N do want[i] = want[i] + 3 * x[i] end
    same(want, y1, "launched again with device 0 selected:")
    local k0 = K("axpy")
    C.raises("cudalua: graph:kernel: the kernel is on device 0 and the graph on device 1", g.kernel, g, k0, { 1, 32 }, { y1, x1, 1, 1 })
    C.raises("cudalua: graph_exec:launch: the stream is on device 0 and the graph on device 1", exec.launch, exec, cuda.stream())
    local d0 = cuda.device_array(N, "float32")
    C.raises("graph:memcpy: the array is on device 0 and the work on device 1", g.memcpy, g, y1, d0)
  end)
end)

describe("cuda.gpus", function()
  multi("counts, selects for a block or a call, and gives the selection back", function()
    assert.equal(#cuda.devices(), #cuda.gpus)
    assert.equal(0, cuda.gpus.current.id)
    do
      local g <close> = cuda.gpus[1]:use()
      assert.equal(1, cuda.current_device())
    end
    assert.equal(0, cuda.current_device())
    local a, b = cuda.gpus[1]:run(function(p, q) return cuda.current_device() + p, q end, 10, "x")
    assert.same({ 11, "x" }, { a, b })
    C.raises_own("boom", cuda.gpus[1].run, cuda.gpus[1], function() error("boom") end)
    assert.equal(0, cuda.current_device())
    assert.matches("^cudalua.gpu<1: ", tostring(cuda.gpus[1]))
    C.raises("cuda.gpus[" .. #cuda.gpus .. "]: device id out of range", function() return cuda.gpus[#cuda.gpus] end)
    C.raises("cuda.gpus: expected a device id (0-based) or 'current', got 1.5", function() return cuda.gpus[1.5] end)
  end)
end)

describe("peer access and copies between devices", function()
  multi("copies between devices, with and without a stream, in both directions", function()
    local x = data(1 << 20)
    local d0 = on(0, cuda.to_device, x, "float32")
    local d1 = on(1, cuda.device_array, #x, "float32")
    d1:copy_to_device(d0)                         -- finished on return
    same(x, d1)
    local s1 = on(1, cuda.stream)
    local back = on(0, cuda.device_array, #x, "float32")
    cuda.copy(back, d1, s1)
    s1:synchronize()
    same(x, back)
    local s0 = cuda.stream()
    d1:fill(0)
    cuda.copy(d1, d0, s0)                          -- on the source's device
    s0:synchronize()
    same(x, d1)
    C.raises("cuda.copy: size mismatch", cuda.copy, d1:slice(1, 10), d0)
    C.raises("cuda.copy: dtype mismatch", cuda.copy, on(1, cuda.device_array, #x, "int32"), d0)
  end)

  multi("kernels use a peer device's memory once peer access is on", function()
    assert.is_true(cuda.can_access_peer(0, 0))
    if not cuda.can_access_peer(0, 1) then
      C.raises("enable_peer_access: device 0 cannot reach device 1's memory", cuda.enable_peer_access, 0, 1)
      return
    end
    local x, y = data(), data()
    local x1 = on(1, cuda.to_device, x, "float32")
    local y0 = cuda.to_device(y, "float32")
    local k = K("axpy")
    C.raises("the array is on device 1 and the kernel on device 0 (cuda.enable_peer_access(0, 1)", k[{ 1, 32 }], y0, x1, 1, 1)
    cuda.enable_peer_access(0, 1)
    cuda.enable_peer_access(0, 1)   -- again: nothing
    k[{ (N + 127) // 128, 128 }](y0, x1, 4, N)
    local want = {}
    for i = 1, N do want[i] = y[i] + 4 * x[i] end
    same(want, y0)
    cuda.disable_peer_access(0, 1)
    C.raises("the array is on device 1 and the kernel on device 0", k[{ 1, 32 }], y0, x1, 1, 1)
    C.raises("(device id 99 out of range", cuda.enable_peer_access, 99, 0)
  end)

  -- fn(spin, x) with peer access 1 -> 0 on: spin(y) queues device 1's spin_then_add on y
  -- (~0.1 s, then y += 1), x is 64 random values
  local function peer_spin(fn)
    if not cuda.can_access_peer(1, 0) then pending("no peer access between the GPUs") return end
    cuda.enable_peer_access(1, 0)
    local k1 = on(1, K, "spin_then_add")
    fn(function(y) on(1, function() k1[{ 1, 64 }](y, 1, 64, 200000000) end) end, data(64))
    cuda.disable_peer_access(1, 0)
  end
  local function plus(x, v) local w = {} for i = 1, #x do w[i] = x[i] + v end return w end

  multi("memory another device used is not freed before that device is done", function()
    -- device 1's kernel spins, then reads a device-0 array through peer access; the array is
    -- dropped meanwhile: the block must stay until the kernel ended
    peer_spin(function(spin, x)
      local y1 = on(1, cuda.to_device, x, "float32")
      local tmp = on(0, cuda.to_device, x, "float32")
      spin(y1)
      assert.equal(0, tmp.device)
      on(1, function()
        local k = mod:get("axpy")
        k[{ 1, 64 }](y1, tmp, 1, 64)   -- queued after the spin, reads device 0's memory
      end)
      tmp:close()
      on(0, function() for _ = 1, 20 do cuda.device_array(64, "float32"):fill(-1e6) end end)
      cuda.gpus[1]:synchronize()
      local want = {}
      for i = 1, 64 do want[i] = x[i] + 1 + x[i] end
      same(want, y1)
    end)
  end)

  multi("stream-less reads, writes, copies and fills wait for another device's work on the array", function()
    -- device 1's kernel spins, then adds to a device-0 array through peer access; device 0's
    -- legacy stream does not order that kernel: each stream-less use must wait for it
    peer_spin(function(spin, x)
      local y0 = cuda.to_device(x, "float32")
      spin(y0)
      assert.equal(x[1] + 1, y0[1], "element read")
      spin(y0)
      same(plus(x, 2), y0, "copy_to_host")
      spin(y0)
      local z0 = cuda.device_array(64, "float32")
      z0:copy_to_device(y0)
      same(plus(x, 3), z0, "device copy")
      spin(y0)
      y0:fill(5)   -- after the kernel's add, not before it
      local fives = {}
      for i = 1, 64 do fives[i] = 5 end
      same(fives, y0, "fill")
      spin(y0)
      y0[2] = 7
      cuda.gpus[1]:synchronize()
      assert.equal(7, y0[2], "element written after the kernel")
    end)
  end)
end)

describe("NCCL across the GPUs of one process", function()
  local nccl = require "cudalua.nccl"
  local function setup(n)
    local comms = nccl.comm_init_all()
    local host = {}
    for r = 1, #comms do host[r] = data(n) end
    return comms, #comms, host
  end

  multi("all_reduce, broadcast, reduce, all_gather, reduce_scatter, send and recv, checked against the CPU", function()
    local n = 1000
    local comms, g, host = setup(n)
    assert.equal(#cuda.gpus, g)
    for r = 1, g do
      assert.equal(r - 1, comms[r]:rank())
      assert.equal(g, comms[r]:size())
      assert.equal(r - 1, comms[r]:device())
    end
    local send, recv = {}, {}
    for r = 1, g do
      send[r] = on(r - 1, cuda.to_device, host[r], "float32")
      recv[r] = on(r - 1, cuda.device_array, n, "float32")
    end
    local function expect(op)
      local t = {}
      for i = 1, n do
        local v = host[1][i]
        for r = 2, g do
          local w = host[r][i]
          v = op == "sum" and v + w or op == "max" and math.max(v, w) or op == "min" and math.min(v, w) or v * w
        end
        t[i] = op == "prod" and C.f32(v) or v
      end
      return t
    end
    local wants = {}
    for _, op in ipairs { "sum", "max", "min", "prod" } do
      nccl.group(function() for r = 1, g do comms[r]:all_reduce(send[r], recv[r], op) end end)
      for r = 1, g do on(r - 1, cuda.synchronize) end
      wants[op] = expect(op)
      for r = 1, g do same(wants[op], recv[r], op .. " rank " .. r - 1 .. ":") end
    end
    -- broadcast from the last rank
    nccl.group(function() for r = 1, g do comms[r]:broadcast(send[r], recv[r], g - 1) end end)
    for r = 1, g do same(host[g], recv[r], "broadcast:") end
    -- all_gather: rank order
    local all = {}
    for r = 1, g do all[r] = on(r - 1, cuda.device_array, n * g, "float32") end
    nccl.group(function() for r = 1, g do comms[r]:all_gather(send[r], all[r]) end end)
    local cat = {}
    for r = 1, g do for i = 1, n do cat[#cat + 1] = host[r][i] end end
    for r = 1, g do same(cat, all[r], "all_gather:") end
    -- reduce_scatter: rank r gets block r of the sum
    local part = {}
    for r = 1, g do part[r] = on(r - 1, cuda.device_array, n // g, "float32") end
    local big = {}
    for r = 1, g do big[r] = on(r - 1, cuda.to_device, data(n // g * g), "float32") end
    nccl.group(function() for r = 1, g do comms[r]:reduce_scatter(big[r], part[r], "sum") end end)
    local bh = {}
    for r = 1, g do bh[r] = big[r]:copy_to_host() end
    for r = 1, g do
      local t = {}
      for i = 1, n // g do
        local v = 0
        for q = 1, g do v = v + bh[q][(r - 1) * (n // g) + i] end
        t[i] = v
      end
      same(t, part[r], "reduce_scatter rank " .. r - 1 .. ":")
    end
    -- reduce to rank 1 (recv nil elsewhere)
    for r = 1, g do recv[r]:fill(0) end
    nccl.group(function()
      for r = 1, g do comms[r]:reduce(send[r], r == 2 and recv[r] or nil, "sum", 1) end
    end)
    same(wants.sum, recv[2], "reduce to rank 1:")
    -- the root must give one
    C.raises("cudalua array expected, got nil", comms[2].reduce, comms[2], send[2], nil, "sum", 1)
    -- avg over the ranks
    nccl.group(function() for r = 1, g do comms[r]:all_reduce(send[r], recv[r], "avg") end end)
    local avg = {}
    for i = 1, n do avg[i] = C.f32(wants.sum[i] / g) end
    for r = 1, g do same(avg, recv[r], "avg:") end
    -- send/recv: a ring
    for r = 1, g do recv[r]:fill(0) end
    nccl.group(function()
      for r = 1, g do
        comms[r]:send(send[r], r % g)
        comms[r]:recv(recv[r], (r - 2) % g)
      end
    end)
    for r = 1, g do same(host[(r - 2) % g + 1], recv[r], "ring:") end
    comms:close()
    assert.equal("cudalua.nccl_comm<closed>", tostring(comms[1]))
  end)

  multi("misuse: no group, mismatched arrays, another device's array, types NCCL lacks", function()
    local comms = nccl.comm_init_all()
    local a0 = on(0, cuda.device_array, 16, "float32")
    local a1 = on(1, cuda.device_array, 16, "float32")
    C.raises("cudalua.nccl: all_reduce: this communicator is one of several this process drives", comms[1].all_reduce, comms[1], a0, a0)
    nccl.group(function()
      C.raises("cudalua.nccl: all_reduce: the array is on device 1 and the communicator on device 0", comms[1].all_reduce, comms[1], a1, a1)
      C.raises("cudalua.nccl: all_reduce: dtype mismatch (float32 and int32)", comms[1].all_reduce, comms[1], a0, on(0, cuda.device_array, 16, "int32"))
      C.raises("cudalua.nccl: all_gather: the receiving array needs " .. 16 * #comms .. " elements, it has 16", comms[1].all_gather, comms[1], a0, a0)
      C.raises("cudalua.nccl: all_reduce: NCCL has no int16", comms[1].all_reduce, comms[1], on(0, cuda.device_array, 4, "int16"), on(0, cuda.device_array, 4, "int16"))
      C.raises("invalid option 'mean'", comms[1].all_reduce, comms[1], a0, a0, "mean")
      C.raises("cudalua.nccl: all_reduce: NCCL works on device memory, got a pinned_array", comms[1].all_reduce, comms[1], cuda.pinned_array(16, "float32"), a0)
    end)
    C.raises("cudalua.nccl: comm_init_all: device 99 is not one of this machine's", nccl.comm_init_all, { 0, 99 })
    C.raises("device 0 given twice", nccl.comm_init_all, { 0, 0 })
    C.raises_own("boom", nccl.group, function() error("boom") end)
    comms:close()
    C.raises("closed communicator", comms[2].all_reduce, comms[2], a1, a1)
  end)
end)

describe("NCCL with one process per GPU", function()
  multi("ranks started as processes join through a unique id and all_reduce", function()
    local nccl = require "cudalua.nccl"
    local id = nccl.unique_id()
    local prog = [[package.cpath = "./?.so;" .. package.cpath
      local cuda = require "cudalua"
      local nccl = require "cudalua.nccl"
      local rank, n = tonumber(os.getenv("RANK")), tonumber(os.getenv("NRANKS"))
      cuda.select_device(rank)
      local comm = nccl.comm_init_rank(n, os.getenv("NCCL_ID"), rank)
      local x = cuda.to_device({ rank + 1, 10 * (rank + 1) }, "int64")
      comm:all_reduce(x, x, "sum")
      local h = x:copy_to_host()
      io.write(("rank %d of %d: %d %d\n"):format(comm:rank(), comm:size(), h[1], h[2]))
      comm:close()]]
    local n = #cuda.gpus
    -- make sanitize runs each rank under a compute-sanitizer of its own (CUDALUA_WORKER_WRAP)
    local wrap = os.getenv("CUDALUA_WORKER_WRAP") or ""
    local procs = {}
    for r = 0, n - 1 do
      procs[r] = io.popen(("RANK=%d NRANKS=%d NCCL_ID=%s %s %s -e %s 2>&1"):format(r, n, id, wrap, H.LUA, H.q(prog)))
    end
    local total = n * (n + 1) // 2
    for r = 0, n - 1 do
      local out = procs[r]:read("a")
      assert.is_true(procs[r]:close(), out)
      assert.matches(("rank %d of %d: %d %d"):format(r, n, total, 10 * total), out, 1, true)
    end
  end)
end)
