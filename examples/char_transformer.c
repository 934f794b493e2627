/* A character-level transformer on text of its own, through the public API: DDP under mpirun
 * (global batch 16 on any world), bf16, a checkpoint. cc FILE $(pkg-config dtrain ...) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain.h"

enum { T = 32, C = 64, HEADS = 4, V = 96, BATCH = 16 }; /* V: printable ASCII */

static const char *TEXT =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the winter "
    "of despair, we had everything before us, we had nothing before us, we were all going direct "
    "to Heaven, we were all going direct the other way. There were a king with a large jaw and a "
    "queen with a plain face, on the throne of England; there were a king with a large jaw and a "
    "queen with a fair face, on the throne of France. In both countries it was clearer than "
    "crystal to the lords of the State preserves of loaves and fishes, that things in general "
    "were settled for ever. It was the year of Our Lord one thousand seven hundred and "
    "seventy-five.";

typedef struct tiny { /* the children, and the learned positions (T, C) */
  dt_module *tok, *ln1, *qkv, *proj, *ln2, *fc, *gelu, *out, *ln_f, *head;
  dt_tensor *pos;
} tiny;

/* x += f3(f2(f1(norm(x)))), f2 the causal attention when f2 is NULL. */
static dt_status residual(dt_module *norm, dt_module *f1, dt_module *f2, dt_module *f3,
                          dt_tensor **x) {
  dt_tensor *h = NULL, *a = NULL, *b = NULL, *c = NULL, *y = NULL;
  dt_status st = dt_module_call(norm, *x, &h);
  if (st == DT_OK && (st = dt_module_call(f1, h, &a)) == DT_OK) /* qkv (B,T,3C), fc (B,T,4C) */
    st = f2 ? dt_module_call(f2, a, &b) : dt_op_causal_attention(a, HEADS, &b);
  if (st == DT_OK && (st = dt_module_call(f3, b, &c)) == DT_OK)
    st = dt_op_add(*x, c, &y);
  dt_tensor_release(h), dt_tensor_release(a), dt_tensor_release(b), dt_tensor_release(c);
  if (st == DT_OK)
    dt_tensor_release(*x), *x = y;
  return st;
}

/* ids (B, T) -> logits (B, T, V): embeddings, one block, the head. */
static dt_status tiny_forward(dt_module *m, dt_tensor *ids, dt_tensor **out) {
  tiny *t = dt_module_impl(m);
  dt_tensor *e = NULL, *x = NULL, *z = NULL;
  DT_CHECK(dt_module_call(t->tok, ids, &e)); /* (B, T, C) */
  dt_status st = dt_op_add(e, t->pos, &x);   /* (B, T, C) + (T, C) */
  dt_tensor_release(e);
  if (st == DT_OK && (st = residual(t->ln1, t->qkv, NULL, t->proj, &x)) == DT_OK)
    st = residual(t->ln2, t->fc, t->gelu, t->out, &x);
  if (st == DT_OK && (st = dt_module_call(t->ln_f, x, &z)) == DT_OK)
    st = dt_module_call(t->head, z, out);
  dt_tensor_release(z), dt_tensor_release(x);
  return st;
}

static const dt_module_vtable TINY = {"TinyCharTransformer", tiny_forward, free};

