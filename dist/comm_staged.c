/* Host staging of device tensors for the host backends (mpi, local): the
 * fallback where NCCL is missing or refuses (two ranks on one GPU).
 *
 * Everything goes through the device's dt_backend_ops table (streams,
 * events, asynchronous copies, page-locked host memory), never through
 * CUDA directly, so the protocol runs, and is tested, with a stand-in
 * backend on machines without a GPU. Per work, on the communication
 * thread:
 *
 *   comm stream waits on w->ready          (gradients complete on compute)
 *   copy device -> staging, on comm stream
 *   record `copied`, host waits on it      (only this thread blocks)
 *   host collective on the staging memory  (be->run: MPI / shared memory)
 *   copy staging -> device, on comm stream
 *   record w->done_ev on comm stream       (what the compute stream waits on)
 *
 * One staging buffer per communicator suffices: works run one at a time,
 * and the next work's device->host copy is ordered after this work's
 * host->device copy on the same stream.
 */
#include <stdlib.h>
#include <string.h>

#include "core/memory.h"
#include "dist/comm_internal.h"

int dt_comm_can_stage(dt_device dev) {
  if (dev.type == DT_DEVICE_CPU)
    return 0;
  const dt_backend_ops *ops = NULL;
  if (dt_backend_get(dev, &ops) != DT_OK)
    return 0;
  return ops->copy && ops->stream && ops->event_create && ops->event_destroy && ops->event_record &&
         ops->stream_wait_event && ops->event_synchronize && ops->stream_synchronize;
}

static void release_buffer(dt_comm_staging *s) {
  if (s->buf == NULL)
    return;
  if (s->pinned)
    s->ops->host_free(s->buf);
  else
    free(s->buf);
  s->buf = NULL;
  s->cap = 0;
}

void dt_comm_staging_free(dt_comm_staging *s, int broken) {
  if (s->ops == NULL)
    return;
  dt_stream *cs = s->ops->stream(s->dev, DT_STREAM_COMM);
  if (!broken) {
    /* The last copy back to the device may still read the buffer. */
    if (cs != NULL)
      s->ops->stream_synchronize(cs);
    release_buffer(s);
  }
  if (s->copied)
    s->ops->event_destroy(s->copied);
  memset(s, 0, sizeof *s);
}

/* Makes the staging state serve `dev` and hold at least `bytes`. */
static dt_status staging_reserve(dt_comm_staging *s, const dt_backend_ops *ops, dt_device dev,
                                 dt_stream *cs, size_t bytes, dt_work *w, double deadline) {
  if (s->ops != ops || !dt_device_equal(s->dev, dev)) {
    dt_comm_staging_free(s, 0);
    s->ops = ops;
    s->dev = dev;
    DT_CHECK(ops->event_create(dev, &s->copied));
  }
  if (bytes <= s->cap)
    return DT_OK;
  /* A copy back may still read the old buffer. */
  DT_CHECK(ops->event_record(s->copied, cs));
  DT_CHECK(dt_comm_event_wait(ops, s->copied, w, deadline));
  release_buffer(s);
  size_t cap = DT_MIB;
  while (cap < bytes)
    cap *= 2;
  if (ops->host_alloc != NULL) {
    DT_CHECK(ops->host_alloc(cap, &s->buf));
    s->pinned = 1;
  } else {
    s->buf = malloc(cap);
    s->pinned = 0;
    if (s->buf == NULL)
      return DT_ERROR(DT_ERR_OOM, "staging %zu bytes of %s data in host memory: out of memory", cap,
                      ops->name);
  }
  s->cap = cap;
  return DT_OK;
}

dt_status dt_comm_staged_run(dt_comm_staging *s, const dt_comm_backend *be, void *impl, dt_work *w,
                             double deadline) {
  const dt_backend_ops *ops = w->dev_ops;
  dt_stream *cs = ops->stream(w->dev, DT_STREAM_COMM);
  if (cs == NULL) {
    char d[32];
    return DT_ERROR(DT_ERR_UNSUPPORTED, "staging %s data: the %s backend has no comm stream",
                    dt_device_format(w->dev, d, sizeof d), ops->name);
  }
  size_t elem = w->elem;
  size_t in_bytes = (size_t)dt_tensor_numel(w->in) * elem;
  size_t out_bytes = (size_t)dt_tensor_numel(w->out) * elem;
  int in_place = w->in == w->out;
  size_t out_off = in_place ? 0 : (in_bytes + 255) & ~(size_t)255;
  DT_CHECK(staging_reserve(s, ops, w->dev, cs, out_off + out_bytes, w, deadline));
  char *host_in = s->buf, *host_out = (char *)s->buf + out_off;

  if (w->ready != NULL)
    DT_CHECK(ops->stream_wait_event(cs, w->ready));
  /* A broadcast's receivers need no copy up: their data is overwritten. */
  int copy_up = !(w->kind == DT_COLL_BROADCAST && dt_comm_rank(w->comm) != w->root);
  if (copy_up && in_bytes > 0)
    DT_CHECK(ops->copy(host_in, DT_CPU, w->in_data, w->dev, in_bytes, cs));
  DT_CHECK(ops->event_record(s->copied, cs));
  DT_CHECK(dt_comm_event_wait(ops, s->copied, w, deadline)); /* the device may be stuck */

  void *dev_in = w->in_data, *dev_out = w->out_data;
  w->in_data = host_in;
  w->out_data = host_out;
  dt_status st = be->run(impl, w, deadline);
  w->in_data = dev_in;
  w->out_data = dev_out;
  if (st != DT_OK)
    return st;
  if (out_bytes > 0)
    DT_CHECK(ops->copy(dev_out, w->dev, host_out, DT_CPU, out_bytes, cs));
  return ops->event_record(w->done_ev, cs);
}
