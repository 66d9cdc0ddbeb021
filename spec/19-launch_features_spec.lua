-- Launch features real kernels need, in every launch form (k[{...}], k:launch, forall, graph
-- kernel nodes, stream capture): cooperative launches (grid-wide sync), thread block clusters
-- with distributed shared memory (Hopper), dynamic shared memory above 48 KiB, the writable
-- function attributes, and configuration tables that refuse unknown keys.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local SRC = [[
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// out[i] = x[i] * (sum of all x): needs every block's partial sum before anyone scales
extern "C" __global__ void scale_by_sum(const int *x, long long *out, long long *partial, int n) {
  cg::grid_group grid = cg::this_grid();
  __shared__ long long s;
  if (threadIdx.x == 0) s = 0;
  __syncthreads();
  long long v = 0;
  for (int i = grid.thread_rank(); i < n; i += grid.size()) v += x[i];
  atomicAdd((unsigned long long *)&s, (unsigned long long)v);
  __syncthreads();
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
  grid.sync();
  long long total = 0;
  for (int b = 0; b < gridDim.x; b++) total += partial[b];
  for (int i = grid.thread_rank(); i < n; i += grid.size()) out[i] = (long long)x[i] * total;
}

// each block of a cluster puts its rank in shared memory; every thread reads the next block's
__device__ void ring(int *out) {
  __shared__ int mine;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) mine = (int)cluster.block_rank() * 1000 + blockIdx.x;
  cluster.sync();
  unsigned next = (cluster.block_rank() + 1) % cluster.num_blocks();
  int *theirs = cluster.map_shared_rank(&mine, next);
  out[blockIdx.x * blockDim.x + threadIdx.x] = *theirs * 10 + (int)cluster.num_blocks();
  cluster.sync();   // no block leaves while another reads its shared memory
}
extern "C" __global__ void cluster_ring(int *out) { ring(out); }
extern "C" __global__ void __cluster_dims__(4, 1, 1) declared_ring(int *out) { ring(out); }
]]

-- (a source of its own: cudalua's CPU device runs these, and refuses the clusters above)
local SRC2 = [[
// reverses x within a block through dynamic shared memory of any size
extern "C" __global__ void reverse_shared(const float *x, float *y, int per_block) {
  extern __shared__ float buf[];
  const float *src = x + (size_t)blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) buf[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) y[(size_t)blockIdx.x * per_block + i] = buf[per_block - 1 - i];
}

extern "C" __global__ void plain(int *x) { x[threadIdx.x] = threadIdx.x; }
]]

local mod, mod2
local function K(name)
  if name == "plain" or name == "reverse_shared" then
    mod2 = mod2 or cuda.compile(SRC2)
    return mod2:get(name)
  end
  mod = mod or cuda.compile(SRC)
  return mod:get(name)
end
local function dev() return cuda.devices()[cuda.current_device() + 1] end

it("the kernels of this file compile for Hopper, and clusters are refused before it", function()
  assert.same({ "cluster_ring", "declared_ring", "scale_by_sum" }, cuda.compile(SRC, { arch = "sm_90" }):kernels())
  assert.same({ "plain", "reverse_shared" }, cuda.compile(SRC2, { arch = "sm_90" }):kernels())
  C.raises('namespace "cooperative_groups" has no member "this_cluster"', cuda.compile, SRC, { arch = "sm_80" })
  C.raises("__cluster_dims__ is not supported for this GPU architecture", cuda.compile,
           'extern "C" __global__ void __cluster_dims__(2, 1, 1) k(int *x) {}', { arch = "sm_80" })
end)

