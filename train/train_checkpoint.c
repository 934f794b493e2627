/* The run directory, saving on a background thread, resuming, and the
 * save of a stop the hooks requested (see train/train_checkpoint.h). */
#define _GNU_SOURCE
#include "train/train_checkpoint.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/checkpoint.h"
#include "dist/agree.h"
#include "train/run_lock.h"
#include "train/train_checkpoint_internal.h"
#include "train/train_loop.h"

/* One checkpoint being written by this rank's background thread: rank 0
 * writes the weights, the trainer state and, last, the manifest; under
 * ZeRO with DDP every rank writes its own optimizer shard, and rank 0's
 * manifest waits until every rank's is there. */
typedef struct save_job {
  char dir[4096];    /* .../checkpoints/step_NNNNNNNN */
  char parent[4096]; /* .../checkpoints */
  int64_t step;
  int keep;
  int n_shards;           /* ZeRO with DDP: optimizer.rank<R>.bin of every rank (world), else 0 */
  int rank;               /* this rank */
  dt_state_writer *shard; /* this rank's shard (section optimizer.rank<R>), NULL = none */
  double shard_wait_s;    /* rank 0: how long the other ranks' shards may take */
  double snapshot_ms;     /* the training thread's part (the copies) */
  double write_ms;        /* the writer thread's */
  dt_tensor_snapshot *weights; /* rank 0 */
  dt_state_writer *state;      /* rank 0; NULL on the others */
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
  dt_train_run_lock *lock; /* rank 0's: this run owns run_dir */
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

/* ---- saving ---- */
/* Rank 0 writes the weights, the trainer state and the manifest. */
static bool writes(const dt_train_ckpt *ck) { return ck->run.rank == 0; }

/* The job's communicator when it has several ranks, else NULL. */
static dt_comm *job_comm(const dt_train_ckpt *ck) {
  return ck->run.world > 1 ? ck->run.comm : NULL;
}

/* Under ZeRO with DDP every rank writes its optimizer shards. */
static bool every_rank_writes(const dt_train_ckpt *ck) {
  return job_comm(ck) && dt_optim_is_sharded(ck->run.opts[0]);
}

/* Size and CRC32 of a file another rank wrote. */
static dt_status file_entry(const char *dir, dt_ckpt_file_entry *e) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, e->name);
  void *buf = NULL;
  size_t size = 0;
  DT_CHECK(dt_ckpt_read_file(path, &buf, &size));
  e->size = size;
  e->crc32 = dt_crc32(0, buf, size);
  free(buf);
  return DT_OK;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static void shard_name(int rank, const char *suffix, char *buf, size_t cap) {
  snprintf(buf, cap, "optimizer.rank%05d.%s", rank, suffix);
}

/* This rank's shard, optimizer.rank<R>.bin; on failure a marker
 * optimizer.rank<R>.failed with the reason, so that rank 0's writer stops
 * waiting for the shard at once. */
static dt_status write_shard(save_job *j) {
  char name[64];
  shard_name(j->rank, "bin", name, sizeof name);
  dt_status st = dt_state_writer_write(j->shard, j->dir, name, NULL, NULL);
  if (st == DT_OK)
    return DT_OK;
  char marker[4200];
  shard_name(j->rank, "failed", name, sizeof name);
  snprintf(marker, sizeof marker, "%s/%s", j->dir, name);
  FILE *f = fopen(marker, "w");
  if (f) {
    fputs(dt_last_error(), f);
    fclose(f);
  }
  return st;
}

/* Rank 0: the size and CRC32 of every rank's shard, waiting (up to
 * j->shard_wait_s) for those that other ranks are still writing. */
