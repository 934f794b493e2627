/* Modules: registration, recursive enumeration, hooks, train/eval, device
 * moves. See core/module.h. */
#include "core/module.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nn_internal.h"
#include "core/tensor_internal.h"

typedef struct named_tensor {
  char *name;
  dt_tensor *t; /* owned reference */
} named_tensor;

typedef struct named_child {
  char *name;
  dt_module *m; /* owned */
} named_child;

typedef struct module_hook {
  dt_hook_handle handle;
  dt_forward_pre_hook pre; /* exactly one of pre / post is set */
  dt_forward_hook post;
  void *user;
} module_hook;

/* A recursively flattened list (dotted names), rebuilt when registration
 * anywhere below the module changes. */
typedef struct flat_list {
  int valid;
  int n, cap;
  named_tensor *items; /* t borrowed, name owned */
} flat_list;

struct dt_module {
  const dt_module_vtable *vt;
  void *impl;
  dt_module *parent; /* NULL for a root */
  int training;
  int recompute; /* dt_module_set_recompute */

  named_tensor *params;
  int n_params, cap_params;
  named_tensor *buffers;
  int n_buffers, cap_buffers;
  named_child *children;
  int n_children, cap_children;

  module_hook *pre_hooks;
  int n_pre_hooks, cap_pre_hooks;
  module_hook *hooks;
  int n_hooks, cap_hooks;

  pthread_mutex_t cache_lock; /* guards the lazy rebuild of the flat lists */
  flat_list flat_params;
  flat_list flat_buffers;
};

static dt_status grow(void **items, int *cap, int need, size_t elem, const char *what) {
  if (need <= *cap)
    return DT_OK;
  int ncap = *cap ? *cap * 2 : 4;
  while (ncap < need)
    ncap *= 2;
  void *p = realloc(*items, (size_t)ncap * elem);
  if (p == NULL)
    return DT_ERROR(DT_ERR_OOM, "growing the %s list to %d entries failed: out of host memory",
                    what, ncap);
  *items = p;
  *cap = ncap;
  return DT_OK;
}

static char *copy_string(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p != NULL)
    memcpy(p, s, n);
  return p;
}

static void flat_list_clear(flat_list *l) {
  for (int i = 0; i < l->n; i++)
    free(l->items[i].name);
  l->n = 0;
  l->valid = 0;
}

static void invalidate_caches(dt_module *m) {
  for (; m != NULL; m = m->parent) {
    pthread_mutex_lock(&m->cache_lock);
    flat_list_clear(&m->flat_params);
    flat_list_clear(&m->flat_buffers);
    pthread_mutex_unlock(&m->cache_lock);
  }
}

dt_status dt_module_create(const dt_module_vtable *vt, void *impl, dt_module **out) {
  if (out == NULL || vt == NULL || vt->forward == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "module vtable or out pointer is NULL, or the vtable has no forward: "
                    "give a vtable with at least a forward function");
  dt_module *m = calloc(1, sizeof *m);
  if (m == NULL)
    return DT_ERROR(DT_ERR_OOM, "allocating a %s module failed: out of host memory",
                    vt->type_name ? vt->type_name : "?");
  m->vt = vt;
  m->impl = impl;
  m->training = 1;
  pthread_mutex_init(&m->cache_lock, NULL);
  *out = m;
  return DT_OK;
}

void dt_module_destroy(dt_module *m) {
  if (m == NULL)
    return;
  for (int i = m->n_children - 1; i >= 0; i--) {
    dt_module_destroy(m->children[i].m);
    free(m->children[i].name);
  }
  for (int i = m->n_buffers - 1; i >= 0; i--) {
    dt_tensor_release(m->buffers[i].t);
    free(m->buffers[i].name);
  }
  for (int i = m->n_params - 1; i >= 0; i--) {
    dt_tensor_release(m->params[i].t);
    free(m->params[i].name);
  }
  free(m->children);
  free(m->buffers);
  free(m->params);
  free(m->pre_hooks);
  free(m->hooks);
  flat_list_clear(&m->flat_params);
  flat_list_clear(&m->flat_buffers);
  free(m->flat_params.items);
  free(m->flat_buffers.items);
  pthread_mutex_destroy(&m->cache_lock);
  if (m->vt->destroy != NULL)
    m->vt->destroy(m->impl);
  free(m);
}

