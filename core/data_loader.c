/* The background loader.
 *
 * `workers` threads per epoch fill a ring of max(prefetch, workers) host
 * batch buffers (gathering samples with dt_dataset_get_sample_at, in the
 * dataset's sample layout: images and labels, token windows, ...) while
 * the caller trains; the caller's dt_loader_next takes the oldest batch
 * once its slot is ready, copies it to the device and hands the slot back.
 *
 *   worker:   wait for a free slot -> claim batch b = claimed++ -> fill slot
 *             b % ring -> mark it ready
 *   consumer: wait for slot taken % ring to be ready -> copy slot ->
 *             unmark it, consumed++
 *
 * A worker claims batch b only while b - consumed < ring, so no two workers
 * share a slot and none touches the slot being copied; batches finish in
 * any order but are handed out in order, so the result does not depend on
 * the number of workers.
 *
 * On a device whose backend offers page-locked host memory (CUDA), the slots
 * are allocated there and dt_loader_next copies a batch asynchronously on
 * the device's copy stream, records an event, and makes the compute stream
 * wait on it: the caller's kernels queue behind the copy without the host
 * waiting. The slot goes back to the worker at once; the worker waits for
 * the slot's copy event before it refills the slot, so the caller's thread
 * never waits for a transfer.
 *
 * The copies land in device buffers the loader keeps (DEVICE_RING pairs,
 * the batch tensors are views of them), so that a copy waits only for the
 * compute work that last read its own buffer, not for all queued compute:
 *   - a buffer goes back into use once no tensor but the loader's refers to
 *     it; at the first dt_loader_next that sees this, an event is recorded
 *     on the compute stream (all kernels that read the batch were queued
 *     before the caller let go of it), and the copy into the buffer waits
 *     on that event only, so the upload of batch k+1 runs while batch k
 *     computes;
 *   - a buffer the loader has just allocated, and every batch when the
 *     caller still holds all the buffers (or a short last batch), come
 *     fresh from the allocator, whose blocks are cached for the compute
 *     stream and may still be read by queued kernels: those copies wait for
 *     all compute queued so far.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/data.h"
#include "core/tensor_internal.h"
#include "core/trace.h"

#define LOADER_ERROR_MAX 2048
#define DEVICE_RING 2

typedef struct batch_slot {
  dt_event *copied; /* async path: the copy out of this slot has completed */
  int copy_pending; /* `copied` recorded: the worker waits on it before a refill */
  uint8_t *inputs;  /* (batch_size, input) host, in the layout's dtype */
  uint8_t *labels;  /* (batch_size, target) host */
  int64_t count;    /* samples in this batch */
  int ready;        /* filled and not yet handed back (guarded by mu) */
  dt_status status;
  char error[LOADER_ERROR_MAX]; /* the worker's message when status != DT_OK */
} batch_slot;

struct dt_loader {
  const dt_dataset *dataset;
  dt_sampler *sampler;
  dt_loader_config cfg;
  size_t input_bytes, target_bytes; /* of one sample */
  int ring_size;
  batch_slot *ring;

  pthread_mutex_t mu;
  pthread_cond_t filled; /* worker -> consumer: a slot became ready */
  pthread_cond_t freed;  /* consumer -> worker: consumed advanced, or stop */
  int64_t num_batches;   /* this epoch, from first_batch on */
  int64_t first_batch;   /* batches of the epoch skipped (a resumed run) */
  int64_t epoch;
  int64_t claimed;  /* batches workers have taken on this epoch (guarded by mu) */
  int failed;       /* a worker failed: the others claim nothing more (mu) */
  int64_t consumed; /* slots handed back this epoch (guarded by mu) */
  int64_t taken;    /* slots the consumer has read (>= consumed) */
  const dt_backend_ops *be;
  int async_copy;      /* pinned slots + copy stream (see the top) */
  atomic_int stop;     /* ask the workers to quit (checked per sample) */
  int workers_running; /* threads that exist and must be joined */
  pthread_t *workers;  /* cfg.workers */
  int epoch_started;

