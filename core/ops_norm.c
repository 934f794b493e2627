/* Normalisation: batch_norm2d (NCHW or NC), layer_norm and rms_norm (last
 * dim). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops_internal.h"

/* A (C) parameter: the given one made contiguous, or `fill` everywhere
 * when NULL (affine = False). */
static dt_status param_or_const(dt_tensor *p, int64_t c, float fill, dt_device dev,
                                dt_tensor **out) {
  if (p)
    return dt_ops_contiguous(p, out);
  return dt_tensor_full(&c, 1, fill, dev, out);
}

/* The affine parameters of a norm over c features, as its kernels read
 * them: gamma (ones when NULL) and beta (zeros when NULL), contiguous. */
static dt_status affine_params(dt_tensor *gamma, dt_tensor *beta, int64_t c, dt_device dev,
                               dt_tensor **gc, dt_tensor **bc) {
  DT_CHECK(param_or_const(gamma, c, 1.0f, dev, gc));
  return param_or_const(beta, c, 0.0f, dev, bc);
}

/* The running mean and variance a batch norm updates: the caller's, or
 * (training without running stats) scratch zeros and ones of c. */
static dt_status running_stats(dt_tensor *running_mean, dt_tensor *running_var, int64_t c,
                               dt_device dev, dt_tensor **rm, dt_tensor **rv) {
  if (running_mean) {
    *rm = dt_tensor_retain(running_mean);
    *rv = dt_tensor_retain(running_var);
    return DT_OK;
  }
  DT_CHECK(dt_tensor_zeros(&c, 1, DT_DTYPE_F32, dev, rm));
  return dt_tensor_full(&c, 1, 1.0f, dev, rv);
}

/* A (c) parameter or statistic: f32 (the kernels read it as f32 whatever
 * the input's dtype) and of c features; NULL passes. */
static dt_status check_vec(const char *op, const char *what, dt_tensor *t, int64_t c) {
  char b[128];
  if (t && dt_tensor_dtype(t) != DT_DTYPE_F32)
    return DT_ERROR(DT_ERR_DTYPE, "%s: %s is %s: norms take f32 parameters and statistics", op,
                    what, dt_dtype_name(dt_tensor_dtype(t)));
  if (t && (dt_tensor_ndim(t) != 1 || dt_tensor_shape(t)[0] != c))
    return DT_ERROR(DT_ERR_SHAPE, "%s: %s %s does not match %lld features: expected (%lld)", op,
                    what, dt_shape_format(dt_tensor_shape(t), dt_tensor_ndim(t), b, sizeof b),
                    (long long)c, (long long)c);
  return DT_OK;
}

/* Gives dx, dgamma, dbeta to the node's inputs (x, [gamma], [beta]) that
 * need them and releases the rest. */
static void hand_out_grads(dt_node *node, int has_gamma, int has_beta, dt_tensor *dx,
                           dt_tensor *dgamma, dt_tensor *dbeta, dt_tensor **grad_in) {
  dt_tensor *g[3] = {dx, dgamma, dbeta};
  int present[3] = {1, has_gamma, has_beta};
  for (int i = 0, k = 0; i < 3; ++i) {
    if (present[i] && node->needs_grad[k]) {
      grad_in[k] = g[i];
      g[i] = NULL;
    }
    k += present[i];
    dt_tensor_release(g[i]);
  }
}

/* ---- batch norm ---- */

/* saved: 0 x (contiguous; f32 or 16-bit, as the op received it), 1 gamma
 * (or ones), 2 mean, 3 invstd (the batch statistics in training; a
 * snapshot of the running ones in eval). */
typedef struct batch_norm2d_saved {
  int64_t n, c, hw;
  bool training, has_gamma, has_beta;
  float eps;
} batch_norm2d_saved;

/* out (n, c, hw) = a (n, c, hw) <op> v (c), v broadcast over n and hw;
 * out may be a (n = hw = 1: element by element). */
static dt_status per_channel(const dt_exec *ex, dt_binary_op op, dt_tensor *a, dt_tensor *v,
                             dt_tensor *out, int64_t n, int64_t c, int64_t hw) {
  dt_binary_args args;
  memset(&args, 0, sizeof args);
  args.op = op;
  args.ndim = 3;
  args.shape[0] = n;
  args.shape[1] = c;
  args.shape[2] = hw;
  args.a_strides[0] = c * hw;
  args.a_strides[1] = hw;
  args.a_strides[2] = 1;
  args.b_strides[1] = 1;
  return dt_kernel_binary(ex, &args, DT_F32(a), DT_F32(v), DT_F32(out));
}

/* This process's gradients of a batch norm in training: *dx (n, c, hw;
 * the training formula over this batch, of x's dtype; dx NULL: not
 * computed, for the callers with a formula of their own), *dgamma = sum
 * dy (x - mean) invstd and *dbeta = sum dy (c), from the saved mean and
 * invstd. x and gy may be 16-bit (the kernel reads them as they are). */
