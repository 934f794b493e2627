/* Parameter-free modules (ReLU, GELU, Tanh, Flatten, MaxPool2d, AvgPool2d,
 * Dropout) and Embedding. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn.h"
#include "core/nn_internal.h"
#include "core/ops.h"

/* ---- one op of x: the activations (x -> f(x), same shape) and Flatten
 * (x (N, ...) -> (N, prod(...))) ---- */

/* The module's impl: the op its forward is (static, never freed). */
typedef struct unary_impl {
  dt_status (*op)(dt_tensor *x, dt_tensor **y);
} unary_impl;

static dt_status unary_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  const unary_impl *u = dt_module_impl(m);
  return u->op(x, y);
}

static const dt_module_vtable relu_vtable = {"ReLU", unary_forward, NULL};
static const dt_module_vtable gelu_vtable = {"GELU", unary_forward, NULL};
static const dt_module_vtable tanh_vtable = {"Tanh", unary_forward, NULL};
static const dt_module_vtable flatten_vtable = {"Flatten", unary_forward, NULL};
static const unary_impl relu_op = {dt_op_relu}, gelu_op = {dt_op_gelu}, tanh_op = {dt_op_tanh},
                        flatten_op = {dt_op_flatten};

static dt_status create_unary(const dt_module_vtable *vt, const unary_impl *op, dt_module **out) {
  if (out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a %s module: out is NULL", vt->type_name);
  return dt_module_create(vt, (void *)op, out);
}

dt_status dt_nn_relu(dt_module **out) { return create_unary(&relu_vtable, &relu_op, out); }
dt_status dt_nn_gelu(dt_module **out) { return create_unary(&gelu_vtable, &gelu_op, out); }
dt_status dt_nn_tanh(dt_module **out) { return create_unary(&tanh_vtable, &tanh_op, out); }
dt_status dt_nn_flatten(dt_module **out) { return create_unary(&flatten_vtable, &flatten_op, out); }

/* ---- pooling: x (N,C,H,W) -> (N,C,OH,OW); channels-last (N,H,W,C) ->
 * (N,OH,OW,C) ---- */

typedef struct pool_impl {
  int kernel, stride, padding;
  bool channels_last;
} pool_impl;

static dt_status max_pool_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  pool_impl *p = dt_module_impl(m);
  return (p->channels_last ? dt_op_max_pool2d_nhwc : dt_op_max_pool2d)(x, p->kernel, p->stride,
                                                                       p->padding, y);
}

static dt_status avg_pool_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  pool_impl *p = dt_module_impl(m);
  return (p->channels_last ? dt_op_avg_pool2d_nhwc : dt_op_avg_pool2d)(x, p->kernel, p->stride,
                                                                       p->padding, y);
}

static const dt_module_vtable max_pool_vtable = {"MaxPool2d", max_pool_forward, free};
static const dt_module_vtable avg_pool_vtable = {"AvgPool2d", avg_pool_forward, free};

static dt_status create_pool(const dt_module_vtable *vt, int kernel, int stride, int padding,
                             dt_module **out) {
  if (stride == 0)
    stride = kernel; /* PyTorch: stride defaults to kernel_size */
  if (kernel <= 0 || stride <= 0 || padding < 0 || 2 * padding > kernel || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s(kernel %d, stride %d, padding %d): kernel and stride must be positive "
                    "(stride 0 = kernel) and padding in [0, kernel/2]",
                    vt->type_name, kernel, stride, padding);
  pool_impl *impl = malloc(sizeof *impl);
  if (impl != NULL)
    *impl = (pool_impl){kernel, stride, padding, false};
  return dt_nn_create(vt, impl, out);
}

dt_status dt_nn_max_pool2d(int kernel, int stride, int padding, dt_module **out) {
  return create_pool(&max_pool_vtable, kernel, stride, padding, out);
}

dt_status dt_nn_avg_pool2d(int kernel, int stride, int padding, dt_module **out) {
  return create_pool(&avg_pool_vtable, kernel, stride, padding, out);
}

int dt_nn_set_channels_last(dt_module *m, bool on) {
  if (m == NULL)
    return 0;
  const char *type = dt_module_type_name(m);
  int count = dt_nn_conv2d_channels_last(m, on) + dt_nn_batch_norm_channels_last(m, on);
  if (type == max_pool_vtable.type_name || type == avg_pool_vtable.type_name) {
    ((pool_impl *)dt_module_impl(m))->channels_last = on;
    count++;
  }
  for (int i = 0; i < dt_module_num_children(m); i++)
    count += dt_nn_set_channels_last(dt_module_child_at(m, i), on);
  return count;
}

/* ---- dropout: x -> x * mask / (1 - p) in training, x in eval ---- */

typedef struct dropout_impl {
  float p;
  dt_generator gen;
} dropout_impl;

static dt_status dropout_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  dropout_impl *d = dt_module_impl(m);
  return dt_op_dropout(x, d->p, dt_module_is_training(m), &d->gen, y);
}

static const dt_module_vtable dropout_vtable = {"Dropout", dropout_forward, free};

dt_generator *dt_nn_dropout_generator(dt_module *m) {
  if (strcmp(dt_module_type_name(m), dropout_vtable.type_name) != 0)
    return NULL;
  return &((dropout_impl *)dt_module_impl(m))->gen;
}

dt_status dt_nn_dropout(float p, uint64_t seed, dt_module **out) {
  if (!(p >= 0.0f && p < 1.0f) || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "Dropout(p %g): p must be in [0, 1)", (double)p);
  dropout_impl *impl = malloc(sizeof *impl);
  if (impl != NULL) {
    impl->p = p;
    dt_generator_init(&impl->gen, seed);
  }
  return dt_nn_create(&dropout_vtable, impl, out);
}

/* ---- embedding: idx (...) i32/i64 -> (..., dim) ---- */

static dt_status embedding_forward(dt_module *m, dt_tensor *idx, dt_tensor **y) {
  dt_tensor *table = NULL;
  DT_CHECK(dt_nn_param(m, "weight", &table));
  return dt_op_embedding(idx, table, y);
}

static const dt_module_vtable embedding_vtable = {"Embedding", embedding_forward, NULL};

dt_status dt_nn_embedding(int num_embeddings, int dim, dt_generator *gen, dt_module **out) {
  if (num_embeddings <= 0 || dim <= 0 || gen == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "Embedding(%d, %d): sizes must be positive and gen/out non-NULL",
                    num_embeddings, dim);
  dt_module *m = NULL;
  DT_CHECK(dt_module_create(&embedding_vtable, NULL, &m));
  int64_t shape[2] = {num_embeddings, dim};
  dt_tensor *t = NULL;
  dt_status st = dt_nn_normal(shape, 2, 1.0f, gen, &t);
  if (st == DT_OK)
    st = dt_nn_add_parameter(m, "weight", t);
  return dt_nn_finish_create(m, st, out);
}
