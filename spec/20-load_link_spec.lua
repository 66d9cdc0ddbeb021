-- Modules that cuda.compile did not make: cuda.load_module (cubin, fatbin, PTX, LTO-IR, from a
-- path or bytes, built by nvcc or anything else), parameter types without a source (PTX
-- .param lists, C++ mangled names, signatures the user gives, the driver's sizes), cuda.link
-- (nvJitLink: relocatable code, LTO-IR, PTX) and checking a kernel compiled with lineinfo
-- under compute-sanitizer. Loading and linking need no GPU; launching does.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local MOD = require "cudalua.module"
local SIG = require "cudalua.signature"
local gpu = H.gpu(it, pending)
local nogpu = C.nogpu(it, pending)
local nvcc_gpu = H.gpuonly(it, pending, "nvcc's cubins and PTX")

local CUDA_DIR = os.getenv("CUDA_DIR") or "/usr/local/cuda"
local NVCC = CUDA_DIR .. "/bin/nvcc"
local have_nvcc = os.execute(H.q(NVCC) .. " --version >/dev/null 2>&1")
local function with_nvcc(test, name, fn)
  if have_nvcc then test(name, fn) else pending(name .. " (no nvcc at " .. NVCC .. ")") end
end

local CU = [[
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
__global__ void shift(double *v, double by, long long n, short s) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) v[i] += by + s;
}
struct Pair { float a; int b; };
extern "C" __global__ void take_pair(Pair p, float *out) { out[0] = p.a * p.b; }
]]

-- images built by nvcc for sm_90, once
local built
local function nvcc_images()
  if built then return built end
  local dir = H.tmpdir()
  H.write(dir .. "/k.cu", CU)
  built = { dir = dir }
  for flag, ext in pairs { ["-cubin"] = "cubin", ["-ptx"] = "ptx", ["-fatbin"] = "fatbin",
                           ["-fatbin -Xfatbin=-compress-all"] = "zfatbin" } do
    local out = dir .. "/k." .. ext
    local _, ok = H.run(("%s %s -arch=sm_90 %s -o %s 2>&1"):format(H.q(NVCC), flag, H.q(dir .. "/k.cu"), H.q(out)))
    assert(ok, "nvcc " .. flag .. " failed")
    built[ext] = out
  end
  return built
end

local function arrays(n)
  local x, y = H.rand_table(n), H.rand_table(n)
  return x, y, cuda.to_device(x, "float32"), cuda.to_device(y, "float32")