static dt_status local_grads(dt_tensor *x, dt_tensor *gy, dt_tensor *gamma, dt_tensor *mean,
                             dt_tensor *invstd, int64_t n, int64_t c, int64_t hw, float eps,
                             dt_tensor **dx, dt_tensor **dgamma, dt_tensor **dbeta) {
  dt_device dev = dt_tensor_device(gy);
  const dt_exec ex = dt_tensor_exec(x), *ex32 = DT_TENSOR_EXEC(mean);
  if (dx)
    DT_CHECK(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), dt_tensor_dtype(x), dev, dx));
  DT_CHECK(dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, dgamma));
  DT_CHECK(dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, dbeta));
  if (n * hw > 0 && c > 0)
    return dt_kernel_batch_norm2d_backward(&ex, dt_tensor_data(x), dt_tensor_data(gy),
                                           dt_tensor_dtype(gy), DT_F32(gamma), DT_F32(mean),
                                           DT_F32(invstd), dx ? dt_tensor_data(*dx) : NULL,
                                           DT_F32(*dgamma), DT_F32(*dbeta), n, c, hw, eps);
  if (c > 0) { /* no samples: the parameter gradients are zero */
    DT_CHECK(dt_kernel_fill(ex32, DT_F32(*dgamma), 0.0f, c));
    DT_CHECK(dt_kernel_fill(ex32, DT_F32(*dbeta), 0.0f, c));
  }
  return DT_OK;
}

static dt_status batch_norm_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0], *gamma = node->saved[1], *mean = node->saved[2],
            *invstd = node->saved[3];
  const batch_norm2d_saved *s = DT_NODE_PARAMS(node, batch_norm2d_saved);
  int64_t n = s->n, c = s->c, hw = s->hw;
  int training = s->training, has_gamma = s->has_gamma, has_beta = s->has_beta;
  dt_device dev = dt_tensor_device(gy);
  const dt_exec *ex32 = DT_TENSOR_EXEC(mean);
  dt_tensor *dx = NULL, *dgamma = NULL, *dbeta = NULL, *scale = NULL, *gy32 = NULL;
  dt_status st;
  /* dgamma and dbeta are the same in both modes; dx is the training
   * formula, or in eval mode the one below. */
  DT_CHECK_GOTO(local_grads(x, gy, gamma, mean, invstd, n, c, hw, s->eps, training ? &dx : NULL,
                            &dgamma, &dbeta),
                st, fail);
  if (!training)
    DT_CHECK_GOTO(dt_ops_empty_like(x, dev, &dx), st, fail);
  if (!training && n * hw > 0 && c > 0) {
    /* eval: y = gamma * invstd * (x - mean) + beta is affine in x:
     * dx (n, c, hw) = dy * scale (c), scale = gamma * invstd, in f32 (the
     * engine rounds it to a 16-bit x's dtype) */
    DT_CHECK_GOTO(dt_ops_widen(gy, &gy32), st, fail);
    DT_CHECK_GOTO(dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, &scale), st, fail);
    DT_CHECK_GOTO(per_channel(ex32, DT_BINARY_MUL, gamma, invstd, scale, 1, c, 1), st, fail);
    DT_CHECK_GOTO(per_channel(ex32, DT_BINARY_MUL, gy32, scale, dx, n, c, hw), st, fail);
  }
  DT_RELEASE_TENSORS(gy32, scale);
  hand_out_grads(node, has_gamma, has_beta, dx, dgamma, dbeta, grad_in);
  return DT_OK;
fail:
  DT_RELEASE_TENSORS(gy32, scale, dbeta, dgamma, dx);
  return st;
}

/* Eval mode, recording: snapshot of the running mean and 1/sqrt(var + eps)
 * (computed on the host; the stats are C floats). */
static dt_status running_stats_snapshot(dt_tensor *rm, dt_tensor *rv, float eps, dt_tensor **mean,
                                        dt_tensor **invstd) {
  int64_t c = dt_tensor_numel(rv);
  dt_device dev = dt_tensor_device(rv);
  float *host = malloc(sizeof(float) * (size_t)(c > 0 ? c : 1));
  if (!host)
    return DT_ERROR(DT_ERR_OOM, "batch_norm2d: out of host memory for %lld running stats",
                    (long long)c);
  dt_status st = dt_tensor_to_host(rv, host, sizeof(float) * (size_t)c);
  for (int64_t i = 0; st == DT_OK && i < c; ++i)
    host[i] = (float)(1.0 / sqrt((double)host[i] + (double)eps));
  if (st == DT_OK)
    st = dt_tensor_from_host(host, &c, 1, DT_DTYPE_F32, dev, invstd);
  free(host);
  if (st == DT_OK) {
    st = dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, mean);
    if (st == DT_OK)
      st = dt_tensor_copy_(*mean, rm);
    if (st != DT_OK) {
      dt_tensor_release(*mean);
      dt_tensor_release(*invstd);
      *mean = *invstd = NULL;
    }
  }
  return st;
}

