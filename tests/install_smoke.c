/* A program of an embedder, built against an installed dtrain with nothing
 * but dtrain.h and pkg-config (tests/install_test.sh): a two-layer MLP on
 * fixed data, forward, cross-entropy, backward and one SGD step on the CPU;
 * prints the loss before and after the step. */
#include <dtrain.h>
#include <stdio.h>

#define TRY(x)                                                                \
  do {                                                                        \
    if ((x) != DT_OK) {                                                       \
      fprintf(stderr, "install_smoke: %s failed: %s\n", #x, dt_last_error()); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static int loss_of(dt_module *model, dt_tensor *x, dt_tensor *y, dt_tensor **loss) {
  dt_tensor *logits = NULL;
  TRY(dt_module_call(model, x, &logits));
  dt_status st = dt_op_cross_entropy(logits, y, DT_REDUCTION_MEAN, DT_IGNORE_INDEX, loss);
  dt_tensor_release(logits);
  TRY(st);
  return 0;
}

int main(void) {
  enum { N = 8, IN = 4, HIDDEN = 16, CLASSES = 3 };
  float xs[N * IN];
  int32_t ys[N];
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < IN; j++)
      xs[i * IN + j] = (float)((i * 7 + j * 3) % 11) / 11.0f - 0.5f;
    ys[i] = i % CLASSES;
  }
  const int64_t xshape[2] = {N, IN}, yshape[1] = {N};
  dt_tensor *x = NULL, *y = NULL;
  TRY(dt_tensor_from_host(xs, xshape, 2, DT_DTYPE_F32, DT_CPU, &x));
  TRY(dt_tensor_from_host(ys, yshape, 1, DT_DTYPE_I32, DT_CPU, &y));

  dt_generator gen;
  dt_generator_init(&gen, 1234);
  dt_module *layers[3] = {NULL, NULL, NULL};
  TRY(dt_nn_linear(IN, HIDDEN, 1, &gen, &layers[0]));
  TRY(dt_nn_relu(&layers[1]));
  TRY(dt_nn_linear(HIDDEN, CLASSES, 1, &gen, &layers[2]));
  dt_module *model = NULL;
  TRY(dt_nn_sequential(layers, 3, &model));
  dt_param_arena *arena = NULL;
  TRY(dt_param_arena_create(model, &arena));
  dt_sgd_config sgd = DT_SGD_CONFIG_DEFAULT;
  sgd.lr = 0.5f;
  dt_optimizer *opt = NULL;
  TRY(dt_optim_sgd_create(arena, &sgd, &opt));

  dt_tensor *loss = NULL;
  double before = 0, after = 0;
  if (loss_of(model, x, y, &loss))
    return 1;
  TRY(dt_tensor_item(loss, 0, &before));
  TRY(dt_backward(loss, NULL));
  TRY(dt_optim_step(opt));
  TRY(dt_optim_zero_grad(opt));
  dt_tensor_release(loss);
  loss = NULL;
  if (loss_of(model, x, y, &loss))
    return 1;
  TRY(dt_tensor_item(loss, 0, &after));
  dt_tensor_release(loss);

  printf("loss %.9g -> %.9g\n", before, after);
  dt_optim_destroy(opt);
  dt_param_arena_destroy(arena);
  dt_module_destroy(model);
  dt_tensor_release(x);
  dt_tensor_release(y);
  return after < before ? 0 : 1;
}
