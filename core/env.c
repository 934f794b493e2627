#include "core/env.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/memory.h"
#include "core/parse.h"

static const dt_env_info env_table[DT_ENV_COUNT] = {
#define DT_ENV_INT(id, lo, hi, def, unset, group, doc) \
  {"DT_" #id, DT_ENV_TYPE_INT, (lo), (hi), NULL, (def), (unset), (group), (doc)},
#define DT_ENV_BOOL(id, def, unset, group, doc) \
  {"DT_" #id, DT_ENV_TYPE_BOOL, 0, 0, NULL, (def), (unset), (group), (doc)},
#define DT_ENV_BYTES(id, lo, def, unset, group, doc) \
  {"DT_" #id, DT_ENV_TYPE_BYTES, (lo), 0, NULL, (def), (unset), (group), (doc)},
#define DT_ENV_CHOICE(id, choices, def, unset, group, doc) \
  {"DT_" #id, DT_ENV_TYPE_CHOICE, 0, 0, (choices), (def), (unset), (group), (doc)},
#define DT_ENV_STRING(id, def, unset, group, doc) \
  {"DT_" #id, DT_ENV_TYPE_STRING, 0, 0, NULL, (def), (unset), (group), (doc)},
#include "core/env_params.def"
#undef DT_ENV_INT
#undef DT_ENV_BOOL
#undef DT_ENV_BYTES
#undef DT_ENV_CHOICE
#undef DT_ENV_STRING
};

const dt_env_info *dt_env_info_of(dt_env_param p) {
  if ((int)p < 0 || p >= DT_ENV_COUNT)
    return NULL;
  return &env_table[p];
}

const char *dt_env_raw(dt_env_param p) {
  const dt_env_info *e = dt_env_info_of(p);
  if (!e)
    return NULL;
  const char *v = getenv(e->name);
  return v && v[0] ? v : NULL;
}

bool dt_env_is_set(dt_env_param p) { return dt_env_raw(p) != NULL; }

const char *dt_env_default_text(dt_env_param p) {
  const dt_env_info *e = dt_env_info_of(p);
  if (!e)
    return "";
  return e->default_value ? e->default_value : e->unset ? e->unset : "unset";
}

const char *dt_env_accepted(dt_env_param p, char *buf, size_t cap) {
  const dt_env_info *e = dt_env_info_of(p);
  char list[256];
  if (!e || cap == 0)
    return "";
  switch (e->type) {
    case DT_ENV_TYPE_INT:
      snprintf(buf, cap, "an integer in %lld..%lld", (long long)e->min, (long long)e->max);
      break;
    case DT_ENV_TYPE_BOOL: snprintf(buf, cap, "1 or 0 (true/false, on/off, yes/no)"); break;
    case DT_ENV_TYPE_BYTES:
      if (e->min > 0)
        snprintf(buf, cap, "a byte count of at least %lld, such as 1048576, 64K, 512M or 2G",
                 (long long)e->min);
      else
        snprintf(buf, cap, "a byte count such as 1048576, 64K, 512M or 2G");
      break;
    case DT_ENV_TYPE_CHOICE:
      dt_format_choices(e->choices, list, sizeof list);
      snprintf(buf, cap, "one of %s", list);
      break;
    case DT_ENV_TYPE_STRING: snprintf(buf, cap, "any non-empty text"); break;
  }
  return buf;
}

static dt_status bad_value(dt_env_param p, const char *value) {
  char accepted[256];
  return DT_ERROR(DT_ERR_INVALID_ARG,
                  "environment variable %s: invalid value '%s': expected %s (or unset it)",
                  env_table[p].name, value, dt_env_accepted(p, accepted, sizeof accepted));
}

static dt_status wrong_type(dt_env_param p, dt_env_type want) {
  const dt_env_info *e = dt_env_info_of(p);
  if (!e)
    return DT_ERROR(DT_ERR_INVALID_ARG, "environment parameter %d: no such parameter", (int)p);
  if (e->type != want)
    return DT_ERROR(DT_ERR_INVALID_ARG, "environment variable %s: read with the wrong getter",
                    e->name);
  return DT_OK;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  if (!isdigit((unsigned char)s[0]) && s[0] != '-' && s[0] != '+')
    return false; /* strtoll would skip leading blanks */
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}

static bool parse_bytes(const char *s, size_t *out) {
  /* dt_parse_bytes records its own message; bad_value replaces it. */
  size_t v = 0;
  if (dt_parse_bytes(s, &v) != DT_OK)
    return false;
  *out = v;
  return true;
}

/* The text to parse: the value when set, else the table's default (NULL
 * when there is none). */
static const char *value_or_default(dt_env_param p, bool *is_set) {
  const char *v = dt_env_raw(p);
  *is_set = v != NULL;
  return v ? v : env_table[p].default_value;
}

/* Reads text into *out for the parameter e; false when it is not a value
 * of e's type. */
typedef bool (*param_parse_fn)(const dt_env_info *e, const char *text, void *out);

static bool parse_int_param(const dt_env_info *e, const char *s, void *out) {
  return parse_int(s, e->min, e->max, (int64_t *)out);
}
static bool parse_bool_param(const dt_env_info *e, const char *s, void *out) {
  (void)e;
  return dt_parse_bool(s, (bool *)out);
}
static bool parse_bytes_param(const dt_env_info *e, const char *s, void *out) {
  size_t v = 0;
  if (!parse_bytes(s, &v) || (e->min > 0 && v < (size_t)e->min))
    return false;
  *(size_t *)out = v;
  return true;
}
static bool parse_choice_param(const dt_env_info *e, const char *s, void *out) {
  int i = dt_choice_index(e->choices, s);
  if (i < 0)
    return false;
  *(int *)out = i;
  return true;
}

/* Parameter p of type `type` into *out: the variable's value when set, else
 * the table's default (*out untouched when there is none). A bad value
 * leaves the default in *out and is DT_ERR_INVALID_ARG naming it. */
static dt_status read_param(dt_env_param p, dt_env_type type, param_parse_fn parse, void *out) {
  DT_CHECK(wrong_type(p, type));
  const dt_env_info *e = &env_table[p];
  bool is_set;
  const char *v = value_or_default(p, &is_set);
  if (!v || parse(e, v, out))
    return DT_OK;
  if (is_set && e->default_value)
    parse(e, e->default_value, out);
  return bad_value(p, v);
}

dt_status dt_env_int(dt_env_param p, int64_t *out) {
  return read_param(p, DT_ENV_TYPE_INT, parse_int_param, out);
}

dt_status dt_env_bool(dt_env_param p, bool *out) {
  return read_param(p, DT_ENV_TYPE_BOOL, parse_bool_param, out);
}

dt_status dt_env_bytes(dt_env_param p, size_t *out) {
  return read_param(p, DT_ENV_TYPE_BYTES, parse_bytes_param, out);
}

dt_status dt_env_choice(dt_env_param p, int *index) {
  return read_param(p, DT_ENV_TYPE_CHOICE, parse_choice_param, index);
}

dt_status dt_env_string(dt_env_param p, const char **out) {
  DT_CHECK(wrong_type(p, DT_ENV_TYPE_STRING));
  bool is_set;
  const char *v = value_or_default(p, &is_set);
  if (v)
    *out = v;
  return DT_OK;
}

dt_status dt_env_check(dt_env_param p) {
  const dt_env_info *e = dt_env_info_of(p);
  if (!e)
    return wrong_type(p, DT_ENV_TYPE_INT);
  union {
    int64_t i;
    bool b;
    size_t bytes;
    int choice;
    const char *text;
  } v;
  switch (e->type) {
    case DT_ENV_TYPE_INT: return dt_env_int(p, &v.i);
    case DT_ENV_TYPE_BOOL: return dt_env_bool(p, &v.b);
    case DT_ENV_TYPE_BYTES: return dt_env_bytes(p, &v.bytes);
    case DT_ENV_TYPE_CHOICE: return dt_env_choice(p, &v.choice);
    case DT_ENV_TYPE_STRING: return dt_env_string(p, &v.text);
  }
  return DT_OK;
}