/* The checks of a batch norm's arguments all = {x, gamma, beta,
 * running_mean, running_var}; x (n, c, hw). uses_batch_stats: running
 * stats may be NULL; check_count: more than one value per channel here. */
static dt_status check_batch_norm(const char *op, dt_tensor *const *all, bool uses_batch_stats,
                                  bool check_count, int64_t *n_out, int64_t *c_out,
                                  int64_t *hw_out) {
  dt_tensor *x = all[0], *gamma = all[1], *beta = all[2], *running_mean = all[3],
            *running_var = all[4];
  DT_CHECK(dt_ops_check_float_inputs(op, all, 5)); /* the same device, x 16-bit or f32 */
  DT_CHECK(dt_ops_check_inputs(op, all + 1, 4));   /* the per-channel vectors f32 */
  int nd = dt_tensor_ndim(x);
  const int64_t *s = dt_tensor_shape(x);
  char b[128];
  if (nd != 4 && nd != 2)
    return DT_ERROR(DT_ERR_SHAPE, "%s: input %s: expected (N, C, H, W) or (N, C)", op,
                    dt_shape_format(s, nd, b, sizeof b));
  int64_t n = s[0], c = s[1], hw = nd == 4 ? s[2] * s[3] : 1;
  *n_out = n;
  *c_out = c;
  *hw_out = hw;
  DT_CHECK(check_vec(op, "gamma", gamma, c));
  DT_CHECK(check_vec(op, "beta", beta, c));
  DT_CHECK(check_vec(op, "running_mean", running_mean, c));
  DT_CHECK(check_vec(op, "running_var", running_var, c));
  if ((running_mean == NULL) != (running_var == NULL))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: running_mean and running_var must both be given or both be NULL", op);
  if (!uses_batch_stats && running_mean == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: eval mode needs running_mean and running_var (or use training mode)", op);
  if ((running_mean && !dt_tensor_is_contiguous(running_mean)) ||
      (running_var && !dt_tensor_is_contiguous(running_var)))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: running_mean / running_var are updated in place and must be "
                    "contiguous",
                    op);
  if (check_count && n * hw <= 1 && c > 0)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: input %s: training mode needs more than one value per channel to "
                    "estimate the variance: use a larger batch or eval mode",
                    op, dt_shape_format(s, nd, b, sizeof b));
  return DT_OK;
}

dt_status dt_op_batch_norm2d(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                             dt_tensor *running_mean, dt_tensor *running_var, bool training,
                             float momentum, float eps, dt_tensor **out) {
  static const char *op = "dt_op_batch_norm2d";
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  dt_tensor *all[5] = {x, gamma, beta, running_mean, running_var};
  /* autocast's NORM policy: x read as it is (a 16-bit x is what the
   * backward keeps), the statistics in f32, y f32 or under autocast the
   * 16-bit dtype, rounded once */
  const dt_dtype ydt = dt_autocast_norm_dtype_for(op);
  int64_t n = 0, c = 0, hw = 0;
  DT_CHECK(check_batch_norm(op, all, training, training, &n, &c, &hw));
  int nd = dt_tensor_ndim(x);
  const int64_t *s = dt_tensor_shape(x);

  dt_device dev = dt_tensor_device(x);
  dt_tensor *xc = NULL, *gc = NULL, *bc = NULL, *y = NULL, *mean = NULL, *invstd = NULL, *rm = NULL,
            *rv = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(x, &xc), st, fail);
  DT_CHECK_GOTO(affine_params(gamma, beta, c, dev, &gc, &bc), st, fail);
  DT_CHECK_GOTO(running_stats(running_mean, running_var, c, dev, &rm, &rv), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(s, nd, ydt, dev, &y), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, &mean), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, &invstd), st, fail);
  /* x (n, c, hw) -> y; batch stats -> mean, invstd (training) */
  if (n * c * hw > 0)
    DT_CHECK_GOTO(dt_kernel_batch_norm2d_forward(DT_TENSOR_EXEC(xc), dt_tensor_data(xc),
                                                 dt_tensor_data(y), ydt, DT_F32(gc), DT_F32(bc),
                                                 DT_F32(rm), DT_F32(rv), DT_F32(mean),
                                                 DT_F32(invstd), n, c, hw, training, momentum, eps),
                  st, fail);
  dt_tensor *ins[3] = {x, gamma, beta};
  DT_CHECK_GOTO(dt_ops_maybe_record(op, batch_norm_backward, ins, 3, y, &node), st, fail);
  if (node && !training) {
    dt_tensor_release(mean);
    dt_tensor_release(invstd);
    mean = invstd = NULL;
    DT_CHECK_GOTO(running_stats_snapshot(rm, rv, eps, &mean, &invstd), st, fail);
  }
  dt_tensor *saved[4] = {xc, gc, mean, invstd};
  dt_ops_save_for_backward(node, saved, 4);
  DT_OPS_SAVE_PARAMS(node, batch_norm2d_saved,
                     {n, c, hw, training != 0, gamma != NULL, beta != NULL, eps});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, invstd, mean, rv, rm, bc, gc, xc);
  return st;
}

