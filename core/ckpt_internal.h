/* Private to the checkpoint files of core/ (ckpt_*.c): a small streaming
 * JSON reader for the safetensors header and the manifest. */
#ifndef DT_CORE_CKPT_INTERNAL_H
#define DT_CORE_CKPT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ckpt_json {
  const char *s;
  size_t n, pos;
  const char *what; /* "model.safetensors: header", for messages */
} ckpt_json;

/* Each returns DT_ERR_FORMAT naming `what` and the byte offset on bad input. */
dt_status ckpt_json_expect(ckpt_json *j, char c);
/* Peeks the next non-space character (0 at the end). */
char ckpt_json_peek(ckpt_json *j);
dt_status ckpt_json_string(ckpt_json *j, char *buf, size_t cap);
dt_status ckpt_json_int(ckpt_json *j, int64_t *out);
dt_status ckpt_json_skip(ckpt_json *j); /* any value */
/* Inside an object or array after its first element: true when another
 * element follows (consumes the ','), false at the closing bracket (consumed). */
dt_status ckpt_json_next(ckpt_json *j, char close, bool *more);
/* An array of integers into out[0..cap); *n the count. */
dt_status ckpt_json_int_array(ckpt_json *j, int64_t *out, int cap, int *n);

/* 8 hex digits -> value; false when malformed. */
bool ckpt_parse_hex32(const char *s, uint32_t *out);

/* Every tensor of a safetensors file in buf against its CRC32, for
 * dt_ckpt_verify: DT_ERR_FORMAT naming the file and the tensor. */
dt_status ckpt_safetensors_check(const char *path, const void *buf, size_t size);
/* Every section of a trainer-state file in buf (dt_state_file_open's checks). */
dt_status ckpt_state_check(const char *path, const void *buf, size_t size);

#endif
