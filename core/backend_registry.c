/* The backend registry: one table per device type. */
#include <stdio.h>

#include "core/backend.h"

static const dt_backend_ops *registry[2];

dt_status dt_backend_register(dt_device_type type, const dt_backend_ops *ops) {
  if ((int)type < 0 || (int)type > DT_DEVICE_CUDA)
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown device type %d", (int)type);
  registry[type] = ops;
  return DT_OK;
}

int dt_device_count(dt_device_type type) {
  if ((int)type < 0 || (int)type > DT_DEVICE_CUDA || registry[type] == NULL)
    return 0;
  return registry[type]->device_count();
}

dt_status dt_backend_get(dt_device dev, const dt_backend_ops **out) {
  if ((int)dev.type < 0 || (int)dev.type > DT_DEVICE_CUDA)
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown device type %d", (int)dev.type);
  const dt_backend_ops *ops = registry[dev.type];
  if (ops != NULL && dev.index >= 0 && dev.index < ops->device_count()) {
    *out = ops;
    return DT_OK;
  }
  char name[32];
  dt_device_format(dev, name, sizeof name);
  if (ops == NULL && dev.type == DT_DEVICE_CPU)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "device %s requested but the CPU backend is not linked into this program: "
                    "link //core:cpu (or //core)",
                    name);
  if (ops == NULL) {
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "device %s requested but this build of dtrain has no CUDA backend: "
                    "rebuild with the CUDA toolkit present (see `dtrain doctor`), or use "
                    "--device cpu",
                    name);
  }
  int n = ops->device_count();
  if (dev.index < 0 || dev.index >= n) {
    if (n == 0 && ops->unavailable != NULL) {
      dt_status why = ops->unavailable();
      if (why != DT_OK)
        return dt_error_wrap(why,
                             "device %s requested but unusable (run `dtrain doctor`; or use "
                             "--device cpu)",
                             name);
    }
    if (dev.type == DT_DEVICE_CUDA && n == 0)
      return DT_ERROR(DT_ERR_NO_DEVICE,
                      "device %s requested but no CUDA GPU is visible (CUDA_VISIBLE_DEVICES, "
                      "driver); run `dtrain doctor` for details, or use --device cpu",
                      name);
    return DT_ERROR(DT_ERR_NO_DEVICE, "device %s does not exist: %d %s device(s) available", name,
                    n, ops->name);
  }
  *out = ops;
  return DT_OK;
}
