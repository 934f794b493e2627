/* ResNet-18/34/50 (see models/models.h) in torchvision's layout. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn.h"
#include "core/ops.h"
#include "models/builder_internal.h"
#include "models/models.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f
#define MAX_STAGE_BLOCKS 8

static const struct {
  const char *name;
  int bottleneck;
  int blocks[4];
} resnet_configs[] = {
    {"resnet18", 0, {2, 2, 2, 2}},
    {"resnet34", 0, {3, 4, 6, 3}},
    {"resnet50", 1, {3, 4, 6, 3}},
};
#define NUM_RESNET_CONFIGS ((int)(sizeof resnet_configs / sizeof resnet_configs[0]))

dt_status dt_resnet_config_named(const char *name, dt_resnet_config *out) {
  int i = 0;
  DT_CHECK(dt_models_find_config("ResNet", name, resnet_configs, sizeof resnet_configs[0],
                                 NUM_RESNET_CONFIGS, &i));
  dt_resnet_config c = {0};
  c.bottleneck = resnet_configs[i].bottleneck;
  memcpy(c.blocks, resnet_configs[i].blocks, sizeof c.blocks);
  c.in_channels = 3;
  c.num_classes = 1000;
  *out = c;
  return DT_OK;
}

/* ---- the blocks ---- */
/* BasicBlock (2 convolutions) or Bottleneck (3): conv<i>, bn<i> and a ReLU
 * after each but the last; the identity (or downsample(x)) added before the
 * last ReLU. */
typedef struct block_impl {
  int n;
  dt_module *conv[3], *bn[3], *downsample; /* children; downsample may be NULL */
} block_impl;

/* x (N, C, H, W) -> (N, C', H / stride, W / stride) */
static dt_status block_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  block_impl *b = dt_module_impl(m);
  dt_status st = DT_OK;
  dt_tensor *h = x, *identity = NULL, *sum = NULL;
  dt_tensor_retain(x);
  for (int i = 0; i < b->n && st == DT_OK; i++) {
    dt_tensor *c = NULL, *n = NULL;
    st = dt_module_call(b->conv[i], h, &c);
    if (st == DT_OK)
      st = dt_module_call(b->bn[i], c, &n);
    dt_tensor_release(c);
    dt_tensor_release(h);
    h = NULL;
    if (st == DT_OK && i + 1 < b->n) {
      st = dt_op_relu(n, &h);
      dt_tensor_release(n);
    } else {
      h = n;
    }
  }
  if (st == DT_OK && b->downsample != NULL)
    st = dt_module_call(b->downsample, x, &identity);
  if (st == DT_OK)
    st = dt_op_add(h, identity ? identity : x, &sum);
  if (st == DT_OK)
    st = dt_op_relu(sum, out);
  dt_tensor_release(sum);
  dt_tensor_release(identity);
  dt_tensor_release(h);
  return st;
}

static dt_status conv(int in, int out, int kernel, int stride, dt_generator *gen, dt_module **m) {
  return dt_nn_conv2d(in, out, kernel, stride, kernel / 2, 0, gen, m);
}

static dt_status batch_norm(int channels, dt_module **m) {
  return dt_nn_batch_norm2d(channels, BN_EPS, BN_MOMENTUM, m);
}

/* downsample: Sequential(conv 1x1 with the stride, BatchNorm) */
static dt_status build_downsample(int in, int out, int stride, dt_generator *gen, dt_module **m) {
  dt_module *mods[2] = {0};
  dt_status st = conv(in, out, 1, stride, gen, &mods[0]);
  if (st == DT_OK)
    st = batch_norm(out, &mods[1]);
  if (st != DT_OK) {
    dt_module_destroy(mods[0]);
    return st;
  }
  return dt_nn_sequential(mods, 2, m);
}

static const dt_module_vtable basic_vtable = {"BasicBlock", block_forward, free};
static const dt_module_vtable bottleneck_vtable = {"Bottleneck", block_forward, free};

