/* Resuming (train/train_checkpoint.h): what must match, finding the
 * newest complete checkpoint, loading the weights and the optimizer state
 * (any sharding) into every replica. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checkpoint.h"
#include "train/train_checkpoint_internal.h"
#include "train/train_loop.h"

/* ---- what must match on resume ---- */
int64_t dt_train_ckpt_global_batch(const dt_train_ckpt_run *r) {
  return (int64_t)r->cfg->batch * r->world;
}

const char *dt_train_ckpt_model_name(const dt_train_ckpt_run *r) { return r->cfg->task->name; }

const char *dt_train_ckpt_data_name(const dt_train_ckpt_run *r) {
  const dt_train_config *c = r->cfg;
  if (c->image_folder) { /* its last component: the run directory's name has no slashes */
    const char *slash = strrchr(c->image_folder, '/');
    return slash ? (slash[1] ? slash + 1 : "images") : c->image_folder;
  }
  return c->data ? c->data->name : c->task->data[0].name;
}

/* "config.<flag> value" lines; the derived ones are named for their flags
 * in the messages (config_advice). */
void dt_train_ckpt_config_lines(const dt_train_ckpt_run *r, char *buf, size_t cap) {
  const dt_train_config *c = r->cfg;
  /* The step schedule's derived step size (one epoch) depends on the
   * plan; the others ignore it. */
  long long step_size = c->schedule == DT_LR_DECAY_STEP ? (long long)r->schedule->step_size : 0;
  snprintf(buf, cap,
           "config.model %s\nconfig.data %s\nconfig.ctx %lld\nconfig.train-samples "
           "%lld\nconfig.global-batch "
           "%lld\nconfig.accum %d\nconfig.optimizer %s\nconfig.lr %.9g\nconfig.momentum %.9g\n"
           "config.nesterov %d\nconfig.weight-decay %.9g\nconfig.schedule %s\nconfig.warmup "
           "%d\nconfig.step-size %lld\nconfig.gamma %.9g\nconfig.min-lr %.9g\n"
           "config.schedule-steps %lld\nconfig.clip %.9g\nconfig.seed %llu\n"
           "config.beta2 %.9g\nconfig.decay-matrices-only %d\nconfig.precision %s\n",
           dt_train_ckpt_model_name(r), dt_train_ckpt_data_name(r), (long long)r->context,
           (long long)r->train_samples, (long long)dt_train_ckpt_global_batch(r), c->accum,
           dt_train_optimizer_name(c->optimizer), (double)c->lr, (double)c->momentum,
           c->nesterov ? 1 : 0, (double)c->weight_decay, dt_train_schedule_name(c->schedule),
           c->warmup, step_size, (double)c->gamma, (double)c->min_lr,
           (long long)r->schedule->total_steps, (double)c->clip, (unsigned long long)c->seed,
           (double)c->beta2, c->decay_matrices_only ? 1 : 0, dt_precision_name(c->precision));
}

/* A value as the user wrote it: "0.05", not "0.0500000007", unless %g
 * would hide the difference. */
static const char *shown(const char *v, const char *other, char *buf, size_t cap) {
  char *end = NULL, a[64], b[64];
  double x = strtod(v, &end);
  if (end == v || *end != '\0')
    return v;
  snprintf(a, sizeof a, "%g", x);
  snprintf(b, sizeof b, "%g", strtod(other, NULL));
  if (!strcmp(a, b))
    return v;
  snprintf(buf, cap, "%s", a);
  return buf;
}

static const char *config_advice(const char *key) {
  if (!strcmp(key, "config.global-batch"))
    return "keep the global batch (`batch` x ranks) when resuming on another number of ranks";
  if (!strcmp(key, "config.schedule-steps"))
    return "the LR schedule must span the same steps: keep `epochs`, `max_steps` and the "
           "global batch";
  if (!strcmp(key, "config.ctx"))
    return "the model's position table and the data's windows depend on it: resume with the "
           "checkpoint's `ctx`";
  if (!strcmp(key, "config.train-samples"))
    return "the training data differ: resume with the checkpoint's `data` and `data_dir`";
  return "start a new run (another `run_dir`) for another configuration";
}

