#include "core/status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[DT_ERROR_MAX];
static _Thread_local char last_error_location[256];

const char *dt_status_name(dt_status s) {
  switch (s) {
    case DT_OK: return "DT_OK";
    case DT_ERR_OOM: return "DT_ERR_OOM";
    case DT_ERR_DEVICE_MISMATCH: return "DT_ERR_DEVICE_MISMATCH";
    case DT_ERR_SHAPE: return "DT_ERR_SHAPE";
    case DT_ERR_DTYPE: return "DT_ERR_DTYPE";
    case DT_ERR_INVALID_ARG: return "DT_ERR_INVALID_ARG";
    case DT_ERR_IO: return "DT_ERR_IO";
    case DT_ERR_FORMAT: return "DT_ERR_FORMAT";
    case DT_ERR_CUDA: return "DT_ERR_CUDA";
    case DT_ERR_NCCL: return "DT_ERR_NCCL";
    case DT_ERR_MPI: return "DT_ERR_MPI";
    case DT_ERR_TIMEOUT: return "DT_ERR_TIMEOUT";
    case DT_ERR_DIST_MISMATCH: return "DT_ERR_DIST_MISMATCH";
    case DT_ERR_UNSUPPORTED: return "DT_ERR_UNSUPPORTED";
    case DT_ERR_NO_DEVICE: return "DT_ERR_NO_DEVICE";
    case DT_ERR_VERSION: return "DT_ERR_VERSION";
    case DT_ERR_STATE: return "DT_ERR_STATE";
    case DT_ERR_INTERNAL: return "DT_ERR_INTERNAL";
  }
  return "DT_ERR_UNKNOWN";
}

const char *dt_last_error(void) { return last_error; }

const char *dt_last_error_location(void) { return last_error_location; }

void dt_error_replace_message(const char *text) {
  char copy[DT_ERROR_MAX]; /* text may be dt_last_error() itself */
  snprintf(copy, sizeof copy, "%s", text);
  memcpy(last_error, copy, sizeof last_error);
}

void dt_clear_error(void) {
  last_error[0] = '\0';
  last_error_location[0] = '\0';
}

/* Formats the message into last_error; wrap: in front of the one there
 * ("prefix: old message"). Formatted aside first: an argument may be
 * dt_last_error() itself. */
static void format_last_error(bool wrap, const char *fmt, va_list ap) {
  char text[DT_ERROR_MAX];
  vsnprintf(text, sizeof text, fmt, ap);
  if (!wrap) {
    memcpy(last_error, text, sizeof last_error);
    return;
  }
  char old[DT_ERROR_MAX];
  memcpy(old, last_error, sizeof old);
  snprintf(last_error, sizeof last_error, "%s: %s", text, old);
}

dt_status dt_error_set(dt_status s, const char *func, const char *file, int line, const char *fmt,
                       ...) {
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  va_list ap;
  va_start(ap, fmt);
  format_last_error(false, fmt, ap);
  va_end(ap);
  snprintf(last_error_location, sizeof last_error_location, "%s %s:%d", func, base, line);
  return s;
}

dt_status dt_error_wrap(dt_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  format_last_error(true, fmt, ap);
  va_end(ap);
  return s;
}

void dt_assert_fail(const char *expr, const char *file, int line) {
  fprintf(stderr, "dtrain: internal invariant broken at %s:%d: %s\n", file, line, expr);
  abort();
}
