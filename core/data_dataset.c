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
  dt_sample_layout layout;
  int64_t numel; /* of one input */
  int num_classes;
};

/* Checks one sample tensor's shape (ndim in [min_ndim, DT_MAX_DIMS-1]);
 * sets *numel. */
static dt_status check_sample_shape(const char *what, const int64_t *shape, int ndim, int min_ndim,
                                    int64_t *numel) {
  /* The loader prepends the batch dimension, so one dim is kept free. */
  if (ndim < min_ndim || ndim > DT_MAX_DIMS - 1 || (ndim > 0 && !shape))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s ndim %d: must be %d to %d (one dim is kept for the "
                    "batch)",
                    what, ndim, min_ndim, DT_MAX_DIMS - 1);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 1 || shape[i] > (INT64_C(1) << 31))
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s dim %d is %lld: must be in [1, 2^31]", what, i,
                      (long long)shape[i]);
    n *= shape[i];
    if (n > (INT64_C(1) << 40))
      return DT_ERROR(DT_ERR_INVALID_ARG, "one sample would hold %lld+ elements: too large",
                      (long long)n);
  }
  *numel = n;
  return DT_OK;
}

dt_status dt_dataset_create_with_layout(const dt_dataset_vtable *vt, void *impl,
                                        const dt_sample_layout *layout, int num_classes,
                                        dt_dataset **out) {
  dt_status st = DT_OK;
  int64_t numel = 0, target_numel = 0;
  if (!out) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
    goto fail;
  }
  *out = NULL;
  if (!vt || !vt->length || !(vt->get || vt->get_sample) || !layout) {
    st = DT_ERROR(DT_ERR_INVALID_ARG,
                  "dataset vtable or layout is NULL, or the vtable lacks length/get_sample");
    goto fail;
  }
  DT_CHECK_GOTO(check_sample_shape("input", layout->input_shape, layout->input_ndim, 1, &numel), st,
                fail);
  DT_CHECK_GOTO(
      check_sample_shape("target", layout->target_shape, layout->target_ndim, 0, &target_numel), st,
      fail);
  if (dt_dtype_size(layout->input_dtype) == 0 || dt_dtype_size(layout->target_dtype) == 0) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "unknown input or target dtype (%d, %d)",
                  (int)layout->input_dtype, (int)layout->target_dtype);
    goto fail;
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
  d->layout = *layout;
  d->numel = numel;
  d->num_classes = num_classes;
  *out = d;
  return DT_OK;
fail:
  if (vt && vt->destroy && impl)
    vt->destroy(impl);
  return st;
}

dt_status dt_dataset_create(const dt_dataset_vtable *vt, void *impl, const int64_t *input_shape,
                            int ndim, int num_classes, dt_dataset **out) {
  /* An impossible ndim (or a NULL shape, as ndim 0) is left to the check. */
  int ok_shape = input_shape && ndim >= 1 && ndim <= DT_MAX_DIMS - 1;
  dt_sample_layout layout = {DT_DTYPE_F32, input_shape ? ndim : 0, {0}, DT_DTYPE_I32, 0, {0}};
  if (ok_shape)
    memcpy(layout.input_shape, input_shape, (size_t)ndim * sizeof *input_shape);
  if (vt && !vt->get) {
    if (vt->destroy && impl)
      vt->destroy(impl);
    return DT_ERROR(DT_ERR_INVALID_ARG, "dataset vtable lacks get");
  }
  return dt_dataset_create_with_layout(vt, impl, &layout, num_classes, out);
}

void dt_dataset_destroy(dt_dataset *d) {
  if (!d)
    return;
  if (d->vt->destroy)
    d->vt->destroy(d->impl);
  free(d);
}

int64_t dt_dataset_length(const dt_dataset *d) { return d->vt->length(d->impl); }
const dt_sample_layout *dt_dataset_layout(const dt_dataset *d) { return &d->layout; }
int dt_dataset_input_ndim(const dt_dataset *d) { return d->layout.input_ndim; }
const int64_t *dt_dataset_input_shape(const dt_dataset *d) { return d->layout.input_shape; }
int64_t dt_dataset_input_numel(const dt_dataset *d) { return d->numel; }
int dt_dataset_num_classes(const dt_dataset *d) { return d->num_classes; }

dt_status dt_dataset_get_sample(const dt_dataset *d, int64_t i, void *input, void *target) {
  return dt_dataset_get_sample_at(d, i, 0, input, target);
}