describe("cooperative launches", function()
  local gpu_only = H.gpuonly(it, pending, "cooperative groups")
  local function data(n)
    local x = H.rand_table(n, -1000, 1000, true)
    local total = 0
    for i = 1, n do total = total + x[i] end
    return cuda.to_device(x, "int32"), x, total
  end
  local function check(out, x, total)
    local h = out:copy_to_host()
    for i = 1, #x do assert.equal(x[i] * total, h[i], "element " .. i) end
  end

  gpu_only("synchronise the whole grid, in k:launch, k[{...}], forall and a graph node", function()
    assert.is_true(dev().cooperative_launch)
    local k = K("scale_by_sum")
    local n = 100000
    local d_x, x, total = data(n)
    local blocks = k:max_blocks_per_sm(256) * dev().multiprocessors
    local partial = cuda.device_array(blocks, "int64")
    local out = cuda.device_array(n, "int64")
    k:launch({ grid = blocks, block = 256, cooperative = true }, d_x, out, partial, n)
    check(out, x, total)
    out:fill(0)
    k[{ blocks, 256, cooperative = true }](d_x, out, partial, n)
    check(out, x, total)
    -- forall picks the block size; a grid of n / block blocks must still be co-resident
    local small = 2048
    local sx, sh, stotal = data(small)
    local sout = cuda.device_array(small, "int64")
    local launcher = k:forall(small, { cooperative = true })
    assert.matches("cooperative", tostring(launcher))
    launcher(sx, sout, cuda.device_array(small, "int64"), small)
    check(sout, sh, stotal)
    out:fill(0)
    local g = cuda.graph()
    g:kernel(k, { grid = blocks, block = 256, cooperative = true }, { d_x, out, partial, n })
    local exec = g:instantiate()
    exec:launch()
    cuda.synchronize()
    check(out, x, total)
  end)

  gpu_only("a grid larger than can be resident at once is refused, with the limit", function()
    local k = K("scale_by_sum")
    local per, sms = k:max_blocks_per_sm(256), dev().multiprocessors
    local d_x = data(1000)
    local blocks = per * sms + 1
    local e = C.raises(("a cooperative grid of %d blocks is more than can be resident at once: at most %d (%d per multiprocessor x %d multiprocessors, for blocks of 256 threads"):format(
      blocks, per * sms, per, sms), k.launch, k, { grid = blocks, block = 256, cooperative = true },
      d_x, cuda.device_array(1000, "int64"), cuda.device_array(blocks, "int64"), 1000)
    assert.matches("kernel 'scale_by_sum' launch with grid {" .. blocks .. ", 1, 1}, block {256, 1, 1}, shared 0, cooperative failed", e, 1, true)
  end)

  gpu_only("the limit follows an attribute set through another kernel object of the same function", function()
    local m = cuda.compile(SRC) -- a module of its own: the attribute stays with it
    local k1 = m:get("scale_by_sum")
    local k2 = m:get("scale_by_sum", "const int*, long long*, long long*, int") -- the same CUfunction
    assert.are_not.equal(k1, k2)
    local shared, sms = 40 * 1024, dev().multiprocessors
    local n = 1000
    local d_x, x, total = data(n)
    local out = cuda.device_array(n, "int64")
    local function launch(blocks)
      k2:launch({ grid = blocks, block = 256, shared = shared, cooperative = true },
        d_x, out, cuda.device_array(blocks, "int64"), n)
    end
    local before = k2:max_blocks_per_sm(256, shared)
    C.raises(("at most %d (%d per multiprocessor"):format(before * sms, before), launch, before * sms + 1)
    -- the smallest shared-memory carveout leaves room for fewer blocks of 40 KiB
    k1:set_attribute("preferred_shared_memory_carveout", 0)
    local after = k2:max_blocks_per_sm(256, shared)
    assert.is_true(after >= 1 and after < before, ("blocks per multiprocessor: %d, then %d"):format(before, after))
    C.raises(("at most %d (%d per multiprocessor"):format(after * sms, after), launch, after * sms + 1)
    launch(after * sms)
    check(out, x, total)
  end)

  gpu_only("misuse: cooperative must be a boolean", function()
    local k = K("plain")
    local d = cuda.device_array(32, "int32")
    C.raises("cudalua: kernel[{grid, block}]: cooperative must be a boolean, got string", function() return k[{ 1, 32, cooperative = "yes" }] end)
    C.raises("cudalua: kernel:launch: cooperative must be a boolean, got number", k.launch, k, { grid = 1, block = 32, cooperative = 1 }, d)
    C.raises("cudalua: kernel:forall: cooperative must be a boolean, got table", k.forall, k, 10, { cooperative = {} })
  end)
end)

