/* progress.c: what cuda.progress (lua/cudalua/progress.lua) needs from the system: whether a
   Lua file is a terminal, and how wide it is. */
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include "cl.h"
#include <lualib.h>

static int fd_of(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TNUMBER) return (int)luaL_checkinteger(L, idx);
  luaL_Stream *f = luaL_checkudata(L, idx, LUA_FILEHANDLE);
  if (!f->f) luaL_argerror(L, idx, "closed file");
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

void cl_open_progress(lua_State *L) {
  lua_pushcfunction(L, l_isatty);
  lua_setfield(L, -2, "isatty");
}
