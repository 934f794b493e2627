/* Checks what `dtrain train --metrics/--trace` and `dtrain report` wrote,
 * for tests/launch/observe_cli_test.sh. Parses with cJSON, the library the
 * writers use; reads PNG screenshots with zlib.
 *
 *   obs_check metrics FILE [--world W] [--ddp] [--split val] [--no-metric] [--tokens]
 *                                                every record has its documented keys
 *   obs_check trace FILE [--lanes a,b,...] [--overlap comm:backward]
 *                        [--launched-during comm:backward] [--steps A:B]
 *       --overlap: a span of the lane overlaps a span of that name;
 *       --launched-during: one was queued (ts - args.queued_ms) inside one
 *   obs_check png FILE --panels N                N plot areas, each with a drawn series
 *
 * Prints "ok: ..." and exits 0, or prints what is wrong and exits 1. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int failures;

static void fail(const char *fmt, const char *a, long b) {
  fprintf(stderr, "obs_check: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  failures++;
}

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      char *b = realloc(buf, 2 * cap + 1);
      if (!b) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = b;
      cap *= 2;
    }
  }
  fclose(f);
  if (buf)
    buf[n] = '\0';
  *len = n;
  return buf;
}

static const char *arg_after(int argc, char **argv, const char *flag) {
  for (int i = 0; i + 1 < argc; i++)
    if (!strcmp(argv[i], flag))
      return argv[i + 1];
  return NULL;
}

static bool has_flag(int argc, char **argv, const char *flag) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], flag))
      return true;
  return false;
}

/* ---- metrics ---- */

static void need(const cJSON *o, const char *key, bool number_or_null, long line) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v)
    fail("line %2$ld: key '%1$s' missing", key, line);
  else if (number_or_null && !cJSON_IsNumber(v) && !cJSON_IsNull(v))
    fail("line %2$ld: key '%1$s' is neither a number nor null", key, line);
}

