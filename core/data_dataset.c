/* Data sets: the generic vtable wrapper and idx image classification sets
 * (MNIST, Fashion-MNIST). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/data.h"

struct dt_dataset {
  const dt_dataset_vtable *vt;
  void *impl;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t numel;
  int num_classes;
};

dt_status dt_dataset_create(const dt_dataset_vtable *vt, void *impl, const int64_t *input_shape,
                            int ndim, int num_classes, dt_dataset **out) {
  dt_status st = DT_OK;
  if (!out) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
    goto fail;
  }
  *out = NULL;
  if (!vt || !vt->length || !vt->get) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "dataset vtable is NULL or lacks length/get");
    goto fail;
  }
  /* The loader prepends the batch dimension, so one dim is kept free. */
  if (ndim < 1 || ndim > DT_MAX_DIMS - 1 || !input_shape) {
    st = DT_ERROR(DT_ERR_INVALID_ARG,
                  "input ndim %d: must be 1 to %d (one dim is kept for the "
                  "batch)",
                  ndim, DT_MAX_DIMS - 1);
    goto fail;
  }
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (input_shape[i] < 1 || input_shape[i] > (INT64_C(1) << 31)) {
      st = DT_ERROR(DT_ERR_INVALID_ARG, "input dim %d is %lld: must be in [1, 2^31]", i,
                    (long long)input_shape[i]);
      goto fail;
    }
    numel *= input_shape[i];
    if (numel > (INT64_C(1) << 40)) {
      st = DT_ERROR(DT_ERR_INVALID_ARG, "one sample would hold %lld+ elements: too large",
                    (long long)numel);
      goto fail;
    }
  }
  if (num_classes < 1) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "num_classes %d: must be >= 1", num_classes);
    goto fail;
  }
  dt_dataset *d = calloc(1, sizeof *d);
  if (!d) {
    st = DT_ERROR(DT_ERR_OOM, "cannot allocate a dataset");
    goto fail;
  }
  d->vt = vt;
  d->impl = impl;
  d->ndim = ndim;
  memcpy(d->shape, input_shape, (size_t)ndim * sizeof *input_shape);
  d->numel = numel;
  d->num_classes = num_classes;
  *out = d;
  return DT_OK;
fail:
  if (vt && vt->destroy && impl)
    vt->destroy(impl);
  return st;
}

void dt_dataset_destroy(dt_dataset *d) {
  if (!d)
    return;
  if (d->vt->destroy)
    d->vt->destroy(d->impl);
  free(d);
}

int64_t dt_dataset_length(const dt_dataset *d) { return d->vt->length(d->impl); }
int dt_dataset_input_ndim(const dt_dataset *d) { return d->ndim; }
const int64_t *dt_dataset_input_shape(const dt_dataset *d) { return d->shape; }
int64_t dt_dataset_input_numel(const dt_dataset *d) { return d->numel; }
int dt_dataset_num_classes(const dt_dataset *d) { return d->num_classes; }

dt_status dt_dataset_get(const dt_dataset *d, int64_t i, float *input, int32_t *label) {
  if (!d || !input || !label)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dataset, input and label must not be NULL");
  int64_t n = d->vt->length(d->impl);
  if (i < 0 || i >= n)
    return DT_ERROR(DT_ERR_INVALID_ARG, "sample index %lld out of range for a dataset of %lld",
                    (long long)i, (long long)n);
  return d->vt->get(d->impl, i, input, label);
}

/* ---- idx image classification ---- */

typedef struct idx_images {
  dt_idx images;  /* (N, H, W) u8 */
  dt_idx labels;  /* (N) u8 */
  int64_t pixels; /* H * W */
  float lut[256]; /* (v/255 - mean) / std */
} idx_images;

static int64_t idx_images_length(void *impl) { return ((idx_images *)impl)->images.dims[0]; }

static dt_status idx_images_get(void *impl, int64_t i, float *input, int32_t *label) {
  idx_images *s = impl;
  const uint8_t *px = s->images.data + i * s->pixels;
  for (int64_t j = 0; j < s->pixels; j++)
    input[j] = s->lut[px[j]];
  *label = s->labels.data[i];
  return DT_OK;
}

static void idx_images_destroy(void *impl) {
  idx_images *s = impl;
  dt_idx_free(&s->images);
  dt_idx_free(&s->labels);
  free(s);
}

