/* A data set over samples the caller hands over in memory (copied). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/data.h"

typedef struct memory_set {
  int64_t n;
  size_t input_bytes, target_bytes; /* of one sample */
  uint8_t *inputs, *targets;        /* n samples each, owned */
} memory_set;

static int64_t memory_length(void *impl) { return ((memory_set *)impl)->n; }

static dt_status memory_get_sample(void *impl, int64_t i, void *input, void *target) {
  const memory_set *s = impl;
  memcpy(input, s->inputs + (size_t)i * s->input_bytes, s->input_bytes);
  memcpy(target, s->targets + (size_t)i * s->target_bytes, s->target_bytes);
  return DT_OK;
}

static void memory_destroy(void *impl) {
  memory_set *s = impl;
  free(s->inputs);
  free(s->targets);
  free(s);
}

static const dt_dataset_vtable memory_vtable = {
    .length = memory_length,
    .destroy = memory_destroy,
    .get_sample = memory_get_sample,
};

/* A copy of n samples of `bytes` each into *out; DT_ERR_INVALID_ARG when
 * n * bytes does not fit a size_t. */
static dt_status copy_samples(const char *what, const void *src, int64_t n, size_t bytes,
                              uint8_t **out) {
  if (bytes > SIZE_MAX / (uint64_t)n)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%lld samples of %zu %s bytes each do not fit in memory",
                    (long long)n, bytes, what);
  *out = malloc((size_t)n * bytes);
  if (!*out)
    return DT_ERROR(DT_ERR_OOM,
                    "cannot allocate %zu bytes for the %s of %lld samples: free memory or pass "
                    "fewer samples",
                    (size_t)n * bytes, what, (long long)n);
  memcpy(*out, src, (size_t)n * bytes);
  return DT_OK;
}

static size_t layout_numel(const int64_t *shape, int ndim) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++)
    n *= (size_t)shape[i];
  return n;
}

dt_status dt_dataset_from_memory(const dt_sample_layout *layout, const void *inputs,
                                 const void *targets, int64_t n, int num_classes,
                                 dt_dataset **out) {
  DT_CHECK_OUT(out);
  if (!layout || !inputs || !targets)
    return DT_ERROR(DT_ERR_INVALID_ARG, "layout, inputs and targets must not be NULL");
  if (n < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%lld samples: an in-memory data set holds at least one",
                    (long long)n);
  memory_set *s = calloc(1, sizeof *s);
  if (!s)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a dataset");
  s->n = n;
  /* The layout (shapes, dtypes, num_classes) is checked here, before any
   * size is computed from it; on failure s is freed by memory_destroy. */
  dt_dataset *d = NULL;
  DT_CHECK(dt_dataset_create_with_layout(&memory_vtable, s, layout, num_classes, &d));
  s->input_bytes =
      layout_numel(layout->input_shape, layout->input_ndim) * dt_dtype_size(layout->input_dtype);
  s->target_bytes =
      layout_numel(layout->target_shape, layout->target_ndim) * dt_dtype_size(layout->target_dtype);
  dt_status st = copy_samples("input", inputs, n, s->input_bytes, &s->inputs);
  if (st == DT_OK)
    st = copy_samples("target", targets, n, s->target_bytes, &s->targets);
  if (st != DT_OK) {
    dt_dataset_destroy(d);
    return st;
  }
  *out = d;
  return DT_OK;
}
