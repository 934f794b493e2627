/* Reference models, each built from core modules (core/nn.h) as a
 * dt_module whose forward maps a batch of inputs to logits.
 *
 * Parameters are drawn from a generator seeded with `seed` in registration
 * order, so the same seed gives the same model on every rank. Models are
 * created on the CPU; move them with dt_module_to().
 */
#ifndef DT_MODELS_MODELS_H
#define DT_MODELS_MODELS_H

#include <stdint.h>

#include "core/module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Multi-layer perceptron: Flatten, then Linear(sizes[i], sizes[i+1]) for
 * each consecutive pair, with ReLU between (not after the last). Input
 * (N, ...) with prod(...) == sizes[0] (so (N,1,28,28) works for sizes[0] =
 * 784) -> logits (N, sizes[n_sizes-1]). A Sequential: children "0"
 * (Flatten), "1" (Linear), "2" (ReLU), "3" (Linear), ...; parameter names
 * "1.weight", "1.bias", "3.weight", ...
 * The classic MNIST MLP is sizes {784, 512, 512, 10} (669,706 parameters).
 * n_sizes >= 2, every size > 0; DT_ERR_INVALID_ARG otherwise. */
dt_status dt_model_mlp(const int *sizes, int n_sizes, uint64_t seed, dt_module **out);

/* LeNet-5 (modern variant: ReLU and max-pooling) for (N,1,28,28) inputs:
 *   features:   Conv2d(1,6,5,pad 2) ReLU MaxPool2d(2) Conv2d(6,16,5) ReLU MaxPool2d(2)
 *   classifier: Flatten Linear(400,120) ReLU Linear(120,84) ReLU Linear(84,num_classes)
 * -> logits (N, num_classes). Children "features" and "classifier"
 * (Sequentials), so parameters are "features.0.weight", "features.0.bias",
 * "features.3.weight", ..., "classifier.1.weight", ..., "classifier.5.bias".
 * 61,706 parameters for 10 classes. */
dt_status dt_model_lenet5(int num_classes, uint64_t seed, dt_module **out);

/* Builds the model of task `name` (models/tasks.h) with its default
 * configuration:
 *   "mlp"   MLP 784-512-512-10
 *   "lenet" LeNet-5, 10 classes
 * An unknown name is DT_ERR_INVALID_ARG with the list of known names. */
dt_status dt_model_create(const char *name, uint64_t seed, dt_module **out);

/* The i-th registered model name (i from 0), NULL past the last: the list
 * the command line offers for --model. */
const char *dt_model_name(int i);

#ifdef __cplusplus
}
#endif
#endif