void *dt_dataset_impl_of(const dt_dataset *d, const dt_dataset_vtable *vt) {
  return d && d->vt == vt ? d->impl : NULL;
}

dt_status dt_dataset_get_sample_at(const dt_dataset *d, int64_t i, int64_t epoch, void *input,
                                   void *target) {
  if (!d || !input || !target)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dataset, input and target must not be NULL");
  int64_t n = d->vt->length(d->impl);
  if (i < 0 || i >= n)
    return DT_ERROR(DT_ERR_INVALID_ARG, "sample index %lld out of range for a dataset of %lld",
                    (long long)i, (long long)n);
  if (d->vt->get_sample_at)
    return d->vt->get_sample_at(d->impl, i, epoch, input, target);
  if (d->vt->get_sample)
    return d->vt->get_sample(d->impl, i, input, target);
  return d->vt->get(d->impl, i, input, target);
}

dt_status dt_dataset_get(const dt_dataset *d, int64_t i, float *input, int32_t *label) {
  if (d && (d->layout.input_dtype != DT_DTYPE_F32 || d->layout.target_dtype != DT_DTYPE_I32 ||
            d->layout.target_ndim != 0))
    return DT_ERROR(DT_ERR_DTYPE,
                    "dt_dataset_get reads f32 inputs and one i32 label; this dataset's samples "
                    "are %s and %s with %d target dims: use dt_dataset_get_sample",
                    dt_dtype_name(d->layout.input_dtype), dt_dtype_name(d->layout.target_dtype),
                    d->layout.target_ndim);
  return dt_dataset_get_sample(d, i, input, label);
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
  DT_CHECK_OUT(out);
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

/* 1: path is a file to read; 0: nothing there (ENOENT); -1: something is
 * there that cannot be the file (a directory, a symlink loop, no
 * permission to look): *why gets the reason. */
static int idx_candidate(const char *path, const char **why) {
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (!S_ISDIR(sb.st_mode))
      return 1;
    *why = "is a directory, not an IDX file";
    return -1;
  }
  int e = errno;
  if (e == ENOENT && lstat(path, &sb) != 0)
    return 0;
  *why = e == ENOENT ? "is a dangling symbolic link" : strerror(e);
  return -1;
}

/* "<dir>/<stem>.gz" if present, else "<dir>/<stem>". */
static dt_status find_idx_file(const char *dir, const char *stem, char *buf, size_t cap) {
  static const char *const suffixes[] = {".gz", ""};
  for (int i = 0; i < 2; i++) {
    int n = snprintf(buf, cap, "%s/%s%s", dir, stem, suffixes[i]);
    if (n < 0 || (size_t)n >= cap)
      return DT_ERROR(DT_ERR_INVALID_ARG, "path too long: %s/%s%s", dir, stem, suffixes[i]);
    const char *why = NULL;
    int found = idx_candidate(buf, &why);
    if (found > 0)
      return DT_OK;
    if (found < 0)
      return DT_ERROR(DT_ERR_IO, "%s: %s", buf, why);
  }
  return DT_ERROR(DT_ERR_IO,
                  "%s: neither %s.gz nor %s found in this directory: %s (for Fashion-MNIST "
                  "install the Debian package dataset-fashion-mnist, see tools/setup.sh)",
                  dir, stem, stem, strerror(ENOENT));
}

dt_status dt_dataset_mnist_files(const char *dir, const char *split, int num_classes, float mean,
                                 float std, dt_dataset **out) {
  DT_CHECK_OUT(out);
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

dt_status dt_dataset_mnist_like(const char *dir, const char *name, const char *split,
                                dt_dataset **out) {
  DT_CHECK_OUT(out);
  if (!name)
    return DT_ERROR(DT_ERR_INVALID_ARG, "name must not be NULL");
  /* Per-pixel statistics of the training sets (torchvision examples), by
   * the data set's name, never by the folder it happens to sit in. */
  if (strcmp(name, "mnist") == 0)
    return dt_dataset_mnist_files(dir, split, 10, 0.1307f, 0.3081f, out);
  if (strcmp(name, "fashion-mnist") == 0)
    return dt_dataset_mnist_files(dir, split, 10, 0.2860f, 0.3530f, out);
  return DT_ERROR(DT_ERR_INVALID_ARG,
                  "data set \"%s\": an MNIST-format set is \"mnist\" or \"fashion-mnist\"", name);
}
