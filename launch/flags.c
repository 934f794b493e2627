#include "launch/flags.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/parse.h"

#define HELP_WIDTH 100 /* the help wraps its lines here */
#define HELP_LEFT 24   /* the flag column */

bool dt_flags_is_choice(const char *value, const char *choices) {
  return dt_choice_index(choices, value) >= 0;
}

const char *dt_flags_format_choices(const char *choices, char *buf, size_t cap) {
  return dt_format_choices(choices, buf, cap);
}

/* "a positive integer", "an integer in 1..4096", "a number > 0", "a number
 * in [0, 1)", ... */
static void describe_number(const dt_flag *f, char *buf, size_t cap) {
  bool integer = f->type == DT_FLAG_INT;
  const char *noun = integer ? "integer" : "number";
  if (f->max != 0 && f->max_exclusive)
    snprintf(buf, cap, "a number in %s%g, %g)", f->min_exclusive ? "(" : "[", f->min, f->max);
  else if (f->max != 0)
    snprintf(buf, cap, "%s in %s%g..%g", integer ? "an integer" : "a number",
             f->min_exclusive ? ">" : "", f->min, f->max);
  else if (integer && f->min == 1)
    snprintf(buf, cap, "a positive integer");
  else if (f->min == 0 && !f->min_exclusive)
    snprintf(buf, cap, "a non-negative %s", noun);
  else
    snprintf(buf, cap, "a%s %s %s %g", integer ? "n" : "", noun,
             f->min_exclusive ? ">" : ">=", f->min);
}

static bool in_range(const dt_flag *f, double v) {
  if (f->min_exclusive ? !(v > f->min) : !(v >= f->min))
    return false;
  return f->max == 0 || (f->max_exclusive ? v < f->max : v <= f->max);
}

/* Stores `text` into flag f; on failure writes why into `why`. */
static bool set_value(dt_flag *f, const char *text, char *why, size_t cap) {
  char *end = NULL;
  char expected[384];
  switch (f->type) {
    case DT_FLAG_INT: {
      errno = 0;
      long long v = strtoll(text, &end, 10);
      bool number = end != text && !*end; /* digits, perhaps beyond what an int holds */
      if (errno || !number || v > INT_MAX || v < INT_MIN || !in_range(f, (double)v)) {
        describe_number(f, expected, sizeof expected);
        /* A number beyond an int: the range itself says why it is refused. */
        bool beyond = number && f->max == 0 && (errno == ERANGE || v > INT_MAX || v < INT_MIN);
        snprintf(why, cap, "expected %s%s", expected, beyond ? " of at most 2147483647" : "");
        return false;
      }
      *(int *)f->target = (int)v;
      return true;
    }
    case DT_FLAG_U64: {
      errno = 0;
      unsigned long long v = strtoull(text, &end, 10);
      /* strtoull accepts "-1" (and " -1") and negates it: refuse any sign. */
      if (errno || end == text || *end || strchr(text, '-') != NULL) {
        bool beyond = errno == ERANGE && end != text && !*end && !strchr(text, '-');
        snprintf(why, cap, "expected a non-negative integer%s",
                 beyond ? " of at most 18446744073709551615" : "");
        return false;
      }
      *(uint64_t *)f->target = (uint64_t)v;
      return true;
    }
    case DT_FLAG_FLOAT:
    case DT_FLAG_DOUBLE: {
      errno = 0;
      double v = strtod(text, &end);
      bool fits = f->type == DT_FLAG_DOUBLE || fabs(v) <= 3.4028234663852886e38;
      /* strtod also reads hexadecimal ("0x10" is 16): a decimal number only. */
      bool decimal = strpbrk(text, "xX") == NULL;
      if (errno || end == text || *end || !isfinite(v) || !fits || !decimal || !in_range(f, v)) {
        describe_number(f, expected, sizeof expected);
        snprintf(why, cap, "expected %s", expected);
        return false;
      }
      if (f->type == DT_FLAG_FLOAT)
        *(float *)f->target = (float)v;
      else
        *(double *)f->target = v;
      return true;
    }
    case DT_FLAG_STRING:
      if (!text[0]) {
        snprintf(why, cap, "expected a non-empty value");
        return false;
      }
      if (f->check && !f->check(text, why, cap))
        return false;
      *(const char **)f->target = text;
      return true;
    case DT_FLAG_CHOICE:
      if (!dt_flags_is_choice(text, f->choices)) {
        snprintf(why, cap, "expected one of %s",
                 dt_flags_format_choices(f->choices, expected, sizeof expected));
        return false;
      }
      *(const char **)f->target = text;
      return true;
    case DT_FLAG_BOOL:
      if (!dt_parse_bool(text, (bool *)f->target)) {
        snprintf(why, cap, "expected true or false");
        return false;
      }
      return true;
    case DT_FLAG_LIST: {
      dt_flag_list *l = f->target;
      if (l->n >= DT_FLAG_LIST_MAX) {
        snprintf(why, cap, "more than %d values in all", DT_FLAG_LIST_MAX);
        return false;
      }
      l->items[l->n++] = text;
      return true;
    }
  }
  return false;
}

