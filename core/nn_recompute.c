/* Activation recomputation of a module (dt_module_set_recompute, core/module.h):
 * the forward runs the module under no-grad and records one "recompute"
 * node that holds the module's input; its backward re-runs the module with
 * grad on, as the forward saw it (autocast dtype, Dropout generators), and
 * backpropagates through the re-run graph. */
#include <stdlib.h>
#include <string.h>

#include "core/amp.h"
#include "core/autograd_internal.h"
#include "core/nn_internal.h"
#include "core/tensor_internal.h"

/* The depth of recomputation re-runs on this thread (dt_nn_recomputing). */
static _Thread_local int rerun_depth;

int dt_nn_recomputing(void) { return rerun_depth > 0; }

typedef struct recompute_ctx {
  dt_module *m; /* borrowed: the module outlives its graphs */
  dt_dtype autocast;
  int n_gens;
  dt_generator **gens;  /* the Dropout generators below m */
  dt_generator *states; /* their states when the forward began */
} recompute_ctx;

static void ctx_free(void *p) {
  recompute_ctx *c = p;
  free(c->gens);
  free(c->states);
  free(c);
}

/* Counts (gens NULL) or lists the Dropout generators of m's subtree. */
static int collect_gens(dt_module *m, dt_generator **gens, int n) {
  dt_generator *g = dt_nn_dropout_generator(m);
  if (g != NULL) {
    if (gens != NULL)
      gens[n] = g;
    n++;
  }
  for (int i = 0; i < dt_module_num_children(m); i++)
    n = collect_gens(dt_module_child_at(m, i), gens, n);
  return n;
}

static dt_status ctx_create(dt_module *m, recompute_ctx **out) {
  recompute_ctx *c = calloc(1, sizeof *c);
  int n = collect_gens(m, NULL, 0);
  if (c != NULL && n > 0) {
    c->gens = malloc(sizeof *c->gens * (size_t)n);
    c->states = malloc(sizeof *c->states * (size_t)n);
  }
  if (c == NULL || (n > 0 && (c->gens == NULL || c->states == NULL))) {
    if (c != NULL)
      ctx_free(c);
    return DT_ERROR(DT_ERR_OOM, "out of host memory for the recomputation of a %s",
                    dt_module_type_name(m));
  }
  c->m = m;
  c->autocast = dt_autocast_dtype();
  c->n_gens = collect_gens(m, c->gens, 0);
  for (int i = 0; i < c->n_gens; i++)
    c->states[i] = *c->gens[i];
  *out = c;
  return DT_OK;
}

/* Swaps the generators' current states with the saved ones. */
static void swap_gens(recompute_ctx *c) {
  for (int i = 0; i < c->n_gens; i++) {
    dt_generator t = *c->gens[i];
    *c->gens[i] = c->states[i];
    c->states[i] = t;
  }
}

static dt_status recompute_backward(dt_node *node, dt_tensor *grad_out, dt_tensor **grad_in) {
  recompute_ctx *c = node->ctx;
  dt_tensor *x = NULL, *y = NULL;
  DT_CHECK(dt_tensor_detach(node->inputs[0], &x));
  x->requires_grad = node->needs_grad[0];
  x->sum_as_node = 1;
  swap_gens(c); /* the forward's draws again */
  dt_dtype prev = dt_autocast_begin(c->autocast);
  int mode = dt_grad_mode_force_on();
  rerun_depth++;
  dt_status st = dt_module_call_recorded(c->m, x, &y);
  rerun_depth--;
  dt_grad_mode_restore(mode);
  dt_autocast_end(prev);
  swap_gens(c); /* back to where the forward left them */
  if (st == DT_OK && y->requires_grad)
    st = dt_backward(y, grad_out);
  if (st == DT_OK && node->needs_grad[0] && x->grad != NULL)
    grad_in[0] = dt_tensor_retain(x->grad);
  dt_tensor_release(y);
  dt_tensor_release(x);
  return st;
}

static int any_parameter_requires_grad(const dt_module *m) {
  for (int i = 0; i < dt_module_num_parameters(m); i++)
    if (dt_module_parameter_at(m, i, NULL)->requires_grad)
      return 1;
  return 0;
}

dt_status dt_nn_recompute_call(dt_module *m, dt_tensor *input, dt_tensor **output) {
  *output = NULL;
  if (!input->requires_grad && !any_parameter_requires_grad(m))
    return dt_module_call_recorded(m, input, output);
  recompute_ctx *c = NULL;
  DT_CHECK(ctx_create(m, &c));
  dt_tensor *y = NULL;
  dt_no_grad_begin();
  dt_status st = dt_module_call_recorded(m, input, &y);
  dt_no_grad_end();
  if (st == DT_OK && (y == input || y->grad_fn != NULL))
    st = DT_ERROR(DT_ERR_STATE,
                  "recomputing a %s: its forward returned its input or a tensor on the tape, "
                  "which recomputation cannot stand in for",
                  dt_module_type_name(m));
  dt_node *node = NULL;
  if (st == DT_OK)
    st = dt_autograd_record("recompute", recompute_backward, &input, 1, y, &node);
  if (st != DT_OK) {
    ctx_free(c);
    dt_tensor_release(y);
    return st;
  }
  node->ctx = c;
  node->ctx_free = ctx_free;
  *output = y;
  return DT_OK;
}