end
local function check_saxpy(k, a)
  local n = 3000
  local x, y, dx, dy = arrays(n)
  k[{ (n + 127) // 128, 128 }](a, dx, dy, n)
  local h = dy:copy_to_host()
  for i = 1, n do assert.equal(C.f32(C.f32(a) * C.f32(x[i]) + C.f32(y[i])), h[i], "element " .. i) end
end

teardown(function() if built then H.rmrf(built.dir) end end)

describe("cuda.load_module", function()
  with_nvcc(it, "tells a cubin, PTX and a fatbin from nvcc apart, from a path or the bytes", function()
    local img = nvcc_images()
    for _, kind in ipairs { "cubin", "ptx", "fatbin" } do
      local m = cuda.load_module(img[kind])
      assert.equal(kind, m:kind())
      assert.equal(H.read(img[kind]), m:image())
      assert.equal("cudalua.module<" .. img[kind] .. ">", tostring(m))
      assert.equal(kind, cuda.load_module(H.read(img[kind])):kind())
    end
    assert.equal("cudalua.module<<a cubin>>", tostring(cuda.load_module(H.read(img.cubin))))
    assert.equal("mine", tostring(cuda.load_module(img.cubin, { name = "mine" })):match("<(.*)>"))
  end)

  with_nvcc(it, "lists a cubin's and PTX's kernels without a GPU", function()
    local img = nvcc_images()
    local want = { "_Z5shiftPddxs", "saxpy", "take_pair" }
    assert.same(want, cuda.load_module(img.cubin):kernels())
    assert.same(want, cuda.load_module(img.ptx):kernels())
    local e = MOD.ptx_entries(H.read(img.ptx))
    assert.equal("fUUW", e.saxpy.codes)
    assert.equal("UdUH", e._Z5shiftPddxs.codes)
    assert.equal("xU", e.take_pair.codes)
    assert.equal("8 bytes (.b8[8])", e.take_pair.types[1])
  end)

  with_nvcc(it, "counts a kernel's parameters from the image: signatures are checked without a GPU", function()
    local img = nvcc_images()
    local mods = {}
    -- a PTX's count is its .param list's (the codes); a cubin's and a fatbin's, the ELF's
    local function count(st, k) return MOD.param_count(st, k, st.info[k] and st.info[k].codes) end
    for _, kind in ipairs { "cubin", "fatbin", "ptx" } do
      mods[kind] = cuda.load_module(img[kind])
      local st = MOD.fields(mods[kind])
      assert.equal(4, count(st, "saxpy"), kind)
      assert.equal(4, count(st, "_Z5shiftPddxs"), kind)
      assert.equal(2, count(st, "take_pair"), kind)
    end
    for _, kind in ipairs { "cubin", "ptx" } do   -- (the driver lists a fatbin's kernels)
      local m = mods[kind]
      C.raises("cudalua: module:get: kernel 'saxpy': the signature \"float, const float*\" has 2 parameters, the kernel 4",
               m.get, m, "saxpy", "float, const float*")
      C.raises("the signature \"float, const float*, float*, int, int\" has 5 parameters, the kernel 4",
               m.get, m, "saxpy", "float, const float*, float*, int, int")
      C.raises("no kernel 'nope' in module", m.get, m, "nope")   -- from the image's list
    end
    -- a compressed fatbin does not say: the driver is asked (on a GPU)
    assert.is_nil(MOD.param_count(MOD.fields(cuda.load_module(img.zfatbin)), "saxpy"))
  end)

  it("LTO-IR is linked into a cubin for the arch given", function()
    local lto = cuda.compile('extern "C" __global__ void k(int *x) { *x = 3; }', { arch = "sm_90", lto = true })
    local m = cuda.load_module(lto:image(), { arch = "sm_90" })
    assert.equal("cubin", m:kind())
    assert.same({ "k" }, m:kernels())
  end)

  nogpu("LTO-IR without a GPU needs an arch", function()
    local lto = cuda.compile('extern "C" __global__ void k(int *x) { *x = 3; }', { arch = "sm_90", lto = true })
    C.raises('cudalua: cuda.load_module: no CUDA driver found (', cuda.load_module, lto:image())
    C.raises('give opts.arch (e.g. "sm_90")', cuda.load_module, lto:image())
  end)

  it("misuse: missing files, other files, junk bytes, bad options", function()
    local dir = H.tmpdir()
    C.raises("cuda.load_module: cannot open " .. dir .. "/none.cubin: No such file or directory", cuda.load_module, dir .. "/none.cubin")
    H.write(dir .. "/text.cubin", "this is not a module\n")
    C.raises("cuda.load_module: " .. dir .. '/text.cubin is not a cubin, fatbin, PTX or LTO-IR image (it starts with "this is ")',
             cuda.load_module, dir .. "/text.cubin")
    H.write(dir .. "/empty", "")
    C.raises("is not a cubin, fatbin, PTX or LTO-IR image", cuda.load_module, dir .. "/empty")
    C.raises("cuda.load_module: /bin/sh is an ELF file but not a CUDA cubin (a host object? build with nvcc -cubin or -fatbin)",
             cuda.load_module, "/bin/sh")
    C.raises('cuda.load_module: not a cubin, fatbin, PTX or LTO-IR image (it starts with "\\0\\1\\2\\3junk")',
             cuda.load_module, "\0\1\2\3junk bytes")
    C.raises("cuda.load_module: expected a path or the bytes of an image, got nil", cuda.load_module)
    C.raises("cuda.load_module: expected a path or the bytes of an image, got number", cuda.load_module, 5)
    C.raises("cuda.load_module: unknown option 'signature' (arch, name)", cuda.load_module, "/bin/sh", { signature = "" })
    C.raises('cuda.load_module: arch must look like "sm_90" or "compute_90", got "90"', cuda.load_module, "/bin/sh", { arch = "90" })
    H.rmrf(dir)
  end)

  with_nvcc(nvcc_gpu, "runs nvcc's kernels: types from PTX, from a C++ name, from a signature", function()
    local img = nvcc_images()
    check_saxpy(cuda.load_module(img.ptx).saxpy, 2.5)
    local cubin = cuda.load_module(img.cubin)
    check_saxpy(cubin:get("saxpy", "float a, const float *x, float *y, int n"), -1.25)
    check_saxpy(cuda.load_module(img.fatbin):get("saxpy", "float, const float*, float*, int"), 0.5)
    assert.same({ "_Z5shiftPddxs", "saxpy", "take_pair" }, cuda.load_module(img.fatbin):kernels())
    -- shift(double*, double, long long, short) by its plain name
    local shift = cubin.shift
    assert.same({ "double*", "double", "long long", "short" }, shift:info().types)
    local v = H.rand_table(500)
    local dv = cuda.to_device(v, "float64")
    shift[{ 4, 128 }](dv, 0.25, 500, 3)
    local h = dv:copy_to_host()
    for i = 1, 500 do assert.equal(v[i] + 3.25, h[i]) end
    C.raises("kernel 'shift' argument 4 (short): value out of range, got 40000", shift[{ 1, 1 }], dv, 1, 1, 40000)
    -- a struct by value from a signature ("x": a string of its size)
    local tp = cubin:get("take_pair", "Pair p, float *out")
    local out = cuda.device_array(1, "float32")
    tp[{ 1, 1 }](string.pack("<fi", 1.5, 6), out)
    assert.equal(9, out:copy_to_host()[1])
  end)

  with_nvcc(nvcc_gpu, "without types, 8-byte parameters take arrays or addresses and the others refuse numbers", function()
    local img = nvcc_images()
    local m = cuda.load_module(img.cubin)
    local k = m.saxpy -- extern "C": no types in the name, none in a cubin
    assert.same({ "4 bytes of unknown type", "8 bytes: an array or an integer address",
                  "8 bytes: an array or an integer address", "4 bytes of unknown type" }, k:info().types)
    local n = 256
    local x, y, dx, dy = arrays(n)
    C.raises("kernel 'saxpy' argument 1 (4 bytes of unknown type): expected a string of exactly 4 bytes (the type is not known: give a signature",
             k[{ 1, n }], 2.0, dx, dy, n)
    C.raises("kernel 'saxpy' argument 2 (8 bytes: an array or an integer address): expected an array or an integer address",
             k[{ 1, n }], string.pack("<f", 2), 1.5, dy, string.pack("<i4", n))
    k[{ 1, n }](string.pack("<f", 2), dx:ptr(), dy, string.pack("<i4", n))
    local h = dy:copy_to_host()
    for i = 1, n do assert.equal(C.f32(2 * C.f32(x[i]) + C.f32(y[i])), h[i]) end
  end)

  with_nvcc(nvcc_gpu, "misuse: signatures that do not fit the kernel #cudaerror", function()
    local m = cuda.load_module(nvcc_images().cubin)
    C.raises("cudalua: kernel 'saxpy': parameter 2 is 4 bytes, the driver says 8 (signature \"float, int, float*, int\")",
             m.get, m, "saxpy", "float, int, float*, int")
    C.raises("has 2 parameters, the kernel 4", m.get, m, "saxpy", "float, const float*")
    local fat = cuda.load_module(nvcc_images().fatbin)
    C.raises("has 2 parameters, the kernel 4", fat.get, fat, "saxpy", "float, const float*")
    -- where the image does not say (a compressed fatbin), the driver is asked
    local z = cuda.load_module(nvcc_images().zfatbin)
    C.raises("the driver reports more parameters than 2", z.get, z, "saxpy", "float, const float*")
    C.raises("the driver reports fewer parameters than 5", z.get, z, "saxpy", "float, const float*, float*, int, int")
    check_saxpy(z:get("saxpy", "float, const float*, float*, int"), math.random() * 4 - 2)
    C.raises("cudalua: module:get: kernel 'saxpy': parameter 1 is a reference (float &a)", m.get, m, "saxpy", "float &a, float*, float*, int")
    C.raises("module:get: the signature must be a string", m.get, m, "saxpy", 5)
    C.raises("no kernel 'nope' in module", m.get, m, "nope")
    C.raises("(kernels: _Z5shiftPddxs, saxpy, take_pair)", m.get, m, "nope")
  end)
end)

describe("PTX listings", function()
  it("leave out commented entries, take entries without parameters and arrays of any width", function()
    local e = MOD.ptx_entries([[
.version 9.0
.target sm_90
/* .visible .entry fake(.param .u32 a) {} */
// .visible .entry fake2(
.visible .entry none
{ ret; }
.visible .entry arrays(
	.param .align 16 .b32 arrays_param_0[4],
	.param .f64 arrays_param_1
)
{ ret; }]])
    assert.is_nil(e.fake)
    assert.is_nil(e.fake2)
    assert.equal("", e.none.codes)
    assert.equal("xd", e.arrays.codes)
    assert.equal("16 bytes (.b32[4])", e.arrays.types[1])
  end)
end)

describe("modules", function()
  it("kernels() gives a copy, and misuse says what is wrong", function()
    local m = cuda.load_module(cuda.compile('extern "C" __global__ void a() {}\nextern "C" __global__ void b() {}', { arch = "sm_90" }):cubin())
    table.remove(m:kernels(), 1)
    assert.same({ "a", "b" }, m:kernels())
    C.raises("cudalua: module:kernels: expected a module (call it as m:kernels())", m.kernels)
    C.raises("cudalua: module:ptx: expected a module (call it as m:ptx())", m.ptx, 5)
    C.raises("modules are indexed by kernel names, got number", function() return m[1] end)
    C.raises("modules are read-only", function() m.x = 1 end)
  end)

  it("a damaged cubin is refused as such", function()
    local img = cuda.compile('extern "C" __global__ void a(int *x) { *x = 1; }', { arch = "sm_90" }):cubin()
    local bad = img:sub(1, 0x28) .. string.pack("<I8", 1 << 40) .. img:sub(0x31)   -- section table far away
    C.raises("cuda.load_module: <a cubin> is a damaged cubin", cuda.load_module, bad)
    assert.is_false(MOD.elf_info(bad))
    assert.is_nil(MOD.elf_info("not elf"))
  end)

  it("a module loaded from LTO-IR links as LTO-IR", function()
    local A = 'extern __device__ float twice(float);\nextern "C" __global__ void use(float *x) { *x = twice(*x); }'
    local B = '__device__ float twice(float v) { return 2 * v; }'
    local la = cuda.compile(A, { arch = "sm_90", lto = true })
    local lb = cuda.load_module(cuda.compile(B, { arch = "sm_90", lto = true }):image(), { arch = "sm_90" })
    assert.equal("cubin", lb:kind())
    assert.same({ "use" }, cuda.link({ la, lb }):kernels())
  end)
end)

describe("signatures", function()
  it("read C parameter lists, names and qualifiers included", function()
    local codes, types = MOD.parse_signature("float a, const float *x, float* y, int n")
    assert.equal("fqpi", codes)
    assert.same({ "float a", "const float *x", "float* y", "int n" }, types)
    assert.equal("IlLxqSaE", (MOD.parse_signature(
      "unsigned int, long long n, size_t, float4 v, const __half * __restrict__ h, unsigned short, int8_t, __nv_bfloat16")))
    assert.equal("pqdb", (MOD.parse_signature("double *, double const *p, double, bool flag")))
    assert.equal("", (MOD.parse_signature("")))
    assert.equal("", (MOD.parse_signature("void")))
  end)

  it("read qualifiers, std:: names and builtin types in any word order", function()
    assert.equal("xxLLSix", (MOD.parse_signature(
      "const float4, struct Pair p, std::size_t n, long unsigned n, short unsigned int s, __grid_constant__ const int n, long double d")))
    assert.equal("IlaAIx", (MOD.parse_signature("unsigned, ::int64_t x, char c, unsigned char, unsigned int, const Params")))
  end)

  it("misuse: references, templates and empty parameters", function()
    C.raises_internal("parameter 2 is a reference (int &x)", MOD.parse_signature, "float, int &x")
    C.raises_internal("cannot read parameter 1 (std::vector<int>)", MOD.parse_signature, "std::vector<int>")
    C.raises_internal('empty parameter 2 in the signature "int,,float"', MOD.parse_signature, "int,,float")
  end)

  it("C++ mangled names spell their kernels' types", function()
    assert.equal("pdls", (SIG.param_codes(SIG.demangle_function("_Z5shiftPddxs"))))
    assert.equal("qi", (SIG.param_codes(SIG.demangle_function("_ZN2ns1kEPKfi"))))
    assert.equal("", (SIG.param_codes(SIG.demangle_function("_Z4noopv"))))
    assert.is_nil(SIG.demangle_function("_Z5scaleIfEvPT_S0_i")) -- a template: types not spelt plainly
    assert.is_nil(SIG.demangle_function("saxpy"))
  end)
end)

describe("cuda.link", function()
  local A = [[extern __device__ float twice(float);
extern __device__ int counter;
extern "C" __global__ void use(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { x[i] = twice(x[i]); atomicAdd(&counter, 1); }
}
extern "C" __global__ void count(int *out) { *out = counter; }]]
  local B = [[__device__ int counter;
__device__ float twice(float v) { return 2.0f * v; }]]

  it("links relocatable code, LTO-IR and PTX without a GPU, keeping the kernels' types", function()
    for _, flag in ipairs { "relocatable", "lto" } do
      local m = cuda.link { cuda.compile(A, { arch = "sm_90", [flag] = true }), cuda.compile(B, { arch = "sm_90", [flag] = true }) }
      assert.equal("cubin", m:kind())
      assert.same({ "count", "use" }, m:kernels())
      assert.equal("pi", MOD.fields(m).info.use.codes)
      assert.is_false(MOD.elf_info(m:cubin()).relocatable)
      C.raises("has no PTX (it holds a cubin made by cuda.link)", m.ptx, m)
    end
    local ptx = cuda.compile(B, { arch = "compute_90", options = { "-rdc=true" } })
    local m = cuda.link({ cuda.compile(A, { arch = "sm_90", relocatable = true }), ptx:image() }, { name = "mixed" })
    assert.same({ "count", "use" }, m:kernels())
    assert.equal("cudalua.module<mixed>", tostring(m))
  end)

  it("misuse: nothing to link, unresolved symbols, mixed architectures, junk", function()
    C.raises("cuda.link: expected a list of modules or images, got an empty table", cuda.link, {})
    C.raises("cuda.link: expected a list of modules or images, got nil", cuda.link)
    local a = cuda.compile(A, { arch = "sm_90", relocatable = true })
    local e = C.raises("cuda.link: linking failed (NVJITLINK_ERROR_", cuda.link, { a })
    assert.matches("twice", e, 1, true)
    C.raises("cuda.link: input 2 is for sm_80, an earlier one for sm_90: give opts.arch", cuda.link,
             { a, cuda.compile(B, { arch = "sm_80", relocatable = true }) })
    C.raises('cuda.link: input 2: not a cubin, fatbin, PTX, LTO-IR image or static library (it starts with "\\0junk")', cuda.link, { a, "\0junk" })
    C.raises("cuda.link: unknown option 'lto' (arch, name, options)", cuda.link, { a }, { lto = true })
    C.raises("cuda.link: opts.options[1] must be a string", cuda.link, { a }, { options = { 1 } })
  end)

  it("without nvJitLink, says so (in a process where it cannot be found)", function()
    local prog = [[package.cpath = "./?.so;" .. package.cpath
      local cuda = require "cudalua"
      local a = cuda.compile('__device__ int f() { return 1; }', {arch = "sm_90", relocatable = true})
      local ok, e = pcall(cuda.link, {a})
      print(ok, e, cuda.versions().nvjitlink)]]
    local out = H.run(("CUDALUA_NVJITLINK=/nonexistent/libnvJitLink.so %s -e %s 2>&1"):format(H.LUA, H.q(prog)))
    assert.matches("false\tcudalua: cuda.link: nvJitLink not found (libnvJitLink.so.13 or .12, from the CUDA toolkit): " ..
                   "CUDALUA_NVJITLINK=/nonexistent/libnvJitLink.so cannot be opened (/nonexistent/libnvJitLink.so: " ..
                   "cannot open shared object file: No such file or directory): linking and LTO-IR modules need it\tnil",
                   out, 1, true)
  end)

  H.gpuonly(it, pending, "device-code linking")("the linked kernels run, calling across the sources", function()
    for _, flag in ipairs { "relocatable", "lto" } do
      local m = cuda.link { cuda.compile(A, { [flag] = true }), cuda.compile(B, { [flag] = true }) }
      local n = 1000
      local x = H.rand_table(n)
      local d = cuda.to_device(x, "float32")
      m.use[{ 8, 128 }](d, n)
      local out = cuda.device_array(1, "int32")
      m.count[{ 1, 1 }](out)
      local h = d:copy_to_host()
      for i = 1, n do assert.equal(C.f32(2 * C.f32(x[i])), h[i]) end
      assert.equal(n, out:copy_to_host()[1])
      C.raises("kernel 'use' argument 2 (int): expected an integer", m.use[{ 1, 1 }], d, 1.5)
    end
  end)
end)

describe("compute-sanitizer", function()
  -- on the PATH, else in the toolkit
  local sanitizer = H.run("command -v compute-sanitizer 2>/dev/null"):gsub("%s+$", "")
  if sanitizer == "" then sanitizer = CUDA_DIR .. "/bin/compute-sanitizer" end
  local have = os.execute(H.q(sanitizer) .. " --version >/dev/null 2>&1")
  local test = have and gpu or function(name) pending(name .. " (no compute-sanitizer at " .. sanitizer .. ")") end
  test("names the user's file and line of a planted out-of-bounds write (lineinfo = true) #cudaerror", function()
    local prog = [[package.cpath = "./?.so;" .. package.cpath
      local cuda = require "cudalua"
      local k = cuda.kernel(table.concat({
        'extern "C" __global__ void planted(int *x, int n) {',
        '  int i = blockIdx.x * blockDim.x + threadIdx.x;',
        '  if (i <= n) x[i] = i;   // line 3: one past the end',
        '}'}, "\n"), "planted", {name = "planted_oob.cu", lineinfo = true, cache = false})
      local d = cuda.device_array(256, "int32")
      k[{1, 256}](d, 256)
      k[{1, 257}](d, 256)
      pcall(cuda.synchronize)]]
    local out = H.run(("%s --tool memcheck %s -e %s 2>&1"):format(H.q(sanitizer), H.LUA, H.q(prog)))
    assert.matches("Invalid __global__ write of size 4 bytes", out, 1, true)
    assert.matches("planted_oob.cu:3", out, 1, true)
  end)
end)
