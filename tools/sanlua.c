/* sanlua: a small lua5.4 interpreter for `make asan`. AddressSanitizer's runtime must be in the
   main program, so cudalua.so built with -fsanitize=address,undefined is loaded by this program
   (built with the same flags) rather than by the system's lua5.4. It takes what the specs and
   tools/fuzz.lua need of lua5.4's command line: options -e CODE, then a script and its arguments;
   `arg` is laid out as lua5.4 lays it out (the interpreter and options at negative indexes). */
#include <stdio.h>
#include <string.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    fprintf(stderr, "%s: %s\n", "sanlua", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  return status;
}

static int docall(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, 0, base);
  lua_remove(L, base);
  return status;
}

int main(int argc, char **argv) {
  lua_State *L = luaL_newstate();
  if (!L) { fprintf(stderr, "sanlua: cannot create a state\n"); return 1; }
  luaL_openlibs(L);
  int script = 1;   /* the index of the script in argv, argc when there is none */
  while (script < argc && argv[script][0] == '-') {
    if (!strcmp(argv[script], "-e") && script + 1 < argc) script += 2;
    else { fprintf(stderr, "sanlua: unknown option %s\n", argv[script]); return 1; }
  }
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) { lua_pushstring(L, argv[i]); lua_rawseti(L, -2, i - script); }
  lua_setglobal(L, "arg");
  int status = LUA_OK;
  for (int i = 1; status == LUA_OK && i < script; i += 2) {
    status = luaL_loadbuffer(L, argv[i + 1], strlen(argv[i + 1]), "=(command line)");
    if (status == LUA_OK) status = docall(L, 0);
    report(L, status);
  }
  if (status == LUA_OK && script < argc) {
    status = luaL_loadfile(L, strcmp(argv[script], "-") ? argv[script] : NULL);
    if (status == LUA_OK) {
      int n = argc - script - 1;
      luaL_checkstack(L, n, "too many arguments");
      for (int i = 1; i <= n; i++) lua_pushstring(L, argv[script + i]);
      status = docall(L, n);
    }
    report(L, status);
  }
  lua_close(L);
  return status == LUA_OK ? 0 : 1;
}