/* ---- synchronised batch norm (PyTorch's SyncBatchNorm) ---- */

/* saved: 0 x (contiguous), 1 gamma (or ones), 2 mean, 3 invstd: the
 * statistics over every process's batch */
typedef struct sync_batch_norm_saved {
  int64_t n, c, hw;
  bool has_gamma, has_beta;
  float eps;
  double count; /* values per channel over every process */
  dt_sum_across across;
} sync_batch_norm_saved;

/* A (c) f32 tensor on dev from c doubles. */
static dt_status channel_tensor(const double *v, int64_t c, dt_device dev, dt_tensor **out) {
  float *f = malloc(sizeof(float) * (size_t)(c > 0 ? c : 1));
  if (!f)
    return DT_ERROR(DT_ERR_OOM, "sync_batch_norm2d: no host memory for %lld values", (long long)c);
  for (int64_t i = 0; i < c; i++)
    f[i] = (float)v[i];
  dt_status st = dt_tensor_from_host(f, &c, 1, DT_DTYPE_F32, dev, out);
  free(f);
  return st;
}

/* v (k doubles) = the f32 tensor t (k values). */
static dt_status read_doubles(dt_tensor *t, int64_t k, double *v) {
  float *f = malloc(sizeof(float) * (size_t)(k > 0 ? k : 1));
  dt_status st =
      f ? dt_tensor_to_host(t, f, sizeof(float) * (size_t)k)
        : DT_ERROR(DT_ERR_OOM, "sync_batch_norm2d: no host memory for %lld values", (long long)k);
  for (int64_t i = 0; st == DT_OK && i < k; i++)
    v[i] = f[i];
  free(f);
  return st;
}

/* v (k values on the host) summed over the processes of `across`, through
 * an f32 tensor on dev. */
static dt_status sum_across(const dt_sum_across *across, double *v, int64_t k, dt_device dev) {
  dt_tensor *t = NULL;
  DT_CHECK(channel_tensor(v, k, dev, &t));
  dt_status st = across->sum(t, across->user);
  if (st != DT_OK)
    dt_error_wrap(st, "sync_batch_norm2d: summing %lld statistics across processes", (long long)k);
  else
    st = read_doubles(t, k, v);
  dt_tensor_release(t);
  return st;
}

/* The per-channel sums of x (n, c, hw) into v (c), summed on the device. */
static dt_status channel_sums(dt_tensor *x, int64_t c, double *v) {
  static const int dims4[3] = {0, 2, 3}, dims2[1] = {0};
  bool four = dt_tensor_ndim(x) == 4;
  dt_tensor *sum = NULL;
  dt_no_grad_begin();
  dt_status st = dt_op_sum(x, four ? dims4 : dims2, four ? 3 : 1, false, &sum);
  dt_no_grad_end();
  if (st == DT_OK)
    st = read_doubles(sum, c, v);
  dt_tensor_release(sum);
  return st;
}

/* The squared deviations of x from mean (c), per channel, into v (c). */
static dt_status channel_squares(dt_tensor *x, dt_tensor *mean, int64_t n, int64_t c, int64_t hw,
                                 double *v) {
  dt_tensor *d = NULL;
  dt_status st = dt_ops_empty_like(x, dt_tensor_device(x), &d);
  const dt_exec ex = dt_tensor_exec(x);
  if (st == DT_OK)
    st = per_channel(&ex, DT_BINARY_SUB, x, mean, d, n, c, hw);
  if (st == DT_OK)
    st = per_channel(&ex, DT_BINARY_MUL, d, d, d, 1, n * c * hw, 1); /* d * d */
  if (st == DT_OK)
    st = channel_sums(d, c, v);
  dt_tensor_release(d);
  return st;
}

