/* The run directory, saving on a background thread, resuming, and the
 * stop requested by SIGTERM/SIGUSR1 (see launch/train_checkpoint.h). */
#define _GNU_SOURCE
#include "launch/train_checkpoint.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/checkpoint.h"
#include "dist/agree.h"
#include "launch/train_loop.h"

#define STATE_FILE "trainer_state.bin"
#define WEIGHTS_FILE "model.safetensors"

/* The one piece of process state: a signal handler can only set a flag. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) { stop_requested = sig; }

void dt_train_ckpt_install_signal_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}

/* One checkpoint being written by the background thread. */
typedef struct save_job {
  char dir[4096];    /* .../checkpoints/step_NNNNNNNN */
  char parent[4096]; /* .../checkpoints */
  int64_t step;
  int keep;
  dt_tensor_snapshot *weights;
  dt_state_writer *state;
  dt_status status;
  char error[1024];
} save_job;

struct dt_train_ckpt {
  dt_train_ckpt_run run;
  char run_dir[4096];
  char ckpt_dir[4096];
  FILE *caller_log; /* the log before the tee */
  FILE *file_log;   /* train.log (rank 0) */
  FILE *tee;
  pthread_t writer;
  bool writer_running;
  save_job *job;      /* in flight or finished, not yet collected */
  int64_t saved_step; /* the newest step saved (or resumed from), -1 = none */
  char last_saved[4096];
  int stop_signal;
};

/* ---- the log: caller's stream and train.log ---- */
static ssize_t tee_write(void *cookie, const char *buf, size_t size) {
  dt_train_ckpt *ck = cookie;
  if (ck->caller_log) {
    fwrite(buf, 1, size, ck->caller_log);
    fflush(ck->caller_log);
  }
  if (ck->file_log) {
    fwrite(buf, 1, size, ck->file_log);
    fflush(ck->file_log);
  }
  return (ssize_t)size;
}

static dt_status open_log(dt_train_ckpt *ck, FILE **log) {
  char path[4200];
  snprintf(path, sizeof path, "%s/train.log", ck->run_dir);
  ck->file_log = fopen(path, "a");
  if (!ck->file_log)
    return DT_ERROR(DT_ERR_IO, "opening the run's log %s: %s", path, strerror(errno));
  ck->caller_log = *log;
  cookie_io_functions_t io = {NULL, tee_write, NULL, NULL};
  ck->tee = fopencookie(ck, "w", io);
  if (!ck->tee)
    return DT_ERROR(DT_ERR_IO, "opening the run's log %s: %s", path, strerror(errno));
  setvbuf(ck->tee, NULL, _IOLBF, 0);
  *log = ck->tee;
  return DT_OK;
}

