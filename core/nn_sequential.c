/* Sequential: runs its children in registration order, each through
 * dt_module_call so that their hooks fire. */
#include <stdio.h>

#include "core/nn.h"
#include "core/nn_internal.h"

/* x -> child_n-1(... child_0(x)) */
static dt_status sequential_forward(dt_module *m, dt_tensor *x, dt_tensor **y) {
  dt_tensor *cur = dt_tensor_retain(x);
  int n = dt_module_num_children(m);
  for (int i = 0; i < n; i++) {
    dt_tensor *next = NULL;
    dt_status st = dt_module_call(dt_module_child_at(m, i), cur, &next);
    dt_tensor_release(cur);
    if (st != DT_OK)
      return dt_error_wrap(st, "Sequential child %d (%s)", i,
                           dt_module_type_name(dt_module_child_at(m, i)));
    cur = next;
  }
  *y = cur;
  return DT_OK;
}

static const dt_module_vtable sequential_vtable = {"Sequential", sequential_forward, NULL};

dt_status dt_nn_sequential(dt_module *const *mods, int n, dt_module **out) {
  dt_status st = DT_OK;
  dt_module *seq = NULL;
  int i = 0;
  if (out == NULL || n < 0 || (n > 0 && mods == NULL)) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "Sequential of %d modules: bad arguments", n);
    goto destroy_rest;
  }
  DT_CHECK_GOTO(dt_module_create(&sequential_vtable, NULL, &seq), st, destroy_rest);
  for (; i < n; i++) {
    st = dt_nn_sequential_append(seq, mods[i]); /* owns mods[i], also on failure */
    if (st != DT_OK) {
      i++;
      goto destroy_seq;
    }
  }
  *out = seq;
  return DT_OK;

destroy_seq:
  dt_module_destroy(seq);
destroy_rest:
  for (; mods != NULL && i < n; i++)
    dt_module_destroy(mods[i]);
  return st;
}

dt_status dt_nn_sequential_append(dt_module *seq, dt_module *mod) {
  /* Same type-name pointer = built by dt_nn_sequential (the vtable is private). */
  if (seq == NULL || mod == NULL || dt_module_type_name(seq) != sequential_vtable.type_name) {
    dt_module_destroy(mod);
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "appending to a Sequential: the container is NULL or not a Sequential, or "
                    "the module is NULL");
  }
  /* A module that already has an owner (another container, or seq itself
   * or one of its ancestors) is refused without destroying it: its owner
   * still holds it. */
  int owned = dt_module_parent(mod) != NULL;
  for (const dt_module *a = seq; !owned && a != NULL; a = dt_module_parent(a))
    owned = a == mod;
  if (owned)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "appending a %s module to a Sequential: it already belongs to a module "
                    "(or contains this Sequential): a module has exactly one parent",
                    dt_module_type_name(mod));
  char name[16];
  snprintf(name, sizeof name, "%d", dt_module_num_children(seq));
  dt_status st = dt_module_add_child(seq, name, mod);
  if (st != DT_OK)
    dt_module_destroy(mod);
  return st;
}
