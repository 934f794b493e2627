/* Corpora to token streams (files and folders, the Brown corpus), split by
 * file into training and validation; the Brown shards under data/. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/data_text_internal.h"

typedef struct corpus_file {
  char *path;
  int brown;
} corpus_file;

typedef struct file_list {
  corpus_file *v;
  int64_t len, cap;
} file_list;

static void file_list_free(file_list *l) {
  for (int64_t i = 0; i < l->len; i++)
    free(l->v[i].path);
  free(l->v);
}

static dt_status file_list_add(file_list *l, const char *dir, const char *name, int brown) {
  if (l->len == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 64;
    corpus_file *v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v)
      return DT_ERROR(DT_ERR_OOM, "cannot grow the file list to %lld", (long long)cap);
    l->v = v;
    l->cap = cap;
  }
  size_t n = (dir ? strlen(dir) + 1 : 0) + strlen(name) + 1;
  char *path = malloc(n);
  if (!path)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a path");
  if (dir)
    snprintf(path, n, "%s/%s", dir, name);
  else
    snprintf(path, n, "%s", name);
  l->v[l->len++] = (corpus_file){path, brown};
  return DT_OK;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A folder's regular files by name (hidden ones skipped); only Brown's
 * tagged files when it holds any. */
static dt_status add_folder(file_list *l, const char *dir, int brown) {
  DIR *d = opendir(dir);
  if (!d)
    return DT_ERROR(DT_ERR_IO, "cannot open the folder %s: %s", dir, strerror(errno));
  char **names = NULL;
  int64_t n = 0, cap = 0;
  int any_brown = 0;
  dt_status st = DT_OK;
  struct dirent *e;
  while (st == DT_OK && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[4096];
    struct stat sb;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path ||
        stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **v = realloc(names, (size_t)cap * sizeof *v);
      if (!v) {
        st = DT_ERROR(DT_ERR_OOM, "cannot list %s", dir);
        break;
      }
      names = v;
    }
    names[n] = strdup(e->d_name);
    if (!names[n]) {
      st = DT_ERROR(DT_ERR_OOM, "cannot list %s", dir);
      break;
    }
    any_brown |= dt_brown_is_file_name(names[n]);
    n++;
  }
  closedir(d);
  if (st == DT_OK)
    qsort(names, (size_t)n, sizeof *names, compare_names);
  for (int64_t i = 0; i < n && st == DT_OK; i++)
    if (!any_brown || dt_brown_is_file_name(names[i]))
      st = file_list_add(l, dir, names[i], brown || any_brown);
  for (int64_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  if (st == DT_OK && n == 0)
    return DT_ERROR(DT_ERR_IO, "the folder %s holds no files", dir);
  return st;
}

/* Appends one document: the end-of-text token, then the file's tokens. */
static dt_status tokenize_file(dt_bpe *bpe, const corpus_file *f, int pipe_limit_mb, dt_bytes *raw,
                               dt_bytes *text, dt_tokens *out, int64_t *text_bytes) {
  raw->len = 0;
  text->len = 0;
  DT_CHECK(dt_text_read_file(f->path, pipe_limit_mb, raw));
  const dt_bytes *doc = raw;
  if (f->brown) {
    DT_CHECK(dt_brown_detag(raw->data, (size_t)raw->len, text));
    doc = text;
  }
  int32_t eot = dt_bpe_eot(bpe);
  if (eot >= 0)
    DT_CHECK(dt_tokens_append(out, &eot, 1));
  *text_bytes += doc->len;
  return dt_bpe_encode(bpe, doc->data, (size_t)doc->len, out);
}

/* floor(x) robust to x = k - 1e-15 from rounding. */
static int64_t floor_eps(double x) { return (int64_t)floor(x + 1e-9); }

