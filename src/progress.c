/* progress.c: what cuda.progress (lua/cudalua/progress.lua) needs from the system: whether a
   Lua file is a terminal, and how wide it is. */
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "cl.h"
#include <lualib.h>

static int fd_of(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TNUMBER) return (int)cl_checkinteger(L, idx);
  luaL_Stream *f = cl_checkudata(L, idx, LUA_FILEHANDLE);
  if (!f->f) cl_argerror(L, idx, "closed file");
  return fileno(f->f);
}

/* isatty(file or fd) -> boolean, columns */
static int l_isatty(lua_State *L) {
  int fd = fd_of(L, 1);
  int tty = isatty(fd);
  lua_pushboolean(L, tty);
  struct winsize w;
  if (tty && ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) lua_pushinteger(L, w.ws_col);
  else lua_pushinteger(L, 80);
  return 2;
}

/* wait_flag(mapped uint32 array, value, stream): spins until a kernel on the stream has stored
   value in the array's first element; the stream is queried now and then, so a failed kernel
   raises instead of hanging. A cuStreamSynchronize round trip costs microseconds more. */
static int l_wait_flag(lua_State *L) {
  cl_array *a = cl_checkarray(L, 1);
  uint32_t want = (uint32_t)cl_checkinteger(L, 2);
  cl_stream *s = cl_tostream(L, 3, "cuda.reduce");
  if ((a->kind != CL_MAPPED && a->kind != CL_PINNED) || a->dtype != CL_U32)
    return cl_error(L, "cuda.reduce", "wait_flag needs a mapped uint32 array");
  volatile uint32_t *p = cl_hostptr(a);
  CUstream h = cl_stream_use(L, s);
  for (unsigned spins = 1;; spins++) {
    if (*p == want) return 0;
    if ((spins & 1023) == 0) {
      cl_host_service(L);
      CUresult r = CU(cuStreamQuery, h);
      if (r == CUDA_SUCCESS) {
        if (*p == want) return 0;
        return cl_error(L, "cuda.reduce", "wait_flag: the stream finished without storing the value");
      }
      if (r != CUDA_ERROR_NOT_READY) cl_check(L, r, "waiting for a kernel");
    }
  }
}

void cl_open_progress(lua_State *L) {
  lua_pushcfunction(L, l_wait_flag);
  lua_setfield(L, -2, "wait_flag");
  lua_pushcfunction(L, l_isatty);
  lua_setfield(L, -2, "isatty");
}
