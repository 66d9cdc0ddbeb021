/* nvtx.c: NVTX ranges and marks for profilers, cuProfilerStart/Stop. NVTX v3 is header-only:
   its first call looks for a tool (NVTX_INJECTION64_PATH, which Nsight Systems and Nsight
   Compute set when they run the program) and loads it with dlopen; without one every call is
   a call through a pointer to an empty function, so ranges can stay in production code. */
#include <nvtx3/nvToolsExt.h>
#include "cl.h"

/* ranges this thread has open: popping with none open raises (without a tool NVTX cannot say) */
static __thread int depth;

static const char *name_of(lua_State *L, const char *where) {
  if (lua_type(L, 1) != LUA_TSTRING)
    cl_error(L, lua_pushfstring(L, "cuda.nvtx.%s", where), "expected the range's name (a string), got %s", luaL_typename(L, 1));
  return lua_tostring(L, 1);
}

/* nvtx.range_push(name) -> the depth of the range pushed (1 for the outermost) */
static int l_push(lua_State *L) {
  nvtxRangePushA(name_of(L, "range_push"));
  lua_pushinteger(L, ++depth);
  return 1;
}

/* nvtx.range_pop() -> the depth left */
static int l_pop(lua_State *L) {
  if (depth == 0) return cl_error(L, "cuda.nvtx.range_pop", "no range is open (range_push opens one)");
  nvtxRangePop();
  lua_pushinteger(L, --depth);
  return 1;
}

/* nvtx.mark(name): an instant event */
static int l_mark(lua_State *L) {
  nvtxMarkA(name_of(L, "mark"));
  return 0;
}

/* cuda.profile_start() / profile_stop(): the profiler collects only between them, when told to
   (nsys --capture-range=cudaProfilerApi, ncu --profile-from-start off) */
static int profiler(lua_State *L, int start) {
  CUresult (*f)(void) = NULL;
  cl_ctx(L);   /* they apply to the current context */
  f = start ? cu.cuProfilerStart : cu.cuProfilerStop;
  if (!f) return cl_error(L, start ? "cuda.profile_start" : "cuda.profile_stop", "this driver has no cuProfiler%s", start ? "Start" : "Stop");
  cl_check(L, f(), start ? "cuda.profile_start" : "cuda.profile_stop");
  return 0;
}
static int l_profile_start(lua_State *L) { return profiler(L, 1); }
static int l_profile_stop(lua_State *L) { return profiler(L, 0); }

void cl_open_nvtx(lua_State *L) {
  static const luaL_Reg f[] = {{"range_push", l_push}, {"range_pop", l_pop}, {"mark", l_mark}, {NULL, NULL}};
  luaL_newlib(L, f);
  lua_setfield(L, -2, "nvtx");
  lua_pushcfunction(L, l_profile_start); lua_setfield(L, -2, "profile_start");
  lua_pushcfunction(L, l_profile_stop); lua_setfield(L, -2, "profile_stop");
}
