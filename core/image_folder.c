/* The ImageFolder data set (core/image.h): the listing of class folders,
 * and samples decoded, augmented and normalised on the loader's workers. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/image.h"
#include "core/rng.h"

#define PATH_CAP 4096
/* The flip's draw of a sample's key: after the crop's 22 (ten tries of two,
 * then the position; dt_image_random_resized_crop_box). */
#define FLIP_DRAW 22
/* PAD_CROP's shift draws: (key, 20) down, (key, 21) across. */
#define PAD_DRAW 20

enum { FILE_UNKNOWN = 0, FILE_GOOD, FILE_BAD };

typedef struct image_folder {
  dt_image_folder_config cfg;
  int augment;
  char **classes;
  int n_classes;
  char **paths; /* n files, class by class, sorted by name within each */
  int32_t *labels;
  int64_t n;
  _Atomic unsigned char *state; /* per file: FILE_* (skip_bad_images) */
  atomic_llong bad;             /* distinct bad files met */
} image_folder;

static void folder_destroy(void *impl) {
  image_folder *f = impl;
  if (!f)
    return;
  for (int c = 0; c < f->n_classes; c++)
    free(f->classes[c]);
  for (int64_t i = 0; i < f->n; i++)
    free(f->paths[i]);
  free(f->classes);
  free(f->paths);
  free(f->labels);
  free((void *)f->state);
  free(f);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_extension(const char *name, const char *const *exts) {
  const char *dot = strrchr(name, '.');
  for (int i = 0; dot && exts[i]; i++)
    if (strcasecmp(dot, exts[i]) == 0)
      return 1;
  return 0;
}

/* Read, and the other extensions of torchvision's IMG_EXTENSIONS, listed so
 * that they fail (or are skipped) as unsupported rather than vanish. */
static const char *const read_exts[] = {".png", ".jpg", ".jpeg", NULL};
static const char *const other_exts[] = {".bmp", ".gif",  ".pgm",  ".ppm",
                                         ".tif", ".tiff", ".webp", NULL};

/* The names in `dir` that are folders (want_dirs) or image files, sorted;
 * *n of them in a malloc'd array of malloc'd names. */
static dt_status list_dir(const char *dir, int want_dirs, char ***names, int64_t *n) {
  *names = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d)
    return DT_ERROR(DT_ERR_IO, "cannot read image folder %s: %s", dir, strerror(errno));
  int64_t cap = 0;
  dt_status st = DT_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[PATH_CAP];
    struct stat sb;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) {
      st = DT_ERROR(DT_ERR_INVALID_ARG, "path too long: %s/%s", dir, e->d_name);
      break;
    }
    if (stat(path, &sb) != 0)
      continue; /* a dangling link: not an image of the set */
    if (want_dirs ? !S_ISDIR(sb.st_mode)
                  : !S_ISREG(sb.st_mode) || !(has_extension(e->d_name, read_exts) ||
                                              has_extension(e->d_name, other_exts)))
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      char **grown = realloc(*names, (size_t)cap * sizeof *grown);
      if (!grown) {
        st = DT_ERROR(DT_ERR_OOM, "no memory listing %s", dir);
        break;
      }
      *names = grown;
    }
    if (((*names)[*n] = strdup(want_dirs ? e->d_name : path)) == NULL) {
      st = DT_ERROR(DT_ERR_OOM, "no memory listing %s", dir);
      break;
    }
    (*n)++;
  }
  closedir(d);
  if (st == DT_OK && *n > 1)
    qsort(*names, (size_t)*n, sizeof **names, cmp_names);
  if (st != DT_OK) { /* nothing half-listed reaches the caller */
    while (*n > 0)
      free((*names)[--*n]);
    free(*names);
    *names = NULL;
  }
  return st;
}

