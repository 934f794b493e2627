/* BatchNorm2d, LayerNorm and RMSNorm: weight 1, bias 0 (PyTorch's defaults). */
#include <stdbool.h>
#include <stdlib.h>

#include "core/nn.h"
#include "core/nn_internal.h"
#include "core/ops.h"

typedef struct batch_norm_impl {
  int channels;
  float eps, momentum;
  bool synced; /* training statistics over every process of `across` */
  dt_sum_across across;
  bool channels_last; /* x (N,H,W,C): normalised as its (N*H*W, C) view */
} batch_norm_impl;

typedef struct layer_norm_impl {
  int features;
  float eps;
} layer_norm_impl;

/* num_batches_tracked += 1. It is a device tensor (it is broadcast and
 * checkpointed with the other buffers), so the count makes a round trip
 * through the host: one 8-byte copy each way per training forward. */
static dt_status increment_counter(dt_tensor *counter) {
  int64_t n = 0;
  DT_CHECK(dt_tensor_to_host(counter, &n, sizeof n));
  n++;
  dt_tensor *host = NULL;
  int64_t scalar_shape[1] = {1}; /* unused: rank 0 */
  DT_CHECK(dt_tensor_from_host(&n, scalar_shape, 0, DT_DTYPE_I64, DT_CPU, &host));
  dt_status st = dt_tensor_copy_(counter, host);
  dt_tensor_release(host);
  return st;
}

/* Channels-last x (N,H,W,C) as the (N*H*W, C) view the batch norm ops
 * take (C channels: the statistics are per column), in *flat; x itself
 * (retained) otherwise. */
static dt_status batch_norm_input(const batch_norm_impl *impl, dt_tensor *x, dt_tensor **flat) {
  if (!impl->channels_last) {
    dt_tensor_retain(x);
    *flat = x;
    return DT_OK;
  }
  if (dt_tensor_ndim(x) != 4 || dt_tensor_dim(x, 3) != impl->channels) {
    char d[96];
    return DT_ERROR(DT_ERR_SHAPE,
                    "BatchNorm2d(%d), channels-last: expected x (N, H, W, %d), got %s",
                    impl->channels, impl->channels, dt_tensor_describe(x, d, sizeof d));
  }
  int64_t shape[2] = {dt_tensor_numel(x) / impl->channels, impl->channels};
  return dt_tensor_reshape(x, shape, 2, flat);
}

/* x (N,C,H,W) or (N,C) -> same shape; channels-last x (N,H,W,C) too */
static dt_status batch_norm_forward(dt_module *m, dt_tensor *x_in, dt_tensor **y) {
  batch_norm_impl *impl = dt_module_impl(m);
  dt_tensor *w = NULL, *b = NULL;
  DT_CHECK(dt_nn_weight_bias(m, 1, &w, &b));
  dt_tensor *mean = dt_module_buffer(m, "running_mean");
  dt_tensor *var = dt_module_buffer(m, "running_var");
  dt_tensor *count = dt_module_buffer(m, "num_batches_tracked");
  if (mean == NULL || var == NULL || count == NULL)
    return DT_ERROR(DT_ERR_STATE, "BatchNorm2d is missing one of its running-stat buffers");
  int training = dt_module_is_training(m);
  /* A recomputation's re-run (core/nn_recompute.c) normalises with the
   * batch's statistics again, bit for bit, but must not move the running
   * ones a second time. */
  int rerun = training && dt_nn_recomputing();
  dt_tensor *run_mean = rerun ? NULL : mean, *run_var = rerun ? NULL : var;
  dt_tensor *x = NULL, *flat_y = NULL;
  DT_CHECK(batch_norm_input(impl, x_in, &x));
  dt_status st;
  if (training && impl->synced)
    st = dt_op_sync_batch_norm2d(x, w, b, run_mean, run_var, impl->momentum, impl->eps,
                                 &impl->across, &flat_y);
  else
    st = dt_op_batch_norm2d(x, w, b, run_mean, run_var, training, impl->momentum, impl->eps,
                            &flat_y);
  dt_tensor_release(x);
  DT_CHECK(st);
  if (impl->channels_last) {
    st = dt_tensor_reshape(flat_y, dt_tensor_shape(x_in), 4, y);
    dt_tensor_release(flat_y);
    DT_CHECK(st);
  } else {
    *y = flat_y;
  }
  if (training && !rerun) {
    st = increment_counter(count);
    if (st != DT_OK) {
      dt_tensor_release(*y);
      *y = NULL;
      return st;
    }
  }
  return DT_OK;
}

static const dt_module_vtable batch_norm_vtable = {"BatchNorm2d", batch_norm_forward, free};