static void log_msg(dt_train_ckpt *ck, FILE *log, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_msg(dt_train_ckpt *ck, FILE *log, const char *fmt, ...) {
  if (!log)
    return;
  va_list ap;
  va_start(ap, fmt);
  const char *prefix = ck && ck->run.cfg->log_prefix ? ck->run.cfg->log_prefix : "";
  fputs(prefix, log);
  vfprintf(log, fmt, ap);
  va_end(ap);
  fflush(log);
}

/* ---- what must match on resume ---- */
static int64_t global_batch(const dt_train_ckpt_run *r) {
  return (int64_t)r->cfg->batch * r->world;
}

/* "config.<flag> value" lines; the derived ones are named for their flags
 * in the messages (config_advice). */
static void config_lines(const dt_train_ckpt_run *r, char *buf, size_t cap) {
  const dt_train_config *c = r->cfg;
  /* The step schedule's derived step size (one epoch) depends on the
   * plan; the others ignore it. */
  long long step_size = !strcmp(c->schedule, "step") ? (long long)r->schedule->step_size : 0;
  snprintf(buf, cap,
           "config.model %s\nconfig.data %s\nconfig.train-samples %lld\nconfig.global-batch "
           "%lld\nconfig.accum %d\nconfig.optimizer %s\nconfig.lr %.9g\nconfig.momentum %.9g\n"
           "config.nesterov %d\nconfig.weight-decay %.9g\nconfig.schedule %s\nconfig.warmup "
           "%d\nconfig.step-size %lld\nconfig.gamma %.9g\nconfig.min-lr %.9g\n"
           "config.schedule-steps %lld\nconfig.clip %.9g\nconfig.seed %llu\n",
           c->model, c->data, (long long)r->train_samples, (long long)global_batch(r), c->accum,
           c->optimizer, (double)c->lr, (double)c->momentum, c->nesterov ? 1 : 0,
           (double)c->weight_decay, c->schedule, c->warmup, step_size, (double)c->gamma,
           (double)c->min_lr, (long long)r->schedule->total_steps, (double)c->clip,
           (unsigned long long)c->seed);
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
    return "keep the global batch (--batch x ranks) when resuming on another number of ranks";
  if (!strcmp(key, "config.schedule-steps"))
    return "the LR schedule must span the same steps: keep --epochs, --max-steps and the "
           "global batch";
  if (!strcmp(key, "config.train-samples"))
    return "the training set differs";
  return "start a new run (another --run-dir) for another configuration";
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
                          "--batch %d): with %d ranks use --batch %lld",
                          path, saved, value, r->world, r->cfg->batch, r->world, g / r->world);
        return DT_ERROR(DT_ERR_INVALID_ARG,
                        "%s: the checkpoint's global batch is %s, which %d ranks cannot share "
                        "evenly: resume on a number of ranks that divides it",
                        path, saved, r->world);
      }
      char a[64], b[64];
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "%s: the checkpoint was written with --%s %s, this run has --%s %s: %s", path,
                      key + 7, shown(saved, value, a, sizeof a), key + 7,
                      shown(value, saved, b, sizeof b), config_advice(key));
    }
    line = nl ? nl + 1 : line + len;
  }
  return DT_OK;
}

/* ---- saving ---- */
static void *writer_main(void *arg) {
  save_job *j = arg;
  dt_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  m.step = j->step;
  dt_status st = dt_ckpt_make_dirs(j->dir);
  char manifest[4200];
  snprintf(manifest, sizeof manifest, "%s/%s", j->dir, DT_CKPT_MANIFEST);
  if (st == DT_OK && unlink(manifest) != 0 && errno != ENOENT) /* a save of this step again */
    st = DT_ERROR(DT_ERR_IO, "removing %s: %s", manifest, strerror(errno));
  dt_ckpt_file_entry *w = &m.files[0], *s = &m.files[1];
  snprintf(w->name, sizeof w->name, "%s", WEIGHTS_FILE);
  snprintf(s->name, sizeof s->name, "%s", STATE_FILE);
  m.n_files = 2;
  if (st == DT_OK)
    st =
        dt_tensor_snapshot_write_safetensors(j->weights, j->dir, WEIGHTS_FILE, &w->crc32, &w->size);
  if (st == DT_OK)
    st = dt_state_writer_write(j->state, j->dir, STATE_FILE, &s->crc32, &s->size);
  if (st == DT_OK)
    st = dt_ckpt_manifest_write(j->dir, &m);
  /* --keep: the newest K complete checkpoints stay. */
  char names[256][64];
  int n = 0, complete = 0;
  if (st == DT_OK && j->keep > 0)
    st = dt_ckpt_list(j->parent, names, 256, &n);
  for (int i = 0; st == DT_OK && j->keep > 0 && i < n; i++) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", j->parent, names[i]);
    snprintf(manifest, sizeof manifest, "%s/%s", dir, DT_CKPT_MANIFEST);
    bool has_manifest = access(manifest, F_OK) == 0;
    complete += has_manifest;
    if ((has_manifest && complete > j->keep) || (!has_manifest && complete > 0))
      st = dt_ckpt_remove(dir);
  }
  j->status = st;
  if (st != DT_OK)
    snprintf(j->error, sizeof j->error, "saving checkpoint %s: %s", j->dir, dt_last_error());
  return NULL;
}

static void job_destroy(save_job *j) {
  if (!j)
    return;
  dt_tensor_snapshot_destroy(j->weights);
  dt_state_writer_destroy(j->state);
  free(j);
}

