/* `dtrain report` (launch/report.h): the metrics file as one HTML page of
 * inline SVG plots. */
#define _GNU_SOURCE
#include "launch/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "launch/cli.h"
#include "launch/flags.h"

#define MAX_SERIES 8
#define MAX_POINTS 1500 /* per series drawn; longer series are thinned */
#define PANEL_W 560
#define PANEL_H 260
#define PAD_L 64
#define PAD_R 16
#define PAD_T 34
#define PAD_B 36

static const char *const palette[MAX_SERIES] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                "#9467bd", "#17becf", "#e377c2", "#bcbd22"};

typedef struct series {
  char name[64];
  double *x, *y;
  int n, cap;
  bool markers; /* points (evaluations), not a line */
} series;

typedef struct panel {
  const char *title, *xlabel;
  series s[MAX_SERIES];
  int ns;
  const char *empty; /* shown when nothing was recorded */
} panel;

enum { P_LOSS, P_METRIC, P_RATE, P_LR, P_NORM, P_MEMORY, P_RANKS, P_COMM, P_MFU, P_SCALE, P_COUNT };

typedef struct report {
  panel p[P_COUNT];
  cJSON *run; /* the run record, or NULL */
  char metric[64], rate_unit[32], split[32];
  long trains, evals;
  double last_metric;
} report;

static series *series_named(panel *p, const char *name, bool markers) {
  for (int i = 0; i < p->ns; i++)
    if (!strcmp(p->s[i].name, name))
      return &p->s[i];
  if (p->ns == MAX_SERIES)
    return NULL;
  series *s = &p->s[p->ns++];
  snprintf(s->name, sizeof s->name, "%s", name);
  s->markers = markers;
  return s;
}

static dt_status add_point(panel *p, const char *name, bool markers, double x, double y) {
  if (!isfinite(x) || !isfinite(y))
    return DT_OK;
  series *s = series_named(p, name, markers);
  if (!s)
    return DT_OK;
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
    if (nx)
      s->x = nx;
    double *ny = nx ? realloc(s->y, (size_t)cap * sizeof *ny) : NULL;
    if (!nx || !ny)
      return DT_ERROR(DT_ERR_OOM, "no host memory for the report's series");
    s->y = ny;
    s->cap = cap;
  }
  s->x[s->n] = x;
  s->y[s->n] = y;
  s->n++;
  return DT_OK;
}

static bool number(const cJSON *o, const char *key, double *v) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(it))
    return false;
  *v = it->valuedouble;
  return true;
}

static double number_or_nan(const cJSON *o, const char *key) {
  double v = NAN;
  number(o, key, &v);
  return v;
}

static dt_status add_train(report *r, const cJSON *o) {
  double step = number_or_nan(o, "step"), t = number_or_nan(o, "time"), v;
  r->trains++;
  DT_CHECK(add_point(&r->p[P_LOSS], "train loss", false, step, number_or_nan(o, "loss")));
  if (number(o, "tokens_per_s", &v)) {
    snprintf(r->rate_unit, sizeof r->rate_unit, "tokens/s");
    DT_CHECK(add_point(&r->p[P_RATE], "tokens/s", false, step, v));
  } else {
    DT_CHECK(add_point(&r->p[P_RATE], "samples/s", false, step, number_or_nan(o, "samples_per_s")));
  }
  DT_CHECK(add_point(&r->p[P_LR], "lr", false, step, number_or_nan(o, "lr")));
  DT_CHECK(add_point(&r->p[P_NORM], "grad norm", false, step, number_or_nan(o, "grad_norm")));
  const cJSON *it;
  int i = 0;
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "rank_step_ms")) {
    char name[32];
    snprintf(name, sizeof name, "rank %d", i++);
    if (cJSON_IsNumber(it))
      DT_CHECK(add_point(&r->p[P_RANKS], name, false, step, it->valuedouble));
  }
  cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(o, "memory")) {
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(it, "device");
    char name[64];
    const char *d = cJSON_IsString(dev) ? dev->valuestring : "?";
    snprintf(name, sizeof name, "%s allocated", d);
    DT_CHECK(add_point(&r->p[P_MEMORY], name, false, t, number_or_nan(it, "allocated_mib")));
    snprintf(name, sizeof name, "%s peak", d);
    DT_CHECK(add_point(&r->p[P_MEMORY], name, false, t, number_or_nan(it, "peak_mib")));
  }
  double ar = number_or_nan(o, "allreduce_ms"), hidden = number_or_nan(o, "allreduce_hidden");
  DT_CHECK(add_point(&r->p[P_COMM], "all-reduce ms", false, step, ar));
  DT_CHECK(add_point(&r->p[P_COMM], "hidden behind backward ms", false, step, ar * hidden));
  DT_CHECK(add_point(&r->p[P_MFU], "MFU", false, step, number_or_nan(o, "mfu")));
  DT_CHECK(add_point(&r->p[P_SCALE], "loss scale", false, step, number_or_nan(o, "loss_scale")));
  return DT_OK;
}

