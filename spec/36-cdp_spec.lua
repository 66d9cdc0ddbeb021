-- Dynamic parallelism (kernels launching kernels, CDP2): cuda.link takes static libraries
-- (ar archives) and adds the CUDA device runtime (libcudadevrt.a) itself when the code needs
-- it; cuda.kernel links relocatable code on its own; cuda.set_limit / cuda.get_limit. Linking
-- needs no GPU (arch = "sm_90"); launching does.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local MOD = require "cudalua.module"
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)

local CUDA_DIR = os.getenv("CUDA_DIR") or os.getenv("CUDA_HOME") or "/usr/local/cuda"
local NVCC = CUDA_DIR .. "/bin/nvcc"
local have_nvcc = os.execute(H.q(NVCC) .. " --version >/dev/null 2>&1")
local function with_nvcc(test, name, fn)
  if have_nvcc then test(name, fn) else pending(name .. " (no nvcc at " .. NVCC .. ")") end
end
local DEVRT = CUDA_DIR .. "/lib64/libcudadevrt.a"
local have_devrt = H.read(DEVRT) ~= nil
local function with_devrt(test, name, fn)
  if have_devrt then test(name, fn) else pending(name .. " (no " .. DEVRT .. ")") end
end

-- a parent whose every thread launches a child grid writing v[i] * a + i into its slice
local CDP = [[
extern "C" __global__ void child(int *out, const int *v, int a, int base) {
  int i = base + threadIdx.x;
  out[i] = v[i] * a + i;
}
extern "C" __global__ void parent(int *out, const int *v, int a, int per) {
  child<<<1, per>>>(out, v, a, (blockIdx.x * blockDim.x + threadIdx.x) * per);
}
]]
local PLAIN = 'extern "C" __global__ void twice(int *x) { x[threadIdx.x] *= 2; }'

-- a relocatable cubin's undefined references to the device runtime, as its symbol names
local function calls_devrt(m) return m:image():find("__cudaCDP2", 1, true) ~= nil end

-- runs a child process (the environment matters: CUDALUA_CUDADEVRT is read once a process)
local function child_run(env, prog)
  return H.run(("%s %s -e %s 2>&1"):format(env, H.LUA, H.q('package.cpath = "./?.so;" .. package.cpath\n' .. prog)))
end