/* Waits for the checkpoint in flight; its failure is returned here. */
static dt_status collect_writer(dt_train_ckpt *ck) {
  if (ck->writer_running) {
    pthread_join(ck->writer, NULL);
    ck->writer_running = false;
  }
  save_job *j = ck->job;
  ck->job = NULL;
  if (!j)
    return DT_OK;
  dt_status st = j->status;
  if (st != DT_OK)
    dt_error_set(st, __func__, __FILE__, __LINE__, "%s", j->error);
  else
    snprintf(ck->last_saved, sizeof ck->last_saved, "%s", j->dir);
  job_destroy(j);
  return st;
}

static dt_status meta_text(const dt_train_ckpt *ck, const dt_train_position *pos, char *buf,
                           size_t cap) {
  const dt_train_ckpt_run *r = &ck->run;
  char config[4096];
  config_lines(r, config, sizeof config);
  size_t n = (size_t)snprintf(
      buf, cap,
      "format dtrain-trainer-state\nstep %lld\nepoch %lld\nbatch_in_epoch %lld\n"
      "sample_in_epoch %lld\nworld %d\nper_rank_batch %d\nfirst_loss %a\nlr %a\n"
      "rng.sampler.seed %llu\nrng.sampler.epoch %lld\nrng.model_init.seed %llu\n%s",
      (long long)pos->step, (long long)pos->epoch, (long long)pos->batch,
      (long long)(pos->batch * global_batch(r)), r->world, r->cfg->batch, pos->first_loss,
      (double)dt_optim_lr(r->opts[0]), (unsigned long long)r->cfg->seed, (long long)pos->epoch,
      (unsigned long long)r->cfg->seed, config);
  if (n >= cap)
    return DT_ERROR(DT_ERR_INTERNAL, "trainer-state meta text too long");
  return DT_OK;
}

/* The optimizer's moments as one shard [0, total) (no ZeRO: every rank
 * holds all of them). */
static dt_status optimizer_section(const dt_train_ckpt *ck, dt_state_writer *w) {
  dt_optimizer *opt = ck->run.opts[0];
  int64_t numel = dt_optim_state_numel(opt);
  int64_t total = dt_module_parameter_count(ck->run.models[0]);
  float *moments = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
  if (!moments)
    return DT_ERROR(DT_ERR_OOM, "checkpoint: %lld optimizer floats: out of host memory",
                    (long long)numel);
  dt_status st = dt_optim_state_get(opt, moments, numel);
  dt_ckpt_optim_shard shard = {0, (uint64_t)total, (uint64_t)total,
                               total > 0 ? (uint32_t)(numel / total) : 0, moments};
  void *bytes = NULL;
  size_t size = 0;
  if (st == DT_OK)
    st = dt_ckpt_optim_section_encode(&shard, &bytes, &size);
  free(moments);
  if (st == DT_OK)
    st = dt_state_writer_add(w, "optimizer", bytes, size);
  free(bytes);
  return st;
}

/* The snapshot (on this thread), then the files on the writer thread. */
static dt_status start_save(dt_train_ckpt *ck, const dt_train_position *pos) {
  DT_CHECK(collect_writer(ck));
  save_job *j = calloc(1, sizeof *j);
  if (!j)
    return DT_ERROR(DT_ERR_OOM, "checkpoint: out of host memory");
  dt_train_position p = *pos;
  if (p.batch >= ck->run.batches_per_epoch) { /* the epoch is done: the next one's start */
    p.epoch++;
    p.batch = 0;
  }
  j->step = p.step;
  j->keep = ck->run.cfg->keep;
  snprintf(j->parent, sizeof j->parent, "%s", ck->ckpt_dir);
  snprintf(j->dir, sizeof j->dir, "%s/step_%08lld", ck->ckpt_dir, (long long)p.step);
  char meta[8192];
  dt_status st = meta_text(ck, &p, meta, sizeof meta);
  if (st == DT_OK)
    st = dt_tensor_snapshot_of_module(ck->run.models[0], &j->weights);
  if (st == DT_OK)
    st = dt_state_writer_create(&j->state);
  if (st == DT_OK)
    st = dt_state_writer_add(j->state, "meta", meta, strlen(meta));
  if (st == DT_OK)
    st = optimizer_section(ck, j->state);
  if (st != DT_OK) {
    job_destroy(j);
    return dt_error_wrap(st, "checkpoint of step %lld", (long long)p.step);
  }
  int rc = pthread_create(&ck->writer, NULL, writer_main, j);
  if (rc != 0) {
    job_destroy(j);
    return DT_ERROR(DT_ERR_INTERNAL, "cannot start the checkpoint writer thread: %s", strerror(rc));
  }
  ck->writer_running = true;
  ck->job = j;
  ck->saved_step = p.step;
  return DT_OK;
}