static const dt_dataset_vtable idx_images_vtable = {
    idx_images_length,
    idx_images_get,
    idx_images_destroy,
};

dt_status dt_dataset_idx_images(const char *images_path, const char *labels_path, int num_classes,
                                float mean, float std, dt_dataset **out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!images_path || !labels_path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "images_path and labels_path must not be NULL");
  if (num_classes < 1 || num_classes > 256)
    return DT_ERROR(DT_ERR_INVALID_ARG, "num_classes %d: must be in [1, 256] for u8 labels",
                    num_classes);
  if (!(std > 0.0f) || mean != mean)
    return DT_ERROR(DT_ERR_INVALID_ARG, "normalisation mean %g, std %g: std must be > 0",
                    (double)mean, (double)std);

  idx_images *s = calloc(1, sizeof *s);
  if (!s)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate the dataset");
  dt_status st = DT_OK;
  /* Labels first: small, and a wrong path shows up before the big read. */
  DT_CHECK_GOTO(dt_idx_read(labels_path, 1, &s->labels), st, fail);
  DT_CHECK_GOTO(dt_idx_read(images_path, 3, &s->images), st, fail);
  if (s->images.dims[0] != s->labels.dims[0]) {
    st = DT_ERROR(DT_ERR_FORMAT,
                  "mismatched counts: %s holds %lld images but %s holds %lld labels: the "
                  "files belong to different splits",
                  images_path, (long long)s->images.dims[0], labels_path,
                  (long long)s->labels.dims[0]);
    goto fail;
  }
  for (int64_t i = 0; i < s->labels.numel; i++) {
    if (s->labels.data[i] >= num_classes) {
      st = DT_ERROR(DT_ERR_FORMAT, "%s: label %d at index %lld is out of range for %d classes",
                    labels_path, s->labels.data[i], (long long)i, num_classes);
      goto fail;
    }
  }
  s->pixels = s->images.dims[1] * s->images.dims[2];
  for (int v = 0; v < 256; v++)
    s->lut[v] = ((float)v / 255.0f - mean) / std;

  int64_t shape[3] = {1, s->images.dims[1], s->images.dims[2]};
  return dt_dataset_create(&idx_images_vtable, s, shape, 3, num_classes, out);
fail:
  idx_images_destroy(s);
  return st;
}

/* ---- standard MNIST-format directories ---- */

static int file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

/* "<dir>/<stem>.gz" if present, else "<dir>/<stem>". */
static dt_status find_idx_file(const char *dir, const char *stem, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s/%s.gz", dir, stem);
  if (n < 0 || (size_t)n >= cap)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path too long: %s/%s.gz", dir, stem);
  if (file_exists(buf))
    return DT_OK;
  snprintf(buf, cap, "%s/%s", dir, stem);
  if (file_exists(buf))
    return DT_OK;
  return DT_ERROR(DT_ERR_IO,
                  "%s: neither %s.gz nor %s found in this directory: %s (for Fashion-MNIST "
                  "install the Debian package dataset-fashion-mnist, see tools/setup.sh)",
                  dir, stem, stem, strerror(ENOENT));
}

dt_status dt_dataset_mnist_files(const char *dir, const char *split, int num_classes, float mean,
                                 float std, dt_dataset **out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!dir || !split)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dir and split must not be NULL");
  const char *prefix;
  if (strcmp(split, "train") == 0)
    prefix = "train";
  else if (strcmp(split, "test") == 0)
    prefix = "t10k";
  else
    return DT_ERROR(DT_ERR_INVALID_ARG, "split \"%s\": expected \"train\" or \"test\"", split);

  char stem[64], images[4096], labels[4096];
  snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", prefix);
  DT_CHECK(find_idx_file(dir, stem, images, sizeof images));
  snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", prefix);
  DT_CHECK(find_idx_file(dir, stem, labels, sizeof labels));
  return dt_dataset_idx_images(images, labels, num_classes, mean, std, out);
}

dt_status dt_dataset_mnist_like(const char *dir, const char *split, dt_dataset **out) {
  /* Per-pixel statistics of the training sets (torchvision examples); a
   * path naming "fashion" selects Fashion-MNIST's. */
  int fashion = dir != NULL && strstr(dir, "fashion") != NULL;
  return dt_dataset_mnist_files(dir, split, 10, fashion ? 0.2860f : 0.1307f,
                                fashion ? 0.3530f : 0.3081f, out);
}
