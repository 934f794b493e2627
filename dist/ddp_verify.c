/* Cross-rank check that every rank built the same model: its parameter and
 * buffer list, compared by dt_dist_agree_text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/agree.h"
#include "dist/ddp_internal.h"

typedef struct text {
  char *s;
  size_t len, cap;
} text;

static dt_status text_append(text *t, const char *line) {
  size_t n = strlen(line);
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 4096;
    while (cap < t->len + n + 1)
      cap *= 2;
    char *s = realloc(t->s, cap);
    if (s == NULL)
      return DT_ERROR(DT_ERR_OOM, "describing the model's parameters: out of host memory");
    t->s = s;
    t->cap = cap;
  }
  memcpy(t->s + t->len, line, n + 1);
  t->len += n;
  return DT_OK;
}

static void describe_tensor_line(const char *kind, int i, const char *name, const dt_tensor *t,
                                 char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s %d \"%s\" %s[", kind, i, name, dt_dtype_name(dt_tensor_dtype(t)));
  for (int d = 0; d < dt_tensor_ndim(t) && n > 0 && (size_t)n < cap; d++)
    n +=
        snprintf(buf + n, cap - (size_t)n, "%s%lld", d ? ", " : "", (long long)dt_tensor_dim(t, d));
  if (n > 0 && (size_t)n < cap)
    snprintf(buf + n, cap - (size_t)n, "]\n");
}

static dt_status describe_model(dt_module *model, dt_param_arena *arena, text *out) {
  char line[512];
  for (int i = 0; i < dt_param_arena_count(arena); i++) {
    const char *name = NULL;
    dt_tensor *p = dt_param_arena_param(arena, i, &name);
    describe_tensor_line("parameter", i, name, p, line, sizeof line);
    DT_CHECK(text_append(out, line));
  }
  for (int i = 0; i < dt_module_num_buffers(model); i++) {
    const char *name = NULL;
    dt_tensor *b = dt_module_buffer_at(model, i, &name);
    describe_tensor_line("buffer", i, name, b, line, sizeof line);
    DT_CHECK(text_append(out, line));
  }
  return text_append(out, "end\n");
}

dt_status dt_ddp_verify_parameters(dt_comm *comm, dt_module *model, dt_param_arena *arena) {
  if (dt_comm_size(comm) == 1)
    return DT_OK;
  text mine = {0};
  dt_status st = describe_model(model, arena, &mine);
  if (st == DT_OK)
    st = dt_dist_agree_text(comm, dt_param_arena_device(arena), mine.s,
                            "registered different models",
                            "build the same model (same --model and sizes) on every rank");
  free(mine.s);
  return st;
}