/* Sums a flag over the ranks (DDP), on the rank's device. */
static dt_status any_rank(const dt_train_ckpt *ck, float *flag) {
  if (!ck->run.comm || ck->run.world <= 1)
    return DT_OK;
  int64_t shape = 1;
  dt_tensor *t = NULL;
  DT_CHECK(dt_tensor_from_host(flag, &shape, 1, DT_DTYPE_F32, ck->run.dev, &t));
  dt_status st = dt_comm_allreduce_sync(ck->run.comm, t, DT_REDUCE_SUM);
  if (st == DT_OK)
    st = dt_tensor_to_host(t, flag, sizeof *flag);
  dt_tensor_release(t);
  return st;
}

static bool writes(const dt_train_ckpt *ck) { return ck->run.rank == 0; }

dt_status dt_train_ckpt_after_step(dt_train_ckpt *ck, const dt_train_position *pos, bool *stop) {
  *stop = false;
  if (!ck)
    return DT_OK;
  float flag = stop_requested ? 1.0f : 0.0f;
  DT_CHECK(any_rank(ck, &flag));
  int every = ck->run.cfg->save_every;
  if (flag > 0) {
    ck->stop_signal = stop_requested ? (int)stop_requested : SIGTERM;
    *stop = true;
    return DT_OK; /* dt_train_ckpt_finish saves */
  }
  if (every > 0 && pos->step % every == 0 && writes(ck))
    DT_CHECK(start_save(ck, pos));
  return DT_OK;
}

dt_status dt_train_ckpt_finish(dt_train_ckpt *ck, const dt_train_position *pos) {
  if (!ck)
    return DT_OK;
  dt_status st = DT_OK;
  if (writes(ck) && ck->saved_step != pos->step)
    st = start_save(ck, pos);
  if (writes(ck)) {
    dt_status w = collect_writer(ck);
    if (st == DT_OK)
      st = w;
  }
  /* Every rank learns whether rank 0 saved (and none exits before it has:
   * mpirun ends a job whose rank exits with a non-zero status). */
  float failed = st != DT_OK ? 1.0f : 0.0f;
  dt_status cs = any_rank(ck, &failed);
  if (st != DT_OK)
    return st;
  DT_CHECK(cs);
  if (failed > 0)
    return DT_ERROR(DT_ERR_IO, "rank 0 could not save the checkpoint of step %lld",
                    (long long)pos->step);
  return DT_OK;
}

int dt_train_ckpt_stop_signal(const dt_train_ckpt *ck) { return ck ? ck->stop_signal : 0; }
const char *dt_train_ckpt_last_saved(const dt_train_ckpt *ck) { return ck ? ck->last_saved : ""; }

void dt_train_ckpt_close(dt_train_ckpt *ck, FILE **log) {
  if (!ck)
    return;
  if (ck->writer_running)
    pthread_join(ck->writer, NULL);
  job_destroy(ck->job);
  if (ck->tee) {
    fclose(ck->tee);
    *log = ck->caller_log;
  }
  if (ck->file_log)
    fclose(ck->file_log);
  free(ck);
}

/* ---- resuming ---- */
/* The newest complete checkpoint in `parent` (a run's checkpoints/), ""
 * when it holds none (or does not exist yet); damaged ones are reported. */