static dt_status collect_shards(save_job *j, dt_ckpt_manifest *m) {
  double deadline = now_ms() + 1e3 * j->shard_wait_s;
  for (int r = 0; r < j->n_shards; r++) {
    dt_ckpt_file_entry *e = &m->files[m->n_files++];
    char marker[4200], name[64];
    shard_name(r, "bin", e->name, sizeof e->name);
    shard_name(r, "failed", name, sizeof name);
    snprintf(marker, sizeof marker, "%s/%s", j->dir, name);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", j->dir, e->name);
    while (access(path, F_OK) != 0) { /* renamed into place: complete once there */
      if (access(marker, F_OK) == 0) {
        void *why = NULL;
        size_t n = 0;
        if (dt_ckpt_read_file(marker, &why, &n) != DT_OK)
          n = 0;
        dt_status st = DT_ERROR(DT_ERR_IO, "rank %d could not write its optimizer shard: %.*s", r,
                                (int)n, why ? (const char *)why : "");
        free(why);
        return st;
      }
      if (now_ms() > deadline)
        return DT_ERROR(DT_ERR_TIMEOUT,
                        "rank %d's optimizer shard %s did not appear within %.0f s: is the run "
                        "directory on a file system every rank sees?",
                        r, path, j->shard_wait_s);
      struct timespec pause = {0, 20 * 1000 * 1000};
      nanosleep(&pause, NULL);
    }
    DT_CHECK(file_entry(j->dir, e));
  }
  return DT_OK;
}

/* Rank 0: the weights, the trainer state, every rank's shard, then the
 * manifest; then --keep. */
static dt_status write_checkpoint(save_job *j) {
  dt_ckpt_manifest m;
  memset(&m, 0, sizeof m);
  m.step = j->step;
  char manifest[4200];
  snprintf(manifest, sizeof manifest, "%s/%s", j->dir, DT_CKPT_MANIFEST);
  if (unlink(manifest) != 0 && errno != ENOENT) /* a save of this step again */
    return DT_ERROR(DT_ERR_IO, "removing %s: %s", manifest, strerror(errno));
  dt_ckpt_file_entry *w = &m.files[0], *s = &m.files[1];
  snprintf(w->name, sizeof w->name, "%s", DT_CKPT_WEIGHTS_FILE);
  snprintf(s->name, sizeof s->name, "%s", DT_CKPT_STATE_FILE);
  m.n_files = 2;
  DT_CHECK(dt_tensor_snapshot_write_safetensors(j->weights, j->dir, DT_CKPT_WEIGHTS_FILE, &w->crc32,
                                                &w->size));
  DT_CHECK(dt_state_writer_write(j->state, j->dir, DT_CKPT_STATE_FILE, &s->crc32, &s->size));
  DT_CHECK(collect_shards(j, &m));
  DT_CHECK(dt_ckpt_manifest_write(j->dir, &m));
  /* --keep: the newest K complete checkpoints stay. */
  char names[256][64];
  int n = 0, complete = 0;
  if (j->keep > 0)
    DT_CHECK(dt_ckpt_list(j->parent, names, 256, &n));
  for (int i = 0; j->keep > 0 && i < n; i++) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", j->parent, names[i]);
    snprintf(manifest, sizeof manifest, "%s/%s", dir, DT_CKPT_MANIFEST);
    bool has_manifest = access(manifest, F_OK) == 0;
    complete += has_manifest;
    if ((has_manifest && complete > j->keep) || (!has_manifest && complete > 0))
      DT_CHECK(dt_ckpt_remove(dir));
  }
  return DT_OK;
}

static void *writer_main(void *arg) {
  save_job *j = arg;
  double t0 = now_ms();
  dt_status st = dt_ckpt_make_dirs(j->dir);
  if (st == DT_OK && j->shard)
    st = write_shard(j);
  if (st == DT_OK && j->state)
    st = write_checkpoint(j);
  j->write_ms = now_ms() - t0;
  j->status = st;
  if (st != DT_OK)
    snprintf(j->error, sizeof j->error, "saving checkpoint %s: %s", j->dir, dt_last_error());
  return NULL;
}

static void job_destroy(save_job *j) {
  if (!j)
    return;
  dt_state_writer_destroy(j->shard);
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
  if (st == DT_OK && ck->tee && j->state) {
    fprintf(ck->tee,
            "%sdtrain train: checkpoint %s saved: training waited %.1f ms (the snapshot), the "
            "files took %.1f ms in the background\n",
            ck->run.cfg->log_prefix ? ck->run.cfg->log_prefix : "", j->dir, j->snapshot_ms,
            j->write_ms);
    fflush(ck->tee);
  }
  const dt_train_hooks *h = &ck->run.cfg->hooks;
  if (st == DT_OK && j->state && h->checkpoint_saved) /* rank 0 wrote it: complete on disk */
    st = h->checkpoint_saved(h->user, j->dir, j->step);
  job_destroy(j);
  return st;
}

