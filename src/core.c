/* core.c: luaopen_cudalua. The C core, the Lua parts (lua/cudalua) and the kernel headers
   (kernels/cudalua) are all inside the one binary, so require "cudalua" finds them wherever
   the library is: source tree, LuaRocks tree or a host program. */
#include <pthread.h>
#include <string.h>
#include "cl.h"
#include "cudalua.h"

/* package.preload loader for an embedded Lua part: receives the core table as its argument */
static int load_part(lua_State *L) {
  const cl_blob *b = lua_touserdata(L, lua_upvalueindex(1));
  lua_pushfstring(L, "@cudalua/%s", b->name);
  const char *chunkname = lua_tostring(L, -1);
  if (luaL_loadbuffer(L, b->data, b->len, chunkname) != LUA_OK) return lua_error(L);
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_call(L, 1, 1);
  return 1;
}


/* require "cudalua.nccl" before require "cudalua": Lua's C searcher finds this in cudalua.so;
   it loads cudalua, whose preload table has the Lua part */
CUDALUA_API int luaopen_cudalua_nccl(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "cudalua");
  lua_call(L, 1, 0);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_getfield(L, -1, "cudalua.nccl");
  lua_pushliteral(L, "cudalua.nccl");
  lua_call(L, 1, 1);
  return 1;
}

/* Every state that loads cudalua holds a sentinel in its registry, made before any other
   cudalua object: lua_close runs finalizers newest first, so the sentinel's runs after every
   array, stream, module and graph of the state is gone. The last state to close empties the
   process-wide parts (block cache, pools, contexts), so checkers such as compute-sanitizer's
   leak check find nothing left. */
static pthread_mutex_t states_mu = PTHREAD_MUTEX_INITIALIZER;
static int live_states;
static const char sentinel_key = 0;

static int state_closed(lua_State *L) {
  pthread_mutex_lock(&states_mu);
  cl_dlpack_close(L);       /* the tensors handed out that their consumers are done with */
  cl_flush_deferred(L);
  cl_mem_forget_state(L);   /* the blocks it cached: only it may free them (memory.c) */
  if (--live_states == 0) {
    cl_mem_release_all();
    cl_idle_devices();      /* the helper thread releases closed states' host functions meanwhile */
    cl_hostfn_shutdown();   /* before the contexts its memory was allocated in go */
    cl_gexec_shutdown();    /* the conditional lanes, likewise */
    cl_nccl_shutdown();     /* the watchdog: its code goes when the library is unloaded */
    cl_release_contexts();
  }
  pthread_mutex_unlock(&states_mu);
  return 0;
}

static void hold_sentinel(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &sentinel_key) != LUA_TNIL) { lua_pop(L, 1); return; }
  lua_pop(L, 1);
  lua_newuserdatauv(L, 1, 0);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, state_closed);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &sentinel_key);
  pthread_mutex_lock(&states_mu);
  live_states++;
  pthread_mutex_unlock(&states_mu);
}

int luaopen_cudalua(lua_State *L) {
  hold_sentinel(L);
  lua_newtable(L);   /* the core: C functions the Lua parts build on */
  int core = lua_gettop(L);
  /* a type is opened before the files above it that add to it (said on their lines): they
     find its metatable or methods table made */
  cl_open_driver(L);
  cl_open_device(L);
  cl_open_dtype(L);
  cl_open_stream(L);
  cl_open_event(L);     /* adds stream:wait_event */
  cl_open_array(L);
  cl_open_copy(L);      /* adds the arrays' copy methods */
  cl_open_cuarray(L);
  cl_open_texture(L);
  cl_open_memory(L);
  cl_open_compile(L);
  cl_open_cxx(L);
  cl_open_link(L);
  cl_open_kernel(L);
  cl_open_module(L);
  cl_open_launch(L);    /* adds k:launch */
  cl_open_launcher(L);  /* adds k[{grid, block}] (the kernel's __index in front of kernel.c's) and k:forall */
  cl_open_random(L);
  cl_open_progress(L);
  cl_open_cache(L);
  cl_open_hostfn(L);
  cl_open_wait(L);
  cl_open_graph(L);
  cl_open_unbound(L);
  cl_open_gexec(L);     /* adds graph:instantiate and graph:launch */
  cl_open_capture(L);   /* adds the stream's capture methods */
  cl_open_interop(L);
  cl_open_dlpack(L);    /* DLPack in and out (after interop: it makes foreign arrays) */
  cl_open_ipc(L);
  cl_open_nvtx(L);
  luaopen_cudalua_nccl_core(L); lua_setfield(L, core, "nccl");
  lua_pushstring(L, CUDALUA_VERSION); lua_setfield(L, core, "version");
  /* identifies this build's Lua parts and headers: the compile cache key holds it */
  uint64_t h = CL_FNV_BASIS;
  for (int k = 0; k < 2; k++) {
    const cl_blob *b = k ? cl_kernel_headers : cl_lua_parts;
    for (int i = 0; b[i].name; i++) h = cl_fnv1a(h, b[i].data, b[i].len);
  }
  lua_pushfstring(L, "%s-%p", CUDALUA_VERSION, (void *)(uintptr_t)h);
  lua_setfield(L, core, "build_id");
  lua_newtable(L);
  for (int i = 0; cl_kernel_headers[i].name; i++) {
    lua_createtable(L, 2, 0);
    lua_pushstring(L, cl_kernel_headers[i].name); lua_rawseti(L, -2, 1);
    lua_pushlstring(L, cl_kernel_headers[i].data, cl_kernel_headers[i].len); lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, core, "headers");
  lua_getfield(L, LUA_REGISTRYINDEX, CL_ARRAY ".methods"); lua_setfield(L, core, "array_methods");
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  const cl_blob *main = NULL;
  for (int i = 0; cl_lua_parts[i].name; i++) {
    const cl_blob *b = &cl_lua_parts[i];
    if (!strcmp(b->name, "init.lua")) { main = b; continue; }
    char mod[128];
    size_t n = strlen(b->name) - 4;   /* "compile.lua" -> "cudalua.compile" */
    if (n > 100) continue;
    memcpy(mod, "cudalua.", 8); memcpy(mod + 8, b->name, n); mod[8 + n] = 0;
    lua_pushlightuserdata(L, (void *)b);
    lua_pushvalue(L, core);
    lua_pushcclosure(L, load_part, 2);
    lua_setfield(L, -2, mod);
  }
  lua_pop(L, 1);
  if (!main) return cl_error(L, NULL, "built without lua/cudalua/init.lua");
  lua_pushlightuserdata(L, (void *)main);
  lua_pushvalue(L, core);
  lua_pushcclosure(L, load_part, 2);
  lua_call(L, 0, 1);
  return 1;
}
