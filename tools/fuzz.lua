-- tools/fuzz.lua: calls every public function and method of cudalua with random and hostile
-- arguments and counts what happens: clean errors, accepted calls, unclean errors (a Lua
-- runtime error from inside cudalua instead of a message saying what is wrong), crashes and
-- hangs. Seeded and time-boxed; run from the repository root.
--
--   lua5.4 tools/fuzz.lua [--cases N] [--seconds S] [--seed K] [--batch B] [--gpu] [--case ID]
--
-- Cases run in child processes, B to a child (a process start costs more than most cases). A
-- child says which case it starts before it starts it, so a crash, a sanitizer report or a
-- hang is put on that case, and the rest of its batch runs in a new child. Case ID makes the
-- same call whatever the batch: --case ID replays one alone. With --gpu the world has device
-- arrays, streams, events, graphs and kernels too, and scenario cases free objects while launches, copies, graph replays and host functions
-- that use them are in flight. Exit status: 0 when no case crashed or hung.
package.cpath = "./?.so;" .. package.cpath

local opts = { cases = 20000, seconds = 120, seed = 1, gpu = false }
do
  local i = 1
  while arg[i] do
    local a = arg[i]
    if a == "--gpu" then opts.gpu = true; i = i + 1
    elseif a == "--child" then opts.child = true; i = i + 1
    elseif a:match("^%-%-") and arg[i + 1] then
      opts[a:sub(3)] = tonumber(arg[i + 1]) or arg[i + 1]
      i = i + 2
    else error("fuzz.lua: unknown argument " .. a) end
  end
end

local INTERP = "lua5.4"   -- this interpreter, for the children
do
  local i = 0
  while arg[i - 1] do i = i - 1 end
  if i < 0 then INTERP = arg[i] end
end

