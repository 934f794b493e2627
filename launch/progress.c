/* The progress display (launch/progress.h). */
#include "launch/progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/env.h"
#include "core/trace.h"

#define BAR_WIDTH 20
#define DRAW_INTERVAL_S 0.2

void dt_progress_init(dt_progress *p, FILE *out, FILE *console, const char *prefix, bool quiet) {
  memset(p, 0, sizeof *p);
  p->out = out;
  p->live_out = console ? console : out;
  p->prefix = prefix ? prefix : "";
  p->quiet = quiet;
  p->live = out && p->live_out && !quiet && dt_progress_live(p->live_out);
  p->start_s = p->epoch_start_s = dt_trace_now();
}

/* Under mpirun a rank's stdout is a pseudo-terminal of mpirun's even when
 * mpirun writes to a file: only the launcher knows (DT_PROGRESS). */
static bool under_launcher(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i]))
      return true;
  return false;
}

bool dt_progress_live(FILE *out) {
  int mode = 0; /* auto, bar, plain */
  if (dt_env_choice(DT_ENV_PROGRESS, &mode) != DT_OK)
    mode = 0; /* checked at start-up (dt_cli_check_env) */
  if (mode == 1)
    return true;
  return mode == 0 && isatty(fileno(out)) && !under_launcher();
}

void dt_progress_epoch_begin(dt_progress *p, int64_t steps_done) {
  p->epoch_start_s = dt_trace_now();
  p->epoch_first_step = steps_done;
}

void dt_progress_format_eta(double seconds, char *buf, size_t cap) {
  if (!(seconds >= 0) || !isfinite(seconds) || seconds > 1e8) {
    snprintf(buf, cap, "?");
    return;
  }
  long s = (long)(seconds + 0.5);
  if (s >= 3600)
    snprintf(buf, cap, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    snprintf(buf, cap, "%ld:%02ld", s / 60, s % 60);
}

void dt_progress_draw(dt_progress *p, const dt_progress_state *s, bool force) {
  if (!p->live)
    return;
  double now = dt_trace_now();
  if (!force && p->drawn && now - p->last_draw_s < DRAW_INTERVAL_S)
    return;
  p->last_draw_s = now;
  double frac = s->batches > 0 ? (double)s->batch / (double)s->batches : 0.0;
  char bar[BAR_WIDTH + 1];
  int filled = (int)(frac * BAR_WIDTH + 0.5);
  for (int i = 0; i < BAR_WIDTH; i++)
    bar[i] = i < filled ? '#' : '.';
  bar[BAR_WIDTH] = '\0';
  /* ETAs from the optimizer steps' pace: this epoch's so far. */
  int64_t ep_done = s->steps - p->epoch_first_step;
  double per_step = ep_done > 0 ? (now - p->epoch_start_s) / (double)ep_done : -1.0;
  char eta_epoch[32], eta_run[32];
  dt_progress_format_eta(per_step < 0 ? -1 : per_step * (double)(s->epoch_steps - ep_done),
                         eta_epoch, sizeof eta_epoch);
  dt_progress_format_eta(per_step < 0 ? -1 : per_step * (double)(s->total_steps - s->steps),
                         eta_run, sizeof eta_run);
  fprintf(p->live_out,
          "\r\033[K%s[%s] ep %d/%d %3.0f%% step %lld/%lld %.0f %s ETA ep %s run %s%s%s", p->prefix,
          bar, s->epoch, s->epochs, 100.0 * frac, (long long)s->steps, (long long)s->total_steps,
          s->rate, s->rate_unit ? s->rate_unit : "samples/s", eta_epoch, eta_run,
          s->gpu ? " | " : "", s->gpu ? s->gpu : "");
  fflush(p->live_out);
  p->drawn = true;
}

void dt_progress_clear(dt_progress *p) {
  if (!p->live || !p->drawn)
    return;
  fputs("\r\033[K", p->live_out);
  fflush(p->live_out);
  p->drawn = false;
}

void dt_progress_line(dt_progress *p, const char *line) {
  FILE *to = p->live ? p->file_out : p->out;
  if (!p->out || p->quiet || !to)
    return;
  fprintf(to, "%s%s", p->prefix, line);
  fflush(to);
}