/* running = (1 - momentum) running + momentum * batch, on the host. */
static dt_status update_running(dt_tensor *running, const double *batch, int64_t c,
                                float momentum) {
  float *f = malloc(sizeof(float) * (size_t)(c > 0 ? c : 1));
  if (f == NULL)
    return DT_ERROR(DT_ERR_OOM, "sync_batch_norm2d: no host memory for %lld statistics",
                    (long long)c);
  dt_tensor *t = NULL;
  dt_status st = dt_tensor_to_host(running, f, sizeof(float) * (size_t)c);
  for (int64_t i = 0; st == DT_OK && i < c; i++)
    f[i] = (float)((1.0 - momentum) * f[i] + momentum * batch[i]);
  if (st == DT_OK &&
      (st = dt_tensor_from_host(f, &c, 1, DT_DTYPE_F32, dt_tensor_device(running), &t)) == DT_OK)
    st = dt_tensor_copy_(running, t);
  dt_tensor_release(t);
  free(f);
  return st;
}

static dt_status sync_batch_norm_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0], *gamma = node->saved[1], *mean = node->saved[2],
            *invstd = node->saved[3];
  const sync_batch_norm_saved *s = DT_NODE_PARAMS(node, sync_batch_norm_saved);
  int64_t n = s->n, c = s->c, hw = s->hw;
  dt_device dev = dt_tensor_device(gy);
  const dt_exec *ex = DT_TENSOR_EXEC(mean); /* f32: the formula below */
  dt_tensor *dx = NULL, *dgamma = NULL, *dbeta = NULL, *tmp = NULL, *coef[3] = {NULL};
  dt_tensor *x32 = NULL, *gy32 = NULL;
  double *h = calloc((size_t)(5 * c + 1), sizeof(double));
  float *f = malloc(sizeof(float) * (size_t)(3 * c + 1));
  dt_status st = h && f ? DT_OK : DT_ERROR(DT_ERR_OOM, "sync_batch_norm2d: no host memory");
  DT_CHECK_GOTO(st, st, fail);
  DT_CHECK_GOTO(dt_ops_empty_like(x, dev, &tmp), st, fail);
  /* this process's sum dy (dbeta) and sum dy (x - mean) invstd (dgamma):
   * the parameters' gradients, which DDP averages as any other; dx is the
   * formula over every process below, in f32 (the engine rounds it to a
   * 16-bit x's dtype) */
  DT_CHECK_GOTO(local_grads(x, gy, gamma, mean, invstd, n, c, hw, s->eps, NULL, &dgamma, &dbeta),
                st, fail);
  DT_CHECK_GOTO(dt_ops_empty_like(x, dev, &dx), st, fail);
  DT_CHECK_GOTO(dt_ops_widen(x, &x32), st, fail);
  DT_CHECK_GOTO(dt_ops_widen(gy, &gy32), st, fail);
  DT_CHECK_GOTO(dt_tensor_to_host(dbeta, f, sizeof(float) * (size_t)c), st, fail);
  DT_CHECK_GOTO(dt_tensor_to_host(dgamma, f + c, sizeof(float) * (size_t)c), st, fail);
  DT_CHECK_GOTO(dt_tensor_to_host(invstd, f + 2 * c, sizeof(float) * (size_t)c), st, fail);
  for (int64_t i = 0; i < c; i++) {
    h[i] = f[i];
    h[c + i] = f[2 * c + i] != 0.0f ? (double)f[c + i] / f[2 * c + i] : 0.0;
  }
  /* the sums over every process: dx = gamma invstd (dy - mean(dy) - (x -
   * mean) invstd^2 mean(dy (x - mean))), as dy A + (x - mean) B + C per
   * channel */
  DT_CHECK_GOTO(sum_across(&s->across, h, 2 * c, dev), st, fail);
  DT_CHECK_GOTO(dt_tensor_to_host(gamma, f, sizeof(float) * (size_t)c), st, fail);
  for (int64_t i = 0; i < c; i++) {
    double is = f[2 * c + i], a = f[i] * is;
    double b = -a * is * is * h[c + i] / s->count;
    h[2 * c + i] = a;
    h[3 * c + i] = b;
    h[4 * c + i] = -a * h[i] / s->count;
  }
  for (int k = 0; k < 3; k++)
    DT_CHECK_GOTO(channel_tensor(h + (2 + k) * c, c, dev, &coef[k]), st, fail);
  if (n * c * hw > 0) {
    DT_CHECK_GOTO(per_channel(ex, DT_BINARY_MUL, gy32, coef[0], dx, n, c, hw), st, fail);
    DT_CHECK_GOTO(per_channel(ex, DT_BINARY_SUB, x32, mean, tmp, n, c, hw), st, fail);
    DT_CHECK_GOTO(per_channel(ex, DT_BINARY_MUL, tmp, coef[1], tmp, n, c, hw), st, fail);
    DT_CHECK_GOTO(per_channel(ex, DT_BINARY_ADD, dx, tmp, dx, 1, n * c * hw, 1), st, fail);
    DT_CHECK_GOTO(per_channel(ex, DT_BINARY_ADD, dx, coef[2], dx, n, c, hw), st, fail);
  }
  hand_out_grads(node, s->has_gamma, s->has_beta, dx, dgamma, dbeta, grad_in);
  dx = dgamma = dbeta = NULL;
