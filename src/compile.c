/* compile.c: NVRTC. Compiling needs no GPU when the architecture is given. The policy (options,
   shipped headers, finding kernels, the cache) lives in lua/cudalua/compile.lua. */
#define _GNU_SOURCE   /* pipe2, close_range, sched_getaffinity */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cl.h"

/* the compiled output NVRTC is asked for */
enum { OUT_CUBIN, OUT_PTX, OUT_LTOIR };
static const char *const outs[] = {"cubin", "ptx", "ltoir", NULL};

/* ---- one NVRTC run, as a job that needs no Lua state: cuda.compile runs it at once,
   cuda.compile_all in child processes (below) ---- */
typedef struct {
  char **strs;          /* every string below points into these copies */
  int nstr;
  const char *src, *fname, **opts, **hsrc, **hname, **expr;
  int nopt, nh, nx, out, pch;
  /* the result */
  nvrtcResult r;
  char *img, *ptx, *log, **lowered;   /* lowered[i]: expr[i]'s, or NULL */
  size_t nimg, nptx;
  const char *pch_status;   /* NULL, "made", "used", "made after growing the heap" */
  int failed_read;      /* the output could not be read (out of memory) */
} nvjob;

/* with pch: NVRTC's automatic precompiled headers, kept for the process only (NVRTC makes
   them under /tmp/__nvrtc_auto_pch_<pid>_N and deletes them at exit), its messages off where
   they would change the log: why a PCH could not be used (#630), and the #line after the
   source's headers that ends a PCH's prefix (#20283: cudalua's probe appends one) */
static const char *const pch_opts[] = {"-pch", "--pch-verbose=false", "-diag-suppress=20283"};
#define NPCH 3

static void job_free(nvjob *j) {
  for (int i = 0; i < j->nstr; i++) free(j->strs[i]);
  free(j->strs);
  free(j->opts);
  free(j->img); free(j->ptx); free(j->log);
  if (j->lowered) for (int i = 0; i < j->nx; i++) free(j->lowered[i]);
  free(j->lowered);
  memset(j, 0, sizeof *j);
}