describe("thread block clusters", function()
  local gpu_only = H.gpuonly(it, pending, "thread block clusters")
  local function check(out, blocks, threads, csize)
    local h = out:copy_to_host()
    for b = 0, blocks - 1 do
      local rank = b % csize
      local nb = b - rank + (rank + 1) % csize      -- the next block of the same cluster
      local want = (((rank + 1) % csize) * 1000 + nb) * 10 + csize
      for t = 0, threads - 1 do assert.equal(want, h[b * threads + t + 1], ("block %d thread %d"):format(b, t)) end
    end
  end

  gpu_only("read each other's shared memory, in every launch form and in a capture", function()
    assert.is_true(dev().cluster_launch)
    local k = K("cluster_ring")
    local blocks, threads = 16, 64
    local out = cuda.device_array(blocks * threads, "int32")
    k:launch({ grid = blocks, block = threads, cluster = { 2, 1, 1 } }, out)
    check(out, blocks, threads, 2)
    k[{ blocks, threads, cluster = 4 }](out)
    check(out, blocks, threads, 4)
    -- forall rounds its grid up to whole clusters
    local launcher = k:forall(1, { cluster = { 8 } })
    local fb = tonumber(tostring(launcher):match("block {(%d+),"))
    assert.matches("grid {8, 1, 1}, block {" .. fb .. ", 1, 1}, shared 0, cluster {8, 1, 1}", tostring(launcher), 1, true)
    local fout = cuda.device_array(8 * fb, "int32")
    launcher(fout)
    check(fout, 8, fb, 8)
    local g = cuda.graph()
    out:fill(0)
    g:kernel(k, { grid = blocks, block = threads, cluster = { 2 } }, { out })
    g:instantiate():launch()
    cuda.synchronize()
    check(out, blocks, threads, 2)
    local s = cuda.stream()
    out:fill(0)
    s:begin_capture()
    k[{ blocks, threads, s, cluster = 4 }](out)
    local captured = s:end_capture()
    captured:instantiate():launch(s)
    s:synchronize()
    check(out, blocks, threads, 4)
  end)

  gpu_only("a kernel declaring __cluster_dims__ needs no option", function()
    local k = K("declared_ring")
    assert.equal(4, k:attributes().required_cluster_width)
    local out = cuda.device_array(8 * 32, "int32")
    k[{ 8, 32 }](out)
    check(out, 8, 32, 4)
    C.raises("the grid {6, 1, 1} is not a multiple of the cluster {4, 1, 1} the kernel declares (__cluster_dims__)",
             k[{ 6, 32 }], out)
  end)

  gpu_only("more than 8 blocks a cluster takes the non-portable attribute", function()
    local k = K("cluster_ring")
    local out = cuda.device_array(32 * 32, "int32")
    C.raises('clusters of more than 8 blocks need k:set_attribute("non_portable_cluster_size_allowed", 1)',
             k.launch, k, { grid = 32, block = 32, cluster = 16 }, out)
    k:set_attribute("non_portable_cluster_size_allowed", 1)
    assert.equal(1, k:attributes().non_portable_cluster_size_allowed)
    k:launch({ grid = 32, block = 32, cluster = 16 }, out)
    check(out, 32, 32, 16)
    k:set_attribute("non_portable_cluster_size_allowed", false)
  end)

  gpu_only("misuse: bad cluster shapes", function()
    local k = K("cluster_ring")
    local out = cuda.device_array(1024, "int32")
    C.raises("cudalua: kernel[{grid, block}]: the grid {5, 1, 1} is not a multiple of the cluster {2, 1, 1}", function() return k[{ 5, 32, cluster = 2 }] end)
    C.raises("cudalua: kernel:launch: the grid {4, 3, 1} is not a multiple of the cluster {1, 2, 1}", k.launch, k,
             { grid = { 4, 3 }, block = 32, cluster = { 1, 2 } }, out)
    C.raises("cudalua: kernel[{grid, block}]: cluster must be an integer >= 1 or a table of them, got 0", function() return k[{ 4, 32, cluster = 0 }] end)
    C.raises("cudalua: kernel[{grid, block}]: cluster needs 1 to 3 dimensions, got 4", function() return k[{ 4, 32, cluster = { 1, 1, 1, 1 } }] end)
    C.raises("cudalua: kernel:forall: the grid is one-dimensional: cluster must be n or {n}", k.forall, k, 100, { cluster = { 2, 2 } })
    C.raises("cudalua: graph:kernel: the grid {3, 1, 1} is not a multiple of the cluster {2, 1, 1}", cuda.graph().kernel,
             cuda.graph(), k, { grid = 3, block = 32, cluster = 2 }, { out })
  end)
end)