/* The first line of `want` whose value in `have` differs, as an error. */
static dt_status compare_config(const char *path, const char *have, size_t have_size,
                                const char *want, const dt_train_ckpt_run *r) {
  for (const char *line = want; *line;) {
    const char *nl = strchr(line, '\n');
    char key[64], value[256], saved[256];
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    const char *sp = memchr(line, ' ', len);
    snprintf(key, sizeof key, "%.*s", (int)(sp - line), line);
    snprintf(value, sizeof value, "%.*s", (int)(len - (size_t)(sp - line) - 1), sp + 1);
    char what[4200];
    snprintf(what, sizeof what, "%s: section 'meta'", path);
    DT_CHECK(dt_state_meta_get(have, have_size, key, what, saved, sizeof saved));
    if (strcmp(saved, value) != 0) {
      if (!strcmp(key, "config.global-batch")) {
        long long g = atoll(saved);
        if (g % r->world == 0)
          return DT_ERROR(DT_ERR_INVALID_ARG,
                          "%s: the checkpoint's global batch is %s, this run's %s (%d ranks x "
                          "`batch` %d): with %d ranks use `batch` %lld",
                          path, saved, value, r->world, r->cfg->batch, r->world, g / r->world);
        return DT_ERROR(DT_ERR_INVALID_ARG,
                        "%s: the checkpoint's global batch is %s, which %d ranks cannot share "
                        "evenly: resume on a number of ranks that divides it",
                        path, saved, r->world);
      }
      /* derived, not fields: named by what they count */
      if (!strcmp(key, "config.schedule-steps"))
        return DT_ERROR(DT_ERR_INVALID_ARG,
                        "%s: the checkpoint's LR schedule spans %s optimizer steps, this run's %s: "
                        "%s",
                        path, saved, value, config_advice(key));
      if (!strcmp(key, "config.train-samples"))
        return DT_ERROR(DT_ERR_INVALID_ARG,
                        "%s: the checkpoint's training set holds %s samples, this run's %s: %s",
                        path, saved, value, config_advice(key));
      char a[64], b[64], field[64];
      /* "config.weight-decay" names the field weight_decay */
      snprintf(field, sizeof field, "%s", key + 7);
      for (char *p = field; *p; p++)
        *p = *p == '-' ? '_' : *p;
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "%s: the checkpoint was written with `%s` %s, this run has `%s` %s: %s", path,
                      field, shown(saved, value, a, sizeof a), field,
                      shown(value, saved, b, sizeof b), config_advice(key));
    }
    line = nl ? nl + 1 : line + len;
  }
  return DT_OK;
}

/* ---- resuming ---- */
/* dt_ckpt_verify, and the manifest lists the files a resume reads: one
 * that is not listed would be read without its CRC. */
static dt_status verify_checkpoint(const char *dir, dt_ckpt_manifest *m) {
  DT_CHECK(dt_ckpt_verify(dir, m));
  static const char *const needed[] = {DT_CKPT_WEIGHTS_FILE, DT_CKPT_STATE_FILE};
  for (int k = 0; k < 2; k++) {
    int i = 0;
    while (i < m->n_files && strcmp(m->files[i].name, needed[k]) != 0)
      i++;
    if (i == m->n_files)
      return DT_ERROR(DT_ERR_FORMAT, "%s/%s does not list %s", dir, DT_CKPT_MANIFEST, needed[k]);
  }
  return DT_OK;
}

/* The newest complete checkpoint in `parent` (a run's checkpoints/), ""
 * when it holds none (or does not exist yet); damaged ones are reported. */
