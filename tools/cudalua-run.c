/* tools/cudalua-run.c: the job launcher (issue 30), in the manner of torchrun's --nproc-per-node
 * and mpirun's host list (make builds it as build/cudalua-run; make install puts it in bin/).
 *   cudalua-run -n N [--nnodes M --node-rank K] [--master-addr A] [--master-port P]
 *               [--hosts h1,h2,...] [--lua PROGRAM] [--grace SECONDS] [--no-prefix]
 *               script.lua [args...]
 * starts N ranks of `LUA script.lua args...`, each with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and CUDALUA_RUN=1 in its environment.
 * Other launchers' variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK...) are left as
 * they are: a script reading them should give RANK priority.
 *
 * Why C: a launcher is process handling that Lua's standard library lacks (fork and exec,
 * process groups, pipes read together with poll, waitpid, signals caught and passed on); a Lua
 * launcher would need a POSIX rock, and still could not catch the signals meant for the job.
 * So it is a program of its own, with no Lua linked.
 *
 * How it works:
 * - each rank is a child in a process group of its own (setpgid), so that a signal to the group
 *   also reaches what the rank started (a shell, a compiler, a sleep), and a Ctrl-C at the
 *   terminal reaches the launcher alone, which passes it on. Ranks read /dev/null (a rank
 *   outside the terminal's foreground group that read it would be stopped).
 * - one loop waits in poll on every rank's stdout and stderr pipes and on a self-pipe written by
 *   the signal handlers (SIGCHLD, SIGINT, SIGTERM, SIGHUP): no sleeps, no polling in the
 *   normal path, so 4 ranks of a trivial script cost a few milliseconds beyond their own time.
 * - output is cut into lines, each written behind its rank's prefix "[rank R] "; the lines of
 *   one read go out in one write, so lines of different ranks never mix. A last line without
 *   a newline gets one when its pipe closes; a line over MAX_LINE bytes is cut.
 * - the first rank to fail (a non-zero status or a signal) is reported on stderr, every other
 *   rank's group gets SIGTERM and, --grace seconds later, what is left gets SIGKILL; the
 *   launcher exits with that rank's status (128 + the signal for a signal). SIGINT, SIGTERM or
 *   SIGHUP sent to the launcher go to every rank's group the same way and it exits 128 + the
 *   signal; a second such signal kills at once.
 * - it never hangs on a pipe: a rank's pipes are read until end of file, but only DRAIN_S more
 *   after the rank exited (a background child of the rank may hold them forever). The group of
 *   a rank whose pipes outlived it is ended with the job (SIGTERM, SIGKILL after the grace).
 * - --hosts h1,h2: one child per host, `$CUDALUA_RUN_SSH host 'cd DIR && exec cudalua-run -n N
 *   --nnodes M --node-rank i ... --stdin-stop -- script args'`, whose output the far launcher
 *   has prefixed already. Each node's stdin is a pipe this launcher holds: closing it is how a
 *   node is told to stop (--stdin-stop), which also works when this launcher dies, where a
 *   signal to ssh would leave the far side running. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define MAX_NPROC 1024
#define MAX_NNODES 65536
#define HOSTS_PORT "29500"     /* MASTER_PORT with --hosts: no free port can be found for all */
#define DRAIN_S 0.5            /* how long a rank's pipes are read after it exited */
#define NODE_MARGIN_S 2.0      /* --hosts: time beyond the grace for the nodes' own grace */
#define LINGER_POLL_S 0.02     /* while waiting for what a finished rank left running */
#define MAX_LINE (64 * 1024)   /* a line longer than this is written in pieces */
#define READ_CHUNK (16 * 1024)

/* ---- options ---- */

typedef struct {
  int nproc, nnodes, node_rank;
  int nnodes_given, node_rank_given;
  const char *master_addr, *master_port, *hosts, *lua, *grace_text;
  double grace;
  int prefix;          /* 0 with --no-prefix */
  int stdin_stop;      /* --stdin-stop: a node started through --hosts */
  char **script;       /* the script and its arguments: the end of argv */
} options;

static options opt = {.nnodes = 1, .grace = 5, .grace_text = "5", .prefix = 1};

