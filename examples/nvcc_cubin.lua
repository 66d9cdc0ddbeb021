-- nvcc_cubin.lua: kernels built ahead of time by nvcc, loaded with cuda.load_module: a cubin
-- (parameter types from a signature, or from a C++ kernel's mangled name), PTX (types from its
-- .param list) and a fatbin. Needs nvcc (CUDA_DIR, default /usr/local/cuda). Checked against
-- the CPU.
package.cpath = "./?.so;" .. package.cpath
local cuda = require "cudalua"
if cuda.devices()[1].kind == "cpu" then   -- counted as skipped by examples/run.sh
  print("nvcc_cubin: skipped: a cubin made by nvcc runs on a GPU only, not on cudalua's CPU device")
  os.exit(77, true)
end

local nvcc = (os.getenv("CUDA_DIR") or "/usr/local/cuda") .. "/bin/nvcc"
local dev = cuda.gpus.current:info()
local arch = ("sm_%d%d"):format(dev.compute_capability[1], dev.compute_capability[2])
local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. dir))
local function build(flag, out)
  local cmd = ("%s %s -arch=%s examples/cuda/saxpy.cu -o %s/%s"):format(nvcc, flag, arch, dir, out)
  if not os.execute(cmd) then error("nvcc_cubin: this example needs nvcc: " .. cmd .. " failed") end
  return dir .. "/" .. out
end
local cubin, ptx, fatbin = build("-cubin", "saxpy.cubin"), build("-ptx", "saxpy.ptx"), build("-fatbin", "saxpy.fatbin")

local n = 50000
local x, y = cuda.array(n, "float32"), cuda.array(n, "float32")
for i = 1, n do x[i] = math.random() * 2 - 1; y[i] = math.random() * 2 - 1 end
local a = 1.75
local function check(label, saxpy)
  local d_x, d_y = cuda.to_device(x), cuda.to_device(y)
  saxpy[{ (n + 255) // 256, 256 }](a, d_x, d_y, n)
  local out, worst = d_y:copy_to_host(), 0
  for i = 1, n do worst = math.max(worst, math.abs(out[i] - (a * x[i] + y[i]))) end
  print(("%-40s max error %.2e"):format(label, worst))
  if worst > 1e-5 then error("nvcc_cubin: mismatch (" .. label .. ")") end
end

local m = cuda.load_module(cubin)
print("cubin kernels: " .. table.concat(m:kernels(), ", "))
check("cubin, signature given", m:get("saxpy", "float a, const float *x, float *y, int n"))
check("PTX, types from its .param list", cuda.load_module(ptx).saxpy)
check("fatbin, signature given", cuda.load_module(fatbin):get("saxpy", "float, const float*, float*, int"))

-- the C++ kernel by its plain name: scale_offset(double*, double, long long, int)
local so = m.scale_offset
local v = cuda.array(n, "float64")
for i = 1, n do v[i] = math.random() * 100 end
local d_v = cuda.to_device(v)
so[{ (n + 255) // 256, 256 }](d_v, 0.5, 3, n)
local out, worst = d_v:copy_to_host(), 0
for i = 1, n do worst = math.max(worst, math.abs(out[i] - (v[i] * 0.5 + 3))) end
print(("%-40s max error %.2e (types %s)"):format("C++ kernel, types from its mangled name", worst,
  table.concat(so:info().types, ", ")))
if worst > 1e-12 then error("nvcc_cubin: mismatch (scale_offset)") end
os.execute("rm -rf " .. dir)