static dt_status meta_text(const dt_train_ckpt *ck, const dt_train_position *pos, char *buf,
                           size_t cap) {
  const dt_train_ckpt_run *r = &ck->run;
  char config[4096], image[4600] = "";
  dt_train_ckpt_config_lines(r, config, sizeof config);
  if (r->image) { /* not compared on resume: what `dtrain eval` rebuilds the model and data from */
    const dt_image_folder_config *im = r->image;
    char path[4096];
    const char *folder = realpath(r->cfg->image_folder, path) ? path : r->cfg->image_folder;
    snprintf(image, sizeof image,
             "image.folder %s\nimage.channels %d\nimage.size %d\nimage.classes %d\n"
             "image.mean %.9g,%.9g,%.9g\nimage.std %.9g,%.9g,%.9g\nimage.augment %s\n",
             folder, im->channels, im->size, r->image_classes, (double)im->mean[0],
             (double)im->mean[1], (double)im->mean[2], (double)im->std[0], (double)im->std[1],
             (double)im->std[2], dt_image_augment_name(im->recipe));
  }
  size_t n = (size_t)snprintf(
      buf, cap,
      "format dtrain-trainer-state\nstep %lld\nepoch %lld\nbatch_in_epoch %lld\n"
      "sample_in_epoch %lld\nworld %d\nper_rank_batch %d\nmicro_batch_split %d\nfirst_loss %a\n"
      "lr %a\nrng.sampler.seed %llu\nrng.sampler.epoch %lld\nrng.model_init.seed %llu\n%s%s",
      (long long)pos->step, (long long)pos->epoch, (long long)pos->batch,
      (long long)(pos->batch * dt_train_ckpt_global_batch(r)), r->world, r->cfg->batch,
      pos->split > 1 ? pos->split : 1, pos->first_loss, (double)dt_optim_lr(r->opts[0]),
      (unsigned long long)r->cfg->seed, (long long)pos->epoch, (unsigned long long)r->cfg->seed,
      image, config);
  if (n >= cap)
    return DT_ERROR(DT_ERR_INTERNAL, "trainer-state meta text too long");
  return DT_OK;
}

void dt_train_ckpt_copy_segments(const dt_ckpt_optim_shard *shard, float *flat, float *data,
                                 int to_flat) {
  size_t pos = 0;
  for (uint32_t b = 0; b < shard->n_buffers; b++)
    for (uint32_t i = 0; i < shard->n_segments; i++) {
      float *f = flat + (size_t)b * shard->total + shard->segments[2 * i];
      size_t bytes = shard->segments[2 * i + 1] * sizeof(float);
      if (to_flat)
        memcpy(f, shard->data + pos, bytes);
      else
        memcpy(data + pos, f, bytes);
      pos += shard->segments[2 * i + 1];
    }
}

/* This rank's optimizer state as a section (dt_ckpt_optim_shard): its
 * non-empty segments of the flat space (one, [0, total), without ZeRO),
 * taken from the state in the arena's coordinates. */
static dt_status optimizer_section(const dt_train_ckpt *ck, dt_optimizer *opt, void **bytes,
                                   size_t *size) {
  int64_t numel = dt_optim_state_numel(opt), local = dt_optim_local_numel(opt);
  int64_t total = dt_module_parameter_count(ck->run.models[0]);
  int n_seg = dt_optim_num_segments(opt);
  uint32_t nbuf = local > 0 ? (uint32_t)(numel / local) : 0;
  float *flat = calloc((size_t)(nbuf * total > 0 ? nbuf * total : 1), sizeof(float));
  float *data = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
  uint64_t *segs = malloc((size_t)(n_seg > 0 ? n_seg : 1) * 2 * sizeof(uint64_t));
  dt_status st = flat && data && segs ? dt_optim_state_to_flat(opt, flat, nbuf * total)
                                      : DT_ERROR(DT_ERR_OOM, "checkpoint: out of host memory");
  uint32_t kept = 0;
  for (int i = 0; st == DT_OK && i < n_seg; i++) {
    dt_optim_segment g = dt_optim_segment_at(opt, i);
    if (g.numel <= 0)
      continue;
    segs[2 * kept] = (uint64_t)g.offset;
    segs[2 * kept + 1] = (uint64_t)g.numel;
    kept++;
  }
  dt_ckpt_optim_shard shard = {(uint64_t)total, nbuf, kept, segs, data};
  if (st == DT_OK) {
    dt_train_ckpt_copy_segments(&shard, flat, data, 0);
    st = dt_ckpt_optim_section_encode(&shard, bytes, size);
  }
  free(flat);
  free(data);
  free(segs);
  return st;
}