static char *dup_of(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* NVRTC's log without its lines about precompiled headers ("... creating precompiled header
   file ..." / "using ..."), which set the status instead: the log is the one a compile without
   the PCH gives */
static int line_has(const char *line, size_t n, const char *what) {
  size_t k = strlen(what);
  for (size_t i = 0; i + k <= n; i++) if (!memcmp(line + i, what, k)) return 1;
  return 0;
}

static void strip_pch_lines(nvjob *j) {
  char *w = j->log, *rd = j->log;
  while (*rd) {
    char *nl = strchr(rd, '\n');
    size_t n = nl ? (size_t)(nl - rd + 1) : strlen(rd);
    int made = line_has(rd, n, "creating precompiled header file");
    int used = !made && line_has(rd, n, "using precompiled header file");
    if (made) j->pch_status = "made";
    else if (used && !j->pch_status) j->pch_status = "used";
    if (!made && !used) { memmove(w, rd, n); w += n; }
    rd += n;
  }
  *w = 0;
}

/* reads one output of prog into *buf; 0 when there is none */
static int read_output(nvrtcProgram prog, int what, char **buf, size_t *len) {
  size_t n = 0;
  nvrtcResult r = what == OUT_PTX ? cu.nvrtcGetPTXSize(prog, &n)
                : what == OUT_LTOIR ? cu.nvrtcGetLTOIRSize(prog, &n) : cu.nvrtcGetCUBINSize(prog, &n);
  if (r != NVRTC_SUCCESS || n == 0 || !(*buf = malloc(n))) return 0;
  r = what == OUT_PTX ? cu.nvrtcGetPTX(prog, *buf)
    : what == OUT_LTOIR ? cu.nvrtcGetLTOIR(prog, *buf) : cu.nvrtcGetCUBIN(prog, *buf);
  if (r != NVRTC_SUCCESS) { free(*buf); *buf = NULL; return 0; }
  *len = what == OUT_PTX ? n - 1 : n;   /* PTX ends with a NUL */
  return 1;
}

/* CUDALUA_PCH_HEAP (bytes): the PCH heap's size before the first compile with a PCH, in place
   of NVRTC's default; a small one takes the path that grows it (the specs do). The PCH heap is
   the process's; every compile, and so every use or resize of it, holds nv_mu (below), or runs
   in a child of one thread */
static void heap_from_env(void) {
  static int done;
  if (done) return;
  done = 1;
  const char *e = getenv("CUDALUA_PCH_HEAP");
  char *end = NULL;
  unsigned long long v = e && *e ? strtoull(e, &end, 10) : 0;
  if (v > 0 && end && !*end) cu.nvrtcSetPCHHeapSize((size_t)v);
}

/* one program made, compiled and read; 1: the PCH heap was too small for the PCH NVRTC wanted
   to make (the result is right all the same). Called with nv_mu held, or in a child */
static int compile_once(nvjob *j) {
  nvrtcProgram prog;
  j->r = cu.nvrtcCreateProgram(&prog, j->src, j->fname, j->nh, j->hsrc, j->hname);
  if (j->r != NVRTC_SUCCESS) return 0;
  for (int i = 0; i < j->nx && j->r == NVRTC_SUCCESS; i++) j->r = cu.nvrtcAddNameExpression(prog, j->expr[i]);
  if (j->pch) heap_from_env();
  if (j->r == NVRTC_SUCCESS) j->r = cu.nvrtcCompileProgram(prog, j->nopt, j->opts);
  int short_heap = j->pch && cu.nvrtcGetPCHCreateStatus(prog) == NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED;
  size_t need = 0;
  if (short_heap && cu.nvrtcGetPCHHeapSizeRequired(prog, &need) != NVRTC_SUCCESS) short_heap = 0;
  size_t logn = 0;
  cu.nvrtcGetProgramLogSize(prog, &logn);
  free(j->log);
  if ((j->log = malloc(logn + 1))) { j->log[0] = 0; if (logn) cu.nvrtcGetProgramLog(prog, j->log); }
  if (j->r == NVRTC_SUCCESS) {
    free(j->img); free(j->ptx); j->img = j->ptx = NULL;
    j->failed_read = !read_output(prog, j->out, &j->img, &j->nimg);
    if (j->out == OUT_CUBIN) read_output(prog, OUT_PTX, &j->ptx, &j->nptx);   /* for module:ptx() */
    for (int i = 0; i < j->nx; i++) {
      const char *low = NULL;
      free(j->lowered[i]);
      j->lowered[i] = cu.nvrtcGetLoweredName(prog, j->expr[i], &low) == NVRTC_SUCCESS && low ? dup_of(low) : NULL;
    }
  }
  cu.nvrtcDestroyProgram(&prog);
  if (short_heap) {   /* the heap grown, for this and later compiles */
    size_t have = 0;
    if (cu.nvrtcGetPCHHeapSize(&have) == NVRTC_SUCCESS && have < need) cu.nvrtcSetPCHHeapSize(need);
  }
  return short_heap;
}

static void run_job(nvjob *j) {
  if (compile_once(j) && j->r == NVRTC_SUCCESS) {
    compile_once(j);   /* again, so that the PCH is made now */
    if (j->log) strip_pch_lines(j);
    if (j->pch_status && !strcmp(j->pch_status, "made")) j->pch_status = "made after growing the heap";
    return;
  }
  if (j->log) strip_pch_lines(j);
}

/* a copy of a Lua string argument, owned by the job (raises when s is no string) */
static const char *keep(lua_State *L, nvjob *j, const char *s, const char *what) {
  if (!s) cl_error(L, "cuda.compile", "%s is not a string", what);
  char *d = dup_of(s);
  if (!d) cl_error(L, NULL, "out of host memory");
  j->strs[j->nstr++] = d;
  return d;
}

/* the job of the arguments at base: src, filename, {options}, {{name, text}, ...},
   {name expressions}, output ("cubin": the PTX comes too; "ptx"; "ltoir"), pch. j is zeroed
   first and freed by the caller, also after a raise here (the caller's box owns it) */
static void job_of(lua_State *L, int base, nvjob *j) {
  cl_checklstring(L, base, NULL);
  cl_checklstring(L, base + 1, NULL);
  for (int i = 2; i <= 4; i++) cl_checktype(L, base + i, LUA_TTABLE);
  j->out = cl_checkoption(L, base + 5, "cubin", outs);
  j->pch = lua_toboolean(L, base + 6) && cu.nvrtcGetPCHCreateStatus && cu.nvrtcSetPCHHeapSize;
  int nopt = (int)lua_rawlen(L, base + 2), nh = (int)lua_rawlen(L, base + 3), nx = (int)lua_rawlen(L, base + 4);
  int total = nopt + (j->pch ? NPCH : 0);
  j->strs = calloc((size_t)(2 + nopt + 2 * nh + nx), sizeof(char *));
  j->opts = calloc((size_t)(total + 2 * nh + nx + 1), sizeof(char *));
  j->lowered = calloc((size_t)(nx + 1), sizeof(char *));
  if (!j->strs || !j->opts || !j->lowered) cl_error(L, NULL, "out of host memory");
  j->hsrc = j->opts + total;
  j->hname = j->hsrc + nh;
  j->expr = j->hname + nh;
  j->src = keep(L, j, lua_tostring(L, base), "the source");
  j->fname = keep(L, j, lua_tostring(L, base + 1), "the name");
  for (int i = 0; i < nopt; i++) {
    lua_rawgeti(L, base + 2, i + 1);
    j->opts[j->nopt++] = keep(L, j, lua_tostring(L, -1), "an option");
    lua_pop(L, 1);
  }
  for (int i = 0; j->pch && i < NPCH; i++) j->opts[j->nopt++] = pch_opts[i];
  for (int i = 0; i < nh; i++, j->nh++) {
    lua_rawgeti(L, base + 3, i + 1);
    lua_rawgeti(L, -1, 1); lua_rawgeti(L, -2, 2);
    if (!lua_isstring(L, -1) || !lua_isstring(L, -2)) cl_error(L, "cuda.compile", "header %d needs a name and a text", i + 1);
    j->hname[i] = keep(L, j, lua_tostring(L, -2), "a header's name");
    j->hsrc[i] = keep(L, j, lua_tostring(L, -1), "a header");
    lua_pop(L, 3);
  }
  for (int i = 0; i < nx; i++) {
    lua_rawgeti(L, base + 4, i + 1);
    if (lua_isstring(L, -1)) j->expr[j->nx++] = keep(L, j, lua_tostring(L, -1), "a name expression");
    lua_pop(L, 1);
  }
}

/* -> image, log, {expression = lowered name}, ptx text or nil, pch status or nil
   |  nil, log, error */
static int push_result(lua_State *L, const nvjob *j) {
  if (j->r != NVRTC_SUCCESS) {
    lua_pushnil(L);
    lua_pushstring(L, j->log ? j->log : "");
    lua_pushstring(L, cl_result_name(&cl_nvrtc, j->r));
    return 3;
  }
  if (j->failed_read) return cl_error(L, "cuda.compile", "cannot read the compiled %s", outs[j->out]);
  lua_pushlstring(L, j->img, j->nimg);
  lua_pushstring(L, j->log ? j->log : "");
  lua_createtable(L, 0, j->nx);
  for (int i = 0; i < j->nx; i++)
    if (j->lowered[i]) { lua_pushstring(L, j->lowered[i]); lua_setfield(L, -2, j->expr[i]); }
  if (j->ptx) lua_pushlstring(L, j->ptx, j->nptx); else lua_pushnil(L);
  if (j->pch_status) lua_pushstring(L, j->pch_status); else lua_pushnil(L);
  return 5;
}

/* ---- cuda.compile_all's runs in child processes. NVRTC 13.0 serializes compiles within a
   process (two threads compiling take as long as one after the other: measured, raw C too), so
   the runs go to forked children, which run only the job (C, no Lua, no CUDA) and write the
   result to a pipe, then _exit (NVRTC's exit handlers would delete the process's PCH folder,
   the parent's). Every NVRTC run of cudalua holds nv_mu, and a fork happens under it: no
   NVRTC call is half done in the child (another library's own NVRTC use is not covered) ---- */
static pthread_mutex_t nv_mu = PTHREAD_MUTEX_INITIALIZER;

static void run_locked(nvjob *j) {
  pthread_mutex_lock(&nv_mu);
  run_job(j);
  pthread_mutex_unlock(&nv_mu);
}

static int put(int fd, const void *p, size_t n) {
  for (const char *c = p; n;) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    c += w; n -= (size_t)w;
  }
  return 1;
}

