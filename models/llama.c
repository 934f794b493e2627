/* The Llama family (see models/models.h): the blocks, the model, its
 * configurations (models/llama_sizes.def). The ops are core's: rms_norm,
 * rope (Hugging Face's rotate_half), repeat_kv (grouped-query attention),
 * causal_attention, swiglu. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn.h"
#include "core/ops.h"
#include "models/builder_internal.h"
#include "models/models.h"

/* GPT-2's tokens and rows (a multiple of 128), as the GPT-2 models */
enum { LLAMA_VOCAB = 50257, LLAMA_PADDED_VOCAB = 50304 };

/* The sizes of models/llama_sizes.def: their names, and their
 * configurations (RMS norm eps 1e-5, tied heads) */
static const char *const llama_names[] = {
#define DT_LLAMA_SIZE(name, ...) name,
#include "models/llama_sizes.def"
#undef DT_LLAMA_SIZE
};
static const dt_llama_config llama_sizes[] = {
#define DT_LLAMA_SIZE(name, L, H, KV, C, F, T, theta, parameters) \
  {L, H, KV, C, F, T, LLAMA_VOCAB, LLAMA_PADDED_VOCAB, theta, 1e-5f, 1},
#include "models/llama_sizes.def"
#undef DT_LLAMA_SIZE
};

dt_status dt_llama_config_named(const char *name, dt_llama_config *out) {
  int i = 0;
  DT_CHECK(dt_models_find_config("Llama", name, llama_names, sizeof llama_names[0],
                                 (int)(sizeof llama_names / sizeof llama_names[0]), &i));
  *out = llama_sizes[i];
  return DT_OK;
}

int64_t dt_llama_parameter_count(const dt_llama_config *c) {
  const int64_t C = c->n_embd, kv = (int64_t)c->n_kv_head * (C / c->n_head);
  const int64_t per_layer = 2 * C        /* the two norms */
                            + 2 * C * C  /* q_proj, o_proj */
                            + 2 * C * kv /* k_proj, v_proj */
                            + 3 * C * c->ffn /* gate_proj, up_proj, down_proj */;
  return (c->tied ? 1 : 2) * (int64_t)c->padded_vocab * C + c->n_layer * per_layer + C;
}

double dt_llama_flops_per_token(const dt_llama_config *c, int64_t T) {
  return 6.0 * (double)dt_llama_parameter_count(c) +
         12.0 * (double)c->n_layer * (double)T * (double)c->n_embd;
}

/* ---- the modules ---- */

/* The end of a forward: releases its n intermediate tensors; returns st. */
static dt_status release(dt_status st, dt_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++)
    dt_tensor_release(ts[i]);
  return st;
}

/* self_attn: x (B, T, C) -> o_proj(attention) (B, T, C); q, k and v side
 * by side (B, T, (H + 2 Hkv) hd), q and k rotated, the KV heads repeated */
typedef struct attn_impl {
  int n_head, n_kv_head, head_dim;
  float theta;
  dt_module *q, *k, *v, *o; /* children */
} attn_impl;

static dt_status attn_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  attn_impl *a = dt_module_impl(m);
  dt_tensor *qkv[3] = {NULL, NULL, NULL}, *joined = NULL, *rot = NULL, *rep = NULL, *y = NULL;
  dt_module *proj[3] = {a->q, a->k, a->v};
  dt_status st = DT_OK;
  for (int i = 0; i < 3 && st == DT_OK; i++)
    st = dt_module_call(proj[i], x, &qkv[i]);
  if (st == DT_OK)
    st = dt_op_concat(qkv, 3, -1, &joined);
  if (st == DT_OK)
    st = dt_op_rope(joined, a->head_dim, a->n_head + a->n_kv_head, a->theta, &rot);
  if (st == DT_OK)
    st = dt_op_repeat_kv(rot, a->n_head, a->n_kv_head, &rep);
  if (st == DT_OK)
    st = dt_op_causal_attention(rep, a->n_head, &y);
  if (st == DT_OK)
    st = dt_module_call(a->o, y, out);
  return release(st, (dt_tensor *[]){y, rep, rot, joined, qkv[2], qkv[1], qkv[0]}, 7);
}
static const dt_module_vtable attn_vtable = {"LlamaAttention", attn_forward, free};

/* mlp: x (B, T, C) -> down_proj(silu(gate_proj(x)) * up_proj(x)) */
typedef struct mlp_impl {
  dt_module *gate, *up, *down; /* children */
} mlp_impl;