static int check_metrics(const char *path, int argc, char **argv) {
  size_t len = 0;
  char *text = read_all(path, &len);
  if (!text) {
    fail("cannot read %s%.0ld", path, 0);
    return 1;
  }
  int world = arg_after(argc, argv, "--world") ? atoi(arg_after(argc, argv, "--world")) : 1;
  bool ddp = has_flag(argc, argv, "--ddp");
  static const char *const train_keys[] = {
      "step",           "epoch",   "batch",        "batches",
      "time",           "loss",    "lr",           "grad_norm",
      "samples_per_s",  "step_ms", "allreduce_ms", "allreduce_hidden",
      "allreduce_bytes"};
  static const char *const eval_keys[] = {"step", "epoch", "time", "train_loss"};
  const char *split = arg_after(argc, argv, "--split") ? arg_after(argc, argv, "--split") : "test";
  char split_loss[64], split_metric[64];
  snprintf(split_loss, sizeof split_loss, "%s_loss", split);
  snprintf(split_metric, sizeof split_metric, "%s_accuracy", split);
  bool metric = !has_flag(argc, argv, "--no-metric"), tokens = has_flag(argc, argv, "--tokens");
  static const char *const run_keys[] = {"world",  "batch",       "global_batch",    "accum",
                                         "epochs", "total_steps", "steps_per_epoch", "threads"};
  long line = 0, runs = 0, trains = 0, evals = 0;
  for (char *p = text, *end; *p; p = end + 1) {
    end = strchr(p, '\n');
    if (!end) {
      fail("line %2$ld does not end with a newline%1$s", "", line + 1);
      break;
    }
    *end = '\0';
    line++;
    cJSON *o = cJSON_Parse(p);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (!cJSON_IsObject(o) || !cJSON_IsString(type)) {
      fail("line %2$ld is not a JSON object with a \"type\": %1$.80s", p, line);
      cJSON_Delete(o);
      continue;
    }
    const char *t = type->valuestring;
    if (!strcmp(t, "run")) {
      runs++;
      for (size_t k = 0; k < sizeof run_keys / sizeof *run_keys; k++)
        need(o, run_keys[k], true, line);
      const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "world");
      if (cJSON_IsNumber(w) && w->valueint != world)
        fail("run record: world %2$ld, expected it from --world%1$s", "", (long)w->valueint);
    } else if (!strcmp(t, "train")) {
      trains++;
      for (size_t k = 0; k < sizeof train_keys / sizeof *train_keys; k++)
        need(o, train_keys[k], true, line);
      if (tokens)
        need(o, "tokens_per_s", true, line);
      const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "rank_step_ms");
      if (!cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) != world)
        fail("line %2$ld: rank_step_ms is not an array of one number per rank%1$s", "", line);
      const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "memory"), *d;
      if (!cJSON_IsArray(mem) || cJSON_GetArraySize(mem) < 1)
        fail("line %2$ld: memory is not an array of devices%1$s", "", line);
      cJSON_ArrayForEach(d, mem) {
        need(d, "device", false, line);
        need(d, "allocated_mib", true, line);
        need(d, "reserved_mib", true, line);
        need(d, "peak_mib", true, line);
      }
      const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss");
      const cJSON *norm = cJSON_GetObjectItemCaseSensitive(o, "grad_norm");
      if (!cJSON_IsNumber(loss) || !(loss->valuedouble > 0))
        fail("line %2$ld: loss is not a positive number%1$s", "", line);
      if (!cJSON_IsNumber(norm) || !(norm->valuedouble > 0))
        fail("line %2$ld: grad_norm is not a positive number%1$s", "", line);
      const cJSON *ar = cJSON_GetObjectItemCaseSensitive(o, "allreduce_ms");
      const cJSON *hid = cJSON_GetObjectItemCaseSensitive(o, "allreduce_hidden");
      const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(o, "allreduce_bytes");
      if (ddp && (!cJSON_IsNumber(ar) || !(ar->valuedouble > 0) || !cJSON_IsNumber(hid) ||
                  hid->valuedouble < 0 || hid->valuedouble > 1 || !cJSON_IsNumber(bytes) ||
                  !(bytes->valuedouble > 0)))
        fail(
            "line %2$ld: under DDP allreduce_ms and allreduce_bytes must be > 0 and "
            "allreduce_hidden in [0, 1]%1$s",
            "", line);
      if (!ddp && (!cJSON_IsNull(ar) || !cJSON_IsNull(hid) || !cJSON_IsNull(bytes)))
        fail(
            "line %2$ld: without DDP allreduce_ms, allreduce_hidden and allreduce_bytes must be "
            "null%1$s",
            "", line);
    } else if (!strcmp(t, "eval")) {
      evals++;
      for (size_t k = 0; k < sizeof eval_keys / sizeof *eval_keys; k++)
        need(o, eval_keys[k], true, line);
      need(o, split_loss, true, line);
      if (metric)
        need(o, split_metric, true, line);
    } else if (!strcmp(t, "oom")) { /* an out-of-memory recovery (--max-memory) */
      static const char *const oom_keys[] = {"step",        "epoch", "batch",  "time",
                                             "micro_batch", "accum", "retries"};
      for (size_t k = 0; k < sizeof oom_keys / sizeof *oom_keys; k++)
        need(o, oom_keys[k], true, line);
      need(o, "error", false, line);
    } else {
      fail("line %2$ld: unknown type '%1$s'", t, line);
    }
    cJSON_Delete(o);
  }
  free(text);
  if (runs != 1 || trains < 1 || evals < 1)
    fail("expected one run record, train records and an eval record; got %s%ld runs", "", runs);
  if (failures)
    return 1;
  printf("ok: %s: %ld lines, %ld train and %ld eval records, every documented key\n", path, line,
         trains, evals);
  return 0;
}

/* ---- trace ---- */

#define MAX_LANES 256

typedef struct span {
  int pid, tid;
  double ts, dur, step;
  double queued_us; /* args.queued_ms in µs (comm spans), -1 = none */
  const char *name;
} span;

