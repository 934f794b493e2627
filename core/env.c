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
#define DT_ENV_BYTES(id, def, unset, group, doc) \
  {"DT_" #id, DT_ENV_TYPE_BYTES, 0, 0, NULL, (def), (unset), (group), (doc)},
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

dt_status dt_env_int(dt_env_param p, int64_t *out) {
  DT_CHECK(wrong_type(p, DT_ENV_TYPE_INT));
  const dt_env_info *e = &env_table[p];
  bool is_set;
  const char *v = value_or_default(p, &is_set);
  if (!v)
    return DT_OK;
  if (parse_int(v, e->min, e->max, out))
    return DT_OK;
  if (is_set && e->default_value)
    parse_int(e->default_value, e->min, e->max, out);
  return bad_value(p, v);
}

dt_status dt_env_bool(dt_env_param p, bool *out) {
  DT_CHECK(wrong_type(p, DT_ENV_TYPE_BOOL));
  bool is_set;
  const char *v = value_or_default(p, &is_set);
  if (!v || dt_parse_bool(v, out))
    return DT_OK;
  if (is_set && env_table[p].default_value)
    dt_parse_bool(env_table[p].default_value, out);
  return bad_value(p, v);
}

dt_status dt_env_bytes(dt_env_param p, size_t *out) {
  DT_CHECK(wrong_type(p, DT_ENV_TYPE_BYTES));
  bool is_set;
  const char *v = value_or_default(p, &is_set);
  if (!v || parse_bytes(v, out))
    return DT_OK;
  if (is_set && env_table[p].default_value)
    parse_bytes(env_table[p].default_value, out);
  return bad_value(p, v);
}

dt_status dt_env_choice(dt_env_param p, int *index) {
  DT_CHECK(wrong_type(p, DT_ENV_TYPE_CHOICE));
  const dt_env_info *e = &env_table[p];
  bool is_set;
  const char *v = value_or_default(p, &is_set);
  if (!v)
    return DT_OK;
  int i = dt_choice_index(e->choices, v);
  if (i >= 0) {
    *index = i;
    return DT_OK;
  }
  if (is_set && e->default_value && (i = dt_choice_index(e->choices, e->default_value)) >= 0)
    *index = i;
  return bad_value(p, v);
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
  switch (e->type) {
    case DT_ENV_TYPE_INT: {
      int64_t v = 0;
      return dt_env_int(p, &v);
    }
    case DT_ENV_TYPE_BOOL: {
      bool v = false;
      return dt_env_bool(p, &v);
    }
    case DT_ENV_TYPE_BYTES: {
      size_t v = 0;
      return dt_env_bytes(p, &v);
    }
    case DT_ENV_TYPE_CHOICE: {
      int v = 0;
      return dt_env_choice(p, &v);
    }
    case DT_ENV_TYPE_STRING: {
      const char *v = NULL;
      return dt_env_string(p, &v);
    }
  }
  return DT_OK;
}
