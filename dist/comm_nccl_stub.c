/* The nccl backend in a build without CUDA (no toolkit, or --config=cpu):
 * every entry fails with DT_ERR_UNSUPPORTED and says why, so callers (and
 * DT_COMM_BACKEND=auto, which then uses host staging) behave the same on
 * every rank. */
#include "dist/comm_internal.h"

#define NCCL_NOT_BUILT                                                                        \
  "this build of dtrain has no NCCL (built without the CUDA toolkit, or with --config=cpu): " \
  "rebuild where /usr/local/cuda (or $CUDA_HOME) has NCCL, or use DT_COMM_BACKEND=mpi"

int dt_nccl_built(void) { return 0; }

int dt_nccl_version(void) { return 0; }

dt_status dt_comm_create_nccl(dt_pg *pg, dt_device dev, const dt_comm_config *cfg, dt_comm **out) {
  (void)pg, (void)dev, (void)cfg;
  if (out)
    *out = NULL;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "nccl communicator: " NCCL_NOT_BUILT);
}

dt_status dt_nccl_clique_create(const dt_device *devices, int n, dt_nccl_clique **out) {
  (void)devices;
  if (out)
    *out = NULL;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "NCCL clique of %d GPUs: " NCCL_NOT_BUILT, n);
}

void dt_nccl_clique_release(dt_nccl_clique *q) { (void)q; }

dt_status dt_comm_create_nccl_clique(dt_nccl_clique *q, int rank, const dt_comm_config *cfg,
                                     dt_comm **out) {
  (void)q, (void)cfg;
  if (out)
    *out = NULL;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "nccl clique communicator %d: " NCCL_NOT_BUILT, rank);
}
