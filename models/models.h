/* Reference models, each built from core modules (core/nn.h) as a
 * dt_module whose forward maps a batch of inputs to logits.
 *
 * Parameters are drawn from a generator seeded with `seed` in registration
 * order, so the same seed gives the same model on every rank. Models are
 * created on the CPU; move them with dt_module_to().
 */
#ifndef DT_MODELS_MODELS_H
#define DT_MODELS_MODELS_H

#include <stdint.h>

#include "core/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Multi-layer perceptron: Flatten, then Linear(sizes[i], sizes[i+1]) for
 * each consecutive pair, with ReLU between (not after the last). Input
 * (N, ...) with prod(...) == sizes[0] (so (N,1,28,28) works for sizes[0] =
 * 784) -> logits (N, sizes[n_sizes-1]). A Sequential: children "0"
 * (Flatten), "1" (Linear), "2" (ReLU), "3" (Linear), ...; parameter names
 * "1.weight", "1.bias", "3.weight", ...
 * The classic MNIST MLP is sizes {784, 512, 512, 10} (669,706 parameters).
 * n_sizes >= 2, every size > 0; DT_ERR_INVALID_ARG otherwise. */
dt_status dt_model_mlp(const int *sizes, int n_sizes, uint64_t seed, dt_module **out);

/* LeNet-5 (modern variant: ReLU and max-pooling) for (N,1,28,28) inputs:
 *   features:   Conv2d(1,6,5,pad 2) ReLU MaxPool2d(2) Conv2d(6,16,5) ReLU MaxPool2d(2)
 *   classifier: Flatten Linear(400,120) ReLU Linear(120,84) ReLU Linear(84,num_classes)
 * -> logits (N, num_classes). Children "features" and "classifier"
 * (Sequentials), so parameters are "features.0.weight", "features.0.bias",
 * "features.3.weight", ..., "classifier.1.weight", ..., "classifier.5.bias".
 * 61,706 parameters for 10 classes. */
dt_status dt_model_lenet5(int num_classes, uint64_t seed, dt_module **out);

/* ResNet (He et al. 2016) in torchvision's layout (torchvision.models.
 * resnet18/34/50, v1.5: a Bottleneck's stride on its 3x3 convolution), so
 * weights map one to one with load_state_dict(strict=True):
 *   conv1.weight, bn1.{weight,bias,running_mean,running_var,
 *   num_batches_tracked}, layer<s>.<i>.conv<j>.weight, layer<s>.<i>.bn<j>.*,
 *   layer<s>.<i>.downsample.{0.weight,1.*} (the first block of a stage that
 *   changes the shape), fc.{weight,bias}
 * (BatchNorm's running statistics are buffers). The stem is conv1 7x7
 * stride 2, BatchNorm, ReLU and a 3x3 stride-2 max-pool; with small_stem,
 * a 3x3 stride-1 convolution and no max-pool (for 28-64 px images; the
 * names stay). Four stages of 64, 128, 256, 512 planes (x4 for the
 * Bottleneck), stride 2 from the second, then the mean over H and W
 * (AdaptiveAvgPool2d(1)) and fc. Initialisation as torchvision's:
 * convolutions N(0, 2 / (out_channels k^2)) (kaiming_normal_, fan_out,
 * relu), BatchNorm weight 1 bias 0, fc nn.Linear's default;
 * zero_init_residual sets the last BatchNorm weight of each block to 0. */
typedef struct dt_resnet_config {
  int bottleneck;  /* 0: BasicBlock (resnet18, 34), 1: Bottleneck (resnet50) */
  int blocks[4];   /* blocks per stage: {2,2,2,2}, {3,4,6,3} */
  int in_channels; /* 3 for RGB, 1 for grey */
  int num_classes;
  int small_stem;
  int zero_init_residual;
  /* Channels-last: the model permutes its NCHW input once to (N, H, W, C)
   * and runs every convolution, batch norm and pooling channels-last
   * (dt_nn_set_channels_last; cuDNN's NHWC kernels on a GPU). The same
   * parameters, names and checkpoints, and the same logits to rounding. */
  int channels_last;
} dt_resnet_config;

