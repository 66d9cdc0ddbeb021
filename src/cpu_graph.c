/* cpu_graph.c: graphs, executable graphs and stream captures of cudalua's CPU device. A graph
   is a list of nodes with their dependencies; a leaf node holds the op a stream would have
   queued (cpu_driver.c's, run by its runner), so a captured op becomes a node as it is. An
   executable graph holds a plan: a copy of the graph with each graph's nodes in a dependency
   order. A launch queues one op that runs the plan on the worker (in order: the worker runs
   one op at a time); the plan is shared with the launches queued, and a setter changes a
   copy when a launch still holds it, so that queued launches run what they were given.
   Conditions are words the device owns; their handles are the words' addresses, which
   cudaGraphSetConditional (cuda_cpu.h) writes. A graph allocation's block is taken when its
   node is added (CUDA gives its address then) and lives while a graph or plan has the node.
   Every graph structure is under one lock; plans the worker runs are not changed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cl.h"
#include "cpu_dev.h"

typedef struct cpu_graph cpu_graph;
typedef struct cpu_cond { int refs; unsigned value, def, flags; } cpu_cond;   /* handle: &value */
typedef struct cpu_res { int refs; void *p; } cpu_res;                          /* an allocation's block */

typedef struct cpu_node {
  cpu_graph *g;
  CUgraphNodeType type;
  uint64_t id, origin;       /* origin: the id of the node it is a copy of (clones, plans) */
  int enabled;
  size_t idx;                /* in g->nodes */
  struct cpu_node **in, **out;
  size_t nin, nout;
  cpu_op op;                 /* kernel, copy, fill, host, batch, event record/wait, free */
  cpu_graph *child;          /* a child graph node's own copy */
  cpu_cond *cond;            /* a conditional node's */
  CUgraphConditionalNodeType ctype;
  unsigned nbodies;
  CUgraph *bodies;
  cpu_res *res;              /* an allocation's (alloc node; free node of a graph allocation) */
} cpu_node;

struct cpu_graph {
  cpu_node **nodes;
  size_t n;
  cpu_node **order;          /* a plan's: the nodes in a dependency order */
  cpu_cond **conds;          /* made for it */
  size_t nconds;
};

typedef struct cpu_plan {
  int refs;                  /* the executable graph's and each queued launch's */
  cpu_graph *g;
  cpu_cond **conds;          /* those its conditional nodes use (defaults set at each launch) */
  size_t nconds;
} cpu_plan;
typedef struct { cpu_plan *p; } cpu_exec;

typedef struct cpu_capture {
  uint64_t id;
  cpu_graph *g;
  int own;                   /* the graph is the capture's (not cuStreamBeginCaptureToGraph's) */
  int invalid;
  CUstreamCaptureMode mode;
  cpu_stream *origin;
  cpu_stream **streams;      /* every stream taking part, origin first */
  size_t nstreams;
  struct cpu_capture *next;
} cpu_capture;

static pthread_mutex_t glock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_id = 1;
static cpu_capture *captures;   /* the live ones */
static int blocking_captures;   /* of streams that synchronise with the legacy stream */

#define G(h) ((cpu_graph *)(h))
#define N(h) ((cpu_node *)(h))

/* ---- small growable lists (capacity: the next power of two) ---- */
static int grow(void **v, size_t n, size_t size) {
  if (n & (n - 1)) return 1;
  void *nv = realloc(*v, (n ? 2 * n : 4) * size);
  if (!nv) return 0;
  *v = nv;
  return 1;
}
static int push_node(cpu_node ***v, size_t *n, cpu_node *x) {
  void *p = *v;
  if (!grow(&p, *n, sizeof x)) return 0;
  *v = p;
  (*v)[(*n)++] = x;
  return 1;
}
static void drop_node(cpu_node **v, size_t *n, cpu_node *x) {
  for (size_t i = 0; i < *n; i++)
    if (v[i] == x) { memmove(v + i, v + i + 1, (*n - i - 1) * sizeof *v); (*n)--; return; }
}
static int has_node(cpu_node *const *v, size_t n, const cpu_node *x) {
  for (size_t i = 0; i < n; i++) if (v[i] == x) return 1;
  return 0;
}

/* ---- graphs and nodes ---- */
static void cond_unref(cpu_cond *c) { if (c && --c->refs == 0) free(c); }
static void res_unref(cpu_res *r) {
  if (r && --r->refs == 0) { cpu_free(r->p); free(r); }
}
static void graph_free(cpu_graph *g);

/* what a node owns */
static void node_clear(cpu_node *n) {
  if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) free(n->op.u.launch.l);
  if (n->type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) free(n->op.u.batch.v);
  graph_free(n->child);
  for (unsigned i = 0; i < n->nbodies; i++) graph_free(G(n->bodies[i]));
  free(n->bodies);
  cond_unref(n->cond);
  res_unref(n->res);
  n->child = NULL, n->bodies = NULL, n->nbodies = 0, n->cond = NULL, n->res = NULL;
}
static void node_free(cpu_node *n) {
  node_clear(n);
  free(n->in);
  free(n->out);
  free(n);
}
static void graph_free(cpu_graph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->n; i++) node_free(g->nodes[i]);
  for (size_t i = 0; i < g->nconds; i++) cond_unref(g->conds[i]);
  free(g->nodes);
  free(g->order);
  free(g->conds);
  free(g);
}

static int edge(cpu_node *from, cpu_node *to) {
  if (has_node(to->in, to->nin, from)) return 1;
  if (!push_node(&to->in, &to->nin, from)) return 0;
  if (push_node(&from->out, &from->nout, to)) return 1;
  to->nin--;
  return 0;
}

/* the deps must be nodes of g */
static CUresult check_deps(cpu_graph *g, const CUgraphNode *deps, size_t nd) {
  if (nd && !deps) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < nd; i++) if (!deps[i] || N(deps[i])->g != g) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

/* a new node of g after deps (checked), or NULL: out of memory */
static cpu_node *node_add(cpu_graph *g, CUgraphNodeType t, cpu_node *const *deps, size_t nd) {
  cpu_node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  n->g = g, n->type = t, n->enabled = 1, n->id = next_id++, n->idx = g->n;
  if (!push_node(&g->nodes, &g->n, n)) { free(n); return NULL; }
  for (size_t i = 0; i < nd; i++)
    if (!edge(deps[i], n)) { g->n--; for (size_t k = 0; k < i; k++) drop_node(deps[k]->out, &deps[k]->nout, n); node_free(n); return NULL; }
  return n;
}

static void node_remove(cpu_node *n) {
  cpu_graph *g = n->g;
  for (size_t i = 0; i < n->nin; i++) drop_node(n->in[i]->out, &n->in[i]->nout, n);
  for (size_t i = 0; i < n->nout; i++) drop_node(n->out[i]->in, &n->out[i]->nin, n);
  memmove(g->nodes + n->idx, g->nodes + n->idx + 1, (g->n - n->idx - 1) * sizeof *g->nodes);
  g->n--;
  for (size_t i = n->idx; i < g->n; i++) g->nodes[i]->idx = i;
  node_free(n);
}

static cpu_graph *graph_new(void) { return calloc(1, sizeof(cpu_graph)); }

/* ---- copies: of a graph (clones, child nodes, plans); origin: the copy's nodes name the
   originals (keep: name what the originals name) ---- */
static cpu_graph *graph_copy(const cpu_graph *src, int keep);

