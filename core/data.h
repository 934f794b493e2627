/* Data sets, samplers and the background loader.
 *
 * idx files (raw or gzip, detected by magic) are validated strictly: bad
 * magic, truncated data, mismatched image/label counts and absurd
 * dimensions fail with DT_ERR_FORMAT naming the file and the problem,
 * before any large allocation.
 */
#ifndef DT_CORE_DATA_H
#define DT_CORE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- idx reader ---- */
typedef struct dt_idx {
  uint8_t type; /* 0x08 = u8 (the only type the readers here accept) */
  int ndim;
  int64_t dims[4];
  uint8_t *data; /* numel bytes, owned */
  int64_t numel;
} dt_idx;

/* Reads a whole idx file. `expect_ndim` (0 = any) must match. Limits: at most
 * 4 dims, each in [1, 2^31), total <= 2^32 bytes, and no more than the file
 * can hold (for gzip, the decompressed stream is checked as it is read and
 * the buffer grows only as data arrives). A raw file must hold exactly
 * header + numel bytes (truncated or trailing data: DT_ERR_FORMAT); so must
 * a gzip stream's decompressed content. Errors: DT_ERR_IO (cannot open or
 * read; the message has strerror), DT_ERR_FORMAT (bad magic, element type
 * other than 0x08, ndim, dims, truncation, corrupt gzip). Every message
 * names the file. On failure *out is zeroed. Free with dt_idx_free. */
dt_status dt_idx_read(const char *path, int expect_ndim, dt_idx *out);
void dt_idx_free(dt_idx *idx);

/* ---- data sets ---- */
typedef struct dt_dataset dt_dataset;

/* One sample: an input and a target, each of a dtype and shape; the loader
 * stacks batch_size of each. Image classification: f32 (C, H, W) input, one
 * i32 class id (target_ndim 0); token windows: i32 (T) and i32 (T). */
typedef struct dt_sample_layout {
  dt_dtype input_dtype;
  int input_ndim; /* 1 .. DT_MAX_DIMS - 1 (the loader adds the batch dim) */
  int64_t input_shape[DT_MAX_DIMS - 1];
  dt_dtype target_dtype;
  int target_ndim; /* 0 (one value) .. DT_MAX_DIMS - 1 */
  int64_t target_shape[DT_MAX_DIMS - 1];
} dt_sample_layout;

typedef struct dt_dataset_vtable {
  int64_t (*length)(void *impl);
  /* dt_dataset_create: writes sample i's input (f32, `input_numel` values)
   * and label. */
  dt_status (*get)(void *impl, int64_t i, float *input, int32_t *label);
  void (*destroy)(void *impl);
  /* dt_dataset_create_with_layout: writes sample i's input and target in
   * the layout's dtypes and shapes (contiguous). */
  dt_status (*get_sample)(void *impl, int64_t i, void *input, void *target);
  /* Optional: sample i as it is in epoch `epoch` (a random augmentation
   * drawn from the epoch and the index); the loader calls it when set,
   * get_sample (or get) at epoch 0 elsewhere. */
  dt_status (*get_sample_at)(void *impl, int64_t i, int64_t epoch, void *input, void *target);
} dt_dataset_vtable;

/* The dataset takes ownership of impl (on failure too: vt->destroy runs).
 * `input_shape` is one sample's shape (1 to DT_MAX_DIMS-1 dims; the loader
 * adds the batch dim); samples are f32 inputs with one i32 label (vt->get).
 * vt->get may be called from the loader's worker
 * thread, concurrently with other dataset calls: it must be thread-safe
 * for reads. dt_dataset_get checks the index (DT_ERR_INVALID_ARG). */
dt_status dt_dataset_create(const dt_dataset_vtable *vt, void *impl, const int64_t *input_shape,
                            int ndim, int num_classes, dt_dataset **out);
/* Any sample layout, produced by vt->get_sample (same ownership and thread
 * rules). `num_classes`: the range of class-id targets (>= 1). */