static dt_status tiny_build(const dt_task *task, uint64_t seed, dt_module **out) {
  (void)task;
  dt_generator gen;
  dt_generator_init(&gen, seed);
  tiny *t = calloc(1, sizeof *t);
  DT_CHECK(dt_module_create(&TINY, t, out));
  int64_t shape[2] = {T, C};
  static const float zeros[T * C];
  dt_status st = dt_tensor_from_host(zeros, shape, 2, DT_DTYPE_F32, DT_CPU, &t->pos);
  if (st == DT_OK)
    st = dt_module_register_parameter(*out, "pos", t->pos); /* learned positions */
#define CHILD(name, make)                                             \
  if (st == DT_OK && (st = (make)) == DT_OK) /* the parent owns it */ \
    st = dt_module_add_child(*out, #name, t->name);
  CHILD(tok, dt_nn_embedding(V, C, &gen, &t->tok))
  CHILD(ln1, dt_nn_layer_norm(C, 1e-5f, &t->ln1))
  CHILD(qkv, dt_nn_linear(C, 3 * C, 1, &gen, &t->qkv))
  CHILD(proj, dt_nn_linear(C, C, 1, &gen, &t->proj))
  CHILD(ln2, dt_nn_layer_norm(C, 1e-5f, &t->ln2))
  CHILD(fc, dt_nn_linear(C, 4 * C, 1, &gen, &t->fc))
  CHILD(gelu, dt_nn_gelu(&t->gelu))
  CHILD(out, dt_nn_linear(4 * C, C, 1, &gen, &t->out))
  CHILD(ln_f, dt_nn_layer_norm(C, 1e-5f, &t->ln_f))
  CHILD(head, dt_nn_linear(C, V, 0, &gen, &t->head))
  if (st != DT_OK)
    dt_module_destroy(*out), *out = NULL;
  return st;
}

/* The data source: windows of T characters, targets the next character;
 * the first 85% of the text trains, the rest validates. */
static dt_status text_open(const dt_task *task, const dt_task_data *data, const char *folder,
                           const char *split, dt_dataset **out) {
  (void)task, (void)data, (void)folder;
  int64_t len = (int64_t)strlen(TEXT), cut = len * 85 / 100;
  int64_t from = strcmp(split, "train") ? cut : 0, to = strcmp(split, "train") ? len : cut;
  int64_t n = (to - from - T - 1) / 2 + 1; /* a window every 2 characters */
  int32_t *x = malloc(n * T * sizeof *x), *y = malloc(n * T * sizeof *y);
  for (int64_t k = 0; k < n * T; k++) /* window k / T, character k % T */
    y[k] = TEXT[from + 2 * (k / T) + k % T + 1] - 32, x[k] = TEXT[from + 2 * (k / T) + k % T] - 32;
  dt_sample_layout lay = {DT_DTYPE_I32, 1, {T}, DT_DTYPE_I32, 1, {T}};
  dt_status st = dt_dataset_from_memory(&lay, x, y, n, V, out);
  free(x), free(y);
  return st;
}

static dt_status next_char_loss(dt_tensor *y, dt_tensor *target, dt_reduction r, dt_tensor **l) {
  return dt_task_loss_next_token_of(y, target, V, r, l);
}

static const dt_task_data TEXT_DATA = {"tiny-text", V, 0.0f, 1.0f, text_open};
/* The task (models/tasks.h): the model, its input, its data, the loss, what evaluates. */
/* clang-format off */
static const dt_task TASK = {.name = "tiny-char-transformer", .summary = "1 block, 64 wide",
    .build = tiny_build, .input_ndim = 1, .input_shape = {T}, .input_dtype = DT_DTYPE_I32,
    .input_range = V, .num_classes = V, .sequence_targets = true, .data = &TEXT_DATA, .n_data = 1,
    .loss = next_char_loss, .eval_split = "val", .result = DT_TASK_RESULT_LOSS};
/* clang-format on */

static dt_status on_saved(void *user, const char *dir, int64_t step) {
  printf("checkpoint of step %lld: %s\n", (long long)step, dir), (void)user;
  return DT_OK;
}

int main(void) {
  dt_pg *pg = NULL; /* MPI under mpirun, else one process */
  dt_pg_config pc = DT_PG_CONFIG_DEFAULT;
  if (dt_pg_create(&pc, &pg) != DT_OK)
    return fprintf(stderr, "char_transformer: %s\n", dt_last_error()), 1;
  int world = dt_pg_world_size(pg), rank = dt_pg_rank(pg);
  dt_train_config cfg = dt_train_config_default();
  cfg.task = &TASK;
  cfg.data_dir = NULL; /* the data set is in memory */
  cfg.pg = pg;
  cfg.batch = BATCH / world; /* per rank: the same global batch on any world */
  cfg.optimizer = DT_TRAIN_ADAMW;
  cfg.lr = 3e-3f;
  cfg.epochs = 2;
  cfg.eval_batch = 64;
  cfg.precision = DT_PRECISION_BF16;
  cfg.run_dir_default = true; /* runs/<task>-<data>-<time>: the checkpoint at the end */
  cfg.hooks.checkpoint_saved = on_saved;
  dt_status st = dt_train_run(&cfg, rank == 0 ? stdout : NULL, NULL); /* ends val_loss=... */
  if (st != DT_OK)
    fprintf(stderr, "char_transformer: rank %d: %s\n", rank, dt_last_error());
  dt_pg_destroy(pg);
  return st == DT_OK ? 0 : 1;
}
