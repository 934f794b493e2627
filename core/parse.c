#include "core/parse.h"

#include <string.h>
#include <strings.h>

bool dt_parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"1", "true", "on", "yes"};
  static const char *const no[] = {"0", "false", "off", "no"};
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    if (!strcasecmp(s, yes[i])) {
      *out = true;
      return true;
    }
    if (!strcasecmp(s, no[i])) {
      *out = false;
      return true;
    }
  }
  return false;
}

int dt_choice_index(const char *choices, const char *s) {
  size_t n = strlen(s);
  int i = 0;
  for (const char *p = choices;; i++) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !strncmp(p, s, n))
      return i;
    if (!bar)
      return -1;
    p = bar + 1;
  }
}

const char *dt_format_choices(const char *choices, char *buf, size_t cap) {
  size_t used = 0;
  if (cap == 0)
    return buf;
  buf[0] = '\0';
  for (const char *p = choices; *p && used + 3 < cap; p++) {
    if (*p == '|') {
      buf[used++] = ',';
      buf[used++] = ' ';
    } else {
      buf[used++] = *p;
    }
  }
  buf[used] = '\0';
  return buf;
}