static dt_status add_eval(report *r, const cJSON *o) {
  double step = number_or_nan(o, "step");
  r->evals++;
  const cJSON *sp = cJSON_GetObjectItemCaseSensitive(o, "split");
  const char *split = cJSON_IsString(sp) ? sp->valuestring : "test";
  size_t n = strlen(split);
  char loss_key[64];
  snprintf(loss_key, sizeof loss_key, "%s_loss", split);
  snprintf(r->split, sizeof r->split, "%s", split);
  char name[80];
  snprintf(name, sizeof name, "%s loss", split);
  DT_CHECK(add_point(&r->p[P_LOSS], name, true, step, number_or_nan(o, loss_key)));
  const cJSON *it;
  bool metric = false;
  cJSON_ArrayForEach(it, o) {
    if (it->string && !strncmp(it->string, split, n) && it->string[n] == '_' &&
        strcmp(it->string, loss_key) && cJSON_IsNumber(it)) {
      snprintf(r->metric, sizeof r->metric, "%s", it->string + n + 1);
      r->last_metric = it->valuedouble;
      metric = true;
      DT_CHECK(add_point(&r->p[P_METRIC], it->string, true, step, it->valuedouble));
    }
  }
  /* A task without a metric (a language model) is judged by its loss:
   * val_loss is what its run ends with. */
  double loss = number_or_nan(o, loss_key);
  if (!metric && !isnan(loss)) {
    snprintf(r->metric, sizeof r->metric, "loss");
    r->last_metric = loss;
    DT_CHECK(add_point(&r->p[P_METRIC], loss_key, true, step, loss));
  }
  return DT_OK;
}

static dt_status read_metrics(const char *path, report *r) {
  FILE *f = fopen(path, "r");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot read the metrics file %s: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  long lineno = 0;
  dt_status st = DT_OK;
  for (ssize_t len; st == DT_OK && (len = getline(&line, &cap, f)) >= 0;) {
    lineno++;
    bool complete = len > 0 && line[len - 1] == '\n';
    cJSON *o = cJSON_Parse(line);
    if (!cJSON_IsObject(o)) {
      cJSON_Delete(o);
      if (!complete && feof(f))
        break; /* a live run's last line, cut off while being written */
      if (strspn(line, " \t\r\n") == (size_t)len)
        continue;
      st = DT_ERROR(DT_ERR_FORMAT, "%s line %ld is not a JSON object (a dtrain metrics file?)",
                    path, lineno);
      break;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "run") && !r->run) {
      r->run = o;
      continue;
    }
    if (!strcmp(t, "train"))
      st = add_train(r, o);
    else if (!strcmp(t, "eval"))
      st = add_eval(r, o);
    cJSON_Delete(o);
  }
  free(line);
  fclose(f);
  if (st == DT_OK && r->trains + r->evals == 0)
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s holds no train or eval records (was the run started with --metrics, and "
                  "did it reach its first --log-interval?)",
                  path);
  return st;
}

/* ---- drawing ---- */

/* Every text from the metrics file reaches the page through here (element
 * content and quoted attributes alike). */
static void html_escape(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '<')
      fputs("&lt;", out);
    else if (*s == '>')
      fputs("&gt;", out);
    else if (*s == '&')
      fputs("&amp;", out);
    else if (*s == '"')
      fputs("&quot;", out);
    else if (*s == '\'')
      fputs("&#39;", out);
    else
      fputc(*s, out);
  }
}

