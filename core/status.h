/* Status codes and thread-local error messages.
 *
 * Every fallible function returns dt_status. On failure the detail ("what
 * failed: values: advice") is kept in a thread-local buffer read with
 * dt_last_error(), so threads of one process (data-parallel replicas,
 * loader workers) never overwrite each other's text. Where it arose
 * ("function file:line") is kept apart, in dt_last_error_location(): the
 * message is for users, the location for developers (dtrain prints it with
 * DT_DEBUG=1).
 */
#ifndef DT_CORE_STATUS_H
#define DT_CORE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_status {
  DT_OK = 0,
  DT_ERR_OOM,
  DT_ERR_DEVICE_MISMATCH,
  DT_ERR_SHAPE,
  DT_ERR_DTYPE,
  DT_ERR_INVALID_ARG,
  DT_ERR_IO,
  DT_ERR_FORMAT,
  DT_ERR_CUDA,
  DT_ERR_NCCL,
  DT_ERR_MPI,
  DT_ERR_TIMEOUT,
  DT_ERR_DIST_MISMATCH,
  DT_ERR_UNSUPPORTED,
  DT_ERR_NO_DEVICE,
  DT_ERR_VERSION,
  DT_ERR_STATE,
  DT_ERR_INTERNAL,
} dt_status;

/* Name of a status ("DT_ERR_OOM"). Never NULL. */
const char *dt_status_name(dt_status s);

/* The last error message recorded on this thread ("" when none). */
const char *dt_last_error(void);
/* The longest message kept (bytes, with the terminating NUL). */
#define DT_ERROR_MAX 2048

/* Replaces this thread's message, keeping where it was recorded (a caller
 * that rewords it: the command line naming flags for fields). */
void dt_error_replace_message(const char *text);

/* Where the last error was recorded: "function file:line" of its DT_ERROR
 * (dt_error_wrap keeps it); "" when none. */
const char *dt_last_error_location(void);

/* Forget this thread's last error and its location. */
void dt_clear_error(void);

/* Record an error on this thread and return `s`. Use through DT_ERROR. */
dt_status dt_error_set(dt_status s, const char *func, const char *file, int line, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));

/* Prefix the current message with more context (keeps the status). */
dt_status dt_error_wrap(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Abort with file:line for a broken invariant (never for bad input). */
void dt_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define DT_ERROR(status, ...) dt_error_set((status), __func__, __FILE__, __LINE__, __VA_ARGS__)

#define DT_CHECK(expr)              \
  do {                              \
    dt_status dt_check_s_ = (expr); \
    if (dt_check_s_ != DT_OK)       \
      return dt_check_s_;           \
  } while (0)

/* The start of a function that makes a handle: DT_ERR_INVALID_ARG ("out is
 * NULL") when `out` is NULL, else *out = NULL, so that a failure leaves no
 * stale handle behind. */
#define DT_CHECK_OUT(out)                                 \
  do {                                                    \
    if (!(out))                                           \
      return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL"); \
    *(out) = NULL;                                        \
  } while (0)

/* Stores the status of `expr` in `status_var` and jumps to `label` (named
 * for what it frees) on failure:
 *   DT_CHECK_GOTO(dt_tensor_empty(..., &y), st, free_x); */
#define DT_CHECK_GOTO(expr, status_var, label) \
  do {                                         \
    (status_var) = (expr);                     \
    if ((status_var) != DT_OK)                 \
      goto label;                              \
  } while (0)

#define DT_ASSERT(expr)                          \
  do {                                           \
    if (!(expr))                                 \
      dt_assert_fail(#expr, __FILE__, __LINE__); \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
