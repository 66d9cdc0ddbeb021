-- System functions: is_available, detect, devices, select_device, current_device, synchronize,
-- versions, time, sleep, mem_info, driver_error, and what happens without a driver.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)
local NO_DRIVER = "no CUDA driver found ("

-- detect() writes to any object with :write
local function capture()
  local out = { text = "" }
  function out:write(...) for _, s in ipairs { ... } do self.text = self.text .. s end return self end
  return out
end

describe("cuda.is_available", function()
  it("returns a boolean and never raises", function()
    for _ = 1, 3 do
      local ok, v = pcall(cuda.is_available)
      assert.is_true(ok)
      assert.is_boolean(v)
      assert.equal(H.has_gpu, v)
    end
  end)

  nogpu("is false without a driver, and driver_error says why", function()
    assert.is_false(cuda.is_available())
    assert.matches("^cudalua: no CUDA driver found %(.*libcuda%.so%.1%)$", cuda.driver_error())
  end)

  gpu("is true with a GPU, and driver_error is nil", function()
    assert.is_true(cuda.is_available())
    assert.is_nil(cuda.driver_error())
  end)
end)

describe("cuda.launches_block", function()
  nogpu("is false without a driver", function()
    assert.is_false(cuda.launches_block())
  end)

  gpu("is true with CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer, else false", function()
    local got = cuda.launches_block()   -- first: cuInit loads a sanitizer's library
    local maps = assert(H.read("/proc/self/maps"))
    assert.equal(os.getenv("CUDA_LAUNCH_BLOCKING") == "1" or maps:find("sanitizer", 1, true) ~= nil, got)
    local out = H.child("print(cuda.launches_block())", { CUDA_LAUNCH_BLOCKING = "1" })
    assert.equal("true\n", out)
  end)
end)

describe("cuda.versions", function()
  it("gives the NVRTC version and cudalua's own", function()
    local v = cuda.versions()
    assert.is_table(v.nvrtc)
    assert.is_true(math.type(v.nvrtc[1]) == "integer" and v.nvrtc[1] >= 11)
    assert.is_true(math.type(v.nvrtc[2]) == "integer" and v.nvrtc[2] >= 0)
    assert.matches("^%d+%.%d+%.%d+$", v.cudalua)
  end)

  nogpu("has no driver version without a driver", function()
    assert.is_nil(cuda.versions().driver)
  end)

  gpu("has the driver version as an integer such as 12040", function()
    local d = cuda.versions().driver
    assert.equal("integer", math.type(d))
    assert.is_true(d >= 11000)
  end)
end)