  /* async path: the device buffers of full batches (see the top) */
  struct device_buffer {
    dt_storage *inputs, *labels; /* NULL until first used */
    dt_event *released;          /* recorded on compute once only the loader refers to them */
    int in_use;                  /* handed out; not yet seen released */
    uint64_t released_at;        /* release order (oldest first reuse) */
  } dev_ring[DEVICE_RING];
  uint64_t releases;
  dt_event *fresh_fence; /* the copy stream waits for all queued compute */
};

/* Host memory for a slot: page-locked when the backend offers it, else
 * plain aligned memory. */
static void *host_buffer_alloc(const dt_loader *l, size_t bytes) {
  void *p = NULL;
  if (l->async_copy)
    return l->be->host_alloc(bytes ? bytes : 64, &p) == DT_OK ? p : NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return NULL;
  return p;
}

static void host_buffer_free(const dt_loader *l, void *p) {
  if (p == NULL)
    return;
  if (l->async_copy)
    l->be->host_free(p);
  else
    free(p);
}

static int64_t batches_for(int64_t samples, int batch_size, int drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

/* Fills slot for batch b; records a failure in the slot. */
static void fill_slot(dt_loader *l, int64_t b, batch_slot *slot) {
  const int64_t *idx = dt_sampler_indices(l->sampler);
  int64_t len = dt_sampler_length(l->sampler);
  int64_t first = b * l->cfg.batch_size;
  int64_t count = len - first < l->cfg.batch_size ? len - first : l->cfg.batch_size;
  slot->count = count;
  slot->status = DT_OK;
  slot->error[0] = '\0';
  for (int64_t k = 0; k < count; k++) {
    if (atomic_load(&l->stop))
      return;
    dt_status st = dt_dataset_get_sample_at(l->dataset, idx[first + k], l->epoch,
                                            slot->inputs + (size_t)k * l->input_bytes,
                                            slot->labels + (size_t)k * l->target_bytes);
    if (st != DT_OK) {
      slot->status = st;
      snprintf(slot->error, sizeof slot->error, "sample %lld (batch %lld): %s",
               (long long)idx[first + k], (long long)b, dt_last_error());
      return;
    }
  }
}

/* Hands slot's batch to the consumer (and a failure stops the claims). */
static void publish_slot(dt_loader *l, batch_slot *slot) {
  pthread_mutex_lock(&l->mu);
  slot->ready = 1;
  if (slot->status != DT_OK)
    l->failed = 1;
  pthread_cond_broadcast(&l->filled);
  pthread_mutex_unlock(&l->mu);
}

static void *worker_main(void *arg) {
  dt_loader *l = arg;
  for (;;) {
    pthread_mutex_lock(&l->mu);
    while (!atomic_load(&l->stop) && !l->failed && l->claimed < l->num_batches &&
           l->claimed - l->consumed >= l->ring_size)
      pthread_cond_wait(&l->freed, &l->mu);
    int done = atomic_load(&l->stop) || l->failed || l->claimed >= l->num_batches;
    int64_t b = l->claimed;
    if (!done)
      l->claimed++;
    pthread_mutex_unlock(&l->mu);
    if (done)
      return NULL;

    batch_slot *slot = &l->ring[b % l->ring_size];
    if (slot->copy_pending) { /* the copy out of the slot's last batch must be done */
      slot->copy_pending = 0;
      dt_status st = l->be->event_synchronize(slot->copied);
      if (st != DT_OK) {
        slot->status = st;
        snprintf(slot->error, sizeof slot->error, "waiting for the upload of batch %lld: %s",
                 (long long)(b - l->ring_size), dt_last_error());
        publish_slot(l, slot);
        return NULL;
      }
    }
    double span = dt_trace_begin(DT_TRACE_LANE_LOADER, "load batch");
    fill_slot(l, l->first_batch + b, slot);
    dt_trace_end(DT_TRACE_LANE_LOADER, "load batch", span);
    if (atomic_load(&l->stop))
      return NULL;
    publish_slot(l, slot); /* after a failure the consumer reports it; nothing more is claimed */
  }
}

static void stop_worker(dt_loader *l) {
  if (!l->workers_running)
    return;
  pthread_mutex_lock(&l->mu);
  atomic_store(&l->stop, 1);
  pthread_cond_broadcast(&l->freed);
  pthread_mutex_unlock(&l->mu);
  for (int i = 0; i < l->workers_running; i++)
    pthread_join(l->workers[i], NULL);
  l->workers_running = 0;
}

dt_status dt_loader_create(const dt_dataset *d, dt_sampler *s, const dt_loader_config *cfg,
                           dt_loader **out) {
  DT_CHECK_OUT(out);
  if (!d || !s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dataset and sampler must not be NULL");
  dt_loader_config c = cfg ? *cfg : DT_LOADER_CONFIG_DEFAULT;
  if (c.batch_size < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "batch_size %d: must be >= 1", c.batch_size);
  if (c.prefetch < 1 || c.prefetch > 64)
    return DT_ERROR(DT_ERR_INVALID_ARG, "prefetch %d: must be in [1, 64] batches", c.prefetch);
  if (c.workers < 1 || c.workers > 64)
    return DT_ERROR(DT_ERR_INVALID_ARG, "workers %d: must be in [1, 64] threads", c.workers);
  const dt_backend_ops *be = NULL;
  DT_CHECK(dt_backend_get(c.device, &be));

  dt_loader *l = calloc(1, sizeof *l);
  if (!l)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a loader");
  l->dataset = d;
  l->sampler = s;
  l->cfg = c;
  const dt_sample_layout *lay = dt_dataset_layout(d);
  l->input_bytes = (size_t)dt_dataset_input_numel(d) * dt_dtype_size(lay->input_dtype);
  l->target_bytes = dt_dtype_size(lay->target_dtype);
  for (int i = 0; i < lay->target_ndim; i++)
    l->target_bytes *= (size_t)lay->target_shape[i];
  l->be = be;
  l->async_copy = be->host_alloc != NULL && be->host_free != NULL;
  l->ring_size = c.prefetch > c.workers ? c.prefetch : c.workers;
  l->num_batches = batches_for(dt_sampler_length(s), c.batch_size, c.drop_last);
  atomic_init(&l->stop, 0);
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->filled, NULL);
  pthread_cond_init(&l->freed, NULL);
  l->ring = calloc((size_t)l->ring_size, sizeof *l->ring);
  l->workers = calloc((size_t)c.workers, sizeof *l->workers);
  if (!l->ring || !l->workers) {
    dt_loader_destroy(l);
    return DT_ERROR(DT_ERR_OOM, "cannot allocate the loader ring");
  }
  if (l->async_copy) {
    dt_status st = be->event_create(c.device, &l->fresh_fence);
    for (int i = 0; i < DEVICE_RING && st == DT_OK; i++)
      st = be->event_create(c.device, &l->dev_ring[i].released);
    if (st != DT_OK) {
      dt_loader_destroy(l);
      return dt_error_wrap(st, "cannot create the loader's fence events");
    }
  }
  size_t input_bytes = (size_t)c.batch_size * l->input_bytes;
  for (int i = 0; i < l->ring_size; i++) {
    l->ring[i].inputs = host_buffer_alloc(l, input_bytes);
    l->ring[i].labels = host_buffer_alloc(l, (size_t)c.batch_size * l->target_bytes);
    if (l->async_copy && l->ring[i].inputs != NULL &&
        be->event_create(c.device, &l->ring[i].copied) != DT_OK) {
      dt_loader_destroy(l);
      return dt_error_wrap(DT_ERR_INTERNAL, "cannot create the loader's copy events");
    }
    if (!l->ring[i].inputs || !l->ring[i].labels) {
      dt_loader_destroy(l);
      return DT_ERROR(DT_ERR_OOM,
                      "cannot allocate %d host batch buffers of %zu bytes: lower batch_size, "
                      "prefetch or workers",
                      l->ring_size, input_bytes);
    }
  }
  *out = l;
  return DT_OK;
}

void dt_loader_destroy(dt_loader *l) {
  if (!l)
    return;
  stop_worker(l);
  if (l->ring) {
    for (int i = 0; i < l->ring_size; i++) {
      if (l->ring[i].copied != NULL) {
        l->be->event_synchronize(l->ring[i].copied); /* no copy still reads the slot */
        l->be->event_destroy(l->ring[i].copied);
      }
      host_buffer_free(l, l->ring[i].inputs);
      host_buffer_free(l, l->ring[i].labels);
    }
    free(l->ring);
  }
  free(l->workers);
  for (int i = 0; i < DEVICE_RING; i++) { /* the copies into them are done (above) */
    dt_storage_release(l->dev_ring[i].inputs);
    dt_storage_release(l->dev_ring[i].labels);
    if (l->dev_ring[i].released)
      l->be->event_destroy(l->dev_ring[i].released);
  }
  if (l->fresh_fence)
    l->be->event_destroy(l->fresh_fence);
  pthread_cond_destroy(&l->freed);
  pthread_cond_destroy(&l->filled);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

dt_status dt_loader_start_epoch(dt_loader *l, int64_t epoch) {
  return dt_loader_start_epoch_at(l, epoch, 0);
}

dt_status dt_loader_start_epoch_at(dt_loader *l, int64_t epoch, int64_t first_batch) {
  if (!l)
    return DT_ERROR(DT_ERR_INVALID_ARG, "loader is NULL");
  stop_worker(l);
  l->epoch_started = 0;
  DT_CHECK(dt_sampler_set_epoch(l->sampler, epoch));
  int64_t all = batches_for(dt_sampler_length(l->sampler), l->cfg.batch_size, l->cfg.drop_last);
  if (first_batch < 0 || first_batch > all)
    return DT_ERROR(DT_ERR_INVALID_ARG, "first batch %lld of an epoch of %lld batches",
                    (long long)first_batch, (long long)all);
  l->first_batch = first_batch;
  l->num_batches = all - first_batch;
  l->epoch = epoch;
  l->claimed = 0;
  l->failed = 0;
  l->consumed = 0;
  l->taken = 0;
  for (int i = 0; i < l->ring_size; i++)
    l->ring[i].ready = 0;
  atomic_store(&l->stop, 0);
  for (int i = 0; i < l->cfg.workers && i < l->num_batches; i++) {
    int rc = pthread_create(&l->workers[i], NULL, worker_main, l);
    if (rc != 0) {
      stop_worker(l);
      return DT_ERROR(DT_ERR_INTERNAL, "cannot start loader worker thread %d of %d: %s", i + 1,
                      l->cfg.workers, strerror(rc));
    }
    l->workers_running = i + 1;
  }
  l->epoch_started = 1;
  return DT_OK;
}

int64_t dt_loader_num_batches(const dt_loader *l) { return l->num_batches; }

/* Hands the slots read so far back to the worker (on the async path, the
 * worker waits for a slot's copy before refilling it). */
static void release_taken_slots(dt_loader *l) {
  while (l->consumed < l->taken) {
    batch_slot *slot = &l->ring[l->consumed % l->ring_size];
    slot->copy_pending = l->async_copy;
    pthread_mutex_lock(&l->mu);
    slot->ready = 0;
    l->consumed++;
    pthread_cond_broadcast(&l->freed);
    pthread_mutex_unlock(&l->mu);
  }
}

static int only_the_loader_refers_to(const dt_storage *st) {
  return __atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE) == 1;
}

/* Records the release event of every handed-out buffer pair that only the
 * loader still refers to: every kernel reading it is queued by now. */
static dt_status note_released_buffers(dt_loader *l, dt_stream *compute) {
  for (int i = 0; i < DEVICE_RING; i++) {
    struct device_buffer *d = &l->dev_ring[i];
    if (!d->in_use || !only_the_loader_refers_to(d->inputs) ||
        !only_the_loader_refers_to(d->labels))
      continue;
    DT_CHECK(l->be->event_record(d->released, compute));
    d->in_use = 0;
    d->released_at = ++l->releases;
  }
  return DT_OK;
}

/* Device storages (*in, *lab: a reference each, for the batch's tensors)
 * for a batch of `in_bytes` + `lab_bytes`, with the copy stream ordered
 * after their last use (see the top): a released ring pair, a new one, or
 * for a short batch or a ring the caller holds entirely, new storages that
 * only the batch's tensors will own. */
static dt_status batch_buffers(dt_loader *l, int full, size_t in_bytes, size_t lab_bytes,
                               dt_storage **in, dt_storage **lab) {
  dt_stream *compute = l->be->stream(l->cfg.device, DT_STREAM_COMPUTE);
  dt_stream *copy = l->be->stream(l->cfg.device, DT_STREAM_COPY);
  DT_CHECK(note_released_buffers(l, compute));
  struct device_buffer *reuse = NULL, *empty = NULL;
  for (int i = 0; full && i < DEVICE_RING; i++) {
    struct device_buffer *d = &l->dev_ring[i];
    if (!d->inputs && !empty)
      empty = d;
    else if (d->inputs && !d->in_use && (!reuse || d->released_at < reuse->released_at))
      reuse = d;
  }
  if (empty) /* fill the ring first: a pair released just now guards the step just queued */
    reuse = NULL;
  if (reuse) {
    DT_CHECK(l->be->stream_wait_event(copy, reuse->released));
  } else {
    DT_CHECK(dt_storage_alloc(l->cfg.device, in_bytes, in));
    dt_status st = dt_storage_alloc(l->cfg.device, lab_bytes, lab);
    if (st == DT_OK)
      st = l->be->event_record(l->fresh_fence, compute);
    if (st == DT_OK)
      st = l->be->stream_wait_event(copy, l->fresh_fence);
    if (st != DT_OK) {
      dt_storage_release(*in);
      dt_storage_release(*lab);
      *in = *lab = NULL;
      return st;
    }
    if (!empty)
      return DT_OK; /* the batch's tensors own them */
    empty->inputs = *in;
    empty->labels = *lab;
    reuse = empty;
  }
  reuse->in_use = 1;
  *in = reuse->inputs;
  *lab = reuse->labels;
  __atomic_add_fetch(&(*in)->refcount, 1, __ATOMIC_ACQ_REL); /* the tensor's reference */
  __atomic_add_fetch(&(*lab)->refcount, 1, __ATOMIC_ACQ_REL);
  return DT_OK;
}

/* A device tensor over `st` (whose reference it takes) holding `host`,
 * copied on the copy stream. */
static dt_status upload_into(dt_loader *l, dt_storage *st, const void *host, const int64_t *shape,
                             int ndim, dt_dtype dtype, dt_tensor **out) {
  dt_status s = l->be->copy(st->data, l->cfg.device, host, DT_CPU, st->bytes,
                            l->be->stream(l->cfg.device, DT_STREAM_COPY));
  if (s == DT_OK)
    s = dt_tensor_wrap(st, 0, shape, ndim, dtype, out);
  dt_storage_release(st); /* the tensor holds its own reference */
  return s;
}

/* The batch of `slot` on the device: synchronous copies, or on the async
 * path copies on the copy stream that the compute stream waits for. */
static dt_status upload_batch(dt_loader *l, batch_slot *slot, const int64_t *shape, int ndim,
                              dt_dtype dtype, const int64_t *tshape, int tndim, dt_dtype tdtype,
                              dt_tensor **x, dt_tensor **y) {
  if (!l->async_copy) {
    DT_CHECK(dt_tensor_from_host(slot->inputs, shape, ndim, dtype, l->cfg.device, x));
    return dt_tensor_from_host(slot->labels, tshape, tndim, tdtype, l->cfg.device, y);
  }
  size_t in_bytes = (size_t)slot->count * l->input_bytes;
  size_t lab_bytes = (size_t)slot->count * l->target_bytes;
  dt_storage *in = NULL, *lab = NULL;
  DT_CHECK(batch_buffers(l, slot->count == l->cfg.batch_size, in_bytes, lab_bytes, &in, &lab));
  dt_status st = upload_into(l, in, slot->inputs, shape, ndim, dtype, x);
  if (st != DT_OK) {
    dt_storage_release(lab);
    return st;
  }
  DT_CHECK(upload_into(l, lab, slot->labels, tshape, tndim, tdtype, y));
  /* The compute stream waits for the copies; the host does not. */
  dt_stream *copy = l->be->stream(l->cfg.device, DT_STREAM_COPY);
  DT_CHECK(l->be->event_record(slot->copied, copy));
  return l->be->stream_wait_event(l->be->stream(l->cfg.device, DT_STREAM_COMPUTE), slot->copied);
}

dt_status dt_loader_next(dt_loader *l, dt_tensor **inputs, dt_tensor **labels) {
  if (!inputs || !labels)
    return DT_ERROR(DT_ERR_INVALID_ARG, "inputs and labels must not be NULL");
  *inputs = NULL;
  *labels = NULL;
  if (!l)
    return DT_ERROR(DT_ERR_INVALID_ARG, "loader is NULL");
  if (!l->epoch_started)
    return DT_ERROR(DT_ERR_STATE, "no epoch started: call dt_loader_start_epoch first");
  release_taken_slots(l);
  if (l->taken >= l->num_batches) {
    stop_worker(l); /* finished: just joins */
    return DT_OK;
  }

  batch_slot *slot = &l->ring[l->taken % l->ring_size];
  pthread_mutex_lock(&l->mu);
  while (!slot->ready)
    pthread_cond_wait(&l->filled, &l->mu);
  pthread_mutex_unlock(&l->mu);

  if (slot->status != DT_OK) /* sticky: the worker stopped at this batch */
    return DT_ERROR(slot->status, "data loader worker failed on %s", slot->error);

  const dt_sample_layout *lay = dt_dataset_layout(l->dataset);
  int64_t shape[DT_MAX_DIMS], tshape[DT_MAX_DIMS];
  shape[0] = tshape[0] = slot->count;
  memcpy(shape + 1, lay->input_shape, (size_t)lay->input_ndim * sizeof *shape);
  memcpy(tshape + 1, lay->target_shape, (size_t)lay->target_ndim * sizeof *tshape);
  dt_tensor *x = NULL, *y = NULL;
  double span = dt_trace_begin(DT_TRACE_LANE_COPY, "host to device");
  dt_status st = upload_batch(l, slot, shape, lay->input_ndim + 1, lay->input_dtype, tshape,
                              lay->target_ndim + 1, lay->target_dtype, &x, &y);
  dt_trace_end(DT_TRACE_LANE_COPY, "host to device", span);
  if (st != DT_OK) { /* the slot stays taken-but-unread; destroy waits for its copies */
    dt_tensor_release(x);
    dt_tensor_release(y);
    return st;
  }
  l->taken++;
  release_taken_slots(l); /* async: the worker waits for the copy before a refill */
  *inputs = x;
  *labels = y;
  return DT_OK;
}
