/* Checkpoint files: CRC32, atomic writes, safetensors weights, the
 * trainer-state file and the manifest that makes a checkpoint exist.
 *
 * A checkpoint is a directory (launch/ names it step_NNNNNNNN):
 *   model.safetensors   the weights, standard safetensors: an 8-byte
 *                       little-endian header length, a JSON header (dtype,
 *                       shape, data_offsets per tensor; the modules' dotted
 *                       names), raw little-endian data; `__metadata__` holds
 *                       each tensor's CRC32 ("crc32.<name>": 8 hex digits)
 *   trainer_state.bin   dtrain's own: a versioned header and named sections,
 *                       each with its CRC32 (zlib's), see dt_state_writer
 *   manifest.json       written last: every file's size and CRC32. A
 *                       directory without it is an interrupted save and
 *                       does not count as a checkpoint.
 * Every file is written to a temporary name in the same directory, fsync'd,
 * renamed into place, and the directory fsync'd (dt_ckpt_write_file), so a
 * crash at any moment leaves either the old file or the new one.
 *
 * Errors name the file and the section (or tensor) and what is wrong:
 * DT_ERR_IO (missing, unreadable, unwritable: the errno text, e.g. "No
 * space left on device"), DT_ERR_FORMAT (truncated, bad magic, CRC
 * mismatch), DT_ERR_VERSION (a newer format), DT_ERR_SHAPE / DT_ERR_DTYPE
 * (weights that do not fit the model). */
#ifndef DT_CORE_CHECKPOINT_H
#define DT_CORE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "core/module.h"
#include "core/optim.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* zlib's CRC32 of data[0..n), continuing from `crc` (start with 0). */
uint32_t dt_crc32(uint32_t crc, const void *data, size_t n);

/* ---- files ---- */
/* One buffer of a file being written. */
typedef struct dt_ckpt_chunk {
  const void *data;
  size_t size;
} dt_ckpt_chunk;

/* Writes the chunks, in order, as dir/name: to dir/.name.tmp, fsync, rename,
 * fsync of dir. *crc (may be NULL) gets the CRC32 of the whole file and
 * *size (may be NULL) its length. On failure the temporary file is removed
 * and dir/name is left as it was. */
dt_status dt_ckpt_write_file(const char *dir, const char *name, const dt_ckpt_chunk *chunks,
                             int n_chunks, uint32_t *crc, uint64_t *size);

/* Reads the whole of `path` into a new malloc'd buffer (*data, free() it).
 * DT_ERR_IO naming the file. */
dt_status dt_ckpt_read_file(const char *path, void **data, size_t *size);

/* mkdir -p of `path` (mode 0755); fsyncs each parent it created into. */
dt_status dt_ckpt_make_dirs(const char *path);

/* ---- safetensors ---- */
/* Writes the module's parameters, then its buffers, under their dotted names
 * (f32 data copied to the host) as dir/name (dt_ckpt_write_file). */
dt_status dt_safetensors_save_module(const dt_module *m, const char *dir, const char *name,
                                     uint32_t *crc, uint64_t *size);

/* A host snapshot of named tensors, for a writer on another thread. */
typedef struct dt_tensor_snapshot dt_tensor_snapshot;
/* Copies the module's parameters and buffers to host memory. */
dt_status dt_tensor_snapshot_of_module(const dt_module *m, dt_tensor_snapshot **out);
void dt_tensor_snapshot_destroy(dt_tensor_snapshot *s);
/* The snapshot as safetensors, dir/name (dt_ckpt_write_file). */
dt_status dt_tensor_snapshot_write_safetensors(const dt_tensor_snapshot *s, const char *dir,
                                               const char *name, uint32_t *crc, uint64_t *size);

/* Loads `path` into the module's parameters and buffers, by dotted name:
 * every tensor of the module must be in the file with its shape and dtype
 * (f32), and every tensor of the file must belong to the module; the first
 * difference is DT_ERR_SHAPE / DT_ERR_DTYPE / DT_ERR_FORMAT naming the
 * tensor. Each tensor's CRC32 from the metadata ("crc32.<name>") is
 * checked; a tensor without one is DT_ERR_FORMAT. */
dt_status dt_safetensors_load_module(const char *path, dt_module *m);

/* ---- trainer state ----
 * Layout, all little-endian:
 *   "DTSTATE\0"  u32 version (1)  u32 n_sections
 *   n_sections x { char name[48] (NUL-padded), u64 offset, u64 size, u32 crc32, u32 0 }
 *   u32 crc32 of everything above
 *   the sections' bytes at their offsets
 * Sections written by launch/ (docs in train/train_checkpoint.h): "meta"
 * (text lines "key value"), "optimizer" (dt_ckpt_optim_section_*),
 * "scaler" (fp16 runs: dt_ckpt_scaler_section_*). */
#define DT_STATE_VERSION 1
#define DT_STATE_NAME_MAX 48