static void step_dir(const dt_train_ckpt *ck, int64_t step, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/step_%08lld", ck->ckpt_dir, (long long)step);
}

/* This rank's optimizer shard as a trainer-state file (section
 * "optimizer.rank<R>"), for its writer thread. */
static dt_status shard_snapshot(const dt_train_ckpt *ck, dt_state_writer **out) {
  char section[DT_STATE_NAME_MAX];
  snprintf(section, sizeof section, "optimizer.rank%d", ck->run.rank);
  void *bytes = NULL;
  size_t size = 0;
  DT_CHECK(dt_state_writer_create(out));
  dt_status st = optimizer_section(ck, ck->run.opts[0], &bytes, &size);
  if (st == DT_OK)
    st = dt_state_writer_add(*out, section, bytes, size);
  free(bytes);
  return st;
}

/* The GradScaler and the optimizer's step count (behind the run's step
 * by the skipped steps): the same on every rank, saved by rank 0. */
static dt_status add_scaler_section(const dt_train_ckpt *ck, dt_state_writer *w) {
  char text[512];
  size_t n = 0;
  DT_CHECK(dt_ckpt_scaler_section_encode(ck->run.scaler, text, sizeof text, &n));
  int more = snprintf(text + n, sizeof text - n, "optimizer_steps %lld\n",
                      (long long)dt_optim_step_count(ck->run.opts[0]));
  if (more < 0 || (size_t)more >= sizeof text - n)
    return DT_ERROR(DT_ERR_INTERNAL, "trainer-state scaler text too long");
  return dt_state_writer_add(w, "scaler", text, n + (size_t)more);
}

/* Rank 0's part of a save: the meta text, the weights, the replicated
 * optimizer sections, into j. */
static dt_status snapshot_checkpoint(const dt_train_ckpt *ck, const dt_train_position *p,
                                     bool sharded, save_job *j) {
  char meta[16384];
  DT_CHECK(meta_text(ck, p, meta, sizeof meta));
  DT_CHECK(dt_tensor_snapshot_of_module(ck->run.models[0], &j->weights));
  DT_CHECK(dt_state_writer_create(&j->state));
  DT_CHECK(dt_state_writer_add(j->state, "meta", meta, strlen(meta)));
  if (ck->run.scaler)
    DT_CHECK(add_scaler_section(ck, j->state));
  /* Replicated: one "optimizer" section; --mode dp with ZeRO: each
   * replica's shard as "optimizer.part<i>"; DDP with ZeRO: the ranks'
   * files. */
  int parts = !sharded ? 1 : j->n_shards == 0 ? ck->run.n_replicas : 0;
  for (int i = 0; i < parts; i++) {
    char name[DT_STATE_NAME_MAX];
    snprintf(name, sizeof name, sharded ? "optimizer.part%d" : "optimizer", i);
    void *bytes = NULL;
    size_t size = 0;
    dt_status st = optimizer_section(ck, ck->run.opts[i], &bytes, &size);
    if (st == DT_OK)
      st = dt_state_writer_add(j->state, name, bytes, size);
    free(bytes);
    DT_CHECK(st);
  }
  return DT_OK;
}

/* The snapshot (on this thread), then the files on this rank's writer
 * thread: rank 0 always, the others under ZeRO with DDP (their shards). */