static int check_trace(const char *path, int argc, char **argv) {
  size_t len = 0;
  char *text = read_all(path, &len);
  cJSON *root = text ? cJSON_Parse(text) : NULL;
  free(text);
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  if (!cJSON_IsArray(events)) {
    fail("%s is not well-formed trace JSON (an object with a traceEvents array)%.0ld", path, 0);
    cJSON_Delete(root);
    return 1;
  }
  const char *lane_name[MAX_LANES] = {0};
  int n_events = cJSON_GetArraySize(events), n_spans = 0;
  span *spans = calloc((size_t)n_events + 1, sizeof *spans);
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    if (!cJSON_IsString(ph) || !cJSON_IsString(name) || !cJSON_IsNumber(pid) ||
        !cJSON_IsNumber(tid)) {
      fail("an event lacks ph, name, pid or tid%s%.0ld", "", 0);
      continue;
    }
    int t = tid->valueint;
    if (!strcmp(ph->valuestring, "M") && !strcmp(name->valuestring, "thread_name")) {
      const cJSON *n =
          cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
      if (t >= 0 && t < MAX_LANES && cJSON_IsString(n))
        lane_name[t] = n->valuestring;
    } else if (!strcmp(ph->valuestring, "X")) {
      const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
      const cJSON *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
      if (!cJSON_IsNumber(ts) || !cJSON_IsNumber(dur) || dur->valuedouble < 0) {
        fail("span '%s' lacks ts or a dur >= 0%.0ld", name->valuestring, 0);
        continue;
      }
      const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
      const cJSON *step = cJSON_GetObjectItemCaseSensitive(args, "step");
      const cJSON *queued = cJSON_GetObjectItemCaseSensitive(args, "queued_ms");
      spans[n_spans++] = (span){pid->valueint,
                                t,
                                ts->valuedouble,
                                dur->valuedouble,
                                cJSON_IsNumber(step) ? step->valuedouble : -1.0,
                                cJSON_IsNumber(queued) ? 1e3 * queued->valuedouble : -1.0,
                                name->valuestring};
    }
  }
  /* spans per lane */
  const char *lanes = arg_after(argc, argv, "--lanes");
  char buf[512];
  snprintf(buf, sizeof buf, "%s", lanes ? lanes : "");
  for (char *l = strtok(buf, ","); l; l = strtok(NULL, ",")) {
    int count = 0;
    for (int i = 0; i < n_spans; i++)
      if (spans[i].tid >= 0 && spans[i].tid < MAX_LANES && lane_name[spans[i].tid] &&
          !strcmp(lane_name[spans[i].tid], l))
        count++;
    if (count == 0)
      fail("no span on lane '%s'%.0ld", l, 0);
    else
      printf("lane %s: %d spans\n", l, count);
  }
  /* comm spans overlapping backward spans */
  const char *overlap = arg_after(argc, argv, "--overlap");
  if (overlap) {
    char a[64] = "", b[64] = "";
    sscanf(overlap, "%63[^:]:%63s", a, b);
    int pairs = 0;
    for (int i = 0; i < n_spans; i++) {
      const span *x = &spans[i];
      const char *xl = x->tid < MAX_LANES ? lane_name[x->tid] : NULL;
      if (!xl || strcmp(xl, a))
        continue;
      for (int k = 0; k < n_spans; k++) {
        const span *y = &spans[k];
        if (y->pid == x->pid && !strcmp(y->name, b) && x->ts < y->ts + y->dur &&
            y->ts < x->ts + x->dur)
          pairs++;
      }
    }
    if (pairs == 0)
      fail("no span of lane '%s' overlaps a span named the second of --overlap%.0ld", a, 0);
    else
      printf("overlap: %d (%s span, %s span) pairs overlap in time\n", pairs, a, b);
  }
  /* comm spans queued while a backward span ran */
  const char *during = arg_after(argc, argv, "--launched-during");
  if (during) {
    char a[64] = "", b[64] = "";
    sscanf(during, "%63[^:]:%63s", a, b);
    int launched = 0, with_queue = 0;
    for (int i = 0; i < n_spans; i++) {
      const span *x = &spans[i];
      const char *xl = x->tid < MAX_LANES ? lane_name[x->tid] : NULL;
      if (!xl || strcmp(xl, a) || x->queued_us < 0)
        continue;
      with_queue++;
      double at = x->ts - x->queued_us;
      for (int k = 0; k < n_spans; k++) {
        const span *y = &spans[k];
        if (y->pid == x->pid && !strcmp(y->name, b) && y->ts <= at && at <= y->ts + y->dur) {
          launched++;
          break;
        }
      }
    }
    if (launched == 0)
      fail(
          "no span of lane '%s' (of %ld with queued_ms) was queued inside a span named the "
          "second of --launched-during",
          a, (long)with_queue);
    else
      printf("launched during: %d of %d %s spans were queued inside a %s span\n", launched,
             with_queue, a, b);
  }
  /* bounded by --trace-steps */
  const char *steps = arg_after(argc, argv, "--steps");
  double first = 0, last = 0;
  if (steps && sscanf(steps, "%lf:%lf", &first, &last) == 2) {
    double lo = 1e300, hi = -1e300;
    for (int i = 0; i < n_spans; i++) {
      lo = spans[i].step < lo ? spans[i].step : lo;
      hi = spans[i].step > hi ? spans[i].step : hi;
    }
    if (n_spans == 0 || lo != first || hi != last)
      fail("the spans' steps run %s%ld.., not exactly the --steps range", "", (long)lo);
    else
      printf("steps: every span is of steps %g..%g\n", lo, hi);
  }
  free(spans);
  cJSON_Delete(root);
  if (failures)
    return 1;
  printf("ok: %s: %d events, %d spans\n", path, n_events, n_spans);
  return 0;
}