/* a child that never answers (stuck in NVRTC) must not hang the parent: the result is waited
   for until a deadline, CUDALUA_COMPILE_TIMEOUT seconds (default 900) after the wait began */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static __thread double deadline;   /* of the wait under way on this thread */
static __thread int timed_out;

static int get(int fd, void *p, size_t n) {
  for (char *c = p; n;) {
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0) { timed_out = 1; return 0; }
    struct pollfd pf = {fd, POLLIN, 0};
    int k = poll(&pf, 1, left);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) { timed_out = 1; return 0; }
    if (k < 0) return 0;
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    c += r; n -= (size_t)r;
  }
  return 1;
}

/* a block: its length (SIZE_MAX: none), then the bytes */
static int put_block(int fd, const char *p, size_t n) {
  size_t len = p ? n : SIZE_MAX;
  return put(fd, &len, sizeof len) && (!p || put(fd, p, n));
}

static int get_block(int fd, char **p, size_t *n) {
  size_t len;
  if (!get(fd, &len, sizeof len)) return 0;
  *p = NULL;
  if (len == SIZE_MAX) return 1;
  if (len > ((size_t)1 << 34) || !(*p = malloc(len + 1))) return 0;
  (*p)[len] = 0;
  if (n) *n = len;
  return get(fd, *p, len);
}

