/* A streaming JSON reader, enough for the safetensors header and the
 * manifest: strings without \u escapes beyond ASCII, integers, nested
 * objects and arrays skipped when not wanted. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt_internal.h"

static dt_status bad(const ckpt_json *j, const char *why) {
  return DT_ERROR(DT_ERR_FORMAT, "%s: malformed JSON at byte %zu: %s", j->what, j->pos, why);
}

static void skip_ws(ckpt_json *j) {
  while (j->pos < j->n && strchr(" \t\r\n", j->s[j->pos]) && j->s[j->pos])
    j->pos++;
}

char ckpt_json_peek(ckpt_json *j) {
  skip_ws(j);
  return j->pos < j->n ? j->s[j->pos] : 0;
}

dt_status ckpt_json_expect(ckpt_json *j, char c) {
  if (ckpt_json_peek(j) != c) {
    char why[32];
    snprintf(why, sizeof why, "expected '%c'", c);
    return bad(j, why);
  }
  j->pos++;
  return DT_OK;
}

dt_status ckpt_json_string(ckpt_json *j, char *buf, size_t cap) {
  DT_CHECK(ckpt_json_expect(j, '"'));
  size_t len = 0;
  while (j->pos < j->n && j->s[j->pos] != '"') {
    char c = j->s[j->pos++];
    if (c == '\\') {
      if (j->pos >= j->n)
        break;
      c = j->s[j->pos++];
      c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
      if (c == 'u')
        return bad(j, "\\u escapes are not used by dtrain's files");
    }
    if (buf && len + 1 < cap)
      buf[len] = c;
    len++;
  }
  if (j->pos >= j->n)
    return bad(j, "unterminated string");
  j->pos++;
  if (buf && len >= cap)
    return bad(j, "string too long");
  if (buf)
    buf[len] = '\0';
  return DT_OK;
}

dt_status ckpt_json_int(ckpt_json *j, int64_t *out) {
  skip_ws(j);
  size_t start = j->pos;
  while (j->pos < j->n && j->s[j->pos] && strchr("-0123456789", j->s[j->pos]))
    j->pos++;
  size_t k = j->pos - start;
  char tmp[32];
  if (k == 0 || k >= sizeof tmp)
    return k == 0 ? bad(j, "expected an integer")
                  : DT_ERROR(DT_ERR_FORMAT, "%s: the integer %.40s%s is out of range", j->what,
                             j->s + start, k > 40 ? "..." : "");
  memcpy(tmp, j->s + start, k);
  tmp[k] = '\0';
  char *end = NULL;
  errno = 0;
  long long v = strtoll(tmp, &end, 10);
  if (*end != '\0')
    return bad(j, "expected an integer");
  if (errno == ERANGE)
    return DT_ERROR(DT_ERR_FORMAT, "%s: the integer %s is out of range (at most %lld)", j->what,
                    tmp, (long long)INT64_MAX);
  *out = v;
  return DT_OK;
}

dt_status ckpt_json_next(ckpt_json *j, char close, bool *more) {
  char c = ckpt_json_peek(j);
  if (c == ',') {
    j->pos++;
    *more = true;
    return DT_OK;
  }
  if (c == close) {
    j->pos++;
    *more = false;
    return DT_OK;
  }
  return bad(j, "expected ',' or the closing bracket");
}

dt_status ckpt_json_skip(ckpt_json *j) {
  char c = ckpt_json_peek(j);
  if (c == '"')
    return ckpt_json_string(j, NULL, 0);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->pos++;
    if (ckpt_json_peek(j) == close) {
      j->pos++;
      return DT_OK;
    }
    for (bool more = true; more;) {
      if (c == '{') {
        DT_CHECK(ckpt_json_string(j, NULL, 0));
        DT_CHECK(ckpt_json_expect(j, ':'));
      }
      DT_CHECK(ckpt_json_skip(j));
      DT_CHECK(ckpt_json_next(j, close, &more));
    }
    return DT_OK;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    while (j->pos < j->n && j->s[j->pos] && strchr("-+.eE0123456789", j->s[j->pos]))
      j->pos++;
    return DT_OK;
  }
  static const char *const words[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t len = strlen(words[i]);
    if (j->n - j->pos >= len && !memcmp(j->s + j->pos, words[i], len)) {
      j->pos += len;
      return DT_OK;
    }
  }
  return bad(j, "expected a value");
}

dt_status ckpt_json_int_array(ckpt_json *j, int64_t *out, int cap, int *n) {
  DT_CHECK(ckpt_json_expect(j, '['));
  *n = 0;
  if (ckpt_json_peek(j) == ']') {
    j->pos++;
    return DT_OK;
  }
  for (bool more = true; more;) {
    int64_t v;
    DT_CHECK(ckpt_json_int(j, &v));
    if (*n >= cap)
      return bad(j, "too many numbers in an array");
    out[(*n)++] = v;
    DT_CHECK(ckpt_json_next(j, ']', &more));
  }
  return DT_OK;
}

bool ckpt_parse_hex32(const char *s, uint32_t *out) {
  if (strlen(s) != 8)
    return false;
  char *end = NULL;
  unsigned long v = strtoul(s, &end, 16);
  if (*end != '\0')
    return false;
  *out = (uint32_t)v;
  return true;
}