typedef struct dt_state_writer dt_state_writer;
dt_status dt_state_writer_create(dt_state_writer **out);
void dt_state_writer_destroy(dt_state_writer *w);
/* Adds a section (copied). Names are unique, 1..47 characters. */
dt_status dt_state_writer_add(dt_state_writer *w, const char *name, const void *data, size_t size);
/* Writes dir/name (dt_ckpt_write_file). */
dt_status dt_state_writer_write(const dt_state_writer *w, const char *dir, const char *name,
                                uint32_t *crc, uint64_t *size);

typedef struct dt_state_file dt_state_file;
/* Reads and checks a trainer-state file: magic, version, the header's CRC,
 * every section's bounds and CRC. The message names the file and the
 * section: "trainer_state.bin: section 'optimizer': CRC32 mismatch ...". */
dt_status dt_state_file_open(const char *path, dt_state_file **out);
void dt_state_file_close(dt_state_file *f);
/* The section's bytes (borrowed, valid until close); DT_ERR_FORMAT naming
 * the file when it is missing. */
dt_status dt_state_file_section(const dt_state_file *f, const char *name, const void **data,
                                size_t *size);
int dt_state_file_has_section(const dt_state_file *f, const char *name);

/* "key value" lines of a meta section: the value of `key` (up to the end of
 * its line) into buf; DT_ERR_FORMAT naming `what` (file and section) when
 * the key is missing. */
dt_status dt_state_meta_get(const char *text, size_t size, const char *key, const char *what,
                            char *buf, size_t cap);

/* The GradScaler's section "scaler" (fp16), text lines as the meta section:
 * scale_bits (the f32 scale's bits in hex: restored exactly), scale (for
 * reading), growth_tracker, skipped_steps. The scaler's config is the
 * run's. _encode writes at most cap bytes (DT_ERR_INVALID_ARG if too few);
 * _decode sets scale, growth_tracker and skipped_steps, DT_ERR_FORMAT
 * naming `what` for a missing or bad entry. */
dt_status dt_ckpt_scaler_section_encode(const dt_grad_scaler *s, char *buf, size_t cap,
                                        size_t *len);
dt_status dt_ckpt_scaler_section_decode(const void *bytes, size_t size, const char *what,
                                        dt_grad_scaler *s);

/* An optimizer section holds one rank's shard of the flat parameter space
 * (all of it without ZeRO) as segments of it:
 *   u64 total (the model's parameter count), u32 n_buffers, u32 n_segments,
 *   u64 0, n_segments x {u64 offset, u64 numel}, then the data buffer by
 *   buffer (SGD: the momentum; AdamW: exp_avg, exp_avg_sq), each the
 *   segments' elements in order: n_buffers x sum(numel) f32.
 * Segments lie within [0, total) and do not overlap. */
typedef struct dt_ckpt_optim_shard {
  uint64_t total;
  uint32_t n_buffers;
  uint32_t n_segments;
  const uint64_t *segments; /* n_segments x {offset, numel} */
  const float *data;        /* n_buffers x sum of the segments' numel */
} dt_ckpt_optim_shard;
/* Encodes a shard into a new malloc'd buffer. */
dt_status dt_ckpt_optim_section_encode(const dt_ckpt_optim_shard *shard, void **out, size_t *size);
/* Decodes a section (segments and data point into `bytes`); DT_ERR_FORMAT
 * naming `what` for segments outside [0, total) or a size that does not
 * add up. */
dt_status dt_ckpt_optim_section_decode(const void *bytes, size_t size, const char *what,
                                       dt_ckpt_optim_shard *out);

/* ---- manifest ---- */
#define DT_CKPT_MANIFEST "manifest.json"
#define DT_CKPT_MAX_FILES 256 /* two, and one optimizer shard per rank under ZeRO */

typedef struct dt_ckpt_file_entry {
  char name[128];
  uint64_t size;
  uint32_t crc32;
} dt_ckpt_file_entry;

typedef struct dt_ckpt_manifest {
  int64_t step;
  int n_files;
  dt_ckpt_file_entry files[DT_CKPT_MAX_FILES];
} dt_ckpt_manifest;

/* Writes dir/manifest.json (atomically) listing the files. */
dt_status dt_ckpt_manifest_write(const char *dir, const dt_ckpt_manifest *m);
/* Reads dir/manifest.json; DT_ERR_IO when absent (an incomplete checkpoint). */
dt_status dt_ckpt_manifest_read(const char *dir, dt_ckpt_manifest *m);

/* A checkpoint directory is complete and intact: its manifest, every file
 * it lists at its size and CRC32; for a file whose CRC differs, the
 * section or tensor that is wrong (trainer-state sections, safetensors
 * tensors). DT_ERR_IO / DT_ERR_FORMAT naming the file and section. */
dt_status dt_ckpt_verify(const char *dir, dt_ckpt_manifest *m);

/* The checkpoint directories "step_NNNNNNNN" of `parent`, newest (highest
 * step) first, into names (each up to 64 characters): the `cap` newest if
 * there are more; *n gets the count. A missing parent is 0 entries. */
dt_status dt_ckpt_list(const char *parent, char (*names)[64], int cap, int *n);

/* Removes a checkpoint directory: manifest first (it stops counting), then
 * the other files, then the directory. */
dt_status dt_ckpt_remove(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