static dt_status append_class(image_folder *f, char **files, int64_t count, int32_t cls) {
  char **paths = realloc(f->paths, (size_t)(f->n + count) * sizeof *paths);
  if (paths)
    f->paths = paths;
  int32_t *labels = realloc(f->labels, (size_t)(f->n + count) * sizeof *labels);
  if (labels)
    f->labels = labels;
  if (!paths || !labels)
    return DT_ERROR(DT_ERR_OOM, "no memory for the list of %lld images", (long long)(f->n + count));
  for (int64_t k = 0; k < count; k++) {
    f->paths[f->n + k] = files[k];
    f->labels[f->n + k] = cls;
  }
  f->n += count;
  return DT_OK;
}

static dt_status list_folder(image_folder *f, const char *dir) {
  char **classes = NULL;
  int64_t n_classes = 0;
  DT_CHECK(list_dir(dir, 1, &classes, &n_classes));
  f->classes = classes;
  f->n_classes = (int)n_classes;
  if (n_classes == 0)
    return DT_ERROR(DT_ERR_FORMAT,
                    "image folder %s has no class folders (expected %s/<class>/<image>.png)", dir,
                    dir);
  for (int c = 0; c < f->n_classes; c++) {
    char path[PATH_CAP];
    char **files = NULL;
    int64_t count = 0;
    snprintf(path, sizeof path, "%s/%s", dir, classes[c]);
    dt_status st = list_dir(path, 0, &files, &count);
    int64_t readable = 0; /* the others (.gif, .bmp, ...) are listed to be refused */
    for (int64_t k = 0; st == DT_OK && k < count; k++)
      readable += has_extension(files[k], read_exts);
    if (st == DT_OK && readable == 0)
      st = DT_ERROR(DT_ERR_FORMAT,
                    "class folder %s holds no image (.png, .jpg or .jpeg; files of other image "
                    "formats: %lld): every class needs at least one; remove the folder or add "
                    "its images",
                    path, (long long)count);
    if (st == DT_OK)
      st = append_class(f, files, count, c);
    if (st != DT_OK) {
      for (int64_t k = 0; k < count; k++)
        free(files[k]);
    }
    free(files);
    DT_CHECK(st);
  }
  return DT_OK;
}

/* ---- samples ---- */

static dt_status decode_file(const image_folder *f, int64_t j, dt_image *img) {
  const char *path = f->paths[j];
  if (has_extension(path, other_exts))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "image %s: format %s is not supported (only PNG and JPEG are read)", path,
                    strrchr(path, '.'));
  return dt_image_read(path, f->cfg.channels, f->cfg.max_pixels, img);
}

/* The resize buffer of the calling loader worker, kept from sample to
 * sample and freed (free, the key's destructor) when the thread ends: a
 * fresh half-megabyte malloc per sample costs page faults. It holds a
 * sample and one row, (size + 1) x size x channels floats whatever the
 * image, so keeping the largest asked for costs nothing more. */
typedef struct worker_buf {
  size_t cap; /* floats in data */
  float data[];
} worker_buf;

static pthread_key_t worker_buf_key;
static pthread_once_t worker_buf_once = PTHREAD_ONCE_INIT;

static void worker_buf_key_create(void) { pthread_key_create(&worker_buf_key, free); }

/* n floats for the calling thread; NULL when there is no memory. */
static float *worker_floats(size_t n) {
  pthread_once(&worker_buf_once, worker_buf_key_create);
  worker_buf *b = pthread_getspecific(worker_buf_key);
  if (b && b->cap >= n)
    return b->data;
  worker_buf *grown = malloc(sizeof *grown + n * sizeof(float));
  if (!grown || pthread_setspecific(worker_buf_key, grown) != 0) {
    free(grown);
    return NULL; /* b stays registered, freed with the thread */
  }
  free(b);
  grown->cap = n;
  return grown->data;
}

/* File j's image, augmented with the draws of `key`, normalised into
 * input (channels, size, size). */
