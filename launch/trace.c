/* The run's timeline as Chrome trace events (launch/trace.h). Events are
 * built with cJSON and written one by one, so the file grows with the
 * steps recorded, not with the run. */
#include "launch/trace.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "cuda/cuda.h"

/* Lanes (Chrome "tid"s). */
enum { TID_STEP = 1, TID_LOADER, TID_COPY, TID_COMM, TID_GPU, TID_EXTRA_STEP = 100 };

#define GPU_SPANS_MAX 256 /* per step; more are dropped */
#define GPU_STACK_MAX 16

typedef struct gpu_span {
  const char *name;
  void *start, *end;
} gpu_span;

struct dt_trace {
  FILE *f;
  char path[4096];
  int rank;
  int64_t first_step, last_step;
  atomic_llong step;
  bool cuda;
  dt_device dev;
  pthread_t main_thread;
  pthread_mutex_t mu; /* the file, events, write_failed, extra_threads */
  long events;
  bool write_failed;
  int extra_threads;
  /* GPU spans of the main thread (only it touches these). */
  void *gpu_base;    /* timing event recorded at open */
  double gpu_base_s; /* host time at which gpu_base completed */
  void *gpu_open[GPU_STACK_MAX];
  int gpu_depth;
  gpu_span gpu[GPU_SPANS_MAX];
  int n_gpu;
  dt_status hook_status; /* first failure inside a hook */
  char hook_error[512];
};

static _Thread_local int thread_tid; /* 0 = not assigned yet */

static bool in_window(const dt_trace *t) {
  long long s = atomic_load(&t->step);
  return s >= t->first_step && s <= t->last_step;
}

/* Writes one event (takes it). Called with t->mu held. */
static void write_event_locked(dt_trace *t, cJSON *ev) {
  char *text = ev ? cJSON_PrintUnformatted(ev) : NULL;
  cJSON_Delete(ev);
  if (!text) {
    t->write_failed = true;
    return;
  }
  if (fprintf(t->f, "%s%s", t->events ? ",\n" : "", text) < 0)
    t->write_failed = true;
  t->events++;
  cJSON_free(text);
}

static void write_event(dt_trace *t, cJSON *ev) {
  pthread_mutex_lock(&t->mu);
  write_event_locked(t, ev);
  pthread_mutex_unlock(&t->mu);
}

static cJSON *make_event(const dt_trace *t, const char *ph, const char *name, int tid) {
  cJSON *ev = cJSON_CreateObject();
  if (!ev)
    return NULL;
  cJSON_AddStringToObject(ev, "name", name);
  cJSON_AddStringToObject(ev, "ph", ph);
  cJSON_AddNumberToObject(ev, "pid", t->rank);
  cJSON_AddNumberToObject(ev, "tid", tid);
  return ev;
}

/* A complete event ("X") from start_s to end_s; args (taken) may be NULL. */
static void write_span(dt_trace *t, int tid, const char *name, const char *cat, double start_s,
                       double end_s, cJSON *args) {
  cJSON *ev = make_event(t, "X", name, tid);
  if (ev) {
    cJSON_AddStringToObject(ev, "cat", cat);
    cJSON_AddNumberToObject(ev, "ts", start_s * 1e6);
    cJSON_AddNumberToObject(ev, "dur", (end_s - start_s) * 1e6);
    if (!args)
      args = cJSON_CreateObject();
    if (args) {
      cJSON_AddNumberToObject(args, "step", (double)atomic_load(&t->step));
      cJSON_AddItemToObject(ev, "args", args);
    }
  } else {
    cJSON_Delete(args);
  }
  write_event(t, ev);
}

static void write_lane_name(dt_trace *t, int tid, const char *name) {
  cJSON *ev = make_event(t, "M", "thread_name", tid);
  cJSON *args = cJSON_CreateObject();
  if (ev && args) {
    cJSON_AddStringToObject(args, "name", name);
    cJSON_AddItemToObject(ev, "args", args);
    cJSON_AddNumberToObject(ev, "sort_index", tid);
  } else {
    cJSON_Delete(args);
  }
  write_event(t, ev);
}

static void hook_failed(dt_trace *t, dt_status st) {
  if (t->hook_status == DT_OK) {
    t->hook_status = st;
    snprintf(t->hook_error, sizeof t->hook_error, "%s", dt_last_error());
  }
}

/* The step lane of the calling thread: the main thread's, or a new one. */
static int step_tid(dt_trace *t) {
  if (thread_tid)
    return thread_tid;
  if (pthread_equal(pthread_self(), t->main_thread)) {
    thread_tid = TID_STEP;
    return thread_tid;
  }
  pthread_mutex_lock(&t->mu);
  int n = ++t->extra_threads;
  pthread_mutex_unlock(&t->mu);
  thread_tid = TID_EXTRA_STEP + n;
  char name[64];
  snprintf(name, sizeof name, "step (thread %d)", n + 1);
  write_lane_name(t, thread_tid, name);
  return thread_tid;
}

