/* Trace spans: where core marks the phases of a run (the training step's
 * forward, backward and optimizer, the data loader's batches and their
 * host-to-device copies) for whoever records a timeline (launch/trace.h
 * writes them as Chrome trace events and NVTX ranges). Without hooks every
 * call is one relaxed atomic load.
 *
 *   double t0 = dt_trace_begin(DT_TRACE_LANE_STEP, "forward");
 *   ...
 *   dt_trace_end(DT_TRACE_LANE_STEP, "forward", t0);
 *
 * Spans on one thread nest (begin/end in stack order). Names are string
 * literals (the hooks may keep the pointer). Hooks are called on the thread
 * that runs the span, from several threads at once (the loader's worker, dp
 * replicas): they must be thread-safe.
 */
#ifndef DT_CORE_TRACE_H
#define DT_CORE_TRACE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_trace_lane {
  DT_TRACE_LANE_STEP = 0, /* the training step on its thread: forward, backward, optimizer */
  DT_TRACE_LANE_LOADER,   /* the loader's worker assembling a batch */
  DT_TRACE_LANE_COPY,     /* a batch's host-to-device copy (its enqueue on a copy stream) */
  DT_TRACE_LANE_COUNT
} dt_trace_lane;

typedef struct dt_trace_hooks {
  void *user;
  void (*begin)(void *user, dt_trace_lane lane, const char *name);
  /* start_s and end_s on dt_trace_now()'s clock */
  void (*end)(void *user, dt_trace_lane lane, const char *name, double start_s, double end_s);
} dt_trace_hooks;

/* Installs the hooks (copied; NULL removes them). Not for concurrent use with
 * itself: set them before the run's threads start and remove them after the
 * threads have ended. */
void dt_trace_set_hooks(const dt_trace_hooks *hooks);

/* Seconds on CLOCK_MONOTONIC (the clock of dist's dt_comm_now too). */
double dt_trace_now(void);

/* Begins a span: calls the begin hook, returns its start time (0 when no
 * hooks are installed). */
double dt_trace_begin(dt_trace_lane lane, const char *name);
/* Ends the span begun at start_s (a 0 start, begun without hooks, is
 * dropped). */
void dt_trace_end(dt_trace_lane lane, const char *name, double start_s);

#ifdef __cplusplus
}
#endif
#endif
