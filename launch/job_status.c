/* Status files for `dtrain top` (launch/job_status.h). */
#include "launch/job_status.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/env.h"
#include "launch/metrics.h"

const char *dt_job_status_dir(const char *flag, char *buf, size_t cap) {
  const char *env = NULL;
  if (flag && flag[0])
    snprintf(buf, cap, "%s", flag);
  else if (dt_env_string(DT_ENV_STATUS_DIR, &env) == DT_OK && env)
    snprintf(buf, cap, "%s", env);
  else
    snprintf(buf, cap, "/tmp/dtrain-status-%u", (unsigned)getuid());
  return buf;
}

/* Letters, digits, '.', '-' and '_' of src; the rest become '_'. */
static void sanitize(const char *src, char *dst, size_t cap) {
  size_t n = 0;
  for (; *src && n + 1 < cap; src++, n++) {
    char c = *src;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_';
    dst[n] = ok ? c : '_';
  }
  dst[n] = '\0';
}

static void job_name(char *buf, size_t cap) {
  const char *ns = getenv("PMIX_NAMESPACE");
  const char *slurm = getenv("SLURM_JOB_ID");
  char raw[256];
  if (ns && ns[0])
    snprintf(raw, sizeof raw, "%s", ns);
  else if (slurm && slurm[0])
    snprintf(raw, sizeof raw, "slurm%s.%s", slurm,
             getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0");
  else
    snprintf(raw, sizeof raw, "pid%ld", (long)getpid());
  sanitize(raw, buf, cap);
}

dt_status dt_job_status_open(const char *dir, int rank, dt_job_status *s, dt_job_status_file *f) {
  memset(f, 0, sizeof *f);
  job_name(s->job, sizeof s->job);
  s->rank = rank;
  struct stat sb;
  const char *why = NULL;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    why = strerror(errno);
  else if (stat(dir, &sb) != 0)
    why = strerror(errno);
  else if (!S_ISDIR(sb.st_mode))
    why = "it is not a folder";
  else if (access(dir, W_OK | X_OK) != 0)
    why = strerror(errno);
  if (why)
    return DT_ERROR(DT_ERR_IO,
                    "cannot use the status folder %s (for dtrain top): %s; set --status-dir "
                    "or DT_STATUS_DIR to a writable folder",
                    dir, why);
  if ((size_t)snprintf(f->path, sizeof f->path, "%s/%s.rank%d.json", dir, s->job, rank) >=
      sizeof f->path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "status folder path too long: %s", dir);
  snprintf(f->tmp, sizeof f->tmp, "%s.tmp", f->path);
  f->active = true;
  return DT_OK;
}

dt_status dt_job_status_write(dt_job_status_file *f, const dt_job_status *s) {
  if (!f->active)
    return DT_OK;
  cJSON *o = cJSON_CreateObject();
  if (!o)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the status file");
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  cJSON_AddStringToObject(o, "job", s->job);
  cJSON_AddStringToObject(o, "host", host);
  cJSON_AddStringToObject(o, "model", s->model ? s->model : "");
  cJSON_AddStringToObject(o, "data", s->data ? s->data : "");
  cJSON_AddStringToObject(o, "device", s->device ? s->device : "");
  cJSON_AddStringToObject(o, "state", s->state ? s->state : "training");
  cJSON_AddStringToObject(o, "rate_unit", s->rate_unit ? s->rate_unit : "samples/s");
  const dt_json_number fields[] = {{"pid", (double)getpid()},
                                   {"rank", s->rank},
                                   {"world", s->world},
                                   {"epoch", s->epoch},
                                   {"epochs", s->epochs},
                                   {"step", (double)s->step},
                                   {"total_steps", (double)s->total_steps},
                                   {"loss", s->loss},
                                   {"rate", s->rate},
                                   {"eta_s", s->eta_s},
                                   {"mem_mib", s->mem_mib},
                                   {"updated", (double)time(NULL)}};
  dt_json_add_numbers(o, fields, (int)(sizeof fields / sizeof fields[0]));
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!text)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the status file");
  FILE *out = fopen(f->tmp, "w");
  bool ok = out && fputs(text, out) >= 0;
  ok = out && fclose(out) == 0 && ok;
  cJSON_free(text);
  if (!ok || rename(f->tmp, f->path) != 0) {
    int e = errno;
    unlink(f->tmp);
    return DT_ERROR(DT_ERR_IO, "writing the status file %s failed: %s", f->path, strerror(e));
  }
  return DT_OK;
}

void dt_job_status_remove(dt_job_status_file *f) {
  if (f->active)
    unlink(f->path);
  f->active = false;
}