dt_status dt_dataset_create_with_layout(const dt_dataset_vtable *vt, void *impl,
                                        const dt_sample_layout *layout, int num_classes,
                                        dt_dataset **out);
/* A data set over samples held in memory: `inputs` holds n inputs one after
 * another, each of the layout's input dtype and shape (contiguous, so n x
 * numel(input_shape) x dt_dtype_size(input_dtype) bytes), `targets` n
 * targets likewise; any dtypes. Both are copied: the caller may free its
 * buffers when the call returns, and dt_dataset_destroy frees the copies.
 * `num_classes` as for dt_dataset_create_with_layout (the range of class-id
 * targets; the values are not checked here: the loss checks its targets).
 *
 *   float x[N][3]; int32_t y[N];                      // filled by the caller
 *   dt_sample_layout lay = {DT_DTYPE_F32, 1, {3}, DT_DTYPE_I32, 0, {0}};
 *   dt_dataset *d;
 *   DT_CHECK(dt_dataset_from_memory(&lay, x, y, N, 2, &d));
 *
 * For samples made on demand (a file format of your own, augmentation), give
 * callbacks instead: dt_dataset_create_with_layout with a vtable.
 * Errors: DT_ERR_INVALID_ARG (out, layout, inputs or targets NULL; n < 1; a
 * layout dt_dataset_create_with_layout refuses; sizes beyond memory),
 * DT_ERR_OOM. On failure *out is NULL. */
dt_status dt_dataset_from_memory(const dt_sample_layout *layout, const void *inputs,
                                 const void *targets, int64_t n, int num_classes, dt_dataset **out);
void dt_dataset_destroy(dt_dataset *d); /* NULL is a no-op */
int64_t dt_dataset_length(const dt_dataset *d);
const dt_sample_layout *dt_dataset_layout(const dt_dataset *d);
int dt_dataset_input_ndim(const dt_dataset *d);
const int64_t *dt_dataset_input_shape(const dt_dataset *d);
int64_t dt_dataset_input_numel(const dt_dataset *d);
int dt_dataset_num_classes(const dt_dataset *d);
/* f32 input and one i32 label: only for datasets of that layout
 * (DT_ERR_DTYPE otherwise). */
dt_status dt_dataset_get(const dt_dataset *d, int64_t i, float *input, int32_t *label);
/* Any layout: input and target buffers of the layout's sizes. */
dt_status dt_dataset_get_sample(const dt_dataset *d, int64_t i, void *input, void *target);
/* The same in epoch `epoch` (vt->get_sample_at; without it, the epoch
 * changes nothing). */
dt_status dt_dataset_get_sample_at(const dt_dataset *d, int64_t i, int64_t epoch, void *input,
                                   void *target);
/* The impl of a data set made with the vtable `vt`; NULL for another. */
void *dt_dataset_impl_of(const dt_dataset *d, const dt_dataset_vtable *vt);

/* An image classification set from an idx image file (N, H, W) and label
 * file (N): samples are (1, H, W) f32 in [0,1] normalised by (x-mean)/std
 * (mean 0, std 1 leaves them in [0,1]). Counts must agree; labels must be
 * < num_classes. */
dt_status dt_dataset_idx_images(const char *images_path, const char *labels_path, int num_classes,
                                float mean, float std, dt_dataset **out);

/* Standard files under `dir` (e.g. /usr/share/datasets/fashion-mnist), split
 * "train" or "test": train-images-idx3-ubyte.gz / train-labels-idx1-ubyte.gz
 * (or t10k-...), each tried with ".gz" first, then without. 10 classes.
 * Normalised with the training set's statistics of the set `name`:
 * "fashion-mnist" (0.2860, 0.3530) or "mnist" (0.1307, 0.3081); another
 * name is DT_ERR_INVALID_ARG. Missing files: DT_ERR_IO naming the directory
 * and file. */
dt_status dt_dataset_mnist_like(const char *dir, const char *name, const char *split,
                                dt_dataset **out);
/* The same files, with the number of classes and the normalisation given
 * (the task table, models/tasks.h, keeps them per data set). */
