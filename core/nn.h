/* Built-in modules. Initialisation follows PyTorch's defaults, drawn from a
 * seeded generator: Linear and Conv2d weights Kaiming-uniform with a=sqrt(5)
 * (bound 1/sqrt(fan_in)), biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)); norm
 * layers weight 1, bias 0; Embedding N(0, 1).
 * Modules are created on the CPU; use dt_module_to() to move them.
 * `gen` must not be NULL (DT_ERR_INVALID_ARG): seed it with
 * dt_generator_init(); weights are drawn before biases, row-major.
 * Parameter names as PyTorch: "weight", "bias".
 */
#ifndef DT_CORE_NN_H
#define DT_CORE_NN_H

#include "core/module.h"
#include "core/ops.h"
#include "core/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

dt_status dt_nn_linear(int in_features, int out_features, int bias, dt_generator *gen,
                       dt_module **out);
dt_status dt_nn_conv2d(int in_channels, int out_channels, int kernel, int stride, int padding,
                       int bias, dt_generator *gen, dt_module **out);
/* Parameters weight, bias (C); buffers running_mean (C), running_var (C),
 * num_batches_tracked (i64, rank 0). Uses batch statistics and updates the
 * running ones in training mode, running statistics in eval mode. PyTorch
 * defaults: eps 1e-5, momentum 0.1. */
dt_status dt_nn_batch_norm2d(int channels, float eps, float momentum, dt_module **out);
/* SyncBatchNorm (PyTorch's convert_sync_batchnorm): every BatchNorm2d at or
 * below m takes its training-mode statistics over all the processes of
 * `across` (copied; its user must outlive the modules' backward passes),
 * dt_op_sync_batch_norm2d; eval mode still uses the running statistics.
 * across NULL turns it off. Returns the number of BatchNorm2d modules. */
int dt_nn_batch_norm_set_sync(dt_module *m, const dt_sum_across *across);
dt_status dt_nn_layer_norm(int features, float eps, dt_module **out);
/* RMSNorm (torch.nn.RMSNorm, Llama's): parameter weight (features), no
 * bias; eps > 0. */
dt_status dt_nn_rms_norm(int features, float eps, dt_module **out);
dt_status dt_nn_embedding(int num_embeddings, int dim, dt_generator *gen, dt_module **out);
dt_status dt_nn_relu(dt_module **out);
dt_status dt_nn_gelu(dt_module **out);
dt_status dt_nn_tanh(dt_module **out);
dt_status dt_nn_flatten(dt_module **out);
/* stride 0 means stride = kernel (PyTorch's default); padding <= kernel/2. */
dt_status dt_nn_max_pool2d(int kernel, int stride, int padding, dt_module **out);
dt_status dt_nn_avg_pool2d(int kernel, int stride, int padding, dt_module **out);
/* Channels-last (PyTorch's model.to(memory_format=torch.channels_last)):
 * every Conv2d, BatchNorm2d, MaxPool2d and AvgPool2d at or below m takes
 * and returns (N, H, W, C) activations with `on` (dt_op_conv2d_nhwc, the
 * pools' _nhwc ops, batch norm over the (N*H*W, C) view), NCHW again with
 * !on. The parameters, buffers and checkpoints are the same either way; a
 * model's own code must permute its input (and take means over dims 1
 * and 2 rather than 2 and 3). Forward hooks of those modules see the
 * channels-last tensors. Returns the number of modules set. */
int dt_nn_set_channels_last(dt_module *m, bool on);
/* Dropout draws from its own generator seeded with `seed`; identity in eval
 * mode. p in [0, 1). */
dt_status dt_nn_dropout(float p, uint64_t seed, dt_module **out);
/* Children named "0", "1", ... in order; takes ownership of the modules
 * (on failure too). Forward calls every child in registration order through
 * dt_module_call (so child hooks fire), whatever its name: children added
 * with dt_module_add_child ("features", "classifier") take part, as in
 * nn.Sequential(OrderedDict). n = 0 gives an empty Sequential (identity). */
dt_status dt_nn_sequential(dt_module *const *mods, int n, dt_module **out);
/* Appends `mod` as child "<number of children>"; takes ownership of mod (on
 * failure too), except when mod already has a parent or is seq or one of
 * its ancestors: DT_ERR_INVALID_ARG, and mod stays with its owner. seq must
 * come from dt_nn_sequential. */
dt_status dt_nn_sequential_append(dt_module *seq, dt_module *mod);

#ifdef __cplusplus
}
#endif
#endif
