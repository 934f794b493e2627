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

// ---- the asynchronous entries, for the tests that watch them ----
// StandInAsyncOps(name, watch): StandInDeviceOps(name) with page-locked
// host memory it keeps track of, one handle per stream kind, events
// (StandInEvent) that remember where they were recorded, and every device
// allocation, event record, stream wait, synchronisation and copy shown to
// `watch` (on the calling thread) before it is done. One stand-in per
// process: the last call's watch is the one called. Thread-safe.
struct StandInEvent {
  int id = 0;                   // in order of creation, from 0
  dt_stream *stream = nullptr;  // where it was last recorded
  long pos = 0;                 // the watch's own position on that stream then
  int recorded = 0, synced = 0;
};
StandInEvent *AsStandInEvent(dt_event *e);

enum class StandInOp { kAlloc, kRecord, kWait, kEventSync, kStreamSync, kCopy };
struct StandInCall {
  StandInOp op;
  dt_stream *stream;    // record, wait, stream sync, copy
  StandInEvent *event;  // record (already updated), wait, event sync
  void *dst;            // copy
  dt_device dst_dev;
  const void *src;
  dt_device src_dev;
  size_t bytes;  // alloc, copy
};
using StandInWatch = void (*)(const StandInCall &call);
dt_backend_ops StandInAsyncOps(const char *name, StandInWatch watch);

// The stream handle of a kind (DT_STREAM_COMPUTE, _COPY, _COMM), and the
// name of a handle ("compute", "copy", "comm"; "" for any other).
dt_stream *StandInStream(dt_stream_kind kind);
const char *StandInStreamName(const dt_stream *s);

// The page-locked blocks: whether [p, p + bytes) lies in one that is
// allocated; how many were allocated and freed since ResetStandInPinned
// (which also restarts the event ids), and how many are allocated now.
bool StandInIsPinned(const void *p, size_t bytes);
struct StandInPinnedCounts {
  int allocs = 0, frees = 0, live = 0;
};
StandInPinnedCounts StandInPinned();
void ResetStandInPinned();

}  // namespace dtt

#endif