dt_status dt_dataset_mnist_files(const char *dir, const char *split, int num_classes, float mean,
                                 float std, dt_dataset **out);

/* ---- samplers ---- */
typedef struct dt_sampler_config {
  int shuffle;
  uint64_t seed;
  int num_replicas; /* distributed: world size (1 = not distributed) */
  int rank;
  int drop_last; /* distributed: drop the tail instead of padding */
} dt_sampler_config;
#define DT_SAMPLER_CONFIG_DEFAULT ((dt_sampler_config){1, 0, 1, 0, 0})

typedef struct dt_sampler dt_sampler;
dt_status dt_sampler_create(int64_t dataset_len, const dt_sampler_config *cfg, dt_sampler **out);
void dt_sampler_destroy(dt_sampler *s);
/* Recomputes the order for `epoch` (Fisher-Yates with a dt_generator seeded
 * seed + epoch, identical on all ranks). PyTorch DistributedSampler
 * semantics with R = num_replicas: if drop_last and len % R != 0,
 * num_samples = floor(len / R) and the list is truncated to num_samples*R;
 * else num_samples = ceil(len / R) and the list is padded by repeating it
 * from its start; rank r takes list[r : num_samples*R : R]. The create call
 * sets epoch 0. */
dt_status dt_sampler_set_epoch(dt_sampler *s, int64_t epoch);
int64_t dt_sampler_length(const dt_sampler *s); /* indices this rank sees per epoch */
const int64_t *dt_sampler_indices(const dt_sampler *s);

/* ---- loader ---- */
typedef struct dt_loader_config {
  int batch_size;
  int drop_last;    /* drop a final partial batch */
  int prefetch;     /* batches prepared ahead by the worker (>= 1) */
  dt_device device; /* where batches land */
  int workers;      /* threads filling batches, each a whole batch at a time (1 .. 64) */
} dt_loader_config;
#define DT_LOADER_CONFIG_DEFAULT ((dt_loader_config){64, 0, 2, {DT_DEVICE_CPU, 0}, 1})

typedef struct dt_loader dt_loader;
/* The loader borrows dataset and sampler (they must outlive it, and the
 * sampler must not be changed while an epoch runs). batch_size >= 1,
 * prefetch in [1, 64], workers in [1, 64]; the device must exist. Host
 * memory: max(prefetch, workers) batches of batch_size samples (inputs and
 * targets), page-locked where the device's backend offers it (CUDA). The
 * workers take batches in order, each filling a whole batch, and the
 * batches come out in order: the same batches for any number of workers
 * (samples come from dt_dataset_get_sample_at with the epoch). Destroying
 * mid-epoch stops the workers. */
dt_status dt_loader_create(const dt_dataset *d, dt_sampler *s, const dt_loader_config *cfg,
                           dt_loader **out);
void dt_loader_destroy(dt_loader *l);
/* Starts an epoch (calls dt_sampler_set_epoch); the worker threads begin
 * preparing batches. */
dt_status dt_loader_start_epoch(dt_loader *l, int64_t epoch);
/* The same, starting at batch `first_batch` of the epoch (0..batches): a
 * resumed run skips what it trained on before the checkpoint without
 * reading it. dt_loader_num_batches then counts the batches left. */
dt_status dt_loader_start_epoch_at(dt_loader *l, int64_t epoch, int64_t first_batch);
int64_t dt_loader_num_batches(const dt_loader *l);
/* Next batch: inputs (B, ...) and labels (B, ...) in the dataset's layout
 * (f32 images and (B) i32 labels for dt_dataset_create's sets) on the
 * device (new references); B < batch_size only for the last batch without
 * drop_last.
 * Returns DT_OK with *inputs NULL at the end of the epoch. DT_ERR_STATE
 * before the first dt_loader_start_epoch. A failure of dt_dataset_get in
 * the worker is returned here with its status and message (and again on
 * later calls, until the next epoch starts). */
dt_status dt_loader_next(dt_loader *l, dt_tensor **inputs, dt_tensor **labels);

#ifdef __cplusplus
}
#endif
#endif
