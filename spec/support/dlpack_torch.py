"""spec/support/dlpack_torch.py: a zero-copy DLPack round trip between PyTorch and cudalua's C
API, driven through ctypes (spec/51-dlpack_spec.lua runs it where PyTorch and a GPU are):
  python3 dlpack_torch.py LIBLUA LIBCUDALUA
PyTorch's tensor goes to cudalua as a legacy DLManagedTensor (torch.utils.dlpack.to_dlpack's
capsule, marked used as a consumer does); a Lua script doubles it in place with
cuda.elementwise and makes a transposed view, which comes back with cudalua_to_dlpack and
torch.utils.dlpack.from_dlpack. Checked: the same device addresses both ways (no copy), the
values against PyTorch's own arithmetic, and the strides; both sides then let go. Prints
"dlpack_torch: ok ..." and exits 0, or says what differs and exits 1; exits 77 without
PyTorch or a GPU."""
import ctypes
import sys

try:
    import torch
    import torch.utils.dlpack
except Exception as e:  # noqa: BLE001
    print(f"dlpack_torch: no PyTorch ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("dlpack_torch: PyTorch sees no GPU")
    sys.exit(77)

lua = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
cl = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
P = ctypes.c_void_p
lua.luaL_newstate.restype = P
lua.luaL_openlibs.argtypes = [P]
lua.luaL_requiref.argtypes = [P, ctypes.c_char_p, P, ctypes.c_int]
lua.luaL_loadstring.argtypes = [P, ctypes.c_char_p]
lua.lua_pcallk.argtypes = [P, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, P]
lua.lua_setglobal.argtypes = [P, ctypes.c_char_p]
lua.lua_getglobal.argtypes = [P, ctypes.c_char_p]
lua.lua_tolstring.argtypes = [P, ctypes.c_int, P]
lua.lua_tolstring.restype = ctypes.c_char_p
lua.lua_settop.argtypes = [P, ctypes.c_int]
lua.lua_close.argtypes = [P]
cl.cudalua_push_dlpack.argtypes = [P, P, ctypes.c_int]
cl.cudalua_to_dlpack.argtypes = [P, ctypes.c_int, ctypes.c_int]
cl.cudalua_to_dlpack.restype = P
api = ctypes.pythonapi
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_GetPointer.restype = P
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_New.argtypes = [P, ctypes.c_char_p, P]
api.PyCapsule_New.restype = ctypes.py_object

L = lua.luaL_newstate()
lua.luaL_openlibs(L)
lua.luaL_requiref(L, b"cudalua", ctypes.cast(cl.luaopen_cudalua, P), 1)
lua.lua_settop(L, 0)


def run(code):
    if lua.luaL_loadstring(L, code.encode()) != 0 or lua.lua_pcallk(L, 0, 0, 0, None, None) != 0:
        print("dlpack_torch: Lua error:", lua.lua_tolstring(L, -1, None).decode())
        sys.exit(1)


torch.manual_seed(7)
t = torch.randn(300, 200, device="cuda", dtype=torch.float32)
want = t * 2   # (exact in float32 on both sides: no rounding of its own)
ptr_in = t.data_ptr()
cap = torch.utils.dlpack.to_dlpack(t)
tensor = api.PyCapsule_GetPointer(cap, b"dltensor")
api.PyCapsule_SetName(cap, b"used_dltensor")   # ours now: PyTorch will not delete it
if cl.cudalua_push_dlpack(L, tensor, 0) != 1:
    sys.exit(1)
lua.lua_setglobal(L, b"x")
torch.cuda.synchronize()
run("""
local cuda = require "cudalua"
assert(x:ptr() == %d, "the tensor's memory, not a copy")
cuda.elementwise("float32 v", "float32 w", "w = v * 2.0f")(x, x)   -- in place
cuda.synchronize()
t_view = x:T()                        -- {200, 300}, strides {4, 800} bytes
""" % ptr_in)
lua.lua_getglobal(L, b"t_view")
out = cl.cudalua_to_dlpack(L, -1, 0)
lua.lua_settop(L, 0)
back = torch.utils.dlpack.from_dlpack(api.PyCapsule_New(out, b"dltensor", None))
same_memory = back.data_ptr() == ptr_in and t.data_ptr() == ptr_in
values = torch.equal(t, want) and torch.equal(back, want.t())
strides = back.stride() == (1, 200) and tuple(back.shape) == (200, 300)
run("x = nil; t_view = nil; collectgarbage(); collectgarbage()")
del back        # PyTorch calls cudalua's deleter
run("""
local cuda = require "cudalua"
cuda.from_dlpack(cuda.device_array(1, "int8"):to_dlpack())   -- lets go of the handed-out record
""")
lua.lua_close(L)   # the last array over PyTorch's memory is gone: its deleter has run by now
ok = same_memory and values and strides
print(f"dlpack_torch: {'ok' if ok else 'FAILED'}: same memory {same_memory}, values {values}, strides {strides}; "
      f"a {tuple(t.shape)} float32 tensor in, its transposed view back, zero copies")
sys.exit(0 if ok else 1)
