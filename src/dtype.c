/* dtype.c: element types, and converting Lua values to and from elements with checks. */
#include <float.h>
#include <math.h>
#include <string.h>
#include "cl.h"

const cl_dtype_info cl_dtypes[CL_NDTYPE] = {
  {"float32", "f4", 4, "<f4", "float"},   {"float64", "f8", 8, "<f8", "double"},
  {"int8", "i1", 1, "|i1", "signed char"}, {"int16", "i2", 2, "<i2", "short"},
  {"int32", "i4", 4, "<i4", "int"},        {"int64", "i8", 8, "<i8", "long long"},
  {"uint8", "u1", 1, "|u1", "unsigned char"}, {"uint16", "u2", 2, "<u2", "unsigned short"},
  {"uint32", "u4", 4, "<u4", "unsigned int"}, {"uint64", "u8", 8, "<u8", "unsigned long long"},
  {"bool", "b1", 1, "|b1", "bool"},        {"float16", "f2", 2, "<f2", "__half"},
  /* bfloat16 has no typestr of its own: "<V2" (two raw bytes) is what NumPy's ml_dtypes uses;
     complex elements are {re, im} pairs of float or double, cuComplex's layout */
  {"bfloat16", "bf16", 2, "<V2", "__nv_bfloat16"},
  {"complex64", "c8", 8, "<c8", "cuFloatComplex"}, {"complex128", "c16", 16, "<c16", "cuDoubleComplex"},
};

#define DTYPE_MT "cudalua.dtype"
static const char names_key = 0;   /* registry: dtype name -> id */

/* IEEE half <-> float, round to nearest even */
float cl_half_to_float(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0) {
    if (m == 0) u = s;
    else { float f = ldexpf((float)m, -24); return s ? -f : f; }
  } else if (e == 31) u = s | 0x7f800000 | (m << 13);
  else u = s | ((e + 112) << 23) | (m << 13);
  float f; memcpy(&f, &u, 4); return f;
}

uint16_t cl_float_to_half(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  uint16_t s = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffff;
  if (a >= 0x7f800000) return s | 0x7c00 | (a > 0x7f800000 ? 0x200 : 0);
  if (a >= 0x477ff000) return s | 0x7c00;            /* rounds past 65504: inf */
  if (a < 0x38800000) {                              /* subnormal half */
    float v = fabsf(f) * 16777216.0f;                /* 2^24 */
    return s | (uint16_t)lrintf(v);
  }
  uint32_t r = a + 0xfff + ((a >> 13) & 1);          /* round to nearest even */
  return s | (uint16_t)((r - 0x38000000) >> 13);
}

/* bfloat16 is the top half of a float32, rounded to nearest even */
float cl_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f; memcpy(&f, &u, 4); return f;
}

uint16_t cl_float_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);   /* NaN stays NaN */
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

int cl_checkdtype(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TSTRING) {
    /* names are looked up in a table: interned strings hash once, no strcmp chain */
    lua_rawgetp(L, LUA_REGISTRYINDEX, &names_key);
    lua_pushvalue(L, idx);
    int found = lua_rawget(L, -2) == LUA_TNUMBER;
    int id = (int)lua_tointeger(L, -1);
    lua_pop(L, 2);
    if (found) return id;   /* the table holds every name and alias */
    return cl_argerror(L, idx, lua_pushfstring(L, "unknown dtype '%s'", lua_tostring(L, idx)));
  }
  int *p = luaL_testudata(L, idx, DTYPE_MT);
  if (!p) return cl_typeerror(L, idx, "dtype (cuda.float32, \"float32\", ...)");
  return *p;
}

int cl_optdtype(lua_State *L, int idx, int def) {
  return lua_isnoneornil(L, idx) ? def : cl_checkdtype(L, idx);
}

void cl_pushdtype(lua_State *L, int dt) {
  lua_getfield(L, LUA_REGISTRYINDEX, DTYPE_MT ".all");
  lua_rawgeti(L, -1, dt + 1);
  lua_remove(L, -2);
}

