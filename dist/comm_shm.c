/* The shared-memory transport's setup (see comm_shm.h): the segments made
 * by rank 0 and mapped by every rank through MPI, the transport's
 * creation and destruction, and the shared buffers. The collectives over
 * the segment are in comm_shm_protocol.c. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm_shm_internal.h"
#include "dist/guard.h"
#include "dist/mpi_util.h"
#include "dist/process_group_internal.h"

#define SHM_MAGIC 0x64747368u /* "dtsh" */
#define SHM_SLOT_BYTES ((size_t)1 << 20)

typedef struct shm_header {
  uint32_t magic;
  int32_t world;
  uint64_t nonce;
  uint64_t slot_bytes;
} shm_header;

/* ---- shared buffers ---- */

static void region_release(void *ctx) {
  shm_region *r = ctx;
  if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  munmap(r->base, r->map_bytes);
  free(r);
}

/* ---- setup ---- */

void dt_shm_transport_destroy(dt_shm_transport *t) {
  if (t == NULL)
    return;
  if (t->base != NULL)
    munmap(t->base, t->map_bytes);
  for (int i = 0; i < SHM_MAX_REGIONS; i++)
    if (t->regions[i] != NULL)
      region_release(t->regions[i]);
  pthread_mutex_destroy(&t->regions_mu);
  free(t->parts);
  free(t->sub);
  free(t->bufs);
  free(t);
}

static dt_status map_segment(int fd, size_t bytes, char **base) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return DT_ERROR(DT_ERR_OOM, "mapping %zu bytes of shared memory: %s", bytes, strerror(errno));
  *base = p;
  return DT_OK;
}

/* Rank 0: creates, sizes, maps and initialises the segment `name`. */
static dt_status create_segment(const char *name, uint64_t nonce, int world, size_t bytes,
                                size_t slot_bytes, char **base) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO, "shm_open(%s): %s", name, strerror(errno));
  dt_status st = DT_OK;
  if (ftruncate(fd, (off_t)bytes) != 0)
    st = DT_ERROR(DT_ERR_OOM, "sizing the shared segment %s to %zu bytes: %s (is /dev/shm full?)",
                  name, bytes, strerror(errno));
  if (st == DT_OK)
    st = map_segment(fd, bytes, base);
  close(fd);
  if (st != DT_OK) {
    shm_unlink(name);
    return st;
  }
  shm_header *h = (shm_header *)*base;
  h->world = world;
  h->nonce = nonce;
  h->slot_bytes = slot_bytes;
  __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_RELEASE);
  return DT_OK;
}

/* The other ranks: maps rank 0's segment and checks that it is the one
 * rank 0 made (the ranks may see different /dev/shm). */
static dt_status open_segment(const char *name, uint64_t nonce, int world, size_t bytes,
                              char **base) {
  int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO, "shm_open(%s) of rank 0's segment: %s", name, strerror(errno));
  struct stat sb;
  dt_status st = DT_OK;
  if (fstat(fd, &sb) != 0 || (size_t)sb.st_size != bytes)
    st = DT_ERROR(DT_ERR_IO, "rank 0's shared segment %s is not %zu bytes long", name, bytes);
  if (st == DT_OK)
    st = map_segment(fd, bytes, base);
  close(fd);
  DT_CHECK(st);
  const shm_header *h = (const shm_header *)*base;
  if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != SHM_MAGIC || h->nonce != nonce ||
      h->world != world) {
    munmap(*base, bytes);
    *base = NULL;
    return DT_ERROR(DT_ERR_IO, "the shared segment %s is not the one rank 0 created", name);
  }
  return DT_OK;
}

/* What rank 0 tells the others. */
typedef struct shm_offer {
  int32_t ok;
  uint64_t nonce;
  char name[64];
} shm_offer;

