/* spec/support/nccl_stand_in.c: a stand-in for libnccl.so.2, so that cudalua's waits for NCCL,
   its timeouts and its watchdog run without a GPU (spec/45-nccl_timeouts_spec.lua loads it with
   CUDALUA_NCCL on the CPU device; cudalua.nccl accepts the CPU device for a library that
   exports cudalua_nccl_stand_in). Nothing is communicated: a "collective" copies send to recv
   at once. How it misbehaves comes from STAND_IN:
     ok             everything succeeds
     init_hang      the init never finishes (ncclInProgress for ever, as with a rank that never joins)
     call_hang      every collective stays in progress (a connection to a dead peer)
     remote_error   NCCL reports ncclRemoteError once STAND_IN_AFTER seconds have passed since
                    the first collective (a peer's connection closed)
   Each call is logged to STAND_IN_LOG (a file), one name per line, so that the spec sees what
   cudalua called (the abort, above all). Built by the spec: cc -shared -fPIC. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct stand_in_comm { int rank, size, aborted; } *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *cudaStream_t;
enum { OK = 0, REMOTE = 6, IN_PROGRESS = 7, INVALID_ARGUMENT = 4 };

static double first_call = -1;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *mode(void) {
  const char *m = getenv("STAND_IN");
  return m ? m : "ok";
}

static void logged(const char *what) {
  const char *path = getenv("STAND_IN_LOG");
  FILE *f = path ? fopen(path, "a") : NULL;
  if (f) { fprintf(f, "%s\n", what); fclose(f); }
}

int cudalua_nccl_stand_in(void) { return 1; }
int ncclGetVersion(int *v) { *v = 22800; return OK; }
int ncclGetUniqueId(ncclUniqueId *id) { memset(id, 7, sizeof *id); return OK; }
const char *ncclGetErrorString(int r) { return r == REMOTE ? "remote process exited or there was a network error" : r == IN_PROGRESS ? "operation in progress" : "stand-in error"; }
const char *ncclGetLastError(ncclComm_t c) { (void)c; return "stand-in: the peer is gone"; }

static int init(ncclComm_t *c, int n, int rank) {
  *c = calloc(1, sizeof **c);
  (*c)->rank = rank, (*c)->size = n;
  logged("init");
  return strcmp(mode(), "init_hang") == 0 ? IN_PROGRESS : OK;
}
int ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank) { (void)id; return init(c, n, rank); }
int ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int rank, void *cfg) { (void)id; (void)cfg; return init(c, n, rank); }
int ncclCommInitAll(ncclComm_t *c, int n, const int *devs) { (void)devs; for (int i = 0; i < n; i++) init(&c[i], n, i); return OK; }

int ncclCommGetAsyncError(ncclComm_t c, int *e) {
  (void)c;
  const char *m = mode();
  if (strcmp(m, "init_hang") == 0 || strcmp(m, "call_hang") == 0) *e = IN_PROGRESS;
  else if (strcmp(m, "remote_error") == 0 && first_call >= 0 &&
           now() - first_call > atof(getenv("STAND_IN_AFTER") ? getenv("STAND_IN_AFTER") : "0.3")) *e = REMOTE;
  else *e = OK;
  return OK;
}
int ncclCommAbort(ncclComm_t c) { logged("abort"); free(c); return OK; }
int ncclCommDestroy(ncclComm_t c) { logged("destroy"); free(c); return OK; }
int ncclCommFinalize(ncclComm_t c) { (void)c; logged("finalize"); return OK; }
int ncclCommCount(ncclComm_t c, int *n) { *n = c->size; return OK; }
int ncclCommUserRank(ncclComm_t c, int *r) { *r = c->rank; return OK; }
int ncclGroupStart(void) { return OK; }
int ncclGroupEnd(void) { return strcmp(mode(), "call_hang") == 0 ? IN_PROGRESS : OK; }

/* a collective: the data copied at once (the CPU device's memory is the host's) */
static int collective(const void *s, void *r, size_t bytes) {
  if (first_call < 0) first_call = now();
  logged("collective");
  if (s && r && s != r) memmove(r, s, bytes);
  return strcmp(mode(), "call_hang") == 0 ? IN_PROGRESS : OK;
}
static size_t width(int t) { return t <= 1 ? 1 : t == 2 || t == 3 || t == 7 ? 4 : t == 6 || t == 9 ? 2 : 8; }
int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, ncclComm_t c, cudaStream_t h) { (void)op; (void)c; (void)h; return collective(s, r, n * width(t)); }
int ncclBroadcast(const void *s, void *r, size_t n, int t, int root, ncclComm_t c, cudaStream_t h) { (void)root; (void)c; (void)h; return collective(s, r, n * width(t)); }
int ncclReduce(const void *s, void *r, size_t n, int t, int op, int root, ncclComm_t c, cudaStream_t h) { (void)op; (void)root; (void)c; (void)h; return collective(s, r, n * width(t)); }
int ncclAllGather(const void *s, void *r, size_t n, int t, ncclComm_t c, cudaStream_t h) { (void)c; (void)h; return collective(s, r, n * width(t)); }
int ncclReduceScatter(const void *s, void *r, size_t n, int t, int op, ncclComm_t c, cudaStream_t h) { (void)op; (void)c; (void)h; return collective(s, r, n * width(t)); }
int ncclSend(const void *s, size_t n, int t, int peer, ncclComm_t c, cudaStream_t h) { (void)peer; (void)c; (void)h; return collective(s, NULL, n * width(t)); }
int ncclRecv(void *r, size_t n, int t, int peer, ncclComm_t c, cudaStream_t h) { (void)peer; (void)c; (void)h; return collective(NULL, r, n * width(t)); }