/* A block of `planes` from `in` channels; torchvision v1.5: the stride on
 * the 3x3 convolution (the first of a BasicBlock, the second of a
 * Bottleneck). */
static dt_status build_block(int bottleneck, int in, int planes, int stride, dt_generator *gen,
                             dt_module **out) {
  static const char *conv_names[3] = {"conv1", "conv2", "conv3"};
  static const char *bn_names[3] = {"bn1", "bn2", "bn3"};
  block_impl *b = calloc(1, sizeof *b);
  DT_CHECK(dt_models_create_module(bottleneck ? &bottleneck_vtable : &basic_vtable, b, out));
  int expansion = bottleneck ? 4 : 1;
  int widths[4] = {in, planes, planes, planes * expansion}; /* Bottleneck: in -> w -> w -> 4w */
  int kernels[3] = {1, 3, 1}, strides[3] = {1, stride, 1};
  if (!bottleneck) { /* in -> planes -> planes, both 3x3 */
    kernels[0] = 3;
    strides[0] = stride;
    strides[1] = 1;
  }
  b->n = bottleneck ? 3 : 2;
  dt_status st = DT_OK;
  dt_module *m = NULL;
  for (int i = 0; i < b->n && st == DT_OK; i++) {
    st = dt_models_attach(*out, conv_names[i],
                          conv(widths[i], widths[i + 1], kernels[i], strides[i], gen, &m), &m,
                          &b->conv[i]);
    if (st == DT_OK)
      st = dt_models_attach(*out, bn_names[i], batch_norm(widths[i + 1], &m), &m, &b->bn[i]);
  }
  if (st == DT_OK && (stride != 1 || in != planes * expansion))
    st = dt_models_attach(*out, "downsample",
                          build_downsample(in, planes * expansion, stride, gen, &m), &m,
                          &b->downsample);
  return dt_models_finish(st, out);
}

/* ---- the model ---- */
typedef struct resnet_impl {
  dt_resnet_config cfg;
  dt_module *self;
  dt_module *conv1, *bn1, *maxpool, *layer[4], *fc; /* children; maxpool NULL: small stem */
} resnet_impl;

/* x (N, in_channels, H, W) -> logits (N, num_classes) */
static dt_status resnet_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  resnet_impl *r = dt_module_impl(m);
  if (dt_tensor_ndim(x) != 4 || dt_tensor_dim(x, 1) != r->cfg.in_channels) {
    char d[96];
    return DT_ERROR(DT_ERR_SHAPE, "ResNet takes images (N, %d, H, W), got %s", r->cfg.in_channels,
                    dt_tensor_describe(x, d, sizeof d));
  }
  const bool cl = r->cfg.channels_last;
  static const int spatial[2] = {2, 3}, spatial_cl[2] = {1, 2};
  static const int to_nhwc[4] = {0, 2, 3, 1};
  dt_status st = DT_OK;
  dt_tensor *a = NULL, *b = NULL;
  if (cl) { /* (N, C, H, W) -> (N, H, W, C), once */
    DT_CHECK_GOTO(dt_tensor_permute(x, to_nhwc, &b), st, done);
    DT_CHECK_GOTO(dt_tensor_contiguous(b, &a), st, done);
    dt_tensor_release(b);
    b = a;
    a = NULL;
  }
  DT_CHECK_GOTO(dt_module_call(r->conv1, cl ? b : x, &a), st, done);
  dt_tensor_release(b);
  b = NULL;
  DT_CHECK_GOTO(dt_module_call(r->bn1, a, &b), st, done);
  dt_tensor_release(a);
  a = NULL;
  DT_CHECK_GOTO(dt_op_relu(b, &a), st, done);
  dt_module *const stages[5] = {r->maxpool, r->layer[0], r->layer[1], r->layer[2], r->layer[3]};
  for (int i = 0; i < 5; i++) {
    if (stages[i] == NULL)
      continue;
    dt_tensor_release(b);
    b = a;
    a = NULL;
    DT_CHECK_GOTO(dt_module_call(stages[i], b, &a), st, done);
  }
  dt_tensor_release(b);
  b = NULL;
  /* AdaptiveAvgPool2d(1) and flatten: the mean over H and W, (N, C) */
  DT_CHECK_GOTO(dt_op_mean(a, cl ? spatial_cl : spatial, 2, false, &b), st, done);
  DT_CHECK_GOTO(dt_module_call(r->fc, b, out), st, done);
