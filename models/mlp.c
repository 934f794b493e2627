/* The multi-layer perceptron (see models/models.h). */
#include "core/nn.h"
#include "models/models.h"

dt_status dt_model_mlp(const int *sizes, int n_sizes, uint64_t seed, dt_module **out) {
  if (sizes == NULL || n_sizes < 2 || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "MLP with %d sizes: give at least the input and output sizes, e.g. {784, "
                    "512, 512, 10}",
                    n_sizes);
  for (int i = 0; i < n_sizes; i++)
    if (sizes[i] <= 0)
      return DT_ERROR(DT_ERR_INVALID_ARG, "MLP: size %d is %d: every size must be positive", i,
                      sizes[i]);
  dt_status st = DT_OK;
  dt_generator gen;
  dt_generator_init(&gen, seed);
  dt_module *seq = NULL, *layer = NULL;
  DT_CHECK(dt_nn_sequential(NULL, 0, &seq));
  DT_CHECK_GOTO(dt_nn_flatten(&layer), st, destroy_seq);
  DT_CHECK_GOTO(dt_nn_sequential_append(seq, layer), st, destroy_seq);
  for (int i = 0; i + 1 < n_sizes; i++) {
    if (i > 0) {
      DT_CHECK_GOTO(dt_nn_relu(&layer), st, destroy_seq);
      DT_CHECK_GOTO(dt_nn_sequential_append(seq, layer), st, destroy_seq);
    }
    DT_CHECK_GOTO(dt_nn_linear(sizes[i], sizes[i + 1], 1, &gen, &layer), st, destroy_seq);
    DT_CHECK_GOTO(dt_nn_sequential_append(seq, layer), st, destroy_seq);
  }
  *out = seq;
  return DT_OK;

destroy_seq:
  dt_module_destroy(seq);
  return dt_error_wrap(st, "building the MLP");
}
