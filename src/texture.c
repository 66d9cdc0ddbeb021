/* texture.c: texture objects (cuda.texture) and surface objects (cuda.surface), kernel arguments
   of type cudaTextureObject_t / cudaSurfaceObject_t (both unsigned long long handles, which
   args.c passes). The object is a memory record of kind CL_HANDLE (memory.c) and holds a
   reference to the memory it reads: a launch marks both used, so closing either, in any order,
   destroys nothing the GPU may still read. Every refusal the driver would make (or, for wrap and
   mirror without normalised coordinates, silently turn into clamping) is said first, in words. */
#include <string.h>
#include "cl.h"

static void destroy_texture(void *ud, CUdeviceptr h) { (void)ud; CU0(cuTexObjectDestroy, (CUtexObject)h); }
static void destroy_surface(void *ud, CUdeviceptr h) { (void)ud; CU0(cuSurfObjectDestroy, (CUsurfObject)h); }

/* the metatables' second keys (cl_class_test). A closed object of either kind takes the third,
   which has no __gc: Lua then skips its finalizer, a protected call a texture made and closed
   in a loop would pay once more each (cuda.texture's bench row) */
static const char tex_key = 0, surf_key = 0, closed_key = 0;

cl_texref *cl_totexref(lua_State *L, int idx) {
  cl_texref *t = lua_touserdata(L, idx);
  if (!t || !lua_getmetatable(L, idx)) return NULL;
  int top = lua_gettop(L), ours = 0;
  static const char *const keys[] = {&tex_key, &surf_key, &closed_key};
  for (int i = 0; i < 3 && !ours; i++) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, keys[i]);
    ours = lua_rawequal(L, -1, top);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return ours ? t : NULL;
}

/* the user's options, checked before any driver call */
typedef struct {
  int filter, normalized, read_float, srgb, channels, naddr;
  CUaddress_mode addr[3];
  float border[4];
} texopts;

static const char *const filters[] = {"point", "linear", NULL};
static const char *const modes[] = {"wrap", "clamp", "mirror", "border", NULL};   /* CUaddress_mode's order */
static const char *const reads[] = {"element", "normalized_float", NULL};

static int option(lua_State *L, int idx, const char *key, const char *const lst[], int def) {
  if (lua_getfield(L, idx, key) == LUA_TNIL) { lua_pop(L, 1); return def; }
  const char *v = lua_tostring(L, -1);
  for (int i = 0; v && lst[i]; i++)
    if (!strcmp(lst[i], v) && lua_type(L, -1) == LUA_TSTRING) { lua_pop(L, 1); return i; }
  return cl_error(L, "cuda.texture", "%s must be '%s' or '%s', got %s", key, lst[0], lst[1],
                  v ? v : luaL_typename(L, -1));
}

static CUaddress_mode mode_of(lua_State *L, int idx) {
  const char *v = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
  for (int i = 0; v && modes[i]; i++) if (!strcmp(modes[i], v)) return (CUaddress_mode)i;
  cl_error(L, "cuda.texture", "address must be 'clamp', 'wrap', 'mirror' or 'border' (or a list of them, "
           "one per dimension), got %s", v ? v : luaL_typename(L, idx));
  return CU_TR_ADDRESS_MODE_CLAMP;
}

static void parse_address(lua_State *L, int idx, texopts *o) {
  o->addr[0] = o->addr[1] = o->addr[2] = CU_TR_ADDRESS_MODE_CLAMP;
  int t = lua_getfield(L, idx, "address");
  if (t == LUA_TTABLE) {
    o->naddr = (int)lua_rawlen(L, -1);
    if (o->naddr < 1 || o->naddr > 3) cl_error(L, "cuda.texture", "address lists 1 to 3 modes, got %d", o->naddr);
    for (int i = 0; i < o->naddr; i++) { lua_rawgeti(L, -1, i + 1); o->addr[i] = mode_of(L, -1); lua_pop(L, 1); }
    /* dimensions past the list take its last mode, as cuda.core's TextureObject does: {"wrap"}
       on a 2-D texture wraps both, rather than clamping y unasked */
    for (int i = o->naddr; i < 3; i++) o->addr[i] = o->addr[o->naddr - 1];
  } else if (t != LUA_TNIL) {
    o->addr[0] = o->addr[1] = o->addr[2] = mode_of(L, -1);
  }
  lua_pop(L, 1);
}