describe("cuda.link and the device runtime", function()
  it("links a kernel that launches kernels with nothing else, without a GPU", function()
    local m = cuda.compile(CDP, { arch = "sm_90", relocatable = true })
    assert.is_true(calls_devrt(m))
    local l = cuda.link { m }
    assert.equal("cubin", l:kind())
    assert.is_false(MOD.elf_info(l:cubin()).relocatable)
    for _, k in ipairs { "child", "parent" } do
      assert.truthy(MOD.fields(l).info[k], k)
    end
    assert.equal("pqii", MOD.fields(l).info.parent.codes)
    -- LTO-IR hides the names: the first link fails on them and is done again with the library
    local lto = cuda.link { cuda.compile(CDP, { arch = "sm_90", lto = true }) }
    assert.equal("cubin", lto:kind())
  end)

  it("does not add the device runtime where nothing needs it", function()
    local m = cuda.compile(PLAIN, { arch = "sm_90", relocatable = true })
    assert.is_false(calls_devrt(m))
    local l = cuda.link { m }
    assert.same({ "twice" }, l:kernels())
  end)

  with_devrt(it, "takes the toolkit's libcudadevrt.a as an input, by path and as bytes", function()
    local m = cuda.compile(CDP, { arch = "sm_90", relocatable = true })
    for _, lib in ipairs { DEVRT, H.read(DEVRT) } do
      local l = cuda.link { m, lib }
      assert.is_false(MOD.elf_info(l:cubin()).relocatable)
    end
  end)

  -- (a library's members are host objects holding device code, as nvcc -dc makes them)
  with_nvcc(it, "links a static library made with ar of nvcc -rdc objects", function()
    local dir = H.tmpdir()
    local x = math.random(2, 1000)
    H.write(dir .. "/lib.cu", ("__device__ int scale(int v) { return v * %d; }"):format(x))
    local ok = H.sh(("%s -arch=sm_90 -rdc=true -c -o %s %s"):format(H.q(NVCC), H.q(dir .. "/lib.o"), H.q(dir .. "/lib.cu")))
    assert.truthy(ok, "nvcc")
    ok = H.sh(("cd %s && ar rcs libscale.a lib.o"):format(H.q(dir)))
    assert.truthy(ok, "ar")
    local m = cuda.compile('extern __device__ int scale(int);\nextern "C" __global__ void k(int *x) { x[threadIdx.x] = scale(x[threadIdx.x]); }',
                           { arch = "sm_90", relocatable = true })
    C.raises("cuda.link: linking failed", cuda.link, { m })
    local l = cuda.link { m, dir .. "/libscale.a" }
    assert.same({ "k" }, l:kernels())
    H.rmrf(dir)
  end)

  it("misuse: a damaged archive, an archive given to load_module", function()
    local m = cuda.compile(PLAIN, { arch = "sm_90", relocatable = true })
    local junk = "!<arch>\n" .. string.rep("x", math.random(1, 200))
    C.raises("cuda.link: input 2: a damaged static library (its member headers do not fit in it)", cuda.link, { m, junk })
    local dir = H.tmpdir()
    H.write(dir .. "/bad.a", junk)
    C.raises("cuda.link: input 2: " .. dir .. "/bad.a is a damaged static library", cuda.link, { m, dir .. "/bad.a" })
    C.raises("cuda.load_module: " .. dir .. "/bad.a is a static library (ar archive), which cannot be loaded: give it "
             .. "to cuda.link with the code that uses it", cuda.load_module, dir .. "/bad.a")
    C.raises("cuda.load_module: a static library (ar archive) cannot be loaded", cuda.load_module, junk)
    H.rmrf(dir)
  end)

  it("says where it looked when the device runtime is not found, and how to point at it", function()
    local prog = [[local cuda = require "cudalua"
      local m = cuda.compile(...CDP..., {arch = "sm_90", relocatable = true})
      print(pcall(cuda.link, {m}))
      print(pcall(cuda.link, {cuda.compile('extern "C" __global__ void k(int *x) { *x = 1; }', {arch = "sm_90", relocatable = true})}))]]
    prog = prog:gsub("%.%.%.CDP%.%.%.", function() return ("%q"):format(CDP) end)
    local out = child_run("CUDALUA_CUDADEVRT=/nonexistent/libcudadevrt.a", prog)
    assert.matches("false\tcudalua: cuda.link: the code launches kernels from the device (dynamic parallelism), "
      .. "which needs the CUDA device runtime libcudadevrt.a: CUDALUA_CUDADEVRT=/nonexistent/libcudadevrt.a "
      .. "cannot be opened (/nonexistent/libcudadevrt.a: No such file or directory)", out, 1, true)
    assert.matches("true\tcudalua.module<<linked>>", out, 1, true)   -- code without launches links
    local dir = H.tmpdir()
    H.write(dir .. "/libcudadevrt.a", "not an archive")
    out = child_run("CUDALUA_CUDADEVRT=" .. H.q(dir .. "/libcudadevrt.a"), prog)
    assert.matches("CUDALUA_CUDADEVRT=" .. dir .. "/libcudadevrt.a is not an intact static library (ar archive)", out, 1, true)
    -- nowhere to be found: every place is named (a toolkit without the library, no NVRTC beside it)
    out = child_run(("CUDA_HOME=%s CUDA_PATH= CUDA_DIR= CUDALUA_CUDADEVRT="):format(H.q(dir)), prog)
    if not out:find("true\tcudalua.module", 1, true) then   -- found nowhere (no /usr/local/cuda)
      assert.matches("not found (looked for ", out, 1, true)
      assert.matches(dir .. "/lib64/libcudadevrt.a", out, 1, true)
      assert.matches("set CUDALUA_CUDADEVRT to its path", out, 1, true)
    end
    H.rmrf(dir)
  end)
end)

describe("cuda.kernel with relocatable = true", function()
  it("hints at relocatable = true when a kernel launches kernels without it", function()
    C.raises("needs relocatable = true: cuda.kernel then links it with the device runtime itself",
             cuda.compile, CDP, { arch = "sm_90" })
  end)

  it("links relocatable code on its own: an unresolved function is named", function()
    local e = C.raises("cuda.kernel: linking failed (NVJITLINK_ERROR_", cuda.kernel,
      'extern __device__ int f();\nextern "C" __global__ void k(int *x) { *x = f(); }', "k", { arch = "sm_90", relocatable = true })
    assert.matches("_Z1fv", e, 1, true)
  end)

  nogpu("without a GPU: the kernel is linked, and using it says there is no driver", function()
    local m = cuda.compile(CDP, { arch = "sm_90", relocatable = true })
    local l = cuda.link { m }
    C.raises("no CUDA driver found", function() return l.parent end)
    C.raises("no CUDA driver found", cuda.kernel, CDP, "parent", { relocatable = true })
  end)

  H.gpuonly(it, pending, "dynamic parallelism")("a parent's threads launch children that write what the CPU computes", function()
    for _, flag in ipairs { "relocatable", "lto" } do
      local k = cuda.kernel(CDP, "parent", { [flag] = true })
      local blocks, threads, per = math.random(1, 4), math.random(1, 16), math.random(1, 64)
      local n = blocks * threads * per
      local a = math.random(-1000, 1000)
      local v = H.rand_table(n, -10000, 10000, true)
      local dv, dout = cuda.to_device(v, "int32"), cuda.device_array(n, "int32")
      k[{ blocks, threads }](dout, dv, a, per)
      local h = dout:copy_to_host()
      for i = 1, n do assert.equal(v[i] * a + (i - 1), h[i], flag .. " element " .. i) end
    end
  end)

  -- A graph ending in such a kernel node was not waited for with its children (an H100, driver
  -- 580: with one replay most children's elements were still unwritten after the stream's sync;
  -- with three, 32 to 36 of 40 runs lost them for good). cudalua instantiates such graphs with a
  -- memset node after their last nodes (src/gexec.c). Each way a graph is made and launched, a
  -- few times with random shapes, output filled with a sentinel first, only the stream waited for.
  local function cdp_graph_case(how)
    local m = cuda.link { cuda.compile(CDP, { relocatable = true }) }
    for trial = 1, 6 do
      local blocks, threads, per = math.random(1, 4), math.random(1, 8), math.random(1, 32)
      local n = blocks * threads * per
      local v = H.rand_table(n, -10000, 10000, true)
      local dv, dout = cuda.to_device(v, "int32"), cuda.device_array(n, "int32")
      local copy = cuda.device_array(n, "int32")
      dout:fill(-7); copy:fill(-7)
      local a = math.random(2, 50)
      local s = cuda.stream()
      local g
      if how == "capture" then
        s:begin_capture()
        m.parent[{ blocks, threads, s }](dout, dv, a, per)
        g = s:end_capture()
      else
        g = cuda.graph()
        local p = g:kernel(m.parent, { blocks, threads }, { dout, dv, a, per })
        -- a node after the parent sees its children's writes
        if how == "dependent" then g:memcpy(copy, dout, { p }) end
      end
      local exec = g:instantiate()
      if how == "update" then
        -- the executable graph takes another graph of its shape (the same tail added for it)
        local g2 = cuda.graph()
        g2:kernel(m.parent, { blocks, threads }, { dout, dv, a + 1, per })
        exec:update(g2)
        a = a + 1
      end
      for _ = 1, (how == "once" and 1 or 3) do exec:launch(s) end
      s:synchronize()
      local h = (how == "dependent" and copy or dout):copy_to_host()
      for i = 1, n do assert.equal(v[i] * a + (i - 1), h[i], ("%s, trial %d, element %d"):format(how, trial, i)) end
      -- the user's graph is unchanged: no node of cudalua's left in it
      if how ~= "capture" then assert.equal(how == "dependent" and 2 or 1, g:node_count()) end
    end
  end
  for _, how in ipairs { "replayed", "once", "capture", "dependent", "update" } do
    H.gpuonly(it, pending, "dynamic parallelism")("a graph ending in a kernel that launches children waits for them: " .. how,
      function() cdp_graph_case(how) end)
  end
end)

describe("cuda.set_limit and cuda.get_limit", function()
  it("refuse unknown names, read-only limits and bad values, naming the call", function()
    C.raises("cuda.set_limit: unknown limit 'stack' (stack_size, printf_fifo_size, malloc_heap_size, "
      .. "dev_runtime_sync_depth, dev_runtime_pending_launch_count, max_l2_fetch_granularity, "
      .. "persisting_l2_cache_size, shmem_size, cig_enabled, cig_shmem_fallback_enabled)", cuda.set_limit, "stack", 1)
    C.raises("cuda.get_limit: unknown limit 'heap'", cuda.get_limit, "heap")
    C.raises('cuda.get_limit: argument 1: expected a limit\'s name ("stack_size", '
      .. '"dev_runtime_pending_launch_count"...), got number', cuda.get_limit, 4)
    C.raises("cuda.set_limit: shmem_size can only be read (cuda.get_limit)", cuda.set_limit, "shmem_size", 1)
    C.raises("cuda.set_limit: argument 2: expected an integer (bytes or a count), got a number that is not one",
             cuda.set_limit, "stack_size", 1024.5)
    C.raises("cuda.set_limit: argument 2: expected an integer (bytes or a count), got string", cuda.set_limit, "stack_size", "1024")
    local neg = -math.random(1, 1000)
    C.raises("cuda.set_limit: malloc_heap_size must be 0 or more, got " .. neg, cuda.set_limit, "malloc_heap_size", neg)
  end)

  nogpu("say there is no driver", function()
    C.raises("cuda.set_limit: no CUDA driver found", cuda.set_limit, "dev_runtime_pending_launch_count", 4096)
    C.raises("cuda.get_limit: no CUDA driver found", cuda.get_limit, "stack_size")
  end)

  -- in a process of its own: this one has loaded code that launches kernels (see below)
  gpu("set what get reads back (the pending launch count, the stack and heap sizes)", function()
    local out = child_run("", ([[local cuda = require "cudalua"
      local before = cuda.get_limit("dev_runtime_pending_launch_count")
      assert(before > 0)
      local want = before + 1024 * %d
      cuda.set_limit("dev_runtime_pending_launch_count", want)
      assert(cuda.get_limit("dev_runtime_pending_launch_count") == want, "pending count")
      cuda.set_limit("dev_runtime_pending_launch_count", before)
      local stack = cuda.get_limit("stack_size")
      cuda.set_limit("stack_size", stack + 16 * %d)
      assert(cuda.get_limit("stack_size") > stack, "stack")   -- the driver may round it up
      cuda.set_limit("stack_size", stack)
      assert(cuda.get_limit("malloc_heap_size") > 0)
      print("limits ok")]]):format(math.random(1, 4), math.random(1, 64)))
    assert.matches("limits ok", out, 1, true)
  end)

  -- measured (driver 580.159.04, H100): after a graph ran a kernel that launches kernels,
  -- cuCtxSetLimit of the stack size or the pending launch count never returned
  H.gpuonly(it, pending, "dynamic parallelism")("refuse the limits that then hang the driver once such code is loaded, naming them", function()
    local m = cuda.link { cuda.compile(CDP, { relocatable = true }) }
    assert.is_true(m:image():find("__cudaCDP2", 1, true) ~= nil)
    local dout = cuda.device_array(4, "int32")
    local dv = cuda.to_device({ 1, 2, 3, 4 }, "int32")
    local g = cuda.graph()
    g:kernel(m.parent, { 1, 1 }, { dout, dv, 3, 4 })
    g:launch(); cuda.synchronize(); g:close()
    assert.same({ 3, 7, 11, 15 }, dout:copy_to_host():totable())
    for _, name in ipairs { "stack_size", "dev_runtime_pending_launch_count" } do
      C.raises("cudalua: cuda.set_limit: " .. name .. " must be set before code that launches kernels from the "
        .. "device (dynamic parallelism) is loaded on this device: the driver can hang otherwise",
        cuda.set_limit, name, cuda.get_limit(name) + 1024)
    end
    local heap = cuda.get_limit("malloc_heap_size")
    cuda.set_limit("malloc_heap_size", heap)   -- the others still work
    assert.equal(heap, cuda.get_limit("malloc_heap_size"))
  end)
end)
