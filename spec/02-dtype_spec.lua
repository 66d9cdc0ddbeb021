-- Element types: cuda.float32 ... cuda.float16, their fields, and names accepted as dtypes.
local H = require "spec.helper"
local C = require "spec.check"
local cuda = H.cuda

local ALL = {
  -- name, alias, itemsize, typestr, C type, is_float
  { "float32", "f4", 4, "<f4", "float", true },
  { "float64", "f8", 8, "<f8", "double", true },
  { "int8", "i1", 1, "|i1", "signed char", false },
  { "int16", "i2", 2, "<i2", "short", false },
  { "int32", "i4", 4, "<i4", "int", false },
  { "int64", "i8", 8, "<i8", "long long", false },
  { "uint8", "u1", 1, "|u1", "unsigned char", false },
  { "uint16", "u2", 2, "<u2", "unsigned short", false },
  { "uint32", "u4", 4, "<u4", "unsigned int", false },
  { "uint64", "u8", 8, "<u8", "unsigned long long", false },
  { "bool", "b1", 1, "|b1", "bool", false },
  { "float16", "f2", 2, "<f2", "__half", true },
}

describe("dtype values", function()
  it("print as their names and describe themselves", function()
    for _, d in ipairs(ALL) do
      local dt = cuda[d[1]]
      assert.is_userdata(dt)
      assert.equal(d[1], tostring(dt))
      assert.equal(d[1], dt.name)
      assert.equal(d[3], dt.itemsize)
      assert.equal(d[4], dt.typestr)
      assert.equal(d[5], dt.ctype)
      assert.equal(d[6], dt.is_float)
    end
  end)

  it("are twelve distinct values", function()
    local seen = {}
    for _, d in ipairs(ALL) do
      assert.is_nil(seen[cuda[d[1]]])
      seen[cuda[d[1]]] = true
    end
  end)

  it("have no other fields", function()
    assert.is_nil(cuda.float32.size)
    assert.is_nil(cuda.int8.bogus)
  end)
end)

describe("cuda.dtype", function()
  it("returns the same value for a dtype, its name or its alias", function()
    for _, d in ipairs(ALL) do
      local dt = cuda[d[1]]
      assert.equal(dt, cuda.dtype(dt))
      assert.equal(dt, cuda.dtype(d[1]))
      assert.equal(dt, cuda.dtype(d[2]))
    end
  end)

  it("knows the C names float, double and int", function()
    assert.equal(cuda.float32, cuda.dtype("float"))
    assert.equal(cuda.float64, cuda.dtype("double"))
    assert.equal(cuda.int32, cuda.dtype("int"))
  end)

  it("rejects unknown names and other values", function()
    C.raises("unknown dtype 'float128'", cuda.dtype, "float128")
    C.raises("unknown dtype 'Float32'", cuda.dtype, "Float32")
    C.raises("unknown dtype ''", cuda.dtype, "")
    C.raises('dtype (cuda.float32, "float32", ...) expected, got number', cuda.dtype, 4)
    C.raises('dtype (cuda.float32, "float32", ...) expected, got table', cuda.dtype, {})
    C.raises('dtype (cuda.float32, "float32", ...) expected, got no value', cuda.dtype)
  end)
end)

describe("dtypes as arguments", function()
  it("are accepted as values, names and aliases wherever a dtype is", function()
    for _, d in ipairs(ALL) do
      for _, spec in ipairs { cuda[d[1]], d[1], d[2] } do
        local a = cuda.array(3, spec)
        assert.equal(cuda[d[1]], a.dtype)
        assert.equal(3 * d[3], a.nbytes)
        assert.equal(cuda[d[1]], cuda.zeros({ 2, 2 }, spec).dtype)
      end
    end
  end)

  it("unknown ones are rejected by the constructors", function()
    C.raises("unknown dtype 'float33'", cuda.array, 3, "float33")
    C.raises("unknown dtype 'x'", cuda.array, { 1, 2 }, "x")
    C.raises("unknown dtype 'complex32'", cuda.zeros, { 2, 2 }, "complex32")
    C.raises('dtype (cuda.float32, "float32", ...) expected, got boolean', cuda.zeros, 2, true)
    C.raises("unknown dtype 'f3'", cuda.device_array, 4, "f3")
  end)
end)