static const char usage_text[] =
  "usage: cudalua-run -n N [options] script.lua [args...]\n"
  "Starts N ranks of `lua script.lua args...`, each with RANK, WORLD_SIZE, LOCAL_RANK,\n"
  "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and CUDALUA_RUN=1 set; prefixes\n"
  "their output lines with [rank R]; when one fails, stops the others and exits with its status.\n"
  "  -n, --nproc-per-node N    ranks on this node (1 to 1024)\n"
  "  --nnodes M --node-rank K  this is node K of M: its ranks are K*N to K*N+N-1\n"
  "  --master-addr A           MASTER_ADDR (default 127.0.0.1; with --hosts, the first host)\n"
  "  --master-port P           MASTER_PORT (default: a free port; must be given with several\n"
  "                            nodes; 29500 with --hosts)\n"
  "  --hosts h1,h2,...         one node per host, each started by `$CUDALUA_RUN_SSH host ...`\n"
  "                            (default ssh) running `$CUDALUA_RUN_REMOTE` (default cudalua-run)\n"
  "  --lua PROGRAM             the interpreter (default $CUDALUA_LUA, else lua5.4, else lua)\n"
  "  --grace SECONDS           how long stopping ranks get before SIGKILL (default 5)\n"
  "  --no-prefix               no [rank R] before the lines\n"
  "  --stdin-stop              stop the ranks when stdin closes (how --hosts nodes are stopped)\n"
  "  -h, --help                this text\n";

static void usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("cudalua-run: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputs("\nrun 'cudalua-run --help' for the usage\n", stderr);
  va_end(ap);
  exit(2);
}

/* does argument a name the option (alone, or as name=value)? */
static int is(const char *a, const char *name) {
  size_t n = strlen(name);
  return !strncmp(a, name, n) && (a[n] == 0 || a[n] == '=');
}

/* the value of the option at argv[*i], from "name=value" or the next argument (*i moves on) */
static const char *value_of(char **argv, int *i, const char *name) {
  const char *a = argv[*i] + strlen(name);
  if (*a == '=') return a + 1;
  if (!argv[*i + 1]) usage_error("option %s needs a value", name);
  return argv[++*i];
}

static int whole(const char *s, const char *name, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi)
    usage_error("%s must be a whole number from %ld to %ld, got '%s'", name, lo, hi, s);
  return (int)v;
}

static void set_grace(const char *s) {
  char *end;
  double g = strtod(s, &end);
  if (!*s || *end || !(g >= 0 && g <= 86400)) usage_error("--grace must be a number of seconds from 0 to 86400, got '%s'", s);
  opt.grace = g;
  opt.grace_text = s;
}

/* one option at argv[i]; returns the index of the next argument */
static int parse_option(char **argv, int i) {
  const char *a = argv[i];
#define VALUE(name) value_of(argv, &i, name)
  if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage_text, stdout); exit(0); }
  else if (!strcmp(a, "--no-prefix")) opt.prefix = 0;
  else if (!strcmp(a, "--stdin-stop")) opt.stdin_stop = 1;
  else if (is(a, "-n")) opt.nproc = whole(VALUE("-n"), "-n", 1, MAX_NPROC);
  else if (is(a, "--nproc-per-node")) opt.nproc = whole(VALUE("--nproc-per-node"), "--nproc-per-node", 1, MAX_NPROC);
  else if (is(a, "--nnodes")) { opt.nnodes = whole(VALUE("--nnodes"), "--nnodes", 1, MAX_NNODES); opt.nnodes_given = 1; }
  else if (is(a, "--node-rank")) { opt.node_rank = whole(VALUE("--node-rank"), "--node-rank", 0, MAX_NNODES - 1); opt.node_rank_given = 1; }
  else if (is(a, "--master-addr")) opt.master_addr = VALUE("--master-addr");
  else if (is(a, "--master-port")) whole(opt.master_port = VALUE("--master-port"), "--master-port", 1, 65535);
  else if (is(a, "--hosts")) opt.hosts = VALUE("--hosts");
  else if (is(a, "--lua")) opt.lua = VALUE("--lua");
  else if (is(a, "--grace")) set_grace(VALUE("--grace"));
  else usage_error("unknown option '%s'", a);
#undef VALUE
  return i + 1;
}