static int node_copy_into(cpu_node *d, const cpu_node *s, int keep) {
  d->type = s->type, d->enabled = s->enabled, d->op = s->op;
  d->origin = keep ? s->origin : s->id;
  if (s->type == CU_GRAPH_NODE_TYPE_KERNEL) {
    const cpu_launch *l = s->op.u.launch.l;
    cpu_launch *c = malloc(l->size);
    if (!c) return 0;
    memcpy(c, l, l->size);
    c->args = (void **)((char *)c + ((const char *)l->args - (const char *)l));
    for (int i = 0; i < l->f->e->nparams; i++) c->args[i] = (char *)c + ((const char *)l->args[i] - (const char *)l);
    d->op.u.launch.l = c;
  }
  if (s->type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP && cpu_batch_copy(s->op.u.batch.v, s->op.u.batch.n, &d->op.u.batch.v))
    return 0;
  if (s->child && !(d->child = graph_copy(s->child, keep))) return 0;
  if (s->nbodies) {
    if (!(d->bodies = calloc(s->nbodies, sizeof *d->bodies))) return 0;
    d->nbodies = s->nbodies;
    for (unsigned i = 0; i < s->nbodies; i++)
      if (!(d->bodies[i] = (CUgraph)graph_copy(G(s->bodies[i]), keep))) return 0;
  }
  d->ctype = s->ctype;
  if ((d->cond = s->cond)) d->cond->refs++;
  if ((d->res = s->res)) d->res->refs++;
  return 1;
}

static cpu_graph *graph_copy(const cpu_graph *src, int keep) {
  cpu_graph *g = graph_new();
  if (!g) return NULL;
  for (size_t i = 0; i < src->n; i++) {
    cpu_node *n = node_add(g, src->nodes[i]->type, NULL, 0);
    if (!n) { graph_free(g); return NULL; }
    n->op.u.launch.l = NULL;   /* (nothing owned until the copy is done) */
    if (!node_copy_into(n, src->nodes[i], keep)) {
      if (n->type == CU_GRAPH_NODE_TYPE_KERNEL && n->op.u.launch.l == src->nodes[i]->op.u.launch.l) n->op.u.launch.l = NULL;
      if (n->type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP && n->op.u.batch.v == src->nodes[i]->op.u.batch.v) n->op.u.batch.v = NULL;
      graph_free(g);
      return NULL;
    }
  }
  for (size_t i = 0; i < src->n; i++)
    for (size_t k = 0; k < src->nodes[i]->nin; k++)
      if (!edge(g->nodes[src->nodes[i]->in[k]->idx], g->nodes[i])) { graph_free(g); return NULL; }
  /* the conditions go with the graph: a clone's kernels set the same words */
  if (src->nconds && !(g->conds = malloc(src->nconds * sizeof *g->conds))) { graph_free(g); return NULL; }
  for (size_t i = 0; i < src->nconds; i++) (g->conds[g->nconds++] = src->conds[i])->refs++;
  return g;
}

/* a node of g (or of the graphs in it) that copies the node of id */
static cpu_node *find_copy(cpu_graph *g, uint64_t id) {
  for (size_t i = 0; i < g->n; i++) if (g->nodes[i]->origin == id) return g->nodes[i];
  return NULL;
}

/* ---- plans: each graph's nodes in a dependency order (Kahn's); 0 when there is a cycle ---- */
static int order(cpu_graph *g) {
  free(g->order);
  g->order = malloc((g->n ? g->n : 1) * sizeof *g->order);
  size_t *left = calloc(g->n ? g->n : 1, sizeof *left);
  if (!g->order || !left) { free(left); return 0; }
  size_t k = 0, done = 0;
  for (size_t i = 0; i < g->n; i++) if (!(left[i] = g->nodes[i]->nin)) g->order[k++] = g->nodes[i];
  while (done < k) {
    cpu_node *n = g->order[done++];
    for (size_t i = 0; i < n->nout; i++) if (--left[n->out[i]->idx] == 0) g->order[k++] = n->out[i];
  }
  free(left);
  if (k != g->n) return 0;
  for (size_t i = 0; i < g->n; i++) {
    cpu_node *n = g->nodes[i];
    if (n->child && !order(n->child)) return 0;
    for (unsigned b = 0; b < n->nbodies; b++) if (!order(G(n->bodies[b]))) return 0;
  }
  return 1;
}

static int collect_conds(cpu_plan *p, cpu_graph *g) {
  for (size_t i = 0; i < g->n; i++) {
    cpu_node *n = g->nodes[i];
    if (n->cond && n->cond->flags & CU_GRAPH_COND_ASSIGN_DEFAULT) {
      void *v = p->conds;
      if (!grow(&v, p->nconds, sizeof *p->conds)) return 0;
      p->conds = v;
      p->conds[p->nconds++] = n->cond;
    }
    if (n->child && !collect_conds(p, n->child)) return 0;
    for (unsigned b = 0; b < n->nbodies; b++) if (!collect_conds(p, G(n->bodies[b]))) return 0;
  }
  return 1;
}

static void plan_unref(cpu_plan *p) {
  if (!p || --p->refs) return;
  graph_free(p->g);
  free(p->conds);
  free(p);
}

/* a plan of a copy of g; keep: g is a plan's graph (its nodes name the originals already) */
static CUresult plan_new(cpu_graph *g, int keep, cpu_plan **out) {
  cpu_plan *p = calloc(1, sizeof *p);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  p->refs = 1;
  if (!(p->g = graph_copy(g, keep))) { free(p); return CUDA_ERROR_OUT_OF_MEMORY; }
  if (!order(p->g) || !collect_conds(p, p->g)) { plan_unref(p); return CUDA_ERROR_INVALID_VALUE; }
  *out = p;
  return CUDA_SUCCESS;
}

/* the plan a setter may change: a copy when a queued launch holds it */
static cpu_plan *plan_own(cpu_exec *e) {
  if (e->p->refs == 1) return e->p;
  cpu_plan *p;
  if (plan_new(e->p->g, 1, &p)) return NULL;
  plan_unref(e->p);
  return e->p = p;
}

/* ---- running a plan, on the worker ---- */
static void run_graph(cpu_graph *g);

static void run_cond(cpu_node *n) {
  volatile unsigned *v = &n->cond->value;
  if (n->ctype == CU_GRAPH_COND_TYPE_IF) {
    unsigned b = __atomic_load_n(v, __ATOMIC_ACQUIRE) ? 0 : 1;
    if (b < n->nbodies) run_graph(G(n->bodies[b]));
  } else if (n->ctype == CU_GRAPH_COND_TYPE_WHILE) {
    while (__atomic_load_n(v, __ATOMIC_ACQUIRE)) run_graph(G(n->bodies[0]));
  } else if (n->ctype == CU_GRAPH_COND_TYPE_SWITCH) {
    unsigned b = __atomic_load_n(v, __ATOMIC_ACQUIRE);
    if (b < n->nbodies) run_graph(G(n->bodies[b]));
  }
}

static void run_node(cpu_node *n) {
  if (!n->enabled) return;
  switch (n->type) {
  case CU_GRAPH_NODE_TYPE_KERNEL: cpu_launch_run(n->op.u.launch.l); break;
  case CU_GRAPH_NODE_TYPE_MEMCPY: case CU_GRAPH_NODE_TYPE_MEMSET: case CU_GRAPH_NODE_TYPE_HOST:
  case CU_GRAPH_NODE_TYPE_EVENT_RECORD: n->op.run(&n->op); break;
  case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: cpu_batch_do(n->op.u.batch.v, n->op.u.batch.n); break;
  case CU_GRAPH_NODE_TYPE_GRAPH: run_graph(n->child); break;
  case CU_GRAPH_NODE_TYPE_CONDITIONAL: run_cond(n); break;
  /* a graph allocation's block lives with its nodes; another block is freed (once: CUDA
     allows such a graph one launch) */
  case CU_GRAPH_NODE_TYPE_MEM_FREE: if (!n->res && n->op.u.free.p) { cpu_free(n->op.u.free.p); n->op.u.free.p = NULL; } break;
  default: break;   /* empty, event wait (the worker runs all in order), allocation */
  }
}