void *dt_module_impl(const dt_module *m) { return m->impl; }

const char *dt_module_type_name(const dt_module *m) {
  return m->vt->type_name ? m->vt->type_name : "Module";
}

/* ---- registration ---- */

static int name_taken(const dt_module *m, const char *name) {
  for (int i = 0; i < m->n_params; i++)
    if (strcmp(m->params[i].name, name) == 0)
      return 1;
  for (int i = 0; i < m->n_buffers; i++)
    if (strcmp(m->buffers[i].name, name) == 0)
      return 1;
  for (int i = 0; i < m->n_children; i++)
    if (strcmp(m->children[i].name, name) == 0)
      return 1;
  return 0;
}

static dt_status check_new_name(const dt_module *m, const char *name, const char *what) {
  if (m == NULL || name == NULL || name[0] == '\0' || strchr(name, '.') != NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "registering a %s: module is NULL or the name \"%s\" is empty or contains "
                    "'.': give a non-empty name without dots",
                    what, name ? name : "(null)");
  if (name_taken(m, name))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "registering %s \"%s\" on a %s module: the name is already used by a "
                    "parameter, buffer or child of this module: choose a unique name",
                    what, name, dt_module_type_name(m));
  return DT_OK;
}

static dt_status append_tensor(dt_module *m, named_tensor **list, int *n, int *cap,
                               const char *name, dt_tensor *t, const char *what) {
  DT_CHECK(grow((void **)list, cap, *n + 1, sizeof **list, what));
  char *copy = copy_string(name);
  if (copy == NULL)
    return DT_ERROR(DT_ERR_OOM, "copying the %s name \"%s\" failed: out of host memory", what,
                    name);
  (*list)[*n].name = copy;
  (*list)[*n].t = dt_tensor_retain(t);
  (*n)++;
  invalidate_caches(m);
  return DT_OK;
}

dt_status dt_module_register_parameter(dt_module *m, const char *name, dt_tensor *param) {
  DT_CHECK(check_new_name(m, name, "parameter"));
  if (param == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "registering parameter \"%s\": the tensor is NULL", name);
  if (!dt_tensor_is_leaf(param))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "registering parameter \"%s\": the tensor is the result of an op (not a "
                    "leaf): register a leaf tensor, e.g. a detached copy",
                    name);
  DT_CHECK(dt_tensor_set_requires_grad(param, 1));
  return append_tensor(m, &m->params, &m->n_params, &m->cap_params, name, param, "parameter");
}

dt_status dt_module_register_buffer(dt_module *m, const char *name, dt_tensor *buf) {
  DT_CHECK(check_new_name(m, name, "buffer"));
  if (buf == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "registering buffer \"%s\": the tensor is NULL", name);
  return append_tensor(m, &m->buffers, &m->n_buffers, &m->cap_buffers, name, buf, "buffer");
}

dt_status dt_module_add_child(dt_module *m, const char *name, dt_module *child) {
  DT_CHECK(check_new_name(m, name, "child"));
  if (child == NULL || child == m)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "adding child \"%s\": the child is NULL or the module "
                    "itself",
                    name);
  if (child->parent != NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "adding child \"%s\": the %s module already belongs to another module: a "
                    "module has exactly one parent",
                    name, dt_module_type_name(child));
  for (dt_module *a = m; a != NULL; a = a->parent)
    if (a == child)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "adding child \"%s\": it is an ancestor of the "
                      "module (cycle)",
                      name);
  DT_CHECK(grow((void **)&m->children, &m->cap_children, m->n_children + 1, sizeof *m->children,
                "child"));
  char *copy = copy_string(name);
  if (copy == NULL)
    return DT_ERROR(DT_ERR_OOM, "copying the child name \"%s\" failed: out of host memory", name);
  m->children[m->n_children].name = copy;
  m->children[m->n_children].m = child;
  m->n_children++;
  child->parent = m;
  invalidate_caches(m);
  return DT_OK;
}