/* Collective: rank 0 makes a segment of `bytes` and broadcasts its name;
 * every rank maps it (at *base) and, for the transport's own segment
 * (`ctl`), initialises its liveness mutex; all agree that everyone did
 * (the all-reduce is also the point after which nobody opens the name, so
 * rank 0 unlinks it then). DT_ERR_UNSUPPORTED, with `why`, when some rank
 * could not (nothing stays mapped then). */
static dt_status share_segment(dt_shm_transport *t, size_t bytes, size_t slot_bytes, int want,
                               int ctl, char *why, size_t why_cap, char **base) {
  shm_offer offer = {0, 0, ""};
  dt_status st = DT_OK;
  *base = NULL;
  if (t->rank == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    static int counter; /* segments made by this process */
    offer.nonce = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    snprintf(offer.name, sizeof offer.name, "/dtrain-%d-%d-%d", (int)getuid(), (int)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    if (want) {
      st = create_segment(offer.name, offer.nonce, t->world, bytes, slot_bytes, base);
      if (st != DT_OK)
        snprintf(why, why_cap, "%s", dt_last_error());
    } else if (why[0] == '\0') {
      snprintf(why, why_cap, "turned off on rank 0");
    }
    offer.ok = want && st == DT_OK;
  }
  dt_pg_mpi_lock(t->pg);
  int rc = MPI_Bcast(&offer, (int)sizeof offer, MPI_BYTE, 0, t->comm);
  dt_pg_mpi_unlock(t->pg);
  if (rc != MPI_SUCCESS) {
    if (t->rank == 0 && offer.ok) {
      shm_unlink(offer.name);
      munmap(*base, bytes);
      *base = NULL;
    }
    DT_MPI_CHECK(rc);
  }
  int ok = offer.ok;
  if (t->rank != 0 && ok) {
    st = want ? open_segment(offer.name, offer.nonce, t->world, bytes, base) : DT_OK;
    ok = want && st == DT_OK;
    if (st != DT_OK)
      snprintf(why, why_cap, "%s", dt_last_error());
  }
  if (ok && ctl)
    st = dt_shm_init_alive(*base, t->rank);
  ok = ok && st == DT_OK;
  int all_ok = 0;
  dt_pg_mpi_lock(t->pg);
  rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, t->comm);
  dt_pg_mpi_unlock(t->pg);
  if (t->rank == 0 && offer.ok)
    shm_unlink(offer.name); /* everyone that could map it has: nothing stays in /dev/shm */
  if ((rc != MPI_SUCCESS || !all_ok) && *base != NULL) {
    munmap(*base, bytes);
    *base = NULL;
  }
  DT_MPI_CHECK(rc);
  if (!all_ok && why[0] == '\0')
    snprintf(why, why_cap, "%s",
             offer.ok ? "another rank could not map the segment, or has it turned off" : "");
  return all_ok ? DT_OK : DT_ERR_UNSUPPORTED;
}