/* The flag `arg` names ("--batch", "--batch=3", "-n"), or NULL; *value is
 * set to the text after '=' when there is one. */
static dt_flag *find_flag(const dt_flag_set *set, const char *arg, const char **value) {
  *value = NULL;
  const char *eq = strchr(arg, '=');
  size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
  for (int i = 0; i < set->nflags; i++) {
    dt_flag *f = &set->flags[i];
    bool long_match =
        len == strlen(f->name) + 2 && !strncmp(arg, "--", 2) && !strncmp(arg + 2, f->name, len - 2);
    bool alias_match = f->alias && len == strlen(f->alias) && !strncmp(arg, f->alias, len);
    if (long_match || alias_match) {
      if (eq)
        *value = eq + 1;
      return f;
    }
  }
  return NULL;
}

/* The flag's name as the user typed it: "-n" or "--np". */
static void shown_name(const dt_flag *f, const char *typed, char *buf, size_t cap) {
  if (f->alias && !strncmp(typed, f->alias, strlen(f->alias)) && strncmp(typed, "--", 2))
    snprintf(buf, cap, "%s", f->alias);
  else
    snprintf(buf, cap, "--%s", f->name);
}

/* Stores `value` into f, or prints why not ("invalid value ..."). */
static bool store_value(const dt_flag_set *set, dt_flag *f, const char *name, const char *value,
                        FILE *err) {
  char why[512];
  if (set_value(f, value, why, sizeof why))
    return true;
  fprintf(err, "dtrain %s: invalid value '%s' for %s: %s\n", set->command, value, name, why);
  return false;
}

/* A multi list's values: the one after '=' (when not empty), then every
 * argument after argv[*i] up to the next flag; at least one. */
static bool store_multi_values(const dt_flag_set *set, dt_flag *f, const char *name,
                               const char *value, int argc, char **argv, int *i, FILE *err) {
  int given = 0;
  if (value && value[0]) {
    if (!store_value(set, f, name, value, err))
      return false;
    given++;
  }
  while (*i + 1 < argc && !(argv[*i + 1][0] == '-' && argv[*i + 1][1] != '\0')) {
    if (!store_value(set, f, name, argv[++*i], err))
      return false;
    given++;
  }
  if (given == 0) {
    fprintf(err, "dtrain %s: flag %s needs at least one value (see dtrain %s --help)\n",
            set->command, name, set->command);
    return false;
  }
  return true;
}

dt_flags_result dt_flags_parse(const dt_flag_set *set, int argc, char **argv, FILE *err,
                               dt_flags_args *out) {
  const char *cmd = set->command;
  dt_flags_args parsed = {NULL, 0, NULL, 0};
  /* --help wins over any other problem on the line. */
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return DT_FLAGS_HELP;
    if (!strcmp(argv[i], "--"))
      break;
  }
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (set->command_after_dashdash && !strcmp(arg, "--")) {
      parsed.rest = argv + i + 1;
      parsed.nrest = argc - i - 1;
      break;
    }
    if (arg[0] != '-' || !strcmp(arg, "--") || !strcmp(arg, "-")) {
      if (arg[0] != '-' && parsed.nargs < set->max_args) {
        if (parsed.nargs == 0)
          parsed.args = argv + i;
        parsed.nargs++;
        continue;
      }
      fprintf(err, "dtrain %s: unexpected argument '%s'%s%s (see dtrain %s --help)\n", cmd, arg,
              set->args_hint ? ": " : "", set->args_hint ? set->args_hint : "", cmd);
      return DT_FLAGS_ERROR;
    }
    const char *value = NULL;
    dt_flag *f = find_flag(set, arg, &value);
    if (!f) {
      const char *eq = strchr(arg, '=');
      fprintf(err, "dtrain %s: unknown flag %.*s (see dtrain %s --help)\n", cmd,
              (int)(eq ? eq - arg : (long)strlen(arg)), arg, cmd);
      return DT_FLAGS_ERROR;
    }
    char name[80];
    shown_name(f, arg, name, sizeof name);
    if (f->type == DT_FLAG_LIST && f->multi) {
      if (!store_multi_values(set, f, name, value, argc, argv, &i, err))
        return DT_FLAGS_ERROR;
      continue;
    }
    if (!value) {
      if (f->type == DT_FLAG_BOOL) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        fprintf(err, "dtrain %s: flag %s needs a value (see dtrain %s --help)\n", cmd, name, cmd);
        return DT_FLAGS_ERROR;
      }
    }
    if (!store_value(set, f, name, value, err))
      return DT_FLAGS_ERROR;
  }
  if (out)
    *out = parsed;
  return DT_FLAGS_OK;
}