static dt_tensor *find_tensor(const named_tensor *list, int n, const char *name) {
  if (name == NULL)
    return NULL;
  for (int i = 0; i < n; i++)
    if (strcmp(list[i].name, name) == 0)
      return list[i].t;
  return NULL;
}

dt_tensor *dt_module_parameter(const dt_module *m, const char *name) {
  return find_tensor(m->params, m->n_params, name);
}

dt_tensor *dt_module_buffer(const dt_module *m, const char *name) {
  return find_tensor(m->buffers, m->n_buffers, name);
}

dt_module *dt_module_child(const dt_module *m, const char *name) {
  if (name == NULL)
    return NULL;
  for (int i = 0; i < m->n_children; i++)
    if (strcmp(m->children[i].name, name) == 0)
      return m->children[i].m;
  return NULL;
}

int dt_module_num_children(const dt_module *m) { return m->n_children; }

dt_module *dt_module_parent(const dt_module *m) { return m->parent; }

dt_module *dt_module_child_at(const dt_module *m, int i) {
  if (i < 0 || i >= m->n_children)
    return NULL;
  return m->children[i].m;
}

/* ---- recursive enumeration ---- */

static int flat_contains(const flat_list *l, const dt_tensor *t) {
  for (int i = 0; i < l->n; i++)
    if (l->items[i].t == t)
      return 1;
  return 0;
}

/* Appends m's tensors (own first, then each child's) with `prefix`.
 * A tensor registered twice (shared weights) is listed once, under its
 * first name, as PyTorch's named_parameters() does. */
static dt_status flatten_into(const dt_module *m, int buffers, const char *prefix, flat_list *l) {
  const named_tensor *own = buffers ? m->buffers : m->params;
  int n_own = buffers ? m->n_buffers : m->n_params;
  for (int i = 0; i < n_own; i++) {
    if (flat_contains(l, own[i].t))
      continue;
    DT_CHECK(grow((void **)&l->items, &l->cap, l->n + 1, sizeof *l->items, "flattened"));
    size_t len = strlen(prefix) + strlen(own[i].name) + 1;
    char *name = malloc(len);
    if (name == NULL)
      return DT_ERROR(DT_ERR_OOM, "building the dotted name of \"%s\": out of host memory",
                      own[i].name);
    snprintf(name, len, "%s%s", prefix, own[i].name);
    l->items[l->n].name = name;
    l->items[l->n].t = own[i].t;
    l->n++;
  }
  for (int c = 0; c < m->n_children; c++) {
    size_t len = strlen(prefix) + strlen(m->children[c].name) + 2;
    char *child_prefix = malloc(len);
    if (child_prefix == NULL)
      return DT_ERROR(DT_ERR_OOM,
                      "building the dotted prefix of child \"%s\": out of host "
                      "memory",
                      m->children[c].name);
    snprintf(child_prefix, len, "%s%s.", prefix, m->children[c].name);
    dt_status st = flatten_into(m->children[c].m, buffers, child_prefix, l);
    free(child_prefix);
    DT_CHECK(st);
  }
  return DT_OK;
}

/* The flattened list, rebuilt if registration changed. NULL on OOM (the
 * enumeration functions then report no entries). */
static const flat_list *flat_get(const dt_module *cm, int buffers) {
  dt_module *m = (dt_module *)cm; /* the cache is logically const */
  flat_list *l = buffers ? &m->flat_buffers : &m->flat_params;
  pthread_mutex_lock(&m->cache_lock);
  if (!l->valid) {
    flat_list_clear(l);
    if (flatten_into(m, buffers, "", l) == DT_OK) {
      l->valid = 1;
    } else {
      flat_list_clear(l);
      l = NULL;
    }
  }
  pthread_mutex_unlock(&m->cache_lock);
  return l;
}

int dt_module_num_parameters(const dt_module *m) {
  const flat_list *l = flat_get(m, 0);
  return l ? l->n : 0;
}

