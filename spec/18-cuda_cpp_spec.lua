-- Real CUDA C++ through cuda.compile: the toolkit's headers and CCCL (CUB, libcu++, cooperative
-- groups, Thrust's device side) found without options, stand-ins for the standard headers NVRTC
-- lacks, the user's own include folders (and the compile cache seeing their edits), the
-- relocatable / lto / debug / lineinfo options and what a module shows of itself (ptx, cubin,
-- log). Compiling with an explicit arch needs no GPU; the rest is tagged #gpu.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local CC = require "cudalua.compile"
local HD = require "cudalua.headers"
local MOD = require "cudalua.module"
local gpu = H.gpu(it, pending)
local ARCH = "sm_90"

local function compile(src, opts)
  opts = opts or {}
  opts.arch = opts.arch or ARCH
  return cuda.compile(src, opts)
end

local KERNEL = '\nextern "C" __global__ void k(int *x) { x[threadIdx.x] = 1; }\n'

describe("the toolkit's headers and CCCL", function()
  it("are found without options: cooperative groups, CUB, libcu++, Thrust's device side", function()
    assert.is_string(HD.toolkit_includes().include)
    assert.is_string(HD.toolkit_includes().cccl)
    local lines = {}
    for _, h in ipairs { "cooperative_groups.h", "cooperative_groups/reduce.h", "cooperative_groups/scan.h",
                         "cooperative_groups/memcpy_async.h", "cub/cub.cuh", "cub/block/block_radix_sort.cuh",
                         "cub/warp/warp_reduce.cuh", "cuda/atomic", "cuda/barrier", "cuda/pipeline",
                         "cuda/std/type_traits", "cuda/std/complex", "thrust/functional.h", "thrust/tuple.h",
                         "thrust/pair.h", "thrust/iterator/counting_iterator.h",
                         "thrust/iterator/transform_iterator.h", "thrust/iterator/zip_iterator.h", "cuda_fp16.h",
                         "cuda_bf16.h", "mma.h" } do
      lines[#lines + 1] = "#include <" .. h .. ">"
    end
    -- one compile for all of them: each is a second of NVRTC's time
    local m = compile(table.concat(lines, "\n") .. KERNEL, { cache = false })
    assert.same({ "k" }, m:kernels())
  end)

  it("compile a kernel that uses them together", function()
    local m = compile([[
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cub/cub.cuh>
#include <cuda/atomic>
#include <cuda/std/limits>
namespace cg = cooperative_groups;
extern "C" __global__ void k(const float *x, float *out) {
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  float v = cg::reduce(warp, x[threadIdx.x], cg::plus<float>());
  using BR = cub::BlockReduce<float, 128>;
  __shared__ BR::TempStorage tmp;
  float s = BR(tmp).Sum(v);
  cuda::atomic_ref<float, cuda::thread_scope_device> r(*out);
  if (threadIdx.x == 0) r.fetch_add(s + cuda::std::numeric_limits<float>::epsilon());
}]])
    assert.same({ "k" }, m:kernels())
    assert.equal("qp", MOD.fields(m).info.k.codes)
  end)

  it("<cub/cub.cuh> leaves out the host-side device-wide algorithms, with NVRTC's own message", function()
    C.raises("DeviceReduce", compile, '#include <cub/cub.cuh>\n__global__ void k() { (void)sizeof(cub::DeviceReduce); }', { cache = false })
  end)
end)

describe("the standard headers NVRTC lacks", function()
  it("stand in for every header the README lists, each with its usual names", function()
    local names = {}
    for name in pairs(HD.std) do names[#names + 1] = name end
    table.sort(names)
    assert.is_true(#names >= 40)
    local lines = {}
    for _, n in ipairs(names) do lines[#lines + 1] = "#include <" .. n .. ">" end
    local m = compile(table.concat(lines, "\n") .. [[

extern "C" __global__ void k(float *x, uint32_t n, std::int64_t big) {
  std::array<float, 2> a{1.0f, 2.0f};
  auto p = std::make_pair(1, 2.0f);
  x[0] = std::sqrt(x[1]) + std::numeric_limits<float>::max() + FLT_MAX + DBL_EPSILON + M_PI
       + std::min(1.0f, x[2]) + std::max(2, 3) + CHAR_BIT + INT_MAX + a[1] + p.second + (float)big;
  std::complex<float> c(1, 2);
  x[3] = std::abs(c * c);
  static_assert(std::is_same<std::uint8_t, unsigned char>::value, "uint8_t");
  static_assert(sizeof(size_t) == 8 && sizeof(std::ptrdiff_t) == 8, "sizes");
  for (int v : {1, 2, 3}) x[4] += v;
  if (n == 0) printf("%f\n", x[0]);
  assert(n > 0);
}]])
    assert.same({ "k" }, m:kernels())
    assert.equal("pIl", MOD.fields(m).info.k.codes) -- uint32_t and std::int64_t are what they say
    assert.same({ "float*", "unsigned int", "long long" }, MOD.fields(m).info.k.types)
  end)

  it("take the values of the C standard and glibc (FLT_MAX, DBL_EPSILON, M_PI)", function()
    -- static_asserts compare with the numbers themselves: a wrong stand-in fails to compile
    compile([[
#include <cfloat>
#include <cmath>
#include <climits>
#include <cstdint>
static_assert(FLT_MAX == 3.402823466e38f, "FLT_MAX");
static_assert(DBL_EPSILON == 2.220446049250313e-16, "DBL_EPSILON");
static_assert(FLT_EPSILON == 1.1920929e-07f, "FLT_EPSILON");
static_assert(DBL_MAX > 1.7976931348623e308, "DBL_MAX");
static_assert(INT_MAX == 2147483647 && INT64_MAX == 9223372036854775807LL, "INT_MAX");
static_assert(M_PI > 3.14159265358979 && M_PI < 3.1415926535898, "M_PI");
__global__ void k() {}]], { cache = false })
  end)

  it("give way to a header of the same name the user hands over", function()
    local m = compile('#include <cstdint>\nstatic_assert(MINE == 7, "mine");' .. KERNEL,
                      { headers = { cstdint = "#define MINE 7\n" }, cache = false })
    assert.same({ "k" }, m:kernels())
  end)

  it("leave out headers with no device counterpart, with NVRTC's message", function()
    C.raises('cannot open source file "iostream"', compile, "#include <iostream>" .. KERNEL, { cache = false })
    C.raises('cannot open source file "vector"', compile, "#include <vector>" .. KERNEL, { cache = false })
  end)
end)

describe("the user's own headers", function()
  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() H.rmrf(dir) end)

  it("are read from a source's #include lines once, in order, up to one a macro computes", function()
    local found = HD.read_includes('#include <a.h>\n  # include "b/c.h"\n#include WHICH\n#include <d.h>\n')
    assert.same({ { name = "a.h", quoted = false }, { name = "b/c.h", quoted = true } }, found.list)
    assert.is_true(found.macro)
    assert.is_true(found.foreign)
    -- cudalua's own headers are no others; a commented-out #include names one all the same
    assert.is_false(HD.read_includes("#include <cudalua/reduce.cuh>\n").foreign)
    assert.is_true(HD.read_includes("// #include <cub/cub.cuh>\n").foreign)
    assert.same({ list = {}, foreign = false }, HD.read_includes("__global__ void k() {}"))
  end)

  it("come from opts.include_dirs, with <> and with quotes", function()
    os.execute("mkdir -p " .. H.q(dir .. "/inc/sub"))
    H.write(dir .. "/inc/mine.cuh", '#pragma once\n#include "sub/deeper.cuh"\n#define MINE (DEEPER + 1)\n')
    H.write(dir .. "/inc/sub/deeper.cuh", "#define DEEPER 41\n")
    local src = '#include <mine.cuh>\n#include "mine.cuh"\nstatic_assert(MINE == 42, "mine");' .. KERNEL
    assert.same({ "k" }, compile(src, { include_dirs = { dir .. "/inc" } }):kernels())
    C.raises('cannot open source file "mine.cuh"', compile, src, { cache = false })
  end)

  it("are found next to opts.name when it is a path", function()
    H.write(dir .. "/local.cuh", "#define LOCAL 5\n")
    local src = '#include "local.cuh"\nstatic_assert(LOCAL == 5, "local");' .. KERNEL
    assert.same({ "k" }, compile(src, { name = dir .. "/main.cu" }):kernels())
  end)

  it("are part of the cache key: an edited header compiles again, an unchanged one does not", function()
    local cache = require "cudalua.cache"
    H.write(dir .. "/v.cuh", "#define V 1\n")
    local src = '#include "v.cuh"\n__global__ void k(int *x) { *x = V; }\n'
    local opts = function() return { include_dirs = { dir }, name = dir .. "/k.cu" } end
    local m1 = compile(src, opts())
    assert.equal(m1, compile(src, opts()))
    H.write(dir .. "/v.cuh", "#define V 2\n")
    local misses = cache.stats.misses
    local m2 = compile(src, opts())
    assert.are_not.equal(m1, m2)
    assert.equal(misses + 1, cache.stats.misses)
    assert.matches("mov.u32%s+%%r%d+, 2;", m2:ptx())
    assert.matches("mov.u32%s+%%r%d+, 1;", m1:ptx())
  end)

  it("an include computed by a macro turns the cache off for that source", function()
    local cache = require "cudalua.cache"
    H.write(dir .. "/a.cuh", "#define A 3\n")
    local src = '#define HDR "a.cuh"\n#include HDR\n__global__ void k(int *x) { *x = A; }\n'
    local misses = cache.stats.misses
    local m1 = compile(src, { include_dirs = { dir } })
    local m2 = compile(src, { include_dirs = { dir } })
    assert.are_not.equal(m1, m2)
    assert.equal(misses, cache.stats.misses) -- not looked up at all
  end)

  it("include cycles through .. folders end, each file read once", function()
    for _, d in ipairs { "a", "b", "c" } do os.execute("mkdir -p " .. H.q(dir .. "/inc/" .. d)) end
    for _, d in ipairs { "a", "b", "c" } do
      local others = {}
      for _, o in ipairs { "a", "b", "c" } do
        if o ~= d then others[#others + 1] = ('#include "../%s/%s.h"'):format(o, o) end
      end
      H.write(("%s/inc/%s/%s.h"):format(dir, d, d), "#pragma once\n" .. table.concat(others, "\n") ..
              ("\n#define %s_H 1\n"):format(d:upper()))
    end
    local t0 = cuda.time()
    local src = '#include <a/a.h>\nstatic_assert(A_H + B_H + C_H == 3, "all");' .. KERNEL
    local m = compile(src, { include_dirs = { dir .. "/inc" } })
    assert.equal(m, compile(src, { include_dirs = { dir .. "/inc" } }))
    assert.is_true(cuda.time() - t0 < 10)
  end)

  it("folders given as -I options and headers handed in opts.headers are followed too", function()
    local cache = require "cudalua.cache"
    os.execute("mkdir -p " .. H.q(dir .. "/opt"))
    H.write(dir .. "/opt/g.h", "#define G 11\n")
    local src = '#include "wrapper.h"\n__global__ void k(int *x) { *x = G; }\n'
    local function build()
      return compile(src, { options = { "-I" .. dir .. "/opt" }, headers = { ["wrapper.h"] = '#include "g.h"\n' } })
    end
    local m1 = build()
    assert.equal(m1, build())
    H.write(dir .. "/opt/g.h", "#define G 22\n")
    local misses = cache.stats.misses
    local m2 = build()
    assert.equal(misses + 1, cache.stats.misses)
    assert.matches("mov.u32%s+%%r%d+, 22;", m2:ptx())
  end)

  it("misuse: include_dirs must be a list of existing folders", function()
    C.raises("cuda.compile: opts.include_dirs must be a table, got string", compile, KERNEL, { include_dirs = dir })
    C.raises("cuda.compile: opts.include_dirs[1] must be a string", compile, KERNEL, { include_dirs = { 3 } })
    C.raises("cuda.compile: opts.include_dirs[1] is not a directory: " .. dir .. "/nope", compile, KERNEL,
             { include_dirs = { dir .. "/nope" } })
    H.write(dir .. "/file", "x")
    C.raises("is not a directory", compile, KERNEL, { include_dirs = { dir .. "/file" } })
  end)
end)

describe("how a cubin is made", function()
  it("NVRTC's PTX without its unused variables, assembled by nvJitLink: 25 times smaller", function()
    local src = "#include <cooperative_groups.h>\n#include <cuda/std/limits>" .. KERNEL
    local small = compile(src, { cache = false })
    local direct = compile(src, { cache = false, options = { "-Xptxas=-O3" } })  -- ptxas options: NVRTC's own cubin
    assert.is_true(#direct:cubin() > 20 * #small:cubin(), #direct:cubin() .. " vs " .. #small:cubin())
    assert.is_nil(small:ptx():find("numeric_limits", 1, true))
    assert.is_truthy(direct:ptx():find("numeric_limits", 1, true))
    assert.same({ "k" }, small:kernels())
  end)

  it("whether nvJitLink is there is part of the cache key", function()
    local dir = H.tmpdir()
    local f = dir .. "/src.cu"
    H.write(f, "#include <cooperative_groups.h>\n// key " .. os.time() .. KERNEL)
    local prog = ('package.cpath = "./?.so;" .. package.cpath; local cuda = require "cudalua"; ' ..
      'local m = cuda.compile(io.read("a"), {arch = "sm_90"}); io.write(#m:cubin() > 50000 and "big" or "small", " ", ' ..
      'require("cudalua.cache").stats.disk_hits)')
    local function run(env)
      return H.run(("%s CUDALUA_CACHE_DIR=%s %s -e %s < %s"):format(env, H.q(dir .. "/cache"), H.LUA, H.q(prog), H.q(f)))
    end
    assert.equal("big 0", run("CUDALUA_NVJITLINK=/nonexistent/libnvJitLink.so"))
    assert.equal("small 0", run(""))     -- not the entry the other way made
    assert.equal("small 1", run(""))
    H.rmrf(dir)
  end)

  it("errors point at the caller's line", function()
    -- (not tail calls: a tail call leaves no line to point at)
    local ok, e = pcall(function() local m = cuda.compile("this is not C++", { arch = ARCH, cache = false }); return m end)
    assert.is_false(ok)
    assert.matches("18%-cuda_cpp_spec%.lua:%d+: cudalua: cuda%.compile: cudalua_kernel%.cu failed to compile", e)
    ok, e = pcall(function() local k = cuda.kernel(KERNEL, "k", { arch = ARCH, bogus = 1 }); return k end)
    assert.matches("18%-cuda_cpp_spec%.lua:%d+: cudalua: cuda%.compile: unknown option 'bogus'", e)
  end)
end)

describe("compile options for real code", function()
  it("unknown options raise, naming the accepted ones", function()
    C.raises("cuda.compile: unknown option 'includes' (arch, cache, debug, headers, include_dirs, lineinfo, lto, name, name_expressions, options, pch, relocatable)",
             compile, KERNEL, { includes = {} })
    C.raises("cuda.compile: opts.debug must be a boolean, got string", compile, KERNEL, { debug = "yes" })
    C.raises("cuda.compile: lto = true needs an sm_ arch", compile, KERNEL, { lto = true, arch = "compute_90" })
  end)

  it("lineinfo and debug put the source's file and lines into the PTX", function()
    local src = '\n\n__global__ void k(int *x) {\n  x[threadIdx.x] = 7;\n}\n'
    local plain = compile(src, { name = "plain.cu", cache = false })
    assert.is_nil(plain:ptx():find(".file", 1, true))
    local li = compile(src, { name = "mine.cu", lineinfo = true, cache = false })
    assert.matches('%.file%s+%d+%s+"[^"]*mine%.cu"', li:ptx())
    assert.matches("%.loc%s+%d+%s+4%s", li:ptx()) -- line 4 of mine.cu
    local dbg = compile(src, { name = "dbg.cu", debug = true, cache = false })
    assert.matches("%.section%s+%.debug_info", dbg:ptx())
    assert.matches('"[^"]*dbg%.cu"', dbg:ptx())
  end)

  it("relocatable = true gives relocatable code, which links but does not load", function()
    local m = compile("extern __device__ int f();\n__global__ void k(int *x) { *x = f(); }", { relocatable = true })
    assert.equal("cubin", m:kind())
    assert.equal("\127ELF", m:cubin():sub(1, 4))
    assert.is_true(MOD.elf_info(m:cubin()).relocatable)
    C.raises("holds relocatable code (relocatable = true, lto = true or an -rdc object): link it first", m.get, m, "k")
  end)

  it("lto = true gives LTO-IR, which has no PTX and no cubin", function()
    local m = compile(KERNEL, { lto = true })
    assert.equal("ltoir", m:kind())
    assert.equal("\237\67\78\127", m:image():sub(1, 4))
    C.raises("has no PTX (it holds LTO-IR)", m.ptx, m)
    C.raises("holds LTO-IR, not a cubin", m.cubin, m)
  end)
end)

describe("module inspection", function()
  it("ptx(), cubin() and log() show what NVRTC made", function()
    local m = compile('__global__ void k(int *x) { int unused; x[0] = 1; }', { name = "insp.cu", cache = false })
    assert.matches("%.visible%s+%.entry%s+_Z1kPi%(", m:ptx())
    assert.equal("\127ELF", m:cubin():sub(1, 4))
    assert.equal(m:image(), m:cubin())
    assert.matches('variable "unused" was declared but never referenced', m:log(), 1, true)
    local p = compile(KERNEL, { arch = "compute_90", cache = false })
    assert.equal("ptx", p:kind())
    assert.equal(p:image(), p:ptx())
    C.raises("holds PTX, not a cubin (compile with an sm_ arch, or with arch unset, for one)", p.cubin, p)
  end)

  it("what the cache keeps: ptx() of a module from the disk cache", function()
    local dir = H.tmpdir()
    local src = '// disk ptx ' .. os.time() .. '\n__global__ void k(float *x) { x[0] = 2; }\n'
    local prog = ('package.cpath = "./?.so;" .. package.cpath; local cuda = require "cudalua"; ' ..
      'local m = cuda.compile(io.read("a"), {arch = "sm_90"}); io.write(m:ptx():match("%.entry%s+[%w_]+"), " ", ' ..
      'require("cudalua.cache").stats.disk_hits)')
    local cmd = ("CUDALUA_CACHE_DIR=%s %s -e %s"):format(H.q(dir), H.LUA, H.q(prog))
    local f = dir .. "/src.cu"
    H.write(f, src)
    local first = H.run(cmd .. " < " .. H.q(f))
    local second = H.run(cmd .. " < " .. H.q(f))
    H.rmrf(dir)
    assert.equal(".entry _Z1kPf 0", first)
    assert.equal(".entry _Z1kPf 1", second)
  end)

  H.gpuonly(it, pending, "a GPU compiler's register and memory sizes")("k:attributes() names registers, memory sizes and shared memory settings", function()
    local k = cuda.kernel([[
__constant__ float table[64];
extern "C" __global__ void k(float *x, int n) {
  __shared__ float s[256];
  float local_buf[256];   // too large for registers, indexed at run time: local memory
  for (int i = 0; i < 256; i++) local_buf[i] = x[i] * i;
  s[threadIdx.x] = local_buf[(n + threadIdx.x) & 255] + table[threadIdx.x % 64];
  __syncthreads();
  x[threadIdx.x] = s[255 - threadIdx.x];
}]], "k")
    local a = k:attributes()
    assert.is_true(a.num_regs > 0)
    assert.equal(1024, a.shared_size_bytes)
    assert.equal(256, a.const_size_bytes)
    assert.is_true(a.local_size_bytes >= 1024)
    assert.equal(48 * 1024 - 1024, a.max_dynamic_shared_size_bytes)
    assert.equal("prefer_none", a.cache_config)
    assert.equal(0, a.required_cluster_width)
    assert.is_true(a.binary_version >= 90)
  end)
end)
