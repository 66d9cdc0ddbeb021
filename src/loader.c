/* loader.c: opens a library cudalua does not link against (libcuda, NVRTC, nvJitLink, NCCL)
   from the table that describes it (cl_lib, in cl.h), once per process, and names its result
   codes. It knows nothing of CUDA: what libcuda needs after its entry points are in (cuInit,
   the devices) is its table's `ready` hook, so driver.c and nccl.c, above it, share it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"

/* One pattern for every library: `state` is set to 1 last (release) once everything the
   library needs is written, so the common case (loaded) reads it without the lock (acquire)
   and sees the entry points. Everything else happens under the library's own mutex: the first
   caller loads, any other waits and then reads the outcome; a failure is kept (a second try
   would give the same answer) and its message, written under the lock, is read after it.
   A mutex rather than pthread_once: the routine takes the table (pthread_once's takes
   nothing). One mutex per library, and `near` loaded before taking it: no lock is held while
   another is taken, and a slow cuInit does not hold up NVRTC or NCCL. */
int cl_lib_ok(cl_lib *l) { return __atomic_load_n(&l->state, __ATOMIC_ACQUIRE) == 1; }

static void *try_open(cl_lib *l, const char *file) {
  void *h = dlopen(file, l->flags | RTLD_LOCAL);
  if (h) snprintf(l->path, sizeof l->path, "%s", file);
  return h;
}

/* the file `env` names, else every name in each folder in turn (cl.h says which) */
static void *find(cl_lib *l) {
  const char *forced = l->env ? getenv(l->env) : NULL;
  void *h = NULL;
  if (forced && *forced) {
    if (!(h = try_open(l, forced))) {
      const char *why = dlerror();
      snprintf(l->err, sizeof l->err, l->forced_fail, forced, why ? why : "?");
    }
    return h;
  }
  char buf[sizeof l->path];
  const char *near = l->near && cl_lib_ok(l->near) ? l->near->path : NULL;
  const char *slash = near ? strrchr(near, '/') : NULL;
  for (int i = 0; !h && slash && l->names[i]; i++) {
    snprintf(buf, sizeof buf, "%.*s/%s", (int)(slash - near), near, l->names[i]);
    h = try_open(l, buf);
  }
  for (const cl_libdir *d = l->dirs; !h && d->dir; d++) {
    const char *root = d->env ? getenv(d->env) : "";
    if (!root || (d->env && !*root)) continue;
    for (int i = 0; !h && l->names[i]; i++) {
      if (*root || *d->dir) snprintf(buf, sizeof buf, "%s%s/%s", root, d->dir, l->names[i]);
      else snprintf(buf, sizeof buf, "%s", l->names[i]);
      h = try_open(l, buf);
    }
  }
  if (!h) snprintf(l->err, sizeof l->err, l->not_found, l->names[0], "");
  return h;
}

/* fills the slots of the list; the first required entry point missing, NULL when none */
static const char *resolve(void *h, const cl_sym *s, int required, void *(*builtin)(const char *)) {
  const char *missing = NULL;
  for (; s && s->name; s++)
    if (!(*s->slot = builtin ? builtin(s->name) : dlsym(h, s->name)) && required && !missing) missing = s->name;
  return missing;
}

int cl_lib_load(cl_lib *l) {
  if (cl_lib_ok(l)) return 1;   /* the common case: every collective and compile asks */
  if (l->near) cl_lib_load(l->near);
  pthread_mutex_lock(&l->lock);
  if (!l->state) {
    /* a built-in implementation (the CPU device) when it is chosen, else the library */
    int builtin = l->builtin && l->builtin(NULL);
    void *h = builtin ? (void *)l : find(l);
    if (builtin) snprintf(l->path, sizeof l->path, "%s", "(built in)");
    if (h) {
      const char *missing = resolve(h, l->syms, 1, builtin ? l->builtin : NULL);
      resolve(h, l->optional, 0, builtin ? l->builtin : NULL);
      if (missing) snprintf(l->err, sizeof l->err, l->lacks, l->path, missing);
      else if (!l->ready || l->ready(l)) __atomic_store_n(&l->state, 1, __ATOMIC_RELEASE);
    }
    if (l->state != 1) __atomic_store_n(&l->state, -1, __ATOMIC_RELEASE);
  }
  int ok = l->state == 1;
  pthread_mutex_unlock(&l->lock);
  return ok;
}

/* a failed load forgotten, so that the next cl_lib_load tries again (cuda.use_cpu after
   cuda.is_available said no GPU); 0 when the library is loaded already */
int cl_lib_retry(cl_lib *l) {
  pthread_mutex_lock(&l->lock);
  int loaded = l->state == 1;
  if (l->state == -1) l->state = 0;
  pthread_mutex_unlock(&l->lock);
  return !loaded;
}

/* the library's list of names where it has one (nvJitLink and NCCL have no function for it),
   else its own function, which needs it loaded */
const char *cl_result_name(cl_lib *l, int r) {
  const char *n = NULL;
  if (l->results) n = r >= 0 && r < l->nresults ? l->results[r] : NULL;
  else if (l->result_of && cl_lib_ok(l)) n = l->result_of(r);
  return n ? n : l->unknown;
}

/* the library loaded, else the loader's message (made once, with its own prefix) raised for
   the public function running */
void cl_lib_need(lua_State *L, cl_lib *l) {
  if (!cl_lib_load(l)) cl_error(L, NULL, "%s", cl_unprefixed(l->err));
}