static const char *const pch_states[] = {"made", "used", "made after growing the heap", NULL};

static void send_result(int fd, const nvjob *j) {
  int st = -1;
  for (int i = 0; j->pch_status && pch_states[i]; i++) if (!strcmp(pch_states[i], j->pch_status)) st = i;
  int head[3] = {(int)j->r, st, j->failed_read};
  if (!put(fd, head, sizeof head) || !put_block(fd, j->img, j->nimg) || !put_block(fd, j->ptx, j->nptx) ||
      !put_block(fd, j->log, j->log ? strlen(j->log) : 0))
    return;
  for (int i = 0; i < j->nx; i++)
    if (!put_block(fd, j->lowered[i], j->lowered[i] ? strlen(j->lowered[i]) : 0)) return;
}

static int read_result(int fd, nvjob *j) {
  int head[3];
  if (!get(fd, head, sizeof head)) return 0;
  j->r = (nvrtcResult)head[0];
  j->pch_status = head[1] >= 0 && head[1] < 3 ? pch_states[head[1]] : NULL;
  j->failed_read = head[2];
  if (!get_block(fd, &j->img, &j->nimg) || !get_block(fd, &j->ptx, &j->nptx) || !get_block(fd, &j->log, NULL)) return 0;
  for (int i = 0; i < j->nx; i++) if (!get_block(fd, &j->lowered[i], NULL)) return 0;
  return 1;
}

