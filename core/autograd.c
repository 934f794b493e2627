/* The tape engine: recording nodes, running backward, grad-ready hooks. */
#include <stdlib.h>
#include <string.h>

#include "core/tensor_internal.h"

static _Thread_local int no_grad_depth;
static _Thread_local unsigned long backward_passes;
static unsigned long node_seq;   /* atomic */
static int next_hook_handle = 1; /* atomic; shared with module hooks via dt_hook_handle_next */

int dt_hook_handle_next(void) { return __atomic_fetch_add(&next_hook_handle, 1, __ATOMIC_RELAXED); }

void dt_no_grad_begin(void) { no_grad_depth++; }
void dt_no_grad_end(void) {
  DT_ASSERT(no_grad_depth > 0);
  no_grad_depth--;
}
int dt_grad_enabled(void) { return no_grad_depth == 0; }
int dt_grad_mode_force_on(void) {
  int saved = no_grad_depth;
  no_grad_depth = 0;
  return saved;
}
void dt_grad_mode_restore(int saved) { no_grad_depth = saved; }
unsigned long dt_backward_pass_count(void) { return backward_passes; }

int dt_autograd_should_record(dt_tensor *const *inputs, int n) {
  if (no_grad_depth > 0)
    return 0;
  for (int i = 0; i < n; i++)
    if (inputs[i] != NULL && inputs[i]->requires_grad)
      return 1;
  return 0;
}

/* Drops what the node holds (inputs, saved tensors, ctx): after backward
 * or when the node dies. */
static void node_free_graph(dt_node *n) {
  for (int i = 0; i < n->n_inputs; i++) {
    dt_tensor_release(n->inputs[i]);
    n->inputs[i] = NULL;
  }
  for (int i = 0; i < DT_NODE_MAX_SAVED; i++) {
    dt_tensor_release(n->saved[i]);
    n->saved[i] = NULL;
  }
  if (n->ctx != NULL && n->ctx_free != NULL)
    n->ctx_free(n->ctx);
  n->ctx = NULL;
  n->freed = 1;
}

/* The node's destroy function (dt_node_release, in tensor.c, calls it when
 * the last reference goes). */
static void node_destroy(dt_node *n) {
  node_free_graph(n);
  dt_tensor_release(n->grad_accum);
  free(n);
}

dt_status dt_autograd_record(const char *name, dt_backward_fn backward, dt_tensor *const *inputs,
                             int n_inputs, dt_tensor *output, dt_node **out_node) {
  DT_ASSERT(n_inputs >= 0 && n_inputs <= DT_NODE_MAX_INPUTS);
  DT_ASSERT(output->grad_fn == NULL);
  dt_node *n = calloc(1, sizeof *n);
  if (n == NULL)
    return DT_ERROR(DT_ERR_OOM, "out of host memory for an autograd node (%s)", name);
  n->refcount = 1;
  n->destroy = node_destroy;
  n->seq = __atomic_add_fetch(&node_seq, 1, __ATOMIC_RELAXED);
  n->name = name;
  n->backward = backward;
  n->n_inputs = n_inputs;
  for (int i = 0; i < n_inputs; i++) {
    n->inputs[i] = dt_tensor_retain(inputs[i]);
    n->needs_grad[i] = inputs[i] != NULL && inputs[i]->requires_grad;
  }
  output->grad_fn = n;
  output->requires_grad = 1;
  if (out_node != NULL)
    *out_node = n;
  return DT_OK;
}

void *dt_node_params_init(dt_node *node, size_t size) {
  DT_ASSERT(size <= sizeof node->params);
  memset(&node->params, 0, sizeof node->params);
  node->params_size = size;
  return node->params.bytes;
}

void *dt_node_params_get(dt_node *node, size_t size) {
  DT_ASSERT(node->params_size == size);
  return node->params.bytes;
}

void dt_node_save(dt_node *node, int slot, dt_tensor *t) {
  DT_ASSERT(slot >= 0 && slot < DT_NODE_MAX_SAVED);
  dt_tensor_release(node->saved[slot]);
  node->saved[slot] = dt_tensor_retain(t);
}

