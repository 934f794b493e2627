/* For op implementations inside core/ (and cuda/ tests): how an op records
 * itself on the tape. Not part of the public API. */
#ifndef DT_CORE_AUTOGRAD_INTERNAL_H
#define DT_CORE_AUTOGRAD_INTERNAL_H

#include "core/autograd.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_NODE_MAX_INPUTS 5
#define DT_NODE_MAX_SAVED 6
#define DT_NODE_PARAMS_BYTES 96

/* What an op's backward needs besides tensors (sizes, flags, scalars) is
 * the op's own struct, e.g.
 *   typedef struct linear_saved { int64_t rows, in, out; bool has_bias; } linear_saved;
 * kept in the node's params area, not in a separate allocation: a node per
 * op call is the tape's hot path, and the states are small. The area is
 * written with DT_NODE_PARAMS_INIT(node, linear_saved) (zeroed, its size
 * recorded) and read with DT_NODE_PARAMS(node, linear_saved); both fail to
 * compile when the struct does not fit the area or needs more alignment
 * than it has, and reading with a struct of another size than was written
 * is a broken invariant (DT_ASSERT). Larger or owning state goes to
 * node->ctx. */
typedef union dt_node_params {
  int64_t align_i64; /* the area is aligned for int64_t, double and pointers */
  double align_f64;
  void *align_ptr;
  unsigned char bytes[DT_NODE_PARAMS_BYTES];
} dt_node_params;

typedef struct dt_node dt_node;

/* Computes the gradients of the node's inputs from `grad_out` (the gradient
 * of the node's single output, contiguous, in the output's dtype: a
 * gradient has its tensor's dtype, so a 16-bit activation gets a 16-bit
 * gradient). For each input i that needs a gradient (node->needs_grad[i])
 * it sets grad_in[i] to a new tensor of that input's shape (the engine
 * takes the reference and converts it to the input's dtype when it has
 * another); it may leave NULL for inputs that do not need one. Where
 * dt_node_grad_dest(node, i) is not NULL it may instead add input i's
 * gradient into that buffer (a GEMM with beta = 1) and leave grad_in[i]
 * NULL. */
typedef dt_status (*dt_backward_fn)(dt_node *node, dt_tensor *grad_out, dt_tensor **grad_in);

struct dt_node {
  int refcount;
  void (*destroy)(dt_node *); /* frees the node; set by dt_autograd_record */
  unsigned long seq;          /* creation order, for the backward schedule */
  const char *name;           /* op name, for error messages */
  dt_backward_fn backward;
  int n_inputs;
  dt_tensor *inputs[DT_NODE_MAX_INPUTS]; /* retained; edges of the graph */
  int needs_grad[DT_NODE_MAX_INPUTS];
  dt_tensor *saved[DT_NODE_MAX_SAVED]; /* retained until the graph is freed */
  dt_node_params params;               /* the op's saved struct: DT_NODE_PARAMS */
  size_t params_size;                  /* sizeof that struct; 0 = none */
  void *ctx;                           /* op-private data, freed with ctx_free */
  void (*ctx_free)(void *);
  int freed; /* backward already ran and released the graph */
  /* engine scratch */
  dt_tensor *grad_accum;
  int pending;
  float *grad_dest[DT_NODE_MAX_INPUTS];       /* during backward: see dt_node_grad_dest */
  int64_t grad_part_rows[DT_NODE_MAX_INPUTS]; /* see dt_node_grad_rows_per_part */
};

/* During the node's backward: where input i's gradient may be accumulated
 * in place (contiguous f32, input i's numel), or NULL. It is the .grad of
 * a leaf input that has one (the parameter arena's gradient views), shared
 * with no tensor the backward reads; adding into it is what the engine
 * would do with a returned gradient, without the temporary. */
float *dt_node_grad_dest(const dt_node *node, int i);

/* During the node's backward, where dt_node_grad_dest(node, i) is given:
 * the rows per block in which input i's gradient may be reported early
 * (dt_tensor_set_grad_rows_hook), when the leaf has a rows-ready hook and
 * this node is the last to contribute to its gradient in this pass; else
 * 0. The backward then adds blocks into the destination from the last to
 * the first and calls dt_node_grad_rows_ready after each. */
int64_t dt_node_grad_rows_per_part(const dt_node *node, int i);
void dt_node_grad_rows_ready(const dt_node *node, int i, int64_t row0, int64_t nrows);

/* Turns grad mode on whatever the nesting of dt_no_grad_begin, and back:
 * a backward (which runs under no-grad) that re-runs a forward to record
 * it (core/nn_recompute.c). _on returns what _restore takes. */
int dt_grad_mode_force_on(void);
void dt_grad_mode_restore(int saved);

/* 1 if grad mode is on and any of the inputs requires grad. */
int dt_autograd_should_record(dt_tensor *const *inputs, int n);

/* Creates a node with the given inputs (retained) and attaches it to
 * `output` as its grad_fn (output becomes a non-leaf requiring grad).
 * Returns the node (owned by the output) for the op to fill saved and
 * params. */
dt_status dt_autograd_record(const char *name, dt_backward_fn backward, dt_tensor *const *inputs,
                             int n_inputs, dt_tensor *output, dt_node **out_node);

/* A fresh, process-unique hook handle (grad-ready and module hooks). */
int dt_hook_handle_next(void);

/* Drops a reference; the last one destroys the node (tensor.c). */
void dt_node_release(dt_node *n);

/* Accumulates `g` into leaf->grad (allocating it on first use). */
dt_status dt_tensor_accumulate_grad(dt_tensor *leaf, dt_tensor *g);

/* Retains t in node->saved[slot]. */
void dt_node_save(dt_node *node, int slot, dt_tensor *t);

/* The node's params area as a `type *` (see dt_node_params): _INIT zeroes
 * it and records sizeof(type) (the forward, once), the other asserts that
 * the area holds a `type` (the backward). */
#define DT_NODE_PARAMS_INIT(node, type) \
  ((type *)dt_node_params_init((node), DT_NODE_PARAMS_CHECKED_SIZE(type)))
#define DT_NODE_PARAMS(node, type) \
  ((type *)dt_node_params_get((node), DT_NODE_PARAMS_CHECKED_SIZE(type)))
/* sizeof(type), compiling only when a `type` fits the params area. */
#define DT_NODE_PARAMS_CHECKED_SIZE(type)                                                 \
  (sizeof(type) + 0 * sizeof(struct {                                                     \
                    _Static_assert(sizeof(type) <= DT_NODE_PARAMS_BYTES,                  \
                                   #type " exceeds DT_NODE_PARAMS_BYTES");                \
                    _Static_assert(_Alignof(type) <= _Alignof(dt_node_params),            \
                                   #type " needs more alignment than the node's params"); \
                    int unused;                                                           \
                  }))
void *dt_node_params_init(dt_node *node, size_t size);
void *dt_node_params_get(dt_node *node, size_t size);

#ifdef __cplusplus
}
#endif
#endif