/* images (N, in_channels, H, W) -> logits (N, num_classes); another
 * number of channels is DT_ERR_SHAPE. */
dt_status dt_model_resnet(const dt_resnet_config *cfg, uint64_t seed, dt_module **out);
/* 11,689,512 for resnet18, 25,557,032 for resnet50 (3 channels, 1000
 * classes, torchvision's counts). */
int64_t dt_resnet_parameter_count(const dt_resnet_config *cfg);
/* Multiply-adds of one forward pass over an image of in_channels x height
 * x width: every convolution (the downsamples' too) and fc; BatchNorm,
 * ReLU, pooling and the residual adds count none (the convention of
 * torchvision's published figures: 1.814 G for resnet18 at 224x224x3,
 * 3.664 G resnet34, 4.089 G resnet50). *stem (may be NULL): conv1's share. */
double dt_resnet_forward_macs(const dt_resnet_config *cfg, int64_t height, int64_t width,
                              double *stem);
/* resnet18, resnet34 or resnet50, 3 input channels and 1000 classes as
 * torchvision's; DT_ERR_INVALID_ARG naming the known ones. */
dt_status dt_resnet_config_named(const char *name, dt_resnet_config *out);

/* GPT-2 (Radford et al. 2019; the layout of HF's GPT2LMHeadModel and
 * llm.c): token and learned positional embeddings, n_layer pre-LN blocks
 *   x = x + attn.c_proj(causal_attention(attn.c_attn(ln_1(x))))
 *   x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
 * a final LayerNorm, and the LM head tied to the token embedding (wte is
 * one parameter used twice). The embedding has padded_vocab rows (50304 for
 * GPT-2: a multiple of 128, as llm.c) of which the first vocab (50257) are
 * tokens:
 *   tokens (B, T) i32/i64, T <= block_size -> logits (B, T, padded_vocab)
 * and the loss (dt_op_classifier_loss over the first vocab columns) and the
 * sampler ignore the padding's columns, so its rows get no gradient. The
 * attention is dt_op_causal_attention, and each block's second residual
 * add and ln_2 are dt_op_residual_layer_norm (llm.c's fusions).
 * Parameter names and order as HF/llm.c, so checkpoints map:
 *   wte.weight (padded_vocab, C), wpe.weight (block_size, C),
 *   h.<i>.ln_1.{weight,bias}, h.<i>.attn.c_attn.{weight (3C, C), bias},
 *   h.<i>.attn.c_proj.{weight (C, C), bias}, h.<i>.ln_2.{weight,bias},
 *   h.<i>.mlp.c_fc.{weight (4C, C), bias}, h.<i>.mlp.c_proj.{weight (C, 4C), bias},
 *   ln_f.{weight,bias}
 * (Linear weights are (out, in), as llm.c and PyTorch's nn.Linear; HF's
 * Conv1D stores their transposes.) Initialisation as GPT-2: weights and
 * embeddings N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj)
 * N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1 (eps 1e-5). */
typedef struct dt_gpt2_config {
  int n_layer;
  int n_head;
  int n_embd;       /* C; a multiple of n_head */
  int block_size;   /* the longest context the positional embedding holds */
  int vocab;        /* real tokens: 50257 */
  int padded_vocab; /* rows of wte, >= vocab: 50304 */
} dt_gpt2_config;

/* The named configurations of models/gpt2_sizes.def (gpt2-tiny, gpt2
 * (124M), gpt2-medium, gpt2-large, gpt2-xl), context block_size, GPT-2's
 * vocabulary. An unknown name is DT_ERR_INVALID_ARG listing them. */
dt_status dt_gpt2_config_named(const char *name, dt_gpt2_config *out);

/* Any positive sizes with n_embd % n_head == 0 and vocab <= padded_vocab
 * (DT_ERR_INVALID_ARG otherwise). */
dt_status dt_model_gpt2(const dt_gpt2_config *cfg, uint64_t seed, dt_module **out);