static dt_tensor *flat_at(const flat_list *l, int i, const char **name) {
  if (l == NULL || i < 0 || i >= l->n) {
    if (name != NULL)
      *name = NULL;
    return NULL;
  }
  if (name != NULL)
    *name = l->items[i].name;
  return l->items[i].t;
}

dt_tensor *dt_module_parameter_at(const dt_module *m, int i, const char **name) {
  return flat_at(flat_get(m, 0), i, name);
}

int dt_module_num_buffers(const dt_module *m) {
  const flat_list *l = flat_get(m, 1);
  return l ? l->n : 0;
}

dt_tensor *dt_module_buffer_at(const dt_module *m, int i, const char **name) {
  return flat_at(flat_get(m, 1), i, name);
}

int64_t dt_module_parameter_count(const dt_module *m) {
  const flat_list *l = flat_get(m, 0);
  int64_t total = 0;
  for (int i = 0; l != NULL && i < l->n; i++)
    total += dt_tensor_numel(l->items[i].t);
  return total;
}

/* ---- train / eval ---- */

void dt_module_train(dt_module *m, int training) {
  m->training = training ? 1 : 0;
  for (int i = 0; i < m->n_children; i++)
    dt_module_train(m->children[i].m, training);
}

int dt_module_is_training(const dt_module *m) { return m->training; }

/* ---- device moves ---- */

/* Copies t to dev and rebinds the handle to the copy's storage, so that
 * every holder of the handle sees the moved tensor. The old gradient (on
 * the old device) is dropped. */
static dt_status move_tensor(dt_tensor *t, dt_device dev, const char *name) {
  if (dt_device_equal(dt_tensor_device(t), dev))
    return DT_OK;
  if (!dt_tensor_is_leaf(t))
    return DT_ERROR(DT_ERR_INVALID_ARG, "moving \"%s\": the tensor is not a leaf", name);
  dt_tensor *moved = NULL;
  dt_no_grad_begin();
  dt_status st = dt_tensor_to_device(t, dev, &moved);
  dt_no_grad_end();
  if (st != DT_OK)
    return dt_error_wrap(st, "moving \"%s\"", name);
  dt_tensor_rebind(t, moved->storage, moved->offset);
  dt_tensor_release(moved);
  if (dt_tensor_grad(t) != NULL)
    DT_CHECK(dt_tensor_set_grad(t, NULL));
  return DT_OK;
}

static dt_status move_module(dt_module *m, dt_device dev, const char *prefix) {
  char name[256];
  for (int i = 0; i < m->n_params; i++) {
    snprintf(name, sizeof name, "%s%s", prefix, m->params[i].name);
    DT_CHECK(move_tensor(m->params[i].t, dev, name));
  }
  for (int i = 0; i < m->n_buffers; i++) {
    snprintf(name, sizeof name, "%s%s", prefix, m->buffers[i].name);
    DT_CHECK(move_tensor(m->buffers[i].t, dev, name));
  }
  for (int i = 0; i < m->n_children; i++) {
    snprintf(name, sizeof name, "%s%s.", prefix, m->children[i].name);
    DT_CHECK(move_module(m->children[i].m, dev, name));
  }
  return DT_OK;
}

dt_status dt_module_to(dt_module *m, dt_device dev) {
  if (m == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "module is NULL");
  const dt_backend_ops *be = NULL;
  DT_CHECK(dt_backend_get(dev, &be));
  return move_module(m, dev, "");
}

/* ---- hooks ---- */

/* Registers h on m: a forward pre-hook (pre, h.pre) or a forward hook
 * (h.post). */
static dt_status add_hook(dt_module *m, bool pre, module_hook h, dt_hook_handle *out) {
  if (m == NULL || (pre ? h.pre == NULL : h.post == NULL))
    return DT_ERROR(DT_ERR_INVALID_ARG, "registering a forward %s: module or function is NULL",
                    pre ? "pre-hook" : "hook");
  module_hook **list = pre ? &m->pre_hooks : &m->hooks;
  int *n = pre ? &m->n_pre_hooks : &m->n_hooks, *cap = pre ? &m->cap_pre_hooks : &m->cap_hooks;
  DT_CHECK(grow((void **)list, cap, *n + 1, sizeof **list, "hook"));
  /* One process-wide sequence, shared with grad-ready hooks, so a handle
   * from one module (or tensor) can never remove another's hook. */
  h.handle = dt_hook_handle_next();
  (*list)[(*n)++] = h;
  if (out != NULL)
    *out = h.handle;
  return DT_OK;
}

