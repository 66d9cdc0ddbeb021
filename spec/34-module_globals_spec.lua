-- Module variables (Module:get_global: CuPy's RawModule.get_global, cuModuleGetGlobal), NULL
-- pointer arguments (nil, cuda.NULL), headers written for nvcc, Module:sass and every function
-- attribute. The constant-memory case follows cuda-samples' convolutionSeparable (a filter in
-- __constant__ memory set from the host); values are random and checked against the CPU.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)
local modules = require "cudalua.module"

local ARCH = { arch = "sm_90", cache = false }
local SRC = [[
__constant__ float c_k[17];
__device__ int counter;
__device__ double m2[4][8];
namespace ns { __device__ float scale; }
extern "C" __global__ void apply(float *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * c_k[i % 17] * ns::scale;
}
extern "C" __global__ void count(int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&counter, 1);
}
extern "C" __global__ void twice(double *out) {
  int i = threadIdx.x;
  if (i < 32) out[i] = 2 * m2[i / 8][i % 8];
}
// writes partial sums only where the pointer is not NULL (samples' scan: NULL for one block)
extern "C" __global__ void maybe(int *x, int n, int *sums) {
  int i = threadIdx.x;
  if (i < n) x[i] += 1;
  if (sums && i == 0) sums[0] = n;
}
]]

local function randoms(n)
  local t = {}
  for i = 1, n do t[i] = math.random() * 2 - 1 end
  return t
end