dt_status dt_train_ckpt_newest(const char *parent, FILE *log, char *out, size_t cap) {
  dt_ckpt_manifest m;
  char names[256][64];
  int n = 0;
  DT_CHECK(dt_ckpt_list(parent, names, 256, &n));
  int damaged = 0; /* with a manifest, but their files disagree with it */
  for (int i = 0; i < n; i++) {
    char dir[4400], manifest[4500];
    snprintf(dir, sizeof dir, "%s/%s", parent, names[i]);
    snprintf(manifest, sizeof manifest, "%s/%s", dir, DT_CKPT_MANIFEST);
    if (verify_checkpoint(dir, &m) == DT_OK) {
      snprintf(out, cap, "%s", dir);
      return DT_OK;
    }
    damaged += access(manifest, F_OK) == 0;
    if (log)
      fprintf(log, "dtrain: skipping checkpoint %s: %s\n", dir, dt_last_error());
  }
  out[0] = '\0';
  /* Only interrupted saves (no manifest): there is no checkpoint yet. */
  if (damaged > 0)
    return DT_ERROR(DT_ERR_FORMAT,
                    "none of the %d checkpoints in %s is complete and intact (each is named "
                    "above): remove them to start from scratch",
                    n, parent);
  return DT_OK;
}

dt_status dt_train_ckpt_resolve(const char *path, FILE *log, char *out, size_t cap) {
  dt_ckpt_manifest m;
  char manifest[4200], parent[4200];
  snprintf(manifest, sizeof manifest, "%s/%s", path, DT_CKPT_MANIFEST);
  snprintf(parent, sizeof parent, "%s/checkpoints", path);
  struct stat sb;
  if (stat(path, &sb) != 0)
    return DT_ERROR(DT_ERR_IO, "%s: no such checkpoint or run directory: %s", path,
                    strerror(errno));
  if (access(manifest, F_OK) == 0 || stat(parent, &sb) != 0) {
    DT_CHECK(verify_checkpoint(path, &m));
    snprintf(out, cap, "%s", path);
    return DT_OK;
  }
  return dt_train_ckpt_newest(parent, log, out, cap);
}

static dt_status meta_int(const char *meta, size_t n, const char *key, const char *what,
                          long long *out) {
  char buf[64];
  DT_CHECK(dt_state_meta_get(meta, n, key, what, buf, sizeof buf));
  char *end = NULL;
  *out = strtoll(buf, &end, 10);
  if (*end != '\0')
    return DT_ERROR(DT_ERR_FORMAT, "%s: '%s' is '%s', not an integer", what, key, buf);
  return DT_OK;
}

/* The trainer state of a checkpoint directory and its meta section; path
 * and what (for messages) are filled in. */
typedef struct state_meta {
  char path[4200], what[4300];
  dt_state_file *f;
  const char *text;
  size_t size;
} state_meta;

static dt_status open_meta(const char *ckpt_dir, state_meta *m) {
  snprintf(m->path, sizeof m->path, "%s/%s", ckpt_dir, DT_CKPT_STATE_FILE);
  snprintf(m->what, sizeof m->what, "%s: section 'meta'", m->path);
  m->f = NULL;
  DT_CHECK(dt_state_file_open(m->path, &m->f));
  const void *text = NULL;
  dt_status st = dt_state_file_section(m->f, "meta", &text, &m->size);
  m->text = text;
  if (st != DT_OK) {
    dt_state_file_close(m->f);
    m->f = NULL;
  }
  return st;
}

dt_status dt_train_ckpt_meta(const char *ckpt_dir, const char *key, char *buf, size_t cap) {
  state_meta m;
  DT_CHECK(open_meta(ckpt_dir, &m));
  dt_status st = dt_state_meta_get(m.text, m.size, key, m.what, buf, cap);
  dt_state_file *f = m.f;
  dt_state_file_close(f);
  return st;
}

