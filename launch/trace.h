/* The timeline of a run: `dtrain train --trace FILE`, one file per rank
 * ("{rank}" in FILE becomes the rank), in Chrome's trace-event JSON
 * (https://ui.perfetto.dev and chrome://tracing open it).
 *
 *   dt_trace_config tc = {.path = "trace-{rank}.json", .rank = r, .first_step = 1,
 *                         .last_step = 20, .dev = dev};
 *   dt_trace *t = NULL;
 *   DT_CHECK(dt_trace_open(&tc, &t));        // installs core/trace.h's hooks
 *   for each optimizer step k:
 *     dt_trace_set_step(t, k);               // spans outside [first, last] are dropped
 *     ... the step ...
 *     dt_trace_add_comm(t, ddp);             // the step's buckets on the comm lane
 *     DT_CHECK(dt_trace_step_end(t));        // GPU spans of the step
 *   DT_CHECK(dt_trace_close(t));             // after the loader has stopped
 *
 * One process ("rank R") with these lanes (threads): "step" (forward,
 * backward, gradient sync, optimizer, evaluate: the host thread running
 * the step), "loader" (the worker assembling batches), "host-to-device"
 * (a batch's copy, or its enqueue on the copy stream), "comm" (each
 * bucket's all-reduce, from launch to completion on the communication
 * thread), and on a CUDA device "gpu" (the step's spans as the GPU ran
 * them, from CUDA timing events on the compute stream) plus NVTX ranges of
 * the same names for Nsight Systems. Timestamps are CLOCK_MONOTONIC
 * microseconds, so the ranks of one host line up. Data-parallel replicas'
 * threads get lanes of their own ("step (thread N)").
 */
#ifndef DT_LAUNCH_TRACE_H
#define DT_LAUNCH_TRACE_H

#include <stdint.h>

#include "core/device.h"
#include "core/status.h"
#include "dist/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_trace dt_trace;

typedef struct dt_trace_config {
  const char *path; /* "{rank}" is replaced by the rank; NULL = no file (NVTX ranges only) */
  int rank;
  int64_t first_step, last_step; /* optimizer steps recorded, 1-based, inclusive */
  dt_device dev;                 /* cuda: GPU spans and NVTX ranges */
} dt_trace_config;

/* "A:B" (1 <= A <= B) -> *first, *last; DT_ERR_INVALID_ARG naming the
 * text otherwise. */
dt_status dt_trace_parse_steps(const char *text, int64_t *first, int64_t *last);

/* "{rank}" in pattern replaced by rank, into out. DT_ERR_INVALID_ARG when it
 * does not fit. */
dt_status dt_trace_path_for_rank(const char *pattern, int rank, char *out, size_t cap);

/* Creates the file (DT_ERR_IO naming it) and installs the span hooks. */
dt_status dt_trace_open(const dt_trace_config *cfg, dt_trace **out);
/* The optimizer step (1-based) whose work runs from now on. NULL: no-op. */
void dt_trace_set_step(dt_trace *t, int64_t step);
/* The all-reduces of `ddp`'s last synchronised pass, on the comm lane. */
void dt_trace_add_comm(dt_trace *t, const dt_ddp *ddp);
/* Resolves the GPU spans recorded so far (waits for their events); the
 * first error of a hook, if any. NULL: DT_OK. */
dt_status dt_trace_step_end(dt_trace *t);
/* Removes the hooks, ends the JSON and closes the file; DT_ERR_IO when
 * writing failed. Call after every thread that emits spans has stopped.
 * NULL is a no-op. */
dt_status dt_trace_close(dt_trace *t);

#ifdef __cplusplus
}
#endif
#endif