/* ---- grad-ready hooks ---- */

dt_status dt_tensor_add_grad_ready_hook(dt_tensor *leaf, dt_grad_ready_fn fn, void *user,
                                        dt_hook_handle *out) {
  if (leaf->grad_fn != NULL || !leaf->requires_grad)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "grad-ready hooks attach to leaf tensors that require grad");
  if (leaf->n_hooks == leaf->cap_hooks) {
    int cap = leaf->cap_hooks ? 2 * leaf->cap_hooks : 2;
    dt_grad_hook *h = realloc(leaf->hooks, sizeof *h * (size_t)cap);
    if (h == NULL)
      return DT_ERROR(DT_ERR_OOM, "out of host memory for a hook");
    leaf->hooks = h;
    leaf->cap_hooks = cap;
  }
  dt_hook_handle handle = dt_hook_handle_next();
  leaf->hooks[leaf->n_hooks++] = (dt_grad_hook){handle, fn, user};
  if (out != NULL)
    *out = handle;
  return DT_OK;
}

dt_status dt_tensor_remove_grad_ready_hook(dt_tensor *leaf, dt_hook_handle h) {
  for (int i = 0; i < leaf->n_hooks; i++) {
    if (leaf->hooks[i].handle == h) {
      memmove(&leaf->hooks[i], &leaf->hooks[i + 1],
              sizeof(dt_grad_hook) * (size_t)(leaf->n_hooks - i - 1));
      leaf->n_hooks--;
      return DT_OK;
    }
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "no grad-ready hook with handle %d on this tensor", h);
}

dt_status dt_tensor_set_grad_rows_hook(dt_tensor *leaf, int64_t rows_per_part,
                                       dt_grad_rows_ready_fn fn, void *user) {
  if (leaf->grad_fn != NULL || !leaf->requires_grad || fn == NULL || rows_per_part < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "rows-ready hooks attach to leaf tensors that require grad, with a function "
                    "and rows_per_part >= 1 (got %lld)",
                    (long long)rows_per_part);
  if (leaf->rows_fn != NULL)
    return DT_ERROR(DT_ERR_STATE, "the tensor has a rows-ready hook already (one per tensor)");
  leaf->rows_fn = fn;
  leaf->rows_user = user;
  leaf->rows_per_part = rows_per_part;
  return DT_OK;
}

void dt_tensor_clear_grad_rows_hook(dt_tensor *leaf) {
  leaf->rows_fn = NULL;
  leaf->rows_user = NULL;
  leaf->rows_per_part = 0;
}

dt_status dt_tensor_set_grad_dest_hook(dt_tensor *leaf, dt_grad_dest_fn fn, void *user) {
  if (leaf->grad_fn != NULL || !leaf->requires_grad || fn == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "grad-destination hooks attach to leaf tensors that require grad, with a "
                    "function");
  if (leaf->dest_fn != NULL)
    return DT_ERROR(DT_ERR_STATE,
                    "the tensor has a grad-destination hook already (one per tensor)");
  leaf->dest_fn = fn;
  leaf->dest_user = user;
  return DT_OK;
}

void dt_tensor_clear_grad_dest_hook(dt_tensor *leaf) {
  leaf->dest_fn = NULL;
  leaf->dest_user = NULL;
}

int64_t dt_node_grad_rows_per_part(const dt_node *node, int i) {
  return i >= 0 && i < node->n_inputs ? node->grad_part_rows[i] : 0;
}

void dt_node_grad_rows_ready(const dt_node *node, int i, int64_t row0, int64_t nrows) {
  dt_tensor *in = node->inputs[i];
  DT_ASSERT(node->grad_part_rows[i] > 0 && in->rows_fn != NULL);
  in->rows_fn(in, row0, nrows, in->rows_user);
}

/* Fires the hooks registered when the gradient became complete, in order,
 * from a snapshot: a hook may remove itself (or others) while they fire. */