static dt_status mlp_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  mlp_impl *p = dt_module_impl(m);
  dt_tensor *gu[2] = {NULL, NULL}, *joined = NULL, *s = NULL;
  dt_status st = dt_module_call(p->gate, x, &gu[0]);
  if (st == DT_OK)
    st = dt_module_call(p->up, x, &gu[1]);
  if (st == DT_OK)
    st = dt_op_concat(gu, 2, -1, &joined);
  if (st == DT_OK)
    st = dt_op_swiglu(joined, &s);
  if (st == DT_OK)
    st = dt_module_call(p->down, s, out);
  return release(st, (dt_tensor *[]){s, joined, gu[1], gu[0]}, 4);
}
static const dt_module_vtable mlp_vtable = {"LlamaMLP", mlp_forward, free};

typedef struct block_impl {
  dt_module *input_layernorm, *self_attn, *post_attention_layernorm, *mlp;
} block_impl;

/* x (B, T, C) -> x1 = x + self_attn(norm(x)), then x1 + mlp(norm(x1)) */
static dt_status block_forward(dt_module *m, dt_tensor *x, dt_tensor **out) {
  block_impl *b = dt_module_impl(m);
  dt_tensor *h = NULL, *a = NULL, *x1 = NULL, *h2 = NULL, *f = NULL;
  dt_status st = dt_module_call(b->input_layernorm, x, &h);
  if (st == DT_OK)
    st = dt_module_call(b->self_attn, h, &a);
  if (st == DT_OK)
    st = dt_op_add(x, a, &x1);
  if (st == DT_OK)
    st = dt_module_call(b->post_attention_layernorm, x1, &h2);
  if (st == DT_OK)
    st = dt_module_call(b->mlp, h2, &f);
  if (st == DT_OK)
    st = dt_op_add(x1, f, out);
  return release(st, (dt_tensor *[]){f, h2, x1, a, h}, 5);
}
static const dt_module_vtable block_vtable = {"LlamaDecoderLayer", block_forward, free};

typedef struct llama_impl {
  dt_llama_config cfg;
  dt_module *embed_tokens, *layers, *norm, *lm_head; /* children; lm_head NULL when tied */
} llama_impl;

/* tokens (B, T) -> logits (B, T, padded_vocab) */
static dt_status llama_forward(dt_module *m, dt_tensor *idx, dt_tensor **out) {
  llama_impl *g = dt_module_impl(m);
  DT_CHECK(dt_models_check_tokens("Llama", idx, g->cfg.block_size));
  dt_tensor *x = NULL, *y = NULL, *z = NULL;
  dt_status st = dt_module_call(g->embed_tokens, idx, &x);
  if (st == DT_OK)
    st = dt_module_call(g->layers, x, &y);
  if (st == DT_OK)
    st = dt_module_call(g->norm, y, &z);
  if (st == DT_OK && g->lm_head)
    st = dt_module_call(g->lm_head, z, out);
  else if (st == DT_OK) /* the tied head */
    st = dt_op_linear(z, dt_module_parameter(g->embed_tokens, "weight"), NULL, out);
  return release(st, (dt_tensor *[]){z, y, x}, 3);
}
static const dt_module_vtable llama_vtable = {"LlamaForCausalLM", llama_forward, free};

/* The n children names[i] = Linear(ins[i] -> outs[i]) (no bias) of *out,
 * borrowed by *slots[i]; the end of a builder (dt_models_finish). */
static dt_status attach_linears(dt_module **out, int n, const char *const *names, const int *ins,
                                const int *outs, dt_module **const *slots, dt_generator *gen) {
  dt_status st = DT_OK;
  for (int i = 0; i < n && st == DT_OK; i++) {
    dt_module *m = NULL;
    st = dt_models_attach(*out, names[i], dt_nn_linear(ins[i], outs[i], 0, gen, &m), &m, slots[i]);
  }
  return dt_models_finish(st, out);
}

