/* Memory statistics and cache control for any device.
 *
 * CPU: allocations are counted per CPU device index; DT_CPU_MEMORY_LIMIT
 * (bytes, or with a K/M/G suffix) caps what may be allocated so that the
 * out-of-memory path can be exercised: an allocation over the cap fails with
 * DT_ERR_OOM and a message giving the requested size, what is allocated, the
 * cap and advice. Freed blocks are kept in a per-device cache of size
 * classes and reused (`reserved` counts them, `allocated` only live
 * tensors; dt_empty_cache hands them back; DT_CPU_ALLOC_CACHE=0 turns the
 * cache off; see core/cpu.h). CUDA: see cuda/ (caching allocator).
 */
#ifndef DT_CORE_MEMORY_H
#define DT_CORE_MEMORY_H

#include <stddef.h>

#include "core/backend.h"
#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Binary byte multiples, for sizes and for MiB figures in messages:
 * (double)bytes / DT_MIB, (size_t)(mb * DT_MIB). */
#define DT_KIB ((size_t)1 << 10)
#define DT_MIB ((size_t)1 << 20)
#define DT_GIB ((size_t)1 << 30)

dt_status dt_memory_stats_get(dt_device dev, dt_memory_stats *out);
/* Releases cached, unused blocks back to the system. */
dt_status dt_empty_cache(dt_device dev);
/* Sets peak_allocated to the current allocated. */
dt_status dt_memory_reset_peak(dt_device dev);
/* Parses "123", "64K", "512M", "2G" (binary multiples). */
dt_status dt_parse_bytes(const char *s, size_t *out);
/* "1.50 GiB" style formatting. */
char *dt_format_bytes(size_t bytes, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