int dt_flags_parse_command(const dt_flag_set *set, int argc, char **argv, FILE *err,
                           dt_flags_args *out) {
  switch (dt_flags_parse(set, argc, argv, err, out)) {
    case DT_FLAGS_OK: return DT_FLAGS_RUN;
    case DT_FLAGS_HELP: dt_flags_print_help(set, stdout); return 0;
    case DT_FLAGS_ERROR: break;
  }
  return 2;
}

/* The target's value; exact: the shortest digits (at least 6) that read
 * back to the same number, rather than the help's %g. */
static void format_value(const dt_flag *f, bool exact, char *buf, size_t cap) {
  switch (f->type) {
    case DT_FLAG_INT: snprintf(buf, cap, "%d", *(const int *)f->target); break;
    case DT_FLAG_U64: snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)f->target); break;
    case DT_FLAG_FLOAT: {
      float v = *(const float *)f->target;
      for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, cap, "%.*g", digits, (double)v);
        if (!exact || strtof(buf, NULL) == v)
          break;
      }
      break;
    }
    case DT_FLAG_DOUBLE: {
      double v = *(const double *)f->target;
      for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, v);
        if (!exact || strtod(buf, NULL) == v)
          break;
      }
      break;
    }
    case DT_FLAG_STRING:
    case DT_FLAG_CHOICE: {
      const char *s = *(const char *const *)f->target;
      snprintf(buf, cap, "%s", s ? s : "none");
      break;
    }
    case DT_FLAG_BOOL: snprintf(buf, cap, "%s", *(const bool *)f->target ? "on" : "off"); break;
    case DT_FLAG_LIST: {
      const dt_flag_list *l = f->target;
      size_t used = 0;
      buf[0] = '\0';
      for (int i = 0; i < l->n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? "," : "", l->items[i]);
      if (l->n == 0)
        snprintf(buf, cap, "none");
      break;
    }
  }
}

static void format_default(const dt_flag *f, char *buf, size_t cap) {
  if (f->default_text)
    snprintf(buf, cap, "%s", f->default_text);
  else if (f->type == DT_FLAG_LIST)
    snprintf(buf, cap, "none");
  else
    format_value(f, false, buf, cap);
}

size_t dt_flags_format_values(const dt_flag_set *set, char *buf, size_t cap) {
  size_t used = 0;
  if (cap == 0)
    return 0;
  buf[0] = '\0';
  for (int i = 0; i < set->nflags && used + 1 < cap; i++) {
    const dt_flag *f = &set->flags[i];
    if (f->per_rank)
      continue;
    char value[512];
    format_value(f, true, value, sizeof value);
    int n = snprintf(buf + used, cap - used, "--%s %s\n", f->name, value);
    if (n < 0)
      break;
    used += (size_t)n < cap - used ? (size_t)n : cap - used - 1;
  }
  return used;
}

/* Writes `text` from column `col` (the cursor is there) to HELP_WIDTH,
 * continuing lines at HELP_LEFT + 1. */