static dt_status start_save(dt_train_ckpt *ck, const dt_train_position *pos, bool sharded) {
  bool shards = sharded && job_comm(ck);
  if (!writes(ck) && !shards)
    return DT_OK;
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
  j->rank = ck->run.rank;
  /* Under the watchdog's deadline: a rank whose shard never comes is
   * reported by rank 0 before the watchdog ends the job. */
  j->shard_wait_s = 0.5 * ck->run.cfg->comm_timeout;
  snprintf(j->parent, sizeof j->parent, "%s", ck->ckpt_dir);
  step_dir(ck, p.step, j->dir, sizeof j->dir);
  j->n_shards = shards ? ck->run.world : 0;
  dt_status st = shards ? shard_snapshot(ck, &j->shard) : DT_OK;
  if (st == DT_OK && writes(ck))
    st = snapshot_checkpoint(ck, &p, sharded, j);
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
  return DT_OK;
}

/* Every rank learns whether every rank succeeded: this rank's own failure
 * (st) comes back first, then the all-reduce's; *other_failed is set when
 * st is DT_OK but another rank's was not. */
static dt_status every_rank_succeeded(const dt_train_ckpt *ck, dt_status st, bool *other_failed) {
  double failed = st != DT_OK ? 1.0 : 0.0;
  dt_status cs = dt_train_sum_over_ranks(ck->run.comm, ck->run.dev, &failed, 1);
  DT_CHECK(st);
  DT_CHECK(cs);
  *other_failed = failed > 0;
  return DT_OK;
}

/* Under ZeRO with DDP, before any rank's writer of this save starts: the
 * step's directory without this rank's shard (and rank 0's manifest) of an
 * earlier save, so that rank 0's writer cannot take a stale shard. */
static dt_status clear_own_files(const dt_train_ckpt *ck, int64_t step) {
  char dir[4200], name[64], path[4400];
  step_dir(ck, step, dir, sizeof dir);
  DT_CHECK(dt_ckpt_make_dirs(dir));
  const char *kinds[] = {"bin", "failed"};
  for (int k = 0; k < 2 + writes(ck); k++) {
    if (k < 2)
      shard_name(ck->run.rank, kinds[k], name, sizeof name);
    else
      snprintf(name, sizeof name, "%s", DT_CKPT_MANIFEST);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (unlink(path) != 0 && errno != ENOENT)
      return DT_ERROR(DT_ERR_IO, "removing %s: %s", path, strerror(errno));
  }
  return DT_OK;
}

/* A checkpoint of this step; every rank calls it (collective under ZeRO
 * with DDP). The previous save must have finished first (one in flight). */
static dt_status save_checkpoint(dt_train_ckpt *ck, const dt_train_position *pos) {
  bool sharded = dt_optim_is_sharded(ck->run.opts[0]);
  double t0 = now_ms();
  dt_status st = collect_writer(ck);
  if (sharded && job_comm(ck)) {
    if (st == DT_OK)
      st = clear_own_files(ck, pos->step);
    /* Every rank knows the others' earlier shards were written and this
     * step's stale files are gone. */
    bool other_failed = false;
    DT_CHECK(every_rank_succeeded(ck, st, &other_failed));
    if (other_failed)
      return DT_ERROR(DT_ERR_IO,
                      "another rank could not write its optimizer shard (its message names "
                      "the file), or clear it before step %lld's checkpoint",
                      (long long)pos->step);
  }
  DT_CHECK(st);
  DT_CHECK(start_save(ck, pos, sharded));
  if (ck->job)
    ck->job->snapshot_ms = now_ms() - t0; /* read by collect_writer, after the join */
  ck->saved_step = pos->step;
  return DT_OK;
}

dt_status dt_train_ckpt_after_step(dt_train_ckpt *ck, const dt_train_position *pos, bool stop) {
  if (!ck || stop) /* a stop: dt_train_ckpt_finish saves */
    return DT_OK;
  int every = ck->run.cfg->save_every;
  if (every > 0 && pos->step % every == 0)
    DT_CHECK(save_checkpoint(ck, pos));
  return DT_OK;
}

dt_status dt_train_ckpt_finish(dt_train_ckpt *ck, const dt_train_position *pos) {
  if (!ck)
    return DT_OK;
  dt_status st = DT_OK;
  if (ck->saved_step != pos->step)
    st = save_checkpoint(ck, pos);
  dt_status w = collect_writer(ck);
  if (st == DT_OK)
    st = w;
  /* Every rank learns whether rank 0 saved (and none exits before it has:
   * mpirun ends a job whose rank exits with a non-zero status). */
  bool other_failed = false;
  DT_CHECK(every_rank_succeeded(ck, st, &other_failed));
  return other_failed ? DT_ERROR(DT_ERR_IO,
                                 "another rank could not save its part of the checkpoint of "
                                 "step %lld (its message names the file)",
                                 (long long)pos->step)
                      : DT_OK;
}

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
  dt_train_run_lock_release(ck->lock);
  free(ck);
}