static dt_status load_sample(const image_folder *f, int64_t j, uint64_t key, float *input) {
  dt_image img;
  DT_CHECK(decode_file(f, j, &img));
  const int S = f->cfg.size, C = img.channels;
  const dt_image_augment recipe = f->cfg.recipe;
  const dt_image_box whole = {0, 0, img.height, img.width};
  /* src (a box of the image) is resized to rh x rw; the sample is its
   * S x S window `win`, shifted by (dy, dx) with zeros outside (PAD_CROP). */
  dt_image_box src = whole, win = {0, 0, S, S};
  int rh = S, rw = S, flip = 0, dy = 0, dx = 0;
  if (recipe == DT_IMAGE_AUGMENT_RESIZED_CROP && f->augment) {
    src = dt_image_random_resized_crop_box(img.height, img.width, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0,
                                           key);
  } else if (recipe == DT_IMAGE_AUGMENT_RESIZED_CROP &&
             !dt_image_eval_geometry(img.height, img.width, S, &rh, &rw, &win)) {
    dt_status st = DT_ERROR(DT_ERR_UNSUPPORTED,
                            "image %s is %dx%d: too extreme an aspect ratio for the evaluation's "
                            "resize (the shorter side to %d px makes the longer over 2^31 - 1)",
                            f->paths[j], img.width, img.height, (int)(S / 0.875));
    dt_image_free(&img);
    return st;
  } else if (recipe == DT_IMAGE_AUGMENT_PAD_CROP && f->augment) {
    int pad = (S + 4) / 8, span = 2 * pad + 1;
    dy = (int)(dt_rng_uniform(key, PAD_DRAW) * span) % span - pad;
    dx = (int)(dt_rng_uniform(key, PAD_DRAW + 1) * span) % span - pad;
  }
  if (f->augment && recipe != DT_IMAGE_AUGMENT_NONE)
    flip = dt_rng_uniform(key, FLIP_DRAW) < 0.5f;
  /* Only the window is resized (never the whole rh x rw: 73 x 4,781,500
   * for a 1 x 65500 image at size 64), from one box row at a time. */
  size_t row_n = (size_t)win.width * C, win_n = (size_t)win.height * row_n;
  float *scratch = worker_floats(row_n + win_n);
  if (!scratch || !dt_image_resize_window(&img, src, rh, rw, win, flip, scratch, scratch + row_n)) {
    dt_status st = DT_ERROR(DT_ERR_OOM, "no memory to resize image %s (%dx%d)", f->paths[j],
                            img.width, img.height);
    dt_image_free(&img);
    return st;
  }
  const float *hwc = scratch + row_n;
  for (int c = 0; c < C; c++) {
    float scale = 1.0f / (255.0f * f->cfg.std[c]), shift = f->cfg.mean[c] / f->cfg.std[c];
    float *plane = input + (size_t)c * S * S;
    for (int y = 0; y < S; y++)
      for (int x = 0; x < S; x++) {
        int wy = y + dy, wx = x + dx;
        float v = wy >= 0 && wy < win.height && wx >= 0 && wx < win.width
                      ? hwc[((size_t)wy * win.width + wx) * C + c]
                      : 0.0f;
        plane[y * S + x] = v * scale - shift;
      }
  }
  dt_image_free(&img);
  return DT_OK;
}

/* Counts file j bad the first time it fails. */
static void mark_bad(image_folder *f, int64_t j) {
  unsigned char was = atomic_exchange(&f->state[j], FILE_BAD);
  if (was != FILE_BAD)
    atomic_fetch_add(&f->bad, 1);
}

static dt_status folder_get_at(void *impl, int64_t i, int64_t epoch, void *input, void *target) {
  image_folder *f = impl;
  uint64_t key = dt_rng_bits(dt_rng_bits(f->cfg.seed, (uint64_t)epoch), (uint64_t)i);
  for (int64_t k = 0; k < f->n; k++) {
    int64_t j = (i + k) % f->n;
    if (f->cfg.skip_bad_images && atomic_load(&f->state[j]) == FILE_BAD)
      continue;
    dt_status st = load_sample(f, j, key, input);
    if (st == DT_OK) {
      *(int32_t *)target = f->labels[j];
      return DT_OK;
    }
    if (!f->cfg.skip_bad_images || st == DT_ERR_OOM)
      return st;
    mark_bad(f, j);
  }
  return DT_ERROR(DT_ERR_FORMAT, "every image of the folder is bad (the first: %s)", f->paths[0]);
}

