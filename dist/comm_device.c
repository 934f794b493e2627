/* Choosing the device of a rank and the communicator for device tensors
 * (nccl, or host staging over mpi / local). Plain C over the backend
 * registry: builds and runs with or without CUDA. */
#include <stdio.h>

#include "dist/comm_internal.h"
#include "dist/process_group_internal.h"

dt_status dt_comm_pick_device(const dt_pg *pg, dt_device *out) {
  int visible = dt_device_count(DT_DEVICE_CUDA);
  if (visible <= 0) {
    const dt_backend_ops *ops = NULL;
    dt_status st = dt_backend_get((dt_device){DT_DEVICE_CUDA, 0}, &ops);
    if (st == DT_OK)
      st = DT_ERROR(DT_ERR_NO_DEVICE, "no CUDA GPU is visible");
    return dt_error_wrap(st, "picking rank %d's GPU", pg->rank);
  }
  /* One visible GPU: the launcher bound this rank to it (Slurm
   * --gpu-bind, CUDA_VISIBLE_DEVICES per rank), or the ranks share it. */
  int index = visible == 1 ? 0 : pg->local_rank;
  if (index >= visible)
    return DT_ERROR(DT_ERR_NO_DEVICE,
                    "rank %d is local rank %d of %d on %s but only %d GPUs are visible "
                    "(CUDA_VISIBLE_DEVICES): start at most %d ranks per node (dtrain launch -n "
                    "picks one per GPU), or bind one GPU per rank",
                    pg->rank, pg->local_rank, pg->local_size, pg->host, visible, visible);
  *out = (dt_device){DT_DEVICE_CUDA, index};
  return DT_OK;
}

/* Host memory communicator over the group: mpi, or a local group of one. */
static dt_status create_host_comm(dt_pg *pg, const dt_comm_config *cfg, dt_comm **out) {
  return dt_comm_create_for_pg(pg, cfg, out);
}

dt_status dt_comm_create_for_device(dt_pg *pg, dt_device dev, const dt_comm_config *cfg,
                                    dt_comm **out) {
  if (pg == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a communicator: pg or out is NULL");
  *out = NULL;
  dt_comm_config cc = cfg ? *cfg : DT_COMM_CONFIG_DEFAULT;
  char d[32];
  dt_device_format(dev, d, sizeof d);
  if (dev.type == DT_DEVICE_CPU) {
    if (cc.backend == DT_COMM_BACKEND_NCCL)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "communication backend nccl for %s tensors: NCCL reduces GPU memory; use "
                      "auto or mpi with cpu devices",
                      d);
    return create_host_comm(pg, &cc, out);
  }
  switch (cc.backend) {
    case DT_COMM_BACKEND_NCCL: return dt_comm_create_nccl(pg, dev, &cc, out);
    case DT_COMM_BACKEND_MPI:
      if (!dt_comm_can_stage(dev))
        return DT_ERROR(DT_ERR_UNSUPPORTED,
                        "host-staged communication for %s: its backend lacks streams, events or "
                        "copies (or the device is unusable: %s)",
                        d, dt_last_error());
      return create_host_comm(pg, &cc, out);
    case DT_COMM_BACKEND_AUTO: break;
  }
  dt_status st = dt_comm_create_nccl(pg, dev, &cc, out);
  if (st == DT_OK)
    return DT_OK;
  /* dt_comm_create_nccl fails alike on every rank, so all fall back. */
  fprintf(stderr,
          "dtrain: rank %d: nccl unavailable for %s: %s; using the host-staged mpi "
          "backend (slower: GPU -> host -> network -> GPU)\n",
          pg->rank, d, dt_last_error());
  fflush(stderr);
  if (!dt_comm_can_stage(dev))
    return dt_error_wrap(st, "and %s cannot be host-staged either", d);
  return create_host_comm(pg, &cc, out);
}