describe("module variables: declarations read", function()
  it("give dtype, shape and the lowered name (no GPU: arch = sm_90)", function()
    local m = cuda.compile(SRC, ARCH)
    local g = modules.fields(m).globals
    assert.same({ symbol = "c_k", dtype = "float32", dims = { 17 } }, g.c_k)
    assert.same({ symbol = "counter", dtype = "int32", dims = { 1 } }, g.counter)
    assert.same({ 4, 8 }, g.m2.dims)
    assert.equal("float64", g.m2.dtype)
    assert.equal("_ZN2ns5scaleE", g["ns::scale"].symbol)
    assert.same({ "apply", "count", "maybe", "twice" }, m:kernels())
  end)

  -- a declaration NVRTC never sees (#if 0) fails its name expression: the others keep theirs
  it("a variable under #if 0 costs only its own lowered name (arch = sm_90)", function()
    local m = cuda.compile("#if 0\n__device__ int gone;\n#endif\n__device__ float kept[3];\n"
      .. "namespace ns { __device__ double twice[2]; }\n__global__ void k(float *x) { x[0] = kept[0] + ns::twice[0]; }", ARCH)
    local g = modules.fields(m).globals
    assert.same({ symbol = "kept", dtype = "float32", dims = { 3 } }, g.kept)
    assert.same({ symbol = "_ZN2ns5twiceE", dtype = "float64", dims = { 2 } }, g["ns::twice"])
    assert.equal("gone", g.gone.symbol)
  end)

  it("skip functions and bodies; unknown types have no dtype", function()
    local globals = require "cudalua.globals"
    local found = globals.parse([[
struct S { int a; };
__device__ S sv;
__device__ float f(float x) { return x; }
extern "C" { __device__ unsigned long long big[3]; }
__constant__ float by_macro[2 * R + 1];
extern "C" __constant__ short init[3] = {1, 2, 3};
]])
    assert.is_nil(found.f)
    assert.is_nil(found.sv.dtype)
    assert.equal("uint64", found.big.dtype)
    assert.same({ 3 }, found.big.dims)
    assert.equal("float32", found.by_macro.dtype)
    assert.is_nil(found.by_macro.dims)
    assert.equal("int16", found.init.dtype)
  end)

  it("skip pointers (not their pointee's type) and template variables (no one symbol)", function()
    local found = require("cudalua.globals").parse([[
__device__ double *p;
__device__ float *q[2];
template <typename T> __device__ T tv;
__device__ int after;
__device__ __align__(512) float aligned[64];
]])
    assert.is_nil(found.p)
    assert.is_nil(found.q)
    assert.is_nil(found.tv)
    assert.equal("int32", found.after.dtype)
    assert.equal("float32", found.aligned.dtype)
    assert.same({ 64 }, found.aligned.dims)
  end)

  it("survive the compile cache's entries (kept as info entries)", function()
    local globals = require "cudalua.globals"
    local info = {}
    globals.to_info(globals.parse("namespace a { __constant__ int v[2][3]; }"), { ["&a::v"] = "_ZN1a1vE" }, info)
    local kernels, vars = globals.from_info(info)
    assert.same({}, kernels)
    assert.same({ ["a::v"] = { symbol = "_ZN1a1vE", dtype = "int32", dims = { 2, 3 } } }, vars)
  end)

  it("misuse: arguments checked before the device", function()
    local m = cuda.compile(SRC, ARCH)
    C.raises("module:get_global: expected a variable's name, got number", m.get_global, m, 1)
    C.raises("module:get_global: a shape needs a dtype", m.get_global, m, "c_k", nil, { 17 })
    C.raises("module:get_global: expected a module", modules.methods.get_global, {}, "c_k")
  end)
end)

describe("module variables on the GPU", function()
  gpu("constant memory set from the host, read by a kernel, vs the CPU", function()
    local m = cuda.compile(SRC)
    local k = randoms(17)
    local c = m:get_global("c_k")
    assert.equal(17, #c)
    assert.equal("float32", c.dtype.name)
    c:copy_to_device(cuda.array(k, cuda.float32))
    local scale = math.random() + 0.5
    m:get_global("ns::scale"):copy_to_device(cuda.array({ scale }, cuda.float32))
    local n = 1000
    local x = randoms(n)
    local d_in, d_out = cuda.to_device(cuda.array(x, cuda.float32)), cuda.device_array(n, cuda.float32)
    m.apply[{ (n + 127) // 128, 128 }](d_out, d_in, n)
    local got = d_out:copy_to_host()
    for i = 1, n do
      local want = C.f32(C.f32(C.f32(x[i]) * C.f32(k[(i - 1) % 17 + 1])) * C.f32(scale))
      assert.near(want, got[i], 1e-6)
    end
    assert.near(C.f32(k[5]), c:copy_to_host()[5], 0)
  end)

  gpu("a __device__ int counter incremented by a kernel and read back; fill; cuda.copy on a stream", function()
    local m = cuda.compile(SRC)
    local cnt = m:get_global("counter")
    cnt:fill(0)
    local n = math.random(1, 5000)
    m.count[{ (n + 255) // 256, 256 }](n)
    assert.equal(n, cnt:copy_to_host()[1])
    local s = cuda.stream()
    local start = math.random(1, 100)
    cuda.copy(cnt, cuda.to_device(cuda.array({ start }, cuda.int32)), s)
    m.count[{ 1, 32, s }](7)
    s:synchronize()
    assert.equal(start + 7, cnt:copy_to_host()[1])
  end)

  gpu("a 2-D variable, and a view as a kernel argument", function()
    local m = cuda.compile(SRC)
    local v = m:get_global("m2")
    assert.same({ 4, 8 }, v.shape)
    local vals = randoms(32)
    v:copy_to_device(cuda.array(vals, cuda.float64):reshape { 4, 8 })
    local out = cuda.device_array(32, cuda.float64)
    m.twice[{ 1, 32 }](out)
    local o = out:copy_to_host()
    for i = 1, 32 do assert.equal(2 * vals[i], o[i]) end
    -- the view itself passed where a pointer goes
    local k = cuda.kernel('extern "C" __global__ void neg(double *a) { a[threadIdx.x] = -a[threadIdx.x]; }', "neg")
    local flat = m:get_global("m2", "float64")
    assert.same({ 32 }, flat.shape)
    local mk = m:get_global("m2", "float64", { 32 })
    assert.equal(32, #mk)
    k[{ 1, 32 }](flat)
    local back = v:copy_to_host()
    assert.equal(-vals[9], back[9])   -- elements in C order: [2][1] (1-based) is the 9th
  end)

  gpu("errors: unknown name, wrong size, dtype needed", function()
    local m = cuda.compile(SRC)
    C.raises("module:get_global: no variable 'nope' in module", m.get_global, m, "nope")
    C.raises("module:get_global: 'c_k' has 68 bytes, not float32 x {16}", m.get_global, m, "c_k", "float32", { 16 })
    C.raises("module:get_global: 'c_k' has 68 bytes, not float64 elements", m.get_global, m, "c_k", "float64")
    C.raises("module:get_global: unknown dtype", m.get_global, m, "c_k", "float31")
    if H.cpu_device then return end   -- (a cubin's module: a GPU's)
    local loaded = cuda.load_module(m:cubin())
    C.raises("module:get_global: the type of 'c_k' is not known", loaded.get_global, loaded, "c_k")
    local v = loaded:get_global("c_k", "float32")
    assert.equal(17, #v)
  end)

  H.gpuonly(it, pending, "cubins")("load_module and link modules", function()
    local m = cuda.compile(SRC)
    local lm = cuda.load_module(m:cubin())
    local vals = randoms(17)
    lm:get_global("c_k", cuda.float32, 17):copy_to_device(cuda.array(vals, cuda.float32))
    assert.near(C.f32(vals[3]), lm:get_global("c_k", "float32"):copy_to_host()[3], 0)
    local a = cuda.compile('__device__ int shared_v; extern "C" __device__ int get_v() { return shared_v; }', { relocatable = true })
    local b = cuda.compile('extern "C" __device__ int get_v(); extern "C" __global__ void rd(int *o) { o[0] = get_v(); }', { relocatable = true })
    local linked = cuda.link { a, b }
    local want = math.random(1, 1000000)
    linked:get_global("shared_v", "int32"):copy_to_device(cuda.array({ want }, cuda.int32))
    assert.equal(want, linked:get_global("shared_v"):copy_to_host()[1])   -- its type from a's source
    local o = cuda.device_array(1, cuda.int32)
    linked.rd[{ 1, 1 }](o)
    assert.equal(want, o:copy_to_host()[1])
  end)

  gpu("the view keeps its module loaded", function()
    local m = cuda.compile(SRC, { cache = false })   -- no cache holds the module
    local v = m:get_global("counter")
    m = nil   -- luacheck: ignore
    for _ = 1, 3 do collectgarbage() end
    local want = math.random(1, 1000)
    v:copy_to_device(cuda.array({ want }, cuda.int32))
    assert.equal(want, v:copy_to_host()[1])
  end)

  gpu("the declaration's view is made once (closed, a new one); a dtype given makes a new one", function()
    local m = cuda.compile(SRC)
    local v = m:get_global("counter")
    assert.is_true(rawequal(v, m:get_global("counter")))
    assert.is_false(rawequal(v, m:get_global("counter", "int32")))
    local n = math.random(1, 100000)
    v:copy_to_device(cuda.array({ n }, "int32"))
    v:close()
    local w = m:get_global("counter")
    assert.is_false(rawequal(v, w))
    assert.is_false(w.closed)
    assert.equal(n, w:copy_to_host()[1])
  end)

  gpu("graph memcpy nodes target a variable", function()
    local m = cuda.compile(SRC)
    local c = m:get_global("c_k")
    local vals = randoms(17)
    local src = cuda.to_device(cuda.array(vals, cuda.float32))
    local g = cuda.graph()
    g:memcpy(c, src)
    local s = cuda.stream()
    g:launch(s)
    s:synchronize()
    local got = c:copy_to_host()
    for i = 1, 17 do assert.equal(C.f32(vals[i]), got[i]) end
  end)
end)

describe("NULL pointer arguments", function()
  gpu("nil for a pointer passes NULL (launches, launchers, graph nodes, set_args)", function()
    local m = cuda.compile(SRC)
    local n = math.random(1, 64)
    local host = {}
    for i = 1, n do host[i] = math.random(-100, 100) end
    local x = cuda.to_device(cuda.array(host, cuda.int32))
    local sums = cuda.to_device(cuda.array({ -1 }, cuda.int32))
    m.maybe[{ 1, 64 }](x, n, nil)
    m.maybe:launch({ grid = 1, block = 64 }, x, n, cuda.NULL)
    local l = m.maybe[{ 1, 64 }]
    l(x, n, nil)
    assert.equal(-1, sums:copy_to_host()[1])
    local g = cuda.graph()
    local node = g:kernel(m.maybe, { 1, 64 }, { x, n, cuda.NULL })
    local e = g:instantiate()
    e:launch(); cuda.synchronize()
    e:set_args(node, { x, n, sums })
    e:launch(); cuda.synchronize()
    assert.equal(n, sums:copy_to_host()[1])
    e:set_args(node, { x, n, cuda.NULL })
    e:launch(); cuda.synchronize()
    local got = x:copy_to_host()
    for i = 1, n do assert.equal(host[i] + 6, got[i]) end
  end)

  gpu("nil for a scalar stays an error naming it; a dropped trailing nil says so", function()
    local m = cuda.compile(SRC)
    local x = cuda.device_array(4, cuda.int32)
    C.raises("nil (NULL) is taken only by pointer parameters", m.maybe[{ 1, 4 }], x, nil, nil)
    local g = cuda.graph()
    C.raises("give cuda.NULL for a NULL pointer", g.kernel, g, m.maybe, { 1, 4 }, { x, 4, nil })
  end)

  it("cuda.NULL is a light userdata NULL", function()
    assert.equal("userdata", type(cuda.NULL))
  end)
end)

describe("headers written for nvcc (no GPU: arch = sm_90)", function()
  local K = 'extern "C" __global__ void k(int *x) { x[0] = 1; }\n'
  it("<cuda.h> compiles", function()
    local m = cuda.compile('#include <cuda.h>\n' .. K:gsub("= 1", "= CUDA_VERSION"), ARCH)
    assert.same({ "k" }, m:kernels())
  end)
  it("<cuda_profiler_api.h> compiles", function()
    assert.same({ "k" }, cuda.compile('#include <cuda_profiler_api.h>\n' .. K, ARCH):kernels())
  end)
  it("a header declaring host functions compiles (as the samples' *_common.h)", function()
    local common = "#pragma once\n#include <cuda_runtime.h>\nvoid run_on_host(int n);\n"
      .. "int ceil_div(int a, int b) { return (a + b - 1) / b; }\n"
    local src = '#include "sample_common.h"\nextern "C" __global__ void k(int *x) { x[0] = ceil_div(7, 2); }\n'
    local m = cuda.compile(src, { arch = "sm_90", cache = false, headers = { ["sample_common.h"] = common } })
    assert.same({ "k" }, m:kernels())
  end)
  it("explicit __host__ functions still fail with NVRTC's message", function()
    C.raises("explicitly marked as a __host__ function is not allowed in JIT mode", cuda.compile,
      '__host__ void h(int);\n' .. K, ARCH)
  end)
end)

describe("module:sass", function()
  local have = modules.find_tool("nvdisasm") or modules.find_tool("cuobjdump")
  local with_tool = have and it or pending
  with_tool("lists the kernel's SASS (no GPU: arch = sm_90)", function()
    local m = cuda.compile('extern "C" __global__ void sass_probe(float *x) { x[threadIdx.x] *= 2.0f; }', ARCH)
    local sass = m:sass()
    assert.matches("sass_probe", sass, 1, true)
    assert.is_truthy(sass:find("FMUL", 1, true) or sass:find("FADD", 1, true))   -- x * 2: either
    assert.matches("EXIT", sass, 1, true)
  end)
  it("PTX has no SASS", function()
    local m = cuda.compile('extern "C" __global__ void k() {}', { arch = "compute_90", cache = false })
    C.raises("module:sass: module cudalua_kernel.cu holds PTX, not machine code", m.sass, m)
  end)
  local without = have and pending or it
  without("says what is missing without the toolkit's tools", function()
    local m = cuda.compile('extern "C" __global__ void k() {}', ARCH)
    C.raises("module:sass: neither nvdisasm nor cuobjdump was found", m.sass, m)
  end)
end)

describe("kernel:attributes", function()
  gpu("has every CU_FUNC_ATTRIBUTE_* the driver reports", function()
    local k = cuda.compile(SRC).apply
    local a = k:attributes()
    for _, n in ipairs { "max_threads_per_block", "shared_size_bytes", "const_size_bytes",
      "local_size_bytes", "num_regs", "ptx_version", "binary_version", "cache_mode_ca",
      "max_dynamic_shared_size_bytes", "preferred_shared_memory_carveout", "cluster_size_must_be_set",
      "required_cluster_width", "required_cluster_height", "required_cluster_depth",
      "non_portable_cluster_size_allowed", "cluster_scheduling_policy_preference", "cache_config" } do
      assert.is_not_nil(a[n], n)
    end
    -- c_k (the CPU device has no constant memory of its own: __constant__ is host memory there)
    if not H.cpu_device then assert.is_true(a.const_size_bytes >= 17 * 4) end
  end)
end)
