/* wait.c: every blocking wait of cudalua. A wait runs the waiting state's Lua host functions
   as they fire (src/hostfn.c), so that the stream work behind them goes on; device-wide waits
   and captures exclude each other (the claims below). cuda.sleep is a wait for time. */
#include <sched.h>
#include <time.h>
#include "cl.h"

/* ---- waits ---- */

/* the stream is stopped at a running host function: waiting for it there would never end */
void cl_wait_check(lua_State *L) {
  if (cl_in_hostfn)
    cl_error(L, NULL, "a Lua host function cannot wait for the GPU (synchronize, blocking copies)");
}

/* while polling, by the time since the last host function ran (or the wait began): spin for
   the first 50 us (a host function's round trip through the GPU is a few microseconds, and a
   chain of them keeps coming at that pace), yield up to 0.5 ms, then sleep (a 20 us request
   sleeps about 70 us on Linux), 100 us after 5 ms */
double cl_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static void backoff(double since) {
  double idle = cl_now_us() - since;
  if (idle < 50) return;
  if (idle < 500) { sched_yield(); return; }
  struct timespec ts = {0, (idle < 5000 ? 20 : 100) * 1000L};
  nanosleep(&ts, NULL);
}

/* one pause of a loop that polls on L's thread: L's host functions that fired run (*since is
   then reset), then the backoff (never inside a host function: none run there) */
void cl_poll_pause(lua_State *L, double *since) {
  cl_hostq *q = cl_in_hostfn ? NULL : cl_host_queue(L);
  if (q && cl_host_q_armed(q) && cl_host_service_q(L, q)) *since = cl_now_us();
  backoff(*since);
}

/* ---- device-wide waits and captures ----
   The driver refuses cuCtxSynchronize while any thread's stream captures, whatever the
   capture's mode, and ends that capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, then
   ..._INVALIDATED at the capture's next call): seen in tools/stress.c with a free on one
   thread and a capture beginning on another, between the free's test of cl_capturing and its
   wait. So the two exclude each other: a device-wide wait holds a claim, and a capture tells
   its intent first and then begins only once no claim is held (seq_cst: each sees the other). */
static unsigned ctx_claims;
static unsigned capture_intents;      /* captures about to begin (cl_capture_enter) */
static __thread unsigned my_claims;   /* a thread's claims nest (a free inside a wait's) */

int cl_ctx_claim(void) {
  if (my_claims) { my_claims++; return 1; }
  __atomic_add_fetch(&ctx_claims, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&capture_intents, __ATOMIC_SEQ_CST) || __atomic_load_n(&cl_capturing, __ATOMIC_SEQ_CST)) {
    __atomic_sub_fetch(&ctx_claims, 1, __ATOMIC_SEQ_CST);
    return 0;
  }
  my_claims = 1;   /* nothing between a claim and its unclaim raises (a claim never let go
                      would keep every capture from beginning) */
  return 1;
}

void cl_ctx_unclaim(void) {
  if (--my_claims == 0) __atomic_sub_fetch(&ctx_claims, 1, __ATOMIC_SEQ_CST);
}

/* a release that needs a device-wide wait while a stream captures: put off to the state's next
   flush after the captures; a closing state (nothing flushes it) waits for them to end */
int cl_ctx_claim_or_defer(lua_State *L, cl_deferred *d) {
  if (cl_ctx_claim()) return 1;
  if (cl_defer_if_open(L, d)) return 0;
  double since = cl_now_us();
  while (!cl_ctx_claim()) backoff(since);
  return 1;
}

/* s:begin_capture: counted as capturing once no device-wide wait is under way. The intent is
   told first (claims refused from then on), and taken back while a claim is held, as this
   state's host functions run (the wait may be for them): never held, so that a thread that
   waits for this capture's end (another state retrying a refused wait, say) can run the work
   the device-wide wait waits for. cl_capturing counts a capture from here (cl_capture_enter) until it ends, or
   until cuStreamBeginCapture fails. */
