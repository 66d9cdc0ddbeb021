/* capstate.c: what captures in the process and in this state: the guard that refuses what a
   capture forbids (the legacy stream, waits), and each capture's keep table (what its graph
   uses, kept alive; registered by capture id so that streams joined to it find it). The Lua
   methods that begin and end captures are in capture.c. */
#include "cl.h"

/* registry: capture id -> the capture's keep table, so that streams joined to a capture (by
   an event) find the table of the stream that began it */
#define CAPTURES "cudalua.captures"
/* registry: a conditional body's capture id -> the id of the capture it is part of */
#define PARENTS "cudalua.capture_parents"

/* whether cl_capture_guard would refuse: for callers that make its name only to raise */
int cl_capture_refuses(const cl_stream *s, int waits) {
  if (!cl_capturing) return 0;
  /* the legacy stream: its work would depend on a capturing blocking stream; and a wait for
     the whole device is refused by the driver while any stream captures (and it ends the
     capture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, seen with another thread's capture) */
  if (!s) return cl_capturing_blocking || waits;
  return waits && s->capture_ref;
}

void cl_capture_guard(lua_State *L, cl_stream *s, int waits, const char *where) {
  if (!cl_capture_refuses(s, waits)) return;
  if (!s)
    cl_error(L, where, "the legacy default stream cannot be used while a stream is "
               "capturing (pass the capturing stream, or end the capture first)");
  cl_error(L, where, "this would wait for a stream that is capturing (pageable host "
             "memory or no stream given); use pinned or device arrays and the stream");
}

/* the capture id of s, 0 when it is not capturing */
cuuint64_t cl_capture_id(lua_State *L, cl_stream *s) {
  if (s->capture_ref) return s->capture_id;   /* the stream that began it: no driver call */
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (CU(cuStreamGetCaptureInfo, s->h, &st, &id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS ||
      st != CU_STREAM_CAPTURE_STATUS_ACTIVE) return 0;
  return id;
}

/* s captures, its keep table on top (popped): registered under the capture's id, for the
   streams joined to it */
static void register_capture(lua_State *L, cl_stream *s) {
  s->capture_id = cl_capture_id(L, s);
  if (s->capture_id) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, CAPTURES);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, (lua_Integer)s->capture_id);
    lua_pop(L, 1);
  }
  s->capture_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (s->blocking) __atomic_add_fetch(&cl_capturing_blocking, 1, __ATOMIC_SEQ_CST);
}

/* s has begun capturing: a keep table of its own */
void cl_capture_begun(lua_State *L, cl_stream *s) {
  lua_newtable(L);
  register_capture(L, s);
}

int cl_capture_push_keep(lua_State *L, cl_stream *s) {
  if (!s) return 0;
  if (s->capture_ref) { lua_rawgeti(L, LUA_REGISTRYINDEX, s->capture_ref); return 1; }
  /* another stream of this state's may capture: without the driver's word unless one does (a
     launch in one state while another state captures asks nothing) */
  if (lua_getfield(L, LUA_REGISTRYINDEX, CAPTURES) != LUA_TTABLE) { lua_pop(L, 1); return 0; }
  cuuint64_t id = cl_capture_id(L, s);
  if (!id) { lua_pop(L, 1); return 0; }
  lua_rawgeti(L, -1, (lua_Integer)id);
  lua_remove(L, -2);
  if (lua_istable(L, -1)) return 1;
  lua_pop(L, 1);
  return 0;
}

void cl_capture_add(lua_State *L, int keepidx, const char *list, int boxidx) {
  keepidx = lua_absindex(L, keepidx);
  boxidx = lua_absindex(L, boxidx);
  if (lua_getfield(L, keepidx, list) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, keepidx, list);
  }
  lua_pushvalue(L, boxidx);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  lua_pop(L, 1);
}

void cl_capture_ended(lua_State *L, cl_stream *s) {
  cuuint64_t id = s->capture_id;   /* (an invalidated capture has none to ask for) */
  if (id && s->body) {   /* (the table goes with the state) */
    if (lua_getfield(L, LUA_REGISTRYINDEX, PARENTS) == LUA_TTABLE) {
      lua_pushnil(L);
      lua_rawseti(L, -2, (lua_Integer)id);
    }
    lua_pop(L, 1);
  }
  s->body = 0;
  if (id) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, CAPTURES);
    lua_pushnil(L);
    lua_rawseti(L, -2, (lua_Integer)id);
    lua_pushnil(L);
    int more = lua_next(L, -2);   /* the state's last capture: the table goes (see above) */
    lua_pop(L, more ? 3 : 1);
    if (!more) { lua_pushnil(L); lua_setfield(L, LUA_REGISTRYINDEX, CAPTURES); }
  }
  luaL_unref(L, LUA_REGISTRYINDEX, s->capture_ref);
  s->capture_ref = 0;
  s->capture_id = 0;
  __atomic_sub_fetch(&cl_capturing, 1, __ATOMIC_SEQ_CST);
  if (s->blocking) __atomic_sub_fetch(&cl_capturing_blocking, 1, __ATOMIC_SEQ_CST);
}

void cl_capture_body_begun(lua_State *L, cl_stream *body, cl_stream *outer) {
  cuuint64_t oid = cl_capture_id(L, outer);
  if (!cl_capture_push_keep(L, outer)) lua_newtable(L);   /* (outer's is always there) */
  register_capture(L, body);
  if (body->capture_id) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, PARENTS);
    lua_pushinteger(L, (lua_Integer)oid);
    lua_rawseti(L, -2, (lua_Integer)body->capture_id);
    lua_pop(L, 1);
  }
  body->body = 1;
}

int cl_capture_in_body(lua_State *L, cl_stream *s) {
  if (!s || !cl_capturing) return 0;
  if (s->body) return 1;
  if (lua_getfield(L, LUA_REGISTRYINDEX, PARENTS) != LUA_TTABLE) { lua_pop(L, 1); return 0; }
  cuuint64_t id = cl_capture_id(L, s);   /* a stream joined to a body's capture by an event */
  int in = id && lua_rawgeti(L, -1, (lua_Integer)id) != LUA_TNIL;
  lua_pop(L, id ? 2 : 1);
  return in;
}

int cl_capture_within(lua_State *L, cl_stream *s, cuuint64_t id) {
  cuuint64_t at = s ? cl_capture_id(L, s) : 0;
  if (!at) return 0;
  if (at == id) return 1;
  if (lua_getfield(L, LUA_REGISTRYINDEX, PARENTS) != LUA_TTABLE) { lua_pop(L, 1); return 0; }
  int found = 0;
  for (int depth = 0; at && !found && depth < 64; depth++) {   /* (bodies nest a few deep) */
    lua_rawgeti(L, -1, (lua_Integer)at);
    at = (cuuint64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    found = at == id;
  }
  lua_pop(L, 1);
  return found;
}

/* the stream is closed or collected while it captures: the capture is ended and dropped */
int cl_capture_abandon(lua_State *L, cl_stream *s) {
  if (!s || !s->capture_ref) return 0;
  CUcontext prev = cl_ctx_swap(s->ctx);
  CUgraph h = NULL;
  if (CU(cuStreamEndCapture, s->h, &h) == CUDA_SUCCESS && h) CU(cuGraphDestroy, h);
  cl_ctx_swap(prev);
  cl_capture_ended(L, s);
  return 1;
}