/* --hosts: the node count is the hosts', the first host is the master unless told otherwise */
static void check_hosts(void) {
  int n = 1;
  for (const char *p = opt.hosts; *p; p++) n += *p == ',';
  if (strstr(opt.hosts, ",,") || opt.hosts[0] == ',' || opt.hosts[0] == 0 || opt.hosts[strlen(opt.hosts) - 1] == ',')
    usage_error("--hosts has an empty host name: '%s'", opt.hosts);
  if (n > MAX_NNODES) usage_error("--hosts names more than %d hosts", MAX_NNODES);
  if (opt.hosts[0] == '-' || strstr(opt.hosts, ",-")) usage_error("--hosts has a host name beginning with '-': '%s'", opt.hosts);
  if (opt.nnodes_given && opt.nnodes != n) usage_error("--nnodes %d but --hosts names %d hosts", opt.nnodes, n);
  if (opt.node_rank_given) usage_error("--node-rank is not for --hosts (each host's node rank is its place in the list)");
  if (opt.stdin_stop) usage_error("--stdin-stop is not for --hosts");
  opt.nnodes = n;
  if (!opt.master_addr) opt.master_addr = strndup(opt.hosts, strcspn(opt.hosts, ","));
  if (!opt.master_port) opt.master_port = HOSTS_PORT;
}

static void parse_args(int argc, char **argv) {
  int i = 1;
  while (i < argc && argv[i][0] == '-' && argv[i][1]) {
    if (!strcmp(argv[i], "--")) { i++; break; }
    i = parse_option(argv, i);
  }
  if (!opt.nproc) usage_error("-n N is needed: the number of ranks to start on this node");
  if (i >= argc) usage_error("no script given: the Lua script every rank runs");
  opt.script = argv + i;
  if (opt.hosts) check_hosts();
  if (opt.node_rank >= opt.nnodes) usage_error("--node-rank %d must be below --nnodes %d", opt.node_rank, opt.nnodes);
  if (opt.nnodes > 1 && !opt.master_port)
    usage_error("--master-port is needed with several nodes (--nnodes %d): every node must be given the same one", opt.nnodes);
}

/* ---- defaults found on this machine ---- */

static int on_path(const char *prog) {
  const char *p = getenv("PATH");
  char file[PATH_MAX];
  for (p = p ? p : "/usr/bin:/bin";; p++) {
    size_t n = strcspn(p, ":");
    snprintf(file, sizeof file, "%.*s/%s", n ? (int)n : 1, n ? p : ".", prog);
    if (access(file, X_OK) == 0) return 1;
    p += n;
    if (!*p) return 0;
  }
}

/* a port no one listens on now, on the loopback: binding port 0 makes the system choose one */
static const char *free_port(void) {
  static char text[8];
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) || getsockname(s, (struct sockaddr *)&sa, &len)) {
    fprintf(stderr, "cudalua-run: cannot find a free port on 127.0.0.1 (%s): give --master-port\n", strerror(errno));
    exit(1);
  }
  close(s);
  snprintf(text, sizeof text, "%u", (unsigned)ntohs(sa.sin_port));
  return text;
}

static void find_defaults(void) {
  const char *env = getenv("CUDALUA_LUA");
  if (!opt.lua) opt.lua = env && *env ? env : on_path("lua5.4") ? "lua5.4" : "lua";
  if (!opt.master_addr) opt.master_addr = "127.0.0.1";
  if (!opt.master_port) opt.master_port = free_port();
}

/* ---- children and their output ---- */

typedef struct {
  int fd;              /* the pipe's read end, -1 once closed */
  int to;              /* where its lines go: 1 or 2 */
  char *buf;           /* what was read and not written: the start of a line */
  size_t len, cap;
} stream;

typedef struct {
  pid_t pid;           /* 0 once reaped */
  pid_t pgid;          /* its process group (its pid) */
  int id;              /* the global rank; with --hosts, the node's place in the list */
  char host[256];      /* --hosts: the node's host */
  char prefix[32];     /* "[rank R] ", or "" */
  stream out, err;
  int stdin_fd;        /* --hosts: the write end of the node's stdin, -1 once closed */
  double exited_at;    /* when it was reaped (monotonic seconds), 0 before */
  int lingering;       /* its pipes outlived it: its group may still hold processes */
} child;

