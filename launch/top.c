/* `dtrain top` (launch/top.h). */
#include "launch/top.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "launch/flags.h"
#include "launch/gpu_monitor.h"
#include "launch/job_status.h"
#include "launch/progress.h"

#define MAX_RANKS 4096

typedef struct rank_view {
  char job[128], host[256], model[64], data[64], device[32], state[32], rate_unit[32];
  long pid;
  int rank, world, epoch, epochs;
  double step, total_steps, loss, rate, eta_s, mem_mib, updated;
} rank_view;

static const char *json_string(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
}

static double json_number(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads one status file; false when it is not one (or half-written). */
static bool read_rank(const char *path, rank_view *r) {
  FILE *f = fopen(path, "r");
  if (!f)
    return false;
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *o = cJSON_Parse(buf);
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    return false;
  }
  memset(r, 0, sizeof *r);
  snprintf(r->job, sizeof r->job, "%s", json_string(o, "job"));
  snprintf(r->host, sizeof r->host, "%s", json_string(o, "host"));
  snprintf(r->model, sizeof r->model, "%s", json_string(o, "model"));
  snprintf(r->data, sizeof r->data, "%s", json_string(o, "data"));
  snprintf(r->device, sizeof r->device, "%s", json_string(o, "device"));
  snprintf(r->state, sizeof r->state, "%s", json_string(o, "state"));
  snprintf(r->rate_unit, sizeof r->rate_unit, "%s", json_string(o, "rate_unit"));
  r->pid = (long)json_number(o, "pid");
  r->rank = (int)json_number(o, "rank");
  r->world = (int)json_number(o, "world");
  r->epoch = (int)json_number(o, "epoch");
  r->epochs = (int)json_number(o, "epochs");
  r->step = json_number(o, "step");
  r->total_steps = json_number(o, "total_steps");
  r->loss = json_number(o, "loss");
  r->rate = json_number(o, "rate");
  r->eta_s = json_number(o, "eta_s");
  r->mem_mib = json_number(o, "mem_mib");
  r->updated = json_number(o, "updated");
  cJSON_Delete(o);
  return true;
}

/* A rank of this host whose process is gone left its file behind. */
static bool rank_alive(const rank_view *r) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  if (strcmp(host, r->host) != 0)
    return true; /* another node's: trust its freshness instead */
  return r->pid > 0 && (kill((pid_t)r->pid, 0) == 0 || errno == EPERM);
}

static int compare_ranks(const void *a, const void *b) {
  const rank_view *x = a, *y = b;
  int c = strcmp(x->job, y->job);
  return c ? c : x->rank - y->rank;
}

static void show_gpus(FILE *out) {
  dt_gpu_monitor *m = NULL;
  if (dt_gpu_monitor_open(&m) != DT_OK) {
    fprintf(out, "GPUs: none to show: %s\n", dt_last_error());
    return;
  }
  fprintf(out, "GPUs: %d\n", dt_gpu_monitor_count(m));
  for (int i = 0; i < dt_gpu_monitor_count(m); i++) {
    dt_gpu_sample s;
    char line[256];
    if (dt_gpu_monitor_sample(m, i, &s) != DT_OK) {
      fprintf(out, "  gpu%d: %s\n", i, dt_last_error());
      continue;
    }
    dt_gpu_sample_format(i, &s, line, sizeof line);
    fprintf(out, "  %s  %s\n", line, s.name);
  }
  dt_gpu_monitor_close(m);
}

static void show_ranks(FILE *out, const char *dir) {
  DIR *d = opendir(dir);
  static rank_view ranks[MAX_RANKS];
  int n = 0;
  if (d) {
    for (struct dirent *e; (e = readdir(d)) != NULL && n < MAX_RANKS;) {
      size_t len = strlen(e->d_name);
      if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
        continue;
      char path[4096 + 256];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      if (read_rank(path, &ranks[n]) && rank_alive(&ranks[n]))
        n++;
    }
    closedir(d);
  }
  if (n == 0) {
    fprintf(out,
            "jobs: no running dtrain job (no live status file in %s; the ranks of dtrain "
            "train write them there: --status-dir or DT_STATUS_DIR)\n",
            dir);
    return;
  }
  qsort(ranks, (size_t)n, sizeof ranks[0], compare_ranks);
  double now = (double)time(NULL);
  for (int i = 0; i < n; i++) {
    const rank_view *r = &ranks[i];
    if (i == 0 || strcmp(r->job, ranks[i - 1].job) != 0)
      fprintf(out, "job %s: %s on %s, %d rank%s\n", r->job, r->model, r->data, r->world,
              r->world == 1 ? "" : "s");
    char eta[32], loss[32] = "-";
    dt_progress_format_eta(r->eta_s, eta, sizeof eta);
    if (isfinite(r->loss))
      snprintf(loss, sizeof loss, "%.4f", r->loss);
    fprintf(out,
            "  rank %-3d %s pid %ld %-8s %-10s epoch %d/%d step %.0f/%.0f loss %s %.0f %s "
            "ETA %s mem %.1f MiB (%.0f s ago)\n",
            r->rank, r->host, r->pid, r->device, r->state, r->epoch, r->epochs, r->step,
            r->total_steps, loss, r->rate, r->rate_unit, eta, r->mem_mib, now - r->updated);
  }
}

int dt_cli_top(int argc, char **argv, FILE *err) {
  double interval = 2.0;
  bool once = false;
  const char *status_dir = NULL;
  dt_flag flags[] = {
      DT_DOUBLE_FLAG("interval", &interval, "S", "seconds between refreshes", .min = 0.1,
                     .max = 3600),
      DT_BOOL_FLAG("once", &once, "show one refresh and exit"),
      DT_STRING_FLAG("status-dir", &status_dir, "DIR",
                     "where running ranks write their status files",
                     .default_text = "DT_STATUS_DIR, else /tmp/dtrain-status-<uid>"),
  };
  dt_flag_set set = {
      .command = "top",
      .usage = "top [flags]",
      .about =
          "Shows this machine's GPUs (utilisation, memory, temperature, power; NVML) and\n"
          "the ranks of running dtrain jobs (step, loss, throughput, ETA), refreshed\n"
          "every --interval seconds until interrupted (--once: one refresh).",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  char dir[4096];
  dt_job_status_dir(status_dir, dir, sizeof dir);
  bool tty = isatty(fileno(stdout));
  for (;;) {
    if (tty && !once)
      fputs("\033[H\033[2J", stdout);
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    printf("dtrain top  %s\n", when);
    show_gpus(stdout);
    show_ranks(stdout, dir);
    if (fflush(stdout) != 0 || once)
      return 0;
    struct timespec ts = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
    nanosleep(&ts, NULL);
    if (!tty)
      putchar('\n');
  }
}
