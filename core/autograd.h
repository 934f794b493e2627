/* Reverse-mode automatic differentiation over an op-level tape.
 *
 * Each differentiable op records a node (its backward function and the
 * tensors it saved) when grad mode is on and one of its inputs requires
 * grad. dt_backward() runs the nodes reachable from the loss in reverse
 * creation order, accumulating (+=) into each leaf's .grad, and then frees
 * the graph (PyTorch's retain_graph=False).
 *
 * Grad-ready hooks: a leaf's hook fires once per backward pass, as soon as
 * every node that consumes the leaf has contributed its gradient. The DDP
 * reducer is built on them.
 */
#ifndef DT_CORE_AUTOGRAD_H
#define DT_CORE_AUTOGRAD_H

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backpropagates from `loss`. A scalar loss gets the seed gradient 1;
 * otherwise `grad_output` (same shape) must be given. Fails with
 * DT_ERR_STATE if the graph was already freed by an earlier backward, or
 * DT_ERR_INVALID_ARG if loss does not require grad. */
dt_status dt_backward(dt_tensor *loss, dt_tensor *grad_output);

/* Grad mode is per thread. dt_no_grad_begin/end nest. */
void dt_no_grad_begin(void);
void dt_no_grad_end(void);
int dt_grad_enabled(void);

typedef void (*dt_grad_ready_fn)(dt_tensor *leaf, void *user);
typedef int dt_hook_handle; /* > 0; 0 is never a valid handle */

/* Adds a hook fired when `leaf`'s gradient for this backward pass is
 * complete. The leaf must require grad. */
dt_status dt_tensor_add_grad_ready_hook(dt_tensor *leaf, dt_grad_ready_fn fn, void *user,
                                        dt_hook_handle *out);
dt_status dt_tensor_remove_grad_ready_hook(dt_tensor *leaf, dt_hook_handle h);

/* Rows-ready hook: early pieces of a leaf's gradient. An op that adds a
 * leaf's gradient straight into its .grad (core/autograd_internal.h) and
 * is the last contributor of the pass to it may compute that gradient in
 * blocks of rows (along dim 0) of rows_per_part rows, [k * rows_per_part,
 * min((k + 1) * rows_per_part, rows)), from the last block to the first,
 * and report each block once it holds its final value for the pass: the
 * hook gets rows [row0, row0 + nrows). Linear's weight and bias do so;
 * other ops report nothing. The grad-ready hook still fires at the end,
 * whether blocks were reported or not. Same results bit for bit: a block
 * is the same sums as the whole. One per leaf (DT_ERR_STATE for a second);
 * rows_per_part >= 1; the leaf must require grad. */
typedef void (*dt_grad_rows_ready_fn)(dt_tensor *leaf, int64_t row0, int64_t nrows, void *user);
dt_status dt_tensor_set_grad_rows_hook(dt_tensor *leaf, int64_t rows_per_part,
                                       dt_grad_rows_ready_fn fn, void *user);
void dt_tensor_clear_grad_rows_hook(dt_tensor *leaf);

/* Grad-destination hook: where a leaf's gradient of a pass is written.
 * When a backward is about to compute the gradient of a leaf that has no
 * .grad, it asks the hook; *grad = a zeroed, contiguous f32 tensor of the
 * leaf's numel (a view into a larger buffer, say), which becomes the
 * leaf's .grad (the hook's reference moves into it) and which the op adds
 * into in place, as into any .grad; or NULL: the engine makes one as
 * before. ZeRO stage 2 hands out slices of its reduce-scatter buckets, so
 * a gradient is written once, where it is reduced from. One per leaf
 * (DT_ERR_STATE for a second); the leaf must require grad. An error from
 * the hook fails the backward. */
typedef dt_status (*dt_grad_dest_fn)(dt_tensor *leaf, void *user, dt_tensor **grad);
dt_status dt_tensor_set_grad_dest_hook(dt_tensor *leaf, dt_grad_dest_fn fn, void *user);
void dt_tensor_clear_grad_dest_hook(dt_tensor *leaf);

/* Sequence number of the last backward pass completed on this thread; used
 * by tests to tie hook firings to passes. */
unsigned long dt_backward_pass_count(void);

#ifdef __cplusplus
}
#endif
#endif