static void print_wrapped(FILE *out, const char *text, int col) {
  const char *p = text;
  while (*p) {
    const char *word_end = p;
    while (*word_end && *word_end != ' ')
      word_end++;
    int len = (int)(word_end - p);
    if (col > HELP_LEFT + 1 && col + 1 + len > HELP_WIDTH) {
      fprintf(out, "\n%*s", HELP_LEFT + 1, "");
      col = HELP_LEFT + 1;
    } else if (col > HELP_LEFT + 1) {
      fputc(' ', out);
      col++;
    }
    fwrite(p, 1, (size_t)len, out);
    col += len;
    p = word_end;
    while (*p == ' ')
      p++;
  }
  fputc('\n', out);
}

void dt_flags_print_help(const dt_flag_set *set, FILE *out) {
  fprintf(out, "usage: dtrain %s\n\n", set->usage);
  if (set->about)
    fprintf(out, "%s\n\n", set->about);
  fprintf(out, "flags:\n");
  for (int i = 0; i < set->nflags; i++) {
    const dt_flag *f = &set->flags[i];
    char left[96], text[1024], value[256], accepted[256];
    int n = snprintf(left, sizeof left, "  %s%s--%s", f->alias ? f->alias : "",
                     f->alias ? ", " : "", f->name);
    if (f->type != DT_FLAG_BOOL && n > 0 && (size_t)n < sizeof left)
      snprintf(left + n, sizeof left - (size_t)n, " %s", f->metavar ? f->metavar : "VALUE");
    accepted[0] = '\0';
    if (f->type == DT_FLAG_CHOICE) {
      char list[200];
      snprintf(accepted, sizeof accepted, "; one of %s",
               dt_flags_format_choices(f->choices, list, sizeof list));
    } else if ((f->type == DT_FLAG_INT || f->type == DT_FLAG_FLOAT || f->type == DT_FLAG_DOUBLE) &&
               f->max != 0) {
      if (f->max_exclusive)
        snprintf(accepted, sizeof accepted, "; %s%g, %g)", f->min_exclusive ? "(" : "[", f->min,
                 f->max);
      else
        snprintf(accepted, sizeof accepted, "; %g..%g", f->min, f->max);
    } else if (f->type == DT_FLAG_LIST) {
      snprintf(accepted, sizeof accepted, "; %s", f->multi ? "one or more" : "repeat for several");
    }
    format_default(f, value, sizeof value);
    if (f->type == DT_FLAG_LIST)
      snprintf(text, sizeof text, "%s%s", f->help, accepted);
    else
      snprintf(text, sizeof text, "%s%s (default: %s)", f->help, accepted, value);
    int col = fprintf(out, "%-*s", HELP_LEFT, left);
    if (col > HELP_LEFT) {
      fprintf(out, "\n%*s", HELP_LEFT + 1, "");
    } else {
      fputc(' ', out);
    }
    print_wrapped(out, text, HELP_LEFT + 1);
  }
  fprintf(out, "  %-*s show this help\n", HELP_LEFT - 2, "-h, --help");
  if (set->epilogue)
    fprintf(out, "\n%s\n", set->epilogue);
}

/* The flag of `set` that sets configuration field `field` (len bytes), or NULL. */
static const dt_flag *flag_of_field(const dt_flag_set *set, const char *field, size_t len) {
  for (int i = 0; i < set->nflags; i++) {
    const dt_flag *f = &set->flags[i];
    char name[64];
    snprintf(name, sizeof name, "%s", f->field ? f->field : f->name);
    for (char *p = name; !f->field && *p; p++)
      *p = *p == '-' ? '_' : *p;
    if (strlen(name) == len && strncmp(name, field, len) == 0)
      return f;
  }
  return NULL;
}

void dt_flags_name_fields(const dt_flag_set *set, const char *msg, char *out, size_t cap) {
  size_t used = 0;
  if (cap == 0)
    return;
  out[0] = '\0';
  for (const char *p = msg; *p && used + 1 < cap;) {
    const char *end = *p == '`' ? strchr(p + 1, '`') : NULL;
    size_t len = end ? (size_t)(end - p - 1) : 0;
    bool field = end && len > 0 && strspn(p + 1, "abcdefghijklmnopqrstuvwxyz0123456789_") == len;
    if (!field) {
      out[used++] = *p++;
      out[used] = '\0';
      continue;
    }
    const dt_flag *f = flag_of_field(set, p + 1, len);
    int n = f ? snprintf(out + used, cap - used, "--%s", f->name)
              : snprintf(out + used, cap - used, "%.*s", (int)len, p + 1);
    used += n > 0 ? (size_t)n : 0;
    if (used >= cap)
      used = cap - 1;
    p = end + 1;
  }
}