static child *kids;
static int nkids;
static int stopping;        /* the children were told to stop */
static int killed;          /* what was left got SIGKILL */
static double kill_at;      /* when what is left gets SIGKILL; 0 when not pending */
static int result = -1;     /* the exit status, fixed by the first failure or stop */
static int stdin_open;      /* --stdin-stop: stdin has not reached its end */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the children started so far are killed: nothing of the job outlives a launcher that gives up */
static void fatal(const char *what) {
  fprintf(stderr, "cudalua-run: %s: %s\n", what, strerror(errno));
  for (int i = 0; i < nkids; i++)
    if (kids[i].pid) kill(-kids[i].pgid, SIGKILL);
  exit(1);
}

static void *grow(void *p, size_t n) {
  p = realloc(p, n);
  if (!p) fatal("out of memory");
  return p;
}

/* all of buf to fd. An output whose reader is gone (EPIPE) or that fails drops what comes:
   the job goes on (a node's launcher whose ssh died learns it from its stdin) */
static void put(int fd, const char *buf, size_t n) {
  static int broken[3];
  while (n && !broken[fd]) {
    ssize_t w = write(fd, buf, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {   /* an output left non-blocking by whoever gave it */
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      poll(&p, 1, -1);
      continue;
    }
    if (w <= 0) { broken[fd] = 1; return; }
    buf += w;
    n -= (size_t)w;
  }
}

/* the first n bytes of s->buf are whole lines (the last one given a newline when it has none):
   each goes out behind the child's prefix, all in one write; the rest moves to the front */
static void write_lines(child *c, stream *s, size_t n) {
  static char *out;
  static size_t cap;
  size_t plen = strlen(c->prefix), lines = 1;
  for (const char *p = s->buf; (p = memchr(p, '\n', s->buf + n - p)); p++) lines++;
  size_t need = n + lines * (plen + 1);
  if (need > cap) out = grow(out, cap = need);
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    const char *nl = memchr(s->buf + i, '\n', n - i);
    size_t end = nl ? (size_t)(nl - s->buf) : n;
    memcpy(out + o, c->prefix, plen);
    memcpy(out + o + plen, s->buf + i, end - i);
    o += plen + end - i;
    out[o++] = '\n';
    i = end + 1;
  }
  put(s->to, out, o);
  memmove(s->buf, s->buf + n, s->len - n);
  s->len -= n;
}

/* the whole lines read so far; all of it when the pipe is done (final) or a line is too long */
static void flush_lines(child *c, stream *s, int final) {
  size_t n = s->len;
  while (n && s->buf[n - 1] != '\n') n--;
  if (final || s->len - n > MAX_LINE) n = s->len;
  if (n) write_lines(c, s, n);
}

static void close_stream(child *c, stream *s) {
  if (s->fd < 0) return;
  flush_lines(c, s, 1);
  close(s->fd);
  s->fd = -1;
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
}

/* one read of what the pipe holds now; at its end or on an error it is closed. Returns
   whether something was read. */
static int read_stream(child *c, stream *s) {
  for (;;) {
    if (s->cap - s->len < READ_CHUNK / 2) s->buf = grow(s->buf, s->cap = s->len + READ_CHUNK);
    ssize_t r = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return 0;
    if (r <= 0) { close_stream(c, s); return 0; }
    s->len += (size_t)r;
    flush_lines(c, s, 0);
    return 1;
  }
}

/* what a child that exited left in its pipes (a bounded number of reads: something it left
   running may still be writing) */
static void drain(child *c, stream *s) {
  for (int i = 0; i < 64 && s->fd >= 0 && read_stream(c, s); i++) {}
}

/* ---- signals: the handlers only note them and wake the loop (the self-pipe) ---- */

static int wake[2];
static volatile sig_atomic_t got_chld, got_sig, sig_count;
static const int caught[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE};
#define NCAUGHT (int)(sizeof caught / sizeof caught[0])
static struct sigaction found[NCAUGHT];   /* as the launcher found them: restored in children */

static void on_signal(int sig) {
  int e = errno;
  if (sig == SIGCHLD) got_chld = 1;
  else { got_sig = sig; sig_count++; }
  ssize_t r = write(wake[1], "", 1);   /* full: a wake-up is pending anyway */
  (void)r;
  errno = e;
}

