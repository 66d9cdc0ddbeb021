/* tools/stress.c: runs tools/stress.lua in several Lua states at once, one per thread, under a
 * watchdog (make stress; tools/stress.sh runs it in child processes and counts what ended badly).
 *   build/stress [-t THREADS] [-s SECONDS] [-S SEED] [-w HANG_SECONDS] [SCRIPT]
 * Each state runs require(SCRIPT).run(seed + thread, seconds, thread) and returns its tallies;
 * the script calls beat(what) before each operation. A thread whose last beat is older than
 * HANG_SECONDS is a hang: the watchdog prints the seed, the thread and the operation, and ends
 * the process with status 3. Status 1: a state found a wrong result or raised; 0: all well.
 * The last line: "stress: seed S, T threads, N sequences, M operations, W wrong". */
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include "cudalua.h"

void cl_host_dump(void *file);   /* src/hostfn.c (linked from libcudalua.a): the queues' state */

#define MAXT 16
typedef struct {
  int id;
  long long seed;
  double seconds;
  const char *script;
  long long beat;         /* monotonic microseconds of the last beat (atomic) */
  char what[160];         /* the operation it began then */
  long long sequences, ops, wrong;
  int failed, finished;
  char error[512];
} worker;

static worker workers[MAXT];
static int nworkers;
static volatile int done;

static long long now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* stacks, as raw addresses ("bt: 0x..."): tools/stress.sh turns them into functions and lines
   with addr2line. A crash prints the faulting thread's; a hang, every worker's. */
static void print_stack(const char *what) {
  void *pc[48];
  int n = backtrace(pc, 48);
  char buf[64];
  int len = snprintf(buf, sizeof buf, "stress: stack of %s:\n", what);
  if (write(1, buf, (size_t)len) < 0) return;
  for (int i = 0; i < n; i++) {
    len = snprintf(buf, sizeof buf, "bt: %p\n", pc[i]);
    if (write(1, buf, (size_t)len) < 0) return;
  }
  backtrace_symbols_fd(pc, n, 1);   /* frames of the shared libraries: lib(+offset) */
}

static void on_crash(int sig) {
  char buf[64];
  int len = snprintf(buf, sizeof buf, "stress: CRASH: signal %d\n", sig);
  if (write(1, buf, (size_t)len) < 0) _exit(139);
  print_stack("the crashing thread");
  _exit(139);
}

static void on_dump(int sig) { (void)sig; print_stack("a worker"); }

/* beat(what): the state is alive and begins `what` */
static int l_beat(lua_State *L) {
  worker *w = lua_touserdata(L, lua_upvalueindex(1));
  const char *what = luaL_optstring(L, 1, "");
  snprintf(w->what, sizeof w->what, "%s", what);   /* read by the watchdog only for a report */
  __atomic_store_n(&w->beat, now_us(), __ATOMIC_RELAXED);
  return 0;
}

/* CUDA refuses a device-wide synchronize while any thread captures (and that capture ends):
   the states take `order` exclusively for a capture, shared for cuda.synchronize. Only try
   locks: a state waiting for the lock keeps running its host functions (stress.lua loops on
   them with a query between), so that no thread blocks while another waits for it. A capture
   waiting is served first. */
static pthread_rwlock_t order = PTHREAD_RWLOCK_INITIALIZER;
static int capture_waiting;

static int l_try_capture(lua_State *L) {
  __atomic_store_n(&capture_waiting, 1, __ATOMIC_SEQ_CST);
  int ok = pthread_rwlock_trywrlock(&order) == 0;
  if (ok) __atomic_store_n(&capture_waiting, 0, __ATOMIC_SEQ_CST);
  lua_pushboolean(L, ok);
  return 1;
}

static int l_try_sync(lua_State *L) {
  lua_pushboolean(L, !__atomic_load_n(&capture_waiting, __ATOMIC_SEQ_CST) && pthread_rwlock_tryrdlock(&order) == 0);
  return 1;
}

static int l_unlock(lua_State *L) {
  (void)L;
  pthread_rwlock_unlock(&order);
  return 0;
}