/* Parameter count of the configuration (padded embedding included): 124,475,904 for gpt2. */
int64_t dt_gpt2_parameter_count(const dt_gpt2_config *cfg);

/* Training FLOPs per token at context T, as PaLM (appendix B) and nanoGPT
 * count them: 6 N + 12 n_layer T C, where N is the parameter count
 * (dt_gpt2_parameter_count, as llm.c's N: the tied head counted once, as it
 * is one matmul's weight) and 12 L T C the attention's two matmuls (scores
 * and values, 2 T C multiply-adds each per layer and token, forward and
 * backward: x 3) over the full T x T square, not halved for the mask. */
double dt_gpt2_flops_per_token(const dt_gpt2_config *cfg, int64_t T);

/* The Llama family (Hugging Face's LlamaForCausalLM): token embedding,
 * n_layer blocks of x + o_proj(attention(rope(q, k), v)) and x +
 * down_proj(silu(gate_proj(x)) * up_proj(x)), each after an RMS norm,
 * grouped-query attention (n_kv_head key and value heads), no biases, a
 * final RMS norm and the head (the embedding when tied). Parameters named
 * as Hugging Face's without its "model." prefix (GPT-2's are named as
 * Hugging Face's without "transformer."): embed_tokens.weight,
 * layers.<i>.input_layernorm.weight, layers.<i>.self_attn.{q,k,v,o}_proj.
 * weight, layers.<i>.post_attention_layernorm.weight,
 * layers.<i>.mlp.{gate,up,down}_proj.weight, norm.weight and, untied,
 * lm_head.weight. */
typedef struct dt_llama_config {
  int n_layer;
  int n_head;
  int n_kv_head;    /* divides n_head */
  int n_embd;       /* C = n_head * head size (even) */
  int ffn;          /* the MLP's width */
  int block_size;   /* the longest context */
  int vocab;        /* real tokens: 50257 */
  int padded_vocab; /* rows of embed_tokens, >= vocab: 50304 */
  float rope_theta;
  float norm_eps;
  int tied; /* the head is embed_tokens.weight */
} dt_llama_config;

/* The named configurations of models/llama_sizes.def (llama-tiny,
 * llama-135m, llama-1b); DT_ERR_INVALID_ARG naming the known ones. */
dt_status dt_llama_config_named(const char *name, dt_llama_config *out);

/* Initialisation as Hugging Face's: every weight N(0, 0.02^2), the norms'
 * weights 1. tokens (B, T) i32/i64, 1 <= T <= block_size -> logits (B, T,
 * padded_vocab). */
dt_status dt_model_llama(const dt_llama_config *cfg, uint64_t seed, dt_module **out);

int64_t dt_llama_parameter_count(const dt_llama_config *cfg);

/* Training FLOPs per token at context T: 6 N + 12 L T C, as GPT-2's. */
double dt_llama_flops_per_token(const dt_llama_config *cfg, int64_t T);

/* Activation recomputation per transformer or residual block
 * (dt_module_set_recompute on each of h.<i> of a GPT-2, layers.<i> of a
 * Llama, layer<s>.<i> of a ResNet): a block's activations are recomputed
 * in backward instead of kept, for the same gradients bit for bit; a
 * ResNet's BatchNorm running statistics move once per forward, as without
 * (the re-run leaves them alone). Any other model is DT_ERR_INVALID_ARG. */
dt_status dt_model_set_recompute(dt_module *model, int on);

/* Builds the model of task `name` (models/tasks.h) with its default
 * configuration:
 *   "mlp"   MLP 784-512-512-10
 *   "lenet" LeNet-5, 10 classes
 * An unknown name is DT_ERR_INVALID_ARG with the list of known names. */
dt_status dt_model_create(const char *name, uint64_t seed, dt_module **out);

/* The i-th registered model name (i from 0), NULL past the last: the list
 * the command line offers for --model. */
const char *dt_model_name(int i);

#ifdef __cplusplus
}
#endif
#endif