static void fire_hooks(dt_tensor *leaf) {
  dt_grad_hook small[8];
  int n = leaf->n_hooks;
  if (n == 0)
    return;
  dt_grad_hook *snap = n <= 8 ? small : malloc(sizeof *snap * (size_t)n);
  if (snap == NULL) { /* no memory for a snapshot: fire in place */
    for (int i = 0; i < leaf->n_hooks; i++)
      leaf->hooks[i].fn(leaf, leaf->hooks[i].user);
    return;
  }
  memcpy(snap, leaf->hooks, sizeof *snap * (size_t)n);
  for (int i = 0; i < n; i++)
    snap[i].fn(leaf, snap[i].user);
  if (snap != small)
    free(snap);
}

/* ---- backward ---- */

typedef struct node_list {
  dt_node **v;
  int n, cap;
} node_list;

static dt_status list_push(node_list *l, dt_node *n) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    dt_node **v = realloc(l->v, sizeof *v * (size_t)cap);
    if (v == NULL)
      return DT_ERROR(DT_ERR_OOM, "out of host memory in backward");
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = n;
  return DT_OK;
}

static int by_seq_desc(const void *a, const void *b) {
  unsigned long x = (*(dt_node *const *)a)->seq, y = (*(dt_node *const *)b)->seq;
  return x < y ? 1 : (x > y ? -1 : 0);
}

/* g as a contiguous tensor of `dtype` (a new reference): every gradient
 * has its tensor's dtype, so the engine converts one that arrives in
 * another (a backward that computed in f32 for a 16-bit input). */
static dt_status grad_as(dt_tensor *g, dt_dtype dtype, dt_tensor **out) {
  dt_tensor *c = NULL, *r = NULL;
  *out = NULL;
  DT_CHECK(dt_tensor_contiguous_copy(g, &c));
  if (c->dtype == dtype) {
    *out = c;
    return DT_OK;
  }
  dt_status st = dt_tensor_empty(c->shape, c->ndim, dtype, c->storage->device, &r);
  if (st == DT_OK && dt_tensor_numel(c) > 0)
    st = dt_kernel_cast(DT_TENSOR_EXEC(c), dt_tensor_data(c), c->dtype, dt_tensor_data(r), dtype,
                        dt_tensor_numel(c));
  dt_tensor_release(c);
  if (st != DT_OK) {
    dt_tensor_release(r);
    return st;
  }
  *out = r;
  return DT_OK;
}

/* Adds g into the node's pending gradient. Takes the reference to g. */
static dt_status accumulate_into_node(dt_node *n, dt_tensor *g) {
  if (n->grad_accum == NULL) {
    n->grad_accum = g;
    return DT_OK;
  }
  dt_tensor *acc = n->grad_accum;
  dt_tensor *gc;
  dt_status st = grad_as(g, acc->dtype, &gc);
  dt_tensor_release(g);
  if (st != DT_OK)
    return st;
  int64_t numel = dt_tensor_numel(acc);
  if (acc->refcount == 1 && acc->storage->refcount == 1 && dt_tensor_is_contiguous(acc)) {
    st = dt_kernel_axpby(DT_TENSOR_EXEC(acc), numel, 1.0f, dt_tensor_data(gc), 1.0f,
                         dt_tensor_data(acc));
  } else {
    /* acc is shared with another part of the graph: sum into a new tensor. */
    dt_tensor *sum;
    st = dt_tensor_empty(acc->shape, acc->ndim, acc->dtype, acc->storage->device, &sum);
    if (st == DT_OK) {
      dt_tensor *accc;
      st = dt_tensor_contiguous_copy(acc, &accc);
      if (st == DT_OK) {
        const dt_exec ex = dt_tensor_exec(sum);
        st = dt_kernel_axpby(&ex, numel, 1.0f, dt_tensor_data(accc), 0.0f, dt_tensor_data(sum));
        if (st == DT_OK)
          st = dt_kernel_axpby(&ex, numel, 1.0f, dt_tensor_data(gc), 1.0f, dt_tensor_data(sum));
        dt_tensor_release(accc);
      }
      if (st == DT_OK) {
        dt_tensor_release(acc);
        n->grad_accum = sum;
      } else {
        dt_tensor_release(sum);
      }
    }
  }
  dt_tensor_release(gc);
  return st;
}

