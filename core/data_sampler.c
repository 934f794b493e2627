/* Samplers: sequential, shuffled (Fisher-Yates, seed + epoch) and
 * distributed with torch.utils.data.DistributedSampler's exact rules:
 *   drop_last and len % R != 0: num_samples = floor(len / R), the shuffled
 *                               list is truncated to num_samples * R;
 *   otherwise:                  num_samples = ceil(len / R), the list is
 *                               padded cyclically from its start;
 *   rank r takes list[r : total : R].
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/data.h"
#include "core/rng.h"

struct dt_sampler {
  dt_sampler_config cfg;
  int64_t len;         /* dataset length */
  int64_t num_samples; /* per rank per epoch */
  int64_t *order;      /* (len) scratch: the epoch's permutation */
  int64_t *indices;    /* (num_samples) this rank's share */
  /* order and indices follow the struct in its allocation */
};

dt_status dt_sampler_create(int64_t dataset_len, const dt_sampler_config *cfg, dt_sampler **out) {
  DT_CHECK_OUT(out);
  dt_sampler_config c = cfg ? *cfg : DT_SAMPLER_CONFIG_DEFAULT;
  if (dataset_len < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dataset length %lld: must be >= 0",
                    (long long)dataset_len);
  if (c.num_replicas < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "num_replicas %d: must be >= 1 (the world size)",
                    c.num_replicas);
  if (c.rank < 0 || c.rank >= c.num_replicas)
    return DT_ERROR(DT_ERR_INVALID_ARG, "rank %d: must be in [0, num_replicas %d)", c.rank,
                    c.num_replicas);
  int64_t r = c.num_replicas;
  int64_t num_samples =
      (c.drop_last && dataset_len % r != 0) ? dataset_len / r : (dataset_len + r - 1) / r;

  /* One block: the struct, then order (len) and indices (num_samples). */
  uint64_t elems = (uint64_t)dataset_len + (uint64_t)num_samples;
  dt_sampler *s = elems <= (SIZE_MAX - sizeof *s) / sizeof(int64_t)
                      ? calloc(1, sizeof *s + (size_t)elems * sizeof(int64_t))
                      : NULL;
  if (!s)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a sampler for %lld samples",
                    (long long)dataset_len);
  s->cfg = c;
  s->len = dataset_len;
  s->num_samples = num_samples;
  s->order = (int64_t *)(s + 1);
  s->indices = s->order + dataset_len;
  dt_status st = dt_sampler_set_epoch(s, 0);
  if (st != DT_OK) {
    dt_sampler_destroy(s);
    return st;
  }
  *out = s;
  return DT_OK;
}

void dt_sampler_destroy(dt_sampler *s) { free(s); }

dt_status dt_sampler_set_epoch(dt_sampler *s, int64_t epoch) {
  if (!s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "sampler is NULL");
  if (epoch < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "epoch %lld: must be >= 0", (long long)epoch);
  int64_t n = s->len;
  for (int64_t i = 0; i < n; i++)
    s->order[i] = i;
  if (s->cfg.shuffle) {
    dt_generator g;
    dt_generator_init(&g, s->cfg.seed + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
      int64_t j = (int64_t)dt_generator_below(&g, (uint64_t)i + 1);
      int64_t t = s->order[i];
      s->order[i] = s->order[j];
      s->order[j] = t;
    }
  }
  /* Position p of the padded/truncated list is order[p % n]; rank r owns
   * positions r, r + R, r + 2R, ... */
  int64_t r = s->cfg.num_replicas;
  for (int64_t k = 0; k < s->num_samples; k++)
    s->indices[k] = s->order[(s->cfg.rank + k * r) % n];
  return DT_OK;
}

int64_t dt_sampler_length(const dt_sampler *s) { return s->num_samples; }

const int64_t *dt_sampler_indices(const dt_sampler *s) { return s->indices; }