dt_train_run_lock *dt_train_ckpt_take_lock(dt_train_ckpt *ck) {
  dt_train_run_lock *lock = ck ? ck->lock : NULL;
  if (ck)
    ck->lock = NULL;
  return lock;
}

#define DEFAULT_RUNS "runs"

/* The default run directory, created here: runs/<model>-<data>-<UTC
 * time>, or with a suffix -2, -3, ... when another run took that name in
 * the same second (mkdir is the atomic claim: two runs never share one).
 * A working directory where runs/ cannot be made is an error naming the
 * fix: the run's checkpoints must go somewhere every rank sees, which a
 * fallback such as /tmp is not on several nodes. */
static dt_status create_default_run_dir(const dt_train_ckpt_run *r, char *name, size_t cap) {
  const char *model = dt_train_ckpt_model_name(r), *data = dt_train_ckpt_data_name(r);
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  dt_status st = dt_ckpt_make_dirs(DEFAULT_RUNS);
  for (int k = 1; st == DT_OK && k <= 1000; k++) {
    if (k == 1)
      snprintf(name, cap, "%s/%s-%s-%s", DEFAULT_RUNS, model, data, stamp);
    else
      snprintf(name, cap, "%s/%s-%s-%s-%d", DEFAULT_RUNS, model, data, stamp, k);
    if (mkdir(name, 0755) == 0)
      return DT_OK;
    if (errno != EEXIST)
      st = DT_ERROR(DT_ERR_IO, "creating directory %s: %s", name, strerror(errno));
  }
  if (st == DT_OK)
    st = DT_ERROR(DT_ERR_IO, "%s: 1000 runs of this second already", name);
  char cwd[1024], why[1024];
  if (!getcwd(cwd, sizeof cwd))
    snprintf(cwd, sizeof cwd, ".");
  snprintf(why, sizeof why, "%s", dt_last_error());
  return DT_ERROR(st,
                  "%s: the default run directory goes under %s/ in the working directory %s: "
                  "give `run_dir` DIR on a writable file system that every rank sees",
                  why, DEFAULT_RUNS, cwd);
}

static dt_status choose_run_dir(dt_train_ckpt *ck) {
  const dt_train_config *c = ck->run.cfg;
  char name[4096] = "";
  dt_status st = DT_OK;
  if (c->run_dir)
    snprintf(name, sizeof name, "%s", c->run_dir);
  else if (ck->run.rank == 0)
    st = create_default_run_dir(&ck->run, name, sizeof name);
  /* A failure on rank 0 ends the job (the others wait here). */
  DT_CHECK(st);
  if (!c->run_dir)
    DT_CHECK(dt_train_broadcast_text(job_comm(ck), ck->run.dev, name, sizeof name));
  snprintf(ck->run_dir, sizeof ck->run_dir, "%s", name);
  snprintf(ck->ckpt_dir, sizeof ck->ckpt_dir, "%s/checkpoints", name);
  return DT_OK;
}

