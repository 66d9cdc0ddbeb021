-- cudalua.progress: a progress bar driven by a running kernel (seed 000). The kernel bumps a
-- counter in managed or mapped memory with atomics; watch() polls it until the stream's work
-- is done, drawing on stderr.
--
-- Coherence: on Linux GPUs with concurrent managed access (Pascal and newer) the host may read
-- a managed counter while a kernel runs; watch() advises the driver to keep its page on the
-- device and map it for the host, so reading it does not move the page back and forth. Where
-- the device lacks concurrent managed access (Windows, some older setups), touching managed
-- memory while a kernel runs is not allowed: use cuda.mapped_array for the counter there.
local core = ...
local check = require "cudalua.check"
local M = {}

local function human(x)
  if x >= 1e9 then return ("%.1fG"):format(x / 1e9) end
  if x >= 1e6 then return ("%.1fM"):format(x / 1e6) end
  if x >= 1e3 then return ("%.1fk"):format(x / 1e3) end
  return ("%.0f"):format(x)
end

local function duration(s)
  if s ~= s or s == math.huge then return "?" end
  if s >= 3600 then return ("%dh%02dm"):format(s // 3600, s % 3600 // 60) end
  if s >= 60 then return ("%dm%02ds"):format(s // 60, s % 60) end
  return ("%.1fs"):format(s)
end

local advised = setmetatable({}, { __mode = "k" })

-- the counter and total checked -> the counter's kind (raises at the caller of watch)
local function check_counter(counter, total)
  local n, _, kind = core.array_info(counter)
  if not n then check.error("cuda.progress.watch", 3, "counter must be a managed or mapped array, got %s", type(counter)) end
  if kind ~= "managed_array" and kind ~= "mapped_array" then
    check.error("cuda.progress.watch", 3, "counter must be a managed or mapped array"
      .. " (the host reads it while the kernel runs), got a %s", kind)
  end
  if n < 1 then check.error("cuda.progress.watch", 3, "counter is empty") end
  if type(total) ~= "number" or total <= 0 then
    check.error("cuda.progress.watch", 3, "total must be a number > 0, got %s", tostring(total))
  end
  return kind
end

-- the options checked, defaults filled in: a table of its own (the caller's is not changed)
local function check_watch_options(opts)
  if opts ~= nil and type(opts) ~= "table" then check.error("cuda.progress.watch", 3, "options must be a table") end
  opts = opts or {}
  check.options(opts, { "stream", "label", "interval", "out", "line_interval" }, "cuda.progress.watch", 4)
  if opts.stream ~= nil and not check.is_stream(opts.stream) then
    check.error("cuda.progress.watch", 3, "stream must be a stream (cuda.stream()), got %s", type(opts.stream))
  end
  if opts.out ~= nil and io.type(opts.out) ~= "file" then
    check.error("cuda.progress.watch", 3, "out must be a file open for writing (io.stderr, io.open(...)), got %s", type(opts.out))
  end
  local function seconds(v) return type(v) == "number" and v >= 0 and v <= 3600 end   -- NaN is not
  if opts.line_interval ~= nil and not seconds(opts.line_interval) then
    check.error("cuda.progress.watch", 3, "line_interval must be seconds from 0 to 3600")
  end
  local interval = opts.interval or 0.001
  if not seconds(interval) or interval > 10 then check.error("cuda.progress.watch", 3, "interval must be seconds from 0 to 10") end
  if opts.label ~= nil and type(opts.label) ~= "string" then
    check.error("cuda.progress.watch", 3, "label must be a string, got %s", type(opts.label))
  end
  return { stream = opts.stream, label = opts.label or "progress", interval = interval,
           out = opts.out or io.stderr, line_interval = opts.line_interval }
end

-- a managed counter: read by the host while a kernel runs, which the device must allow; its
-- page kept on the device and mapped for the host (once per counter)
local function prepare_managed(cuda, counter)
  local dev = cuda.devices()[cuda.current_device() + 1]
  if not dev.concurrent_managed_access then
    check.error("cuda.progress.watch", 3, "this device cannot share managed memory with the host while a kernel "
      .. "runs; use cuda.mapped_array for the counter")
  end
  if not advised[counter] then
    counter:advise("preferred_device"):advise("accessed_by_host")
    advised[counter] = true
  end
end

-- watch(counter, total, {stream=, label=, interval=, out=, line_interval=}) -> last count
function M.watch(counter, total, opts)
  local cuda = require "cudalua"
  local kind = check_counter(counter, total)
  opts = check_watch_options(opts)
  local out, label, interval = opts.out, opts.label, opts.interval
  local stream = opts.stream or cuda.default_stream()
  if kind == "managed_array" then prepare_managed(cuda, counter) end
  local tty, cols = core.isatty(out)
  local redraw = tty and 0.05 or (opts.line_interval or 1.0) -- seconds between draws
  local t0 = core.time()
  local last_draw = -math.huge
  -- now: core.time() of the caller, which has checked that a non-final draw is due
  local function draw(v, final, now)
    last_draw = now
    local el = now - t0
    local frac = math.min(math.max(v / total, 0), 1)
    local rate = el > 0 and v / el or 0
    local eta = rate > 0 and (total - v) / rate or math.huge
    local stats = ("%3d%% %s/%s %s/s %s %s"):format(math.floor(frac * 100), human(v), human(total),
      human(rate), final and "in" or "ETA", duration(final and el or eta))
    if tty then
      local width = math.max(10, cols - #label - #stats - 6)
      local fill = math.floor(frac * width + 0.5)
      out:write(("\r%s [%s%s] %s"):format(label, ("#"):rep(fill), ("."):rep(width - fill), stats))
    else
      out:write(("%s: %s\n"):format(label, stats))
    end
    out:flush()
  end
  -- the stream is queried every interval (cheap); the counter is read only when a draw is
  -- due: each host read of managed memory a kernel is updating stalls its atomics a little
  while not stream:query() do
    local now = core.time()
    if now - last_draw >= redraw then draw(counter[1], false, now) end
    if interval > 0 then core.sleep(interval) end
  end
  local v = counter[1]
  draw(v, true, core.time())
  if tty then out:write("\n"); out:flush() end
  return v
end

return M
