/* Modules: parameters, buffers, children, hooks, train/eval.
 *
 * A module is an opaque handle over a user-defined implementation: a vtable
 * (forward, destroy) and an `impl` pointer. Parameters, buffers and children
 * are registered in a fixed order (the same on every rank); enumeration is
 * depth-first in registration order with dotted names ("features.0.weight"),
 * own parameters before children's.
 *
 * dt_module_call() is Python's __call__: forward pre-hooks, forward, forward
 * hooks, each in registration order. A pre-hook may replace the input, a
 * forward hook the output. Users override forward, never the call.
 */
#ifndef DT_CORE_MODULE_H
#define DT_CORE_MODULE_H

#include <stdint.h>

#include "core/autograd.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_module dt_module;

typedef struct dt_module_vtable {
  const char *type_name; /* "Linear" */
  /* input -> *output (new reference). */
  dt_status (*forward)(dt_module *m, dt_tensor *input, dt_tensor **output);
  /* Frees impl (the module's parameters, buffers and children are released
   * by the module itself). May be NULL. */
  void (*destroy)(void *impl);
} dt_module_vtable;

/* Creates a module (training mode on, like PyTorch). `impl` is owned by the
 * module (freed by vt->destroy at destroy; on failure the caller keeps it).
 * vt must outlive the module and have a forward. */
dt_status dt_module_create(const dt_module_vtable *vt, void *impl, dt_module **out);
void dt_module_destroy(dt_module *m); /* NULL is a no-op; frees children too */

void *dt_module_impl(const dt_module *m);
const char *dt_module_type_name(const dt_module *m);

/* Registration. On success the module takes a reference to the tensor /
 * ownership of the child; on failure the caller keeps both. Parameters must
 * be leaves and are marked requires_grad (so they must be float). Names
 * must be non-empty, contain no '.', and be unique among a module's
 * parameters, buffers and children (DT_ERR_INVALID_ARG otherwise). A child
 * has exactly one parent. */
dt_status dt_module_register_parameter(dt_module *m, const char *name, dt_tensor *param);
dt_status dt_module_register_buffer(dt_module *m, const char *name, dt_tensor *buf);
dt_status dt_module_add_child(dt_module *m, const char *name, dt_module *child);

/* Local lookup (borrowed; NULL if absent). */
dt_tensor *dt_module_parameter(const dt_module *m, const char *name);
dt_tensor *dt_module_buffer(const dt_module *m, const char *name);
dt_module *dt_module_child(const dt_module *m, const char *name);
int dt_module_num_children(const dt_module *m);
dt_module *dt_module_child_at(const dt_module *m, int i);
/* The module this one is a child of (borrowed), or NULL for a root. */
dt_module *dt_module_parent(const dt_module *m);

/* Recursive enumeration (borrowed references, dotted names valid until the
 * next registration below the module or its destruction). Depth-first in
 * registration order, own entries before children's. A tensor registered
 * under two names (tied weights) is listed once, under its first name, as
 * PyTorch's named_parameters(). The list is cached and rebuilt after a
 * registration anywhere below the module. Out-of-range i returns NULL. */
int dt_module_num_parameters(const dt_module *m);
dt_tensor *dt_module_parameter_at(const dt_module *m, int i, const char **name);
int dt_module_num_buffers(const dt_module *m);
dt_tensor *dt_module_buffer_at(const dt_module *m, int i, const char **name);
/* Total number of parameter elements. */
int64_t dt_module_parameter_count(const dt_module *m);

/* Training flag, set recursively. */
void dt_module_train(dt_module *m, int training);
int dt_module_is_training(const dt_module *m);

/* Activation recomputation (checkpointing, PyTorch's non-reentrant
 * torch.utils.checkpoint) of one module, off by default. When on,
 * dt_module_call of m in grad mode runs m (hooks and forward) without
 * recording on the tape, and keeps only its input: the activations inside m
 * are freed as the forward goes. The output's backward re-runs m from that
 * input, recording, with the autocast dtype and the states of the Dropout
 * generators below m that the forward had (so the same masks), and
 * backpropagates through the re-run into m's parameters and its input. The
 * gradients equal those without recomputation bit for bit; m's parameters
 * get theirs (and their grad-ready hooks fire) during that inner pass. m's
 * forward must not return its input itself. Outside grad mode the flag does
 * nothing. */
void dt_module_set_recompute(dt_module *m, int on);
int dt_module_recompute(const dt_module *m);

/* Moves every parameter and buffer to `dev` (recursively). The tensor
 * handles stay the same (their storage is replaced), so pointers obtained
 * earlier remain valid; requires_grad is kept, existing gradients are
 * dropped. Must be called before dt_param_arena_create (it would move the
 * parameters out of the arena). Errors: the device does not exist, OOM. */
dt_status dt_module_to(dt_module *m, dt_device dev);

/* ---- hooks ----
 * Handles are unique in the process (never reused). A hook returning an
 * error aborts the call with that status (a replacement it set is
 * released). Hooks must not register or remove hooks on the same module
 * while it is being called. */
/* May set *replacement to a new tensor (ownership passes to the call) to
 * replace the input; leaving it NULL keeps the input. To return the input
 * itself, retain it first. Later pre-hooks and forward see the replacement. */
