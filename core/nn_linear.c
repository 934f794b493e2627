/* Linear and Conv2d: weights Kaiming-uniform with a = sqrt(5), which is
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases the same bound (PyTorch's
 * reset_parameters). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/nn.h"
#include "core/nn_internal.h"
#include "core/ops.h"

typedef struct linear_impl {
  int in_features, out_features, has_bias;
} linear_impl;

typedef struct conv2d_impl {
  int in_channels, out_channels, kernel, stride, padding, has_bias;
  bool channels_last; /* x (N,H,W,C): dt_op_conv2d_nhwc */
} conv2d_impl;

/* x (..., in) -> (..., out) */
static dt_status linear_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  linear_impl *impl = dt_module_impl(m);
  dt_tensor *w = NULL, *b = NULL;
  DT_CHECK(dt_nn_weight_bias(m, impl->has_bias, &w, &b));
  return dt_op_linear(x, w, b, y);
}

static const dt_module_vtable linear_vtable = {"Linear", linear_forward, free};

/* weight then bias, each drawn in row-major order, as PyTorch. */
static dt_status init_weight_bias(dt_module *m, const int64_t *wshape, int wndim, int64_t nout,
                                  int fan_in, int bias, dt_generator *gen) {
  float bound = 1.0f / sqrtf((float)fan_in);
  dt_tensor *t = NULL;
  DT_CHECK(dt_nn_uniform(wshape, wndim, bound, gen, &t));
  DT_CHECK(dt_nn_add_parameter(m, "weight", t));
  if (bias) {
    DT_CHECK(dt_nn_uniform(&nout, 1, bound, gen, &t));
    DT_CHECK(dt_nn_add_parameter(m, "bias", t));
  }
  return DT_OK;
}

dt_status dt_nn_linear(int in_features, int out_features, int bias, dt_generator *gen,
                       dt_module **out) {
  if (in_features <= 0 || out_features <= 0 || gen == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "Linear(%d, %d): features must be positive and gen/out non-NULL", in_features,
                    out_features);
  linear_impl *impl = malloc(sizeof *impl);
  if (impl != NULL)
    *impl = (linear_impl){in_features, out_features, bias ? 1 : 0};
  dt_module *m = NULL;
  DT_CHECK(dt_nn_create(&linear_vtable, impl, &m));
  int64_t wshape[2] = {out_features, in_features};
  dt_status st = init_weight_bias(m, wshape, 2, out_features, in_features, bias, gen);
  return dt_nn_finish_create(m, st, out);
}

/* x (N,C,H,W) -> (N,OC,OH,OW); channels-last (N,H,W,C) -> (N,OH,OW,OC) */
static dt_status conv2d_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  conv2d_impl *impl = dt_module_impl(m);
  dt_tensor *w = NULL, *b = NULL;
  DT_CHECK(dt_nn_weight_bias(m, impl->has_bias, &w, &b));
  return (impl->channels_last ? dt_op_conv2d_nhwc : dt_op_conv2d)(x, w, b, impl->stride,
                                                                  impl->padding, y);
}

static const dt_module_vtable conv2d_vtable = {"Conv2d", conv2d_forward, free};

int dt_nn_conv2d_channels_last(dt_module *m, bool on) {
  if (dt_module_type_name(m) != conv2d_vtable.type_name)
    return 0;
  ((conv2d_impl *)dt_module_impl(m))->channels_last = on;
  return 1;
}

dt_status dt_nn_conv2d(int in_channels, int out_channels, int kernel, int stride, int padding,
                       int bias, dt_generator *gen, dt_module **out) {
  if (in_channels <= 0 || out_channels <= 0 || kernel <= 0 || stride <= 0 || padding < 0 ||
      gen == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "Conv2d(%d, %d, kernel %d, stride %d, padding %d): channels, kernel and "
                    "stride must be positive, padding >= 0, gen/out non-NULL",
                    in_channels, out_channels, kernel, stride, padding);
  conv2d_impl *impl = malloc(sizeof *impl);
  if (impl != NULL)
    *impl = (conv2d_impl){in_channels, out_channels, kernel, stride, padding, bias ? 1 : 0, false};
  dt_module *m = NULL;
  DT_CHECK(dt_nn_create(&conv2d_vtable, impl, &m));
  int64_t wshape[4] = {out_channels, in_channels, kernel, kernel};
  dt_status st =
      init_weight_bias(m, wshape, 4, out_channels, in_channels * kernel * kernel, bias, gen);
  return dt_nn_finish_create(m, st, out);
}