done:
  dt_tensor_release(b);
  dt_tensor_release(a);
  return st;
}

static const dt_module_vtable resnet_vtable = {"ResNet", resnet_forward, free};

static dt_status build_resnet(dt_module *model, void *impl, dt_generator *gen) {
  resnet_impl *r = impl;
  const dt_resnet_config *c = &r->cfg;
  r->self = model;
  dt_module *m = NULL;
  int stem_kernel = c->small_stem ? 3 : 7, stem_stride = c->small_stem ? 1 : 2;
  DT_CHECK(dt_models_attach(
      model, "conv1", conv(c->in_channels, 64, stem_kernel, stem_stride, gen, &m), &m, &r->conv1));
  DT_CHECK(dt_models_attach(model, "bn1", batch_norm(64, &m), &m, &r->bn1));
  if (!c->small_stem)
    DT_CHECK(dt_models_attach(model, "maxpool", dt_nn_max_pool2d(3, 2, 1, &m), &m, &r->maxpool));
  static const char *layer_names[4] = {"layer1", "layer2", "layer3", "layer4"};
  int expansion = c->bottleneck ? 4 : 1, in = 64;
  for (int s = 0; s < 4; s++) {
    int planes = 64 << s;
    DT_CHECK(
        dt_models_attach(model, layer_names[s], dt_nn_sequential(NULL, 0, &m), &m, &r->layer[s]));
    for (int i = 0; i < c->blocks[s]; i++) {
      DT_CHECK(build_block(c->bottleneck, in, planes, i == 0 && s > 0 ? 2 : 1, gen, &m));
      DT_CHECK(dt_nn_sequential_append(r->layer[s], m)); /* layer<s+1>.<i> */
      in = planes * expansion;
    }
  }
  DT_CHECK(dt_models_attach(model, "fc", dt_nn_linear(in, c->num_classes, 1, gen, &m), &m, &r->fc));
  if (c->channels_last)
    dt_nn_set_channels_last(model, true);
  return DT_OK;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* The parameter `name` (dotted) of the model. */
static dt_tensor *find_parameter(dt_module *m, const char *name) {
  for (int i = 0; i < dt_module_num_parameters(m); i++) {
    const char *n = NULL;
    dt_tensor *p = dt_module_parameter_at(m, i, &n);
    if (!strcmp(n, name))
      return p;
  }
  return NULL;
}

/* torchvision's initialisation: convolutions kaiming_normal_(mode
 * "fan_out", relu): N(0, 2 / (out_channels k k)); BatchNorm weight 1 (0
 * for the last of each block with zero_init_residual), bias 0; fc as
 * nn.Linear's default (kept: a negative std). */
static float resnet_std(const char *name, const void *ctx, float *fill) {
  const resnet_impl *r = ctx;
  *fill = 0.0f;
  if (!strncmp(name, "fc.", 3))
    return -1.0f;
  dt_tensor *p = find_parameter(r->self, name);
  if (p != NULL && dt_tensor_ndim(p) == 4) {
    const int64_t *s = dt_tensor_shape(p);
    return sqrtf(2.0f / (float)(s[0] * s[2] * s[3]));
  }
  if (ends_with(name, ".bias"))
    return 0.0f;
  bool last_bn = ends_with(name, r->cfg.bottleneck ? ".bn3.weight" : ".bn2.weight");
  *fill = r->cfg.zero_init_residual && last_bn ? 0.0f : 1.0f;
  return 0.0f;
}

dt_status dt_model_resnet(const dt_resnet_config *cfg, uint64_t seed, dt_module **out) {
  if (!cfg || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "ResNet: cfg and out must not be NULL");
  bool ok = cfg->in_channels > 0 && cfg->num_classes > 0;
  for (int s = 0; s < 4; s++)
    ok = ok && cfg->blocks[s] >= 1 && cfg->blocks[s] <= MAX_STAGE_BLOCKS;
  if (!ok)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "ResNet with %d input channels, %d classes, blocks %d %d %d %d: channels "
                    "and classes must be positive, each stage 1 to %d blocks",
                    cfg->in_channels, cfg->num_classes, cfg->blocks[0], cfg->blocks[1],
                    cfg->blocks[2], cfg->blocks[3], MAX_STAGE_BLOCKS);
  resnet_impl *r = calloc(1, sizeof *r);
  if (r)
    r->cfg = *cfg;
  int depth = 2 + (cfg->bottleneck ? 3 : 2) *
                      (cfg->blocks[0] + cfg->blocks[1] + cfg->blocks[2] + cfg->blocks[3]);
  return dt_models_build(&resnet_vtable, r, build_resnet, seed, resnet_std, r, "ResNet", depth, 64,
                         out);
}

