/* Status files of running ranks, for `dtrain top`: each rank of a
 * `dtrain train` writes DIR/<job>.rank<R>.json about once a second
 * (written to a temporary file and renamed, so a reader never sees half a
 * file) and removes it when the run ends. DIR is --status-dir, else
 * DT_STATUS_DIR, else /tmp/dtrain-status-<uid>. <job> names the job: the
 * launcher's (PMIX_NAMESPACE under Open MPI, SLURM_JOB_ID.SLURM_STEP_ID
 * under srun), or pid<pid> for a single process.
 *
 * A file holds one cJSON object: "job", "host", "pid", "rank", "world",
 * "model", "data", "device", "state" ("training", "evaluating"), "epoch",
 * "epochs", "step", "total_steps", "loss", "rate", "rate_unit", "eta_s",
 * "mem_mib", "updated" (Unix time, seconds).
 */
#ifndef DT_LAUNCH_JOB_STATUS_H
#define DT_LAUNCH_JOB_STATUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The status folder: `flag` when given, else DT_STATUS_DIR, else
 * /tmp/dtrain-status-<uid>. */
const char *dt_job_status_dir(const char *flag, char *buf, size_t cap);

typedef struct dt_job_status {
  char job[128];
  int rank, world;
  const char *model, *data, *device, *state, *rate_unit;
  int epoch, epochs;
  int64_t step, total_steps;
  double loss, rate, eta_s, mem_mib;
} dt_job_status;

typedef struct dt_job_status_file {
  char path[4096];
  char tmp[4200];
  bool active;
} dt_job_status_file;

/* Picks the job's name (above) into s->job and the file's path; creates
 * the folder (mode 0700) when missing. DT_ERR_IO naming it. */
dt_status dt_job_status_open(const char *dir, int rank, dt_job_status *s, dt_job_status_file *f);
/* (Re)writes the file. */
dt_status dt_job_status_write(dt_job_status_file *f, const dt_job_status *s);
/* Removes the file (the run is over). */
void dt_job_status_remove(dt_job_status_file *f);

#ifdef __cplusplus
}
#endif
#endif