static void run_graph(cpu_graph *g) {
  for (size_t i = 0; i < g->n; i++) run_node(g->order[i]);
}

static void run_plan(cpu_op *op) {
  cpu_plan *p = op->u.graph.p;
  for (size_t i = 0; i < p->nconds; i++) __atomic_store_n(&p->conds[i]->value, p->conds[i]->def, __ATOMIC_RELEASE);
  run_graph(p->g);
  pthread_mutex_lock(&glock);
  plan_unref(p);
  pthread_mutex_unlock(&glock);
}

/* the events a launch records: done once the launch is */
static void mark_events(cpu_graph *g, uint64_t seq) {
  for (size_t i = 0; i < g->n; i++) {
    cpu_node *n = g->nodes[i];
    if (n->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD && n->enabled) n->op.u.rec.ev->seq = seq;
    if (n->child) mark_events(n->child, seq);
    for (unsigned b = 0; b < n->nbodies; b++) mark_events(G(n->bodies[b]), seq);
  }
}

/* ---- captures: a capturing stream's ops become nodes at its place ---- */
static cpu_capture *capture_of_id(uint64_t id) {
  for (cpu_capture *c = captures; c; c = c->next) if (c->id == id) return c;
  return NULL;
}
static cpu_stream *user_stream(CUstream s) { return (uintptr_t)s > 2 ? (cpu_stream *)s : NULL; }

static int push_stream(cpu_capture *c, cpu_stream *st) {
  void *v = c->streams;
  if (!grow(&v, c->nstreams, sizeof st)) return 0;
  c->streams = v;
  c->streams[c->nstreams++] = st;
  return 1;
}

static int set_deps(cpu_stream *st, cpu_node *const *v, size_t n) {
  cpu_node **d = n ? malloc(n * sizeof *d) : NULL;
  if (n && !d) return 0;
  if (n) memcpy(d, v, n * sizeof *d);
  free(st->deps);
  st->deps = d, st->ndeps = n;
  return 1;
}
static int add_deps(cpu_stream *st, cpu_node *const *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!has_node(st->deps, st->ndeps, v[i]) && !push_node(&st->deps, &st->ndeps, v[i])) return 0;
  return 1;
}

/* a node of type t at st's place in its capture (NULL: out of memory) */
static cpu_node *capture_node(cpu_stream *st, CUgraphNodeType t) {
  cpu_node *n = node_add(st->cap->g, t, st->deps, st->ndeps);
  if (n && !set_deps(st, &n, 1)) { node_remove(n); n = NULL; }
  return n;
}

static void op_free(cpu_op *op) {
  if (op->run == cpu_run_launch) free(op->u.launch.l);
  if (op->run == cpu_run_batch) free(op->u.batch.v);
  free(op);
}

static cpu_res *res_of(cpu_graph *g, void *p) {
  for (size_t i = 0; i < g->n; i++)
    if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && g->nodes[i]->res->p == p) return g->nodes[i]->res;
  return NULL;
}

/* what a queued op is as a node; -1: none (a kernel is 0) */
static CUgraphNodeType op_type(const cpu_op *op) {
  if (op->run == cpu_run_copy) return CU_GRAPH_NODE_TYPE_MEMCPY;
  if (op->run == cpu_run_fill) return CU_GRAPH_NODE_TYPE_MEMSET;
  if (op->run == cpu_run_host) return CU_GRAPH_NODE_TYPE_HOST;
  if (op->run == cpu_run_launch) return CU_GRAPH_NODE_TYPE_KERNEL;
  if (op->run == cpu_run_batch) return CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
  if (op->run == cpu_run_free) return CU_GRAPH_NODE_TYPE_MEM_FREE;
  if (op->run == cpu_run_record) return CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  return (CUgraphNodeType)-1;
}

/* the capture goes on no further: its end says so */
static void invalidate(cpu_capture *c) { c->invalid = 1; }

static CUresult capture_op(cpu_stream *st, cpu_op *op) {
  CUgraphNodeType t = op_type(op);
  if (st->cap->invalid || (int)t < 0) {
    CUresult r = st->cap->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    invalidate(st->cap);
    op_free(op);
    return r;
  }
  cpu_node *n = capture_node(st, t);
  if (!n) { op_free(op); return CUDA_ERROR_OUT_OF_MEMORY; }
  n->op = *op;
  free(op);
  if (t == CU_GRAPH_NODE_TYPE_MEM_FREE && (n->res = res_of(st->cap->g, n->op.u.free.p))) n->res->refs++;
  return CUDA_SUCCESS;
}

/* the legacy stream waits for every blocking stream: its work during a capture of one would
   join the capture implicitly, which CUDA refuses, ending the capture (global and thread-local
   modes) */