/* "where" gets the element's index only when an error is raised: filling is a hot loop */
static const char *at(lua_State *L, const char *where, lua_Integer index) {
  return index > 0 ? lua_pushfstring(L, "%s: element %I", where, index) : where;
}

static int fit_error(lua_State *L, int idx, int dt, const char *where, lua_Integer index) {
  where = at(L, where, index);
  return cl_error(L, where, "value %s does not fit %s", luaL_tolstring(L, idx, NULL),
                    cl_dtypes[dt].name);
}

/* v as bfloat16, rounded to nearest even; 0 when a finite v does not fit (it rounds to inf) */
static int to_bf16(double v, uint16_t *b) {
  if (isfinite(v) && fabs(v) > FLT_MAX) return 0;   /* (float)v would be undefined */
  *b = cl_float_to_bf16((float)v);
  return !isfinite(v) || (*b & 0x7fff) != 0x7f80;
}

/* the one conversion of a Lua number (or a boolean for bool) to an element of a real dtype,
   with the range checks; says what went wrong instead of raising, so that each caller words
   it: elements here (cl_tovalue), kernel arguments in args.c */
static inline int convert(lua_State *L, int idx, int dt, void *p) {
  int t = lua_type(L, idx);
  if (dt == CL_BOOL && t == LUA_TBOOLEAN) { *(uint8_t *)p = (uint8_t)lua_toboolean(L, idx); return CL_CONV_OK; }
  if (t != LUA_TNUMBER) return CL_CONV_TYPE;
  if (dt == CL_F32 || dt == CL_F64 || dt == CL_F16 || dt == CL_BF16) {
    double v = lua_tonumber(L, idx);
    if (dt == CL_F64) { *(double *)p = v; return CL_CONV_OK; }
    if (dt == CL_BF16) {
      uint16_t b;
      if (!to_bf16(v, &b)) return CL_CONV_RANGE;
      memcpy(p, &b, 2);
      return CL_CONV_OK;
    }
    double lim = dt == CL_F32 ? FLT_MAX : 65504.0;
    if (isfinite(v) && fabs(v) > lim) return CL_CONV_RANGE;
    if (dt == CL_F32) *(float *)p = (float)v;
    else *(uint16_t *)p = cl_float_to_half((float)v);
    return CL_CONV_OK;
  }
  int isint;
  lua_Integer i = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    double v = lua_tonumber(L, idx);
    /* uint64 values past 2^63 only exist as floats in Lua */
    if (dt == CL_U64 && v == floor(v) && v >= 0 && v < 18446744073709551616.0) {
      *(uint64_t *)p = (uint64_t)v; return CL_CONV_OK;
    }
    return v == floor(v) ? CL_CONV_RANGE : CL_CONV_NOTINT;   /* integral: past 64 bits */
  }
  /* nothing is written where the value does not fit */
#define FIT(cond, T) if (!(cond)) return CL_CONV_RANGE; *(T *)p = (T)i; break
  switch (dt) {
    case CL_I8: FIT(i >= INT8_MIN && i <= INT8_MAX, int8_t);
    case CL_I16: FIT(i >= INT16_MIN && i <= INT16_MAX, int16_t);
    case CL_I32: FIT(i >= INT32_MIN && i <= INT32_MAX, int32_t);
    case CL_I64: FIT(1, int64_t);
    case CL_U8: FIT(i >= 0 && i <= UINT8_MAX, uint8_t);
    case CL_U16: FIT(i >= 0 && i <= UINT16_MAX, uint16_t);
    case CL_U32: FIT(i >= 0 && i <= (lua_Integer)UINT32_MAX, uint32_t);
    case CL_U64: FIT(i >= 0, uint64_t);
    case CL_BOOL: FIT(i == 0 || i == 1, uint8_t);
  }
#undef FIT
  return CL_CONV_OK;
}