static dt_status newest_complete(const char *parent, FILE *log, char *out, size_t cap) {
  dt_ckpt_manifest m;
  char names[256][64];
  int n = 0;
  DT_CHECK(dt_ckpt_list(parent, names, 256, &n));
  for (int i = 0; i < n; i++) {
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/%s", parent, names[i]);
    if (dt_ckpt_verify(dir, &m) == DT_OK) {
      snprintf(out, cap, "%s", dir);
      return DT_OK;
    }
    if (log)
      fprintf(log, "dtrain: skipping checkpoint %s: %s\n", dir, dt_last_error());
  }
  out[0] = '\0';
  if (n > 0)
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
  if (access(manifest, F_OK) == 0 || stat(parent, &sb) != 0) {
    DT_CHECK(dt_ckpt_verify(path, &m));
    snprintf(out, cap, "%s", path);
    return DT_OK;
  }
  return newest_complete(parent, log, out, cap);
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
  snprintf(m->path, sizeof m->path, "%s/%s", ckpt_dir, STATE_FILE);
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

/* The optimizer sections (one, or one per ZeRO shard) into the flat state. */
static dt_status load_optimizer(const dt_train_ckpt_run *r, const dt_state_file *f,
                                const char *path, int64_t step) {
  int64_t numel = dt_optim_state_numel(r->opts[0]);
  int64_t total = dt_module_parameter_count(r->models[0]);
  int64_t buffers = total > 0 ? numel / total : 0;
  float *flat = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
  if (!flat)
    return DT_ERROR(DT_ERR_OOM, "resuming: out of host memory");
  int64_t covered = 0;
  dt_status st = DT_OK;
  for (int k = -1; st == DT_OK && k < 4096; k++) {
    char name[DT_STATE_NAME_MAX], what[4400];
    if (k < 0)
      snprintf(name, sizeof name, "optimizer");
    else
      snprintf(name, sizeof name, "optimizer.rank%d", k);
    if (!dt_state_file_has_section(f, name)) {
      if (k >= 0)
        break;
      continue;
    }
    snprintf(what, sizeof what, "%s: section '%s'", path, name);
    const void *bytes = NULL;
    size_t size = 0;
    dt_ckpt_optim_shard sh;
    st = dt_state_file_section(f, name, &bytes, &size);
    if (st == DT_OK)
      st = dt_ckpt_optim_section_decode(bytes, size, what, &sh);
    if (st == DT_OK && (sh.total != (uint64_t)total || sh.n_buffers != (uint64_t)buffers))
      st = DT_ERROR(DT_ERR_SHAPE,
                    "%s: %u state buffers over %llu parameters, this run's %s has %lld over "
                    "%lld: the checkpoint is of another model or optimizer",
                    what, sh.n_buffers, (unsigned long long)sh.total, dt_optim_name(r->opts[0]),
                    (long long)buffers, (long long)total);
    for (uint32_t b = 0; st == DT_OK && b < sh.n_buffers; b++)
      memcpy(flat + b * total + sh.offset, sh.data + b * sh.length, sh.length * sizeof(float));
    covered += st == DT_OK ? (int64_t)sh.length : 0;
  }
  if (st == DT_OK && buffers > 0 && covered != total)
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: the optimizer sections cover %lld of the %lld parameters' state", path,
                  (long long)covered, (long long)total);
  for (int i = 0; st == DT_OK && i < r->n_replicas; i++)
    st = dt_optim_state_set(r->opts[i], flat, numel, step);
  free(flat);
  return st;
}