static CUresult legacy_use(void) {
  CUresult r = CUDA_SUCCESS;
  for (cpu_capture *c = captures; c; c = c->next)
    if (!(c->origin->flags & CU_STREAM_NON_BLOCKING) && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
      invalidate(c);
      r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  return r;
}

static int capture_hook(CUstream s, cpu_op *op, CUresult *r) {
  cpu_stream *st = user_stream(s);
  pthread_mutex_lock(&glock);
  int took = 0;
  if (st && st->cap) took = 1, *r = capture_op(st, op);
  else if (!st && s != CU_STREAM_PER_THREAD && blocking_captures && (*r = legacy_use())) took = 1, op_free(op);
  pthread_mutex_unlock(&glock);
  return took;
}

static CUresult begin(CUstream s, cpu_graph *g, const CUgraphNode *deps, size_t nd, CUstreamCaptureMode mode) {
  cpu_stream *st = user_stream(s);
  if (!st) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (st->cap) return CUDA_ERROR_ILLEGAL_STATE;
  cpu_capture *c = calloc(1, sizeof *c);
  if (c && !g) c->own = 1, g = graph_new();
  if (!c || !g || !push_stream(c, st) || !set_deps(st, (cpu_node *const *)deps, nd)) {
    if (c && c->own) graph_free(g);
    if (c) free(c->streams);
    free(c);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  c->id = next_id++, c->g = g, c->mode = mode, c->origin = st;
  c->next = captures, captures = c;
  st->cap = c;
  if (!(st->flags & CU_STREAM_NON_BLOCKING)) blocking_captures++;
  __atomic_store_n(&cpu_capture_hook, capture_hook, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

static CUresult c_StreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
  pthread_mutex_lock(&glock);
  CUresult r = begin(s, NULL, NULL, 0, mode);
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_StreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
                                            size_t nd, CUstreamCaptureMode mode) {
  (void)edges;
  pthread_mutex_lock(&glock);
  CUresult r = !g ? CUDA_ERROR_INVALID_VALUE : check_deps(G(g), deps, nd);
  if (!r) r = begin(s, G(g), deps, nd, mode);
  pthread_mutex_unlock(&glock);
  return r;
}

/* the capture is over: its streams leave it */
static void capture_end(cpu_capture *c) {
  for (size_t i = 0; i < c->nstreams; i++) {
    cpu_stream *st = c->streams[i];
    st->cap = NULL;
    set_deps(st, NULL, 0);
  }
  if (!(c->origin->flags & CU_STREAM_NON_BLOCKING)) blocking_captures--;
  for (cpu_capture **p = &captures; *p; p = &(*p)->next)
    if (*p == c) { *p = c->next; break; }
  free(c->streams);
  free(c);
}

static CUresult c_StreamEndCapture(CUstream s, CUgraph *out) {
  cpu_stream *st = user_stream(s);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = NULL;
  pthread_mutex_lock(&glock);
  cpu_capture *c = st ? st->cap : NULL;
  CUresult r = !c ? CUDA_ERROR_ILLEGAL_STATE : c->origin != st ? CUDA_ERROR_STREAM_CAPTURE_UNMATCHED : CUDA_SUCCESS;
  if (!r) {
    if (c->invalid) {
      r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
      if (c->own) graph_free(c->g);
    } else *out = (CUgraph)c->g;
    capture_end(c);
  }
  pthread_mutex_unlock(&glock);
  return r;
}

static CUresult c_StreamIsCapturing(CUstream s, CUstreamCaptureStatus *out) {
  cpu_stream *st = user_stream(s);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  *out = !st || !st->cap ? CU_STREAM_CAPTURE_STATUS_NONE
       : st->cap->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  pthread_mutex_unlock(&glock);
  return CUDA_SUCCESS;
}

static CUresult c_StreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *g,
                                       const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n) {
  cpu_stream *st = user_stream(s);
  pthread_mutex_lock(&glock);
  cpu_capture *c = st ? st->cap : NULL;
  if (status) *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE : c->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id) *id = c ? c->id : 0;
  if (g) *g = c ? (CUgraph)c->g : NULL;
  if (deps) *deps = c ? (const CUgraphNode *)st->deps : NULL;
  if (edges) *edges = NULL;
  if (n) *n = c ? st->ndeps : 0;
  pthread_mutex_unlock(&glock);
  return CUDA_SUCCESS;
}

static CUresult c_StreamUpdateCaptureDependencies(CUstream s, CUgraphNode *deps, const CUgraphEdgeData *edges, size_t nd, unsigned f) {
  (void)edges;
  cpu_stream *st = user_stream(s);
  pthread_mutex_lock(&glock);
  CUresult r = !st || !st->cap ? CUDA_ERROR_ILLEGAL_STATE : check_deps(st->cap->g, deps, nd);
  if (!r && f != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && f != CU_STREAM_SET_CAPTURE_DEPENDENCIES) r = CUDA_ERROR_INVALID_VALUE;
  if (!r && !(f == CU_STREAM_SET_CAPTURE_DEPENDENCIES ? set_deps(st, (cpu_node *const *)deps, nd) : add_deps(st, (cpu_node *const *)deps, nd)))
    r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_unlock(&glock);
  return r;
}

/* a record in a capture is no work: it keeps the capture's place, for streams that wait on
   it to join the capture there (fork and join); an external one is a node */
static CUresult c_EventRecordWithFlags(CUevent e, CUstream s, unsigned f) {
  cpu_event *ev = (cpu_event *)e;
  cpu_stream *st = user_stream(s);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&glock);
  if (!st || !st->cap) {
    ev->cap = 0;
    pthread_mutex_unlock(&glock);
    return cpu_event_record(e, s);   /* (the legacy stream's refusal is the queue hook's) */
  }
  CUresult r = st->cap->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
  if (!r && f & CU_EVENT_RECORD_EXTERNAL) {
    cpu_node *n = capture_node(st, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
    if (n) n->op.run = cpu_run_record, n->op.u.rec.ev = ev;
    else r = CUDA_ERROR_OUT_OF_MEMORY;
  } else if (!r) {
    cpu_node **d = st->ndeps ? malloc(st->ndeps * sizeof *d) : NULL;
    if (st->ndeps && !d) r = CUDA_ERROR_OUT_OF_MEMORY;
    else {
      if (d) memcpy(d, st->deps, st->ndeps * sizeof *d);
      free(ev->deps);
      ev->deps = d, ev->ndeps = st->ndeps, ev->cap = st->cap->id;
    }
  }
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_EventRecord(CUevent e, CUstream s) { return c_EventRecordWithFlags(e, s, 0); }

/* a wait on an event of a capture joins the stream to it; a capturing stream's wait on
   another event is an event wait node */
static CUresult c_StreamWaitEvent(CUstream s, CUevent e, unsigned f) {
  (void)f;
  cpu_event *ev = (cpu_event *)e;
  cpu_stream *st = user_stream(s);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&glock);
  cpu_capture *c = ev->cap ? capture_of_id(ev->cap) : NULL;
  CUresult r = CUDA_SUCCESS;
  if (c && (!st || (st->cap && st->cap != c))) r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  else if (c && !st->cap) {
    if (!push_stream(c, st) || !set_deps(st, ev->deps, ev->ndeps)) r = CUDA_ERROR_OUT_OF_MEMORY;
    else st->cap = c;
  } else if (c) {
    if (!add_deps(st, ev->deps, ev->ndeps)) r = CUDA_ERROR_OUT_OF_MEMORY;
  } else if (st && st->cap) {
    cpu_node *n = st->cap->invalid ? NULL : capture_node(st, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
    if (n) n->op.u.rec.ev = ev;
    else r = st->cap->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_unlock(&glock);
  return r;   /* (outside captures the worker runs every stream's work in order already) */
}

/* a stream destroyed while it captures leaves the capture (the one it began ends) */
static CUresult c_StreamDestroy(CUstream s) {
  cpu_stream *st = user_stream(s);
  if (!st) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&glock);
  cpu_capture *c = st->cap;
  if (c && c->origin == st) {
    if (c->own) graph_free(c->g);
    capture_end(c);
  } else if (c) {
    for (size_t i = 0; i < c->nstreams; i++)
      if (c->streams[i] == st) { c->streams[i] = c->streams[--c->nstreams]; break; }
  }
  pthread_mutex_unlock(&glock);
  free(st->deps);
  free(st);
  return CUDA_SUCCESS;
}

/* memory allocated in a capture is an allocation node's */
static CUresult c_MemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
  cpu_stream *st = user_stream(s);
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  CUresult r = CUDA_SUCCESS;
  int captured = st && st->cap;
  if (captured) {
    cpu_res *res = calloc(1, sizeof *res);
    cpu_node *node = NULL;
    r = !res || n > cpu_device_free() ? CUDA_ERROR_OUT_OF_MEMORY : st->cap->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
      : cpu_alloc(&res->p, n, CU_MEMORYTYPE_DEVICE);
    if (!r && !(node = capture_node(st, CU_GRAPH_NODE_TYPE_MEM_ALLOC))) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r) { if (res) cpu_free(res->p); free(res); }
    else res->refs = 1, node->res = res, *p = (CUdeviceptr)(uintptr_t)res->p;
  }
  pthread_mutex_unlock(&glock);
  if (captured) return r;
  void *m;
  r = n > cpu_device_free() ? CUDA_ERROR_OUT_OF_MEMORY : cpu_alloc(&m, n, CU_MEMORYTYPE_DEVICE);
  *p = r ? 0 : (CUdeviceptr)(uintptr_t)m;
  return r;
}

