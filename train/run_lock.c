/* The run directory's lock (see train/run_lock.h). */
#define _GNU_SOURCE
#include "train/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/checkpoint.h"
#include "train/train_loop.h"

#define RECORD_MAX 512
/* A refused run reads the holder's record; one that names no live holder
 * yet (the holder is between its flock and its write, over an older
 * record) is read again, for up to TRIES x PAUSE_MS. */
#define TRIES 50
#define PAUSE_MS 20

struct dt_train_run_lock {
  int fd;
  char path[4200];
  char record[RECORD_MAX];      /* this process's */
  char note[RECORD_MAX + 4600]; /* for the run's log, "" = none */
};

/* "dtrain run lock\npid N\nhost H\nstarted T\n" of this process. */
static void own_record(char *buf, size_t cap) {
  char host[256] = "unknown";
  if (gethostname(host, sizeof host) != 0)
    snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, cap, "dtrain run lock\npid %ld\nhost %s\nstarted %s.%09ldZ\n", (long)getpid(), host,
           when, ts.tv_nsec);
}

/* The value of line "<key> <value>" of a record, "" when missing. */
static void record_field(const char *record, const char *key, char *out, size_t cap) {
  out[0] = '\0';
  size_t len = strlen(key);
  for (const char *line = record; line && *line; line = strchr(line, '\n'), line += line != NULL) {
    if (strncmp(line, key, len) != 0 || line[len] != ' ')
      continue;
    const char *v = line + len + 1;
    size_t n = strcspn(v, "\n");
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), v);
    return;
  }
}

static void read_record(int fd, char *buf, size_t cap) {
  ssize_t n = pread(fd, buf, cap - 1, 0);
  buf[n > 0 ? n : 0] = '\0';
}

/* "pid N on host H (since T)" of a record. */
static void describe(const char *record, char *out, size_t cap) {
  char pid[32], host[256], since[64];
  record_field(record, "pid", pid, sizeof pid);
  record_field(record, "host", host, sizeof host);
  record_field(record, "started", since, sizeof since);
  snprintf(out, cap, "pid %s on host %s (since %s)", pid[0] ? pid : "?", host[0] ? host : "?",
           since[0] ? since : "?");
}

/* Whether a record names a holder that may be alive: one of another host
 * cannot be checked from here; one of this host must be a live process. */
static bool may_be_alive(const char *record) {
  char pid[32], host[256], own_host[256] = "";
  record_field(record, "pid", pid, sizeof pid);
  record_field(record, "host", host, sizeof host);
  if (!pid[0])
    return false;
  if (gethostname(own_host, sizeof own_host) != 0 || strcmp(host, own_host) != 0)
    return true;
  long p = strtol(pid, NULL, 10);
  return p > 0 && (kill((pid_t)p, 0) == 0 || errno == EPERM);
}

static void pause_ms(int ms) {
  struct timespec t = {0, (long)ms * 1000 * 1000};
  nanosleep(&t, NULL);
}

/* flock, non-blocking; *held = another holder has it. A file system that
 * takes no locks: not held, said in the note. */
static dt_status try_flock(dt_train_run_lock *l, bool *held) {
  *held = false;
  while (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR)
      continue;
    if (errno == EWOULDBLOCK) {
      *held = true;
    } else if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      snprintf(l->note, sizeof l->note,
               "the file system of %s takes no locks (flock: %s): this run does not keep other "
               "runs out of its directory",
               l->path, strerror(errno));
    } else {
      return DT_ERROR(DT_ERR_IO, "locking the run directory's lock file %s: %s", l->path,
                      strerror(errno));
    }
    break;
  }
  return DT_OK;
}

/* Locked (or on a file system without locks): the previous record, if the
 * run before did not clear it, becomes the note; this process's record
 * goes in, on disk before any other rank reads it. */
static dt_status write_own_record(dt_train_run_lock *l, const char *dir) {
  char previous[RECORD_MAX], who[RECORD_MAX];
  read_record(l->fd, previous, sizeof previous);
  if (previous[0] && !l->note[0]) {
    describe(previous, who, sizeof who);
    snprintf(l->note, sizeof l->note,
             "run directory %s was last held by %s, which did not release it (it was killed, or "
             "its node failed): this run takes it over",
             dir, who);
  }
  own_record(l->record, sizeof l->record);
  size_t n = strlen(l->record);
  if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, l->record, n, 0) != (ssize_t)n || fsync(l->fd) != 0)
    return DT_ERROR(DT_ERR_IO, "writing the run directory's lock file %s: %s", l->path,
                    strerror(errno));
  return DT_OK;
}

