/* Models by name, for the command line and the benchmarks. */
#include <stdio.h>
#include <string.h>

#include "models/models.h"

static dt_status build_mlp(uint64_t seed, dt_module **out) {
  static const int sizes[] = {784, 512, 512, 10};
  return dt_model_mlp(sizes, 4, seed, out);
}

static dt_status build_lenet(uint64_t seed, dt_module **out) {
  return dt_model_lenet5(10, seed, out);
}

typedef struct model_entry {
  const char *name;
  dt_status (*build)(uint64_t seed, dt_module **out);
} model_entry;

static const model_entry known_models[] = {
    {"mlp", build_mlp},
    {"lenet", build_lenet},
};

#define NUM_MODELS ((int)(sizeof known_models / sizeof known_models[0]))

const char *dt_model_name(int i) { return i >= 0 && i < NUM_MODELS ? known_models[i].name : NULL; }

dt_status dt_model_create(const char *name, uint64_t seed, dt_module **out) {
  if (out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating model \"%s\": out is NULL",
                    name ? name : "(null)");
  for (int i = 0; name != NULL && i < NUM_MODELS; i++)
    if (strcmp(name, known_models[i].name) == 0)
      return known_models[i].build(seed, out);
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; i < NUM_MODELS && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                             known_models[i].name);
  return DT_ERROR(DT_ERR_INVALID_ARG, "unknown model \"%s\": known models are %s",
                  name ? name : "(null)", list);
}