/* ---- building graphs ---- */
static CUresult c_GraphCreate(CUgraph *g, unsigned f) {
  (void)f;
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  *g = (CUgraph)graph_new();
  return *g ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult c_GraphDestroy(CUgraph g) {
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  graph_free(G(g));
  pthread_mutex_unlock(&glock);
  return CUDA_SUCCESS;
}

/* a node of type t added to g after deps (under the lock), op its work */
static CUresult add(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraphNodeType t, const cpu_op *op) {
  if (!out || !g) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = check_deps(G(g), deps, nd);
  if (r) return r;
  cpu_node *n = node_add(G(g), t, (cpu_node *const *)deps, nd);
  if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
  if (op) n->op = *op;
  *out = (CUgraphNode)n;
  return CUDA_SUCCESS;
}
static CUresult add_locked(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraphNodeType t, const cpu_op *op) {
  pthread_mutex_lock(&glock);
  CUresult r = add(out, g, deps, nd, t, op);
  pthread_mutex_unlock(&glock);
  return r;
}

static CUresult kernel_op(const CUDA_KERNEL_NODE_PARAMS *p, cpu_op *op) {
  if (!p || !p->func) return CUDA_ERROR_INVALID_VALUE;
  if (p->extra) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r;
  memset(op, 0, sizeof *op);
  op->u.launch.l = cpu_launch_new((cpu_func *)p->func, (cl_cpu_dim){p->gridDimX, p->gridDimY, p->gridDimZ},
                                  (cl_cpu_dim){p->blockDimX, p->blockDimY, p->blockDimZ}, p->sharedMemBytes, p->kernelParams, &r);
  return r;
}
static CUresult c_GraphAddKernelNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS *p) {
  cpu_op op;
  CUresult r = kernel_op(p, &op);
  if (!r && (r = add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_KERNEL, &op))) free(op.u.launch.l);
  return r;
}

static CUresult c_GraphAddMemcpyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMCPY3D *p, CUcontext ctx) {
  (void)ctx;
  cpu_op op;
  memset(&op, 0, sizeof op);
  CUresult r = cpu_copy_op(p, &op);
  return r ? r : add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_MEMCPY, &op);
}

static CUresult fill_op(const CUDA_MEMSET_NODE_PARAMS *p, cpu_op *op) {
  if (!p || !p->dst || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4)) return CUDA_ERROR_INVALID_VALUE;
  if (p->height > 1 && p->pitch < p->width * p->elementSize) return CUDA_ERROR_INVALID_VALUE;
  memset(op, 0, sizeof *op);
  op->run = cpu_run_fill;
  op->u.fill.dst = (void *)(uintptr_t)p->dst, op->u.fill.v = p->value, op->u.fill.size = (int)p->elementSize;
  op->u.fill.pitch = p->pitch, op->u.fill.w = p->width, op->u.fill.h = p->height ? p->height : 1;
  return CUDA_SUCCESS;
}
static CUresult c_GraphAddMemsetNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
  (void)ctx;
  cpu_op op;
  CUresult r = fill_op(p, &op);
  return r ? r : add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_MEMSET, &op);
}

static CUresult c_GraphAddHostNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_HOST_NODE_PARAMS *p) {
  if (!p || !p->fn) return CUDA_ERROR_INVALID_VALUE;
  cpu_op op = {.run = cpu_run_host, .u.host = {p->fn, p->userData}};
  return add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_HOST, &op);
}
static CUresult c_GraphAddEmptyNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd) {
  return add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_EMPTY, NULL);
}

static CUresult c_GraphAddChildGraphNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child) {
  if (!child || child == g) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  cpu_graph *c = graph_copy(G(child), 0);
  CUresult r = c ? add(n, g, deps, nd, CU_GRAPH_NODE_TYPE_GRAPH, NULL) : CUDA_ERROR_OUT_OF_MEMORY;
  if (!r) N(*n)->child = c;
  else graph_free(c);
  pthread_mutex_unlock(&glock);
  return r;
}

static CUresult c_GraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  if (!p || !p->bytesize) return CUDA_ERROR_INVALID_VALUE;
  cpu_res *res = calloc(1, sizeof *res);
  if (!res) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = p->bytesize > cpu_device_free() ? CUDA_ERROR_OUT_OF_MEMORY : cpu_alloc(&res->p, p->bytesize, CU_MEMORYTYPE_DEVICE);
  if (!r) r = add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_MEM_ALLOC, NULL);
  if (r) { cpu_free(res->p); free(res); return r; }
  res->refs = 1;
  N(*n)->res = res;
  p->dptr = (CUdeviceptr)(uintptr_t)res->p;
  return CUDA_SUCCESS;
}
static CUresult c_GraphAddMemFreeNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUdeviceptr p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  cpu_op op = {.run = cpu_run_free, .u.free.p = (void *)(uintptr_t)p};
  pthread_mutex_lock(&glock);
  CUresult r = add(n, g, deps, nd, CU_GRAPH_NODE_TYPE_MEM_FREE, &op);
  if (!r && (N(*n)->res = res_of(G(g), op.u.free.p))) N(*n)->res->refs++;
  pthread_mutex_unlock(&glock);
  return r;
}

static CUresult c_GraphAddEventRecordNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  cpu_op op = {.run = cpu_run_record, .u.rec.ev = (cpu_event *)e};
  return add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_EVENT_RECORD, &op);
}
static CUresult c_GraphAddEventWaitNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  cpu_op op = {.u.rec.ev = (cpu_event *)e};
  return add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_WAIT_EVENT, &op);
}

static CUresult c_GraphAddBatchMemOpNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  cpu_op op = {.run = cpu_run_batch, .u.batch.n = p->count};
  CUresult r = cpu_batch_copy(p->paramArray, p->count, &op.u.batch.v);
  if (!r && (r = add_locked(n, g, deps, nd, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, &op))) free(op.u.batch.v);
  return r;
}
static CUresult c_GraphBatchMemOpNodeGetParams(CUgraphNode n, CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
  if (!n || !p || N(n)->type != CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) return CUDA_ERROR_INVALID_VALUE;
  memset(p, 0, sizeof *p);
  p->count = N(n)->op.u.batch.n;
  p->paramArray = N(n)->op.u.batch.v;
  return CUDA_SUCCESS;
}
static CUresult set_batch(cpu_node *n, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
  if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) return CUDA_ERROR_INVALID_VALUE;
  CUstreamBatchMemOpParams *v;
  CUresult r = cpu_batch_copy(p->paramArray, p->count, &v);
  if (r) return r;
  free(n->op.u.batch.v);
  n->op.u.batch.v = v, n->op.u.batch.n = p->count;
  return CUDA_SUCCESS;
}
static CUresult c_GraphBatchMemOpNodeSetParams(CUgraphNode n, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
  pthread_mutex_lock(&glock);
  CUresult r = set_batch(N(n), p);
  pthread_mutex_unlock(&glock);
  return r;
}

/* conditions: words the graph owns (and the plans and clones made of it) */
static CUresult c_GraphConditionalHandleCreate(CUgraphConditionalHandle *h, CUgraph g, CUcontext ctx, unsigned def, unsigned f) {
  (void)ctx;
  if (!h || !g) return CUDA_ERROR_INVALID_VALUE;
  cpu_cond *c = calloc(1, sizeof *c);
  if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
  c->refs = 1, c->def = def, c->flags = f;
  pthread_mutex_lock(&glock);
  void *v = G(g)->conds;
  int ok = grow(&v, G(g)->nconds, sizeof c);
  if (ok) G(g)->conds = v, G(g)->conds[G(g)->nconds++] = c;
  pthread_mutex_unlock(&glock);
  if (!ok) { free(c); return CUDA_ERROR_OUT_OF_MEMORY; }
  *h = (CUgraphConditionalHandle)(uintptr_t)&c->value;
  return CUDA_SUCCESS;
}