/* a complex element: a number (imaginary part 0) or a pair {re, im}; its parts in re, im */
static int convert_complex(lua_State *L, int idx, int dt, void *p, double *re, double *im) {
  int t = lua_type(L, idx);
  *re = *im = 0;
  if (t == LUA_TNUMBER) *re = lua_tonumber(L, idx);
  else if (t == LUA_TTABLE && lua_rawlen(L, idx) == 2) {
    int first = lua_rawgeti(L, idx, 1) == LUA_TNUMBER;
    int ok = first && lua_rawgeti(L, idx, 2) == LUA_TNUMBER;
    if (ok) { *re = lua_tonumber(L, -2); *im = lua_tonumber(L, -1); }
    lua_pop(L, first ? 2 : 1);
    if (!ok) return CL_CONV_TYPE;
  } else return CL_CONV_TYPE;
  if (dt == CL_C128) { double v[2] = {*re, *im}; memcpy(p, v, 16); return CL_CONV_OK; }
  if ((isfinite(*re) && fabs(*re) > FLT_MAX) || (isfinite(*im) && fabs(*im) > FLT_MAX)) return CL_CONV_RANGE;
  float v[2] = {(float)*re, (float)*im};
  memcpy(p, v, 8);
  return CL_CONV_OK;
}

int cl_convert(lua_State *L, int idx, int dt, void *p) {
  double re, im;
  return cl_is_complex(dt) ? convert_complex(L, idx, dt, p, &re, &im) : convert(L, idx, dt, p);
}

void cl_tovalue(lua_State *L, int idx, int dt, void *p, const char *where, lua_Integer index) {
  idx = lua_absindex(L, idx);   /* messages push strings */
  if (cl_is_complex(dt)) {
    double re, im;
    int st = convert_complex(L, idx, dt, p, &re, &im);
    if (st == CL_CONV_TYPE)
      cl_error(L, at(L, where, index), "expected a number or a pair {re, im} for %s, got %s",
               cl_dtypes[dt].name, lua_type(L, idx) == LUA_TTABLE ? "another table" : luaL_typename(L, idx));
    if (st == CL_CONV_RANGE)
      cl_error(L, at(L, where, index), "value {%s, %s} does not fit complex64", lua_pushfstring(L, "%f", re),
               lua_pushfstring(L, "%f", im));
    return;
  }
  switch (convert(L, idx, dt, p)) {
    case CL_CONV_TYPE:
      cl_error(L, at(L, where, index), "expected a number for %s, got %s", cl_dtypes[dt].name,
                 luaL_typename(L, idx));
      break;
    case CL_CONV_RANGE: fit_error(L, idx, dt, where, index); break;
    case CL_CONV_NOTINT:
      where = at(L, where, index);
      cl_error(L, where, "value %s is not an integer (dtype %s)",
                 luaL_tolstring(L, idx, NULL), cl_dtypes[dt].name);
  }
}

/* a complex element's two parts */
void cl_complex_parts(int dt, const void *p, double *re, double *im) {
  if (dt == CL_C64) { float v[2]; memcpy(v, p, 8); *re = v[0]; *im = v[1]; }
  else { double v[2]; memcpy(v, p, 16); *re = v[0]; *im = v[1]; }
}