------------------------------------------------------------------------------------------------
-- the child: runs cases first..last, printing "S id" before and "R id outcome message" after
------------------------------------------------------------------------------------------------
local function child(first, last)
  local cuda = require "cudalua"
  local nccl = require "cudalua.nccl"
  local gpu = opts.gpu and cuda.is_available()
  local R = math.random

  -- a cubin and a PTX to load, made once per child (NVRTC works without a GPU)
  local SRC = [[
extern "C" __global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
extern "C" __global__ void spin(float *x, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  x[threadIdx.x] += 1;
}
]]
  local base_mod = cuda.compile(SRC, { arch = "sm_90" })
  local CUBIN, PTX = base_mod:image(), base_mod:ptx() or ""

  local function thrower(what) return function() error("fuzz: " .. what .. " throws", 0) end end
  local function throwing_table()
    return setmetatable({}, { __index = thrower("__index"), __newindex = thrower("__newindex"),
      __len = thrower("__len"), __pairs = thrower("__pairs"), __tostring = thrower("__tostring"),
      __eq = thrower("__eq"), __lt = thrower("__lt"), __le = thrower("__le"), __call = thrower("__call"),
      __concat = thrower("__concat"), __name = "fuzz.thrower" })
  end
  local function rand_string(n)
    local t = {}
    for i = 1, n do t[i] = string.char(R(0, 255)) end
    return table.concat(t)
  end
  local function mutate(s)   -- a few bytes of s changed: damaged images
    local b = { s:byte(1, -1) }
    for _ = 1, R(1, 8) do if #b > 0 then b[R(1, #b)] = R(0, 255) end end
    if R() < 0.3 then for _ = 1, R(1, #b // 2 + 1) do b[#b] = nil end end
    local out = {}
    for i = 1, #b, 4096 do out[#out + 1] = string.char(table.unpack(b, i, math.min(i + 4095, #b))) end
    return table.concat(out)
  end

  local HUGE = ("A"):rep(1 << 20)
  -- with a GPU, sizes of 2^31 and more are allocated for real (tens of GB of pinned memory take
  -- seconds): the extremes that fail at once stay
  local NAMES = { "float32", "float64", "int32", "int64", "uint8", "int8", "float16", "uint64", "bool",
    "bogus", "", "float", "f4", "<f4", "complex64", "bfloat16" }
  local SCALARS = { 0, -1, 1, 2, 3, 7, 32, 1024, 65536, 0.5, -0.0, 1 / 0, -1 / 0, 0 / 0, math.maxinteger,
    math.mininteger, math.maxinteger - 1, 2 ^ 53, 2 ^ 63, -2 ^ 63, 1e308, -1e308, 4294967296, -4294967297,
    2147483647, 2147483648, 1e-320 }
  if gpu then
    for i = #SCALARS, 1, -1 do
      local v = SCALARS[i]
      if math.type(v) == "integer" and v ~= math.maxinteger and v ~= math.mininteger and math.abs(v) >= 1 << 31 then
        table.remove(SCALARS, i)
      end
    end
  end

  -- the objects a case may use, made fresh for every case (cases close them)
  local function world()
    local w = {}
    local shape = ({ { 8 }, { 3, 4 }, { 2, 3, 2 }, { 0 }, { 1 } })[R(1, 5)]
    w.host = cuda.zeros(shape, NAMES[R(1, 8)])
    w.host2 = cuda.array({ 1, 2, 3, 4 }, "float32")
    w.closed = cuda.array({ 1, 2 }, "int32"); w.closed:close()
    w.view = w.host2:slice(2, 3)
    w.mod = cuda.load_module(R() < 0.5 and CUBIN or PTX)
    w.closed_mod = base_mod
    w.dtype = cuda.dtype(NAMES[R(1, 7)])
    w.cai = { __cuda_array_interface = { shape = { 4 }, typestr = "<f4", data = { 0x10000, false }, version = 3 } }
    if gpu then
      w.dev = cuda.device_array(R(1, 4096), "float32")
      w.dev2 = cuda.to_device(cuda.array({ 1, 2, 3, 4, 5 }, "float64"))
      w.pinned = cuda.pinned_array(16, "float32")
      w.mapped = cuda.mapped_array(16, "int32")
      w.managed = cuda.managed_array(16, "float32")
      w.stream = cuda.stream()
      w.closed_stream = cuda.stream(); w.closed_stream:close()
      w.event = cuda.event()
      w.kernel = w.mod:get("scale", "float*, float, int")
      w.spin = w.mod:get("spin", "float*, long long")
      w.launcher = w.kernel[{ 1, 32 }]
      w.graph = cuda.graph()
      w.node = w.graph:kernel(w.kernel, { 1, 32 }, { w.dev, 2.0, 1 })
      w.exec = R() < 0.5 and w.graph:instantiate() or nil
      w.closed_dev = cuda.device_array(8, "float32"); w.closed_dev:close()
    end
    return w
  end

  -- in a fixed order (pairs' order changes from one process to the next): cases replay. Not
  -- w.spin: it spins as long as its argument says, a hostile one would hang the GPU for hours
  local ORDER = { "host", "host2", "closed", "view", "mod", "closed_mod", "dtype", "cai", "dev", "dev2",
    "pinned", "mapped", "managed", "stream", "closed_stream", "event", "kernel", "launcher",
    "graph", "node", "exec", "closed_dev" }
  local function objects(w)
    local list = {}
    for _, k in ipairs(ORDER) do if w[k] ~= nil then list[#list + 1] = w[k] end end
    return list
  end

  -- a hostile or plausible value
  local function value(w, depth)
    depth = depth or 0
    local k = R(1, 24)
    if k <= 4 then return SCALARS[R(1, #SCALARS)]
    elseif k == 5 then return nil
    elseif k == 6 then return R() < 0.5
    elseif k == 7 then return NAMES[R(1, #NAMES)]
    elseif k == 8 then return ({ "", "x", HUGE, rand_string(R(0, 64)), "sum", "max", "a + b", "stream",
      "grid", "block", "float*, int", "\0", "%s%s%n" })[R(1, 13)]
    elseif k <= 11 then local o = objects(w); return o[R(1, #o)]
    elseif k == 12 then return throwing_table()
    elseif k == 13 then return ({ print, error, function() return nil end, function() return {} end,
      coroutine.create(print), io.stdout, cuda, nccl, cuda.gpus })[R(1, 9)]
    elseif k == 14 then   -- shapes and lists
      return ({ {}, { 0 }, { -1 }, { 1e9, 1e9 }, { math.maxinteger }, { 1, 2, 3, 4, 5, 6, 7, 8, 9 },
        { { 1, 2 }, { 3 } }, { 1.5 }, { "1" }, { 2, 3 }, { nil, 3 } })[R(1, 11)]
    elseif k == 15 then   -- junk array interfaces
      local junk = depth < 2 and value(w, depth + 1) or 0
      local cai = { shape = R() < 0.5 and { R(-2, 8) } or junk, typestr = R() < 0.5 and "<f4" or junk,
        data = R() < 0.5 and { R(-1, 1 << 40), R() < 0.5 } or junk, version = R() < 0.5 and 3 or junk,
        strides = R() < 0.3 and { R(-8, 8) } or nil, stream = R() < 0.3 and junk or nil,
        mask = R() < 0.1 and {} or nil }
      if R() < 0.2 then return setmetatable({}, { __index = thrower("__cuda_array_interface") }) end
      if R() < 0.2 then return { __cuda_array_interface = junk } end
      return { __cuda_array_interface = cai }
    elseif k <= 18 then   -- option and configuration tables
      local t = {}
      local keys = { "stream", "shared", "grid", "block", "cooperative", "cluster", "arch", "name",
        "options", "headers", "include_dirs", "cache", "debug", "lineinfo", "init", "res", "seed",
        "subsequence_start", "label", "interval", "ipc", "zero", "bogus", 1, 2, 3 }
      for _ = 1, R(0, 4) do
        t[keys[R(1, #keys)]] = depth < 2 and value(w, depth + 1) or SCALARS[R(1, #SCALARS)]
      end
      return t
    elseif k == 19 then return { R(-2, 64), R(-2, 1025) }   -- {grid, block}
    elseif k == 20 then return R() < 0.5 and CUBIN or mutate(R() < 0.5 and CUBIN or PTX)
    elseif k == 21 then return rand_string(R(0, 200))
    elseif k == 22 then return R(-3, 300)
    elseif k == 23 then return R() * 100 - 50
    else return "extern \"C\" __global__ void k(float *x) { " .. rand_string(R(0, 20)):gsub("%z", "") .. " }" end
  end

  -- what can be called: every function of the module's tables and every method name
  local METHODS = { "advise", "close", "copy_to_device", "copy_to_host", "fill", "get", "ipc_handle", "ptr",
    "reshape", "set", "slice", "totable", "view", "synchronize", "query", "wait_event", "handle",
    "launch_host_func", "device", "record", "elapsed_time", "kernel", "memcpy", "memset", "host", "empty",
    "child", "add_dependency", "instantiate", "dot", "node_count", "launch", "upload", "set_args",
    "set_memcpy", "set_memset", "update", "attributes", "set_attribute", "occupancy", "info", "forall",
    "cubin", "image", "kernels", "kind", "log", "ptx", "all_reduce", "broadcast", "reduce", "all_gather",
    "reduce_scatter", "send", "recv", "rank", "size", "async_error", "abort", "run", "itemsize", "name",
    "__gc", "__close", "__index", "__newindex", "__len", "__tostring", "__call", "__concat", "__eq" }
  -- (not use_cpu, which takes no arguments and would move every later case to the CPU device)
  local FUNCS = {}
  for _, t in ipairs { cuda, cuda.random, cuda.progress, nccl } do
    for k, v in pairs(t) do
      if type(v) == "function" and k ~= "sleep" and k ~= "use_cpu" then FUNCS[#FUNCS + 1] = { k, v } end
    end
  end
  table.sort(FUNCS, function(a, b) return a[1] < b[1] end)

  -- a GPU scenario: work in flight on objects a case then drops, closes or collects
  local SCENARIOS = {}
  if gpu then
    local function long(w, s)   -- a kernel that spins a while on w.dev (at least 32 floats)
      local d = cuda.device_array(64, "float32", s)
      w.spin[{ 1, 32, stream = s }](d, R(1, 2000000))
      return d
    end
    SCENARIOS = {
      function(w) local d = long(w, nil); d:close(); cuda.synchronize() end,
      function(w) local d = long(w, w.stream); d = nil; collectgarbage(); w.stream:synchronize() end,
      function(w) long(w, w.stream); w.stream:close(); collectgarbage(); cuda.synchronize() end,
      function(w)
        local h, d = cuda.pinned_array(1 << 16, "float32"), cuda.device_array(1 << 16, "float32", w.stream)
        long(w, w.stream); d:copy_to_host(h, w.stream); h:close(); d:close(); w.stream:close(); cuda.synchronize()
      end,
      function(w)
        local g = cuda.graph()
        local d = cuda.device_array(64, "float32")
        g:kernel(w.spin, { 1, 32 }, { d, R(1, 1000000) })
        g:memset(d, 0)
        local e = g:instantiate()
        e:launch(w.stream); e:launch(w.stream)
        if R() < 0.5 then e:close() end
        g:close(); d:close(); d = nil; g = nil; e = nil
        collectgarbage(); w.stream:synchronize()
      end,
      function(w)
        local d = cuda.device_array(64, "float32", w.stream)
        long(w, w.stream)
        w.stream:launch_host_func(function() d:close(); collectgarbage(); error("fuzz: host function raises", 0) end)
        local ok = pcall(w.stream.synchronize, w.stream)
        d = nil; collectgarbage(); cuda.synchronize()
        return ok
      end,
      function(w)
        local m = cuda.load_module(CUBIN)
        local k = m:get("spin", "float*, long long")
        local d = cuda.device_array(64, "float32")
        k[{ 1, 32 }](d, R(1, 1000000))
        m = nil; k = nil; d = nil; collectgarbage(); cuda.synchronize()
      end,
      function(w)
        local e = cuda.event()
        long(w, w.stream)
        e:record(w.stream)
        w.stream:close(); e:close(); collectgarbage(); cuda.synchronize()
      end,
    }
  end

  -- the message of an error raised inside cudalua by Lua itself, not by a check of cudalua's
  local function unclean(msg)
    -- cudalua raises strings only: another value is a callback's own error (nccl.group(error),
    -- a host function), passed through unchanged as it should be
    if type(msg) ~= "string" then return nil end
    if msg:find("attempt to ", 1, true) or msg:find("stack overflow", 1, true) or msg:find("bad argument #%d+ to '%?'")
      or msg:find("C stack", 1, true) then
      if msg:find("fuzz: ", 1, true) then return nil end   -- the fuzzer's own throwing metamethods
      if msg:find("^tools/fuzz%.lua:%d+: attempt to index") then return nil end   -- an object with no fields
      return msg
    end
    return nil
  end

  local function run_case(id)
    math.randomseed(opts.seed, id)
    local w = world()
    local f, nargs, label
    local pick = R()
    if gpu and pick < 0.1 then
      local i = R(1, #SCENARIOS)
      label = "scenario " .. i
      f = function() return SCENARIOS[i](w) end
      nargs = 0
    elseif pick < 0.55 then
      local e = FUNCS[R(1, #FUNCS)]
      label, f = e[1], e[2]
    else
      local o = objects(w)
      local obj = o[R(1, #o)]
      local name = METHODS[R(1, #METHODS)]
      local mt = getmetatable(obj)
      local ok, m
      if name:sub(1, 2) == "__" then ok, m = true, type(mt) == "table" and rawget(mt, name) or nil
      else ok, m = pcall(function() return obj[name] end) end
      if not ok or type(m) ~= "function" then
        -- a missing method: index the object with a hostile key instead
        label = "index " .. tostring(name)
        f = function(...) local v = obj[(...)]; return v end
      else
        -- another object as self, now and then
        local self = R() < 0.15 and o[R(1, #o)] or obj
        label = (mt and type(mt) == "table" and tostring(rawget(mt, "__name")) or type(obj)) .. ":" .. name
        f = function(...) return m(self, ...) end
      end
    end
    local args = {}
    nargs = nargs or R(0, 5)
    for i = 1, nargs do args[i] = value(w) end
    local shown = {}
    for i = 1, nargs do
      local v = args[i]
      local ok, s = pcall(tostring, v)
      shown[i] = (type(v) == "string" and ("%q"):format(v:sub(1, 24)) or ok and type(s) == "string" and s or type(v)):sub(1, 40)
    end
    io.write("L ", id, " ", label, "(", (table.concat(shown, ", "):gsub("%s+", " ")), ")\n"); io.flush()
    local ok, err = pcall(f, table.unpack(args, 1, nargs))
    -- what the case left behind is collected now, not in a later case
    w = nil
    pcall(collectgarbage)
    local bad = not ok and unclean(err)
    local msg = tostring(err):gsub("%s+", " "):sub(1, 160)
    return bad and "unclean" or ok and "accepted" or "error", label .. ": " .. msg
  end

  for id = first, last do
    io.write("S ", id, "\n"); io.flush()
    local okc, outcome, msg = pcall(run_case, id)
    if not okc then   -- the fuzzer's own fault (making the world), not cudalua's
      io.stderr:write("fuzz.lua: case ", id, ": ", tostring(outcome), "\n")
      os.exit(3)
    end
    io.write("R ", id, " ", outcome, " ", msg, "\n"); io.flush()
  end
  if gpu then cuda.synchronize() end
  io.write("DONE\n"); io.flush()
  os.exit(0, true)
end

if opts.child then child(opts.first, opts.last) end

------------------------------------------------------------------------------------------------
-- the parent
------------------------------------------------------------------------------------------------
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local errfile = os.tmpname()
local tally = { error = 0, accepted = 0, unclean = 0, crash = 0, hang = 0 }
local examples = { unclean = {}, crash = {}, hang = {} }
local function note(kind, id, text)
  tally[kind] = tally[kind] + 1
  local list = examples[kind]
  if list and #list < (tonumber(opts.show) or 12) then list[#list + 1] = ("case %d: %s"):format(id, text) end
end

local function sanitizer_report(text)
  return text:match("ERROR: %a+Sanitizer[^\n]*") or text:match("runtime error:[^\n]*")
end

-- runs cases first..last in one child; returns the id the next child starts at
local function batch(first, last)
  local limit = (opts.gpu and 60 or 20) + (last - first + 1) // 20
  local cmd = ("timeout -s KILL %d %s tools/fuzz.lua --child --first %d --last %d --seed %s%s 2>%s"):format(
    limit, q(INTERP), first, last, q(opts.seed), opts.gpu and " --gpu" or "", q(errfile))
  local p = assert(io.popen(cmd))
  local started, finished, done, call = nil, first - 1, false, ""
  for line in p:lines() do
    local s = line:match("^S (%d+)")
    local l = line:match("^L %d+ (.*)")
    if l then call = l
    elseif s then started, call = tonumber(s), ""
    elseif line == "DONE" then done = true
    else
      local id, outcome, msg = line:match("^R (%d+) (%a+) (.*)")
      if id then
        started, finished = nil, tonumber(id)
        if outcome == "unclean" then note("unclean", finished, msg) else tally[outcome] = tally[outcome] + 1 end
      end
    end
  end
  local _, how, code = p:close()
  local f = io.open(errfile)
  local err = f and f:read("a") or ""
  if f then f:close() end
  local report = sanitizer_report(err)
  if how == "exit" and code == 3 and not report then error("fuzz.lua: the fuzzer broke: " .. err) end
  if done and code == 0 and not report then return last + 1 end
  -- the case in flight, or (none in flight) the last one: the crash came at the end, in a finalizer
  local culprit = started or finished
  local hung = how == "exit" and code == 137 and not report   -- timeout -s KILL
  local what = report or (hung and ("no end after %d s"):format(limit))
    or ("exit %s %s: %s"):format(how, tostring(code), (err:match("[^\n]*%S[^\n]*\n?$") or ""):sub(1, 200))
  if not started then what = what .. " (after the case, at the child's end)" else what = what .. " in " .. call end
  note(hung and "hang" or "crash", culprit, what)
  return math.max(culprit, first) + 1
end

if opts.case then
  batch(tonumber(opts.case), tonumber(opts.case))
else
  local t0, id = os.time(), 1
  opts.batch = opts.batch or (opts.gpu and 50 or 400)   -- GPU cases take longer
  while id <= opts.cases and os.time() - t0 < opts.seconds do
    local b0 = os.time()
    id = batch(id, math.min(opts.cases, id + opts.batch - 1))
    io.stderr:write(("  cases to %d, %d s; %d errors, %d accepted, %d unclean, %d crashes, %d hangs\n"):format(
      id - 1, os.time() - b0, tally.error, tally.accepted, tally.unclean, tally.crash, tally.hang))
  end
  opts.ran = id - 1
end
os.remove(errfile)

for _, kind in ipairs { "crash", "hang", "unclean" } do
  for _, e in ipairs(examples[kind]) do print(kind .. ": " .. e) end
end
print(("fuzz%s: seed %s, %d cases: %d clean errors, %d accepted, %d unclean errors, %d crashes, %d hangs"):format(
  opts.gpu and " (gpu)" or "", tostring(opts.seed), opts.ran or 1, tally.error, tally.accepted, tally.unclean,
  tally.crash, tally.hang))
os.exit(tally.crash + tally.hang == 0 and 0 or 1)