static void parse_border(lua_State *L, int idx, texopts *o) {
  if (lua_getfield(L, idx, "border") == LUA_TNIL) { lua_pop(L, 1); return; }
  if (!lua_istable(L, -1) || lua_rawlen(L, -1) < 1 || lua_rawlen(L, -1) > 4)
    cl_error(L, "cuda.texture", "border must be a list of 1 to 4 numbers (the value outside the texture, per channel)");
  for (int i = 0; i < (int)lua_rawlen(L, -1); i++) {
    lua_rawgeti(L, -1, i + 1);
    if (lua_type(L, -1) != LUA_TNUMBER) cl_error(L, "cuda.texture", "border[%d] must be a number, got %s", i + 1, luaL_typename(L, -1));
    o->border[i] = (float)lua_tonumber(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

static void parse_opts(lua_State *L, int idx, texopts *o) {
  static const char *const names[] = {"filter", "address", "normalized", "read", "srgb", "border", "channels", NULL};
  memset(o, 0, sizeof *o);
  o->channels = 1;
  o->addr[0] = o->addr[1] = o->addr[2] = CU_TR_ADDRESS_MODE_CLAMP;
  if (lua_isnoneornil(L, idx)) return;
  if (!lua_istable(L, idx)) cl_error(L, "cuda.texture", "argument 2: options table expected, got %s", luaL_typename(L, idx));
  cl_check_options(L, idx, "cuda.texture", names);
  o->filter = option(L, idx, "filter", filters, 0);
  o->read_float = option(L, idx, "read", reads, 0);
  o->normalized = cl_opt_bool(L, idx, "normalized", "cuda.texture") == 1;
  o->srgb = cl_opt_bool(L, idx, "srgb", "cuda.texture") == 1;
  parse_address(L, idx, o);
  parse_border(L, idx, o);
  if (lua_getfield(L, idx, "channels") != LUA_TNIL) {
    if (!lua_isinteger(L, -1)) cl_error(L, "cuda.texture", "channels must be an integer, got %s", luaL_typename(L, -1));
    o->channels = (int)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
}

/* what the driver refuses for these data, or does other than asked, said first */
static void check_sampling(lua_State *L, int dt, const texopts *o, int linear_mem) {
  int is_int = dt != CL_F32 && dt != CL_F16;
  int small = dt == CL_I8 || dt == CL_U8 || dt == CL_I16 || dt == CL_U16;
  if (o->read_float && !small)
    cl_error(L, "cuda.texture", "read = 'normalized_float' takes 8- and 16-bit integers, not %s", cl_dtypes[dt].name);
  if (o->filter == CU_TR_FILTER_MODE_LINEAR && is_int && !o->read_float)
    cl_error(L, "cuda.texture", "linear filtering needs float results: %s read as elements cannot be "
             "interpolated (give read = 'normalized_float' for 8- and 16-bit integers)", cl_dtypes[dt].name);
  if (o->srgb && !(dt == CL_U8 && o->read_float))
    cl_error(L, "cuda.texture", "srgb takes uint8 data read as 'normalized_float'");
  for (int i = 0; i < 3; i++)
    if (!o->normalized && (o->addr[i] == CU_TR_ADDRESS_MODE_WRAP || o->addr[i] == CU_TR_ADDRESS_MODE_MIRROR))
      cl_error(L, "cuda.texture", "address '%s' needs normalized = true (with unnormalized coordinates CUDA "
               "clamps instead)", modes[o->addr[i]]);
  if (linear_mem && (o->filter || o->normalized))
    cl_error(L, "cuda.texture", "a texture over 1-D linear memory (tex1Dfetch) takes no filtering and no "
             "normalized coordinates (use a CUDA array or a 2-D array for those)");
}

/* an attribute of ctx's device (not the selected one: the array may be another device's) */
static int attr_of(CUcontext ctx, CUdevice_attribute a) {
  int v = 0;
  CUdevice d;
  if (CU0(cuDeviceGet, &d, cl_device_of(ctx)) == CUDA_SUCCESS) CU0(cuDeviceGetAttribute, &v, a, d);
  return v;
}

/* the resource of a device array: 1-D linear or 2-D pitched memory, aligned as the device needs */
static void device_resource(lua_State *L, cl_array *a, const texopts *o, CUDA_RESOURCE_DESC *r) {
  size_t es = cl_dtypes[a->dtype].size;
  CUdeviceptr p = cl_devptr(a);
  if (a->kind == CL_HOST || !p) cl_error(L, "cuda.texture", "the array must be in device memory (device, managed, mapped or pinned), not a pageable host array");
  if (a->mem->gmem) cl_error(L, "cuda.texture", "the array's memory is a graph's (it exists only while that graph runs)");
  if (a->ndim != 1 && a->ndim != 2) cl_error(L, "cuda.texture", "a device array gives a 1-D or 2-D texture, got %d dimensions (copy it into a cuda_array)", a->ndim);
  cl_need_contiguous(L, a, "cuda.texture", "the array");
  int64_t last = a->shape[a->ndim - 1];
  if (last % o->channels) cl_error(L, "cuda.texture", "the last extent (%I) is not a multiple of channels (%d)", (lua_Integer)last, o->channels);
  cl_use_ctx(L, a->mem->ctx);   /* cuTexObjectCreate runs there */
  size_t pitch = (size_t)last * es;
  int palign = attr_of(a->mem->ctx, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT);
  if (a->ndim == 2 && palign > 0 && pitch % (size_t)palign)
    cl_error(L, "cuda.texture", "a row is %I bytes, not a multiple of the device's pitch alignment (%d bytes): "
             "pad the rows to a multiple of %d elements", (lua_Integer)pitch, palign, (int)(palign / (int)es));
  /* TEXTURE_ALIGNMENT is 512 bytes on NVIDIA GPUs, while the stream-ordered pool that device
     arrays come from promises 256 (cudaMallocAsync's documented alignment) */
  int align = attr_of(a->mem->ctx, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
  if (align > 0 && p % (CUdeviceptr)align)
    cl_error(L, "cuda.texture", "the array's address is not a multiple of %d bytes, as textures over device "
             "memory need (device arrays are only sure to be 256-byte aligned): copy it into a cuda_array", align);
  CUarray_format f = cl_array_format(a->dtype);
  if (a->ndim == 1) {
    r->resType = CU_RESOURCE_TYPE_LINEAR;
    r->res.linear.devPtr = p; r->res.linear.format = f; r->res.linear.numChannels = (unsigned)o->channels;
    r->res.linear.sizeInBytes = cl_nbytes(a);
    return;
  }
  r->resType = CU_RESOURCE_TYPE_PITCH2D;
  r->res.pitch2D.devPtr = p; r->res.pitch2D.format = f; r->res.pitch2D.numChannels = (unsigned)o->channels;
  r->res.pitch2D.width = (size_t)(last / o->channels); r->res.pitch2D.height = (size_t)a->shape[0];
  r->res.pitch2D.pitchInBytes = pitch;
}

/* the object for the source at 1 (kept in its user value: a view's memory may be its owner's,
   a module's variable or another library's block), holding src's record; pushed */
static cl_texref *push_ref(lua_State *L, const void *mt, cl_mem *src) {
  /* the reference first: the allocation may collect garbage, whose finalizers may close the
     source and free its record otherwise (the review's case) */
  cl_mem_ref(src);
  cl_texref *t = lua_newuserdatauv(L, sizeof *t, 1);
  memset(t, 0, sizeof *t);
  t->src = src;
  cl_class_set(L, mt);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return t;
}

/* t takes the object a closed one of its description left over ca (cuarray.c's spares): 1 */
static int reuse(lua_State *L, cl_cuarray *ca, cl_texref *t) {
  cl_spare sp;
  if (!cl_cuarray_spare_take(ca, t->surface, &t->desc, &sp)) return 0;
  t->obj = sp.obj;
  t->h = sp.obj->dptr;
  cl_mem_unref(L, sp.src);   /* (t holds its own; ca holds one too, so nothing goes) */
  return 1;
}

/* the driver's object h made: its record (if that fails, h is destroyed before the raise) */
static void set_obj(lua_State *L, cl_texref *t, CUcontext ctx, void (*destroy)(void *, CUdeviceptr), uint64_t h) {
  cl_mem *m = cl_mem_handle_try(L, ctx, 0, destroy, NULL, h);
  if (!m) { destroy(NULL, h); cl_error(L, NULL, "out of host memory"); }
  t->obj = m;
  t->h = h;
}

/* cuda.texture(source [, options]): source a cuda_array or a 1-D / 2-D device array */
static int l_texture(lua_State *L) {
  texopts o;
  parse_opts(L, 2, &o);
  cl_cuarray *ca = cl_tocuarray(L, 1);
  cl_array *a = ca ? NULL : cl_toarray(L, 1);
  if (!ca && !a) return cl_error(L, "cuda.texture", "argument 1: cuda_array or device array expected, got %s", luaL_typename(L, 1));
  if (ca && !ca->mem) return cl_error(L, "cuda.texture", "the CUDA array is closed");
  if (a && !a->mem) return cl_error(L, "cuda.texture", "the array is closed");
  /* (raw: a metamethod could close the array after the check above) */
  if (ca && lua_istable(L, 2) && (lua_pushliteral(L, "channels"), lua_rawget(L, 2)) != LUA_TNIL)
    return cl_error(L, "cuda.texture", "channels is the CUDA array's own (%d): give it to cuda.cuda_array", ca->channels);
  int dt = ca ? ca->dtype : a->dtype;
  cl_check_format(L, dt, ca ? ca->channels : o.channels, "cuda.texture");
  check_sampling(L, dt, &o, a && a->ndim == 1);
  CUDA_RESOURCE_DESC r;
  memset(&r, 0, sizeof r);
  cl_mem *src = ca ? ca->mem : a->mem;
  if (ca) { r.resType = CU_RESOURCE_TYPE_ARRAY; r.res.array.hArray = (CUarray)ca->mem->ud; cl_use_ctx(L, src->ctx); }
  else device_resource(L, a, &o, &r);
  CUDA_TEXTURE_DESC d;
  memset(&d, 0, sizeof d);
  memcpy(d.addressMode, o.addr, sizeof o.addr);
  d.filterMode = o.filter ? CU_TR_FILTER_MODE_LINEAR : CU_TR_FILTER_MODE_POINT;
  d.flags = (o.normalized ? CU_TRSF_NORMALIZED_COORDINATES : 0) | (o.srgb ? CU_TRSF_SRGB : 0) |
            (o.read_float || dt == CL_F32 || dt == CL_F16 ? 0 : CU_TRSF_READ_AS_INTEGER);
  memcpy(d.borderColor, o.border, sizeof o.border);
  /* the source held first: the create is parked, and a host function run meanwhile may close
     it (its free is then put off: the reference keeps the record) */
  cl_texref *t = push_ref(L, &tex_key, src);
  t->desc = d;
  if (ca && !ca->mem) return cl_error(L, "cuda.texture", "the CUDA array was closed meanwhile");
  if (ca && reuse(L, ca, t)) return 1;
  CUtexObject h = 0;
  cl_check(L, CU(cuTexObjectCreate, &h, &r, &d, NULL), "cuda.texture");
  set_obj(L, t, src->ctx, destroy_texture, h);
  return 1;
}

/* cuda.surface(cuda_array): the array was made with surface = true */
static int l_surface(lua_State *L) {
  cl_cuarray *ca = cl_tocuarray(L, 1);
  if (!ca) return cl_error(L, "cuda.surface", "argument 1: cuda_array expected, got %s",
                           cl_toarray(L, 1) ? "an array" : luaL_typename(L, 1));
  if (!ca->mem) return cl_error(L, "cuda.surface", "the CUDA array is closed");
  if (!ca->surface) return cl_error(L, "cuda.surface", "the CUDA array was made without surface = true "
                                    "(cuda.cuda_array(shape, dtype, {surface = true}))");
  CUDA_RESOURCE_DESC r;
  memset(&r, 0, sizeof r);
  r.resType = CU_RESOURCE_TYPE_ARRAY;
  r.res.array.hArray = (CUarray)ca->mem->ud;
  cl_mem *src = ca->mem;
  cl_use_ctx(L, src->ctx);
  cl_texref *t = push_ref(L, &surf_key, src);   /* (held before the parked create, as textures) */
  t->surface = 1;
  if (!ca->mem) return cl_error(L, "cuda.surface", "the CUDA array was closed meanwhile");
  if (reuse(L, ca, t)) return 1;
  CUsurfObject h = 0;
  cl_check(L, CU(cuSurfObjectCreate, &h, &r), "cuda.surface");
  set_obj(L, t, src->ctx, destroy_surface, h);
  return 1;
}

/* a closed object over a CUDA array still open is left to the array, for the next one of its
   description (not inside a host function: its releases are put off, as tools/stress.lua
   checks). 1: left there, the references with it */
static int spare(lua_State *L, cl_texref *t, cl_mem *obj, cl_mem *src) {
  if (!obj || cl_in_hostfn) return 0;
  lua_getiuservalue(L, 1, 1);
  cl_cuarray *ca = cl_tocuarray(L, -1);
  lua_pop(L, 1);
  if (!ca || ca->mem != src || !src) return 0;
  cl_cuarray_spare_put(L, ca, &(cl_spare){obj, src, t->surface, t->desc});
  return 1;
}

/* close, __gc, __close: the object and its hold on the memory go once queued work is done (or
   wait over its CUDA array for the next one alike) */
static int t_close(lua_State *L) {
  cl_texref *t = cl_totexref(L, 1);
  if (!t) return cl_error(L, NULL, "argument 1: texture or surface expected, got %s", luaL_typename(L, 1));
  cl_mem *obj = t->obj, *src = t->src;
  t->obj = t->src = NULL;
  t->h = 0;
  if (!spare(L, t, obj, src)) {
    cl_mem_unref(L, obj);
    cl_mem_unref(L, src);
  }
  lua_settop(L, 1);
  cl_class_set(L, &closed_key);
  return 0;
}

/* t.handle (the integer a kernel gets), t.closed; methods otherwise */
static int t_index(lua_State *L) {
  cl_texref *t = cl_totexref(L, 1);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
  const char *k = lua_tostring(L, 2);
  if (t && k && !strcmp(k, "handle")) {
    if (!t->h) return cl_error(L, t->surface ? "surface.handle" : "texture.handle", "closed");
    lua_pushinteger(L, (lua_Integer)t->h);
  } else if (t && k && !strcmp(k, "closed")) lua_pushboolean(L, t->h == 0);
  else return 0;
  return 1;
}

static int t_tostring(lua_State *L) {
  cl_texref *t = cl_totexref(L, 1);
  if (!t) return 0;
  if (t->h) lua_pushfstring(L, "cudalua.%s (handle %I)", t->surface ? "surface" : "texture", (lua_Integer)t->h);
  else lua_pushfstring(L, "cudalua.%s (closed)", t->surface ? "surface" : "texture");
  return 1;
}

void cl_open_texture(lua_State *L) {
  static const luaL_Reg m[] = {{"close", t_close}, {NULL, NULL}};
  static const luaL_Reg meta[] = {{"__gc", t_close}, {"__close", t_close}, {"__tostring", t_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){CL_TEXTURE, m, t_index, meta, &tex_key});
  cl_class_define(L, &(cl_class){CL_SURFACE, m, t_index, meta, &surf_key});
  cl_class_define(L, &(cl_class){"cudalua.closed_texref", m, t_index, meta + 1, &closed_key});
  lua_pushcfunction(L, l_texture); lua_setfield(L, -2, "texture");
  lua_pushcfunction(L, l_surface); lua_setfield(L, -2, "surface");
}