/* a job in a userdata: freed by __gc whatever happened (a raise while it was read; a child
   still running is waited for first) */
typedef struct { nvjob j; pid_t pid; int fd, done, taken; } nvbox;
#define NVJOB "cudalua.nvrtc_job"

/* a child whose result is not read (the box collected first) is killed: it may be blocked on
   the pipe, and would be waited for until its whole compile ended otherwise */
static void box_reap(nvbox *b) {
  if (b->fd >= 0) { close(b->fd); b->fd = -1; }
  if (b->pid > 0 && !b->done) kill(b->pid, SIGKILL);
  if (b->pid > 0) {
    while (waitpid(b->pid, NULL, 0) < 0 && errno == EINTR) {}
    b->pid = 0;
  }
}

static int box_gc(lua_State *L) {
  nvbox *b = luaL_checkudata(L, 1, NVJOB);
  box_reap(b);
  job_free(&b->j);
  return 0;
}

static nvbox *new_box(lua_State *L) {
  nvbox *b = lua_newuserdatauv(L, sizeof *b, 0);
  memset(b, 0, sizeof *b);
  b->fd = -1;
  if (luaL_newmetatable(L, NVJOB)) { lua_pushcfunction(L, box_gc); lua_setfield(L, -2, "__gc"); }
  lua_setmetatable(L, -2);
  return b;
}

/* the result pushed, then the job's memory freed at once (the image, the PTX and the copied
   sources can be megabytes the collector does not see); a raise in between leaves it to __gc */
static int taken(lua_State *L, nvbox *b) {
  int n = push_result(L, &b->j);
  job_free(&b->j);
  b->taken = 1;
  return n;
}

/* nvrtc_compile(src, filename, {options}, {{name, text}, ...}, {name expressions}, output, pch) */
static int l_nvrtc_compile(lua_State *L) {
  cl_lib_need(L, &cl_nvrtc);
  lua_settop(L, 7);   /* the box goes above the arguments, never read as one */
  nvbox *b = new_box(L);
  job_of(L, 1, &b->j);
  run_locked(&b->j);
  return taken(L, b);
}

/* one small compile in this process before the first child: NVRTC then has everything it
   loads at its first compile (libnvrtc-builtins) loaded, so that a child, forked while another
   thread may be inside the dynamic loader (a JIT, a require), never has to load anything */
static void warm_up(void) {
  static int warm;
  pthread_mutex_lock(&nv_mu);
  nvrtcProgram prog;
  if (!warm && cu.nvrtcCreateProgram(&prog, "__device__ int cudalua_warm;\n", "warm.cu", 0, NULL, NULL) == NVRTC_SUCCESS) {
    const char *opt = "-arch=compute_75";
    cu.nvrtcCompileProgram(prog, 1, &opt);
    cu.nvrtcDestroyProgram(&prog);
  }
  warm = 1;
  pthread_mutex_unlock(&nv_mu);
}

/* nvrtc_start(...as nvrtc_compile) -> job: the run in a child process; nvrtc_wait(job) -> what
   nvrtc_compile returns. Where no child can be made, the run happens in the wait */
static int l_nvrtc_start(lua_State *L) {
  cl_lib_need(L, &cl_nvrtc);
  lua_settop(L, 7);
  nvbox *b = new_box(L);
  job_of(L, 1, &b->j);
  warm_up();
  int fds[2];
  /* close-on-exec: a program another thread starts meanwhile (io.popen) keeps no end open */
  if (pipe2(fds, O_CLOEXEC) != 0) return 1;
  pthread_mutex_lock(&nv_mu);
  pid_t pid = fork();
  if (pid == 0) {   /* the child: the job, its result down the pipe, and out */
    /* only the pipe's write end stays: the read ends of earlier jobs' pipes, inherited, would
       keep their children from ever seeing the parent stop reading */
    if (fds[1] != 3) { dup2(fds[1], 3); fds[1] = 3; }
    close_range(4, ~0U, 0);
    run_job(&b->j);
    send_result(fds[1], &b->j);
    _exit(0);
  }
  pthread_mutex_unlock(&nv_mu);
  close(fds[1]);
  if (pid < 0) { close(fds[0]); return 1; }
  b->pid = pid;
  b->fd = fds[0];
  return 1;
}

