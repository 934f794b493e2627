/* GPT-2 (see models/models.h): the blocks, the model, its configurations. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn.h"
#include "core/ops.h"
#include "models/models.h"

#define GPT2_VOCAB 50257
#define GPT2_PADDED_VOCAB 50304
#define GPT2_LN_EPS 1e-5f
#define GPT2_INIT_STD 0.02f

static const struct {
  const char *name;
  dt_gpt2_config cfg;
} gpt2_configs[] = {
#define DT_GPT2_SIZE(name, n_layer, n_head, n_embd, context, parameters) \
  {name, {n_layer, n_head, n_embd, context, GPT2_VOCAB, GPT2_PADDED_VOCAB}},
#include "models/gpt2_sizes.def"
#undef DT_GPT2_SIZE
};
#define NUM_GPT2_CONFIGS ((int)(sizeof gpt2_configs / sizeof gpt2_configs[0]))

dt_status dt_gpt2_config_named(const char *name, dt_gpt2_config *out) {
  char names[128] = "";
  size_t used = 0;
  for (int i = 0; i < NUM_GPT2_CONFIGS; i++) {
    if (name && !strcmp(name, gpt2_configs[i].name)) {
      *out = gpt2_configs[i].cfg;
      return DT_OK;
    }
    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                             gpt2_configs[i].name);
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unknown GPT-2 configuration \"%s\": known are %s",
                  name ? name : "(null)", names);
}

int64_t dt_gpt2_parameter_count(const dt_gpt2_config *c) {
  int64_t C = c->n_embd, L = c->n_layer;
  int64_t per_layer = 2 * C               /* ln_1 */
                      + 3 * C * C + 3 * C /* attn.c_attn */
                      + C * C + C         /* attn.c_proj */
                      + 2 * C             /* ln_2 */
                      + 4 * C * C + 4 * C /* mlp.c_fc */
                      + 4 * C * C + C;    /* mlp.c_proj */
  return (int64_t)c->padded_vocab * C + (int64_t)c->block_size * C + L * per_layer + 2 * C;
}

double dt_gpt2_flops_per_token(const dt_gpt2_config *c, int64_t T) {
  return 6.0 * (double)dt_gpt2_parameter_count(c) +
         12.0 * (double)c->n_layer * (double)T * (double)c->n_embd;
}

/* ---- the modules ---- */
/* The two sub-layers of a block share a shape: a projection in, the
 * attention (n_head > 0) or the GELU (n_head 0), a projection out:
 *   attn: c_attn (C -> 3C), causal attention, c_proj (C -> C)
 *   mlp:  c_fc (C -> 4C), gelu, c_proj (4C -> C) */
typedef struct sublayer_impl {
  int n_head;
  dt_module *in, *out; /* children */
} sublayer_impl;

/* x (B, T, C) -> (B, T, C) */
static dt_status sublayer_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  sublayer_impl *l = dt_module_impl(m);
  dt_tensor *h = NULL, *y = NULL;
  dt_status st = dt_module_call(l->in, x, &h);
  if (st == DT_OK)
    st = l->n_head > 0 ? dt_op_causal_attention(h, l->n_head, &y) : dt_op_gelu(h, &y);
  if (st == DT_OK)
    st = dt_module_call(l->out, y, out);
  dt_tensor_release(y);
  dt_tensor_release(h);
  return st;
}

typedef struct block_impl {
  dt_module *ln_1, *attn, *ln_2, *mlp;
} block_impl;

/* x (B, T, C) -> x1 = x + attn(ln_1(x)), then x1 + mlp(ln_2(x1)); the
 * residual add and ln_2 are one fused op (llm.c's), so ln_2's own hooks do
 * not fire. */
static dt_status block_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  block_impl *b = dt_module_impl(m);
  dt_status st = DT_OK;
  dt_tensor *h = NULL, *a = NULL, *x1 = NULL, *h2 = NULL, *f = NULL;
  dt_tensor *gamma = dt_module_parameter(b->ln_2, "weight");
  dt_tensor *beta = dt_module_parameter(b->ln_2, "bias");
  DT_CHECK_GOTO(dt_module_call(b->ln_1, x, &h), st, done);
  DT_CHECK_GOTO(dt_module_call(b->attn, h, &a), st, done);
  DT_CHECK_GOTO(dt_op_residual_layer_norm(x, a, gamma, beta, GPT2_LN_EPS, &x1, &h2), st, done);
  DT_CHECK_GOTO(dt_module_call(b->mlp, h2, &f), st, done);
  DT_CHECK_GOTO(dt_op_add(x1, f, out), st, done);
done:
  dt_tensor_release(f);
  dt_tensor_release(h2);
  dt_tensor_release(x1);
  dt_tensor_release(a);
  dt_tensor_release(h);
  return st;
}