float *dt_node_grad_dest(const dt_node *node, int i) {
  return i >= 0 && i < node->n_inputs ? node->grad_dest[i] : NULL;
}

static int shares_storage(const dt_tensor *t, const dt_storage *s) {
  return t != NULL && t->storage == s;
}

/* A leaf without .grad whose grad-destination hook hands one out: it
 * becomes the leaf's .grad (checked: f32, contiguous, the leaf's numel). */
static dt_status grad_from_dest_hook(dt_tensor *in) {
  dt_tensor *d = NULL;
  DT_CHECK(in->dest_fn(in, in->dest_user, &d));
  if (d == NULL)
    return DT_OK;
  if (d->dtype != DT_DTYPE_F32 || !dt_tensor_is_contiguous(d) ||
      dt_tensor_numel(d) != dt_tensor_numel(in) ||
      !dt_device_equal(d->storage->device, in->storage->device)) {
    dt_tensor_release(d);
    return DT_ERROR(DT_ERR_INTERNAL,
                    "a grad-destination hook returned a tensor that is not a contiguous f32 "
                    "tensor of its leaf's size and device");
  }
  in->grad = d;
  return DT_OK;
}

/* Offers each leaf input's .grad to the backward as its destination
 * (dt_node_grad_dest) where writing into it in place is safe: f32,
 * contiguous, the leaf's size, on its device, and no storage shared with
 * the incoming gradient, an input or a saved tensor. A leaf without one
 * asks its grad-destination hook first. */
static dt_status offer_grad_dests(dt_node *n, const dt_tensor *g) {
  for (int j = 0; j < n->n_inputs; j++) {
    dt_tensor *in = n->inputs[j];
    n->grad_dest[j] = NULL;
    n->grad_part_rows[j] = 0;
    if (!n->needs_grad[j] || in == NULL || in->grad_fn != NULL || !in->requires_grad ||
        in->sum_as_node)
      continue;
    if (in->grad == NULL && in->dest_fn != NULL)
      DT_CHECK(grad_from_dest_hook(in));
    dt_tensor *d = in->grad;
    if (d == NULL || d->dtype != DT_DTYPE_F32 || !dt_tensor_is_contiguous(d) ||
        dt_tensor_numel(d) != dt_tensor_numel(in) ||
        !dt_device_equal(d->storage->device, in->storage->device) || shares_storage(g, d->storage))
      continue;
    int shared = 0;
    for (int k = 0; k < n->n_inputs && !shared; k++)
      shared = shares_storage(n->inputs[k], d->storage);
    for (int k = 0; k < DT_NODE_MAX_SAVED && !shared; k++)
      shared = shares_storage(n->saved[k], d->storage);
    if (shared)
      continue;
    n->grad_dest[j] = dt_tensor_data(d);
    /* the last edge into the leaf, and no other input of this node is it */
    int edges = 0;
    for (int k = 0; k < n->n_inputs; k++)
      edges += n->inputs[k] == in && n->needs_grad[k];
    if (in->rows_fn != NULL && in->pending_grads == 1 && edges == 1 && in->ndim >= 1)
      n->grad_part_rows[j] = in->rows_per_part;
  }
  return DT_OK;
}

static dt_status collect_nodes(dt_node *root, node_list *out) {
  node_list stack = {0};
  dt_status st = list_push(&stack, root);
  root->pending = 1; /* visited mark */
  while (st == DT_OK && stack.n > 0) {
    dt_node *n = stack.v[--stack.n];
    st = list_push(out, n);
    for (int i = 0; st == DT_OK && i < n->n_inputs; i++) {
      dt_tensor *in = n->inputs[i];
      if (!n->needs_grad[i] || in == NULL)
        continue;
      if (in->grad_fn != NULL) {
        if (in->grad_fn->freed) {
          st = DT_ERROR(DT_ERR_STATE,
                        "backward through a graph that was already freed (node %s): a "
                        "second backward needs a new forward pass",
                        in->grad_fn->name);
        } else if (!in->grad_fn->pending) {
          in->grad_fn->pending = 1;
          st = list_push(&stack, in->grad_fn);
        }
      } else if (in->requires_grad) {
        in->pending_grads = 0;
      }
    }
  }
  /* On failure, nodes still on the stack were marked but are not in `out`
   * (whose marks dt_backward clears): unmark them, or a later backward
   * through them would skip them as already visited. */
  for (int i = 0; i < stack.n; i++)
    stack.v[i]->pending = 0;
  free(stack.v);
  return st;
}