static int l_nvrtc_wait(lua_State *L) {
  nvbox *b = luaL_checkudata(L, 1, NVJOB);
  if (b->taken) return cl_error(L, "cuda.compile_all", "a compile's result was taken already");
  if (!b->done && b->pid > 0) {
    const char *e = getenv("CUDALUA_COMPILE_TIMEOUT");
    double limit = e && atof(e) > 0 ? atof(e) : 900;
    deadline = now_s() + limit;
    timed_out = 0;
    int ok = read_result(b->fd, &b->j);
    b->done = ok;   /* (read: the child only exits now; not read: it is killed) */
    box_reap(b);
    if (!ok && timed_out) {
      char secs[32];
      snprintf(secs, sizeof secs, "%g", limit);
      return cl_error(L, "cuda.compile_all", "a compile's child process gave no result in %s s "
                      "(CUDALUA_COMPILE_TIMEOUT): it was killed", secs);
    }
    if (!ok) return cl_error(L, "cuda.compile_all", "a compile's child process ended without its result "
                             "(out of memory, or killed)");
  } else if (!b->done) {
    run_locked(&b->j);
  }
  b->done = 1;
  return taken(L, b);
}

/* ---- ptx_strip ---- */
static int ident_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}

typedef struct { const char *name; size_t len, line_start, line_end; int used; } pvar;

/* ptx_strip(ptx) -> ptx, number of declarations dropped. Drops the module-local .global
   variables (declared on one line, without .visible, .weak or .extern) that nothing in the
   module names. NVRTC emits every static constexpr member the headers instantiate as such
   a variable (about a thousand for <cooperative_groups.h>, libcu++'s numeric_limits and
   integral_constant members); ptxas keeps them all, and a cubin with them is 25 times the
   size and takes 30 times as long to load. In whole-program mode NVRTC also writes a plain
   __device__ variable without .visible: one no kernel uses goes too, which matters only to
   code looking globals up by name (cudalua does not). When this changes, bump PIPELINE in
   lua/cudalua/compile.lua: cached cubins were made by the old one. */