typedef struct gpt2_impl {
  dt_gpt2_config cfg;
  dt_module *wte, *wpe, *h, *ln_f; /* children */
} gpt2_impl;

/* tokens (B, T) -> logits (B, T, padded_vocab) */
static dt_status gpt2_forward(dt_module *m, dt_tensor *idx, dt_tensor **out) {
  gpt2_impl *g = dt_module_impl(m);
  if (dt_tensor_ndim(idx) != 2 || dt_tensor_dim(idx, 1) < 1 ||
      dt_tensor_dim(idx, 1) > g->cfg.block_size) {
    char d[96];
    return DT_ERROR(DT_ERR_SHAPE,
                    "GPT-2 takes token ids (B, T) with 1 <= T <= %d (its context), got %s",
                    g->cfg.block_size, dt_tensor_describe(idx, d, sizeof d));
  }
  int64_t T = dt_tensor_dim(idx, 1);
  dt_status st = DT_OK;
  dt_tensor *wte = dt_module_parameter(g->wte, "weight");
  dt_tensor *tok = NULL, *pos = NULL, *x = NULL, *y = NULL, *z = NULL;
  DT_CHECK_GOTO(dt_module_call(g->wte, idx, &tok), st, done);
  DT_CHECK_GOTO(dt_tensor_slice(dt_module_parameter(g->wpe, "weight"), 0, T, &pos), st, done);
  DT_CHECK_GOTO(dt_op_add(tok, pos, &x), st, done); /* (B, T, C) + (T, C) */
  DT_CHECK_GOTO(dt_module_call(g->h, x, &y), st, done);
  DT_CHECK_GOTO(dt_module_call(g->ln_f, y, &z), st, done);
  DT_CHECK_GOTO(dt_op_linear(z, wte, NULL, out), st, done); /* the tied head */
done:
  dt_tensor_release(z);
  dt_tensor_release(y);
  dt_tensor_release(x);
  dt_tensor_release(pos);
  dt_tensor_release(tok);
  return st;
}

static const dt_module_vtable attn_vtable = {"CausalSelfAttention", sublayer_forward, free};
static const dt_module_vtable mlp_vtable = {"MLP", sublayer_forward, free};
static const dt_module_vtable block_vtable = {"Block", block_forward, free};
static const dt_module_vtable gpt2_vtable = {"GPT2", gpt2_forward, free};

/* A module over impl (freed here when creation fails). */
static dt_status create_module(const dt_module_vtable *vt, void *impl, dt_module **out) {
  if (!impl)
    return DT_ERROR(DT_ERR_OOM, "no host memory for a %s module", vt->type_name);
  dt_status st = dt_module_create(vt, impl, out);
  if (st != DT_OK)
    free(impl);
  return st;
}

/* Adds `child` (built with status `built`: nothing to add unless DT_OK)
 * to m as `name`; *slot borrows it. The child is destroyed when it cannot
 * be added. */
static dt_status attach(dt_module *m, const char *name, dt_status built, dt_module **made,
                        dt_module **slot) {
  DT_CHECK(built);
  dt_module *child = *made; /* read after the builder ran (argument order) */
  dt_status st = dt_module_add_child(m, name, child);
  if (st != DT_OK) {
    dt_module_destroy(child);
    return st;
  }
  *slot = child;
  return DT_OK;
}

static dt_status linear(int in, int out, dt_generator *gen, dt_module **m) {
  return dt_nn_linear(in, out, 1, gen, m);
}

/* The end of a builder: a failed module is destroyed, *out cleared. */
static dt_status finish(dt_status st, dt_module **out) {
  if (st != DT_OK) {
    dt_module_destroy(*out);
    *out = NULL;
  }
  return st;
}

/* attn (n_head > 0: in_name c_attn, width 3C) or mlp (n_head 0: c_fc, 4C). */
static dt_status build_sublayer(const dt_gpt2_config *c, int n_head, dt_generator *gen,
                                dt_module **out) {
  sublayer_impl *l = calloc(1, sizeof *l);
  DT_CHECK(create_module(n_head > 0 ? &attn_vtable : &mlp_vtable, l, out));
  l->n_head = n_head;
  int C = c->n_embd, width = n_head > 0 ? 3 * C : 4 * C, out_in = n_head > 0 ? C : 4 * C;
  dt_module *m = NULL;
  dt_status st =
      attach(*out, n_head > 0 ? "c_attn" : "c_fc", linear(C, width, gen, &m), &m, &l->in);
  if (st == DT_OK)
    st = attach(*out, "c_proj", linear(out_in, C, gen, &m), &m, &l->out);
  return finish(st, out);
}

