/* The shared-memory transport of the mpi communicator (internal to dist/).
 *
 * When every rank of a communicator runs on one node, the mpi backend runs
 * its host collectives through one shared segment instead of MPI
 * point-to-point messages: each rank copies the parts of its data the
 * others reduce into its own staging slots, reduces its 1/W slice reading
 * every rank's slots directly, publishes the result in its slot, and copies
 * the others' results out. Ranks synchronise through counters in the
 * segment (a short spin, then a futex wait on the shared mapping), so the
 * communication thread sleeps while the ranks compute. MPI is used only to
 * set the segment up.
 *
 *   dt_shm_transport *t = NULL;
 *   DT_CHECK(dt_shm_transport_create(pg, comm, 1, timeout_s, &t));  // NULL: not used
 *   ... dt_shm_transport_run(t, w, deadline) on the communication thread ...
 *   dt_shm_transport_destroy(t);
 */
#ifndef DT_DIST_COMM_SHM_H
#define DT_DIST_COMM_SHM_H

#include <mpi.h>

#include "dist/comm_internal.h"
#include "dist/process_group.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_shm_transport dt_shm_transport;

/* Collective over `comm` (every rank calls it; `comm` has
 * MPI_ERRORS_RETURN). *out stays NULL, with DT_OK, when the transport is
 * not used: a single rank, ranks on several nodes, `want` 0 on any rank
 * (dt_comm_config.shm, DT_COMM_SHM), or a segment that some rank could not
 * create or map (then rank 0 prints why, and the communicator keeps MPI's
 * path). The segment's name
 * exists only while the ranks map it during this call: afterwards nothing
 * is left in /dev/shm, whatever way the processes end. */
dt_status dt_shm_transport_create(dt_pg *pg, MPI_Comm comm, int want, double timeout_s,
                                  dt_shm_transport **out);
/* Runs one host collective of the communicator (w->in_data, w->out_data on
 * the host) to completion: agreement on the collective first (a mismatch is
 * DT_ERR_DIST_MISMATCH on every rank before any data moves), then the
 * data. DT_ERR_TIMEOUT past `deadline`; DT_ERR_STATE when a peer's process
 * died or left the communicator while this rank waited for it. */
dt_status dt_shm_transport_run(dt_shm_transport *t, dt_work *w, double deadline);
/* Collective (every rank, with the same `bytes`, on the caller's thread:
 * MPI sets it up): a buffer of `bytes` in a segment every rank maps, one
 * part per rank. *data is this rank's part (page-aligned); `release(ctx)`
 * lets go of it (the mapping stays until the transport is destroyed too).
 * An in-place all-reduce whose data lies in such a buffer at the same
 * offset on every rank reads the others' data where it lies and copies
 * each segment's result from its owner's part (no staging copies); any
 * other collective stages as before. *data is NULL, with DT_OK, when the
 * segment could not be made or mapped on some rank (rank 0 says why). */
dt_status dt_shm_transport_share(dt_shm_transport *t, size_t bytes, void **data,
                                 void (**release)(void *ctx), void **ctx);
/* Unmaps the segment (and the shared buffers nobody holds). NULL is a no-op. */
void dt_shm_transport_destroy(dt_shm_transport *t);

#ifdef __cplusplus
}
#endif
#endif