static cpu_cond *cond_of(cpu_graph *g, CUgraphConditionalHandle h) {
  for (size_t i = 0; i < g->nconds; i++) if ((uintptr_t)&g->conds[i]->value == h) return g->conds[i];
  return NULL;
}

/* a conditional node (the node type cudalua adds through cuGraphAddNode) with its bodies */
static CUresult add_cond(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraphNodeParams *p) {
  CUgraphConditionalNodeType t = p->conditional.type;
  unsigned size = p->conditional.size;
  cpu_cond *c = g ? cond_of(G(g), p->conditional.handle) : NULL;
  if (!c || !size || (t == CU_GRAPH_COND_TYPE_IF && size > 2) || (t == CU_GRAPH_COND_TYPE_WHILE && size != 1) ||
      (t != CU_GRAPH_COND_TYPE_IF && t != CU_GRAPH_COND_TYPE_WHILE && t != CU_GRAPH_COND_TYPE_SWITCH))
    return CUDA_ERROR_INVALID_VALUE;
  CUgraph *bodies = calloc(size, sizeof *bodies);
  for (unsigned i = 0; bodies && i < size; i++)
    if (!(bodies[i] = (CUgraph)graph_new())) { while (i--) graph_free(G(bodies[i])); free(bodies); bodies = NULL; }
  if (!bodies) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = add(out, g, deps, nd, CU_GRAPH_NODE_TYPE_CONDITIONAL, NULL);
  if (r) {
    for (unsigned i = 0; i < size; i++) graph_free(G(bodies[i]));
    free(bodies);
    return r;
  }
  cpu_node *n = N(*out);
  n->cond = c, c->refs++, n->ctype = t, n->nbodies = size, n->bodies = bodies;
  p->conditional.phGraph_out = bodies;
  return CUDA_SUCCESS;
}
static CUresult c_GraphAddNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges, size_t nd,
                               CUgraphNodeParams *p) {
  (void)edges;
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  if (p->type == CU_GRAPH_NODE_TYPE_EMPTY) return add_locked(out, g, deps, nd, CU_GRAPH_NODE_TYPE_EMPTY, NULL);
  if (p->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD) return c_GraphAddEventRecordNode(out, g, deps, nd, p->eventRecord.event);
  if (p->type == CU_GRAPH_NODE_TYPE_WAIT_EVENT) return c_GraphAddEventWaitNode(out, g, deps, nd, p->eventWait.event);
  if (p->type == CU_GRAPH_NODE_TYPE_GRAPH) return c_GraphAddChildGraphNode(out, g, deps, nd, p->graph.graph);
  if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL) return CUDA_ERROR_NOT_SUPPORTED;
  pthread_mutex_lock(&glock);
  CUresult r = add_cond(out, g, deps, nd, p);
  pthread_mutex_unlock(&glock);
  return r;
}

static CUresult c_GraphAddDependencies(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, const CUgraphEdgeData *edges, size_t n) {
  (void)edges;
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  CUresult r = check_deps(G(g), from, n);
  if (!r) r = check_deps(G(g), to, n);
  for (size_t i = 0; !r && i < n; i++)
    if (from[i] == to[i]) r = CUDA_ERROR_INVALID_VALUE;
    else if (!edge(N(from[i]), N(to[i]))) r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_unlock(&glock);
  return r;
}