void cl_pushvalue(lua_State *L, int dt, const void *p) {
  switch (dt) {
    case CL_F32: lua_pushnumber(L, *(const float *)p); break;
    case CL_F64: lua_pushnumber(L, *(const double *)p); break;
    case CL_F16: lua_pushnumber(L, cl_half_to_float(*(const uint16_t *)p)); break;
    case CL_BF16: { uint16_t b; memcpy(&b, p, 2); lua_pushnumber(L, cl_bf16_to_float(b)); break; }
    case CL_C64: case CL_C128: {   /* a new pair {re, im} */
      double re, im;
      cl_complex_parts(dt, p, &re, &im);
      lua_createtable(L, 2, 0);
      lua_pushnumber(L, re); lua_rawseti(L, -2, 1);
      lua_pushnumber(L, im); lua_rawseti(L, -2, 2);
      break;
    }
    case CL_I8: lua_pushinteger(L, *(const int8_t *)p); break;
    case CL_I16: lua_pushinteger(L, *(const int16_t *)p); break;
    case CL_I32: lua_pushinteger(L, *(const int32_t *)p); break;
    case CL_I64: lua_pushinteger(L, *(const int64_t *)p); break;
    case CL_U8: lua_pushinteger(L, *(const uint8_t *)p); break;
    case CL_U16: lua_pushinteger(L, *(const uint16_t *)p); break;
    case CL_U32: lua_pushinteger(L, *(const uint32_t *)p); break;
    case CL_U64: {
      uint64_t v = *(const uint64_t *)p;
      if (v <= (uint64_t)LUA_MAXINTEGER) lua_pushinteger(L, (lua_Integer)v);
      else lua_pushnumber(L, (lua_Number)v);   /* no Lua integer holds it */
      break;
    }
    case CL_BOOL: lua_pushboolean(L, *(const uint8_t *)p != 0); break;
  }
}

static int dt_tostring(lua_State *L) {
  lua_pushstring(L, cl_dtypes[*(int *)cl_checkudata(L, 1, DTYPE_MT)].name);
  return 1;
}

static int dt_index(lua_State *L) {
  const cl_dtype_info *d = &cl_dtypes[*(int *)cl_checkudata(L, 1, DTYPE_MT)];
  const char *k = cl_checklstring(L, 2, NULL);
  if (!strcmp(k, "name")) lua_pushstring(L, d->name);
  else if (!strcmp(k, "itemsize")) lua_pushinteger(L, d->size);
  else if (!strcmp(k, "typestr")) lua_pushstring(L, d->typestr);
  else if (!strcmp(k, "ctype")) lua_pushstring(L, d->ctype);
  else if (!strcmp(k, "is_float"))
    lua_pushboolean(L, d == &cl_dtypes[CL_F32] || d == &cl_dtypes[CL_F64] || d == &cl_dtypes[CL_F16] ||
                       d == &cl_dtypes[CL_BF16]);
  else if (!strcmp(k, "is_complex")) lua_pushboolean(L, cl_is_complex((int)(d - cl_dtypes)));
  else lua_pushnil(L);
  return 1;
}

static int l_dtype(lua_State *L) {
  cl_pushdtype(L, cl_checkdtype(L, 1));
  return 1;
}

void cl_open_dtype(lua_State *L) {
  static const luaL_Reg meta[] = {{"__tostring", dt_tostring}, {NULL, NULL}};
  cl_class_define(L, &(cl_class){DTYPE_MT, NULL, dt_index, meta, NULL});
  lua_createtable(L, CL_NDTYPE, 0);
  for (int i = 0; i < CL_NDTYPE; i++) {
    int *p = lua_newuserdatauv(L, sizeof(int), 0);
    *p = i;
    luaL_setmetatable(L, DTYPE_MT);
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, cl_dtypes[i].name);   /* cuda.float32, ... in the module table */
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, LUA_REGISTRYINDEX, DTYPE_MT ".all");
  lua_createtable(L, 0, 2 * CL_NDTYPE + 3);
  for (int i = 0; i < CL_NDTYPE; i++) {
    lua_pushinteger(L, i); lua_setfield(L, -2, cl_dtypes[i].name);
    lua_pushinteger(L, i); lua_setfield(L, -2, cl_dtypes[i].alias);
  }
  lua_pushinteger(L, CL_F32); lua_setfield(L, -2, "float");
  lua_pushinteger(L, CL_F64); lua_setfield(L, -2, "double");
  lua_pushinteger(L, CL_I32); lua_setfield(L, -2, "int");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &names_key);
  lua_pushcfunction(L, l_dtype); lua_setfield(L, -2, "dtype");
}