dt_status dt_module_register_forward_pre_hook(dt_module *m, dt_forward_pre_hook fn, void *user,
                                              dt_hook_handle *out) {
  return add_hook(m, true, (module_hook){0, fn, NULL, user}, out);
}

dt_status dt_module_register_forward_hook(dt_module *m, dt_forward_hook fn, void *user,
                                          dt_hook_handle *out) {
  return add_hook(m, false, (module_hook){0, NULL, fn, user}, out);
}

static int remove_from(module_hook *list, int *n, dt_hook_handle h) {
  for (int i = 0; i < *n; i++) {
    if (list[i].handle == h) {
      memmove(&list[i], &list[i + 1], (size_t)(*n - i - 1) * sizeof *list);
      (*n)--;
      return 1;
    }
  }
  return 0;
}

dt_status dt_module_remove_hook(dt_module *m, dt_hook_handle h) {
  if (m == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "removing hook %d: module is NULL", h);
  if (remove_from(m->pre_hooks, &m->n_pre_hooks, h) || remove_from(m->hooks, &m->n_hooks, h))
    return DT_OK;
  return DT_ERROR(DT_ERR_INVALID_ARG,
                  "removing hook %d from a %s module: no forward or pre-hook with this handle "
                  "(already removed, or registered on another module)",
                  h, dt_module_type_name(m));
}

/* What a hook returned: on success its replacement (if any) takes the place
 * of *t, whose reference it drops; on failure the replacement is dropped. */
static dt_status apply_replacement(dt_status st, dt_tensor *repl, dt_tensor **t) {
  if (st != DT_OK) {
    dt_tensor_release(repl);
    return st;
  }
  if (repl != NULL) {
    dt_tensor_release(*t);
    *t = repl;
  }
  return DT_OK;
}

int dt_module_num_forward_hooks(const dt_module *m) { return m->n_pre_hooks + m->n_hooks; }

void dt_module_set_recompute(dt_module *m, int on) { m->recompute = on ? 1 : 0; }
int dt_module_recompute(const dt_module *m) { return m->recompute; }

dt_status dt_module_call(dt_module *m, dt_tensor *input, dt_tensor **output) {
  if (m == NULL || input == NULL || output == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "calling a module: module, input or output pointer is NULL");
  *output = NULL;
  if (m->recompute && dt_grad_enabled())
    return dt_nn_recompute_call(m, input, output);
  return dt_module_call_recorded(m, input, output);
}

dt_status dt_module_call_recorded(dt_module *m, dt_tensor *input, dt_tensor **output) {
  *output = NULL;
  dt_status st = DT_OK;
  dt_tensor *x = dt_tensor_retain(input); /* released at the end, whatever replaces it */
  dt_tensor *y = NULL;
  for (int i = 0; i < m->n_pre_hooks; i++) {
    dt_tensor *repl = NULL;
    st = m->pre_hooks[i].pre(m, x, &repl, m->pre_hooks[i].user);
    DT_CHECK_GOTO(apply_replacement(st, repl, &x), st, release_input);
  }
  DT_CHECK_GOTO(m->vt->forward(m, x, &y), st, release_input);
  for (int i = 0; i < m->n_hooks; i++) {
    dt_tensor *repl = NULL;
    st = m->hooks[i].post(m, x, y, &repl, m->hooks[i].user);
    DT_CHECK_GOTO(apply_replacement(st, repl, &y), st, release_output);
  }
  *output = y;
  dt_tensor_release(x);
  return DT_OK;

release_output:
  dt_tensor_release(y);
release_input:
  dt_tensor_release(x);
  return st;
}
