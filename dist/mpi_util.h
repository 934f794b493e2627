/* MPI helpers for dist/ (internal). */
#ifndef DT_DIST_MPI_UTIL_H
#define DT_DIST_MPI_UTIL_H

#include <mpi.h>

#include "core/status.h"

/* Translates an MPI error code into DT_ERR_MPI with the statement and MPI's
 * text, and returns it from the enclosing function. The communicator must
 * use MPI_ERRORS_RETURN for codes to come back at all. */
#define DT_MPI_CHECK(call)                                                                         \
  do {                                                                                             \
    int dt_mpi_rc_ = (call);                                                                       \
    if (dt_mpi_rc_ != MPI_SUCCESS) {                                                               \
      char dt_mpi_msg_[MPI_MAX_ERROR_STRING];                                                      \
      int dt_mpi_len_ = 0;                                                                         \
      if (MPI_Error_string(dt_mpi_rc_, dt_mpi_msg_, &dt_mpi_len_) != MPI_SUCCESS)                  \
        dt_mpi_msg_[0] = '\0';                                                                     \
      return DT_ERROR(DT_ERR_MPI, "%s failed: %s (MPI error %d)", #call, dt_mpi_msg_, dt_mpi_rc_); \
    }                                                                                              \
  } while (0)

#endif
