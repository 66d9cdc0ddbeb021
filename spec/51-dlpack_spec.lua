-- DLPack from Lua (issue 31, part 5): a:to_dlpack() hands out a DLManagedTensorVersioned (or a
-- legacy DLManagedTensor) as a light userdata, cuda.from_dlpack takes one; a round trip is a
-- view of the same memory, with its strides and read-only flag, and the memory goes once both
-- sides let go. (The C API, tensors made in C and deleters on other threads: spec 16.)
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda
local gpu = H.gpu(it, pending)

local function collect() collectgarbage(); collectgarbage() end

describe("DLPack from Lua", function()
  gpu("a round trip views the same memory: every dtype, strided views, both versions", function()
    math.randomseed(95)
    for _, dt in ipairs({ "int8", "uint16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool",
                          "complex64", "complex128" }) do
      local d = cuda.device_array({ 6, 5 }, dt)
      local h = cuda.zeros({ 6, 5 }, dt)
      for i = 1, #h do
        local v = math.random(0, 1)
        if dt == "bool" then h[i] = v == 1 elseif dt:match("^complex") then h[i] = { math.random(-9, 9), v }
        else h[i] = math.random(0, 100) end
      end
      d:copy_to_device(h)
      for _, versioned in ipairs({ true, false }) do
        local view = d:sub({ 2, 6, 2 }, { 1, 5, 2 })
        local back = cuda.from_dlpack(view:to_dlpack(versioned), versioned)
        assert.equal("foreign_array", back.kind)
        assert.equal(dt, tostring(back.dtype))
        assert.equal(view:ptr(), back:ptr())
        assert.same(view.shape, back.shape)
        assert.same(view.strides, back.strides)
        assert.same(view:copy_to_host():totable(), back:copy_to_host():totable())
      end
    end
  end)

  gpu("writes through the imported view are the array's; read-only travels with the versioned tensor", function()
    local d = cuda.device_array(64, "float32")
    d:fill(1)
    local b = cuda.from_dlpack(d:to_dlpack())
    b:sub({ 10, 20 }):fill(4)
    assert.equal(4, d[15])
    assert.equal(1, d[21])
    local ro = cuda.as_cuda_array(setmetatable({}, { __cuda_array_interface = {
      version = 3, data = { d:ptr(), true }, shape = { 64 }, typestr = "<f4" } }))
    local r = cuda.from_dlpack(ro:to_dlpack())
    C.raises("array:fill: array is read-only", r.fill, r, 0)
    -- a legacy tensor has no flags: writable
    cuda.from_dlpack(ro:to_dlpack(false), false):fill(2)
    assert.equal(2, d[1])
  end)

  gpu("the memory goes once the array and the imported view are both gone", function()
    for _ = 1, 2 do   -- (what earlier cases left, tensors included, let go first)
      collect()
      cuda.from_dlpack(cuda.device_array(1, "int8"):to_dlpack())
    end
    collect()
    cuda.empty_cache()
    local base = cuda.memory_stats().used_bytes
    local d = cuda.device_array(1 << 18, "float32")
    local v = cuda.from_dlpack(d:to_dlpack())
    d = nil
    collect()
    assert.is_true(cuda.memory_stats().used_bytes >= base + (1 << 20) - 16, "the view holds it")
    v:fill(1)
    v = nil
    collect()
    cuda.synchronize()
    cuda.from_dlpack(cuda.device_array(1, "int8"):to_dlpack())   -- (a DLPack call lets go of what is done)
    collect()
    cuda.from_dlpack(cuda.device_array(1, "int8"):to_dlpack())
    assert.is_true(cuda.memory_stats().used_bytes <= base + 2, "the 1 MiB array was let go")
  end)

  -- a real producer and consumer: PyTorch, through the C API from ctypes (spec/support/dlpack_torch.py)
  local torch = H.has_gpu and not H.cpu_device and os.execute("python3 -c 'import torch' >/dev/null 2>&1")
  local torch_it = torch and it or function(name) pending(name .. " #gpu (no PyTorch with a GPU here)") end
  torch_it("a zero-copy round trip with PyTorch: its tensor in, doubled in place, a transposed view back #gpu", function()
    local ok = os.execute("make -s libs >/dev/null")
    assert(ok, "make libs failed")
    local inc = os.getenv("LUA_INCDIR")
    local lib = inc and inc ~= "" and (inc .. "/../lib/liblua5.4.so.0") or "liblua5.4.so.0"
    local p = io.popen(("python3 spec/support/dlpack_torch.py %q ./libcudalua.so 2>&1"):format(lib))
    local out = p:read("a")
    local _, _, code = p:close()
    assert.equal(0, code, out)
    assert.matches("dlpack_torch: ok: same memory True, values True, strides True", out, 1, true)
  end)

  gpu("misuse names the function", function()
    C.raises("cuda.from_dlpack: argument 1: light userdata (a DLManagedTensor pointer) expected, got number",
      cuda.from_dlpack, 5)
    C.raises("cuda.from_dlpack: a NULL tensor", cuda.from_dlpack, cuda.NULL)
  end)
end)
