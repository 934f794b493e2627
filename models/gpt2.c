/* GPT-2 (see models/models.h): the blocks, the model, its configurations. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn.h"
#include "core/ops.h"
#include "models/builder_internal.h"
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
  int i = 0;
  DT_CHECK(dt_models_find_config("GPT-2", name, gpt2_configs, sizeof gpt2_configs[0],
                                 NUM_GPT2_CONFIGS, &i));
  *out = gpt2_configs[i].cfg;
  return DT_OK;
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

/* Whether calling m is just its forward: no hooks, no recomputation. */
static int plain_call(const dt_module *m) {
  return dt_module_num_forward_hooks(m) == 0 && !dt_module_recompute(m);
}

/* x (B, T, C) -> (B, T, C). The MLP is one op (dt_op_gelu_mlp: under
 * 16-bit autocast the GELU goes into the GEMMs' epilogues on a GPU) when
 * its projections run no hooks of their own, else the three calls. */
static dt_status sublayer_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  sublayer_impl *l = dt_module_impl(m);
  if (l->n_head == 0 && plain_call(l->in) && plain_call(l->out))
    return dt_op_gelu_mlp(x, dt_module_parameter(l->in, "weight"),
                          dt_module_parameter(l->in, "bias"), dt_module_parameter(l->out, "weight"),
                          dt_module_parameter(l->out, "bias"), out);
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
  DT_CHECK(dt_models_check_tokens("GPT-2", idx, g->cfg.block_size));
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

static dt_status linear(int in, int out, dt_generator *gen, dt_module **m) {
  return dt_nn_linear(in, out, 1, gen, m);
}

/* attn (n_head > 0: in_name c_attn, width 3C) or mlp (n_head 0: c_fc, 4C). */
static dt_status build_sublayer(const dt_gpt2_config *c, int n_head, dt_generator *gen,
                                dt_module **out) {
  sublayer_impl *l = calloc(1, sizeof *l);
  DT_CHECK(dt_models_create_module(n_head > 0 ? &attn_vtable : &mlp_vtable, l, out));
  l->n_head = n_head;
  int C = c->n_embd, width = n_head > 0 ? 3 * C : 4 * C, out_in = n_head > 0 ? C : 4 * C;
  dt_module *m = NULL;
  dt_status st =
      dt_models_attach(*out, n_head > 0 ? "c_attn" : "c_fc", linear(C, width, gen, &m), &m, &l->in);
  if (st == DT_OK)
    st = dt_models_attach(*out, "c_proj", linear(out_in, C, gen, &m), &m, &l->out);
  return dt_models_finish(st, out);
}

static dt_status build_block(const dt_gpt2_config *c, dt_generator *gen, dt_module **out) {
  block_impl *b = calloc(1, sizeof *b);
  DT_CHECK(dt_models_create_module(&block_vtable, b, out));
  dt_module *m = NULL;
  dt_status st =
      dt_models_attach(*out, "ln_1", dt_nn_layer_norm(c->n_embd, GPT2_LN_EPS, &m), &m, &b->ln_1);
  if (st == DT_OK)
    st = dt_models_attach(*out, "attn", build_sublayer(c, c->n_head, gen, &m), &m, &b->attn);
  if (st == DT_OK)
    st = dt_models_attach(*out, "ln_2", dt_nn_layer_norm(c->n_embd, GPT2_LN_EPS, &m), &m, &b->ln_2);
  if (st == DT_OK)
    st = dt_models_attach(*out, "mlp", build_sublayer(c, 0, gen, &m), &m, &b->mlp);
  return dt_models_finish(st, out);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* GPT-2's initialisation (dt_models_init_normal): biases 0, layer norm
 * gains 1, weights N(0, 0.02), the residual projections (c_proj)
 * N(0, 0.02 / sqrt(2 L)). */
static float gpt2_std(const char *name, const void *ctx, float *fill) {
  const dt_gpt2_config *c = ctx;
  const bool bias = ends_with(name, ".bias"), norm = strstr(name, "ln_") != NULL;
  *fill = norm && !bias ? 1.0f : 0.0f;
  if (bias || norm)
    return 0.0f;
  return ends_with(name, "c_proj.weight") ? GPT2_INIT_STD / sqrtf(2.0f * (float)c->n_layer)
                                          : GPT2_INIT_STD;
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

static dt_status build_gpt2(dt_module *model, void *impl, dt_generator *gen) {
  gpt2_impl *g = impl;
  const dt_gpt2_config *c = &g->cfg;
  dt_module *m = NULL;
  DT_CHECK(dt_models_attach(model, "wte", dt_nn_embedding(c->padded_vocab, c->n_embd, gen, &m), &m,
                            &g->wte));
  DT_CHECK(dt_models_attach(model, "wpe", dt_nn_embedding(c->block_size, c->n_embd, gen, &m), &m,
                            &g->wpe));
  DT_CHECK(dt_models_attach(model, "h", dt_nn_sequential(NULL, 0, &m), &m, &g->h));
  for (int i = 0; i < c->n_layer; i++) {
    DT_CHECK(build_block(c, gen, &m));
    DT_CHECK(dt_nn_sequential_append(g->h, m)); /* h.<i> */
  }
  return dt_models_attach(model, "ln_f", dt_nn_layer_norm(c->n_embd, GPT2_LN_EPS, &m), &m,
                          &g->ln_f);
}

dt_status dt_model_gpt2(const dt_gpt2_config *cfg, uint64_t seed, dt_module **out) {
  if (!cfg || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "GPT-2: cfg and out must not be NULL");
  DT_CHECK(check_config(cfg));
  gpt2_impl *g = calloc(1, sizeof *g);
  if (g)
    g->cfg = *cfg;
  return dt_models_build(&gpt2_vtable, g, build_gpt2, seed, gpt2_std, cfg, "GPT-2", cfg->n_layer,
                         cfg->n_embd, out);
}