/* ---- PNG (8-bit RGB or RGBA, non-interlaced: what Chromium writes) ---- */

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int paeth(int a, int b, int c) {
  int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* RGB pixels of the PNG into *rgb (w * h * 3); false on anything unexpected. */
static bool read_png(const char *path, int *w, int *h, unsigned char **rgb) {
  size_t len = 0;
  unsigned char *f = (unsigned char *)read_all(path, &len);
  if (!f || len < 33 || memcmp(f, "\x89PNG\r\n\x1a\n", 8) != 0) {
    free(f);
    return false;
  }
  *w = (int)be32(f + 16);
  *h = (int)be32(f + 20);
  int depth = f[24], color = f[25], interlace = f[28];
  int ch = color == 6 ? 4 : color == 2 ? 3 : 0;
  if (depth != 8 || ch == 0 || interlace != 0 || *w <= 0 || *h <= 0) {
    free(f);
    return false;
  }
  size_t zcap = 0, zlen = 0;
  unsigned char *z = NULL;
  for (size_t p = 8; p + 12 <= len;) {
    uint32_t n = be32(f + p);
    if (p + 12 + n > len)
      break;
    if (!memcmp(f + p + 4, "IDAT", 4)) {
      if (zlen + n > zcap) {
        zcap = 2 * (zlen + n);
        z = realloc(z, zcap);
      }
      memcpy(z + zlen, f + p + 8, n);
      zlen += n;
    }
    p += 12 + n;
  }
  free(f);
  size_t stride = (size_t)*w * ch, raw_len = (stride + 1) * (size_t)*h;
  unsigned char *raw = malloc(raw_len);
  uLongf got = raw_len;
  bool ok = z && raw && uncompress(raw, &got, z, zlen) == Z_OK && got == raw_len;
  free(z);
  *rgb = ok ? malloc((size_t)*w * *h * 3) : NULL;
  unsigned char *prev = NULL;
  for (int y = 0; ok && *rgb && y < *h; y++) {
    unsigned char *row = raw + y * (stride + 1), type = row[0], *cur = row + 1;
    for (size_t i = 0; i < stride; i++) {
      int a = i >= (size_t)ch ? cur[i - ch] : 0, b = prev ? prev[i] : 0;
      int c = prev && i >= (size_t)ch ? prev[i - ch] : 0;
      int v = type == 1   ? a
              : type == 2 ? b
              : type == 3 ? (a + b) / 2
              : type == 4 ? paeth(a, b, c)
                          : 0;
      cur[i] = (unsigned char)(cur[i] + v);
    }
    for (int x = 0; x < *w; x++)
      memcpy(*rgb + ((size_t)y * *w + x) * 3, cur + (size_t)x * ch, 3);
    prev = cur;
  }
  free(raw);
  return ok && *rgb;
}

/* Plot areas: connected regions of non-white pixels at least 200x100 in
 * size (the report's filled plot rectangles); a drawn series shows as
 * saturated "ink" pixels inside one. */
static int check_png(const char *path, int argc, char **argv) {
  int w = 0, h = 0;
  unsigned char *rgb = NULL;
  if (!read_png(path, &w, &h, &rgb)) {
    fail("%s is not a PNG this checker reads (8-bit RGB/RGBA)%.0ld", path, 0);
    return 1;
  }
  int want = arg_after(argc, argv, "--panels") ? atoi(arg_after(argc, argv, "--panels")) : 1;
  size_t n = (size_t)w * h;
  int *label = calloc(n, sizeof *label), *stack = malloc(n * sizeof *stack);
  int panels = 0, drawn = 0;
#define PIX(i) (rgb + (size_t)(i)*3)
#define NONWHITE(i) (PIX(i)[0] < 240 || PIX(i)[1] < 240 || PIX(i)[2] < 240)
  for (size_t i = 0; i < n; i++) {
    if (label[i] || !NONWHITE(i))
      continue;
    int sp = 0, x0 = w, x1 = -1, y0 = h, y1 = -1;
    long ink = 0;
    stack[sp++] = (int)i;
    label[i] = 1;
    while (sp > 0) {
      int p = stack[--sp], x = p % w, y = p / w;
      const unsigned char *c = PIX(p);
      int mx = c[0] > c[1] ? (c[0] > c[2] ? c[0] : c[2]) : (c[1] > c[2] ? c[1] : c[2]);
      int mn = c[0] < c[1] ? (c[0] < c[2] ? c[0] : c[2]) : (c[1] < c[2] ? c[1] : c[2]);
      ink += mx - mn > 60;
      x0 = x < x0 ? x : x0;
      x1 = x > x1 ? x : x1;
      y0 = y < y0 ? y : y0;
      y1 = y > y1 ? y : y1;
      const int nb[4] = {x > 0 ? p - 1 : -1, x + 1 < w ? p + 1 : -1, y > 0 ? p - w : -1,
                         y + 1 < h ? p + w : -1};
      for (int k = 0; k < 4; k++)
        if (nb[k] >= 0 && !label[nb[k]] && NONWHITE(nb[k])) {
          label[nb[k]] = 1;
          stack[sp++] = nb[k];
        }
    }
    if (x1 - x0 >= 200 && y1 - y0 >= 100) {
      panels++;
      drawn += ink >= 50;
      printf("plot area %d: %dx%d at (%d, %d), %ld ink pixels\n", panels, x1 - x0 + 1, y1 - y0 + 1,
             x0, y0, ink);
    }
  }
  free(stack);
  free(label);
  free(rgb);
  if (panels < want || drawn < want) {
    fprintf(stderr, "obs_check: %s: %d plot areas, %d with a drawn series; expected %d\n", path,
            panels, drawn, want);
    return 1;
  }
  printf("ok: %s: %d plot areas, %d with a drawn series\n", path, panels, drawn);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: obs_check metrics|trace|png FILE [options]\n");
    return 2;
  }
  if (!strcmp(argv[1], "metrics"))
    return check_metrics(argv[2], argc - 3, argv + 3);
  if (!strcmp(argv[1], "trace"))
    return check_trace(argv[2], argc - 3, argv + 3);
  if (!strcmp(argv[1], "png"))
    return check_png(argv[2], argc - 3, argv + 3);
  fprintf(stderr, "obs_check: unknown check '%s'\n", argv[1]);
  return 2;
}
