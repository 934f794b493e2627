/* Element types and devices: the vocabulary shared by tensors, backends and
 * everything above them.
 */
#ifndef DT_CORE_DEVICE_H
#define DT_CORE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_DIMS 8

typedef enum dt_dtype {
  DT_DTYPE_F32 = 0,
  DT_DTYPE_F16,
  DT_DTYPE_BF16,
  DT_DTYPE_I32,
  DT_DTYPE_I64,
  DT_DTYPE_U8,
  DT_DTYPE_COUNT,
} dt_dtype;

size_t dt_dtype_size(dt_dtype t);
const char *dt_dtype_name(dt_dtype t);
int dt_dtype_is_float(dt_dtype t);

/* Conversions between f32 and the 16-bit floats: core/half.h. */

typedef enum dt_device_type { DT_DEVICE_CPU = 0, DT_DEVICE_CUDA = 1 } dt_device_type;

typedef struct dt_device {
  dt_device_type type;
  int index;
} dt_device;

#define DT_CPU ((dt_device){DT_DEVICE_CPU, 0})

/* "cpu:0", "cuda:1". Writes at most `cap` bytes; returns buf. */
char *dt_device_format(dt_device d, char *buf, size_t cap);
/* Parses "cpu", "cpu:1", "cuda", "cuda:0". */
dt_status dt_device_parse(const char *s, dt_device *out);
int dt_device_equal(dt_device a, dt_device b);

#ifdef __cplusplus
}
#endif
#endif