dt_status dt_backward(dt_tensor *loss, dt_tensor *grad_output) {
  char a[200];
  if (!loss->requires_grad)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "backward: the loss %s does not require grad (was it computed under "
                    "no_grad, or from tensors without requires_grad?)",
                    dt_tensor_describe(loss, a, sizeof a));
  dt_tensor *seed;
  if (grad_output != NULL) {
    char b[200];
    if (grad_output->ndim != loss->ndim ||
        memcmp(grad_output->shape, loss->shape, sizeof(int64_t) * (size_t)loss->ndim) != 0)
      return DT_ERROR(DT_ERR_SHAPE, "backward: grad_output %s does not have the loss's shape %s",
                      dt_tensor_describe(grad_output, b, sizeof b),
                      dt_tensor_describe(loss, a, sizeof a));
    int dtype_ok = grad_output->dtype == DT_DTYPE_F32 || grad_output->dtype == loss->dtype;
    if (!dtype_ok || !dt_device_equal(grad_output->storage->device, loss->storage->device))
      return DT_ERROR(!dtype_ok ? DT_ERR_DTYPE : DT_ERR_DEVICE_MISMATCH,
                      "backward: grad_output %s must be f32 (or the loss's dtype) on the loss's "
                      "device (loss %s)",
                      dt_tensor_describe(grad_output, b, sizeof b),
                      dt_tensor_describe(loss, a, sizeof a));
    DT_CHECK(grad_as(grad_output, loss->dtype, &seed));
  } else {
    if (dt_tensor_numel(loss) != 1)
      return DT_ERROR(DT_ERR_SHAPE,
                      "backward: loss %s is not a scalar: pass grad_output of its shape",
                      dt_tensor_describe(loss, a, sizeof a));
    dt_tensor *one = NULL;
    DT_CHECK(dt_tensor_full(loss->shape, loss->ndim, 1.0f, loss->storage->device, &one));
    dt_status st1 = grad_as(one, loss->dtype, &seed);
    dt_tensor_release(one);
    DT_CHECK(st1);
  }
  dt_status st = DT_OK;
  if (loss->grad_fn == NULL) { /* a leaf loss */
    st = dt_tensor_accumulate_grad(loss, seed);
    dt_tensor_release(seed);
    if (st == DT_OK)
      fire_hooks(loss);
    backward_passes++;
    return st;
  }
  dt_node *root = loss->grad_fn;
  if (root->freed) {
    dt_tensor_release(seed);
    return DT_ERROR(DT_ERR_STATE,
                    "backward through a graph that was already freed (node %s): a second "
                    "backward needs a new forward pass",
                    root->name);
  }
  node_list nodes = {0};
  st = collect_nodes(root, &nodes);
  /* Keep every node alive while we run: freeing one node's inputs may drop
   * the last reference to another node still to run. */
  for (int i = 0; i < nodes.n; i++) {
    __atomic_add_fetch(&nodes.v[i]->refcount, 1, __ATOMIC_RELAXED);
    nodes.v[i]->pending = 0;
  }
  /* Count the edges into each leaf (pending_grads was reset while collecting). */
  for (int i = 0; st == DT_OK && i < nodes.n; i++) {
    dt_node *n = nodes.v[i];
    for (int j = 0; j < n->n_inputs; j++) {
      dt_tensor *in = n->inputs[j];
      if (n->needs_grad[j] && in != NULL && in->grad_fn == NULL && in->requires_grad)
        in->pending_grads++;
    }
  }
  if (st == DT_OK) {
    qsort(nodes.v, (size_t)nodes.n, sizeof *nodes.v, by_seq_desc);
    root->grad_accum = seed;
    seed = NULL;
  }
  dt_no_grad_begin();
  for (int i = 0; st == DT_OK && i < nodes.n; i++) {
    dt_node *n = nodes.v[i];
    dt_tensor *grad_in[DT_NODE_MAX_INPUTS] = {0};
    dt_tensor *g = n->grad_accum;
    n->grad_accum = NULL;
    if (g != NULL) {
      dt_tensor *gc;
      st = dt_tensor_contiguous_copy(g, &gc);
      dt_tensor_release(g);
      if (st == DT_OK) {
        st = offer_grad_dests(n, gc);
        if (st == DT_OK)
          st = n->backward(n, gc, grad_in);
        memset(n->grad_dest, 0, sizeof n->grad_dest);
        memset(n->grad_part_rows, 0, sizeof n->grad_part_rows);
        if (st != DT_OK)
          dt_error_wrap(st, "backward of %s", n->name);
        dt_tensor_release(gc);
      }
    }
    for (int j = 0; j < n->n_inputs; j++) {
      dt_tensor *in = n->inputs[j];
      dt_tensor *gj = grad_in[j];
      grad_in[j] = NULL;
      if (st != DT_OK || !n->needs_grad[j] || in == NULL) {
        dt_tensor_release(gj);
        continue;
      }
      if (in->grad_fn != NULL) {
        dt_tensor *gt = NULL;
        if (gj != NULL) {
          st = grad_as(gj, in->dtype, &gt);
          dt_tensor_release(gj);
        }
        if (gt != NULL)
          st = accumulate_into_node(in->grad_fn, gt);
      } else if (in->requires_grad) {
        if (gj != NULL) {
          st = dt_tensor_accumulate_grad(in, gj);
          dt_tensor_release(gj);
        }
        if (st == DT_OK && --in->pending_grads == 0)
          fire_hooks(in);
      } else {
        dt_tensor_release(gj);
      }
    }
    node_free_graph(n);
  }
  dt_no_grad_end();
  for (int i = 0; i < nodes.n; i++) {
    dt_tensor_release(nodes.v[i]->grad_accum);
    nodes.v[i]->grad_accum = NULL;
    node_free_graph(nodes.v[i]);
    dt_node_release(nodes.v[i]);
  }
  free(nodes.v);
  dt_tensor_release(seed);
  if (st == DT_OK)
    backward_passes++;
  return st;
}