static int l_ptx_strip(lua_State *L) {
  size_t n;
  const char *s = cl_checklstring(L, 1, &n);
  size_t cap = 64, nv = 0;
  pvar *v = malloc(cap * sizeof *v);
  if (!v) return cl_error(L, NULL, "out of host memory");
  /* declarations: ".global ... NAME[...] = ...;" or ".global ... NAME;" on one line */
  for (size_t at = 0; at < n;) {
    size_t end = at;
    while (end < n && s[end] != '\n') end++;
    if (end - at > 8 && !memcmp(s + at, ".global", 7) && (s[at + 7] == ' ' || s[at + 7] == '\t')) {
      size_t stop = at, last = end;
      while (stop < end && s[stop] != '=' && s[stop] != ';' && s[stop] != '[') stop++;
      while (last > at && (s[last - 1] == ' ' || s[last - 1] == '\t' || s[last - 1] == '\r')) last--;
      size_t ne = stop;
      while (ne > at && (s[ne - 1] == ' ' || s[ne - 1] == '\t')) ne--;
      size_t nb = ne;
      while (nb > at && ident_char((unsigned char)s[nb - 1])) nb--;
      int several = memchr(s + at, ',', stop - at) != NULL;   /* ".global .u32 a, b;": kept */
      if (stop < end && last > at && s[last - 1] == ';' && nb < ne && !several) {
        if (nv == cap) {
          pvar *nv2 = realloc(v, 2 * cap * sizeof *v);
          if (!nv2) { free(v); return cl_error(L, NULL, "out of host memory"); }
          v = nv2; cap *= 2;
        }
        v[nv++] = (pvar){s + nb, ne - nb, at, end, 0};
      }
    }
    at = end + 1;
  }
  if (nv == 0) { free(v); lua_settop(L, 1); lua_pushinteger(L, 0); return 2; }
  /* an open-addressing table of the names, then every identifier of the text looked up */
  size_t tsize = 1;
  while (tsize < 2 * nv) tsize <<= 1;
  size_t *tab = calloc(tsize, sizeof *tab);   /* index + 1 into v; 0: empty */
  if (!tab) { free(v); return cl_error(L, NULL, "out of host memory"); }
  for (size_t i = 0; i < nv; i++) {
    size_t j = cl_fnv1a(CL_FNV_BASIS, v[i].name, v[i].len) & (tsize - 1);
    while (tab[j]) j = (j + 1) & (tsize - 1);
    tab[j] = i + 1;
  }
  for (size_t at = 0; at < n;) {
    if (!ident_char((unsigned char)s[at])) { at++; continue; }
    size_t b = at;
    while (at < n && ident_char((unsigned char)s[at])) at++;
    size_t j = cl_fnv1a(CL_FNV_BASIS, s + b, at - b) & (tsize - 1);
    for (; tab[j]; j = (j + 1) & (tsize - 1)) {
      pvar *p = &v[tab[j] - 1];
      if (p->len == at - b && !memcmp(p->name, s + b, p->len) && (b < p->line_start || b >= p->line_end)) p->used = 1;
    }
  }
  free(tab);
  /* the text without the unused declarations (v is in text order) */
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  size_t from = 0, dropped = 0;
  for (size_t i = 0; i < nv; i++) {
    if (v[i].used) continue;
    luaL_addlstring(&buf, s + from, v[i].line_start - from);
    from = v[i].line_end < n ? v[i].line_end + 1 : n;
    dropped++;
  }
  luaL_addlstring(&buf, s + from, n - from);
  free(v);
  luaL_pushresult(&buf);
  lua_pushinteger(L, (lua_Integer)dropped);
  return 2;
}

/* supported architectures, e.g. {75, 80, ..., 120} */
static int l_nvrtc_archs(lua_State *L) {
  cl_lib_need(L, &cl_nvrtc);
  int n = 0;
  cu.nvrtcGetNumSupportedArchs(&n);
  int *a = lua_newuserdatauv(L, sizeof(int) * (n ? n : 1), 0);
  cu.nvrtcGetSupportedArchs(a);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) { lua_pushinteger(L, a[i]); lua_rawseti(L, -2, i + 1); }
  return 1;
}

/* the CPUs this process may use (its affinity mask, as taskset or a container's cpuset set
   it): compile_all's children at once */
static int l_nprocs(lua_State *L) {
  cpu_set_t set;
  long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
  lua_pushinteger(L, n > 0 ? n : 1);
  return 1;
}

void cl_open_compile(lua_State *L) {
  lua_pushcfunction(L, l_nvrtc_compile); lua_setfield(L, -2, "nvrtc_compile");
  lua_pushcfunction(L, l_nvrtc_start); lua_setfield(L, -2, "nvrtc_start");
  lua_pushcfunction(L, l_nvrtc_wait); lua_setfield(L, -2, "nvrtc_wait");
  lua_pushcfunction(L, l_nprocs); lua_setfield(L, -2, "nprocs");
  lua_pushcfunction(L, l_nvrtc_archs); lua_setfield(L, -2, "nvrtc_archs");
  lua_pushcfunction(L, l_ptx_strip); lua_setfield(L, -2, "ptx_strip");
}