/* A convolution's output side: kernel k, stride s, padding k / 2. */
static int64_t conv_side(int64_t in, int k, int s) { return (in + 2 * (k / 2) - k) / s + 1; }

double dt_resnet_forward_macs(const dt_resnet_config *cfg, int64_t height, int64_t width,
                              double *stem) {
  /* walked as the builder lays the model out */
  int k = cfg->small_stem ? 3 : 7, s = cfg->small_stem ? 1 : 2;
  int64_t h = conv_side(height, k, s), w = conv_side(width, k, s);
  double macs = (double)(h * w) * 64 * cfg->in_channels * k * k;
  if (stem)
    *stem = macs;
  if (!cfg->small_stem) { /* max-pool 3x3, stride 2, padding 1 */
    h = conv_side(h, 3, 2);
    w = conv_side(w, 3, 2);
  }
  int expansion = cfg->bottleneck ? 4 : 1, in = 64;
  for (int g = 0; g < 4; g++) {
    double p = 64 << g, o = p * expansion;
    for (int i = 0; i < cfg->blocks[g]; i++) {
      int stride = i == 0 && g > 0 ? 2 : 1;
      double hw_in = (double)(h * w);
      h = conv_side(h, 3, stride);
      w = conv_side(w, 3, stride);
      double hw = (double)(h * w);
      macs += cfg->bottleneck ? hw_in * in * p + hw * 9 * p * p + hw * p * o
                              : hw * 9 * in * p + hw * 9 * p * p;
      if (stride != 1 || in != o)
        macs += hw * in * o; /* downsample: 1x1 with the stride */
      in = (int)o;
    }
  }
  return macs + (double)in * cfg->num_classes;
}

int64_t dt_resnet_parameter_count(const dt_resnet_config *cfg) {
  /* counted from the layout, as the builder makes it */
  int64_t n = (int64_t)64 * cfg->in_channels * (cfg->small_stem ? 9 : 49) + 2 * 64;
  int expansion = cfg->bottleneck ? 4 : 1, in = 64;
  for (int s = 0; s < 4; s++) {
    int64_t p = 64 << s, o = p * expansion;
    for (int i = 0; i < cfg->blocks[s]; i++) {
      n += cfg->bottleneck ? in * p + 2 * p + 9 * p * p + 2 * p + p * o + 2 * o
                           : 9 * in * p + 2 * p + 9 * p * p + 2 * p;
      if (i == 0 && (s > 0 || in != o))
        n += in * o + 2 * o;
      in = (int)o;
    }
  }
  return n + (int64_t)in * cfg->num_classes + cfg->num_classes;
}
