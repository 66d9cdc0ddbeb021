/* cxx.c: core.cxx_compile, the CPU device's compile: the host C++ compiler builds a kernel
   library (kernels/cudalua/cpu/cuda_cpu.h maps CUDA C++ onto the CPU). Which compiler, which
   flags and the text around the source are lua/cudalua/cpucompile.lua's; this file writes the
   files, runs the compiler in a temporary folder, reads the library back and names the name
   expressions the way NVRTC's lowered names do: the library, loaded here, says the symbol each
   one's address has (its __cudalua_cpu_expr table). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cl.h"
#include "cpu_dev.h"

extern char **environ;

static int write_file(const char *path, const char *s, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  int ok = fwrite(s, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

/* dir/name, with the folders name has made first (a header "cudalua/cpu/abi.h") */
static int write_under(const char *dir, const char *name, const char *s, size_t n) {
  char path[4096];
  if (strstr(name, "..") || name[0] == '/') return 0;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  for (char *p = path + strlen(dir) + 1; (p = strchr(p, '/')); p++) {
    *p = 0;
    mkdir(path, 0700);
    *p = '/';
  }
  return write_file(path, s, n);
}

static char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
  fclose(f);
  if (b) { b[len] = 0; *n = (size_t)len; }
  return b;
}

static int rm_one(const char *p, const struct stat *s, int flag, struct FTW *f) {
  (void)s; (void)flag; (void)f;
  return remove(p);
}

/* the compiler's run: argv with the log as its standard output and error; its exit status */
static int run(char **argv, const char *log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (r) return -r;
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* the lowered names: table expr -> symbol, from the built library */
static void push_lowered(lua_State *L, const char *lib, int exprs) {
  lua_newtable(L);
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  void *const *addr = h ? dlsym(h, "__cudalua_cpu_expr") : NULL;
  lua_Integer n = (lua_Integer)lua_rawlen(L, exprs);
  for (lua_Integer i = 1; addr && i <= n; i++) {
    Dl_info info;
    if (!addr[i - 1] || !dladdr(addr[i - 1], &info) || !info.dli_sname) continue;
    lua_rawgeti(L, exprs, i);
    lua_pushstring(L, info.dli_sname);
    lua_settable(L, -3);
  }
  if (h) dlclose(h);
}

/* cxx_compile(src, file name, {compiler, flags...}, {{name, text}, ...}, {exprs}) ->
   library bytes, log, lowered | nil, log, why */
static int l_cxx_compile(lua_State *L) {
  size_t nsrc;
  const char *src = luaL_checklstring(L, 1, &nsrc);
  luaL_checkstring(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  char dir[] = "/tmp/cudalua-cpu-XXXXXX";
  if (!mkdtemp(dir)) return cl_error(L, "cuda.compile", "cannot make a folder in /tmp (%s)", strerror(errno));
  char inc[64], file[64], out[64], log[64];
  snprintf(inc, sizeof inc, "%s/include", dir);
  snprintf(file, sizeof file, "%s/kernel.cpp", dir);
  snprintf(out, sizeof out, "%s/kernel.so", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  mkdir(inc, 0700);
  int ok = write_file(file, src, nsrc);
  for (lua_Integer i = 1; ok && i <= (lua_Integer)lua_rawlen(L, 4); i++) {
    lua_rawgeti(L, 4, i);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    size_t n;
    const char *name = lua_tostring(L, -2), *text = lua_tolstring(L, -1, &n);
    ok = name && text && write_under(inc, name, text, n);
    lua_pop(L, 3);
  }
  int na = (int)lua_rawlen(L, 3);
  char **argv = calloc((size_t)na + 8, sizeof *argv);
  if (!ok || !argv) {
    free(argv);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return cl_error(L, "cuda.compile", "cannot write the source for the C++ compiler in %s", dir);
  }
  for (int i = 0; i < na; i++) { lua_rawgeti(L, 3, i + 1); argv[i] = (char *)lua_tostring(L, -1); lua_pop(L, 1); }
  char incflag[80];
  snprintf(incflag, sizeof incflag, "-I%s", inc);
  char *tail[] = {incflag, "-o", out, file, NULL};
  for (int i = 0; i < 5; i++) argv[na + i] = tail[i];
  int st = run(argv, log);   /* (the strings stay referenced by the table at 3) */
  free(argv);
  size_t nlog = 0, nimg = 0;
  char *text = read_all(log, &nlog), *img = st == 0 ? read_all(out, &nimg) : NULL;
  int rets;
  if (img) {
    lua_pushlstring(L, img, nimg);
    lua_pushstring(L, text ? text : "");
    push_lowered(L, out, 5);
    rets = 3;
  } else {
    lua_pushnil(L);
    lua_pushstring(L, text ? text : "");
    lua_rawgeti(L, 3, 1);
    const char *cxx = lua_tostring(L, -1);
    lua_pop(L, 1);
    if (st < 0) lua_pushfstring(L, "the C++ compiler %s cannot be run (%s)", cxx ? cxx : "?", strerror(-st));
    else lua_pushfstring(L, "the C++ compiler failed (exit status %d)", st);
    rets = 3;
  }
  free(text);
  free(img);
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  return rets;
}

/* is_cpu_device() -> true when the driver loaded is the CPU device (loading it if need be) */
static int l_is_cpu_device(lua_State *L) {
  lua_pushboolean(L, cl_driver_load() && cl_cpu_symbol(NULL) != NULL);
  return 1;
}

/* has_symbol(name) -> whether the process has it (a sanitizer's runtime, preloaded) */
static int l_has_symbol(lua_State *L) {
  lua_pushboolean(L, dlsym(RTLD_DEFAULT, luaL_checkstring(L, 1)) != NULL);
  return 1;
}

/* drop_sanitizer_preload(): LD_PRELOAD without the sanitizers' runtimes, for the children
   (the compiler, the shell of io.popen) this process starts: the runtime is needed in this
   process only, and a shell run under ThreadSanitizer crashes */
static int l_drop_sanitizer_preload(lua_State *L) {
  const char *p = getenv("LD_PRELOAD");
  if (!p || !strstr(p, "san")) return 0;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (const char *s = p; *s;) {
    size_t n = strcspn(s, ": ");
    int drop = 0;
    for (const char *q = s; q + 7 <= s + n && !drop; q++) drop = q[0] == 'l' && strncmp(q + 4, "san", 3) == 0 && !strncmp(q, "lib", 3);
    if (!drop && n) { if (luaL_bufflen(&b)) luaL_addchar(&b, ':'); luaL_addlstring(&b, s, n); }
    s += n + (s[n] != 0);
  }
  luaL_pushresult(&b);
  if (lua_rawlen(L, -1)) setenv("LD_PRELOAD", lua_tostring(L, -1), 1);
  else unsetenv("LD_PRELOAD");
  return 0;
}

void cl_open_cxx(lua_State *L) {
  lua_pushcfunction(L, l_drop_sanitizer_preload); lua_setfield(L, -2, "drop_sanitizer_preload");
  lua_pushcfunction(L, l_has_symbol); lua_setfield(L, -2, "has_symbol");
  lua_pushcfunction(L, l_cxx_compile); lua_setfield(L, -2, "cxx_compile");
  lua_pushcfunction(L, l_is_cpu_device); lua_setfield(L, -2, "is_cpu_device");
}
