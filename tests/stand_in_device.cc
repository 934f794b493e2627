#include "tests/stand_in_device.h"

#include <cstdlib>
#include <map>
#include <mutex>

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

// The asynchronous half's state: page-locked blocks (start -> bytes) and
// their counts, the next event id, and the streams (their addresses are
// the handles).
std::mutex g_mu;
std::map<const char *, size_t> g_pinned;
StandInPinnedCounts g_counts;
int g_next_event = 0;
char g_streams[3];
StandInWatch g_watch = nullptr;

void Show(const StandInCall &call) {
  if (g_watch)
    g_watch(call);
}

dt_status StandInHostAlloc(size_t bytes, void **out) {
  *out = std::malloc(bytes ? bytes : 1);
  if (!*out)
    return DT_ERROR(DT_ERR_OOM, "stand-in: no host memory for %zu page-locked bytes", bytes);
  std::lock_guard<std::mutex> lock(g_mu);
  g_pinned[static_cast<const char *>(*out)] = bytes;
  g_counts.allocs++;
  return DT_OK;
}
void StandInHostFree(void *p) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_pinned.erase(static_cast<const char *>(p));
    g_counts.frees++;
  }
  std::free(p);
}
dt_stream *StandInStreamOf(dt_device, dt_stream_kind kind) { return StandInStream(kind); }
dt_status StandInEventCreate(dt_device, dt_event **out) {
  auto *e = new StandInEvent();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    e->id = g_next_event++;
  }
  *out = reinterpret_cast<dt_event *>(e);
  return DT_OK;
}
void StandInEventDestroy(dt_event *e) { delete AsStandInEvent(e); }
dt_status StandInWatchedAlloc(dt_device dev, size_t bytes, void **out) {
  Show({StandInOp::kAlloc, nullptr, nullptr, nullptr, dev, nullptr, dev, bytes});
  return StandInAlloc(dev, bytes, out);
}
dt_status StandInEventRecord(dt_event *e, dt_stream *s) {
  StandInEvent *ev = AsStandInEvent(e);
  ev->stream = s;
  ev->recorded++;
  Show({StandInOp::kRecord, s, ev, nullptr, {}, nullptr, {}, 0});
  return DT_OK;
}
dt_status StandInStreamWait(dt_stream *s, dt_event *e) {
  Show({StandInOp::kWait, s, AsStandInEvent(e), nullptr, {}, nullptr, {}, 0});
  return DT_OK;
}
dt_status StandInEventSync(dt_event *e) {
  StandInEvent *ev = AsStandInEvent(e);
  ev->synced++;
  Show({StandInOp::kEventSync, nullptr, ev, nullptr, {}, nullptr, {}, 0});
  return DT_OK;
}
dt_status StandInStreamSync(dt_stream *s) {
  Show({StandInOp::kStreamSync, s, nullptr, nullptr, {}, nullptr, {}, 0});
  return DT_OK;
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

namespace {
dt_status StandInWatchedCopy(void *dst, dt_device dst_dev, const void *src, dt_device src_dev,
                             size_t bytes, dt_stream *stream) {
  Show({StandInOp::kCopy, stream, nullptr, dst, dst_dev, src, src_dev, bytes});
  return StandInCopy(dst, dst_dev, src, src_dev, bytes, stream);
}
}  // namespace

dt_backend_ops StandInAsyncOps(const char *name, StandInWatch watch) {
  g_watch = watch;
  dt_backend_ops ops = StandInDeviceOps(name);
  ops.alloc = StandInWatchedAlloc;
  ops.copy = StandInWatchedCopy;
  ops.host_alloc = StandInHostAlloc;
  ops.host_free = StandInHostFree;
  ops.stream = StandInStreamOf;
  ops.event_create = StandInEventCreate;
  ops.event_destroy = StandInEventDestroy;
  ops.event_record = StandInEventRecord;
  ops.stream_wait_event = StandInStreamWait;
  ops.event_synchronize = StandInEventSync;
  ops.stream_synchronize = StandInStreamSync;
  return ops;
}

StandInEvent *AsStandInEvent(dt_event *e) { return reinterpret_cast<StandInEvent *>(e); }

dt_stream *StandInStream(dt_stream_kind kind) {
  int k = kind == DT_STREAM_COPY ? 1 : kind == DT_STREAM_COMM ? 2 : 0;
  return reinterpret_cast<dt_stream *>(&g_streams[k]);
}

const char *StandInStreamName(const dt_stream *s) {
  static const char *const names[3] = {"compute", "copy", "comm"};
  for (int k = 0; k < 3; k++)
    if (s == reinterpret_cast<const dt_stream *>(&g_streams[k]))
      return names[k];
  return "";
}

bool StandInIsPinned(const void *p, size_t bytes) {
  const char *c = static_cast<const char *>(p);
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_pinned.upper_bound(c);
  return it != g_pinned.begin() && (--it, c + bytes <= it->first + it->second);
}

StandInPinnedCounts StandInPinned() {
  std::lock_guard<std::mutex> lock(g_mu);
  StandInPinnedCounts c = g_counts;
  c.live = static_cast<int>(g_pinned.size());
  return c;
}

void ResetStandInPinned() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_counts = StandInPinnedCounts();
  g_next_event = 0;
}

}  // namespace dtt