dt_status dt_corpus_tokenize(dt_bpe *bpe, const char *const *inputs, int num_inputs,
                             const dt_corpus_config *cfg, dt_tokens *train, dt_tokens *val,
                             dt_corpus_stats *stats) {
  dt_corpus_config c = cfg ? *cfg : DT_CORPUS_CONFIG_DEFAULT;
  if (!bpe || !inputs || num_inputs < 1 || !train)
    return DT_ERROR(DT_ERR_INVALID_ARG, "bpe, inputs (at least one) and train must be given");
  if (!(c.val_fraction >= 0 && c.val_fraction < 1))
    return DT_ERROR(DT_ERR_INVALID_ARG, "validation fraction %g: must be in [0, 1)",
                    c.val_fraction);
  if (c.pipe_limit_mb < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "pipe limit %d MiB: must be at least 1", c.pipe_limit_mb);
  if (c.val_fraction > 0 && !val)
    return DT_ERROR(DT_ERR_INVALID_ARG, "val is NULL with a validation fraction of %g",
                    c.val_fraction);
  file_list files = {0};
  dt_bytes raw = {0}, text = {0};
  dt_corpus_stats s = {0};
  dt_status st = DT_OK;
  for (int i = 0; i < num_inputs && st == DT_OK; i++) {
    struct stat sb;
    if (!inputs[i] || stat(inputs[i], &sb) != 0)
      st = DT_ERROR(DT_ERR_IO, "cannot read %s: %s", inputs[i] ? inputs[i] : "(null)",
                    strerror(errno));
    else if (S_ISDIR(sb.st_mode))
      st = add_folder(&files, inputs[i], c.brown);
    else if ((st = dt_text_check_input(inputs[i])) == DT_OK)
      st = file_list_add(&files, NULL, inputs[i], c.brown);
  }
  if (st != DT_OK)
    goto done;

  if (files.len == 1 && c.val_fraction > 0) {
    /* One document: its last ceil(f * n) tokens are the validation part. */
    dt_tokens all = {0};
    st = tokenize_file(bpe, &files.v[0], c.pipe_limit_mb, &raw, &text, &all, &s.text_bytes);
    int64_t nval = (int64_t)ceil(c.val_fraction * (double)all.len);
    if (st == DT_OK)
      st = dt_tokens_append(train, all.data, all.len - nval);
    if (st == DT_OK)
      st = dt_tokens_append(val, all.data + all.len - nval, nval);
    dt_tokens_free(&all);
    s.train_files = 1;
    goto done;
  }
  for (int64_t i = 0; i < files.len && st == DT_OK; i++) {
    int to_val =
        floor_eps((double)(i + 1) * c.val_fraction) > floor_eps((double)i * c.val_fraction);
    st = tokenize_file(bpe, &files.v[i], c.pipe_limit_mb, &raw, &text, to_val ? val : train,
                       &s.text_bytes);
    if (st != DT_OK)
      st = dt_error_wrap(st, "tokenizing %s", files.v[i].path);
    *(to_val ? &s.val_files : &s.train_files) += 1;
  }
done:
  if (stats)
    *stats = s;
  file_list_free(&files);
  dt_bytes_free(&raw);
  dt_bytes_free(&text);
  return st;
}

dt_status dt_brown_shards_ensure(const char *data_dir) {
  if (!data_dir)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data_dir is NULL");
  char train_path[4096], val_path[4096], raw_dir[4096], gpt2_dir[4096];
  if (snprintf(train_path, sizeof train_path, "%s/brown/train.bin", data_dir) >= 4096 ||
      snprintf(val_path, sizeof val_path, "%s/brown/val.bin", data_dir) >= 4096 ||
      snprintf(raw_dir, sizeof raw_dir, "%s/brown/raw", data_dir) >= 4096 ||
      snprintf(gpt2_dir, sizeof gpt2_dir, "%s/gpt2", data_dir) >= 4096)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data_dir too long: %s", data_dir);
  struct stat sb;
  if (stat(train_path, &sb) == 0 && stat(val_path, &sb) == 0)
    return DT_OK;
  if (stat(raw_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return DT_ERROR(DT_ERR_IO, "the Brown corpus is missing: %s: run tools/setup.sh", raw_dir);
  dt_bpe *bpe = NULL;
  DT_CHECK(dt_bpe_load_dir(gpt2_dir, NULL, &bpe));
  dt_tokens train = {0}, val = {0};
  dt_corpus_config cfg = DT_CORPUS_CONFIG_DEFAULT;
  cfg.brown = 1;
  const char *inputs[] = {raw_dir};
  dt_status st;
  DT_CHECK_GOTO(dt_corpus_tokenize(bpe, inputs, 1, &cfg, &train, &val, NULL), st, done);
  DT_CHECK_GOTO(dt_shard_write(val_path, val.data, val.len), st, done);
  DT_CHECK_GOTO(dt_shard_write(train_path, train.data, train.len), st, done);
done:
  dt_tokens_free(&train);
  dt_tokens_free(&val);
  dt_bpe_destroy(bpe);
  return st;
}
