-- cudalua.interop: the CUDA Array Interface (v3). Any Lua value whose metatable has
-- __cuda_array_interface (a table, or a function returning one) is accepted wherever a device
-- array is, through a view made here without copying. cudalua arrays answer the same field.
local core = ...
local M = {}

local dtype_of = {
  ["<f4"] = "float32", ["<f8"] = "float64", ["<f2"] = "float16",
  ["|i1"] = "int8", ["<i2"] = "int16", ["<i4"] = "int32", ["<i8"] = "int64",
  ["|u1"] = "uint8", ["<u2"] = "uint16", ["<u4"] = "uint32", ["<u8"] = "uint64", ["|b1"] = "bool",
}
-- the same types spelled with "=" (native order) or "<"/"|" for one byte; this is little-endian
for k, v in pairs(dtype_of) do
  dtype_of["=" .. k:sub(2)] = v
  if k:sub(1, 1) == "|" then dtype_of["<" .. k:sub(2)] = v end
end

local function fail(msg) error("as_cuda_array: " .. msg, 3) end

local cache = setmetatable({}, { __mode = "k" }) -- object -> {key, view}

-- as_cuda_array(obj) -> a cudalua array viewing obj's memory
function M.as_cuda_array(obj)
  if core.array_info(obj) then return obj end
  local mt = getmetatable(obj)
  local cai = type(mt) == "table" and mt.__cuda_array_interface or nil
  if cai == nil then fail("the object has no __cuda_array_interface (got " .. type(obj) .. ")") end
  if type(cai) == "function" then cai = cai(obj) end
  if type(cai) ~= "table" then fail("__cuda_array_interface must be a table or give one, got " .. type(cai)) end
  local version = cai.version
  if math.type(version) ~= "integer" or version < 1 or version > 3 then
    fail("unsupported version " .. tostring(version) .. " (1 to 3)")
  end
  local data = cai.data
  if type(data) ~= "table" then fail("data must be {ptr, readonly}, got " .. type(data)) end
  local ptr, readonly = data[1], data[2]
  if math.type(ptr) ~= "integer" then fail("data[1] (the pointer) must be an integer, got " .. tostring(ptr)) end
  if readonly ~= nil and type(readonly) ~= "boolean" then fail("data[2] (read-only) must be a boolean") end
  local typestr = cai.typestr
  local dt = dtype_of[typestr]
  if not dt then
    fail(("unsupported typestr %s (supported: <f2 <f4 <f8 |i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1)"):format(
      type(typestr) == "string" and ("'" .. typestr .. "'") or tostring(typestr)))
  end
  local shape = cai.shape
  if type(shape) ~= "table" then fail("shape must be a table of integers, got " .. type(shape)) end
  if #shape > 8 then fail("more than 8 dimensions") end
  local n, dims = 1, {}
  for i = 1, #shape do
    local s = shape[i]
    if math.type(s) ~= "integer" then fail(("shape[%d] must be an integer, got %s"):format(i, tostring(s))) end
    if s < 0 then fail(("shape[%d] is negative (%d)"):format(i, s)) end
    dims[i] = s
    n = n * s
  end
  if #dims == 0 then dims[1] = 1 end -- a 0-d array holds one element
  if cai.mask ~= nil then fail("masked arrays are not supported") end
  local strides = cai.strides
  if strides ~= nil then
    if type(strides) ~= "table" or #strides ~= #shape then fail("strides must be nil or one integer per dimension") end
    local itemsize = core.dtype(dt).itemsize
    local c, f = itemsize, itemsize
    local is_c, is_f = true, true
    for i = #shape, 1, -1 do
      if shape[i] > 1 and strides[i] ~= c then is_c = false end
      c = c * shape[i]
    end
    for i = 1, #shape do
      if shape[i] > 1 and strides[i] ~= f then is_f = false end
      f = f * shape[i]
    end
    if not is_c then
      if is_f then fail("Fortran-order (column-major) arrays are not supported: pass a C-order copy") end
      local t = {}
      for i = 1, #strides do t[i] = tostring(strides[i]) end
      fail("non-contiguous strides {" .. table.concat(t, ", ") .. "} are not supported")
    end
  end
  local stream = cai.stream
  if stream ~= nil then
    if math.type(stream) ~= "integer" then fail("stream must be an integer handle, got " .. tostring(stream)) end
    if stream == 0 then fail("stream 0 is not allowed by the interface (use 1 for the legacy stream)") end
    -- the producer's work may still be queued on that stream: wait for it before using the data
    core.sync_stream_handle(stream)
  end
  local key = ("%d|%s|%s|%s"):format(ptr, typestr, table.concat(dims, ","), tostring(readonly))
  local hit = cache[obj]
  if hit and hit.key == key then return hit.view end
  local view = core.foreign_array(ptr, dt, dims, readonly, obj)
  cache[obj] = { key = key, view = view }
  return view
end

return M