static dt_status build_attn(const dt_llama_config *c, dt_generator *gen, dt_module **out) {
  attn_impl *a = calloc(1, sizeof *a);
  DT_CHECK(dt_models_create_module(&attn_vtable, a, out));
  const int C = c->n_embd, hd = C / c->n_head, kv = c->n_kv_head * hd;
  *a = (attn_impl){c->n_head, c->n_kv_head, hd, c->rope_theta, NULL, NULL, NULL, NULL};
  const char *names[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const int ins[4] = {C, C, C, C}, outs[4] = {C, kv, kv, C};
  dt_module **const slots[4] = {&a->q, &a->k, &a->v, &a->o};
  return attach_linears(out, 4, names, ins, outs, slots, gen);
}

static dt_status build_mlp(const dt_llama_config *c, dt_generator *gen, dt_module **out) {
  mlp_impl *p = calloc(1, sizeof *p);
  DT_CHECK(dt_models_create_module(&mlp_vtable, p, out));
  const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
  const int ins[3] = {c->n_embd, c->n_embd, c->ffn}, outs[3] = {c->ffn, c->ffn, c->n_embd};
  dt_module **const slots[3] = {&p->gate, &p->up, &p->down};
  return attach_linears(out, 3, names, ins, outs, slots, gen);
}

/* input_layernorm, self_attn, post_attention_layernorm, mlp */
static dt_status build_block(const dt_llama_config *c, dt_generator *gen, dt_module **out) {
  block_impl *b = calloc(1, sizeof *b);
  DT_CHECK(dt_models_create_module(&block_vtable, b, out));
  const char *names[4] = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"};
  dt_module **const slots[4] = {&b->input_layernorm, &b->self_attn, &b->post_attention_layernorm,
                                &b->mlp};
  dt_status st = DT_OK;
  for (int i = 0; i < 4 && st == DT_OK; i++) {
    dt_module *m = NULL;
    dt_status built = i % 2 == 0 ? dt_nn_rms_norm(c->n_embd, c->norm_eps, &m)
                      : i == 1   ? build_attn(c, gen, &m)
                                 : build_mlp(c, gen, &m);
    st = dt_models_attach(*out, names[i], built, &m, slots[i]);
  }
  return dt_models_finish(st, out);
}

/* Hugging Face's initialisation: weights N(0, 0.02), the norms' weights 1. */
static float llama_std(const char *name, const void *ctx, float *fill) {
  (void)ctx;
  *fill = 1.0f;
  return strstr(name, "layernorm") || !strcmp(name, "norm.weight") ? 0.0f : 0.02f;
}

static dt_status check_config(const dt_llama_config *c, dt_module **out) {
  if (!c || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "Llama: cfg and out must not be NULL");
  if (c->n_layer < 1 || c->n_head < 1 || c->n_kv_head < 1 || c->n_embd < 1 || c->ffn < 1 ||
      c->block_size < 1 || c->vocab < 1 || c->padded_vocab < c->vocab ||
      c->n_embd % c->n_head != 0 || (c->n_embd / c->n_head) % 2 != 0 ||
      c->n_head % c->n_kv_head != 0 || !(c->rope_theta > 0.0f) || !(c->norm_eps > 0.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "Llama with %d layers, %d heads (%d KV heads), C %d, FFN %d, context %d, "
                    "vocabulary %d padded to %d, theta %g, eps %g: sizes must be positive, C a "
                    "multiple of the heads with an even head size, the KV heads a divisor of "
                    "the heads, the padded vocabulary at least the vocabulary, theta and eps > 0",
                    c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->ffn, c->block_size, c->vocab,
                    c->padded_vocab, (double)c->rope_theta, (double)c->norm_eps);
  return DT_OK;
}

static dt_status build_llama(dt_module *model, void *impl, dt_generator *gen) {
  llama_impl *g = impl;
  const dt_llama_config *c = &g->cfg;
  dt_module *m = NULL;
  DT_CHECK(dt_models_attach(model, "embed_tokens",
                            dt_nn_embedding(c->padded_vocab, c->n_embd, gen, &m), &m,
                            &g->embed_tokens));
  DT_CHECK(dt_models_attach(model, "layers", dt_nn_sequential(NULL, 0, &m), &m, &g->layers));
  for (int i = 0; i < c->n_layer; i++) {
    DT_CHECK(build_block(c, gen, &m));
    DT_CHECK(dt_nn_sequential_append(g->layers, m)); /* layers.<i> */
  }
  DT_CHECK(
      dt_models_attach(model, "norm", dt_nn_rms_norm(c->n_embd, c->norm_eps, &m), &m, &g->norm));
  if (!c->tied)
    DT_CHECK(dt_models_attach(
        model, "lm_head", dt_nn_linear(c->n_embd, c->padded_vocab, 0, gen, &m), &m, &g->lm_head));
  return DT_OK;
}

dt_status dt_model_llama(const dt_llama_config *cfg, uint64_t seed, dt_module **out) {
  DT_CHECK(check_config(cfg, out));
  llama_impl *g = calloc(1, sizeof *g);
  if (g)
    g->cfg = *cfg;
  return dt_models_build(&llama_vtable, g, build_llama, seed, llama_std, NULL, "Llama",
                         cfg->n_layer, cfg->n_embd, out);
}