static dt_status load_checkpoint(dt_train_ckpt *ck, const char *dir, dt_train_position *pos) {
  const dt_train_ckpt_run *r = &ck->run;
  state_meta m;
  DT_CHECK(open_meta(dir, &m));
  dt_state_file *f = m.f;
  const char *meta = m.text, *path = m.path, *what = m.what;
  size_t n = m.size;
  char config[4096], first_loss[64];
  long long step = 0, epoch = 0, batch = 0;
  config_lines(r, config, sizeof config);
  dt_status st = compare_config(path, meta, n, config, r);
  if (st == DT_OK)
    st = meta_int(meta, n, "step", what, &step);
  if (st == DT_OK)
    st = meta_int(meta, n, "epoch", what, &epoch);
  if (st == DT_OK)
    st = meta_int(meta, n, "batch_in_epoch", what, &batch);
  if (st == DT_OK)
    st = dt_state_meta_get(meta, n, "first_loss", what, first_loss, sizeof first_loss);
  if (st == DT_OK && (step < 0 || epoch < 0 || batch < 0 || batch > r->batches_per_epoch))
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: position step %lld epoch %lld batch %lld does not fit an epoch of %lld "
                  "micro-batches",
                  what, step, epoch, batch, (long long)r->batches_per_epoch);
  if (st == DT_OK) {
    char weights[4200];
    snprintf(weights, sizeof weights, "%s/%s", dir, WEIGHTS_FILE);
    for (int i = 0; st == DT_OK && i < r->n_replicas; i++)
      st = dt_safetensors_load_module(weights, r->models[i]);
  }
  if (st == DT_OK)
    st = load_optimizer(r, f, path, step);
  dt_state_file_close(f);
  DT_CHECK(st);
  for (int i = 0; i < r->n_replicas; i++)
    dt_optim_set_lr(r->opts[i], dt_lr_at(r->schedule, step));
  pos->step = step;
  pos->epoch = epoch;
  pos->batch = batch;
  pos->first_loss = strtod(first_loss, NULL);
  return DT_OK;
}

/* rank 0's text of `len` bytes to every rank (DDP). */
static dt_status broadcast_text(const dt_train_ckpt *ck, char *text, size_t len) {
  if (!ck->run.comm || ck->run.world <= 1)
    return DT_OK;
  int64_t shape = (int64_t)len;
  dt_tensor *t = NULL;
  DT_CHECK(dt_tensor_from_host(text, &shape, 1, DT_DTYPE_U8, ck->run.dev, &t));
  dt_status st = dt_comm_broadcast_sync(ck->run.comm, t, 0);
  if (st == DT_OK)
    st = dt_tensor_to_host(t, text, len);
  dt_tensor_release(t);
  text[len - 1] = '\0';
  return st;
}

static dt_status choose_run_dir(dt_train_ckpt *ck) {
  const dt_train_config *c = ck->run.cfg;
  char name[4096] = "";
  if (c->run_dir) {
    snprintf(name, sizeof name, "%s", c->run_dir);
  } else if (ck->run.rank == 0) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(name, sizeof name, "runs/%s-%s-%s", c->model, c->data, stamp);
  }
  if (!c->run_dir)
    DT_CHECK(broadcast_text(ck, name, sizeof name));
  snprintf(ck->run_dir, sizeof ck->run_dir, "%s", name);
  snprintf(ck->ckpt_dir, sizeof ck->ckpt_dir, "%s/checkpoints", name);
  return DT_OK;
}

static dt_status write_config_json(const dt_train_ckpt *ck) {
  const dt_train_ckpt_run *r = &ck->run;
  const dt_train_config *c = r->cfg;
  char buf[8192];
  int n = snprintf(
      buf, sizeof buf,
      "{\n  \"model\": \"%s\",\n  \"data\": \"%s\",\n  \"data_dir\": \"%s\",\n"
      "  \"device\": \"%s\",\n  \"mode\": \"%s\",\n  \"world\": %d,\n  \"batch\": %d,\n"
      "  \"global_batch\": %lld,\n  \"accum\": %d,\n  \"epochs\": %d,\n  \"max_steps\": %d,\n"
      "  \"schedule_steps\": %lld,\n  \"optimizer\": \"%s\",\n  \"lr\": %.9g,\n"
      "  \"momentum\": %.9g,\n  \"nesterov\": %s,\n  \"weight_decay\": %.9g,\n"
      "  \"schedule\": \"%s\",\n  \"warmup\": %d,\n  \"step_size\": %d,\n  \"gamma\": %.9g,\n"
      "  \"min_lr\": %.9g,\n  \"clip\": %.9g,\n  \"seed\": %llu,\n  \"eval_batch\": %d,\n"
      "  \"save_every\": %d,\n  \"keep\": %d,\n  \"resume\": \"%s\",\n  \"run_dir\": \"%s\"\n}\n",
      c->model, c->data, c->data_dir, c->device, c->mode, r->world, c->batch,
      (long long)global_batch(r), c->accum, c->epochs, c->max_steps,
      (long long)r->schedule->total_steps, c->optimizer, (double)c->lr, (double)c->momentum,
      c->nesterov ? "true" : "false", (double)c->weight_decay, c->schedule, c->warmup, c->step_size,
      (double)c->gamma, (double)c->min_lr, (double)c->clip, (unsigned long long)c->seed,
      c->eval_batch, c->save_every, c->keep, c->resume ? c->resume : "", ck->run_dir);
  if (n < 0 || (size_t)n >= sizeof buf)
    return DT_ERROR(DT_ERR_INTERNAL, "config.json too long");
  dt_ckpt_chunk chunk = {buf, (size_t)n};
  return dt_ckpt_write_file(ck->run_dir, "config.json", &chunk, 1, NULL, NULL);
}

