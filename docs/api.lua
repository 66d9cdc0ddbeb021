--- cudalua: CUDA for Lua 5.4. The reference of every public function, method, field and option.
-- This file is documentation only (most of cudalua is C): `make docs` builds HTML from it with
-- LDoc into docs/html/ and writes docs/API.md, the Markdown form GitHub shows. Indexes are
-- 1-based on the Lua side, device ids 0-based as CUDA numbers them. Every misuse raises a Lua
-- error of one form, `cudalua: <what you called>: <what is wrong>`, e.g. `cudalua: cuda.copy:
-- ...`, `cudalua: array:slice: ...`, `cudalua: array[i] =: ...`, `cudalua: kernel 'add': ...`
-- (a kernel's call), `cudalua: elementwise 'saxpy': ...`. An error of a Lua host function of
-- yours is raised by the next wait: `cudalua: stream:synchronize: a Lua host function failed:
-- <its message>`; one of a function cudalua calls for you at once (`nvtx.range`'s) comes back
-- as it was.
-- @module cudalua
-- @usage local cuda = require "cudalua"

local cuda = {}

--- System
-- @section system

--- The version of this build, e.g. "0.2.0".
cuda.__version = ""

--- True when a driver and at least one GPU are usable (or the CPU device is chosen); never raises.
function cuda.is_available() end

--- Runs everything from here on on cudalua's CPU device, as `CUDALUA_DEVICE=cpu` does: memory
-- is host memory, kernels are compiled by the host C++ compiler (`CXX`, else c++, g++ or
-- clang++) and run on a pool of threads. Call it before the first use of a device, or after
-- `cuda.is_available()` said no GPU; once the GPU's driver is in use it raises.
-- @return true
-- @usage if not cuda.is_available() then cuda.use_cpu() end
function cuda.use_cpu() end

--- Why no GPU is usable (nil when one is): "cudalua: no CUDA driver found (libcuda.so.1)"...
function cuda.driver_error() end

--- Prints the devices, the driver, NVRTC and cudalua versions, like `numba -s`.
-- @param out a file or an object with a write method (default io.stdout)
-- @return true when a GPU is usable
function cuda.detect(out) end

--- One table per device: `id`, `name`, `kind` ("gpu", or "cpu" for the CPU device, whose
-- `compute_capability` is {0, 0}), `compute_capability` {major, minor},
-- `multiprocessors`, `total_memory`, `concurrent_managed_access` and more attributes.
function cuda.devices() end

--- Selects the device (0-based) new objects are made on, for this thread.
function cuda.select_device(i) end

--- The selected device (0-based).
function cuda.current_device() end


--- Waits for all work on the selected device, running Lua host functions meanwhile.
function cuda.synchronize() end

--- True when launches return only once their work has run: with `CUDA_LAUNCH_BLOCKING=1`,
-- and under compute-sanitizer. Lua host functions then run before `launch_host_func` or the
-- graph launch that queued them returns, not at the next wait; false without a driver.
function cuda.launches_block() end

--- `{driver=13000, nvrtc={13,0}, nvjitlink={13,0}, cudalua="0.2.0"}`; missing parts are absent.
function cuda.versions() end






--- Free and total bytes of the selected device.
function cuda.mem_info() end

--- Sets a limit of the selected device's context (`cuCtxSetLimit`): `"stack_size"` (bytes a
-- thread), `"printf_fifo_size"`, `"malloc_heap_size"` (set before the kernels that use them),
-- `"dev_runtime_sync_depth"` (CDP1 only, compute capability below 9.0),
-- `"dev_runtime_pending_launch_count"` (device-side launches not yet finished, 2048 by
-- default), `"max_l2_fetch_granularity"` (0-128 bytes, a hint), `"persisting_l2_cache_size"`,
-- `"cig_shmem_fallback_enabled"`. The driver may round or clamp the value: `cuda.get_limit` says
-- what it took. An unknown name, a read-only one, a value that is not an integer of 0 or more
-- raise; so does what the driver refuses (CUDA_ERROR_UNSUPPORTED_LIMIT...). `"stack_size"`,
-- `"dev_runtime_pending_launch_count"` and `"dev_runtime_sync_depth"` are refused once code that
-- launches kernels from the device is loaded on the device: set them before (cudalua knows such
-- code by the device runtime's names in the image it loads: cuda.link's output and cubins; a
-- compressed fatbin from nvcc is not recognised). (Measured with
-- driver 580.159.04 on an H100: after a graph had run such a kernel, setting the first two
-- never returned, even with the graph closed.)
function cuda.set_limit(name, value) end

--- The value of a limit of the selected device's context (`cuCtxGetLimit`), by the names of
-- `cuda.set_limit`, and the read-only `"shmem_size"` and `"cig_enabled"` (CIG contexts).
function cuda.get_limit(name) end

--- Seconds from a monotonic clock (for timing on the host).
function cuda.time() end

--- Sleeps for the given seconds. The thread is idle meanwhile, so this state's Lua host
-- functions that come due run (as at a wait; their errors are raised by the next wait).
function cuda.sleep(seconds) end

--- Whether kernels of device a may use device b's memory once peer access is on.
function cuda.can_access_peer(a, b) end

--- Lets kernels and copies of device a use device b's memory (and its memory pool).
function cuda.enable_peer_access(a, b) end

--- Turns peer access from a to b off again.
function cuda.disable_peer_access(a, b) end

--- Device blocks freed by arrays are kept for reuse up to max_bytes (0 turns the cache off). The
-- limit is the process's; each state frees only the blocks it cached (a free is queued on the
-- block's stream, which only its state may know to be capturing), so a lower limit frees this
-- state's oldest blocks.
-- @return the bytes cached now, and the limit before the call
function cuda.block_cache(max_bytes) end

--- Frees the device blocks this state cached now (the limit stays).
function cuda.empty_cache() end

--- What cudalua holds on a device (default: the current one), as CuPy's MemoryPool and
-- cuda.core's memory resources say it. Counts are the process's (the states share the devices
-- and the block cache), each read atomically.
-- Fields: `used_bytes` (device arrays in use: cudalua's allocations, not another library's
-- memory, IPC-opened memory or a capture's allocations, which are the graph's), `cached_bytes`
-- (blocks the block cache keeps for reuse), `total_bytes` (the two: CuPy's total_bytes),
-- `peak_used_bytes`, `pinned_bytes` (pinned and mapped host arrays made in the device's
-- context), `managed_bytes`, `allocations` (live), `allocations_total` and `cache_hits` (since
-- the last reset), `limit` (0: none), and the driver's stream-ordered pool's own counts
-- (`cuMemPoolGetAttribute`): `reserved_bytes`, `peak_reserved_bytes`, `pool_used_bytes`,
-- `peak_pool_used_bytes` (every device array and cached block is in the pool, so
-- pool_used_bytes >= total_bytes). While a stream captures anywhere in the process those four
-- are left out (nil): the driver's query would end a capture begun in global mode.
-- About 0.4 us a call.
-- @param device an id
-- @return a table
function cuda.memory_stats(device) end

--- The peaks (cudalua's and the driver pool's) become what is in use now; allocations_total and
-- cache_hits count again from here. While a stream captures, the pool's marks stay.
-- @param device an id (default: the current one)
function cuda.reset_memory_stats(device) end

--- Limits the device memory cudalua holds on a device (arrays in use and cached blocks), as
-- CuPy's MemoryPool.set_limit: `bytes`, or `{fraction = f}` of the device's memory (0 to 1);
-- 0 or nil removes the limit. A device array that would pass it first has unreachable arrays
-- collected and this state's cached blocks freed; if it still would, the call raises naming
-- the limit, what is in use and what is cached. Host, pinned and managed memory are not
-- limited. The check is made at each allocation: states on other threads allocating at the
-- same moment may pass it together by one allocation each.
-- @param bytes the limit
-- @param device an id (default: the current one)
-- @return the limit before (0: none)
function cuda.set_memory_limit(bytes, device) end

--- Numba's defer_cleanup: frees and destroys (arrays, streams, events, modules, graphs) asked
-- for while fn runs are put off until it returns or raises, so that a loop of short-lived
-- arrays is not held up by the waits a free implies. Scopes nest; the last to end runs what
-- was put off. Without arguments it returns a guard whose scope ends with its block
-- (`local _ <close> = cuda.defer_cleanup()`) or at guard:close().
-- @return fn's results
function cuda.defer_cleanup(fn, ...) end

--- The releases this state has put off now (by cuda.defer_cleanup scopes, a capture, or a host
-- function), and the defer_cleanup scopes open.
-- @return pending, open
function cuda.pending_cleanup() end

--- Element types
-- @section dtypes

--- `NULL`: a NULL pointer kernel argument, as `nil` is: `nil` (or `cuda.NULL`) for a pointer
-- parameter passes NULL (launches, launchers, graph kernel nodes, `exec:set_args`); for any
-- other parameter it raises. A `nil` at the end of an argument table (`{a, nil}`) is not
-- counted by Lua, so the launch raises "expects N arguments"; write `cuda.NULL` there.
cuda.NULL = nil

--- Element types, fields of the module (`cuda.float32`...): `float32`, `float64`, `float16`,
-- `bfloat16` (`__nv_bfloat16`), `complex64` and `complex128` (cuComplex's layouts), `int8`,
-- `int16`, `int32`, `int64`, `uint8`, `uint16`, `uint32`, `uint64`, `bool`. Strings ("float32",
-- "f4", "c8") are accepted wherever a dtype is. A complex element is a pair `{re, im}` on the Lua
-- side (reads give a new pair; a number stands for `{number, 0}`); in a table given to
-- `cuda.array`, a pair below the top level is one element. Kernel parameters of type `float2` /
-- `cuFloatComplex` and `double2` / `cuDoubleComplex` take a pair or a number. Typestrs: `<V2`
-- (bfloat16), `<c8`, `<c16`.
cuda.float32 = nil
cuda.float64 = nil
cuda.float16 = nil
cuda.int8 = nil
cuda.int16 = nil
cuda.int32 = nil
cuda.int64 = nil
cuda.uint8 = nil
cuda.uint16 = nil
cuda.uint32 = nil
cuda.uint64 = nil
cuda.bool = nil

--- The dtype a name or a dtype stands for; raises for an unknown name.
function cuda.dtype(name) end

--- A dtype. Fields: `Dtype.name`, `Dtype.itemsize` (bytes), `Dtype.typestr` (as the CUDA Array
-- Interface spells it), `Dtype.ctype` (the C type kernels use), `Dtype.is_float`,
-- `Dtype.is_complex`.
-- @type Dtype
local Dtype = {}
Dtype.name = ""
Dtype.itemsize = 0
Dtype.typestr = ""
Dtype.ctype = ""
Dtype.is_float = false
Dtype.is_complex = false

--- Arrays
-- @section arrays

--- A pageable host array from a table (nested tables make N-d arrays) or zero-filled of a shape.
-- @param values a table of numbers, or a shape (integer or {rows, cols, ...})
-- @param dtype default float64 for shapes, inferred from the values for tables
function cuda.array(values, dtype) end

--- A zero-filled host array of a shape.
function cuda.zeros(shape, dtype) end

--- Page-locked host memory: fast and asynchronous copies.
function cuda.pinned_array(shape, dtype) end

--- Page-locked host memory kernels read and write directly (zero-copy).
function cuda.mapped_array(shape, dtype) end

--- Unified memory the host and kernels share.
function cuda.managed_array(shape, dtype) end

--- Uninitialised device memory.
-- @param shape an integer or {rows, cols, ...}
-- @param dtype default float64
-- @param stream a stream, or options `stream` (allocation ordered on it) and `ipc` (memory that
-- can be shared with other processes through `Array:ipc_handle`)
function cuda.device_array(shape, dtype, stream) end

--- A device array of another array's shape and dtype.
function cuda.device_array_like(a, stream) end

--- A device copy of a host array (or of a table, with a dtype).
function cuda.to_device(a, stream_or_dtype, stream) end

--- Copies src into dst (same dtype and size): host, device and other devices' memory
-- (peer copies), on a stream or ordered after queued work. A strided view at either end
-- (`Array:sub`, `Array:transpose`) needs one shape at both (axes of extent 1 aside); it is
-- copied as 2-D or 3-D copies (cuMemcpy2DAsync / cuMemcpy3DAsync), not element by element;
-- between two devices only contiguous arrays are copied.
function cuda.copy(dst, src, stream) end


--- Opens device memory another process shared (`Array:ipc_handle`), as an array.
function cuda.open_ipc_array(handle, shape, dtype) end

--- An array of any kind. Fields: `Array.shape` (a table), `Array.dtype`, `Array.ndim`,
-- `Array.size` (elements), `Array.nbytes`, `Array.itemsize`, `Array.kind` ("array",
-- "pinned_array", "mapped_array", "managed_array", "device_array", "foreign"), `Array.device`,
-- `Array.closed`, `Array.strides` (bytes from one index of each axis to the next, as NumPy's
-- and the CUDA Array Interface's). `#a` is the number of elements; `a[i]` reads and writes
-- element i in row-major order (device arrays: one slow copy each); `tostring(a)` shows the values.
-- Views (`Array:slice`, `Array:sub`, `Array:transpose`, `Array:squeeze`) share their parent's
-- memory and keep it alive. A kernel given a view gets the address of its first element (the
-- strides are the kernel's business: pass them as arguments); `cuda.elementwise`,
-- `cuda.reduce`, `Array:reshape`, textures, NCCL buffers, IPC handles and graph memsets need a
-- contiguous array and say so, naming the function (`Array:copy` makes one).
-- Metafields: `__cuda_array_interface` (v3, with the strides), `__close` (frees it), `__gc`.
-- @type Array
local Array = {}
Array.shape = {}
Array.dtype = nil
Array.ndim = 0
Array.size = 0
Array.nbytes = 0
Array.itemsize = 0
Array.kind = ""
Array.device = 0
Array.closed = false
Array.strides = {}

--- Element (i, j, ...), one index per dimension.
function Array:get(...) end

--- Sets element (i, j, ...) to v, one index per dimension.
function Array:set(...) end

--- A Lua table of the values (nested for N-d arrays).
function Array:totable() end

--- Sets every element to v; returns the array.
function Array:fill(v, stream) end

--- A new host array with the values, or copies into `into` (on a stream: asynchronous).
function Array:copy_to_host(into, stream) end

--- Copies src (host, device or another device's array) into this array.
function Array:copy_to_device(src, stream) end

--- Elements first..last (1-based, inclusive) of the first axis as a view, no copy.
function Array:slice(first, last) end

--- A view selecting along every axis, one selector per axis (those left out: the whole axis):
-- `nil` or `true`, the whole axis; an integer i, index i, the axis dropped (NumPy's `a[:, j]`);
-- `{first, last, step}`, 1-based and inclusive as `string.sub` (negative: from the end; step
-- >= 1). `d:sub(nil, j)` is column j, `d:sub({1, -1, 2})` every other row.
function Array:sub(...) end

--- A view with the axes in perm's order (a list of 1-based axes; default: reversed).
function Array:transpose(perm) end

--- The transpose: the axes reversed (`Array:transpose()`).
function Array:T() end

--- A view without the axes of extent 1 (or only the given one, which must have extent 1).
function Array:squeeze(axis) end

--- True when the elements lie one after another in C (row-major) order (NumPy's rule: axes
-- of extent 1 and empty arrays do not count).
function Array:is_contiguous() end

--- A new contiguous array of the same kind (a foreign array's: a device array) with the values
-- (CuPy's `a.copy()`).
function Array:copy(stream) end

--- The same memory with another shape (same size; a contiguous array).
function Array:reshape(shape) end

--- The same bytes as another dtype. To another item size the last dimension is rescaled, as
-- NumPy and Numba do (int16 `{3, 4}` as int32 is `{3, 2}`): its bytes must divide by the new
-- item size, and the array must start aligned for it.
function Array:view(dtype) end

--- The device address (an integer).
function Array:ptr() end

--- Frees the memory now (once queued work that uses it is done); later use raises.
function Array:close() end

--- cuMemAdvise for managed memory: "read_mostly", "preferred_location", "accessed_by"...
function Array:advise(advice, device) end

--- The array as a new DLPack tensor (a light userdata: a `DLManagedTensorVersioned *`, or with
-- versioned false a legacy `DLManagedTensor *`): device, dtype, shape, strides in items and
-- (versioned) the read-only flag; queued work on it is waited for first. Its memory stays alive
-- until the consumer calls the deleter (once, from any thread); the state lets it go at its
-- next DLPack call or its close. The C API: `cudalua_to_dlpack`.
function Array:to_dlpack(versioned) end

--- A string another process passes to `cuda.open_ipc_array` (arrays made with `ipc = true`).
function Array:ipc_handle() end

--- CUDA arrays, textures and surfaces
-- @section textures

--- A CUDA array: opaque device memory laid out for texture fetches and surface loads and stores
-- (cuArray3DCreate). `shape` in C order like arrays': `{width}`, `{height, width}` or `{depth,
-- height, width}`; layered, `{layers, width}` or `{layers, height, width}`. dtype int8, int16,
-- int32, uint8, uint16, uint32, float16 or float32 (others raise: CUDA has no such array format;
-- this CUDA has no bfloat16 one). Options: `channels` (1, 2 or 4 values of the dtype per element:
-- the arrays copied in and out hold channels times as many values), `layered` (a boolean),
-- `surface` (a boolean: `cuda.surface` may write it). Freed by `CudaArray:close`, `<close>` or
-- the collector, once no queued work and no texture or surface uses it.
function cuda.cuda_array(shape, dtype, opts) end

--- A texture object over a `CudaArray`, a 1-D device array (linear memory, read with
-- `tex1Dfetch`) or a 2-D device array (pitched memory: its rows must be a multiple of the device's
-- `TEXTURE_PITCH_ALIGNMENT` bytes). Kernels take it as `cudaTextureObject_t`. Options: `filter`
-- ("point", the default, or "linear": float data, or 8- and 16-bit integers read as
-- "normalized_float"), `address` ("clamp", the default, "border", and with `normalized` "wrap" and
-- "mirror"; or a list, one per dimension, dimensions past it taking its last mode), `normalized` (coordinates in [0, 1)), `read`
-- ("element", the default, or "normalized_float": uint8 / uint16 to [0, 1], int8 / int16 to
-- [-1, 1]), `srgb` (uint8 read as normalized_float), `border` (up to 4 numbers: the value outside
-- the texture with "border"), `channels` (a device array's, 1, 2 or 4: its last extent holds
-- width times channels values). Combinations CUDA refuses, or would quietly change (wrap without
-- normalized coordinates clamps), raise first. The texture keeps the memory it reads alive.
-- Closed inside the stream capture that used it (or its CUDA array closed there), it stays the
-- graph's: the capture holds the objects and memory its work used.
function cuda.texture(source, opts) end

--- A surface object over a `CudaArray` made with `surface = true`; kernels take it as
-- `cudaSurfaceObject_t` (surf2Dread / surf2Dwrite address x in bytes). It keeps the array alive.
function cuda.surface(cuda_array) end

--- A CUDA array. Fields: `CudaArray.shape`, `CudaArray.dtype`, `CudaArray.channels`,
-- `CudaArray.ndim`, `CudaArray.layered`, `CudaArray.surface`, `CudaArray.closed`,
-- `CudaArray.handle` (the CUarray, an integer, for C code and other libraries). Metafields:
-- `__close`, `__gc`. A closed CUDA array raises when used; textures and surfaces made over it
-- before go on reading it.
-- @type CudaArray
local CudaArray = {}
CudaArray.shape = {}
CudaArray.dtype = nil
CudaArray.channels = 1
CudaArray.ndim = 0
CudaArray.layered = false
CudaArray.surface = false
CudaArray.closed = false
CudaArray.handle = 0

--- Copies src (a host or device array, or a table of values) of the same dtype and as many
-- values (elements times channels) into the CUDA array (cuMemcpy3DAsync); returns it. On a
-- stream: asynchronous.
function CudaArray:copy_to_device(src, stream) end

--- A new host array of the values (shape, then channels when more than 1), or copies into
-- `into` (any array of the same dtype and size, a device array too); on a stream: asynchronous.
function CudaArray:copy_to_host(into, stream) end

--- Frees the CUDA array once queued work, textures and surfaces no longer use it; later use raises.
-- The texture and surface objects it kept for reuse (`Texture:close`) go now, each once the work
-- queued on it is done (a wait that closing those textures used to make).
function CudaArray:close() end

--- A texture object (`cuda.texture`) or surface object (`cuda.surface`), a kernel argument of
-- type `cudaTextureObject_t` / `cudaSurfaceObject_t` in launches, launchers, graph kernel nodes
-- and `exec:set_args` (a graph holds it while it may run). Fields: `Texture.handle` (the
-- integer kernels get), `Texture.closed`. Metafields: `__close`, `__gc`. A closed one passed to
-- a kernel raises.
-- @type Texture
local Texture = {}
Texture.handle = 0
Texture.closed = false

--- Destroys the object once queued work no longer uses it, and lets go of its memory. One
-- over a CUDA array still open is kept by the array instead (up to four, let go with it) and
-- given to the next `cuda.texture` (`cuda.surface`) over that array with the same options: the
-- same handle, which reads exactly the same, without the driver's create and destroy (about
-- 2.5 us on an H100). Not inside a host function, whose closes are put off.
function Texture:close() end

--- Streams and events
-- @section streams

--- A new stream. `cuda.stream(true)` does not wait on the legacy stream; or options
-- `non_blocking` (a boolean) and `priority` (an integer of `cuda.stream_priority_range()`;
-- smaller is higher, 0 the default; out of range raises).
function cuda.stream(opts) end

--- The least and the greatest stream priority of the selected device (e.g. 0, -5).
function cuda.stream_priority_range() end

--- The legacy default stream.
function cuda.default_stream() end

--- An event; options `timing` (default true) and `interprocess`.
function cuda.event(opts) end

--- Milliseconds between two recorded events.
function cuda.event_elapsed_time(e0, e1) end

--- Opens an event another process shared (`Event:ipc_handle`).
function cuda.open_ipc_event(handle) end

--- A stream of the device it was made on. Fields `Stream.priority` and `Stream.non_blocking`.
-- Metafields `__close`, `__gc`.
-- @type Stream
local Stream = {}
Stream.priority = 0
Stream.non_blocking = false

--- Waits for the stream's work (running Lua host functions, raising their errors).
function Stream:synchronize() end

--- True when all its work is done.
function Stream:query() end

--- Later work on the stream waits for the event.
function Stream:wait_event(e) end

--- Queues fn (a Lua function, no arguments) to run when the stream reaches it; later work on
-- the stream waits for it. It runs when this Lua state waits in cudalua (synchronize, query,
-- blocking copies), or, while the state's thread is blocked in a driver call that needs it
-- (a full queue, launches that block), on cudalua's helper thread. Inside it, waits for the
-- GPU raise and releases (close, collection) are put off until it returns; its error is raised
-- by the next wait. Captured, it runs at each launch of the graph.
function Stream:launch_host_func(fn) end

--- Starts capturing the stream's work into a graph: mode "global", "thread_local" or "relaxed".
function Stream:begin_capture(mode) end

--- Ends the capture; returns the graph.
function Stream:end_capture() end

--- True while the stream captures.
function Stream:is_capturing() end

--- In a capture: a condition of the captured graph, for the conditional nodes made on this
-- stream (`Stream:while_loop`...) and for the kernels launched in the capture that set it
-- (`cudaGraphSetConditional`); options as `Graph:condition`'s. The capture form of
-- `Graph:condition`, as cuda.core's `GraphBuilder.create_conditional_handle`.
function Stream:condition(opts) end

--- In a capture: an IF node at the stream's place. `fn(body_stream)` is called at once with a
-- new stream that captures the node's body (launch the body's work on it); the body runs
-- when the condition is not 0. Later work on this stream follows the node.
function Stream:if_then(cond, fn) end

--- In a capture: an IF/ELSE node; `fn_then` and `fn_else` capture its two bodies.
function Stream:if_else(cond, fn_then, fn_else) end

--- In a capture: a WHILE node; `fn(body_stream)` captures its body, run while the condition
-- is not 0 (tested before each run). Bodies may launch kernels, copy, fill, and nest
-- conditional nodes (`body_stream:while_loop`...); Lua host functions, allocations and
-- event nodes are refused there (CUDA refuses them in bodies); a body with no work is
-- refused. Its graph runs as `Graph:while_loop`'s (one at a time per device).
function Stream:while_loop(cond, fn) end

--- In a capture: a SWITCH node, one body per function of the list `fns`; body k + 1 runs when
-- the condition is k, none when it is `#fns` or more.
function Stream:switch(cond, fns) end

--- The CUstream handle (an integer).
function Stream:handle() end

--- The stream's device id.
function Stream:device() end

--- Destroys the stream once its queued work is done.
function Stream:close() end

--- An event. Metafields `__close`, `__gc`.
-- @type Event
local Event = {}

--- Records the event on a stream (default: the legacy stream). Options (`opts`): `external`
-- (in a stream capture: an event record node, recorded at each launch of the graph; without
-- it a record there only orders the capture's streams).
function Event:record(stream, opts) end

--- Waits for the event.
function Event:synchronize() end

--- True when the event has happened.
function Event:query() end

--- Milliseconds from this event to another.
function Event:elapsed_time(other) end

--- A string another process passes to `cuda.open_ipc_event` (events made with `interprocess`).
function Event:ipc_handle() end

--- Destroys the event.
function Event:close() end

--- Kernels
-- @section kernels

--- Compiles CUDA C++ with NVRTC; returns a module. Kernel parameter types come from the compiler.
-- Options (`opts`): `options` (NVRTC options), `name` (file name in messages; relative includes
-- from its folder), `headers` ({["x.h"] = source}), `include_dirs`, `arch` ("sm_90";
-- default: the device's), `name_expressions` (templates: {"scale<float>"}), `cache` (false:
-- no compile cache), `relocatable` (-rdc, for `cuda.link`), `lto`, `debug` (-G -lineinfo),
-- `lineinfo`, `pch` (false: no precompiled header).
--
-- **Precompiled headers** (NVRTC 12.8+): a source whose headers are all the toolkit's (CCCL,
-- cooperative groups...) compiles with NVRTC's automatic PCH. The first one of an `#include`
-- run makes it (about 15% slower); a later, different source starting with the same run skips
-- parsing those headers (an H100 machine: 0.16 s instead of about 1 s for `<cub/cub.cuh>`). The
-- image, the PTX and the diagnostics are the same as without, and the compile cache's key does
-- not hold it; `m:log()` ends with a line saying the PCH was made or used. NVRTC keeps the PCH
-- for the process only (it is valid only for the NVRTC loaded there); across processes the
-- compile cache keeps the modules. A source including a file of the user's gets none (NVRTC
-- took a PCH as valid after that file changed). `CUDALUA_PCH=0` turns it off everywhere. Each
-- PCH is a file of 100-250 MB in /tmp until the process ends: at most `CUDALUA_PCH_MAX`
-- (default 4) are made in a process, and past that only the runs that have one use it. When
-- NVRTC's PCH heap is too small for a header run, cudalua grows it to what NVRTC asks and
-- compiles again (`compile_stats().pch_heap_grown`); `CUDALUA_PCH_HEAP` (bytes) sets the heap's
-- size before the first such compile.
function cuda.compile(src, opts) end

--- Compiles several sources at once: a list of sources, or of `{source, opts}` (an item's opts
-- join the shared `opts` and win); returns the modules in order and, when some failed, a table
-- of their messages by index (`mods[i]` is then false), without raising for them. NVRTC
-- compiles one program at a time in a process, so each source's compile runs in a child
-- process of its own (forked; it runs only NVRTC, no Lua and no CUDA, and sends the result
-- back); a source whose `#include` run two of them share and the process has no PCH of is
-- compiled first, here, to make it for the others (the children only use PCHs, never make
-- them). At most as many children run at once as there are CPUs; one that gives no result in
-- `CUDALUA_COMPILE_TIMEOUT` seconds (default 900) is killed, and its source's error says so. Each PCH NVRTC makes (one per
-- `#include` run and option set) is a file of 100-250 MB in /tmp until the process ends.
-- @usage local mods, errs = cuda.compile_all({src_a, src_b, {src_c, {name = "c.cu"}}}, {arch = "sm_90"})
function cuda.compile_all(sources, opts) end

--- What this Lua state's compiles cost so far: `nvrtc_runs`, `nvrtc_ms` (in NVRTC, or waiting
-- for `compile_all`'s children), `link_ms` (nvJitLink), `pch_made`, `pch_used`,
-- `pch_heap_grown` (NVRTC asked for a bigger PCH heap: grown, compiled again), `child_runs`
-- (NVRTC runs `compile_all` took from its children) and the compile
-- cache's `cache_memory_hits`, `cache_disk_hits`, `cache_misses`, `cache_writes`.
function cuda.compile_stats() end

--- Compiles src and returns its kernel name (`opts` as `cuda.compile`); a C++ name ("ns::k",
-- "scale<float>") needs no `name_expressions`. With `relocatable` or `lto` the module is linked
-- on its own first (as `nvcc -rdc=true` links a one-file program), with the CUDA device runtime
-- when its kernels launch kernels: dynamic parallelism needs `relocatable = true` and nothing else.
function cuda.kernel(src, name, opts) end

--- Loads a cubin, fatbin, PTX or LTO-IR (a path or the bytes) built elsewhere.
-- Options (`opts`): `name`, `arch` (for LTO-IR).
function cuda.load_module(path_or_bytes, opts) end

--- Links modules made with `relocatable` or `lto`, loaded modules, images and static libraries
-- (`.a` archives of `nvcc -dc` objects, by path or bytes) into one module with nvJitLink.
-- Options (`opts`): `name`, `arch`, `options` (nvJitLink options).
--
-- **Dynamic parallelism** (a kernel launching kernels, `child<<<grid, block>>>(...)`): compile
-- with `relocatable = true` (or `lto = true`); `cuda.link {m}` adds the CUDA device runtime
-- `libcudadevrt.a` itself when an input calls it. It is looked for at `CUDALUA_CUDADEVRT` (the
-- file), next to the NVRTC library in use (a toolkit's `lib64`, a pip wheel's `lib`), next to
-- nvJitLink, under `CUDA_HOME`, `CUDA_PATH`, `CUDA_DIR` (`lib64`, `lib`) and in
-- `/usr/local/cuda/lib64`; not found, the link raises naming every place. It is added only when
-- needed: relocatable cubins and PTX name its entry points (`__cudaCDP2*`) in plain text, and a
-- link of LTO-IR that fails on them is done again with it; linking it always would cost 2 ms a
-- link instead of 0.1 ms (a small relocatable cubin, sm_90, nvJitLink 13.0).
--
-- CDP2 (CUDA 12 and later, the only kind on compute capability 9.0+): device code cannot call
-- `cudaDeviceSynchronize`; a parent grid is complete only once all the grids it launched are,
-- so the host's wait for the parent waits for every descendant. Children launched into a
-- block's default stream run in order; `cudaStreamFireAndForget` runs a child independently, and
-- `cudaStreamTailLaunch` runs it after the launching grid has ended (work that needs the
-- parent's results). Launches not yet finished count against
-- `cuda.set_limit("dev_runtime_pending_launch_count", n)` (2048 by default; beyond it device
-- launches fail), and launches nest at most 24 deep. Such kernels work in graphs as kernel
-- nodes (`g:kernel`) and in captures. A graph whose last node is such a kernel was not waited
-- for with the kernel's children (an H100, driver 580: after the stream's sync their output
-- was missing, and with several replays lost), so once such code is loaded on a device,
-- cudalua instantiates (and updates) that device's graphs with a 1-byte memset node after
-- their last nodes: about 2 us a launch; the graph, its nodes and node_count are unchanged.
-- Without a GPU the link works (`arch = "sm_90"`); using a kernel raises the no-driver error.
function cuda.link(inputs, opts) end

--- A module: kernels by name (`m.vecadd`) or by `Module:get`.
-- @type Module
local Module = {}

--- The kernel named name (or a name expression); sig, a signature such as
-- "float*, const float*, int", gives the types where the module has none. Its length is
-- checked against the parameters the image lists (a cubin's or fatbin's ELF attributes, the
-- PTX), else against the driver's parameter sizes; each size against the driver's.
function Module:get(name, sig) end

--- The names of its kernels.
function Module:kernels() end

--- The image: cubin, PTX, fatbin or LTO-IR bytes.
function Module:image() end

--- What it holds: "cubin", "ptx", "fatbin" or "ltoir".
function Module:kind() end

--- The PTX it was made from, where known.
function Module:ptx() end

--- The cubin, when it holds one.
function Module:cubin() end

--- The compiler's and linker's log.
function Module:log() end

--- A `__constant__` or `__device__` variable as a device array view of the module's memory
-- (CuPy's `RawModule.get_global`, `cuModuleGetGlobal`): copies (`copy_to_device`,
-- `copy_to_host`, `fill`, `cuda.copy` on a stream), kernel arguments and graph memcpy nodes
-- take it; the view keeps its module loaded. For a module `cuda.compile` made, dtype and shape
-- come from simple declarations (`__constant__ float c[17];`, `__device__ double m[4][8];`, in
-- namespaces or `extern "C"`; `"ns::v"` names a variable in a namespace, found through NVRTC's
-- name expressions); otherwise (load_module, link, declarations not read) give dtype, and
-- shape (default: the size / the itemsize, 1-D). The driver's size must be dtype x shape; an
-- unknown name raises, listing the variables the source declares.
function Module:get_global(name, dtype, shape) end

--- The module's SASS as text, from the toolkit's `nvdisasm` (a cubin) or `cuobjdump -sass` (a
-- cubin or fatbin), found on PATH, in `$CUDA_HOME/bin`, `$CUDA_PATH/bin` or
-- `/usr/local/cuda/bin`; raises naming the tool when neither is there, and for PTX or LTO-IR.
function Module:sass() end

--- A kernel. `k[{grid, block [, stream [, shared]]}]` or `k[{grid = , block = , stream = ,
-- shared = , cooperative = , cluster = }]` gives a `Launcher`; unknown keys raise. A table
-- config is parsed once when kept. Launch config keys: `grid`, `block` (integers or {x, y, z}),
-- `stream`, `shared` (dynamic shared bytes; over 48 KiB opted in automatically),
-- `cooperative` (grid-wide sync; the grid must fit on the device at once), `cluster` ({x, y, z},
-- Hopper).
-- @type Kernel
local Kernel = {}

--- Launches with a config table (keys as above) and the kernel's arguments.
function Kernel:launch(config, ...) end

--- A launcher for n threads with the occupancy calculator's block size.
-- Options: `stream`, `shared`, `cooperative`, `cluster`.
function Kernel:forall(n, opts) end

--- The occupancy calculator's grid and block for a dynamic shared size.
function Kernel:occupancy(shared) end

--- Blocks of a size that fit on one multiprocessor at once.
function Kernel:max_blocks_per_sm(block, shared) end

--- Function attributes: every CU_FUNC_ATTRIBUTE_* the driver reports (registers, local,
-- shared and constant memory, max threads, PTX and binary versions, cache_mode_ca, the shared
-- memory and cluster settings) and `cache_config`; on the CPU device also `cpu_threads`: how a
-- block's threads run ("loop", "coroutines" or "fibers").
function Kernel:attributes() end

--- Sets a writable attribute: "max_dynamic_shared_size_bytes",
-- "preferred_shared_memory_carveout", "non_portable_cluster_size_allowed", "cache_config"...
function Kernel:set_attribute(name, value) end

--- Its name, parameter types and symbol.
function Kernel:info() end

--- The CUfunction handle (an integer).
function Kernel:handle() end

--- What `k[config]` gives: call it with the kernel's arguments to launch.
-- @type Launcher
local Launcher = {}

--- Launches the kernel with these arguments (`launcher(...)`, the `__call` metamethod).
function Launcher:__call(...) end

--- Helpers
-- @section helpers

--- Numba's reduce: a reducer for a binary expression of a and b ("a + b", "fmax(a, b)").
-- Options (`opts`): `init`. The reducer is called as `r(array, opts)` with options `init`,
-- `res` (a device array: the result stays there) and `stream`; it returns a number. With
-- `axis` (1-based, negative from the end, or a list) and `keepdims` it reduces along those
-- axes and returns a device array of the results (into `res` when given), init folded into
-- each: an expression known to commute ("a + b", "a * b", bitwise) folds in parallel lanes,
-- any other folds each result in one thread in the elements' order. A strided view
-- (`Array:sub`, `Array:transpose`) is reduced whole the same way.
-- `r:precompile(dtypes)` compiles its kernels for these dtypes (names or dtypes) on the
-- selected device now, all at once (`cuda.compile_all`), rather than each at its first call,
-- and returns r; the dtypes that compile are kept, then the first that does not raises,
-- naming it.
-- @usage local sum = cuda.reduce("a + b"):precompile { "float32", "float64", "int32" }
function cuda.reduce(expr, opts) end

--- CuPy's ElementwiseKernel (Numba's @vectorize): a callable running body once per element.
-- `ew(in1, ..., [out1, ...], [opts])`: inputs given as Lua numbers are broadcast, arrays all
-- have one size; outputs not given are made (device arrays shaped like the first array input)
-- and returned. Options: `stream`, `block`. One kernel per dtypes-and-scalars signature, a
-- grid-stride loop with 16-byte loads and stores when every pointer is aligned. Every dtype:
-- `bfloat16` values are `__nv_bfloat16`, complex ones `cuda::std::complex<float|double>` in the
-- body (complex scalars are given as pairs `{re, im}` or numbers). `ew:precompile(scalars)`
-- compiles, now and at once (`cuda.compile_all`) on the selected device, the kernels of the
-- calls whose inputs named in the list `scalars` are numbers and the others arrays (default:
-- every input an array), at both vector widths, and returns ew; calls of that pattern then
-- compile nothing. An input declared `raw` ("raw float32 t", CuPy's raw arguments) is an array
-- of any size the body indexes itself, and `_i` is the element's index (CuPy's `i`):
-- `cuda.elementwise("float32 x, raw float32 n, int64 cols", "float32 y", "y = x / n[_i / cols]")`
-- divides each row of a matrix by its entry of n.
-- @usage local saxpy = cuda.elementwise("float32 x, float32 y, float32 a", "float32 z",
--   "z = a * x + y"):precompile { "a" }
-- @param in_params "float32 x, float32 y, float32 a"
-- @param out_params "float32 z"
-- @param body C++ statements on the parameters' names: "z = a * x + y"
-- @param name for messages and the kernel's file name (default "elementwise")
function cuda.elementwise(in_params, out_params, body, name) end

--- CuPy's ReductionKernel: a callable folding along axes. map_expr is computed for every
-- element from the inputs (by their names; Lua numbers given for inputs are broadcast),
-- reduce_expr folds two mapped values `a` and `b` (assumed associative and commutative: the
-- order is not kept), identity starts each fold, and post_map_expr sets the outputs from the
-- result `a` (`_count`: how many elements went into it). `r(in1, ..., [out1, ...], [opts])`
-- with options `axis` (1-based, negative from the end, or a list; default every axis),
-- `keepdims`, `out` (the first output) and `stream`; inputs are arrays of one shape, strided
-- views welcome; outputs not given are made (device arrays of the kept axes' shape; {1} when
-- every axis is folded). One kernel per signature and layout class: a block folds one output
-- reading along it (the innermost step is along a folded axis) or 32 side by side.
-- `opts` (the 7th argument) is a name, or `{name =, reduce_type =}` (the fold's dtype;
-- default the first output's).
-- @usage local mean = cuda.reduction("float32 x", "float32 y", "x", "a + b", "y = a / _count", "0")
--   local rows = mean(d, { axis = 2 })
function cuda.reduction(in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, opts) end

--- An array over a DLPack tensor (a light userdata: a `DLManagedTensorVersioned *`, DLPack 1.x;
-- with versioned false a legacy `DLManagedTensor *`) in CUDA device, CUDA host or managed
-- memory: its dtype, shape, strides and read-only flag; cudalua owns the tensor and calls its
-- deleter once, when no array uses the memory and queued work is done. A CPU tensor, a dtype
-- cudalua lacks, negative strides, or a device id that is not the memory's raise (the tensor
-- still the caller's). The C API: `cudalua_push_dlpack` (src/cudalua.h).
function cuda.from_dlpack(tensor, versioned) end

--- Wraps an object with `__cuda_array_interface` as an array, without a copy.
function cuda.as_cuda_array(obj) end

--- Numba's xoroshiro128+ generators.
-- @table random
cuda.random = {}

--- A device array of n generator states: state i is the seeded state jumped 2^64 draws i times.
-- Options (`opts`, or positional seed, subsequence_start, stream): `seed`,
-- `subsequence_start`, `stream`.
function cuda.random.create_xoroshiro128p_states(n, opts) end

--- Fills existing states again.
function cuda.random.init_xoroshiro128p_states(states, seed, subsequence_start, stream) end

--- SplitMix64 of an integer seed (how states are seeded).
function cuda.random.splitmix64(seed) end

--- Progress bars driven by a running kernel.
-- @table progress
cuda.progress = {}

--- Polls a managed or mapped counter the kernel bumps until the stream is done; draws a bar
-- (a terminal) or lines. Options (`opts`): `stream`, `label`, `interval`, `out`,
-- `line_interval`. Returns the last count.
function cuda.progress.watch(counter, total, opts) end

--- Profiling
-- @section profiling

--- NVTX ranges and marks, which Nsight Systems and Nsight Compute show (and Nsight Compute can
-- filter kernels by: `ncu --nvtx --nvtx-include "name/"`). NVTX v3 finds a profiler through
-- NVTX_INJECTION64_PATH, which the profilers set; without one each call costs a Lua-to-C call.
-- @table nvtx
cuda.nvtx = {}

--- Opens a range on this thread; returns its depth (1 for the outermost).
function cuda.nvtx.range_push(name) end

--- Closes the innermost range; returns the depth left. Raises when none is open.
function cuda.nvtx.range_pop() end

--- An instant event.
function cuda.nvtx.mark(name) end

--- Calls fn(...) inside a range, which ends when fn raises too; returns fn's results.
function cuda.nvtx.range(name, fn, ...) end

--- Opens a range and returns a guard that closes it: `local _ <close> = cuda.nvtx.scope(name)`
-- (or `guard:close()`).
function cuda.nvtx.scope(name) end

--- cuProfilerStart: a profiler told to wait for it (`nsys --capture-range=cudaProfilerApi`,
-- `ncu --profile-from-start off`) collects from here.
function cuda.profile_start() end

--- cuProfilerStop: the profiler stops collecting.
function cuda.profile_stop() end

--- Graphs
-- @section graphs

--- An empty graph: nodes are added to it with its methods (the bound form). `cuda.graph` is also
-- a table of node makers (the unbound form, the seed's): nodes that belong to no graph until
-- `node:build()`. The bound `local g = cuda.graph(); local n0 = g:memcpy(d, h);
-- g:kernel(k, {4, 1}, {d}, {n0}); g:launch(s)` and the unbound `local n0 = cuda.graph.memcpy(d, h);
-- cuda.graph.kernel[{4, 1}](k, {d}, {n0}):build():launch(s)` give the same CUDA graph.
function cuda.graph() end

--- Unbound graph nodes (the seed's form)
-- @section unbound

--- A kernel node of no graph: `cuda.graph.kernel(k, config, args, deps)` or
-- `cuda.graph.kernel[config](k, args, deps)` (the seed's `KernelNode[64, 32](k, args, deps)`).
function cuda.graph.kernel(k, config, args, deps) end

--- A copy node of no graph (host to device, device to host or device to device).
function cuda.graph.memcpy(dst, src, deps) end

--- A fill node of no graph.
function cuda.graph.memset(dst, value, deps) end

--- A node of no graph that runs `fn(args...)` on the Lua thread (the args as they are at build).
function cuda.graph.host(fn, args, deps) end

--- A node of no graph that does nothing (joins dependencies).
function cuda.graph.empty(deps) end

--- A node of no graph: a copy of another graph.
function cuda.graph.child(graph, deps) end

--- An unbound event record node (`Graph:record` once built).
function cuda.graph.record(event, deps) end

--- An unbound event wait node (`Graph:wait` once built). Allocations and conditions have no
-- unbound form: their address and handle are made by the graph they belong to.
function cuda.graph.wait(event, deps) end

--- A node of no graph, made by `cuda.graph.kernel` and the others (the form of the CUDA graph API
-- proposal for Numba). Its `args` and `deps` are its own plain lists, changed as the user likes
-- until `node:build()`. Fields: `Node.kind` ("kernel",
-- "memcpy", "memset", "host", "empty", "child", "record", "wait"), `Node.args` and `Node.deps` (lists; kernel and
-- host nodes have args), `Node.config`, `Node.kernel`, `Node.fn`, `Node.dst`, `Node.src`,
-- `Node.value`, `Node.graph` as made.
-- @type Node
local Node = {}
Node.kind = ""
Node.args = {}
Node.deps = {}

--- A new graph of this node and every node it depends on, each once, dependencies first; also
-- a table from each unbound node to its node in the graph (for `exec:set_args` and the like). A
-- cycle, or a dependency that is not a node, is refused before the graph is made; a node the
-- graph refuses closes it and names `node:build` and the node's kind.
function Node:build() end

--- Graph objects
-- @section graph_objects

--- A CUDA graph. Metafields `__close`, `__gc`. Node functions take an optional list of nodes
-- they depend on.
-- @type Graph
local Graph = {}

--- A kernel node: config as `Kernel:launch` ({grid, block} or keys), args a list.
function Graph:kernel(k, config, args, deps) end

--- A copy node between host and device arrays.
function Graph:memcpy(dst, src, deps) end

--- A fill node.
function Graph:memset(dst, value, deps) end

--- A node that runs a Lua function on the Lua thread.
function Graph:host(fn, deps) end

--- A node that does nothing (joins dependencies).
function Graph:empty(deps) end

--- A copy of another graph as one node.
function Graph:child(other, deps) end

--- Makes node `to` run after node `from`.
function Graph:add_dependency(from, to) end

--- An executable graph.
function Graph:instantiate() end

--- Launches the graph on a stream (the default stream when none): `g:instantiate():launch(s)`
-- with the executable graph kept, made again only once nodes or dependencies were added since.
function Graph:launch(stream) end

--- The number of nodes.
function Graph:node_count() end

--- Writes the graph as Graphviz to path.
function Graph:dot(path) end

--- Destroys the graph.
function Graph:close() end

--- A memory allocation node: returns the node and an array that exists while the graph runs,
-- from this node until a `Graph:free` node, which the graph must have (instantiating refuses
-- a graph that allocates without freeing: its second launch would fail). The array may be
-- used by this graph's nodes only: anywhere else (a launch, a copy, an element) it raises.
-- Stream-ordered allocation in a capture is the same: `cuda.device_array(n, dtype, {stream =
-- s})` while `s` captures is an allocation node, closing it in the capture a free node, and
-- one still open when the capture ends is freed there by cudalua.
function Graph:alloc(shape, dtype, deps) end

--- A free node for an array from this graph's `Graph:alloc`, after its last use.
function Graph:free(array, deps) end

--- An event record node: the graph records the event at each launch (for timing it, or for
-- work outside the graph to wait on). The graph keeps the event; `Event:close` then waits
-- for the graph to go. In a capture, `Event:record(s, {external = true})` makes one; a plain
-- record there orders the capture's streams (CUDA's fork and join) and makes no node.
function Graph:record(event, deps) end

--- An event wait node: later nodes wait for the event's latest record at each launch. In a
-- capture, `Stream:wait_event` on an event recorded outside the capture makes one.
function Graph:wait(event, deps) end

--- A condition for this graph's conditional nodes (an unsigned 32-bit value). Kernels of the
-- graph and of its bodies take it as a `cudaGraphConditionalHandle` parameter and call
-- `cudaGraphSetConditional(handle, value)` (cudalua declares it for NVRTC); options:
-- `default` (set at the start of each launch; without it the value is what a kernel set).
function Graph:condition(opts) end

--- An IF node: returns its body (a graph to fill, bound or with `Node:build`'s nodes inside
-- it) and the node; the body runs when the condition is not 0.
function Graph:if_then(cond, deps) end

--- An IF/ELSE node: returns the body run when the condition is not 0, the one run when it
-- is 0, and the node.
function Graph:if_else(cond, deps) end

--- A WHILE node: returns its body and the node. The condition is tested before each run of
-- the body; a kernel in the body sets it to 0 to end the loop (a device-side loop: no host
-- round trip). Bodies hold kernels, copies, memsets, empty, child and conditional nodes, not
-- Lua host functions, memory or event nodes; an empty body is refused at instantiation.
--
-- Each run of the body costs the driver a few microseconds (about 4.5 µs on an H100, driver
-- 580: bench/, "WHILE node" rows), more than a small kernel. A body of several kernels, each
-- doing one iteration unless the loop is done (and setting the condition when it is), shares
-- that cost: 4 per body took 1000 iterations from 4.6 to 1.9 ms there (bench/helpers.lua's
-- `tick_n`).
--
-- Graphs with conditional nodes run one at a time on each device: cudalua launches them on a
-- stream of its own, after the launching stream's earlier work and before its later work.
-- Known driver fault (580.159.04, H100, reproduced in plain CUDA C by tools/while_repro.cu):
-- two such graphs running at once on different streams fail the context
-- (`CUDA_ERROR_LAUNCH_FAILED`); one at a time they do not, which is why cudalua orders them.
-- Other streams' kernels running while a WHILE graph runs can still fail it on that driver:
-- run WHILE graphs while other streams are idle.
function Graph:while_loop(cond, deps) end

--- A SWITCH node of n bodies: returns the list of bodies and the node; body k + 1 runs when
-- the condition is k, none when it is n or more.
function Graph:switch(cond, n, deps) end

--- A copy of the graph (its host nodes with records of their own). CUDA cannot clone graphs
-- with memory or conditional nodes.
function Graph:clone() end

--- The copy, in this clone, of a node of the graph it was cloned from.
function Graph:find(node) end

--- A graph node. Fields: `GraphNode.kind` ("kernel", "memcpy", ...), `GraphNode.graph`.
-- @type GraphNode
local GraphNode = {}
GraphNode.kind = ""
GraphNode.graph = nil

--- An executable graph. Metafields `__close`, `__gc`.
-- @type GraphExec
local GraphExec = {}

--- Launches it on a stream.
function GraphExec:launch(stream) end

--- Uploads it to the device ahead of the first launch.
function GraphExec:upload(stream) end

--- New arguments for a kernel node: a list as `Graph:kernel` takes them (one table holding as many
-- values as the kernel has parameters), or the values themselves, `exec:set_args(node, a, b)`.
function GraphExec:set_args(node, args) end

--- New arrays for a memcpy node.
function GraphExec:set_memcpy(node, dst, src) end

--- A new array or value for a memset node.
function GraphExec:set_memset(node, dst, value) end

--- Takes the parameters of a graph of the same shape.
function GraphExec:update(graph) end

--- Destroys it once its launches are done.
function GraphExec:close() end

--- Turns a kernel, memcpy or memset node off (false: later launches skip it) or on again,
-- without instantiating again.
function GraphExec:enable(node, on) end

--- A host node calls fn at later launches (a launch queued before still calls the old one).
function GraphExec:set_host(node, fn) end

--- A child node runs a copy of graph (same shape) at later launches. Child graphs with Lua
-- host functions cannot be swapped (instantiate again).
function GraphExec:set_child(node, graph) end

--- A record or wait node's event at later launches.
function GraphExec:set_event(node, event) end

--- Many GPUs
-- @section gpus

--- Numba's `cuda.gpus`: `#cuda.gpus`, `cuda.gpus[i]` (a `Gpu`, 0-based), `cuda.gpus.current`
-- (the selected device's), `pairs(cuda.gpus)`.
-- @table gpus
cuda.gpus = {}

--- One device of `cuda.gpus`.
-- @type Gpu
local Gpu = {}

--- Calls fn(...) with this device selected, then selects the previous one again (errors too).
function Gpu:run(fn, ...) end

--- Selects this device; returns a guard whose `__close` (or `restore`) selects the previous one.
function Gpu:use() end

--- Waits for all work on this device.
function Gpu:synchronize() end

--- Its table from `cuda.devices`.
function Gpu:info() end

--- NCCL (require "cudalua.nccl")
-- @section nccl

local nccl = {}

--- True when NCCL can be opened; false and why otherwise.
function nccl.is_available() end

--- NCCL's version as an integer (22703 for 2.27.3).
function nccl.version() end

--- A unique id (256 hex characters) every rank passes to `nccl.comm_init_rank`.
function nccl.unique_id() end

--- A communicator on the selected device, once every rank has joined. Non-blocking unless
-- opts.blocking: NCCL's calls and each collective on the GPU are waited for with opts.timeout
-- (seconds; CUDALUA_NCCL_TIMEOUT, else 600); past it, or when NCCL reports a lost peer, the
-- communicator is aborted and a Lua error names the operation, the rank, the time waited and
-- NCCL's last warning.
function nccl.comm_init_rank(nranks, id, rank, opts) end

--- The same, the ranks meeting at "host:port" (rank 0 listens there; NCCL 2.22 or newer).
function nccl.comm_init_at(nranks, addr, rank, opts) end

--- A communicator of the job, started the way cluster launchers start one: rank, size and local
-- rank from opts or from RANK/WORLD_SIZE/LOCAL_RANK (cudalua-run, torchrun), OMPI_COMM_WORLD_*,
-- PMI_* or SLURM_*; the GPU local_rank modulo the GPUs (selected); the ranks meet at opts.addr,
-- MASTER_ADDR:MASTER_PORT, or through opts.file (CUDALUA_NCCL_ID_FILE). Options: rank, size,
-- local_rank, device, addr, file, timeout, blocking.
function nccl.init(opts) end

--- {rank, size, local_rank, launcher} from a launcher's variables, or nil (getenv: os.getenv).
function nccl.launch_info(getenv) end

--- One communicator per device of the list (default: every GPU); `comms:close()` ends them.
function nccl.comm_init_all(devices) end

--- Runs fn(...) with its collectives queued as one group; the group ends when fn raises too.
function nccl.group(fn, ...) end

--- An NCCL communicator. Ops: "sum", "prod", "max", "min", "avg". Metafields `__close`, `__gc`.
-- @type Comm
local Comm = {}

--- All ranks get the reduction of every rank's send.
function Comm:all_reduce(send, recv, op, stream) end

--- Root's send to every rank's recv.
function Comm:broadcast(send, recv, root, stream) end

--- The reduction into root's recv.
function Comm:reduce(send, recv, op, root, stream) end

--- Every rank's send, in rank order, in every recv.
function Comm:all_gather(send, recv, stream) end

--- Rank i gets block i of the reduction.
function Comm:reduce_scatter(send, recv, op, stream) end

--- Sends an array to a peer rank.
function Comm:send(a, peer, stream) end

--- Receives an array from a peer rank.
function Comm:recv(a, peer, stream) end

--- Its rank.
function Comm:rank() end

--- The number of ranks.
function Comm:size() end

--- Its device id.
function Comm:device() end

--- The ncclComm_t handle (an integer).
function Comm:handle() end

--- An error NCCL found asynchronously (or why it was aborted), or nil.
function Comm:async_error() end

--- Its timeout in seconds.
function Comm:timeout() end

--- Sets its timeout (seconds > 0).
function Comm:set_timeout(seconds) end

--- How many of its collectives the GPU has not finished (it does not wait).
function Comm:pending() end

--- The communicator of the ranks that gave this color, ranked by key; nil for color nil.
-- Every rank calls it.
function Comm:split(color, key, opts) end

--- A communicator of the ranks not in the list (NCCL 2.27 or newer); every rank that stays
-- calls it. opts.abort: abandon the work in flight first (by default when NCCL reports an error).
function Comm:shrink(ranks, opts) end

--- Aborts the communicator (after an error).
function Comm:abort() end

--- Destroys the communicator.
function Comm:close() end

return cuda
