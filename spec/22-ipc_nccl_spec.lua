-- Sharing between processes and collectives that need only one GPU: device memory and events
-- passed to another process by handle (cuda.device_array(shape, dtype, {ipc = true}),
-- a:ipc_handle(), cuda.open_ipc_array, cuda.event{interprocess = true}, cuda.open_ipc_event),
-- and cudalua.nccl on one GPU and without NCCL. The spec on two GPUs is spec/21-multigpu.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nccl = require "cudalua.nccl"

-- a child process, the parent's handles in its environment
local child = H.child

describe("device memory shared between processes", function()
  it("misuse without a GPU: handles are checked before anything else", function()
    C.raises("argument 1: not a memory handle from array:ipc_handle()", cuda.open_ipc_array, "junk", 4, "float32")
    C.raises("argument 1: not an event handle from event:ipc_handle()", cuda.open_ipc_event, "cudalua-ipc-event:zz")
    C.raises("cudalua: cuda.event: unknown option 'ipc' (timing, interprocess)", cuda.event, { ipc = true })
    C.raises("cudalua: cuda.event: an interprocess event cannot time (timing = false)", cuda.event, { interprocess = true, timing = true })
    C.raises("cuda.device_array: unknown option 'shared' (stream, ipc)", cuda.device_array, 4, "float32", { shared = true })
  end)

  H.gpuonly(it, pending, "CUDA IPC")("another process reads and writes an array through its handle, ordered by an event", function()
    local n = 100000
    local x = H.rand_table(n, -1000, 1000, true)
    local a = cuda.device_array(n, "float32", { ipc = true })
    a:copy_to_device(cuda.array(x, "float32"))
    local view = a:slice(11, 20)
    local ev = cuda.event { interprocess = true }
    ev:record()
    local out, ok = child([[
      local a = cuda.open_ipc_array(os.getenv("H"), tonumber(os.getenv("N")), "float32")
      local v = cuda.open_ipc_array(os.getenv("V"), 10, "float32")
      cuda.open_ipc_event(os.getenv("E")):synchronize()
      local k = cuda.kernel('extern "C" __global__ void twice(float *x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }', "twice")
      k[{ (#a + 255) // 256, 256 }](a, #a)
      cuda.synchronize()
      io.write(a.kind, " ", #a, " ", v[1], " ", v[10], "\n")]], { H = a:ipc_handle(), V = view:ipc_handle(), E = ev:ipc_handle(), N = tostring(n) })
    assert.is_true(ok, out)
    assert.equal(("device_array %d %d %d\n"):format(n, 2 * x[11], 2 * x[20]), out)
    local h = a:copy_to_host()
    for i = 1, n do assert.equal(2 * x[i], h[i], "element " .. i) end
  end)

  H.gpuonly(it, pending, "CUDA IPC")("misuse: pool memory, the same process, a shape larger than the handle, a plain event", function()
    C.raises("cudalua: array:ipc_handle: this array's memory comes from the stream-ordered pool, which cannot be shared; make it with cuda.device_array(shape, dtype, {ipc = true})",
             cuda.device_array(4, "float32").ipc_handle, cuda.device_array(4, "float32"))
    C.raises("cudalua: array:ipc_handle: only device arrays can be shared", cuda.pinned_array(4, "float32").ipc_handle, cuda.pinned_array(4, "float32"))
    local a = cuda.device_array(16, "float64", { ipc = true })
    local h = a:ipc_handle()
    assert.matches("^cudalua%-ipc%-mem:%x+:0:128$", h)
    C.raises("a handle opens in another process, not the one that made it", cuda.open_ipc_array, h, 16, "float64")
    local out, ok = child('cuda.open_ipc_array(os.getenv("H"), 17, "float64")', { H = h })
    assert.is_falsy(ok)
    assert.matches("cuda.open_ipc_array: the shape and dtype need 136 bytes, the handle covers 128", out, 1, true)
    C.raises("event:ipc_handle: the event was not made with cuda.event{interprocess = true}", cuda.event(false).ipc_handle, cuda.event(false))
    a:close()
  end)
end)

describe("cudalua.nccl", function()
  it("loads without NCCL and says so on use (in a process where it cannot be found)", function()
    local out = child([[local nccl = require "cudalua.nccl"
      local ok, why = nccl.is_available()
      io.write(tostring(ok), " | ", why, " | ", select(2, pcall(nccl.unique_id)))]], { CUDALUA_NCCL = "/nonexistent/libnccl.so.2" })
    assert.matches("^false | cudalua.nccl: NCCL not found: CUDALUA_NCCL=/nonexistent/libnccl.so.2 cannot be opened", out)
    assert.matches("| cudalua.nccl: NCCL not found: CUDALUA_NCCL=", out, 1, true)
  end)

  it("gives unique ids and checks the arguments of comm_init_rank (where NCCL is)", function()
    local have, why = nccl.is_available()
    if not have then pending("no NCCL here: " .. why) return end
    local id = nccl.unique_id()
    assert.matches("^" .. ("%x"):rep(256) .. "$", id)
    assert.are_not.equal(id, nccl.unique_id())
    assert.is_true(nccl.version() >= 20000)
    C.raises("argument 2: not an id from nccl.unique_id() (256 hex characters)", nccl.comm_init_rank, 2, "abc", 0)
    C.raises("argument 3: rank must be 0..1", nccl.comm_init_rank, 2, id, 2)
    C.raises("nccl.comm_init_rank: id must be the string nccl.unique_id() gave, got nil", nccl.comm_init_rank, 2, nil, 0)
    C.raises("nccl.group: expected a function, got nil", nccl.group, nil)
    C.raises("nccl.group: expected a function, got no value", nccl.group)
  end)

  H.gpuonly(it, pending, "NCCL")("one communicator on one GPU: collectives without a group, every op, closing", function()
    local have, why = nccl.is_available()
    if not have then pending("no NCCL here: " .. why) return end
    local comms = nccl.comm_init_all { cuda.current_device() }
    local c = comms[1]
    assert.equal(0, c:rank())
    assert.equal(1, c:size())
    local x = H.rand_table(1000, -50, 50, true)
    local send, recv = cuda.to_device(x, "float64"), cuda.device_array(1000, "float64")
    for _, op in ipairs { "sum", "prod", "max", "min", "avg" } do
      recv:fill(0)
      c:all_reduce(send, recv, op)
      assert.same(x, recv:copy_to_host():totable(), op)
    end
    local s = cuda.stream()
    local i8 = cuda.to_device({ 1, -2, 3 }, "int8")
    c:all_reduce(i8, i8, "sum", s)         -- in place, on a stream
    s:synchronize()
    assert.same({ 1, -2, 3 }, i8:copy_to_host():totable())
    assert.matches("^cudalua.nccl_comm<rank 0 of 1, device %d+>$", tostring(c))
    assert.is_nil(c:async_error())
    do local cs <close> = comms end
    assert.equal("cudalua.nccl_comm<closed>", tostring(c))
    C.raises("closed communicator", c.all_reduce, c, send, recv)
  end)

  H.gpuonly(it, pending, "NCCL")("collectives take a graph's memory in that graph's capture only", function()
    local have, why = nccl.is_available()
    if not have then pending("no NCCL here: " .. why) return end
    local comms <close> = nccl.comm_init_all { cuda.current_device() }
    local c = comms[1]
    local n = math.random(10, 500)
    local x = H.rand_table(n, -50, 50, true)
    local src, out = cuda.to_device(x, "float64"), cuda.device_array(n, "float64")
    -- an array of graph:alloc, outside its graph: refused outside any capture and inside one
    local other = cuda.graph()
    local an, arr = other:alloc({ n }, "float64")
    other:free(arr, { an })
    C.raises("cudalua: comm:all_reduce: the array's memory is a graph's", c.all_reduce, c, arr, out)
    C.raises("cudalua: comm:broadcast: the array's memory is a graph's", c.broadcast, c, src, arr, 0)
    local s = cuda.stream()
    s:begin_capture()
    local ok1, e1 = pcall(c.all_reduce, c, arr, out, "sum", s)
    local ok2, e2 = pcall(c.send, c, arr, 0, s)
    -- the capture's own allocation: a collective in the capture may use it
    local tmp = cuda.device_array(n, "float64", { stream = s })
    tmp:copy_to_device(src, s)
    c:all_reduce(tmp, out, "max", s)
    tmp:close()
    local g = s:end_capture()
    assert.is_false(ok1); assert.is_false(ok2)
    assert.matches("comm:all_reduce: the array is from graph:alloc: only its graph's nodes may use it", e1, 1, true)
    assert.matches("comm:send: the array is from graph:alloc: only its graph's nodes may use it", e2, 1, true)
    out:fill(0)
    g:launch(s)
    s:synchronize()
    assert.same(x, out:copy_to_host():totable())
    g:close(); other:close()
  end)
end)