typedef dt_status (*dt_forward_pre_hook)(dt_module *m, dt_tensor *input, dt_tensor **replacement,
                                         void *user);
/* `input` is the (possibly replaced) input seen by forward. May set
 * *replacement (a new reference) to replace the output; the call releases
 * the replaced output. Later hooks see the replacement. */
typedef dt_status (*dt_forward_hook)(dt_module *m, dt_tensor *input, dt_tensor *output,
                                     dt_tensor **replacement, void *user);

dt_status dt_module_register_forward_pre_hook(dt_module *m, dt_forward_pre_hook fn, void *user,
                                              dt_hook_handle *out);
dt_status dt_module_register_forward_hook(dt_module *m, dt_forward_hook fn, void *user,
                                          dt_hook_handle *out);
/* The forward pre-hooks and forward hooks registered on m (not its
 * children): a model that calls a child's parameters through a fused op
 * instead of dt_module_call (GPT-2's MLP) does so only when this is 0. */
int dt_module_num_forward_hooks(const dt_module *m);
/* Removes a pre- or forward hook by handle. DT_ERR_INVALID_ARG if unknown. */
dt_status dt_module_remove_hook(dt_module *m, dt_hook_handle h);

/* Runs pre-hooks, forward, forward hooks. *output is a new reference (NULL
 * on failure, with nothing leaked). */
dt_status dt_module_call(dt_module *m, dt_tensor *input, dt_tensor **output);

/* ---- flat parameter arena ----
 * Moves every parameter's data into one flat buffer (registration order)
 * and gives each a gradient that is a view into one flat gradient buffer
 * (same order, zero-initialised). The module's parameter tensors keep their
 * handles; their storage becomes the arena. Optimizers and the DDP reducer
 * work on the arena. Parameters must all be f32 (DT_ERR_DTYPE) on one
 * device (DT_ERR_DEVICE_MISMATCH) and leaves; a module without parameters
 * is DT_ERR_INVALID_ARG. Offsets are dense (no padding) so that any run of
 * consecutive parameters is one contiguous slice. A gradient that existed
 * before is copied into the arena. The parameters keep the arena's storage
 * alive: the arena may be destroyed before the module. Accessors take an
 * index in [0, count): out of range gives NULL / -1. */
typedef struct dt_param_arena dt_param_arena;

dt_status dt_param_arena_create(dt_module *m, dt_param_arena **out);
void dt_param_arena_destroy(dt_param_arena *a);
int dt_param_arena_count(const dt_param_arena *a);
dt_tensor *dt_param_arena_param(const dt_param_arena *a, int i, const char **name);
int64_t dt_param_arena_offset(const dt_param_arena *a, int i); /* elements */
dt_tensor *dt_param_arena_data(const dt_param_arena *a);       /* flat (numel) */
dt_tensor *dt_param_arena_grads(const dt_param_arena *a);      /* flat (numel); NULL: dropped */
int64_t dt_param_arena_numel(const dt_param_arena *a);
dt_device dt_param_arena_device(const dt_param_arena *a);
/* Zeroes the flat gradient buffer (one memset on the arena's device);
 * after dt_param_arena_drop_grads it sets every parameter's .grad to NULL
 * instead. */
dt_status dt_param_arena_zero_grad(dt_param_arena *a);

/* ZeRO (dist/ddp.h) splits the flat space into equal pieces per rank, which
 * can reach past the last parameter. dt_param_arena_pad gives both flat
 * buffers `tail` zeroed elements after it (at least: a smaller tail than
 * the current one is a no-op): it reallocates them, copies the data and
 * the gradients accumulated so far and re-points every parameter and .grad
 * view; offsets do not change. Call it before anything keeps pointers into
 * the arena's buffers. The padded tensors (numel + tail elements) are
 * dt_param_arena_padded_data / _grads; the tail stays zero unless a caller
 * writes it (collectives write only equal values into it). */
dt_status dt_param_arena_pad(dt_param_arena *a, int64_t tail);
int64_t dt_param_arena_tail(const dt_param_arena *a);
dt_tensor *dt_param_arena_padded_data(const dt_param_arena *a);  /* flat (numel + tail) */
dt_tensor *dt_param_arena_padded_grads(const dt_param_arena *a); /* flat (numel + tail) */
/* Moves the flat gradient buffer into `flat`, a contiguous f32 tensor of
 * numel + tail elements on the arena's device (the arena keeps a
 * reference): copies the gradients accumulated so far and re-points every
 * .grad; offsets do not change. DDP puts the gradients in memory its ranks
 * share this way (dist/comm.h, dt_comm_shared_buffer). Call it before
 * anything keeps pointers into the gradients. DT_ERR_STATE after
 * dt_param_arena_drop_grads; a wrong size, dtype, device or layout is
 * DT_ERR_INVALID_ARG. */
dt_status dt_param_arena_move_grads(dt_param_arena *a, dt_tensor *flat);
/* ZeRO stage 2: frees the flat gradient buffer. Every .grad becomes NULL,
 * so autograd allocates a parameter's gradient when it first accumulates
 * one (the reducer copies it into a bucket and frees it);
 * dt_param_arena_grads and _padded_grads return NULL from then on. */
dt_status dt_param_arena_drop_grads(dt_param_arena *a);

#ifdef __cplusplus
}
#endif
#endif