void cl_capture_enter(lua_State *L) {
  cl_hostq *q = cl_host_queue(L);
  double since = cl_now_us();
  for (;;) {
    __atomic_add_fetch(&capture_intents, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&ctx_claims, __ATOMIC_SEQ_CST)) break;
    __atomic_sub_fetch(&capture_intents, 1, __ATOMIC_SEQ_CST);
    if (q && cl_host_q_armed(q) && cl_host_service_q(L, q)) since = cl_now_us();
    backoff(since);
  }
  __atomic_add_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
  __atomic_sub_fetch(&capture_intents, 1, __ATOMIC_SEQ_CST);
}

static CUresult ctx_sync(void) {
  if (!cl_ctx_claim()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  CUresult r = CU0(cuCtxSynchronize);
  cl_ctx_unclaim();
  return r;
}

static CUresult plain_wait(int kind, void *h) {
  if (kind == CL_WAIT_STREAM) return CU0(cuStreamSynchronize, (CUstream)h);
  if (kind == CL_WAIT_EVENT) return CU0(cuEventSynchronize, (CUevent)h);
  if (kind == CL_WAIT_HOSTFNS) return CUDA_SUCCESS;
  return ctx_sync();
}

/* Every blocking wait of cudalua goes through here: with none of L's host functions pending
   it is the plain driver call; otherwise it polls, running them as they fire. A context-wide
   wait polls until none is pending (the legacy stream's query tells a failed context). */
static CUresult wait_q(lua_State *L, cl_hostq *q, int kind, void *h) {
  cl_wait_check(L);
  double since = cl_now_us();
  for (unsigned i = 0;; i++) {
    if (!q || !cl_host_q_armed(q)) return plain_wait(kind, h);
    if (cl_host_service_q(L, q)) since = cl_now_us();
    CUresult r = kind == CL_WAIT_STREAM ? CU(cuStreamQuery, (CUstream)h)
               : kind == CL_WAIT_EVENT ? CU(cuEventQuery, (CUevent)h)
               : (i & 15) == 15 ? CU(cuStreamQuery, CU_STREAM_LEGACY) : CUDA_ERROR_NOT_READY;
    if ((kind == CL_WAIT_CTX || kind == CL_WAIT_HOSTFNS) && r == CUDA_SUCCESS) r = CUDA_ERROR_NOT_READY;
    if (r != CUDA_ERROR_NOT_READY) return r;
    backoff(since);
  }
}

CUresult cl_wait_raw(lua_State *L, int kind, void *h) { return wait_q(L, cl_host_queue(L), kind, h); }

void cl_wait_result(lua_State *L, CUresult r, const char *what) {
  if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    cl_error(L, what, "the whole device cannot be waited for while a stream is capturing "
               "(wait after the capture ends: on another thread, it may have just begun)");
  cl_check(L, r, what);
}

/* set by a layer above (nccl.c) that must see every wait of the user's: before it (a refusal),
   and after it (a failure found meanwhile on another thread, told to its state) */
void (*cl_wait_hook)(lua_State *L, const char *what, int after);

void cl_wait(lua_State *L, int kind, void *h, const char *what) {
  if (cl_wait_hook) cl_wait_hook(L, what, 0);
  CUresult r = cl_wait_raw(L, kind, h);
  cl_wait_result(L, r, what);
  cl_host_raise(L);
  if (cl_wait_hook) cl_wait_hook(L, what, 1);
}

/* before a driver call that waits for the whole device by itself (frees of host-visible
   memory, module unloads, the legacy stream's synchronous copies): L's own host functions are
   run first (no device-wide wait: while another thread captures, the driver refuses one and
   ends that capture); never raises */
void cl_host_drain(lua_State *L) {
  if (L && !cl_in_hostfn && cl_host_armed(L)) cl_wait_raw(L, CL_WAIT_HOSTFNS, NULL);
}


/* L's queue when it has armed calls this thread may wait for now: inside a host function or a
   capture no wait may be; nothing armed, nothing to wait for */
static cl_hostq *waitable(lua_State *L) {
  if (cl_capturing) return NULL;
  cl_hostq *q = cl_host_queue(L);
  return q && !cl_in_hostfn && cl_host_q_armed(q) ? q : NULL;
}

/* where launches block, work queued behind a pending host function would block in the driver:
   they are run first. A host function's error is left for the next wait, as without. */
void cl_host_before_enqueue(lua_State *L, const char *what) {
  cl_hostq *q = waitable(L);
  if (q) cl_check(L, wait_q(L, q, CL_WAIT_HOSTFNS, NULL), what);
}

/* where launches block, so does queueing a host function: it has run when the call returns */
void cl_host_after_enqueue(lua_State *L, CUstream h, const char *what) {
  cl_hostq *q = cl_launch_blocks ? waitable(L) : NULL;
  if (q) cl_check(L, wait_q(L, q, CL_WAIT_STREAM, h), what);
}


/* waits for every device cudalua has a context on (memory a device's kernels used on another
   device is freed after this), running Lua host functions meanwhile; raises only as
   cl_wait_raw does inside a host function */
CUresult cl_sync_all_devices(lua_State *L) {
  cl_wait_check(L);   /* before switching: a raise must not leave another context current */
  CUcontext cur = NULL;
  CUresult r = CUDA_SUCCESS;
  CU0(cuCtxGetCurrent, &cur);
  for (int d = 0; d < cl_ndevices(); d++) {
    CUcontext c = cl_ctx_of_device(d);
    if (!c) continue;
    CU0(cuCtxSetCurrent, c);
    CUresult r2 = cl_wait_raw(L, CL_WAIT_CTX, NULL);
    if (r == CUDA_SUCCESS) r = r2;
  }
  CU0(cuCtxSetCurrent, cur);
  return r;
}

/* cuda.sleep(seconds): the thread is idle, so this state's host functions that fire meanwhile
   run (their errors are left for the next wait, as before a launch): another thread's
   device-wide wait may be waiting for them, and a loop that retries a wait refused while
   another state captures sleeps between tries (tools/stress.lua's did, and a wait of a third
   thread for its host functions stalled that capture for seconds). Only this thread arms its
   queue: with nothing armed at the start, it simply sleeps. */
static int l_sleep(lua_State *L) {
  lua_Number sec = cl_checknumber(L, 1);
  cl_argcheck(L, sec >= 0 && sec < 1e9, 1, "seconds must be >= 0 and < 1e9");
  double end = cl_now_us() + sec * 1e6;
  cl_hostq *q = cl_in_hostfn ? NULL : cl_host_queue(L);
  for (;;) {
    if (q && cl_host_q_armed(q)) cl_host_service_q(L, q);
    double left = end - cl_now_us();
    if (left <= 0) break;
    if (q && cl_host_q_armed(q) && left > 50) left = 50;   /* polls for the next firing */
    long long ns = (long long)(left * 1e3);
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&ts, NULL);
  }
  if (q) cl_flush_deferred(L);
  return 0;
}

/* core.cleanup_pause(delta) -> scopes open, releases put off (cuda.defer_cleanup) */
static int l_cleanup_pause(lua_State *L) {
  int pending = 0, open = cl_cleanup_pause(L, (int)luaL_checkinteger(L, 1), &pending);
  lua_pushinteger(L, open);
  lua_pushinteger(L, pending);
  return 2;
}

void cl_open_wait(lua_State *L) {
  lua_pushcfunction(L, l_cleanup_pause);
  lua_setfield(L, -2, "cleanup_pause");
  lua_pushcfunction(L, l_sleep);
  lua_setfield(L, -2, "sleep");
}
