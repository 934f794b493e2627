/* The progress display of `dtrain train`. On a terminal: one live line,
 * redrawn in place at most 5 times a second,
 *
 *   [#######.............] ep 1/2 38% step 360/1876 4521 samples/s ETA ep 0:12 run 0:39 | gpu0
 * 57% 12.1/80.0 GiB 61C 230/700W
 *
 * (DT_PROGRESS=bar|plain|auto decides; auto: a terminal outside a launcher,
 * whose ranks write to mpirun's pseudo-terminal even when mpirun's output
 * is a file, so `dtrain launch` passes DT_PROGRESS on);
 * off a terminal (a log file, Slurm, a pipe): the plain lines
 * `epoch E step B/N loss L lr LR samples/s S mem M MiB (peak P MiB)` every
 * --log-interval micro-batches, as before; with the live line they go to
 * the run's train.log alone (file_out). --quiet: neither.
 */
#ifndef DT_LAUNCH_PROGRESS_H
#define DT_LAUNCH_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_progress {
  FILE *out;          /* plain lines; NULL = nothing shown */
  FILE *live_out;     /* the live line (a terminal) */
  FILE *file_out;     /* with the live line: the plain lines' file (train.log), NULL = none */
  const char *prefix; /* "" or "rank 1: " */
  bool live;          /* out is a terminal */
  bool quiet;
  bool drawn;         /* a live line is on the screen */
  double last_draw_s; /* when it was drawn */
  double start_s;     /* the run's start */
  double epoch_start_s;
  int64_t epoch_first_step; /* optimizer steps done when the epoch began */
} dt_progress;

/* Whether progress on `out` is the live line: DT_PROGRESS bar, or auto
 * and `out` a terminal outside a launcher. */
bool dt_progress_live(FILE *out);

/* out: the log (NULL = none); console: the stream a live line would go to
 * (out, or the terminal behind it); live as dt_progress_live(console) says. */
void dt_progress_init(dt_progress *p, FILE *out, FILE *console, const char *prefix, bool quiet);
void dt_progress_epoch_begin(dt_progress *p, int64_t steps_done);

typedef struct dt_progress_state {
  int epoch, epochs;
  int64_t batch, batches;     /* micro-batches done in this epoch, and in all of it */
  int64_t steps, total_steps; /* optimizer steps done in the run, and in all */
  int64_t epoch_steps;        /* optimizer steps this epoch will take */
  double rate;                /* samples/s (or tokens/s) */
  const char *rate_unit;      /* "samples/s" */
  const char *gpu;            /* the GPU monitor's text, NULL = none */
} dt_progress_state;

/* Redraws the live line (throttled; force: now). No-op off a terminal. */
void dt_progress_draw(dt_progress *p, const dt_progress_state *s, bool force);
/* Clears the live line so that an ordinary line can be printed. */
void dt_progress_clear(dt_progress *p);
/* A plain progress line (not quiet): to out off a terminal, to file_out
 * while the live line is shown. */
void dt_progress_line(dt_progress *p, const char *line);

/* "1:02:03" / "2:03" for seconds (negative or unknown: "?"). */
void dt_progress_format_eta(double seconds, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