/* Adds one optimizer section to the flat state (n_buffers x total). */
static dt_status add_optimizer_section(const dt_state_file *f, const char *path, const char *name,
                                       int64_t total, uint32_t nbuf, float *flat,
                                       int64_t *covered) {
  char what[4400];
  snprintf(what, sizeof what, "%s: section '%s'", path, name);
  const void *bytes = NULL;
  size_t size = 0;
  dt_ckpt_optim_shard sh;
  DT_CHECK(dt_state_file_section(f, name, &bytes, &size));
  DT_CHECK(dt_ckpt_optim_section_decode(bytes, size, what, &sh));
  if (sh.total != (uint64_t)total || sh.n_buffers != nbuf)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: %u state buffers over %llu parameters, this run's optimizer has %u "
                    "over %lld: the checkpoint is of another model or optimizer",
                    what, sh.n_buffers, (unsigned long long)sh.total, nbuf, (long long)total);
  dt_train_ckpt_copy_segments(&sh, flat, NULL, 1);
  for (uint32_t i = 0; i < sh.n_segments; i++)
    *covered += (int64_t)sh.segments[2 * i + 1];
  return DT_OK;
}

/* The optimizer state of the checkpoint (its "optimizer" section, or every
 * rank's optimizer.rank<R>.bin under ZeRO, whatever the world size was)
 * assembled over the flat space, then each replica's own part of it. */
static dt_status load_optimizer(const dt_train_ckpt_run *r, const dt_state_file *f, const char *dir,
                                const char *path, int64_t step) {
  dt_optimizer *opt = r->opts[0];
  int64_t numel = dt_optim_state_numel(opt), local = dt_optim_local_numel(opt);
  int64_t total = dt_module_parameter_count(r->models[0]);
  uint32_t nbuf = local > 0 ? (uint32_t)(numel / local) : 0;
  float *flat = calloc((size_t)(nbuf * total > 0 ? nbuf * total : 1), sizeof(float));
  if (!flat)
    return DT_ERROR(DT_ERR_OOM, "resuming: out of host memory");
  int64_t covered = 0;
  dt_status st = DT_OK;
  if (dt_state_file_has_section(f, "optimizer")) {
    st = add_optimizer_section(f, path, "optimizer", total, nbuf, flat, &covered);
  } else if (dt_state_file_has_section(f, "optimizer.part0")) {
    char name[DT_STATE_NAME_MAX] = "optimizer.part0";
    for (int i = 1; st == DT_OK && dt_state_file_has_section(f, name); i++) {
      st = add_optimizer_section(f, path, name, total, nbuf, flat, &covered);
      snprintf(name, sizeof name, "optimizer.part%d", i);
    }
  } else {
    dt_ckpt_manifest m;
    st = dt_ckpt_manifest_read(dir, &m);
    for (int i = 0; st == DT_OK && i < m.n_files; i++) {
      int rank = 0;
      if (sscanf(m.files[i].name, "optimizer.rank%d.bin", &rank) != 1)
        continue;
      char shard_path[4400], section[DT_STATE_NAME_MAX];
      snprintf(shard_path, sizeof shard_path, "%s/%s", dir, m.files[i].name);
      snprintf(section, sizeof section, "optimizer.rank%d", rank);
      dt_state_file *sf = NULL;
      st = dt_state_file_open(shard_path, &sf);
      if (st == DT_OK)
        st = add_optimizer_section(sf, shard_path, section, total, nbuf, flat, &covered);
      dt_state_file_close(sf);
    }
  }
  if (st == DT_OK && covered != total)
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: the optimizer state covers %lld of the %lld parameters (a shard file is "
                  "missing?)",
                  path, (long long)covered, (long long)total);
  /* Each replica's part: its segments of the flat space (padding stays 0;
   * the replicas of --mode dp with ZeRO have the same sizes, other pieces). */
  for (int k = 0; st == DT_OK && k < r->n_replicas; k++)
    st = dt_optim_state_from_flat(r->opts[k], flat, (int64_t)nbuf * total, step);
  free(flat);
  return st;
}