describe("cuda.detect", function()
  it("reports cudalua and NVRTC, and returns is_available()", function()
    local out = capture()
    local r = cuda.detect(out)
    assert.equal(H.has_gpu, r)
    local v = cuda.versions()
    assert.matches("cudalua " .. v.cudalua, out.text, 1, true)
    assert.matches(("NVRTC: %d.%d"):format(v.nvrtc[1], v.nvrtc[2]), out.text, 1, true)
  end)

  nogpu("says why no GPU is usable", function()
    local out = capture()
    assert.is_false(cuda.detect(out))
    assert.matches(NO_DRIVER, out.text, 1, true)
  end)

  gpu("lists every device with its name and compute capability", function()
    local out = capture()
    assert.is_true(cuda.detect(out))
    local devs = cuda.devices()
    assert.matches(("Found %d CUDA device"):format(#devs), out.text, 1, true)
    for _, d in ipairs(devs) do
      assert.matches(d.name, out.text, 1, true)
      assert.matches(("compute capability %d.%d"):format(d.compute_capability[1], d.compute_capability[2]),
                     out.text, 1, true)
    end
  end)

  it("rejects an output without write", function()
    C.raises("write", cuda.detect, {})
  end)
end)

describe("cuda.use_cpu", function()
  local KERNEL = [[
local k = cuda.kernel('extern "C" __global__ void k(int *x, int n) {'
  .. ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] = 3 * i + 1; }', 'k')
local x = cuda.device_array(1000, 'int32')
k[{ 8, 128 }](x, 1000)
local h, ok = x:copy_to_host(), true
for i = 1, 1000 do ok = ok and h[i] == 3 * (i - 1) + 1 end
print("kernel", ok)
]]
  it("moves a process that found no GPU to the CPU device, where kernels run", function()
    local out = H.child("print(cuda.is_available())\nprint(cuda.use_cpu(), cuda.is_available(), cuda.devices()[1].kind)\n"
      .. KERNEL .. "print(cuda.use_cpu())\nprint(require('cudalua.nccl').is_available())",
      { CUDALUA_LIBCUDA = "/nonexistent/libcuda.so.1", CUDALUA_DEVICE = "" })
    assert.equal("false\ntrue\ttrue\tcpu\nkernel\ttrue\ntrue\nfalse\tcudalua.nccl: cudalua's CPU device "
      .. "(CUDALUA_DEVICE=cpu) has no GPUs for NCCL\n", out)
  end)

  it("raises once the GPU's driver is in use, naming the way to choose the CPU device", function()
    if not H.has_gpu or H.cpu_device then return pending("it needs the GPU's driver in use") end
    local out = H.child("cuda.devices()\nprint(pcall(cuda.use_cpu))\nprint(cuda.devices()[1].kind)", { CUDALUA_DEVICE = "" })
    assert.matches("false\tcudalua: cuda.use_cpu: the GPU's driver is in use already: call it before the first use "
      .. "of a device (or set CUDALUA_DEVICE=cpu)\ngpu\n", out, 1, true)
  end)

  -- CI once saw such a child die of a segmentation fault at exit: the device's threads were
  -- left asleep in cudalua's code as Lua unloaded it (now joined as the last state closes)
  it("lets processes exit cleanly right after a launch, with work still queued", function()
    local code = KERNEL .. "k[{ 64, 128 }](x, 1000)\nk[{ 64, 128 }](x, 1000)\n"
    for i = 1, 16 do
      local out, ok = H.child(code, { CUDALUA_DEVICE = "cpu" })
      assert.equal("kernel\ttrue\n", out, "child " .. i)
      assert.is_true(ok, "child " .. i .. ": " .. out)
    end
  end)
end)

describe("cuda.devices", function()
  gpu("lists devices with 0-based ids and their properties", function()
    local devs = cuda.devices()
    assert.is_true(#devs >= 1)
    for i, d in ipairs(devs) do
      assert.equal(i - 1, d.id)
      assert.is_string(d.name)
      assert.is_true(#d.name > 0)
      assert.is_true(d.kind == "gpu" or d.kind == "cpu")
      if d.kind == "gpu" then
        assert.is_true(d.compute_capability[1] >= 3)
        assert.is_true(d.compute_capability[2] >= 0)
      else -- the CPU device claims no GPU architecture
        assert.same({ 0, 0 }, d.compute_capability)
      end
      assert.is_true(d.multiprocessors >= 1)
      assert.is_true(d.total_memory >= 2 ^ 30)
      assert.is_true(d.max_threads_per_block >= 512)
      assert.is_boolean(d.concurrent_managed_access)
    end
  end)

  nogpu("raises without a driver", function()
    C.raises(NO_DRIVER, cuda.devices)
  end)
end)

describe("cuda.select_device and cuda.current_device", function()
  gpu("select a device by its 0-based id", function()
    local n = #cuda.devices()
    for id = n - 1, 0, -1 do
      cuda.select_device(id)
      assert.equal(id, cuda.current_device())
      local d = cuda.to_device({ 1, 2, 3 }, "int32")
      assert.same({ 1, 2, 3 }, d:copy_to_host():totable())
    end
    assert.equal(0, cuda.current_device())
  end)

  gpu("reject ids out of range", function()
    local n = #cuda.devices()
    C.raises(("device id %d out of range (0..%d)"):format(n, n - 1), cuda.select_device, n)
    C.raises(("device id -1 out of range (0..%d)"):format(n - 1), cuda.select_device, -1)
    C.raises("number has no integer representation", cuda.select_device, 0.5)
    assert.equal(0, cuda.current_device())
  end)

  it("reject an id that is not a number", function()
    C.raises("number expected, got string", cuda.select_device, "zero")
    C.raises("number expected, got no value", cuda.select_device)
  end)

  nogpu("raise without a driver", function()
    C.raises(NO_DRIVER, cuda.select_device, 0)
    C.raises(NO_DRIVER, cuda.current_device)
  end)
end)

describe("cuda.synchronize", function()
  gpu("waits for queued work", function()
    local t = H.rand_table(1001, -50, 50, true)
    local s = cuda.stream()
    local d = cuda.to_device(cuda.array(t, "int32"), s)
    local h = cuda.pinned_array(1001, "int32")
    d:copy_to_host(h, s)
    cuda.synchronize()
    assert.is_true(s:query())
    assert.same(t, h:totable())
  end)

  nogpu("raises without a driver", function()
    C.raises(NO_DRIVER, cuda.synchronize)
  end)
end)

describe("cuda.mem_info", function()
  gpu("gives free and total bytes of the current device", function()
    local free, total = cuda.mem_info()
    assert.equal("integer", math.type(free))
    assert.is_true(free > 0 and free <= total)
    assert.equal(cuda.devices()[cuda.current_device() + 1].total_memory, total)
  end)

  nogpu("raises without a driver", function()
    C.raises(NO_DRIVER, cuda.mem_info)
  end)
end)

describe("cuda.time and cuda.sleep", function()
  it("time is a monotonic clock in seconds; sleep waits that long", function()
    local t0 = cuda.time()
    assert.equal("float", math.type(t0))
    cuda.sleep(0.05)
    local dt = cuda.time() - t0
    assert.is_true(dt >= 0.05, "slept " .. dt)
    assert.is_true(dt < 2, "slept " .. dt)
    cuda.sleep(0)
    assert.is_true(cuda.time() >= t0 + dt)
  end)

  it("sleep rejects negative and non-numeric durations", function()
    C.raises("seconds must be >= 0", cuda.sleep, -1)
    C.raises("number expected, got string", cuda.sleep, "1s")
    C.raises("number expected, got no value", cuda.sleep)
  end)
end)

describe("without a driver", function()
  nogpu("require works, host arrays and compiling work, device calls raise", function()
    assert.is_table(cuda)
    assert.same({ 1, 2 }, cuda.array({ 1, 2 }):totable())
    assert.is_table(cuda.compile("__global__ void f() {}", { arch = "sm_90" }))
    for _, f in ipairs {
      function() return cuda.device_array(10, "float32") end,
      function() return cuda.pinned_array(10, "float32") end,
      function() return cuda.mapped_array(10, "float32") end,
      function() return cuda.managed_array(10, "float32") end,
      function() return cuda.to_device({ 1, 2 }) end,
      function() return cuda.stream() end,
      function() return cuda.event() end,
      function() return cuda.default_stream():synchronize() end,
    } do
      C.raises(NO_DRIVER, f)
    end
  end)

  nogpu("compiling without arch asks for one", function()
    C.raises('give opts.arch (e.g. "sm_90") to compile without a GPU', cuda.compile,
             "__global__ void f() {}")
  end)
end)