static dt_status folder_get(void *impl, int64_t i, void *input, void *target) {
  return folder_get_at(impl, i, 0, input, target);
}

static int64_t folder_length(void *impl) { return ((image_folder *)impl)->n; }

static const dt_dataset_vtable folder_vtable = {folder_length, NULL, folder_destroy, folder_get,
                                                folder_get_at};

static dt_status check_config(const dt_image_folder_config *c) {
  if (c->channels != 1 && c->channels != 3)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`channels` %d: expected 1 (grey) or 3 (RGB)", c->channels);
  if (c->size < 1 || c->size > 4096)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`image_size` %d: expected 1 to 4096 pixels", c->size);
  for (int k = 0; k < c->channels; k++)
    if (!(c->std[k] > 0.0f))
      return DT_ERROR(DT_ERR_INVALID_ARG, "`image_std` of channel %d is %g: must be > 0", k,
                      (double)c->std[k]);
  if ((unsigned)c->recipe > DT_IMAGE_AUGMENT_NONE)
    return DT_ERROR(DT_ERR_INVALID_ARG, "augmentation recipe %d: unknown", (int)c->recipe);
  if (c->max_pixels < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`max_pixels` %lld: must be >= 0 (0 = PIL's limit)",
                    (long long)c->max_pixels);
  return DT_OK;
}

dt_status dt_dataset_image_folder(const char *root, const char *split,
                                  const dt_image_folder_config *cfg, dt_dataset **out) {
  DT_CHECK_OUT(out);
  if (!root || !split)
    return DT_ERROR(DT_ERR_INVALID_ARG, "image folder root and split must not be NULL");
  dt_image_folder_config c = cfg ? *cfg : DT_IMAGE_FOLDER_CONFIG_DEFAULT;
  DT_CHECK(check_config(&c));
  char dir[PATH_CAP];
  if ((size_t)snprintf(dir, sizeof dir, "%s/%s", root, split) >= sizeof dir)
    return DT_ERROR(DT_ERR_INVALID_ARG, "image folder path too long: %s/%s", root, split);
  image_folder *f = calloc(1, sizeof *f);
  if (!f)
    return DT_ERROR(DT_ERR_OOM, "no memory for image folder %s", dir);
  f->cfg = c;
  f->augment = c.augment >= 0 ? c.augment : strcmp(split, "train") == 0;
  atomic_init(&f->bad, 0);
  dt_status st = list_folder(f, dir);
  if (st == DT_OK && (f->state = calloc((size_t)f->n, 1)) == NULL)
    st = DT_ERROR(DT_ERR_OOM, "no memory for image folder %s", dir);
  if (st != DT_OK) {
    folder_destroy(f);
    return st;
  }
  dt_sample_layout lay = {DT_DTYPE_F32, 3, {c.channels, c.size, c.size}, DT_DTYPE_I32, 0, {0}};
  return dt_dataset_create_with_layout(&folder_vtable, f, &lay, f->n_classes, out);
}

const char *dt_image_folder_class_name(const dt_dataset *d, int cls) {
  image_folder *f = dt_dataset_impl_of(d, &folder_vtable);
  return f && cls >= 0 && cls < f->n_classes ? f->classes[cls] : NULL;
}

int64_t dt_image_folder_bad_count(const dt_dataset *d) {
  image_folder *f = dt_dataset_impl_of(d, &folder_vtable);
  return f ? (int64_t)atomic_load(&f->bad) : 0;
}

int64_t dt_image_folder_bad_mask(const dt_dataset *d, float *mask, int64_t n) {
  image_folder *f = dt_dataset_impl_of(d, &folder_vtable);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    mask[i] = f && i < f->n && atomic_load(&f->state[i]) == FILE_BAD ? 1.0f : 0.0f;
    bad += mask[i] > 0.0f;
  }
  return bad;
}

const char *dt_image_folder_file(const dt_dataset *d, int64_t i) {
  image_folder *f = dt_dataset_impl_of(d, &folder_vtable);
  return f && i >= 0 && i < f->n ? f->paths[i] : NULL;
}
