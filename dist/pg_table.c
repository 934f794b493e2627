/* The process group's progress table: where each rank of this host stands
 * (its pid, the phase it named, its guarded steps and collectives), in a
 * small shared-memory segment every rank of the host maps, so that a rank
 * whose deadline passes can name the ranks that did not arrive instead of
 * itself (PyTorch's NCCL flight recorder publishes the same per rank).
 *
 * One slot per world rank, written only by its rank and read by the
 * others; a rank on another host has no slot here (its pid stays 0). The
 * segment's name exists only while the ranks map it at start-up, so
 * nothing is left in /dev/shm however the processes end. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist/process_group_internal.h"

struct dt_pg_slot {
  int32_t pid;        /* 0: the rank is not on this host */
  uint32_t phase_gen; /* odd while the phase text is written (a sequence lock) */
  uint64_t guards;    /* guarded steps begun (dt_guard_begin) */
  uint64_t entered;   /* the newest collective begun (or enqueued) */
  uint64_t completed; /* the newest collective completed */
  char phase[96];
};

static size_t table_bytes(int world) { return (size_t)world * sizeof(dt_pg_slot); }

/* What local rank 0 tells the others. */
typedef struct table_offer {
  int32_t ok;
  char name[64];
} table_offer;

/* Local rank 0: a fresh segment for `world` slots (zeroed by the kernel). */
static dt_pg_slot *create_table(const char *name, int world) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return NULL;
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)table_bytes(world)) == 0)
    p = mmap(NULL, table_bytes(world), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    shm_unlink(name);
  return p == MAP_FAILED ? NULL : p;
}

static dt_pg_slot *open_table(const char *name, int world) {
  int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0)
    return NULL;
  struct stat sb;
  void *p = MAP_FAILED;
  if (fstat(fd, &sb) == 0 && (size_t)sb.st_size == table_bytes(world))
    p = mmap(NULL, table_bytes(world), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}

void dt_pg_table_open(dt_pg *pg, MPI_Comm node) {
  table_offer offer = {0, ""};
  dt_pg_slot *table = NULL;
  if (pg->local_rank == 0) {
    snprintf(offer.name, sizeof offer.name, "/dtrain-%d-%d-table", (int)getuid(), (int)getpid());
    table = create_table(offer.name, pg->world);
    offer.ok = table != NULL;
  }
  if (MPI_Bcast(&offer, (int)sizeof offer, MPI_BYTE, 0, node) != MPI_SUCCESS)
    offer.ok = 0;
  if (pg->local_rank != 0 && offer.ok)
    table = open_table(offer.name, pg->world);
  int ok = table != NULL, all_ok = 0;
  if (MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node) != MPI_SUCCESS)
    all_ok = 0;
  if (pg->local_rank == 0 && offer.ok)
    shm_unlink(offer.name); /* every rank that could map it has */
  if (!all_ok) {            /* no table: the messages say less, nothing else changes */
    if (table != NULL)
      munmap(table, table_bytes(pg->world));
    return;
  }
  pg->table = table;
  __atomic_store_n(&table[pg->rank].pid, (int32_t)getpid(), __ATOMIC_RELEASE);
}

void dt_pg_table_close(dt_pg *pg) {
  if (pg->table != NULL)
    munmap(pg->table, table_bytes(pg->world));
  pg->table = NULL;
}

void dt_pg_set_phase(dt_pg *pg, const char *phase) {
  if (pg == NULL)
    return;
  snprintf(pg->phase, sizeof pg->phase, "%s", phase ? phase : "");
  if (pg->table == NULL)
    return;
  dt_pg_slot *s = &pg->table[pg->rank];
  uint32_t gen = __atomic_load_n(&s->phase_gen, __ATOMIC_RELAXED);
  __atomic_store_n(&s->phase_gen, gen + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  snprintf(s->phase, sizeof s->phase, "%s", pg->phase);
  __atomic_store_n(&s->phase_gen, gen + 2, __ATOMIC_RELEASE);
}

uint64_t dt_pg_note_guard(const dt_pg *pg) {
  if (pg == NULL || pg->table == NULL)
    return 0;
  return __atomic_add_fetch(&pg->table[pg->rank].guards, 1, __ATOMIC_RELEASE);
}

void dt_pg_note_collective(const dt_pg *pg, uint64_t entered, uint64_t completed) {
  if (pg == NULL || pg->table == NULL)
    return;
  dt_pg_slot *s = &pg->table[pg->rank];
  if (entered)
    __atomic_store_n(&s->entered, entered, __ATOMIC_RELEASE);
  if (completed)
    __atomic_store_n(&s->completed, completed, __ATOMIC_RELEASE);
}

/* A consistent copy of slot s's phase ("" while its writer is stopped in
 * the middle of writing it). */
static void read_phase(const dt_pg_slot *s, char *buf, size_t cap) {
  for (int tries = 0; tries < 1000; tries++) {
    uint32_t before = __atomic_load_n(&s->phase_gen, __ATOMIC_ACQUIRE);
    if (before & 1)
      continue;
    snprintf(buf, cap, "%.*s", (int)sizeof s->phase - 1, s->phase);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->phase_gen, __ATOMIC_RELAXED) == before)
      return;
  }
  buf[0] = '\0';
}