fail:
  DT_RELEASE_TENSORS(gy32, x32, coef[2], coef[1], coef[0], tmp, dbeta, dgamma, dx);
  free(f);
  free(h);
  return st;
}

dt_status dt_op_sync_batch_norm2d(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                                  dt_tensor *running_mean, dt_tensor *running_var, float momentum,
                                  float eps, const dt_sum_across *across, dt_tensor **out) {
  static const char *op = "dt_op_sync_batch_norm2d";
  if (!x || !out || !across || !across->sum)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument (x, out and across->sum are needed)",
                    op);
  /* as batch_norm2d (NORM): a 16-bit x read as it is (its f32 copy only
   * for the statistics' passes), y f32 or under autocast 16-bit */
  const dt_dtype ydt = dt_autocast_norm_dtype_for(op);
  /* running stats may be NULL; the count is checked over every process */
  int64_t n = 0, c = 0, hw = 0;
  DT_CHECK(check_batch_norm(op, (dt_tensor *[5]){x, gamma, beta, running_mean, running_var}, true,
                            false, &n, &c, &hw));
  dt_device dev = dt_tensor_device(x);
  dt_tensor *xc = NULL, *x32 = NULL, *gc = NULL, *bc = NULL, *y = NULL, *mean = NULL, *var = NULL,
            *invstd = NULL;
  dt_node *node = NULL;
  double *h = calloc((size_t)(2 * c + 1), sizeof(double)), count = 0.0;
  dt_status st = h ? DT_OK : DT_ERROR(DT_ERR_OOM, "%s: no host memory", op);
  DT_CHECK_GOTO(st, st, fail);
  DT_CHECK_GOTO(dt_ops_contiguous(x, &xc), st, fail);
  {
    dt_no_grad_begin(); /* the statistics' copy: not on the tape */
    st = dt_ops_widen(xc, &x32);
    dt_no_grad_end();
    DT_CHECK_GOTO(st, st, fail);
  }
  DT_CHECK_GOTO(affine_params(gamma, beta, c, dev, &gc, &bc), st, fail);
  /* pass 1: the sums and the count over every process -> the mean */
  if (n * hw > 0)
    DT_CHECK_GOTO(channel_sums(x32, c, h), st, fail);
  h[c] = (double)(n * hw);
  DT_CHECK_GOTO(sum_across(across, h, c + 1, dev), st, fail);
  count = h[c];
  if (count <= 1.0 && c > 0) {
    st = DT_ERROR(DT_ERR_SHAPE,
                  "%s: %g values per channel over every process: training needs more than one "
                  "to estimate the variance",
                  op, count);
    goto fail;
  }
  for (int64_t i = 0; i < c; i++)
    h[i] /= count;
  DT_CHECK_GOTO(channel_tensor(h, c, dev, &mean), st, fail);
  /* pass 2: the squared deviations -> the (biased) variance */
  if (n * hw > 0)
    DT_CHECK_GOTO(channel_squares(x32, mean, n, c, hw, h + c), st, fail);
  dt_tensor_release(x32);
  x32 = NULL;
  DT_CHECK_GOTO(sum_across(across, h + c, c, dev), st, fail);
  for (int64_t i = 0; i < c; i++)
    h[c + i] /= count;
  DT_CHECK_GOTO(channel_tensor(h + c, c, dev, &var), st, fail);
  /* y from those statistics: the kernel's eval mode with them as the
   * running ones (it saves mean and 1 / sqrt(var + eps)) */
  DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), ydt, dev, &y), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(&c, 1, DT_DTYPE_F32, dev, &invstd), st, fail);
  if (n * c * hw > 0)
    DT_CHECK_GOTO(
        dt_kernel_batch_norm2d_forward(DT_TENSOR_EXEC(xc), dt_tensor_data(xc), dt_tensor_data(y),
                                       ydt, DT_F32(gc), DT_F32(bc), DT_F32(mean), DT_F32(var), NULL,
                                       DT_F32(invstd), n, c, hw, false, momentum, eps),
        st, fail);
  else if (c > 0)
    DT_CHECK_GOTO(dt_kernel_fill(DT_TENSOR_EXEC(x), DT_F32(invstd), 1.0f, c), st, fail);
  if (running_mean) { /* the unbiased variance, as PyTorch */
    DT_CHECK_GOTO(update_running(running_mean, h, c, momentum), st, fail);
    for (int64_t i = 0; i < c; i++)
      h[c + i] *= count / (count - 1.0);
    DT_CHECK_GOTO(update_running(running_var, h + c, c, momentum), st, fail);
  }
  dt_tensor *ins[3] = {x, gamma, beta};
  DT_CHECK_GOTO(dt_ops_maybe_record(op, sync_batch_norm_backward, ins, 3, y, &node), st, fail);
  dt_tensor *saved[4] = {xc, gc, mean, invstd};
  dt_ops_save_for_backward(node, saved, 4);
  DT_OPS_SAVE_PARAMS(node, sync_batch_norm_saved,
                     {n, c, hw, gamma != NULL, beta != NULL, eps, count, *across});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(invstd, var, mean, y, bc, gc, x32, xc);
  free(h);
  return st;
}