/* a list the caller reads: its length alone when out is NULL (CUDA's convention) */
static CUresult list_out(cpu_node *const *v, size_t n, CUgraphNode *out, size_t *count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  if (out) {
    for (size_t i = 0; i < *count; i++) out[i] = i < n ? (CUgraphNode)v[i] : NULL;
  }
  *count = n;
  return CUDA_SUCCESS;
}
static CUresult c_GraphNodeGetDependentNodes(CUgraphNode n, CUgraphNode *out, CUgraphEdgeData *edges, size_t *count) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  if (edges && out && count) memset(edges, 0, *count * sizeof *edges);
  CUresult r = list_out(N(n)->out, N(n)->nout, out, count);
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_GraphGetNodes(CUgraph g, CUgraphNode *out, size_t *count) {
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  CUresult r = list_out(G(g)->nodes, G(g)->n, out, count);
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_GraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) {
  if (!n || !t) return CUDA_ERROR_INVALID_VALUE;
  *t = N(n)->type;
  return CUDA_SUCCESS;
}
static CUresult c_GraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *g) {
  if (!n || !g || N(n)->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
  *g = (CUgraph)N(n)->child;
  return CUDA_SUCCESS;
}
static CUresult c_GraphDestroyNode(CUgraphNode n) {
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  node_remove(N(n));
  pthread_mutex_unlock(&glock);
  return CUDA_SUCCESS;
}

/* clusters and cooperative launches are what plain launches refuse on the CPU device too */
static CUresult c_GraphKernelNodeSetAttribute(CUgraphNode n, CUkernelNodeAttrID a, const CUkernelNodeAttrValue *v) {
  if (!n || !v || N(n)->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  if (a == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION && (size_t)v->clusterDim.x * v->clusterDim.y * v->clusterDim.z > 1)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (a == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && v->cooperative) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

/* CUDA clones neither memory nodes nor conditional ones */
static int clonable(const cpu_graph *g) {
  for (size_t i = 0; i < g->n; i++) {
    const cpu_node *n = g->nodes[i];
    if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->type == CU_GRAPH_NODE_TYPE_MEM_FREE ||
        n->type == CU_GRAPH_NODE_TYPE_CONDITIONAL || (n->child && !clonable(n->child)))
      return 0;
  }
  return 1;
}
static CUresult c_GraphClone(CUgraph *out, CUgraph g) {
  if (!out || !g) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  CUresult r = !clonable(G(g)) ? CUDA_ERROR_NOT_SUPPORTED : (*out = (CUgraph)graph_copy(G(g), 0)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_GraphNodeFindInClone(CUgraphNode *out, CUgraphNode n, CUgraph clone) {
  if (!out || !n || !clone) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  cpu_node *c = find_copy(G(clone), N(n)->id);
  pthread_mutex_unlock(&glock);
  *out = (CUgraphNode)c;
  return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- executable graphs ---- */
static CUresult c_GraphInstantiate(CUgraphExec *out, CUgraph g, unsigned long long f) {
  (void)f;
  if (!out || !g) return CUDA_ERROR_INVALID_VALUE;
  cpu_exec *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&glock);
  CUresult r = plan_new(G(g), 0, &e->p);
  pthread_mutex_unlock(&glock);
  if (r) { free(e); return r; }
  *out = (CUgraphExec)e;
  return CUDA_SUCCESS;
}
static CUresult c_GraphExecDestroy(CUgraphExec x) {
  cpu_exec *e = (cpu_exec *)x;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  plan_unref(e->p);   /* (a queued launch keeps the plan until it has run) */
  pthread_mutex_unlock(&glock);
  free(e);
  return CUDA_SUCCESS;
}

/* a launch: one op running the plan; in a capture, a child node copying the graph */
static CUresult c_GraphLaunch(CUgraphExec x, CUstream s) {
  cpu_exec *e = (cpu_exec *)x;
  cpu_stream *st = user_stream(s);
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&glock);
  if (st && st->cap) {
    cpu_graph *c = st->cap->invalid ? NULL : graph_copy(e->p->g, 1);
    cpu_node *n = c ? capture_node(st, CU_GRAPH_NODE_TYPE_GRAPH) : NULL;
    CUresult r = st->cap->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : n ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (n) n->child = c;
    else graph_free(c);
    pthread_mutex_unlock(&glock);
    return r;
  }
  cpu_plan *p = e->p;
  p->refs += 2;   /* the op's, and this call's until its events are marked */
  pthread_mutex_unlock(&glock);
  cpu_op *op = calloc(1, sizeof *op);
  CUresult r = op ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  if (op) op->run = run_plan, op->u.graph.p = p;
  if (op) r = cpu_enqueue(s, op);   /* (refused: freed, the plan not run) */
  pthread_mutex_lock(&glock);
  if (!r) mark_events(p->g, cpu_enqueued());
  else p->refs--;
  plan_unref(p);
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_GraphUpload(CUgraphExec x, CUstream s) { (void)s; return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* the node of the executable graph's plan that copies n (a node of its graph), in a plan it
   may change; NULL: none of type t (-1: of any type) */
static cpu_node *exec_node(CUgraphExec x, CUgraphNode n, CUgraphNodeType t, CUresult *r) {
  cpu_exec *e = (cpu_exec *)x;
  *r = CUDA_ERROR_INVALID_VALUE;
  if (!e || !n) return NULL;
  cpu_node *c = find_copy(e->p->g, N(n)->id);
  if (!c || ((int)t >= 0 && c->type != t)) return NULL;
  cpu_plan *p = plan_own(e);
  *r = p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  return p ? find_copy(p->g, N(n)->id) : NULL;
}

/* a leaf node's work replaced (ownership of op's parts passes to the node) */
static CUresult exec_set_op(CUgraphExec x, CUgraphNode n, CUgraphNodeType t, const cpu_op *op) {
  CUresult r;
  pthread_mutex_lock(&glock);
  cpu_node *c = exec_node(x, n, t, &r);
  if (c) {
    if (t == CU_GRAPH_NODE_TYPE_KERNEL) free(c->op.u.launch.l);
    if (t == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) free(c->op.u.batch.v);
    c->op = *op;
  }
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_GraphExecKernelNodeSetParams(CUgraphExec x, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
  cpu_op op;
  CUresult r = kernel_op(p, &op);
  if (!r && (r = exec_set_op(x, n, CU_GRAPH_NODE_TYPE_KERNEL, &op))) free(op.u.launch.l);
  return r;
}
static CUresult c_GraphExecMemcpyNodeSetParams(CUgraphExec x, CUgraphNode n, const CUDA_MEMCPY3D *p, CUcontext ctx) {
  (void)ctx;
  cpu_op op;
  memset(&op, 0, sizeof op);
  CUresult r = cpu_copy_op(p, &op);
  return r ? r : exec_set_op(x, n, CU_GRAPH_NODE_TYPE_MEMCPY, &op);
}
static CUresult c_GraphExecMemsetNodeSetParams(CUgraphExec x, CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
  (void)ctx;
  cpu_op op;
  CUresult r = fill_op(p, &op);
  return r ? r : exec_set_op(x, n, CU_GRAPH_NODE_TYPE_MEMSET, &op);
}
static CUresult c_GraphExecBatchMemOpNodeSetParams(CUgraphExec x, CUgraphNode n, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  cpu_op op = {.run = cpu_run_batch, .u.batch.n = p->count};
  CUresult r = cpu_batch_copy(p->paramArray, p->count, &op.u.batch.v);
  if (!r && (r = exec_set_op(x, n, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, &op))) free(op.u.batch.v);
  return r;
}
static CUresult set_event(CUgraphExec x, CUgraphNode n, CUgraphNodeType t, CUevent ev) {
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r;
  pthread_mutex_lock(&glock);
  cpu_node *c = exec_node(x, n, t, &r);
  if (c) c->op.u.rec.ev = (cpu_event *)ev;
  pthread_mutex_unlock(&glock);
  return r;
}
static CUresult c_GraphExecEventRecordNodeSetEvent(CUgraphExec x, CUgraphNode n, CUevent e) {
  return set_event(x, n, CU_GRAPH_NODE_TYPE_EVENT_RECORD, e);
}
static CUresult c_GraphExecEventWaitNodeSetEvent(CUgraphExec x, CUgraphNode n, CUevent e) {
  return set_event(x, n, CU_GRAPH_NODE_TYPE_WAIT_EVENT, e);
}
static CUresult c_GraphNodeSetEnabled(CUgraphExec x, CUgraphNode n, unsigned on) {
  CUresult r;
  pthread_mutex_lock(&glock);
  cpu_node *c = exec_node(x, n, (CUgraphNodeType)-1, &r);
  if (c && c->type != CU_GRAPH_NODE_TYPE_KERNEL && c->type != CU_GRAPH_NODE_TYPE_MEMCPY && c->type != CU_GRAPH_NODE_TYPE_MEMSET)
    r = CUDA_ERROR_INVALID_VALUE;
  else if (c) c->enabled = on != 0;
  pthread_mutex_unlock(&glock);
  return r;
}

/* whether b has a's shape: node types and dependencies, index for index, children too */
static cpu_node *shape_differs(const cpu_graph *a, const cpu_graph *b, CUgraphExecUpdateResult *why) {
  if (a->n != b->n) { *why = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED; return b->n ? b->nodes[0] : (cpu_node *)1; }
  for (size_t i = 0; i < a->n; i++) {
    const cpu_node *x = a->nodes[i];
    cpu_node *y = b->nodes[i];
    if (x->type != y->type) { *why = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED; return y; }
    int same = x->nin == y->nin && x->nbodies == y->nbodies && x->ctype == y->ctype;
    for (size_t k = 0; same && k < x->nin; k++) {
      same = 0;
      for (size_t j = 0; j < y->nin; j++) same |= y->in[j]->idx == x->in[k]->idx;
    }
    if (same && x->child && shape_differs(x->child, y->child, why)) same = 0;
    for (unsigned k = 0; same && k < x->nbodies; k++) if (shape_differs(G(x->bodies[k]), G(y->bodies[k]), why)) same = 0;
    if (!same) { *why = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED; return y; }
  }
  return NULL;
}
static CUresult c_GraphExecUpdate(CUgraphExec x, CUgraph g, CUgraphExecUpdateResultInfo *info) {
  cpu_exec *e = (cpu_exec *)x;
  if (!e || !g) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExecUpdateResult why = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  pthread_mutex_lock(&glock);
  cpu_node *bad = shape_differs(e->p->g, G(g), &why);
  cpu_plan *p = NULL;
  CUresult r = bad ? CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE : plan_new(G(g), 0, &p);
  if (!r) {   /* the new plan's nodes stand for the nodes the old one's did */
    for (size_t i = 0; i < p->g->n; i++) p->g->nodes[i]->origin = e->p->g->nodes[i]->origin;
    plan_unref(e->p);
    e->p = p;
  }
  pthread_mutex_unlock(&glock);
  if (info) {
    memset(info, 0, sizeof *info);
    info->result = bad ? why : r ? CU_GRAPH_EXEC_UPDATE_ERROR : CU_GRAPH_EXEC_UPDATE_SUCCESS;
    info->errorNode = bad && bad != (cpu_node *)1 ? (CUgraphNode)bad : NULL;
  }
  return r;
}
static CUresult c_GraphExecChildGraphNodeSetParams(CUgraphExec x, CUgraphNode n, CUgraph child) {
  if (!child) return CUDA_ERROR_INVALID_VALUE;
  CUresult r;
  CUgraphExecUpdateResult why;
  pthread_mutex_lock(&glock);
  cpu_node *c = exec_node(x, n, CU_GRAPH_NODE_TYPE_GRAPH, &r);
  cpu_graph *copy = NULL;
  if (c && shape_differs(c->child, G(child), &why)) r = CUDA_ERROR_INVALID_VALUE;
  else if (c && (!(copy = graph_copy(G(child), 0)) || !order(copy))) r = copy ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
  if (!r) {
    cpu_plan *p = ((cpu_exec *)x)->p;
    graph_free(c->child);
    c->child = copy, copy = NULL;
    free(p->conds);
    p->conds = NULL, p->nconds = 0;
    if (!collect_conds(p, p->g)) r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  graph_free(copy);
  pthread_mutex_unlock(&glock);
  return r;
}

/* ---- Graphviz ---- */
static const char *type_name(CUgraphNodeType t) {
  static const char *const names[] = {"kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event",
    "event_record", "ext_sem_signal", "ext_sem_wait", "mem_alloc", "mem_free", "batch_mem_op", "conditional"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "node";
}
static void dot(FILE *f, const cpu_graph *g, const char *prefix, int depth) {
  for (size_t i = 0; i < g->n; i++) {
    const cpu_node *n = g->nodes[i];
    Dl_info info;   /* a kernel node says its kernel */
    const char *k = n->type == CU_GRAPH_NODE_TYPE_KERNEL && dladdr(n->op.u.launch.l->f->e->fn, &info) ? info.dli_sname : NULL;
    fprintf(f, "  \"%s%zu\" [label=\"%s %zu%s%s\"];\n", prefix, i, type_name(n->type), i, k ? " " : "", k ? k : "");
    for (size_t k = 0; k < n->nin; k++) fprintf(f, "  \"%s%zu\" -> \"%s%zu\";\n", prefix, n->in[k]->idx, prefix, i);
    char sub[256];
    if (depth > 8) continue;
    if (n->child) {
      snprintf(sub, sizeof sub, "%s%zu.", prefix, i);
      dot(f, n->child, sub, depth + 1);
    }
    for (unsigned b = 0; b < n->nbodies; b++) {
      snprintf(sub, sizeof sub, "%s%zu.%u.", prefix, i, b);
      dot(f, G(n->bodies[b]), sub, depth + 1);
    }
  }
}
static CUresult c_GraphDebugDotPrint(CUgraph g, const char *path, unsigned flags) {
  (void)flags;
  if (!g || !path) return CUDA_ERROR_INVALID_VALUE;
  FILE *f = fopen(path, "w");
  if (!f) return CUDA_ERROR_OPERATING_SYSTEM;
  fprintf(f, "digraph cudalua_cpu_graph {\n");
  pthread_mutex_lock(&glock);
  dot(f, G(g), "n", 0);
  pthread_mutex_unlock(&glock);
  fprintf(f, "}\n");
  return fclose(f) ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_SUCCESS;
}

/* ---- the entry points, found before cpu_driver.c's (those of streams and events here are
   the capture-aware ones) ---- */
static const struct { const char *name; void *fn; } impls[] = {
  IMPL(cuGraphCreate, c_GraphCreate), IMPL(cuGraphDestroy, c_GraphDestroy), IMPL(cuGraphAddKernelNode, c_GraphAddKernelNode),
  IMPL(cuGraphAddMemcpyNode, c_GraphAddMemcpyNode), IMPL(cuGraphAddMemsetNode, c_GraphAddMemsetNode),
  IMPL(cuGraphAddHostNode, c_GraphAddHostNode), IMPL(cuGraphAddEmptyNode, c_GraphAddEmptyNode),
  IMPL(cuGraphAddChildGraphNode, c_GraphAddChildGraphNode), IMPL(cuGraphAddMemAllocNode, c_GraphAddMemAllocNode),
  IMPL(cuGraphAddMemFreeNode, c_GraphAddMemFreeNode), IMPL(cuGraphAddEventRecordNode, c_GraphAddEventRecordNode),
  IMPL(cuGraphAddEventWaitNode, c_GraphAddEventWaitNode), IMPL(cuGraphAddBatchMemOpNode, c_GraphAddBatchMemOpNode),
  IMPL(cuGraphBatchMemOpNodeGetParams, c_GraphBatchMemOpNodeGetParams),
  IMPL(cuGraphBatchMemOpNodeSetParams, c_GraphBatchMemOpNodeSetParams),
  IMPL(cuGraphConditionalHandleCreate, c_GraphConditionalHandleCreate), IMPL(cuGraphAddNode, c_GraphAddNode),
  IMPL(cuGraphAddDependencies, c_GraphAddDependencies), IMPL(cuGraphNodeGetDependentNodes, c_GraphNodeGetDependentNodes),
  IMPL(cuGraphGetNodes, c_GraphGetNodes), IMPL(cuGraphNodeGetType, c_GraphNodeGetType),
  IMPL(cuGraphChildGraphNodeGetGraph, c_GraphChildGraphNodeGetGraph), IMPL(cuGraphDestroyNode, c_GraphDestroyNode),
  IMPL(cuGraphKernelNodeSetAttribute, c_GraphKernelNodeSetAttribute), IMPL(cuGraphClone, c_GraphClone),
  IMPL(cuGraphNodeFindInClone, c_GraphNodeFindInClone), IMPL(cuGraphInstantiate, c_GraphInstantiate),
  IMPL(cuGraphExecDestroy, c_GraphExecDestroy), IMPL(cuGraphLaunch, c_GraphLaunch), IMPL(cuGraphUpload, c_GraphUpload),
  IMPL(cuGraphExecKernelNodeSetParams, c_GraphExecKernelNodeSetParams),
  IMPL(cuGraphExecMemcpyNodeSetParams, c_GraphExecMemcpyNodeSetParams),
  IMPL(cuGraphExecMemsetNodeSetParams, c_GraphExecMemsetNodeSetParams),
  IMPL(cuGraphExecBatchMemOpNodeSetParams, c_GraphExecBatchMemOpNodeSetParams),
  IMPL(cuGraphExecChildGraphNodeSetParams, c_GraphExecChildGraphNodeSetParams),
  IMPL(cuGraphExecEventRecordNodeSetEvent, c_GraphExecEventRecordNodeSetEvent),
  IMPL(cuGraphExecEventWaitNodeSetEvent, c_GraphExecEventWaitNodeSetEvent), IMPL(cuGraphNodeSetEnabled, c_GraphNodeSetEnabled),
  IMPL(cuGraphExecUpdate, c_GraphExecUpdate), IMPL(cuGraphDebugDotPrint, c_GraphDebugDotPrint),
  IMPL(cuStreamBeginCapture, c_StreamBeginCapture), IMPL(cuStreamBeginCaptureToGraph, c_StreamBeginCaptureToGraph),
  IMPL(cuStreamEndCapture, c_StreamEndCapture), IMPL(cuStreamIsCapturing, c_StreamIsCapturing),
  IMPL(cuStreamGetCaptureInfo, c_StreamGetCaptureInfo), IMPL(cuStreamUpdateCaptureDependencies, c_StreamUpdateCaptureDependencies),
  IMPL(cuEventRecord, c_EventRecord), IMPL(cuEventRecordWithFlags, c_EventRecordWithFlags),
  IMPL(cuStreamWaitEvent, c_StreamWaitEvent), IMPL(cuStreamDestroy, c_StreamDestroy), IMPL(cuMemAllocAsync, c_MemAllocAsync),
};

void *cl_cpu_symbol(const char *name) {
  for (size_t i = 0; name && i < sizeof impls / sizeof impls[0]; i++)
    if (!strcmp(impls[i].name, name)) return impls[i].fn;
  return cpu_driver_symbol(name);
}