void dt_pg_phase(const dt_pg *pg, char *buf, size_t cap) {
  if (pg != NULL && pg->table != NULL)
    read_phase(&pg->table[pg->rank], buf, cap); /* the comm thread reads it too */
  else
    snprintf(buf, cap, "%s", pg != NULL ? pg->phase : "");
}

/* The process's state from /proc/PID/stat: "stopped" (SIGSTOP, or a
 * debugger), "gone" (exited: no such process, or a zombie), else
 * "running". */
static const char *process_state(int pid) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return "gone";
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  const char *close = strrchr(text, ')'); /* the name in parentheses may hold anything */
  char state = close != NULL && close[1] == ' ' ? close[2] : '?';
  return state == 'T' || state == 't'   ? "stopped"
         : state == 'Z' || state == 'X' ? "gone"
                                        : "running";
}

/* Appends printf text to buf (of cap bytes) at *len, keeping it terminated. */
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0)
    *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* "rank R (pid P, stopped)" and where it stands. */
static void describe_rank(const dt_pg_slot *s, int r, char *buf, size_t cap, size_t *len) {
  int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
  char phase[sizeof s->phase];
  read_phase(s, phase, sizeof phase);
  append(buf, cap, len, "rank %d (pid %d, %s", r, pid, process_state(pid));
  if (phase[0])
    append(buf, cap, len, ", last in %s", phase);
  append(buf, cap, len, ", its last completed collective #%llu)",
         (unsigned long long)__atomic_load_n(&s->completed, __ATOMIC_ACQUIRE));
}

void dt_pg_describe_behind(const dt_pg *pg, uint64_t guard_step, uint64_t coll_seq, char *buf,
                           size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  if (pg == NULL || pg->table == NULL || pg->world < 2) {
    append(buf, cap, &len, "which rank is behind is not known here");
    return;
  }
  int behind = 0, halted = 0, remote = 0;
  /* The ranks that did not arrive: fewer guarded steps begun, or an older
   * newest collective, than this one. */
  for (int r = 0; r < pg->world; r++) {
    const dt_pg_slot *s = &pg->table[r];
    int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    remote += pid == 0;
    if (r == pg->rank || pid == 0)
      continue;
    int late = guard_step ? __atomic_load_n(&s->guards, __ATOMIC_ACQUIRE) < guard_step
                          : __atomic_load_n(&s->entered, __ATOMIC_ACQUIRE) < coll_seq;
    if (!late)
      continue;
    append(buf, cap, &len, "%s", behind++ ? "; " : "");
    describe_rank(s, r, buf, cap, &len);
  }
  if (behind > 0)
    append(buf, cap, &len, " did not arrive");
  /* Every rank here arrived: name those that cannot finish it. */
  for (int r = 0; behind == 0 && r < pg->world; r++) {
    const dt_pg_slot *s = &pg->table[r];
    int pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (r == pg->rank || pid == 0 || strcmp(process_state(pid), "running") == 0)
      continue;
    append(buf, cap, &len, "%s", halted++ ? "; " : "every rank on this host arrived, but ");
    describe_rank(s, r, buf, cap, &len);
  }
  if (halted > 0)
    append(buf, cap, &len, " cannot finish it");
  if (behind == 0 && halted == 0)
    append(buf, cap, &len, "every rank on this host arrived and runs");
  if (remote > 0)
    append(buf, cap, &len, " (%d rank%s on other hosts: not visible from here)", remote,
           remote == 1 ? "" : "s");
}
