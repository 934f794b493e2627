#include "launch/flags.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static dt_flag *find_flag(dt_flag *flags, int nflags, const char *name, size_t len) {
  for (int i = 0; i < nflags; i++) {
    if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0)
      return &flags[i];
  }
  return NULL;
}

static int is_one_of(const char *value, const char *choices) {
  size_t n = strlen(value);
  const char *p = choices;
  while (*p) {
    const char *end = strchr(p, '|');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && strncmp(p, value, n) == 0)
      return 1;
    if (!end)
      break;
    p = end + 1;
  }
  return 0;
}

static void describe_int_expectation(double min, char *buf, size_t cap) {
  if (min == 1)
    snprintf(buf, cap, "a positive integer");
  else if (min == 0)
    snprintf(buf, cap, "a non-negative integer");
  else
    snprintf(buf, cap, "an integer >= %.0f", min);
}

/* Stores `text` into flag f; on failure writes what was expected. */
static int set_value(dt_flag *f, const char *text, char *expected, size_t cap) {
  char *end = NULL;
  switch (f->type) {
    case DT_FLAG_INT: {
      errno = 0;
      long long v = strtoll(text, &end, 10);
      if (errno || end == text || *end || v < (long long)f->min || v > INT_MAX) {
        describe_int_expectation(f->min, expected, cap);
        return 0;
      }
      *(int *)f->value = (int)v;
      return 1;
    }
    case DT_FLAG_U64: {
      errno = 0;
      unsigned long long v = strtoull(text, &end, 10);
      /* strtoull accepts "-1" (and " -1") and negates it: refuse any sign. */
      if (errno || end == text || *end || strchr(text, '-') != NULL) {
        snprintf(expected, cap, "a non-negative integer");
        return 0;
      }
      *(uint64_t *)f->value = (uint64_t)v;
      return 1;
    }
    case DT_FLAG_FLOAT: {
      errno = 0;
      float v = strtof(text, &end);
      if (errno || end == text || *end || !isfinite(v) || v < f->min) {
        if (f->min == 0)
          snprintf(expected, cap, "a non-negative number");
        else
          snprintf(expected, cap, "a number >= %g", f->min);
        return 0;
      }
      *(float *)f->value = v;
      return 1;
    }
    case DT_FLAG_STRING:
      if (!text[0] || (f->choices && !is_one_of(text, f->choices))) {
        if (f->choices)
          snprintf(expected, cap, "one of %s", f->choices);
        else
          snprintf(expected, cap, "a non-empty string");
        return 0;
      }
      *(const char **)f->value = text;
      return 1;
    case DT_FLAG_BOOL:
      if (!strcmp(text, "true") || !strcmp(text, "1") || !strcmp(text, "yes")) {
        *(int *)f->value = 1;
        return 1;
      }
      if (!strcmp(text, "false") || !strcmp(text, "0") || !strcmp(text, "no")) {
        *(int *)f->value = 0;
        return 1;
      }
      snprintf(expected, cap, "true or false");
      return 0;
  }
  return 0;
}

dt_flags_result dt_flags_parse(const char *command, dt_flag *flags, int nflags, int argc,
                               char **argv, FILE *err) {
  /* --help wins over any other problem on the line. */
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return DT_FLAGS_HELP;
    if (!strcmp(argv[i], "--"))
      break;
  }
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
      fprintf(err, "dtrain %s: unexpected argument '%s' (see dtrain %s --help)\n", command, arg,
              command);
      return DT_FLAGS_ERROR;
    }
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    dt_flag *f = find_flag(flags, nflags, name, len);
    if (!f) {
      fprintf(err, "dtrain %s: unknown flag --%.*s (see dtrain %s --help)\n", command, (int)len,
              name, command);
      return DT_FLAGS_ERROR;
    }
    const char *value;
    if (eq) {
      value = eq + 1;
    } else if (f->type == DT_FLAG_BOOL) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      fprintf(err, "dtrain %s: flag --%s needs a value (see dtrain %s --help)\n", command, f->name,
              command);
      return DT_FLAGS_ERROR;
    }
    char expected[128];
    if (!set_value(f, value, expected, sizeof expected)) {
      fprintf(err, "dtrain %s: invalid value '%s' for --%s: expected %s\n", command, value, f->name,
              expected);
      return DT_FLAGS_ERROR;
    }
  }
  return DT_FLAGS_OK;
}

static void format_value(const dt_flag *f, char *buf, size_t cap) {
  switch (f->type) {
    case DT_FLAG_INT: snprintf(buf, cap, "%d", *(const int *)f->value); break;
    case DT_FLAG_U64: snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)f->value); break;
    case DT_FLAG_FLOAT: snprintf(buf, cap, "%g", *(const float *)f->value); break;
    case DT_FLAG_STRING: {
      const char *s = *(const char *const *)f->value;
      snprintf(buf, cap, "%s", s ? s : "");
      break;
    }
    case DT_FLAG_BOOL: snprintf(buf, cap, "%s", *(const int *)f->value ? "on" : "off"); break;
  }
}

void dt_flags_print(const dt_flag *flags, int nflags, FILE *out) {
  for (int i = 0; i < nflags; i++) {
    const dt_flag *f = &flags[i];
    char left[64], value[256];
    if (f->type == DT_FLAG_BOOL)
      snprintf(left, sizeof left, "--%s", f->name);
    else
      snprintf(left, sizeof left, "--%s %s", f->name, f->metavar ? f->metavar : "VALUE");
    format_value(f, value, sizeof value);
    fprintf(out, "  %-22s %s (default: %s)\n", left, f->help, value);
  }
}