static void *run(void *p) {
  worker *w = p;
  __atomic_store_n(&w->beat, now_us(), __ATOMIC_RELAXED);
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "cudalua", luaopen_cudalua, 0);
  lua_pop(L, 1);
  lua_pushlightuserdata(L, w);
  lua_pushcclosure(L, l_beat, 1);
  lua_setglobal(L, "beat");
  lua_pushcfunction(L, l_try_capture); lua_setglobal(L, "try_capture");
  lua_pushcfunction(L, l_try_sync); lua_setglobal(L, "try_sync");
  lua_pushcfunction(L, l_unlock); lua_setglobal(L, "unlock");
  int st = luaL_dofile(L, w->script);
  if (st == LUA_OK) {
    lua_getfield(L, -1, "run");
    lua_pushinteger(L, w->seed);
    lua_pushnumber(L, w->seconds);
    lua_pushinteger(L, w->id);
    lua_pushboolean(L, nworkers == 1);   /* alone: captures may use the global mode */
    st = lua_pcall(L, 4, 1, 0);
  }
  if (st != LUA_OK) {
    w->failed = 1;
    snprintf(w->error, sizeof w->error, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(no message)");
  } else {
    lua_getfield(L, -1, "sequences"); w->sequences = lua_tointeger(L, -1); lua_pop(L, 1);
    lua_getfield(L, -1, "ops"); w->ops = lua_tointeger(L, -1); lua_pop(L, 1);
    lua_getfield(L, -1, "wrong"); w->wrong = lua_tointeger(L, -1); lua_pop(L, 1);
    lua_getfield(L, -1, "report");
    if (lua_isstring(L, -1)) snprintf(w->error, sizeof w->error, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_close(L);
  __atomic_store_n(&w->beat, now_us(), __ATOMIC_RELAXED);
  __atomic_store_n(&w->finished, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

int main(int argc, char **argv) {
  int threads = 3;
  double seconds = 20, hang = 60;
  long long seed = (long long)time(NULL);
  const char *script = "tools/stress.lua";
  int c;
  while ((c = getopt(argc, argv, "t:s:S:w:")) != -1) {
    if (c == 't') threads = atoi(optarg);
    else if (c == 's') seconds = atof(optarg);
    else if (c == 'S') seed = atoll(optarg);
    else if (c == 'w') hang = atof(optarg);
    else { fprintf(stderr, "usage: %s [-t threads] [-s seconds] [-S seed] [-w hang_seconds] [script]\n", argv[0]); return 2; }
  }
  if (optind < argc) script = argv[optind];
  if (threads < 1 || threads > MAXT) { fprintf(stderr, "stress: 1 to %d threads\n", MAXT); return 2; }
  void *warm[2];
  backtrace(warm, 2);   /* loads what backtrace needs before a handler may call it */
  signal(SIGSEGV, on_crash); signal(SIGBUS, on_crash); signal(SIGABRT, on_crash); signal(SIGFPE, on_crash);
  signal(SIGUSR1, on_dump);
  nworkers = threads;
  pthread_t t[MAXT];
  for (int i = 0; i < threads; i++) {
    workers[i] = (worker){.id = i + 1, .seed = seed * 100 + i, .seconds = seconds, .script = script};
    if (pthread_create(&t[i], NULL, run, &workers[i]) != 0) { fprintf(stderr, "stress: cannot start a thread\n"); return 2; }
  }
  /* the watchdog: this thread */
  while (__atomic_load_n(&done, __ATOMIC_SEQ_CST) < threads) {
    usleep(200000);
    long long t0 = now_us();
    for (int i = 0; i < threads; i++) {
      worker *w = &workers[i];
      long long b = __atomic_load_n(&w->beat, __ATOMIC_RELAXED);
      if (b && !__atomic_load_n(&w->finished, __ATOMIC_SEQ_CST) && t0 - b > (long long)(hang * 1e6)) {
        printf("stress: HANG: seed %lld, thread %d (its seed %lld), no progress for %.0f s in: %s\n", seed, w->id,
               w->seed, (t0 - b) / 1e6, w->what);
        for (int j = 0; j < threads; j++)
          printf("  thread %d: last began %s, %.1f s ago\n", workers[j].id, workers[j].what,
                 (t0 - __atomic_load_n(&workers[j].beat, __ATOMIC_RELAXED)) / 1e6);
        cl_host_dump(stdout);
        fflush(stdout);
        for (int j = 0; j < threads; j++) {   /* each worker prints its stack */
          printf("stress: thread %d:\n", workers[j].id);
          fflush(stdout);
          pthread_kill(t[j], SIGUSR1);
          usleep(300000);
        }
        if (getenv("STRESS_GDB")) {   /* every thread's stack, where gdb is at hand */
          char cmd[200];
          snprintf(cmd, sizeof cmd, "gdb -batch -p %d -ex 'thread apply all bt 12' 2>/dev/null | grep -E '^(#|Thread)'", (int)getpid());
          if (system(cmd) != 0) printf("  (no gdb)\n");
        }
        _exit(3);
      }
    }
  }
  long long seqs = 0, ops = 0, wrong = 0;
  int failed = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    worker *w = &workers[i];
    seqs += w->sequences; ops += w->ops; wrong += w->wrong;
    if (w->failed) { failed = 1; printf("stress: thread %d (seed %lld) raised: %s\n", w->id, w->seed, w->error); }
    else if (w->wrong) printf("stress: thread %d (seed %lld): %s\n", w->id, w->seed, w->error);
  }
  printf("stress: seed %lld, %d threads, %lld sequences, %lld operations, %lld wrong%s\n", seed, threads, seqs,
         ops, wrong, failed ? ", a state raised" : "");
  return failed || wrong ? 1 : 0;
}