dt_status dt_tensor_accumulate_grad(dt_tensor *leaf, dt_tensor *g) {
  char a[200], b[200];
  if (dt_tensor_numel(g) != dt_tensor_numel(leaf))
    return DT_ERROR(DT_ERR_INTERNAL, "gradient %s does not match its tensor %s",
                    dt_tensor_describe(g, a, sizeof a), dt_tensor_describe(leaf, b, sizeof b));
  dt_tensor *gc;
  DT_CHECK(grad_as(g, leaf->dtype, &gc));
  dt_status st = DT_OK;
  if (leaf->grad == NULL) {
    /* Own a private copy: g may be shared with other parts of the graph. */
    dt_tensor *ng;
    st = dt_tensor_empty(leaf->shape, leaf->ndim, leaf->dtype, leaf->storage->device, &ng);
    if (st == DT_OK) {
      st = dt_kernel_axpby(DT_TENSOR_EXEC(ng), dt_tensor_numel(ng), 1.0f, dt_tensor_data(gc), 0.0f,
                           dt_tensor_data(ng));
      if (st == DT_OK)
        leaf->grad = ng;
      else
        dt_tensor_release(ng);
    }
  } else {
    st = dt_kernel_axpby(DT_TENSOR_EXEC(leaf), dt_tensor_numel(gc), 1.0f, dt_tensor_data(gc), 1.0f,
                         dt_tensor_data(leaf->grad));
  }
  dt_tensor_release(gc);
  return st;
}
