#include "tests/stand_in_device.h"

#include "core/cpu.h"

namespace dtt {
namespace {

// The stand-in device's memory is host memory, accounted as cpu:<index>.
dt_device AsCpu(dt_device d) { return {DT_DEVICE_CPU, d.index}; }

dt_status StandInAlloc(dt_device dev, size_t bytes, void **out) {
  return dt_cpu_backend()->alloc(AsCpu(dev), bytes, out);
}
void StandInFree(dt_device dev, void *p, size_t bytes) {
  dt_cpu_backend()->free(AsCpu(dev), p, bytes);
}
dt_status StandInMemsetZero(dt_device dev, void *p, size_t bytes) {
  return dt_cpu_backend()->memset_zero(AsCpu(dev), p, bytes);
}

}  // namespace

dt_status StandInCopy(void *dst, dt_device dst_dev, const void *src, dt_device src_dev,
                      size_t bytes, dt_stream *) {
  return dt_cpu_backend()->copy(dst, AsCpu(dst_dev), src, AsCpu(src_dev), bytes, nullptr);
}

dt_backend_ops StandInDeviceOps(const char *name) {
  dt_backend_ops ops = *dt_cpu_backend();
  ops.name = name;
  ops.alloc = StandInAlloc;
  ops.free = StandInFree;
  ops.memset_zero = StandInMemsetZero;
  ops.copy = StandInCopy;
  return ops;
}

}  // namespace dtt