static dt_status write_config_json(const dt_train_ckpt *ck) {
  const dt_train_ckpt_run *r = &ck->run;
  const dt_train_config *c = r->cfg;
  char buf[8192], device[32], devices[DT_TRAIN_MAX_DEVICES * 12];
  dt_train_device_text(c->device, device, sizeof device);
  dt_train_devices_text(c->devices, c->mode == DT_TRAIN_MODE_DP ? c->n_devices : 0, devices,
                        sizeof devices);
  const char *resume = c->resume == DT_TRAIN_RESUME_AUTO   ? "auto"
                       : c->resume == DT_TRAIN_RESUME_PATH ? c->resume_path
                                                           : "";
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
      dt_train_ckpt_model_name(r), dt_train_ckpt_data_name(r), c->data_dir ? c->data_dir : "",
      devices[0] ? devices : device, dt_train_mode_name(c->mode), r->world, c->batch,
      (long long)dt_train_ckpt_global_batch(r), c->accum, c->epochs, c->max_steps,
      (long long)r->schedule->total_steps, dt_train_optimizer_name(c->optimizer), (double)c->lr,
      (double)c->momentum, c->nesterov ? "true" : "false", (double)c->weight_decay,
      dt_train_schedule_name(c->schedule), c->warmup, c->step_size, (double)c->gamma,
      (double)c->min_lr, (double)c->clip, (unsigned long long)c->seed, c->eval_batch, c->save_every,
      c->keep, resume, ck->run_dir);
  if (n < 0 || (size_t)n >= sizeof buf)
    return DT_ERROR(DT_ERR_INTERNAL, "config.json too long");
  dt_ckpt_chunk chunk = {buf, (size_t)n};
  return dt_ckpt_write_file(ck->run_dir, "config.json", &chunk, 1, NULL, NULL);
}

/* The checkpoint `resume` names, the same on every rank. */
static dt_status resume_dir(dt_train_ckpt *ck, FILE *log, char *dir, size_t cap) {
  bool is_auto = ck->run.cfg->resume == DT_TRAIN_RESUME_AUTO;
  const char *resume = is_auto ? "auto" : ck->run.cfg->resume_path;
  FILE *report = ck->run.rank == 0 ? log : NULL;
  /* auto: the run's own checkpoints/ (which rank 0 may be creating now). */
  dt_status st = is_auto ? dt_train_ckpt_newest(ck->ckpt_dir, report, dir, cap)
                         : dt_train_ckpt_resolve(resume, report, dir, cap);
  if (st != DT_OK)
    return dt_error_wrap(st, "`resume` %s", resume);
  if (!dir[0] && !is_auto)
    return DT_ERROR(DT_ERR_IO, "`resume` %s: no complete checkpoint there", resume);
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
  dt_train_ckpt *ck = calloc(1, sizeof *ck);
  if (!ck)
    return DT_ERROR(DT_ERR_OOM, "checkpoints: out of host memory");
  ck->run = *run;
  ck->saved_step = -1;
  dt_status st = choose_run_dir(ck);
  /* The run owns its directory before it writes there: a second run, or a
   * resume while this one lives, is refused on every rank. (A default
   * directory is new, claimed by mkdir; one that `run_dir` names may be
   * anyone's.) */
  if (st == DT_OK)
    st = dt_train_run_lock_acquire_job(ck->run_dir, job_comm(ck), run->dev, run->rank,
                                       every_rank_writes(ck), &ck->lock);
  if (st == DT_OK && run->rank == 0) {
    st = dt_ckpt_make_dirs(ck->ckpt_dir);
    if (st == DT_OK)
      st = write_config_json(ck);
    if (st == DT_OK)
      st = open_log(ck, log);
  }
  if (st == DT_OK)
    log_msg(ck, *log, "dtrain train: run directory %s\n", ck->run_dir);
  if (st == DT_OK && dt_train_run_lock_note(ck->lock)[0])
    log_msg(ck, *log, "dtrain train: note: %s\n", dt_train_run_lock_note(ck->lock));
  char old[1][64];
  int n_old = 0;
  if (st == DT_OK && c->resume == DT_TRAIN_RESUME_NONE && run->rank == 0 &&
      dt_ckpt_list(ck->ckpt_dir, old, 1, &n_old) == DT_OK && n_old > 0)
    log_msg(ck, *log,
            "dtrain train: note: %s holds checkpoints of an earlier run (newest %s) and this run "
            "does not resume from them: they are replaced as it reaches their steps\n",
            ck->ckpt_dir, old[0]);
  if (st == DT_OK && c->resume != DT_TRAIN_RESUME_NONE) {
    char dir[4400];
    st = resume_dir(ck, *log, dir, sizeof dir);
    if (st == DT_OK && dir[0]) {
      st = dt_train_ckpt_load(&ck->run, dir, pos);
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

FILE *dt_train_ckpt_log_file(const dt_train_ckpt *ck) { return ck ? ck->file_log : NULL; }

const char *dt_train_ckpt_run_dir(const dt_train_ckpt *ck) { return ck ? ck->run_dir : ""; }