static dt_status build_block(const dt_gpt2_config *c, dt_generator *gen, dt_module **out) {
  block_impl *b = calloc(1, sizeof *b);
  DT_CHECK(create_module(&block_vtable, b, out));
  dt_module *m = NULL;
  dt_status st = attach(*out, "ln_1", dt_nn_layer_norm(c->n_embd, GPT2_LN_EPS, &m), &m, &b->ln_1);
  if (st == DT_OK)
    st = attach(*out, "attn", build_sublayer(c, c->n_head, gen, &m), &m, &b->attn);
  if (st == DT_OK)
    st = attach(*out, "ln_2", dt_nn_layer_norm(c->n_embd, GPT2_LN_EPS, &m), &m, &b->ln_2);
  if (st == DT_OK)
    st = attach(*out, "mlp", build_sublayer(c, 0, gen, &m), &m, &b->mlp);
  return finish(st, out);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* GPT-2's initialisation over every parameter, in registration order,
 * replacing the modules' PyTorch defaults. */
static dt_status init_gpt2(dt_module *model, const dt_gpt2_config *c, uint64_t seed) {
  dt_generator gen;
  dt_generator_init(&gen, seed);
  float proj_std = GPT2_INIT_STD / sqrtf(2.0f * (float)c->n_layer);
  for (int i = 0; i < dt_module_num_parameters(model); i++) {
    const char *name = NULL;
    dt_tensor *p = dt_module_parameter_at(model, i, &name);
    int64_t n = dt_tensor_numel(p);
    float *v = malloc((size_t)n * sizeof *v);
    if (!v)
      return DT_ERROR(DT_ERR_OOM, "no host memory to initialise %s (%lld floats)", name,
                      (long long)n);
    bool layer_norm = strstr(name, "ln_") != NULL;
    bool proj = ends_with(name, "c_proj.weight");
    for (int64_t j = 0; j < n; j++) {
      if (ends_with(name, ".bias"))
        v[j] = 0.0f;
      else if (layer_norm)
        v[j] = 1.0f;
      else
        v[j] = (proj ? proj_std : GPT2_INIT_STD) * dt_generator_normal(&gen);
    }
    dt_tensor *host = NULL;
    dt_status st = dt_tensor_from_host(v, dt_tensor_shape(p), dt_tensor_ndim(p), DT_DTYPE_F32,
                                       dt_tensor_device(p), &host);
    free(v);
    if (st == DT_OK)
      st = dt_tensor_copy_(p, host);
    dt_tensor_release(host);
    DT_CHECK(st);
  }
  return DT_OK;
}

static dt_status check_config(const dt_gpt2_config *c) {
  if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->block_size < 1 || c->vocab < 1 ||
      c->padded_vocab < c->vocab || c->n_embd % c->n_head != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "GPT-2 with %d layers, %d heads, C %d, context %d, vocabulary %d padded to "
                    "%d: sizes must be positive, C a multiple of the heads and the padded "
                    "vocabulary at least the vocabulary",
                    c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab, c->padded_vocab);
  return DT_OK;
}

static dt_status build_gpt2(dt_module *model, gpt2_impl *g, dt_generator *gen) {
  const dt_gpt2_config *c = &g->cfg;
  dt_module *m = NULL;
  DT_CHECK(attach(model, "wte", dt_nn_embedding(c->padded_vocab, c->n_embd, gen, &m), &m, &g->wte));
  DT_CHECK(attach(model, "wpe", dt_nn_embedding(c->block_size, c->n_embd, gen, &m), &m, &g->wpe));
  DT_CHECK(attach(model, "h", dt_nn_sequential(NULL, 0, &m), &m, &g->h));
  for (int i = 0; i < c->n_layer; i++) {
    DT_CHECK(build_block(c, gen, &m));
    DT_CHECK(dt_nn_sequential_append(g->h, m)); /* h.<i> */
  }
  return attach(model, "ln_f", dt_nn_layer_norm(c->n_embd, GPT2_LN_EPS, &m), &m, &g->ln_f);
}

dt_status dt_model_gpt2(const dt_gpt2_config *cfg, uint64_t seed, dt_module **out) {
  if (!cfg || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "GPT-2: cfg and out must not be NULL");
  DT_CHECK(check_config(cfg));
  gpt2_impl *g = calloc(1, sizeof *g);
  dt_module *model = NULL;
  DT_CHECK(create_module(&gpt2_vtable, g, &model));
  g->cfg = *cfg;
  /* The builders' own draws are replaced by init_gpt2. */
  dt_generator gen;
  dt_generator_init(&gen, seed);
  dt_status st = build_gpt2(model, g, &gen);
  if (st == DT_OK)
    st = init_gpt2(model, cfg, seed);
  if (st != DT_OK) {
    dt_module_destroy(model);
    return dt_error_wrap(st, "building GPT-2 (%d layers, C %d)", cfg->n_layer, cfg->n_embd);
  }
  *out = model;
  return DT_OK;
}