/* The "scaler" section into *scaler, and the optimizer's step count. */
static dt_status load_scaler(const dt_state_file *f, const char *path, dt_grad_scaler *scaler,
                             long long *opt_steps) {
  char what[4400], buf[32];
  snprintf(what, sizeof what, "%s: section 'scaler'", path);
  const void *bytes = NULL;
  size_t size = 0;
  DT_CHECK(dt_state_file_section(f, "scaler", &bytes, &size));
  DT_CHECK(dt_ckpt_scaler_section_decode(bytes, size, what, scaler));
  DT_CHECK(dt_state_meta_get(bytes, size, "optimizer_steps", what, buf, sizeof buf));
  char tail;
  if (sscanf(buf, "%lld%c", opt_steps, &tail) != 1 || *opt_steps < 0)
    return DT_ERROR(DT_ERR_FORMAT, "%s: 'optimizer_steps %s' is not a count", what, buf);
  return DT_OK;
}

dt_status dt_train_ckpt_load(const dt_train_ckpt_run *r, const char *dir, dt_train_position *pos) {
  state_meta m;
  DT_CHECK(open_meta(dir, &m));
  dt_state_file *f = m.f;
  const char *meta = m.text, *path = m.path, *what = m.what;
  size_t n = m.size;
  char config[4096], first_loss[64];
  long long step = 0, epoch = 0, batch = 0, split = 1;
  dt_train_ckpt_config_lines(r, config, sizeof config);
  dt_status st = compare_config(path, meta, n, config, r);
  if (st == DT_OK)
    st = meta_int(meta, n, "step", what, &step);
  if (st == DT_OK)
    st = meta_int(meta, n, "epoch", what, &epoch);
  if (st == DT_OK)
    st = meta_int(meta, n, "batch_in_epoch", what, &batch);
  if (st == DT_OK)
    st = dt_state_meta_get(meta, n, "first_loss", what, first_loss, sizeof first_loss);
  /* Absent from the checkpoints of before the out-of-memory recovery: 1. */
  if (st == DT_OK && memmem(meta, n, "\nmicro_batch_split ", 19))
    st = meta_int(meta, n, "micro_batch_split", what, &split);
  if (st == DT_OK && (split < 1 || split > 2LL * r->cfg->batch))
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: micro_batch_split %lld does not fit a micro-batch of %d samples (1 to %d)",
                  what, split, r->cfg->batch, 2 * r->cfg->batch);
  if (st == DT_OK && (step < 0 || epoch < 0 || batch < 0 || batch > r->batches_per_epoch))
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: position step %lld epoch %lld batch %lld does not fit an epoch of %lld "
                  "micro-batches",
                  what, step, epoch, batch, (long long)r->batches_per_epoch);
  if (st == DT_OK) {
    char weights[4200];
    snprintf(weights, sizeof weights, "%s/%s", dir, DT_CKPT_WEIGHTS_FILE);
    for (int i = 0; st == DT_OK && i < r->n_replicas; i++)
      st = dt_safetensors_load_module(weights, r->models[i]);
  }
  long long opt_steps = step; /* the optimizer's: fewer when the scaler skipped steps */
  if (st == DT_OK && r->scaler && dt_state_file_has_section(f, "scaler"))
    st = load_scaler(f, path, r->scaler, &opt_steps);
  if (st == DT_OK)
    st = load_optimizer(r, f, dir, path, opt_steps);
  dt_state_file_close(f);
  DT_CHECK(st);
  for (int i = 0; i < r->n_replicas; i++)
    dt_optim_set_lr(r->opts[i], dt_lr_at(r->schedule, opt_steps));
  pos->step = step;
  pos->epoch = epoch;
  pos->batch = batch;
  pos->first_loss = strtod(first_loss, NULL);
  pos->split = (int)split;
  return DT_OK;
}