describe("dynamic shared memory over 48 KiB", function()
  local function run(launch, per_block, blocks)
    local n = per_block * blocks
    local x = H.rand_table(n)
    local dx, dy = cuda.to_device(x, "float32"), cuda.device_array(n, "float32")
    launch(dx, dy, per_block)
    local y = dy:copy_to_host()
    for b = 0, blocks - 1 do
      for i = 0, per_block - 1, 97 do
        assert.equal(C.f32(x[b * per_block + per_block - i]), y[b * per_block + i + 1])
      end
    end
  end

  gpu("is opted in on first use, in every launch form", function()
    local k = K("reverse_shared")
    local optin = dev().max_shared_memory_per_block_optin
    assert.is_true(optin > 200 * 1024)
    assert.equal(48 * 1024, k:attributes().max_dynamic_shared_size_bytes)
    local per = 100 * 1024 // 4
    run(function(...) k[{ 3, 256, 0, per * 4 }](...) end, per, 3)
    assert.equal(per * 4, k:attributes().max_dynamic_shared_size_bytes)
    local big = optin // 4
    run(function(...) k:launch({ grid = 2, block = 512, shared = big * 4 }, ...) end, big, 2)
    run(function(dx, dy, p) k:forall(1, { shared = p * 4 })(dx, dy, p) end, 60 * 1024 // 4, 1)
    local k2 = cuda.compile(SRC2 .. "\n// a second module: its kernel starts at 48 KiB again\n"):get("reverse_shared")
    assert.equal(48 * 1024, k2:attributes().max_dynamic_shared_size_bytes)
    run(function(dx, dy, p)
      local g = cuda.graph()
      g:kernel(k2, { grid = 2, block = 256, shared = p * 4 }, { dx, dy, p })
      g:instantiate():launch()
      cuda.synchronize()
    end, 80 * 1024 // 4, 2)
  end)

  gpu("over the device's limit is refused, naming it", function()
    local k = K("reverse_shared")
    local optin = dev().max_shared_memory_per_block_optin
    local d = cuda.device_array(16, "float32")
    C.raises(("cudalua: kernel 'reverse_shared': %d bytes of dynamic shared memory asked for; with its 0 bytes of static shared memory this device allows at most %d (its opt-in limit per block is %d)")
             :format(optin + 4, optin, optin), k[{ 1, 32, 0, optin + 4 }], d, d, 4)
    local p = K("plain")   -- 0 static bytes as well
    C.raises("bytes of dynamic shared memory asked for", p.launch, p, { grid = 1, block = 32, shared = optin + 1 }, cuda.device_array(32, "int32"))
  end)
end)

describe("k:set_attribute", function()
  gpu("sets the writable attributes and the cache preference", function()
    local k = cuda.compile(SRC2 .. "\n// attributes\n"):get("plain")
    k:set_attribute("preferred_shared_memory_carveout", 50)
    assert.equal(50, k:attributes().preferred_shared_memory_carveout)
    k:set_attribute("max_dynamic_shared_size_bytes", 64 * 1024)
    assert.equal(64 * 1024, k:attributes().max_dynamic_shared_size_bytes)
    k:set_attribute("cache_config", "prefer_shared")
    assert.equal("prefer_shared", k:attributes().cache_config)
    local d = cuda.device_array(32, "int32")
    k[{ 1, 32, 0, 60 * 1024 }](d) -- within what was set: no further opt-in needed
    assert.same((function() local t = {} for i = 0, 31 do t[#t + 1] = i end return t end)(), d:copy_to_host():totable())
  end)

  gpu("misuse: unknown, read-only and bad values", function()
    local k = K("plain")
    C.raises("cudalua: kernel:set_attribute: unknown attribute 'carveout' (writable: max_dynamic_shared_size_bytes, preferred_shared_memory_carveout",
             k.set_attribute, k, "carveout", 1)
    C.raises("cudalua: kernel:set_attribute: read-only attribute 'num_regs'", k.set_attribute, k, "num_regs", 1)
    C.raises("kernel:set_attribute('preferred_shared_memory_carveout'): expected an integer >= -1, got 1.5",
             k.set_attribute, k, "preferred_shared_memory_carveout", 1.5)
    C.raises("invalid option 'fast'", k.set_attribute, k, "cache_config", "fast")
  end)

  -- #cudaerror: the driver itself refuses (make sanitize leaves such specs out)
  gpu("misuse the driver refuses comes back with its error #cudaerror", function()
    local k = K("plain")
    C.raises("kernel:set_attribute('max_dynamic_shared_size_bytes', 1073741824): CUDA_ERROR_INVALID_VALUE",
             k.set_attribute, k, "max_dynamic_shared_size_bytes", 1 << 30)
  end)
end)

describe("configuration tables", function()
  gpu("refuse unknown keys, naming them, in every form", function()
    local k = K("plain")
    local d = cuda.device_array(32, "int32")
    C.raises("cudalua: kernel[{grid, block}]: unknown key 'clusters' in the launch configuration (grid, block, stream, shared, cooperative, cluster",
             function() return k[{ 1, 32, clusters = 2 }] end)
    C.raises("unknown key 'strem'", k.launch, k, { grid = 1, block = 32, strem = cuda.stream() }, d)
    C.raises("unknown key 5", k.launch, k, { grid = 1, block = 32, [5] = 0 }, d)
    C.raises("cudalua: kernel:forall: unknown option 'clustr' (stream, shared, cooperative, cluster)", k.forall, k, 10, { clustr = 2 })
    local g = cuda.graph()
    C.raises("cudalua: graph:kernel: unknown key 'stream_' in the launch configuration (grid, block, shared, cooperative, cluster",
             g.kernel, g, k, { grid = 1, block = 32, stream_ = 1 }, { d })
    C.raises("cudalua: graph:kernel: a graph node has no stream (the graph is launched on one)", g.kernel, g, k,
             { 1, 32, cuda.stream() }, { d })
    C.raises("cudalua: kernel:launch: grid given both by name and as entry 1", k.launch, k, { 1, 32, grid = 2 }, d)
    -- positional entries written as [1] = ... live in the table's hash part, in any order
    -- with the named ones: each named key is still seen
    local s = cuda.stream()
    for i = 1, 40 do
      local key = "opt" .. i
      C.raises("unknown key '" .. key .. "'", function() return k[{ [1] = 1, [2] = 32, [key] = true }] end)
      C.raises("unknown key '" .. key .. "'", function() return k[{ [1] = 1, [2] = 32, [3] = s, [4] = 0, [key] = true }] end)
    end
  end)

  gpu("take names in k[{...}] too, and the tutorial form still reuses its launcher", function()
    local k = K("plain")
    local d = cuda.device_array(32, "int32")
    k[{ grid = 1, block = 32 }](d)
    local want = {}
    for i = 0, 31 do want[#want + 1] = i end
    assert.same(want, d:copy_to_host():totable())
    assert.equal(k[{ 1, 32 }], k[{ 1, 32 }])
    assert.are_not.equal(k[{ 1, 32 }], k[{ 1, 32, cooperative = true }])
  end)
end)
