/* The environment variables dtrain reads: one table (core/env_params.def),
 * typed getters that parse and validate, in the spirit of NCCL_PARAM.
 *
 *   int64_t threads = cores;                 // a computed default
 *   if (dt_env_int(DT_ENV_NUM_THREADS, &threads) != DT_OK)
 *     ... dt_last_error(): "environment variable DT_NUM_THREADS: invalid
 *         value 'abc': expected an integer in 1..4096"
 *
 * A variable that is unset or empty takes the table's default; when the
 * table has none (a default computed by the caller), *out keeps what the
 * caller put there. A value that does not parse leaves the same default in
 * *out and returns DT_ERR_INVALID_ARG with a message naming the variable,
 * the value and what is accepted, so a caller may fall back and warn, or
 * fail. Nothing is cached: each call reads the environment (callers that
 * need a setting often read it once). Code outside core/env.c never calls
 * getenv("DT_...") (tests/env_doc_test.sh checks it). */
#ifndef DT_CORE_ENV_H
#define DT_CORE_ENV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_env_param {
#define DT_ENV_INT(id, ...) DT_ENV_##id,
#define DT_ENV_BOOL(id, ...) DT_ENV_##id,
#define DT_ENV_BYTES(id, ...) DT_ENV_##id,
#define DT_ENV_CHOICE(id, ...) DT_ENV_##id,
#define DT_ENV_STRING(id, ...) DT_ENV_##id,
#include "core/env_params.def"
#undef DT_ENV_INT
#undef DT_ENV_BOOL
#undef DT_ENV_BYTES
#undef DT_ENV_CHOICE
#undef DT_ENV_STRING
  DT_ENV_COUNT
} dt_env_param;

typedef enum dt_env_type {
  DT_ENV_TYPE_INT = 0,
  DT_ENV_TYPE_BOOL,
  DT_ENV_TYPE_BYTES,
  DT_ENV_TYPE_CHOICE,
  DT_ENV_TYPE_STRING,
} dt_env_type;

/* One row of the table. */
typedef struct dt_env_info {
  const char *name; /* "DT_NUM_THREADS" */
  dt_env_type type;
  int64_t min, max;          /* INT: accepted range; BYTES: min, the least */
  const char *choices;       /* CHOICE: "auto|mpi|nccl" */
  const char *default_value; /* as it would be set; NULL = computed by the caller */
  const char *unset;         /* with default_value NULL: what the default is */
  const char *group;         /* "cpu", "cuda", "dist", "launch", "test" */
  const char *doc;
} dt_env_info;

/* The row of `p`; NULL when p is out of range. */
const dt_env_info *dt_env_info_of(dt_env_param p);

/* The value as set, or NULL when unset or empty. */
const char *dt_env_raw(dt_env_param p);
bool dt_env_is_set(dt_env_param p);

/* "what is accepted" for messages and help: "an integer in 1..4096",
 * "one of auto, mpi, nccl", ... */
const char *dt_env_accepted(dt_env_param p, char *buf, size_t cap);
/* The default for display: the default value, or the `unset` text. */
const char *dt_env_default_text(dt_env_param p);

/* Typed getters (see the top of this file). Each checks that `p` has the
 * getter's type (DT_ERR_INVALID_ARG otherwise). */
dt_status dt_env_int(dt_env_param p, int64_t *out);
dt_status dt_env_bool(dt_env_param p, bool *out);
dt_status dt_env_bytes(dt_env_param p, size_t *out);
/* *index: position in the choices ("auto|mpi|nccl": auto = 0). */
dt_status dt_env_choice(dt_env_param p, int *index);
/* *out points into the environment or the table. */
dt_status dt_env_string(dt_env_param p, const char **out);

/* Validates the current value of `p` (unset is valid). */
dt_status dt_env_check(dt_env_param p);

#ifdef __cplusplus
}
#endif
#endif
