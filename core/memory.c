/* Memory statistics and cache control for any device, and byte-count
 * parsing/formatting. The accounting itself lives in each backend. */
#include "core/memory.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

dt_status dt_memory_stats_get(dt_device dev, dt_memory_stats *out) {
  const dt_backend_ops *ops = NULL;
  DT_CHECK(dt_backend_get(dev, &ops));
  return ops->memory_stats(dev, out);
}

dt_status dt_empty_cache(dt_device dev) {
  const dt_backend_ops *ops = NULL;
  DT_CHECK(dt_backend_get(dev, &ops));
  return ops->empty_cache(dev);
}

dt_status dt_memory_reset_peak(dt_device dev) {
  const dt_backend_ops *ops = NULL;
  DT_CHECK(dt_backend_get(dev, &ops));
  return ops->reset_peak_stats(dev);
}

dt_status dt_parse_bytes(const char *s, size_t *out) {
  if (!s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "byte count: NULL string: pass e.g. \"512M\"");
  const char *p = s;
  while (isspace((unsigned char)*p))
    p++;
  if (!isdigit((unsigned char)*p))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "byte count '%s' does not start with a digit: use e.g. 123, 64K, 512M, 2G", s);
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(p, &end, 10);
  if (errno == ERANGE)
    return DT_ERROR(DT_ERR_INVALID_ARG, "byte count '%s' is too large", s);
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
    case 'K':
      shift = 10;
      end++;
      break;
    case 'M':
      shift = 20;
      end++;
      break;
    case 'G':
      shift = 30;
      end++;
      break;
    case 'T':
      shift = 40;
      end++;
      break;
    default: break;
  }
  /* Accept "64KB", "64KiB", "64B" too. */
  if (shift && (*end == 'i' || *end == 'I'))
    end++;
  if (*end == 'b' || *end == 'B')
    end++;
  while (isspace((unsigned char)*end))
    end++;
  if (*end != '\0')
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "byte count '%s' has trailing text '%s': use e.g. 123, 64K, 512M, 2G", s, end);
  if (shift && v > (SIZE_MAX >> shift))
    return DT_ERROR(DT_ERR_INVALID_ARG, "byte count '%s' is too large", s);
  if (v > SIZE_MAX)
    return DT_ERROR(DT_ERR_INVALID_ARG, "byte count '%s' is too large", s);
  *out = (size_t)v << shift;
  return DT_OK;
}

char *dt_format_bytes(size_t bytes, char *buf, size_t cap) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!buf || cap == 0)
    return buf;
  if (bytes < 1024) {
    snprintf(buf, cap, "%zu B", bytes);
    return buf;
  }
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, cap, "%.2f %s", v, units[u]);
  return buf;
}
