// A stand-in device for tests of the asynchronous paths (pinned memory,
// streams, events) on machines without a GPU: the CPU backend's table
// registered as device type CUDA, its memory host memory accounted as
// cpu:<index>. A test overrides the entries it watches (events, streams,
// host_alloc, copy, ...) and registers the table.
#ifndef DT_TESTS_STAND_IN_DEVICE_H
#define DT_TESTS_STAND_IN_DEVICE_H

#include <cstddef>

#include "core/backend.h"

namespace dtt {

// The CPU table named `name`, with alloc, free, memset_zero and copy
// working on the stand-in's (host) memory.
dt_backend_ops StandInDeviceOps(const char *name);

// The stand-in's copy (what a watching copy calls once it has looked):
// between stand-in and host memory, synchronous; the stream is not used.
dt_status StandInCopy(void *dst, dt_device dst_dev, const void *src, dt_device src_dev,
                      size_t bytes, dt_stream *stream);

}  // namespace dtt

#endif
