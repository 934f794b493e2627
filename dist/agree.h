/* Collective checks that every rank of a communicator holds the same text:
 * the model's parameter list (DDP), the resolved configuration and the data
 * sets (train). Cheap in the common case (one allgather of a 64-bit hash);
 * on a mismatch rank 0's and the first differing rank's texts are
 * broadcast, so that every rank reports the same first differing line. */
#ifndef DT_DIST_AGREE_H
#define DT_DIST_AGREE_H

#include "core/device.h"
#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `text` is lines ending in '\n'. Collective over comm (every rank calls
 * it); dev is the device the communicator reduces (nccl: a GPU). On a
 * difference every rank returns DT_ERR_DIST_MISMATCH:
 *   "ranks <what>: rank 0 has <line>, rank R has <line>: <advice>". */
dt_status dt_dist_agree_text(dt_comm *comm, dt_device dev, const char *text, const char *what,
                             const char *advice);

#ifdef __cplusplus
}
#endif
#endif