static bool gpu_lane(const dt_trace *t, dt_trace_lane lane) {
  return t->cuda && lane == DT_TRACE_LANE_STEP && pthread_equal(pthread_self(), t->main_thread);
}

static void on_begin(void *user, dt_trace_lane lane, const char *name) {
  dt_trace *t = user;
  if (t->cuda)
    dt_cuda_nvtx_push(name);
  if (!gpu_lane(t, lane) || t->gpu_depth >= GPU_STACK_MAX)
    return;
  void *ev = NULL;
  if (in_window(t) && t->n_gpu < GPU_SPANS_MAX) {
    dt_status st = dt_cuda_timer_record(t->dev, &ev);
    if (st != DT_OK)
      hook_failed(t, st);
  }
  t->gpu_open[t->gpu_depth++] = ev;
}

static const char *const lane_names[DT_TRACE_LANE_COUNT] = {"step", "loader", "host-to-device"};
static const int lane_tids[DT_TRACE_LANE_COUNT] = {TID_STEP, TID_LOADER, TID_COPY};

static void on_end(void *user, dt_trace_lane lane, const char *name, double start_s, double end_s) {
  dt_trace *t = user;
  if (t->cuda)
    dt_cuda_nvtx_pop();
  if (gpu_lane(t, lane) && t->gpu_depth > 0) {
    void *start = t->gpu_open[--t->gpu_depth], *end = NULL;
    if (start) {
      dt_status st = dt_cuda_timer_record(t->dev, &end);
      if (st != DT_OK) {
        hook_failed(t, st);
        dt_cuda_timer_destroy(start);
      } else {
        t->gpu[t->n_gpu++] = (gpu_span){name, start, end};
      }
    }
  }
  if (!t->f || !in_window(t) || lane < 0 || lane >= DT_TRACE_LANE_COUNT)
    return;
  int tid = lane == DT_TRACE_LANE_STEP ? step_tid(t) : lane_tids[lane];
  write_span(t, tid, name, lane_names[lane], start_s, end_s, NULL);
}

dt_status dt_trace_parse_steps(const char *text, int64_t *first, int64_t *last) {
  long long a = 0, b = 0;
  int used = 0;
  if (!text || sscanf(text, "%lld:%lld%n", &a, &b, &used) != 2 || text[used] != '\0' || a < 1 ||
      b < a)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--trace-steps '%s': expected A:B, the first and last optimizer step to "
                    "record (1 <= A <= B), e.g. 1:20",
                    text ? text : "(null)");
  *first = a;
  *last = b;
  return DT_OK;
}

dt_status dt_trace_path_for_rank(const char *pattern, int rank, char *out, size_t cap) {
  size_t used = 0;
  for (const char *p = pattern; *p; p++) {
    char piece[32] = {p[0], 0};
    if (!strncmp(p, "{rank}", 6)) {
      snprintf(piece, sizeof piece, "%d", rank);
      p += 5;
    }
    size_t n = strlen(piece);
    if (used + n + 1 > cap)
      return DT_ERROR(DT_ERR_INVALID_ARG, "trace path '%s' is too long", pattern);
    memcpy(out + used, piece, n);
    used += n;
  }
  out[used] = '\0';
  return DT_OK;
}

/* The base of the GPU lane's clock: an event and the host time it ran at. */
static dt_status gpu_clock_start(dt_trace *t) {
  DT_CHECK(dt_cuda_timer_record(t->dev, &t->gpu_base));
  double ms = 0.0;
  DT_CHECK(dt_cuda_timer_elapsed_ms(t->gpu_base, t->gpu_base, &ms));
  t->gpu_base_s = dt_trace_now();
  return DT_OK;
}

static void write_header(dt_trace *t) {
  char name[32];
  snprintf(name, sizeof name, "rank %d", t->rank);
  cJSON *ev = make_event(t, "M", "process_name", 0);
  cJSON *args = cJSON_CreateObject();
  if (ev && args) {
    cJSON_AddStringToObject(args, "name", name);
    cJSON_AddItemToObject(ev, "args", args);
  } else {
    cJSON_Delete(args);
  }
  write_event(t, ev);
  write_lane_name(t, TID_STEP, "step");
  write_lane_name(t, TID_LOADER, "loader");
  write_lane_name(t, TID_COPY, "host-to-device");
  write_lane_name(t, TID_COMM, "comm");
  if (t->cuda)
    write_lane_name(t, TID_GPU, "gpu");
}

