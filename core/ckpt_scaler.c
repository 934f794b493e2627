/* The GradScaler's trainer-state section (core/checkpoint.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/checkpoint.h"

dt_status dt_ckpt_scaler_section_encode(const dt_grad_scaler *s, char *buf, size_t cap,
                                        size_t *len) {
  uint32_t bits;
  memcpy(&bits, &s->scale, sizeof bits);
  int n = snprintf(
      buf, cap, "scale_bits 0x%08" PRIx32 "\nscale %g\ngrowth_tracker %lld\nskipped_steps %lld\n",
      bits, (double)s->scale, (long long)s->growth_tracker, (long long)s->skipped_steps);
  if (n < 0 || (size_t)n >= cap)
    return DT_ERROR(DT_ERR_INVALID_ARG, "scaler section: %zu bytes are too few", cap);
  *len = (size_t)n;
  return DT_OK;
}

static dt_status get_int(const char *text, size_t size, const char *key, const char *what,
                         long long *out) {
  char buf[64], tail;
  DT_CHECK(dt_state_meta_get(text, size, key, what, buf, sizeof buf));
  if (sscanf(buf, "%lli%c", out, &tail) != 1 || *out < 0)
    return DT_ERROR(DT_ERR_FORMAT, "%s: '%s %s' is not a count", what, key, buf);
  return DT_OK;
}

dt_status dt_ckpt_scaler_section_decode(const void *bytes, size_t size, const char *what,
                                        dt_grad_scaler *s) {
  long long bits = 0, tracker = 0, skipped = 0;
  DT_CHECK(get_int(bytes, size, "scale_bits", what, &bits));
  DT_CHECK(get_int(bytes, size, "growth_tracker", what, &tracker));
  DT_CHECK(get_int(bytes, size, "skipped_steps", what, &skipped));
  uint32_t b = (uint32_t)bits;
  float scale;
  memcpy(&scale, &b, sizeof scale);
  if (bits > 0xffffffffLL || !(scale > 0.0f) || scale != scale || scale - scale != 0.0f)
    return DT_ERROR(DT_ERR_FORMAT, "%s: scale_bits 0x%llx is not a finite scale > 0", what, bits);
  s->scale = scale;
  s->growth_tracker = tracker;
  s->skipped_steps = skipped;
  return DT_OK;
}
