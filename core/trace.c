/* Trace span hooks (core/trace.h). */
#include "core/trace.h"

#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

static dt_trace_hooks installed;
static _Atomic(const dt_trace_hooks *) active;

void dt_trace_set_hooks(const dt_trace_hooks *hooks) {
  if (!hooks) {
    atomic_store(&active, NULL);
    return;
  }
  atomic_store(&active, NULL);
  installed = *hooks;
  atomic_store(&active, &installed);
}

double dt_trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double dt_trace_begin(dt_trace_lane lane, const char *name) {
  const dt_trace_hooks *h = atomic_load_explicit(&active, memory_order_acquire);
  if (!h)
    return 0.0;
  if (h->begin)
    h->begin(h->user, lane, name);
  return dt_trace_now();
}

void dt_trace_end(dt_trace_lane lane, const char *name, double start_s) {
  const dt_trace_hooks *h = atomic_load_explicit(&active, memory_order_acquire);
  if (!h || start_s == 0.0)
    return;
  double end = dt_trace_now();
  if (h->end)
    h->end(h->user, lane, name, start_s, end);
}