/* ---- layer norm ---- */

/* saved: 0 x (rows, cols; f32 or 16-bit), 1 gamma (or ones), 2 mean (rows;
 * NULL for RMS norm), 3 rstd (rows) */
typedef struct layer_norm_saved {
  int64_t rows, cols;
  bool has_gamma, has_beta, rms;
} layer_norm_saved;

static dt_status layer_norm_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0], *gamma = node->saved[1], *mean = node->saved[2],
            *rstd = node->saved[3];
  const layer_norm_saved *s = DT_NODE_PARAMS(node, layer_norm_saved);
  int64_t rows = s->rows, cols = s->cols;
  int has_gamma = s->has_gamma, has_beta = s->has_beta;
  dt_device dev = dt_tensor_device(gy);
  dt_tensor *dx = NULL, *dgamma = NULL, *dbeta = NULL;
  dt_status st;
  DT_CHECK(dt_ops_empty_like(x, dev, &dx));
  /* dgamma, dbeta are accumulated by the kernel */
  DT_CHECK_GOTO(dt_tensor_zeros(&cols, 1, DT_DTYPE_F32, dev, &dgamma), st, fail);
  DT_CHECK_GOTO(dt_tensor_zeros(&cols, 1, DT_DTYPE_F32, dev, &dbeta), st, fail);
  /* x and gy may be 16-bit (the kernel reads them as they are); dx is f32,
   * which the engine rounds to x's dtype */
  const dt_dtype gdt = dt_tensor_dtype(gy);
  if (rows * cols > 0 && s->rms)
    DT_CHECK_GOTO(
        dt_kernel_rms_norm_backward(DT_TENSOR_EXEC(x), DT_F32(x), DT_F32(gamma), DT_F32(rstd),
                                    DT_F32(gy), gdt, DT_F32(dx), DT_F32(dgamma), rows, cols),
        st, fail);
  else if (rows * cols > 0)
    DT_CHECK_GOTO(dt_kernel_layer_norm_backward(
                      DT_TENSOR_EXEC(x), DT_F32(x), DT_F32(gamma), DT_F32(mean), DT_F32(rstd),
                      DT_F32(gy), gdt, DT_F32(dx), DT_F32(dgamma), DT_F32(dbeta), rows, cols),
                  st, fail);
  hand_out_grads(node, has_gamma, has_beta, dx, dgamma, dbeta, grad_in);
  return DT_OK;
fail:
  DT_RELEASE_TENSORS(dbeta, dgamma, dx);
  return st;
}

/* The sum of dt_op_residual_layer_norm: its gradient goes to x and residual
 * as is. */
static dt_status residual_add_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  for (int i = 0; i < 2; i++)
    if (node->needs_grad[i])
      grad_in[i] = dt_tensor_retain(g);
  return DT_OK;
}

/* layer_norm(x), or with a residual sum = x + residual and layer_norm(sum)
 * in one kernel: a node for the sum (x, residual) and one for the norm
 * (sum, gamma, beta), which is layer_norm's; rms: rms_norm(x) with the
 * weight `gamma` (no residual, no beta). x and residual may be 16-bit
 * (autocast's NORM ops): the kernels read them as they are and compute in
 * f32, sum is f32, and the 16-bit x is what the backward keeps (no widened
 * copy); y is f32, or under autocast the 16-bit dtype (rounded once from
 * f32: the cast its GEMM would make); gamma and beta are f32. */
