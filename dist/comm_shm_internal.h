/* The shared-memory transport's state, shared by its two files (internal
 * to comm_shm*.c; the mpi backend sees only comm_shm.h):
 *   comm_shm.c           setup: making and mapping the segments, the
 *                        transport's creation, the shared buffers;
 *   comm_shm_protocol.c  the collectives over a mapped segment: the layout,
 *                        the counters and waits, the peers' liveness, the
 *                        staged pipeline and the in-place all-reduce.
 *
 * Segment: a header, one control block per rank, then per rank
 * SHM_SLOTS staging slots of slot_bytes. A rank writes only its own
 * control block (and the waiter counts of the others') and its own slots;
 * it reads everyone's. */
#ifndef DT_DIST_COMM_SHM_INTERNAL_H
#define DT_DIST_COMM_SHM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/comm_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_ALIGN 4096

enum { PH_IN, PH_RED, PH_OUT, PH_N };

typedef struct shm_ctl {
  uint32_t done[PH_N]; /* futex words: chunks past each phase (mod 2^32) */
  /* While this rank sleeps on a peer's counter: which one, packed by
   * sleep_word(), else 0. The peer wakes it only once the target is met. */
  uint64_t sleeping_on;
  uint32_t armed;           /* 1 once `alive` is held by the communication thread */
  int64_t sig[2][DT_SIG_N]; /* the signature of collective seq, at [seq & 1] */
  /* ... and where its buffer lies: shared buffer index and byte offset in
   * this rank's part, or -1 and -1 (not in one: the staging slots). */
  int64_t place[2][2];
  pthread_mutex_t alive; /* robust, process-shared */
} shm_ctl;

/* A shared buffer (dt_shm_transport_share): a segment holding one part
 * per rank, each rank's data at the same offset of its part. Unmapped when
 * both the transport and the buffer's user have let go of it. */
typedef struct shm_region {
  int refs;    /* atomic: the transport's table and the caller's tensor */
  uint64_t id; /* the same on every rank: counts the communicator's shares */
  char *base;
  size_t map_bytes;
  size_t part_bytes; /* the stride between the ranks' parts (page multiple) */
} shm_region;

#define SHM_MAX_REGIONS 16
#define SHM_REGION_HEADER SHM_ALIGN

struct dt_shm_transport {
  int rank, world;
  dt_pg *pg;
  MPI_Comm comm;
  double timeout_s;
  char *base;
  size_t map_bytes;
  size_t slot_bytes;
  uint64_t chunks; /* chunks this rank has started, over all collectives */
  int armed;
  const void **parts; /* world: the slices a reduction adds */
  const void **sub;   /* world: the same, advanced to a sub-chunk */
  char **bufs;        /* world: an in-place all-reduce's buffer on every rank */
  /* Shared buffers: added on the caller's thread, looked up on the
   * communication thread, under regions_mu. A buffer whose caller has let
   * go (refs 1) is unmapped at the next share or at destruction. */
  pthread_mutex_t regions_mu;
  shm_region *regions[SHM_MAX_REGIONS];
  uint64_t shares; /* dt_shm_transport_share calls so far */
};

/* ---- comm_shm_protocol.c ---- */

/* Bytes of a transport segment for `world` ranks with slots of slot_bytes. */
size_t dt_shm_segment_bytes(int world, size_t slot_bytes);
/* Rank k's part of shared buffer r. */
char *dt_shm_region_part(const shm_region *r, int k);
/* Initialises rank k's liveness mutex in the segment mapped at base (each
 * rank its own, at setup). */
dt_status dt_shm_init_alive(char *base, int k);

#ifdef __cplusplus
}
#endif
#endif