dt_status dt_trace_open(const dt_trace_config *cfg, dt_trace **out) {
  *out = NULL;
  dt_trace *t = calloc(1, sizeof *t);
  if (!t)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the trace");
  t->rank = cfg->rank;
  t->first_step = cfg->first_step;
  t->last_step = cfg->last_step;
  t->dev = cfg->dev;
  t->cuda = cfg->dev.type == DT_DEVICE_CUDA;
  t->main_thread = pthread_self();
  atomic_store(&t->step, 0);
  pthread_mutex_init(&t->mu, NULL);
  dt_status st = DT_OK;
  if (cfg->path) {
    DT_CHECK_GOTO(dt_trace_path_for_rank(cfg->path, cfg->rank, t->path, sizeof t->path), st, fail);
    t->f = fopen(t->path, "w");
    if (!t->f) {
      st = DT_ERROR(DT_ERR_IO, "cannot create the trace file %s: %s", t->path, strerror(errno));
      goto fail;
    }
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", t->f);
    write_header(t);
  }
  if (t->cuda && t->f)
    DT_CHECK_GOTO(gpu_clock_start(t), st, fail);
  thread_tid = 0;
  dt_trace_set_hooks(&(dt_trace_hooks){t, on_begin, on_end});
  *out = t;
  return DT_OK;
fail:
  if (t->f)
    fclose(t->f);
  dt_cuda_timer_destroy(t->gpu_base);
  pthread_mutex_destroy(&t->mu);
  free(t);
  return st;
}

void dt_trace_set_step(dt_trace *t, int64_t step) {
  if (t)
    atomic_store(&t->step, step);
}

void dt_trace_add_comm(dt_trace *t, const dt_ddp *ddp) {
  if (!t || !t->f || !ddp || !in_window(t))
    return;
  dt_ddp_timeline tl;
  dt_ddp_get_timeline(ddp, &tl);
  for (int b = 0; b < tl.n_buckets; b++) {
    const dt_ddp_bucket_timing *bt = &tl.buckets[b];
    if (bt->start_s <= 0 || bt->end_s < bt->start_s)
      continue;
    char name[48];
    snprintf(name, sizeof name, "allreduce bucket %d", b);
    cJSON *args = cJSON_CreateObject();
    if (args) {
      cJSON_AddNumberToObject(args, "bucket", b);
      cJSON_AddNumberToObject(args, "bytes", (double)bt->bytes);
      cJSON_AddNumberToObject(args, "queued_ms", 1e3 * (bt->start_s - bt->launch_s));
    }
    write_span(t, TID_COMM, name, "comm", bt->start_s, bt->end_s, args);
  }
}

dt_status dt_trace_step_end(dt_trace *t) {
  if (!t)
    return DT_OK;
  dt_status st = DT_OK;
  for (int i = 0; i < t->n_gpu; i++) {
    gpu_span *g = &t->gpu[i];
    double a = 0.0, b = 0.0;
    if (st == DT_OK)
      st = dt_cuda_timer_elapsed_ms(t->gpu_base, g->start, &a);
    if (st == DT_OK)
      st = dt_cuda_timer_elapsed_ms(t->gpu_base, g->end, &b);
    if (st == DT_OK && t->f)
      write_span(t, TID_GPU, g->name, "gpu", t->gpu_base_s + 1e-3 * a, t->gpu_base_s + 1e-3 * b,
                 NULL);
    dt_cuda_timer_destroy(g->start);
    dt_cuda_timer_destroy(g->end);
  }
  t->n_gpu = 0;
  if (st != DT_OK)
    return dt_error_wrap(st, "reading the trace's GPU timing events");
  if (t->hook_status != DT_OK)
    return DT_ERROR(t->hook_status, "recording the trace's GPU spans: %s", t->hook_error);
  return DT_OK;
}

dt_status dt_trace_close(dt_trace *t) {
  if (!t)
    return DT_OK;
  dt_trace_set_hooks(NULL);
  dt_status st = dt_trace_step_end(t);
  for (int i = 0; i < t->gpu_depth; i++)
    dt_cuda_timer_destroy(t->gpu_open[i]);
  dt_cuda_timer_destroy(t->gpu_base);
  if (t->f) {
    bool failed = t->write_failed || fputs("\n]}\n", t->f) < 0;
    int e = errno;
    if (fclose(t->f) != 0 && !failed) {
      failed = true;
      e = errno;
    }
    if (failed && st == DT_OK)
      st = DT_ERROR(DT_ERR_IO, "writing the trace file %s failed: %s", t->path,
                    e ? strerror(e) : "write error");
  }
  pthread_mutex_destroy(&t->mu);
  free(t);
  return st;
}
