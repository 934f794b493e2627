/* LeNet-5, modern variant (see models/models.h). */
#include "core/nn.h"
#include "models/models.h"

static dt_status build_features(dt_generator *gen, dt_module **out) {
  dt_module *mods[6] = {0};
  dt_status st = DT_OK;
  /* (N,1,28,28) -> (N,6,28,28) -> (N,6,14,14) -> (N,16,10,10) -> (N,16,5,5) */
  DT_CHECK_GOTO(dt_nn_conv2d(1, 6, 5, 1, 2, 1, gen, &mods[0]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_relu(&mods[1]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_max_pool2d(2, 2, 0, &mods[2]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_conv2d(6, 16, 5, 1, 0, 1, gen, &mods[3]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_relu(&mods[4]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_max_pool2d(2, 2, 0, &mods[5]), st, destroy_mods);
  return dt_nn_sequential(mods, 6, out);

destroy_mods:
  for (int i = 0; i < 6; i++)
    dt_module_destroy(mods[i]);
  return st;
}

static dt_status build_classifier(int num_classes, dt_generator *gen, dt_module **out) {
  dt_module *mods[6] = {0};
  dt_status st = DT_OK;
  /* (N,16,5,5) -> (N,400) -> (N,120) -> (N,84) -> (N,num_classes) */
  DT_CHECK_GOTO(dt_nn_flatten(&mods[0]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_linear(400, 120, 1, gen, &mods[1]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_relu(&mods[2]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_linear(120, 84, 1, gen, &mods[3]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_relu(&mods[4]), st, destroy_mods);
  DT_CHECK_GOTO(dt_nn_linear(84, num_classes, 1, gen, &mods[5]), st, destroy_mods);
  return dt_nn_sequential(mods, 6, out);

destroy_mods:
  for (int i = 0; i < 6; i++)
    dt_module_destroy(mods[i]);
  return st;
}

dt_status dt_model_lenet5(int num_classes, uint64_t seed, dt_module **out) {
  if (num_classes <= 0 || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "LeNet-5 with %d classes: need at least one class",
                    num_classes);
  dt_status st = DT_OK;
  dt_generator gen;
  dt_generator_init(&gen, seed);
  dt_module *model = NULL, *features = NULL, *classifier = NULL;
  DT_CHECK(dt_nn_sequential(NULL, 0, &model));
  DT_CHECK_GOTO(build_features(&gen, &features), st, destroy_model);
  /* A Sequential runs its children in order whatever their names. */
  st = dt_module_add_child(model, "features", features);
  if (st != DT_OK) {
    dt_module_destroy(features);
    goto destroy_model;
  }
  DT_CHECK_GOTO(build_classifier(num_classes, &gen, &classifier), st, destroy_model);
  st = dt_module_add_child(model, "classifier", classifier);
  if (st != DT_OK) {
    dt_module_destroy(classifier);
    goto destroy_model;
  }
  *out = model;
  return DT_OK;

destroy_model:
  dt_module_destroy(model);
  return dt_error_wrap(st, "building LeNet-5");
}