static dt_status batch_norm_init(dt_module *m, int channels) {
  int64_t c = channels;
  dt_tensor *t = NULL;
  DT_CHECK(dt_nn_constant(&c, 1, 1.0f, &t));
  DT_CHECK(dt_nn_add_parameter(m, "weight", t));
  DT_CHECK(dt_nn_constant(&c, 1, 0.0f, &t));
  DT_CHECK(dt_nn_add_parameter(m, "bias", t));
  DT_CHECK(dt_nn_constant(&c, 1, 0.0f, &t));
  DT_CHECK(dt_nn_add_buffer(m, "running_mean", t));
  DT_CHECK(dt_nn_constant(&c, 1, 1.0f, &t));
  DT_CHECK(dt_nn_add_buffer(m, "running_var", t));
  DT_CHECK(dt_tensor_zeros(&c, 0, DT_DTYPE_I64, DT_CPU, &t)); /* rank 0, as PyTorch */
  DT_CHECK(dt_nn_add_buffer(m, "num_batches_tracked", t));
  return DT_OK;
}

dt_status dt_nn_batch_norm2d(int channels, float eps, float momentum, dt_module **out) {
  if (channels <= 0 || !(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f) || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "BatchNorm2d(%d, eps %g, momentum %g): channels must be positive, eps > 0, "
                    "momentum in [0, 1] (PyTorch: eps 1e-5, momentum 0.1)",
                    channels, (double)eps, (double)momentum);
  batch_norm_impl *impl = malloc(sizeof *impl);
  if (impl != NULL)
    *impl = (batch_norm_impl){channels, eps, momentum, false, {NULL, NULL}, false};
  dt_module *m = NULL;
  DT_CHECK(dt_nn_create(&batch_norm_vtable, impl, &m));
  return dt_nn_finish_create(m, batch_norm_init(m, channels), out);
}

int dt_nn_batch_norm_set_sync(dt_module *m, const dt_sum_across *across) {
  int count = 0;
  if (m == NULL)
    return 0;
  if (dt_module_type_name(m) == batch_norm_vtable.type_name) {
    batch_norm_impl *impl = dt_module_impl(m);
    impl->synced = across != NULL && across->sum != NULL;
    impl->across = impl->synced ? *across : (dt_sum_across){NULL, NULL};
    count++;
  }
  for (int i = 0; i < dt_module_num_children(m); i++)
    count += dt_nn_batch_norm_set_sync(dt_module_child_at(m, i), across);
  return count;
}

int dt_nn_batch_norm_channels_last(dt_module *m, bool on) {
  if (dt_module_type_name(m) != batch_norm_vtable.type_name)
    return 0;
  ((batch_norm_impl *)dt_module_impl(m))->channels_last = on;
  return 1;
}

/* x (..., features) -> same shape */
static dt_status layer_norm_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  layer_norm_impl *impl = dt_module_impl(m);
  dt_tensor *w = NULL, *b = NULL;
  DT_CHECK(dt_nn_weight_bias(m, 1, &w, &b));
  return dt_op_layer_norm(x, w, b, impl->eps, y);
}

static dt_status rms_norm_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  layer_norm_impl *impl = dt_module_impl(m);
  dt_tensor *w = NULL, *b = NULL;
  DT_CHECK(dt_nn_weight_bias(m, 0, &w, &b));
  return dt_op_rms_norm(x, w, impl->eps, y);
}

static const dt_module_vtable layer_norm_vtable = {"LayerNorm", layer_norm_forward, free};
static const dt_module_vtable rms_norm_vtable = {"RMSNorm", rms_norm_forward, free};

/* A norm over the last dimension: weight 1 (and bias 0). */
static dt_status last_dim_norm(const dt_module_vtable *vt, int features, float eps, int has_bias,
                               dt_module **out) {
  if (features <= 0 || !(eps > 0.0f) || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s(%d, eps %g): features must be positive and eps > 0 (PyTorch: "
                    "1e-5)",
                    vt->type_name, features, (double)eps);
  layer_norm_impl *impl = malloc(sizeof *impl);
  if (impl != NULL)
    *impl = (layer_norm_impl){features, eps};
  dt_module *m = NULL;
  DT_CHECK(dt_nn_create(vt, impl, &m));
  int64_t c = features;
  dt_tensor *t = NULL;
  dt_status st = dt_nn_constant(&c, 1, 1.0f, &t);
  if (st == DT_OK)
    st = dt_nn_add_parameter(m, "weight", t);
  if (st == DT_OK && has_bias)
    st = dt_nn_constant(&c, 1, 0.0f, &t);
  if (st == DT_OK && has_bias)
    st = dt_nn_add_parameter(m, "bias", t);
  return dt_nn_finish_create(m, st, out);
}

dt_status dt_nn_layer_norm(int features, float eps, dt_module **out) {
  return last_dim_norm(&layer_norm_vtable, features, eps, 1, out);
}

dt_status dt_nn_rms_norm(int features, float eps, dt_module **out) {
  return last_dim_norm(&rms_norm_vtable, features, eps, 0, out);
}