/* A "nice" tick step for a range (1, 2 or 5 times a power of ten). */
static double nice_step(double range, int ticks) {
  double raw = range / ticks, p = pow(10.0, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void range_of(const panel *p, bool x, double *lo, double *hi) {
  *lo = INFINITY;
  *hi = -INFINITY;
  for (int i = 0; i < p->ns; i++)
    for (int k = 0; k < p->s[i].n; k++) {
      double v = x ? p->s[i].x[k] : p->s[i].y[k];
      *lo = v < *lo ? v : *lo;
      *hi = v > *hi ? v : *hi;
    }
  if (!x && *lo > 0 && *lo < 0.5 * *hi)
    *lo = 0; /* from zero when that costs little */
  if (*hi - *lo < 1e-12 * (fabs(*hi) + 1)) {
    double pad = fabs(*hi) > 0 ? 0.05 * fabs(*hi) : 1.0;
    *lo -= pad;
    *hi += pad;
  }
}

static int points_in(const panel *p) {
  int n = 0;
  for (int i = 0; i < p->ns; i++)
    n += p->s[i].n;
  return n;
}

static void draw_axes(FILE *out, double x0, double x1, double y0, double y1) {
  int w = PANEL_W - PAD_L - PAD_R, h = PANEL_H - PAD_T - PAD_B;
  double sx = nice_step(x1 - x0, 5), sy = nice_step(y1 - y0, 4);
  for (double v = ceil(x0 / sx) * sx; v <= x1 + 1e-9 * sx; v += sx) {
    double px = PAD_L + (v - x0) / (x1 - x0) * w;
    fprintf(out,
            "<line x1='%.1f' y1='%d' x2='%.1f' y2='%d' stroke='#dcdcd2'/>"
            "<text x='%.1f' y='%d' text-anchor='middle'>%g</text>\n",
            px, PAD_T, px, PAD_T + h, px, PAD_T + h + 14, fabs(v) < 1e-12 * sx ? 0.0 : v);
  }
  for (double v = ceil(y0 / sy) * sy; v <= y1 + 1e-9 * sy; v += sy) {
    double py = PAD_T + h - (v - y0) / (y1 - y0) * h;
    fprintf(out,
            "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#dcdcd2'/>"
            "<text x='%d' y='%.1f' text-anchor='end'>%.4g</text>\n",
            PAD_L, py, PAD_L + w, py, PAD_L - 5, py + 4, fabs(v) < 1e-12 * sy ? 0.0 : v);
  }
}

static void draw_series(FILE *out, const series *s, const char *color, double x0, double x1,
                        double y0, double y1) {
  int w = PANEL_W - PAD_L - PAD_R, h = PANEL_H - PAD_T - PAD_B;
  int stride = s->n > MAX_POINTS ? (s->n + MAX_POINTS - 1) / MAX_POINTS : 1;
  if (!s->markers && s->n > 1)
    fprintf(out, "<polyline fill='none' stroke='%s' stroke-width='2' points='", color);
  for (int k = 0; k < s->n; k += stride) {
    double px = PAD_L + (s->x[k] - x0) / (x1 - x0) * w;
    double py = PAD_T + h - (s->y[k] - y0) / (y1 - y0) * h;
    if (s->markers || s->n == 1)
      fprintf(out, "<circle cx='%.1f' cy='%.1f' r='5' fill='%s'/>", px, py, color);
    else
      fprintf(out, "%.1f,%.1f ", px, py);
  }
  fputs(!s->markers && s->n > 1 ? "'/>\n" : "\n", out);
}

static void draw_panel(FILE *out, const panel *p) {
  int w = PANEL_W - PAD_L - PAD_R, h = PANEL_H - PAD_T - PAD_B;
  fprintf(out, "<svg class='plot' width='%d' height='%d' viewBox='0 0 %d %d'>\n", PANEL_W, PANEL_H,
          PANEL_W, PANEL_H);
  fputs("<text class='title' x='4' y='16'>", out);
  html_escape(out, p->title);
  fputs("</text>\n", out);
  fprintf(out,
          "<rect class='area' x='%d' y='%d' width='%d' height='%d' fill='#f4f4ea' "
          "stroke='#9a9a90' shape-rendering='crispEdges'/>\n",
          PAD_L, PAD_T, w, h);
  if (points_in(p) == 0) {
    fprintf(out, "<text x='%d' y='%d' text-anchor='middle' fill='#888'>", PAD_L + w / 2,
            PAD_T + h / 2);
    html_escape(out, p->empty ? p->empty : "not recorded in this run");
    fputs("</text></svg>\n", out);
    return;
  }
  double x0, x1, y0, y1;
  range_of(p, true, &x0, &x1);
  range_of(p, false, &y0, &y1);
  draw_axes(out, x0, x1, y0, y1);
  for (int i = 0; i < p->ns; i++)
    draw_series(out, &p->s[i], palette[i % MAX_SERIES], x0, x1, y0, y1);
  fprintf(out, "<text x='%d' y='%d' text-anchor='middle'>", PAD_L + w / 2, PANEL_H - 4);
  html_escape(out, p->xlabel);
  fputs("</text>\n", out);
  /* the legend, above the plot area on the right */
  for (int i = 0, x = PANEL_W - PAD_R; i < p->ns; i++) {
    int len = (int)strlen(p->s[i].name) * 6 + 18;
    x -= len;
    fprintf(out, "<rect x='%d' y='%d' width='10' height='10' fill='%s'/>", x, PAD_T - 16,
            palette[i % MAX_SERIES]);
    fprintf(out, "<text x='%d' y='%d'>", x + 13, PAD_T - 7);
    html_escape(out, p->s[i].name);
    fputs("</text>\n", out);
  }
  fputs("</svg>\n", out);
}

static void write_run_table(FILE *out, const report *r) {
  fputs("<table class='run'>", out);
  const cJSON *it;
  cJSON_ArrayForEach(it, r->run) {
    if (!it->string || !strcmp(it->string, "type"))
      continue;
    fputs("<tr><th>", out);
    html_escape(out, it->string);
    fputs("</th><td>", out);
    if (cJSON_IsString(it))
      html_escape(out, it->valuestring);
    else if (cJSON_IsNumber(it))
      fprintf(out, "%g", it->valuedouble);
    fputs("</td></tr>", out);
  }
  fputs("</table>\n", out);
}

static void setup_panels(report *r) {
  static char metric_title[96], rate_title[64];
  snprintf(metric_title, sizeof metric_title, "%s %s after each evaluation",
           r->split[0] ? r->split : "test", r->metric[0] ? r->metric : "metric");
  snprintf(rate_title, sizeof rate_title, "Throughput (%s, all ranks)",
           r->rate_unit[0] ? r->rate_unit : "samples/s");
  const struct {
    const char *title, *xlabel, *empty;
  } t[P_COUNT] = {
      {"Loss: training (per interval) and evaluations", "optimizer step", NULL},
      {metric_title, "optimizer step", "no evaluation recorded"},
      {rate_title, "optimizer step", NULL},
      {"Learning rate", "optimizer step", NULL},
      {"Gradient norm (global, before clipping)", "optimizer step", NULL},
      {"Memory per device (MiB)", "seconds since the start", NULL},
      {"Step time per rank (ms per optimizer step)", "optimizer step", NULL},
      {"All-reduce per step (ms) and the part hidden behind backward", "optimizer step",
       "no all-reduce: a single process"},
      {"Model FLOPs utilisation", "optimizer step", NULL},
      {"Loss scale (mixed precision)", "optimizer step", NULL},
  };
  for (int i = 0; i < P_COUNT; i++) {
    r->p[i].title = t[i].title;
    r->p[i].xlabel = t[i].xlabel;
    r->p[i].empty = t[i].empty;
  }
}

static void write_page(FILE *out, report *r, const char *source) {
  setup_panels(r);
  fputs(
      "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>\n"
      /* The page runs no script and loads nothing: a value that slipped
       * past html_escape still could not run one (inline handlers
       * included). */
      "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
      "style-src 'unsafe-inline'\">\n<title>dtrain report</title>\n"
      "<style>body{font:13px sans-serif;margin:16px;background:#fff;color:#222;width:1160px}"
      "h1{font-size:18px;margin:0 0 8px}.grid{display:grid;grid-template-columns:"
      "repeat(2,560px);gap:24px 24px}svg text{font:11px sans-serif;fill:#333}"
      "svg text.title{font:bold 13px sans-serif}table.run{border-collapse:collapse;"
      "margin:8px 0 16px}table.run th,table.run td{padding:2px 10px 2px 0;text-align:left}"
      "</style></head><body>\n<h1>dtrain report: ",
      out);
  html_escape(out, source);
  fputs("</h1>\n", out);
  if (r->run)
    write_run_table(out, r);
  fprintf(out, "<p>%ld training records, %ld evaluations", r->trains, r->evals);
  if (r->evals) {
    fputs("; last ", out);
    html_escape(out, r->split);
    fputc(' ', out);
    html_escape(out, r->metric);
    fprintf(out, " %.4f", r->last_metric);
  }
  fputs(".</p>\n<div class='grid'>\n", out);
  for (int i = 0; i < P_COUNT; i++)
    if (i < P_MFU || points_in(&r->p[i]) > 0) /* the optional ones when recorded */
      draw_panel(out, &r->p[i]);
  fputs("</div>\n</body></html>\n", out);
}

static void report_free(report *r) {
  for (int i = 0; i < P_COUNT; i++)
    for (int k = 0; k < r->p[i].ns; k++) {
      free(r->p[i].s[k].x);
      free(r->p[i].s[k].y);
    }
  cJSON_Delete(r->run);
}

dt_status dt_report_write(const char *metrics, const char *out_path) {
  report *r = calloc(1, sizeof *r);
  if (!r)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the report");
  dt_status st = read_metrics(metrics, r);
  FILE *out = NULL;
  if (st == DT_OK && !(out = fopen(out_path, "w")))
    st = DT_ERROR(DT_ERR_IO, "cannot create the report %s: %s", out_path, strerror(errno));
  if (st == DT_OK) {
    write_page(out, r, metrics);
    bool failed = ferror(out) != 0;
    if (fclose(out) != 0 || failed)
      st = DT_ERROR(DT_ERR_IO, "writing the report %s failed: %s", out_path, strerror(errno));
  }
  report_free(r);
  free(r);
  return st;
}

int dt_cli_report(int argc, char **argv, FILE *err) {
  const char *out = NULL;
  dt_flag flags[] = {
      DT_STRING_FLAG("out", &out, "FILE", "where the page goes",
                     .default_text = "report.html beside the metrics file"),
  };
  dt_flag_set set = {
      .command = "report",
      .usage = "report RUN_DIR|METRICS_FILE [flags]",
      .about =
          "Writes one self-contained HTML page (inline SVG, nothing fetched) from a run's\n"
          "metrics file (dtrain train --metrics FILE; RUN_DIR/metrics.jsonl for a\n"
          "folder): loss and test curves, throughput, learning rate, gradient norm,\n"
          "memory over time, each rank's step time and the all-reduce time with the\n"
          "part hidden behind backward.",
      DT_FLAG_TABLE(flags),
      .max_args = 1,
  };
  dt_flags_args args;
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, &args);
  if (args.nargs != 1) {
    fprintf(err, "dtrain report: which run? give RUN_DIR or a metrics file (see --help)\n");
    return 2;
  }
  const char *src = args.args[0];
  char metrics[4096], page[4096];
  struct stat sb;
  bool dir = stat(src, &sb) == 0 && S_ISDIR(sb.st_mode);
  snprintf(metrics, sizeof metrics, dir ? "%s/metrics.jsonl" : "%s", src);
  if (out) {
    snprintf(page, sizeof page, "%s", out);
  } else if (dir) {
    snprintf(page, sizeof page, "%s/report.html", src);
  } else {
    const char *slash = strrchr(src, '/');
    snprintf(page, sizeof page, "%.*sreport.html", slash ? (int)(slash - src + 1) : 0, src);
  }
  if (dt_report_write(metrics, page) != DT_OK) {
    dt_cli_print_error(err, "");
    return 1;
  }
  printf("dtrain report: wrote %s\n", page);
  return 0;
}