static const char *signame(int sig) {
  static char text[16];
  static const struct { int sig; const char *name; } names[] = {
    {SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"}, {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].sig == sig) return names[i].name;
  snprintf(text, sizeof text, "%d", sig);
  return text;
}

static void cloexec_pipe(int fds[2], int nonblock_read, int nonblock_write) {
  if (pipe(fds)) fatal("pipe");
  for (int i = 0; i < 2; i++) fcntl(fds[i], F_SETFD, FD_CLOEXEC);
  if (nonblock_read) fcntl(fds[0], F_SETFL, O_NONBLOCK);
  if (nonblock_write) fcntl(fds[1], F_SETFL, O_NONBLOCK);
}

/* a signal ignored when the launcher started (nohup, a shell's background job) stays ignored;
   SIGPIPE is ignored so that a reader gone from stdout is a failed write, not the launcher's
   death */
static void install_signals(void) {
  cloexec_pipe(wake, 1, 1);
  for (int i = 0; i < NCAUGHT; i++) {
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(caught[i], NULL, &found[i]);
    if (caught[i] == SIGPIPE) sa.sa_handler = SIG_IGN;
    else if (caught[i] == SIGCHLD) sa.sa_flags |= SA_NOCLDSTOP;
    else if (found[i].sa_handler == SIG_IGN) continue;
    sigaction(caught[i], &sa, NULL);
  }
#ifdef __linux__
  /* what a rank leaves running when it exits becomes the launcher's child, not init's, and the
     launcher reaps it when it ends: a group found alive (kill(-pgid, 0)) then holds more than
     zombies, even where init does not reap */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
}

/* ---- starting the children ---- */

static struct rlimit fd_limit;   /* as the launcher found it: restored in children */
static int fd_limit_raised;

/* two pipes a rank: 1024 ranks need more descriptors than the usual soft limit of 1024 */
static void raise_fd_limit(void) {
  if (getrlimit(RLIMIT_NOFILE, &fd_limit)) return;
  struct rlimit more = fd_limit;
  more.rlim_cur = more.rlim_max;
  fd_limit_raised = setrlimit(RLIMIT_NOFILE, &more) == 0;
}

static void set_num(const char *name, long v) {
  char text[24];
  snprintf(text, sizeof text, "%ld", v);
  setenv(name, text, 1);
}

/* in a rank's process, before exec (the launcher has one thread: setenv is safe here) */
static void set_rank_env(const child *c) {
  set_num("RANK", c->id);
  set_num("WORLD_SIZE", (long)opt.nnodes * opt.nproc);
  set_num("LOCAL_RANK", c->id - (long)opt.node_rank * opt.nproc);
  set_num("LOCAL_WORLD_SIZE", opt.nproc);
  set_num("GROUP_RANK", opt.node_rank);
  setenv("MASTER_ADDR", opt.master_addr, 1);
  setenv("MASTER_PORT", opt.master_port, 1);
  setenv("CUDALUA_RUN", "1", 1);
}

/* the child's side of fork: a group of its own, the pipes, the signals as the launcher found
   them, then the program. An exec that fails says why on the rank's stderr, exits 127. */
static void exec_child(const child *c, char **argv, int in, int out, int err, const sigset_t *mask) {
  setpgid(0, 0);
  for (int i = 0; i < NCAUGHT; i++) sigaction(caught[i], &found[i], NULL);
  if (fd_limit_raised) setrlimit(RLIMIT_NOFILE, &fd_limit);
  sigprocmask(SIG_SETMASK, mask, NULL);
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(127);
  if (!opt.hosts) set_rank_env(c);
  execvp(argv[0], argv);
  dprintf(2, "cudalua-run: cannot run %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

/* forks and execs argv for child c with stdin from fd in. Signals are blocked across the fork,
   so that the child cannot run the launcher's handler (writing to its self-pipe) before exec. */
static void spawn(child *c, char **argv, int in) {
  int out[2], err[2];
  cloexec_pipe(out, 1, 0);
  cloexec_pipe(err, 1, 0);
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  pid_t pid = fork();
  if (pid == 0) exec_child(c, argv, in, out[1], err[1], &old);
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) fatal("fork");
  setpgid(pid, pid);   /* also here: a signal sent to the group right after fork must find it */
  c->pid = c->pgid = pid;
  close(out[1]);
  close(err[1]);
  c->out = (stream){.fd = out[0], .to = 1};
  c->err = (stream){.fd = err[0], .to = 2};
  c->stdin_fd = -1;
}

static void start_ranks(void) {
  int nargs = 0;
  while (opt.script[nargs]) nargs++;
  char **argv = grow(NULL, (nargs + 2) * sizeof *argv);
  argv[0] = (char *)opt.lua;
  memcpy(argv + 1, opt.script, (nargs + 1) * sizeof *argv);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) fatal("/dev/null");
  kids = grow(NULL, opt.nproc * sizeof *kids);
  for (int i = 0; i < opt.nproc; i++) {
    child *c = &kids[nkids];
    memset(c, 0, sizeof *c);
    c->id = opt.node_rank * opt.nproc + i;
    if (opt.prefix) snprintf(c->prefix, sizeof c->prefix, "[rank %d] ", c->id);
    spawn(c, argv, devnull);
    nkids++;
  }
  close(devnull);
  free(argv);
}

/* ---- --hosts: a launcher per host, through ssh ---- */

typedef struct {
  char *p;
  size_t len, cap;
} text;

static void add(text *t, const char *s) {
  size_t n = strlen(s);
  if (t->len + n + 1 > t->cap) t->p = grow(t->p, t->cap = 2 * (t->len + n + 1));
  memcpy(t->p + t->len, s, n + 1);
  t->len += n;
}

/* a word for the far shell: in single quotes, each ' as '\'' */
static void add_word(text *t, const char *w) {
  char one[2] = {0};
  add(t, " '");
  for (; *w; w++) {
    one[0] = *w;
    add(t, *w == '\'' ? "'\\''" : one);
  }
  add(t, "'");
}

/* what the far shell runs: there, in this directory (a shared file system, as mpirun assumes),
   the launcher with this one's options and node i's rank. $CUDALUA_RUN_REMOTE goes unquoted:
   a path with ~ or a command with its own arguments. */
static char *remote_command(int node) {
  text t = {0};
  char num[24], cwd[PATH_MAX];
  const char *remote = getenv("CUDALUA_RUN_REMOTE");
  if (getcwd(cwd, sizeof cwd)) { add(&t, "cd"); add_word(&t, cwd); add(&t, " && "); }
  add(&t, "exec ");
  add(&t, remote && *remote ? remote : "cudalua-run");
  snprintf(num, sizeof num, "%d", opt.nproc);
  add_word(&t, "-n"); add_word(&t, num);
  snprintf(num, sizeof num, "%d", opt.nnodes);
  add_word(&t, "--nnodes"); add_word(&t, num);
  snprintf(num, sizeof num, "%d", node);
  add_word(&t, "--node-rank"); add_word(&t, num);
  add_word(&t, "--master-addr"); add_word(&t, opt.master_addr);
  add_word(&t, "--master-port"); add_word(&t, opt.master_port);
  add_word(&t, "--grace"); add_word(&t, opt.grace_text);
  if (opt.lua) { add_word(&t, "--lua"); add_word(&t, opt.lua); }
  if (!opt.prefix) add_word(&t, "--no-prefix");
  add_word(&t, "--stdin-stop");
  add_word(&t, "--");
  for (char **a = opt.script; *a; a++) add_word(&t, *a);
  return t.p;
}

/* $CUDALUA_RUN_SSH (default ssh) split at blanks, then the host and the command: argv */
static char **ssh_argv(char *ssh, const char *host, char *command) {
  int n = 0;
  char **argv = grow(NULL, (strlen(ssh) / 2 + 4) * sizeof *argv);
  for (char *w = strtok(ssh, " \t"); w; w = strtok(NULL, " \t")) argv[n++] = w;
  if (!n) argv[n++] = "ssh";
  argv[n++] = (char *)host;
  argv[n++] = command;
  argv[n] = NULL;
  return argv;
}

static void start_nodes(void) {
  const char *env = getenv("CUDALUA_RUN_SSH");
  kids = grow(NULL, opt.nnodes * sizeof *kids);
  const char *h = opt.hosts;
  for (int i = 0; i < opt.nnodes; i++, h += strcspn(h, ",") + 1) {
    child *c = &kids[nkids];
    memset(c, 0, sizeof *c);
    c->id = i;
    snprintf(c->host, sizeof c->host, "%.*s", (int)strcspn(h, ","), h);
    char *ssh = strdup(env && *env ? env : "ssh"), *command = remote_command(i);
    char **argv = ssh_argv(ssh, c->host, command);
    int in[2];
    cloexec_pipe(in, 0, 0);
    spawn(c, argv, in[0]);
    close(in[0]);
    c->stdin_fd = in[1];
    nkids++;
    free(argv);
    free(command);
    free(ssh);
  }
}

/* ---- stopping ---- */

static int group_alive(const child *c) {
  return c->pid || (c->lingering && kill(-c->pgid, 0) == 0);
}

/* a rank's group gets the signal; a node is told by closing its stdin (its launcher then stops
   its ranks the same way) */
static void tell_stop(child *c, int sig) {
  if (opt.hosts) {
    if (c->stdin_fd >= 0) close(c->stdin_fd);
    c->stdin_fd = -1;
  } else if (group_alive(c)) {
    kill(-c->pgid, sig);
  }
}

static void begin_stop(int sig) {
  if (stopping) return;
  stopping = 1;
  kill_at = now() + opt.grace + (opt.hosts ? NODE_MARGIN_S : 0);
  for (int i = 0; i < nkids; i++) tell_stop(&kids[i], sig);
}

static void kill_rest(void) {
  for (int i = 0; i < nkids; i++)
    if (group_alive(&kids[i])) kill(-kids[i].pgid, SIGKILL);
  killed = 1;
  kill_at = 0;
}

/* a signal to the launcher, or (--stdin-stop) the end of its stdin: passed on; a second one
   kills what is left at once */
static void stop_for(int sig, const char *why) {
  if (stopping) {
    if (!killed) kill_rest();
    return;
  }
  if (result < 0) result = 128 + sig;
  fprintf(stderr, "cudalua-run: %s: stopping the %s\n", why, opt.hosts ? "nodes" : "ranks");
  begin_stop(sig);
}

static void report(const child *c, int st) {
  char who[300];
  if (opt.hosts) snprintf(who, sizeof who, "node %d (%s)", c->id, c->host);
  else snprintf(who, sizeof who, "rank %d", c->id);
  if (WIFSIGNALED(st)) fprintf(stderr, "cudalua-run: %s was killed by signal %s\n", who, signame(WTERMSIG(st)));
  else fprintf(stderr, "cudalua-run: %s exited with status %d\n", who, WEXITSTATUS(st));
}

/* its output is written first (it is in the pipes already), then the verdict. The first
   failure, before any stop, stops the others and is the launcher's status. */
static void child_exited(child *c, int st) {
  c->pid = 0;
  c->exited_at = now();
  drain(c, &c->out);
  drain(c, &c->err);
  if (c->out.fd >= 0 || c->err.fd >= 0) c->lingering = 1;
  int code = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  if (code == 0 || stopping) return;
  report(c, st);
  result = code;
  begin_stop(SIGTERM);
}

/* every child that ended; those of no rank are what ranks left running (the subreaper) */
static void reap(void) {
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
    for (int i = 0; i < nkids; i++)
      if (kids[i].pid == pid) { child_exited(&kids[i], st); break; }
}

/* ---- the loop ---- */

/* every child reaped and every pipe closed. What the ranks left running in their groups is
   then stopped (SIGTERM, and SIGKILL after the grace) and waited for: the job ends with it. */
static int job_over(void) {
  for (int i = 0; i < nkids; i++)
    if (kids[i].pid || kids[i].out.fd >= 0 || kids[i].err.fd >= 0) return 0;
  for (int i = 0; i < nkids; i++)
    if (group_alive(&kids[i])) {
      begin_stop(SIGTERM);
      return killed;
    }
  return 1;
}

static int draining(const child *c) {
  return !c->pid && (c->out.fd >= 0 || c->err.fd >= 0);
}

/* the pipes of children gone for DRAIN_S are closed; SIGKILL once the grace is over */
static void check_times(void) {
  double t = now();
  for (int i = 0; i < nkids; i++)
    if (draining(&kids[i]) && t >= kids[i].exited_at + DRAIN_S) {
      close_stream(&kids[i], &kids[i].out);
      close_stream(&kids[i], &kids[i].err);
    }
  if (kill_at && t >= kill_at) kill_rest();
}

/* poll's timeout (ms): until the next of those times, -1 when none is pending; while stopping,
   short, to see the groups of finished ranks end (kill(-pgid, 0) tells no event) */
static int poll_timeout(void) {
  double t = now(), next = kill_at ? kill_at : -1;
  for (int i = 0; i < nkids; i++)
    if (draining(&kids[i]) && (next < 0 || kids[i].exited_at + DRAIN_S < next)) next = kids[i].exited_at + DRAIN_S;
  if (stopping && !killed && (next < 0 || t + LINGER_POLL_S < next)) next = t + LINGER_POLL_S;
  if (next < 0) return -1;
  return next <= t ? 0 : (int)((next - t) * 1000) + 1;
}

/* the self-pipe, stdin with --stdin-stop, and every open pipe; where[k] says whose fds[k] is */
static int gather(struct pollfd *fds, stream **where, child **whose) {
  int n = 0;
  fds[n++] = (struct pollfd){.fd = wake[0], .events = POLLIN};
  if (opt.stdin_stop && stdin_open) fds[n++] = (struct pollfd){.fd = 0, .events = POLLIN};
  for (int i = 0; i < nkids; i++) {
    stream *ss[2] = {&kids[i].out, &kids[i].err};
    for (int j = 0; j < 2; j++)
      if (ss[j]->fd >= 0) {
        where[n] = ss[j];
        whose[n] = &kids[i];
        fds[n++] = (struct pollfd){.fd = ss[j]->fd, .events = POLLIN};
      }
  }
  return n;
}

/* --stdin-stop: what comes is thrown away; its end means the launcher that started this node
   is gone or stopping */
static void read_stdin(void) {
  char buf[512];
  ssize_t r = read(0, buf, sizeof buf);
  if (r > 0 || (r < 0 && (errno == EINTR || errno == EAGAIN))) return;
  stdin_open = 0;
  if (stopping) return;   /* stopping already, by its own grace */
  result = 128 + SIGHUP;
  stop_for(SIGTERM, "standard input closed");
}

static void serve(struct pollfd *fds, stream **where, child **whose, int n) {
  char buf[64];
  if (fds[0].revents) while (read(wake[0], buf, sizeof buf) > 0) {}
  for (int k = 1; k < n; k++) {
    if (!fds[k].revents) continue;
    if (fds[k].fd == 0 && !where[k]) read_stdin();
    else if (where[k]->fd >= 0) read_stream(whose[k], where[k]);
  }
}

static void run(void) {
  struct pollfd *fds = grow(NULL, (2 * nkids + 2) * sizeof *fds);
  stream **where = grow(NULL, (2 * nkids + 2) * sizeof *where);
  child **whose = grow(NULL, (2 * nkids + 2) * sizeof *whose);
  int signals_seen = 0;
  for (;;) {
    if (got_chld) { got_chld = 0; reap(); }
    while (signals_seen != sig_count) {
      signals_seen++;
      stop_for(got_sig, signame(got_sig));
    }
    check_times();
    if (job_over()) break;
    memset(where, 0, (2 * nkids + 2) * sizeof *where);
    int n = gather(fds, where, whose);
    if (poll(fds, n, poll_timeout()) < 0) {
      if (errno != EINTR) fatal("poll");
      continue;
    }
    serve(fds, where, whose, n);
  }
  free(fds);
  free(where);
  free(whose);
}

/* stdin, stdout and stderr open (on /dev/null where closed): else the pipes made later would
   take their numbers and the launcher would write its ranks' lines into them */
static void open_std_fds(void) {
  int fd;
  while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd <= 2) {}
  if (fd > 2) close(fd);
}

int main(int argc, char **argv) {
  open_std_fds();
  parse_args(argc, argv);
  if (!opt.hosts) find_defaults();
  stdin_open = opt.stdin_stop;
  install_signals();
  raise_fd_limit();
  if (opt.hosts) start_nodes();
  else start_ranks();
  run();
  return result < 0 ? 0 : result;
}