/* The checkpoint --resume names, the same on every rank. */
static dt_status resume_dir(dt_train_ckpt *ck, FILE *log, char *dir, size_t cap) {
  const char *resume = ck->run.cfg->resume;
  bool is_auto = !strcmp(resume, "auto");
  FILE *report = ck->run.rank == 0 ? log : NULL;
  /* auto: the run's own checkpoints/ (which rank 0 may be creating now). */
  dt_status st = is_auto ? newest_complete(ck->ckpt_dir, report, dir, cap)
                         : dt_train_ckpt_resolve(resume, report, dir, cap);
  if (st != DT_OK)
    return dt_error_wrap(st, "--resume %s", resume);
  if (!dir[0] && !is_auto)
    return DT_ERROR(DT_ERR_IO, "--resume %s: no complete checkpoint there", resume);
  if (ck->run.comm && ck->run.world > 1) {
    char line[4400];
    snprintf(line, sizeof line, "resume from '%s'\n", dir);
    DT_CHECK(dt_dist_agree_text(ck->run.comm, ck->run.dev, line, "chose different checkpoints",
                                "every rank must see the same run directory (a shared file "
                                "system)"));
  }
  return DT_OK;
}

dt_status dt_train_ckpt_open(const dt_train_ckpt_run *run, FILE **log, dt_train_position *pos,
                             dt_train_ckpt **out) {
  *out = NULL;
  memset(pos, 0, sizeof *pos);
  const dt_train_config *c = run->cfg;
  if (!c->run_dir && !c->run_dir_default)
    return DT_OK;
  if (c->resume && !strcmp(c->resume, "auto") && !c->run_dir)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--resume auto looks in the run directory: give it with --run-dir");
  dt_train_ckpt *ck = calloc(1, sizeof *ck);
  if (!ck)
    return DT_ERROR(DT_ERR_OOM, "checkpoints: out of host memory");
  ck->run = *run;
  ck->saved_step = -1;
  dt_status st = choose_run_dir(ck);
  if (st == DT_OK && run->rank == 0) {
    st = dt_ckpt_make_dirs(ck->ckpt_dir);
    if (st == DT_OK)
      st = write_config_json(ck);
    if (st == DT_OK)
      st = open_log(ck, log);
  }
  if (st == DT_OK)
    log_msg(ck, *log, "dtrain train: run directory %s\n", ck->run_dir);
  if (st == DT_OK && c->resume) {
    char dir[4400];
    st = resume_dir(ck, *log, dir, sizeof dir);
    if (st == DT_OK && dir[0]) {
      st = load_checkpoint(ck, dir, pos);
      if (st == DT_OK) {
        ck->saved_step = pos->step;
        log_msg(ck, *log,
                "dtrain train: resumed from %s: optimizer step %lld, epoch %lld, micro-batch "
                "%lld of the epoch\n",
                dir, (long long)pos->step, (long long)pos->epoch + 1, (long long)pos->batch);
      }
    } else if (st == DT_OK) {
      log_msg(ck, *log, "dtrain train: no checkpoint in %s yet: starting from scratch\n",
              ck->ckpt_dir);
    }
  }
  if (st != DT_OK) {
    dt_train_ckpt_close(ck, log);
    return st;
  }
  *out = ck;
  return DT_OK;
}