dt_status dt_shm_transport_create(dt_pg *pg, MPI_Comm comm, int want, double timeout_s,
                                  dt_shm_transport **out) {
  *out = NULL;
  /* The same answer on every rank: no collective is run otherwise. */
  if (pg->world < 2 || pg->local_size != pg->world)
    return DT_OK;
  dt_shm_transport *t = calloc(1, sizeof *t);
  if (t != NULL) {
    pthread_mutex_init(&t->regions_mu, NULL);
    t->parts = calloc((size_t)pg->world, sizeof *t->parts);
    t->sub = calloc((size_t)pg->world, sizeof *t->sub);
    t->bufs = calloc((size_t)pg->world, sizeof *t->bufs);
  }
  if (t == NULL || t->parts == NULL || t->sub == NULL || t->bufs == NULL) {
    dt_shm_transport_destroy(t);
    return DT_ERROR(DT_ERR_OOM, "shared-memory transport: out of host memory");
  }
  t->rank = pg->rank;
  t->world = pg->world;
  t->pg = pg;
  t->comm = comm;
  t->timeout_s = timeout_s;
  /* At least 64 elements of 4 bytes per segment and slot. */
  size_t min_slot = ((size_t)pg->world * 256 + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
  t->slot_bytes = SHM_SLOT_BYTES > min_slot ? SHM_SLOT_BYTES : min_slot;
  t->map_bytes = dt_shm_segment_bytes(t->world, t->slot_bytes);
  char why[512] = "";
  dt_guard *guard = NULL;
  dt_status st =
      dt_guard_begin(pg, "setting up the shared-memory transport (every rank)", timeout_s, &guard);
  if (st == DT_OK) {
    st = share_segment(t, t->map_bytes, t->slot_bytes, want, 1, why, sizeof why, &t->base);
    dt_guard_end(guard);
  }
  if (st == DT_ERR_UNSUPPORTED) {
    if (t->rank == 0 && want && why[0] != '\0')
      fprintf(stderr, "dtrain: rank 0: shared-memory transport unavailable (%s); using MPI\n", why);
    dt_shm_transport_destroy(t);
    return DT_OK;
  }
  if (st != DT_OK) {
    dt_shm_transport_destroy(t);
    return dt_error_wrap(st, "setting up the shared-memory transport on rank %d", pg->rank);
  }
  *out = t;
  return DT_OK;
}

/* Unmaps the buffers whose callers have let go; the index of a free
 * table entry, or -1. Under regions_mu. */
static int sweep_regions(dt_shm_transport *t) {
  int free_slot = -1;
  for (int i = 0; i < SHM_MAX_REGIONS; i++) {
    shm_region *r = t->regions[i];
    if (r != NULL && __atomic_load_n(&r->refs, __ATOMIC_ACQUIRE) == 1) {
      region_release(r); /* only the table held it */
      t->regions[i] = r = NULL;
    }
    if (r == NULL && free_slot < 0)
      free_slot = i;
  }
  return free_slot;
}

dt_status dt_shm_transport_share(dt_shm_transport *t, size_t bytes, void **data,
                                 void (**release)(void *ctx), void **ctx) {
  *data = NULL;
  *release = NULL;
  *ctx = NULL;
  uint64_t id = t->shares++; /* the same count on every rank */
  if (bytes == 0)
    return DT_OK;
  pthread_mutex_lock(&t->regions_mu);
  int slot = sweep_regions(t);
  pthread_mutex_unlock(&t->regions_mu);
  shm_region *r = calloc(1, sizeof *r);
  if (r == NULL)
    return DT_ERROR(DT_ERR_OOM, "a shared buffer: out of host memory");
  r->id = id;
  r->part_bytes = (bytes + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
  r->map_bytes = SHM_REGION_HEADER + (size_t)t->world * r->part_bytes;
  char why[512] = "";
  if (slot < 0) /* every rank learns of it in the segment's agreement */
    snprintf(why, sizeof why, "%d shared buffers are in use on rank %d", SHM_MAX_REGIONS, t->rank);
  dt_guard *guard = NULL;
  dt_status st = dt_guard_begin(t->pg, "sharing a buffer between the ranks (every rank)",
                                t->timeout_s, &guard);
  if (st == DT_OK) {
    st = share_segment(t, r->map_bytes, 0, slot >= 0, 0, why, sizeof why, &r->base);
    dt_guard_end(guard);
  }
  if (st == DT_ERR_UNSUPPORTED) {
    if (t->rank == 0 || slot < 0)
      fprintf(stderr,
              "dtrain: rank %d: no shared buffer of %zu bytes (%s); its all-reduces are staged\n",
              t->rank, bytes, why);
    free(r);
    return DT_OK;
  }
  if (st != DT_OK) {
    free(r);
    return dt_error_wrap(st, "sharing a buffer of %zu bytes on rank %d", bytes, t->rank);
  }
  r->refs = 2; /* the table's and the caller's */
  pthread_mutex_lock(&t->regions_mu);
  t->regions[slot] = r;
  pthread_mutex_unlock(&t->regions_mu);
  *data = dt_shm_region_part(r, t->rank);
  *release = region_release;
  *ctx = r;
  return DT_OK;
}