static dt_status layer_norm_op(const char *op, dt_tensor *x, dt_tensor *residual, dt_tensor *gamma,
                               dt_tensor *beta, float eps, bool rms, dt_tensor **sum_out,
                               dt_tensor **out) {
  if (!x || !out || (residual && !sum_out))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  dt_tensor *ins[4] = {x, residual, gamma, beta};
  DT_CHECK(dt_ops_check_float_inputs(op, ins, 4)); /* gamma, beta: f32 (check_vec) */
  int nd = dt_tensor_ndim(x);
  char b[128], br[128];
  if (nd < 1)
    return DT_ERROR(DT_ERR_SHAPE, "%s: input %s is 0-dim: expected (..., D)", op,
                    dt_shape_format(dt_tensor_shape(x), nd, b, sizeof b));
  if (residual &&
      (dt_tensor_ndim(residual) != nd ||
       memcmp(dt_tensor_shape(residual), dt_tensor_shape(x), (size_t)nd * sizeof(int64_t)) != 0))
    return DT_ERROR(
        DT_ERR_SHAPE,
        "%s: x %s and residual %s differ in shape: the residual add does not "
        "broadcast",
        op, dt_shape_format(dt_tensor_shape(x), nd, b, sizeof b),
        dt_shape_format(dt_tensor_shape(residual), dt_tensor_ndim(residual), br, sizeof br));
  int64_t cols = dt_tensor_shape(x)[nd - 1];
  int64_t rows = dt_shape_numel(dt_tensor_shape(x), nd - 1);
  DT_CHECK(check_vec(op, rms ? "weight" : "gamma", gamma, cols));
  DT_CHECK(check_vec(op, "beta", beta, cols));

  dt_device dev = dt_tensor_device(x);
  const dt_exec ex = dt_tensor_exec(x);
  dt_tensor *xc = NULL, *rc = NULL, *sum = NULL, *gc = NULL, *bc = NULL, *y = NULL, *mean = NULL,
            *rstd = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(x, &xc), st, fail);
  if (residual) {
    DT_CHECK_GOTO(dt_ops_contiguous(residual, &rc), st, fail);
    DT_CHECK_GOTO(dt_ops_empty_like(x, dev, &sum), st, fail);
  }
  DT_CHECK_GOTO(affine_params(gamma, beta, cols, dev, &gc, &bc), st, fail);
  const dt_dtype ydt = dt_autocast_norm_dtype_for(op);
  DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(x), nd, ydt, dev, &y), st, fail);
  if (!rms)
    DT_CHECK_GOTO(dt_tensor_empty(&rows, 1, DT_DTYPE_F32, dev, &mean), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(&rows, 1, DT_DTYPE_F32, dev, &rstd), st, fail);
  /* x (+ residual -> sum) (rows, cols) -> y (rows, cols), mean, rstd (rows) */
  if (rows * cols > 0 && rms)
    DT_CHECK_GOTO(dt_kernel_rms_norm_forward(&ex, DT_F32(xc), DT_F32(gc), DT_F32(y), ydt,
                                             DT_F32(rstd), rows, cols, eps),
                  st, fail);
  else if (rows * cols > 0 && residual)
    DT_CHECK_GOTO(dt_kernel_residual_layer_norm_forward(
                      &ex, DT_F32(xc), DT_F32(rc), dt_tensor_dtype(rc), DT_F32(gc), DT_F32(bc),
                      DT_F32(sum), DT_F32(y), ydt, DT_F32(mean), DT_F32(rstd), rows, cols, eps),
                  st, fail);
  else if (rows * cols > 0)
    DT_CHECK_GOTO(dt_kernel_layer_norm_forward(&ex, DT_F32(xc), DT_F32(gc), DT_F32(bc), DT_F32(y),
                                               ydt, DT_F32(mean), DT_F32(rstd), rows, cols, eps),
                  st, fail);
  if (residual)
    DT_CHECK_GOTO(dt_ops_maybe_record(op, residual_add_backward, ins, 2, sum, &node), st, fail);
  /* the norm's input: x, or the sum */
  dt_tensor *norm_ins[3] = {residual ? sum : x, gamma, beta};
  DT_CHECK_GOTO(dt_ops_maybe_record(op, layer_norm_backward, norm_ins, 3, y, &node), st, fail);
  dt_tensor *saved[4] = {residual ? sum : xc, gc, mean, rstd};
  dt_ops_save_for_backward(node, saved, 4);
  DT_OPS_SAVE_PARAMS(node, layer_norm_saved, {rows, cols, gamma != NULL, beta != NULL, rms});
  if (residual)
    dt_ops_take(&sum, sum_out);
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, rstd, mean, bc, gc, sum, rc, xc);
  return st;
}

dt_status dt_op_layer_norm(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps,
                           dt_tensor **out) {
  return layer_norm_op("dt_op_layer_norm", x, NULL, gamma, beta, eps, false, NULL, out);
}

dt_status dt_op_rms_norm(dt_tensor *x, dt_tensor *weight, float eps, dt_tensor **out) {
  return layer_norm_op("dt_op_rms_norm", x, NULL, weight, NULL, eps, true, NULL, out);
}

dt_status dt_op_residual_layer_norm(dt_tensor *x, dt_tensor *residual, dt_tensor *gamma,
                                    dt_tensor *beta, float eps, dt_tensor **sum_out,
                                    dt_tensor **norm_out) {
  if (!residual)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dt_op_residual_layer_norm: NULL argument");
  return layer_norm_op("dt_op_residual_layer_norm", x, residual, gamma, beta, eps, false, sum_out,
                       norm_out);
}