static dt_status lock_or_refuse(dt_train_run_lock *l, const char *dir) {
  char record[RECORD_MAX] = "";
  for (int attempt = 0; attempt < TRIES; attempt++) {
    bool held;
    DT_CHECK(try_flock(l, &held));
    if (!held)
      return write_own_record(l, dir);
    read_record(l->fd, record, sizeof record);
    if (may_be_alive(record))
      break;
    pause_ms(PAUSE_MS);
  }
  char who[RECORD_MAX];
  if (record[0])
    describe(record, who, sizeof who);
  else
    snprintf(who, sizeof who, "a process that has not written its record");
  return DT_ERROR(DT_ERR_STATE,
                  "run directory %s is in use by another run: %s; its lock file %s: wait for that "
                  "run to end (SIGTERM stops it after a checkpoint, which `resume` auto "
                  "continues from), or give another `run_dir`",
                  dir, who, l->path);
}

dt_status dt_train_run_lock_acquire(const char *dir, dt_train_run_lock **out) {
  DT_CHECK_OUT(out);
  DT_CHECK(dt_ckpt_make_dirs(dir));
  dt_train_run_lock *l = calloc(1, sizeof *l);
  if (!l)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the run directory's lock");
  snprintf(l->path, sizeof l->path, "%s/%s", dir, DT_TRAIN_RUN_LOCK_FILE);
  /* O_CLOEXEC: a program this process started must not keep the lock. */
  l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  dt_status st = l->fd >= 0 ? lock_or_refuse(l, dir)
                            : DT_ERROR(DT_ERR_IO, "opening the run directory's lock file %s: %s",
                                       l->path, strerror(errno));
  if (st != DT_OK) {
    if (l->fd >= 0)
      close(l->fd);
    free(l);
    return st;
  }
  *out = l;
  return DT_OK;
}

/* Ranks other than 0 that write into the directory: the lock file there
 * must hold rank 0's record. */
static dt_status check_rank0_record(const char *dir, int rank, const char *rank0_record) {
  char path[4200], seen[RECORD_MAX], seen_who[RECORD_MAX] = "no record", rank0[RECORD_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, DT_TRAIN_RUN_LOCK_FILE);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO,
                    "this rank (%d) cannot open the run directory's lock file %s that rank 0 "
                    "holds (%s): every rank must see the run directory on one file system",
                    rank, path, strerror(errno));
  read_record(fd, seen, sizeof seen);
  close(fd);
  if (!strcmp(seen, rank0_record))
    return DT_OK;
  if (seen[0])
    describe(seen, seen_who, sizeof seen_who);
  describe(rank0_record, rank0, sizeof rank0);
  return DT_ERROR(
      DT_ERR_DIST_MISMATCH,
      "this rank (%d) sees another holder in the run directory's lock file %s (%s) "
      "than rank 0's lock (%s): every rank must see the run directory on one file system",
      rank, path, seen_who, rank0);
}

dt_status dt_train_run_lock_acquire_job(const char *dir, dt_comm *comm, dt_device dev, int rank,
                                        bool others_write, dt_train_run_lock **out) {
  DT_CHECK_OUT(out);
  /* Rank 0's outcome: its status (one byte), then its record or message. */
  char text[RECORD_MAX + DT_ERROR_MAX] = "";
  dt_status st = DT_OK;
  if (rank == 0) {
    st = dt_train_run_lock_acquire(dir, out);
    snprintf(text, sizeof text, "%c%s", (char)('A' + (int)st),
             st == DT_OK ? (*out)->record : dt_last_error());
  }
  if (!comm)
    return st;
  dt_status cs = dt_train_broadcast_text(comm, dev, text, sizeof text);
  if (cs == DT_OK && text[0] != 'A')
    cs = rank == 0 ? st : DT_ERROR((dt_status)(text[0] - 'A'), "%s", text + 1);
  if (cs == DT_OK && others_write) {
    st = rank == 0 ? DT_OK : check_rank0_record(dir, rank, text + 1);
    double failed = st != DT_OK;
    cs = dt_train_sum_over_ranks(comm, dev, &failed, 1);
    if (cs == DT_OK)
      cs = st;
    if (cs == DT_OK && failed > 0)
      cs = DT_ERROR(DT_ERR_DIST_MISMATCH,
                    "another rank does not see this run's lock file %s/%s (its message names "
                    "the rank): every rank must see the run directory on one file system",
                    dir, DT_TRAIN_RUN_LOCK_FILE);
  }
  if (cs != DT_OK) {
    dt_train_run_lock_release(*out);
    *out = NULL;
  }
  return cs;
}

const char *dt_train_run_lock_note(const dt_train_run_lock *lock) { return lock ? lock->note : ""; }

void dt_train_run_lock_release(dt_train_run_lock *lock) {
  if (!lock)
    return;
  /* Cleared: a record the next holder finds was left by a run that did
   * not end here. Closing the file releases the lock. */
  int cleared = ftruncate(lock->fd, 0); /* failed: the lock goes with the close all the same */
  (void)cleared;
  close(lock->fd);
  free(lock);
}
