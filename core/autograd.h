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

/* Sequence number of the last backward pass completed on this thread; used
 * by tests to tie hook firings to passes. */
unsigned long dt_backward_pass_count(void);

#ifdef __cplusplus
}
#endif
#endif
