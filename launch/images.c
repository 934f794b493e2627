/* `dtrain images --from fashion-mnist|mnist --out DIR [--format png|jpeg]`:
 * an idx data set written out as an image folder (core/image.h). */
#include "launch/images.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/data.h"
#include "core/env.h"
#include "core/image.h"
#include "launch/cli.h"
#include "launch/flags.h"

/* Class folder names: sorted bytewise they keep the label order. */
static const char *const fashion_classes[10] = {
    "0_tshirt_top", "1_trouser", "2_pullover", "3_dress", "4_coat",
    "5_sandal",     "6_shirt",   "7_sneaker",  "8_bag",   "9_ankle_boot"};
static const char *const digit_classes[10] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};

static dt_status make_dir(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0)
    return S_ISDIR(sb.st_mode) ? DT_OK : DT_ERROR(DT_ERR_IO, "%s exists and is not a folder", path);
  if (mkdir(path, 0777) != 0 && errno != EEXIST)
    return DT_ERROR(DT_ERR_IO, "cannot create folder %s: %s", path, strerror(errno));
  return DT_OK;
}

/* dir/<prefix>-<kind>-idx<n>-ubyte(.gz): the gzip'd file first. */
static dt_status read_idx(const char *dir, const char *prefix, const char *kind, int ndim,
                          dt_idx *out) {
  char path[4096];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s-%s-idx%d-ubyte.gz", dir, prefix, kind, ndim);
  if (stat(path, &sb) != 0)
    snprintf(path, sizeof path, "%s/%s-%s-idx%d-ubyte", dir, prefix, kind, ndim);
  if (stat(path, &sb) != 0)
    return DT_ERROR(DT_ERR_IO,
                    "%s/%s-%s-idx%d-ubyte(.gz) not found: run tools/setup.sh, or give --data-dir",
                    dir, prefix, kind, ndim);
  return dt_idx_read(path, ndim, out);
}

typedef struct images_job {
  const char *out;
  const char *const *classes;
  bool jpeg;
  int quality;
  int per_class; /* 0 = all */
  int64_t written, kept;
} images_job;

/* One split: out/<split>/<class>/<index>.<ext>, files that exist kept (each
 * was renamed into place whole). */
static dt_status write_split(images_job *job, const char *dir, const char *prefix,
                             const char *split) {
  dt_idx images = {0}, labels = {0};
  char path[4096];
  dt_status st = read_idx(dir, prefix, "images", 3, &images);
  if (st == DT_OK)
    st = read_idx(dir, prefix, "labels", 1, &labels);
  if (st == DT_OK && labels.dims[0] != images.dims[0])
    st = DT_ERROR(DT_ERR_FORMAT, "%s: %lld images but %lld labels", dir, (long long)images.dims[0],
                  (long long)labels.dims[0]);
  snprintf(path, sizeof path, "%s/%s", job->out, split);
  if (st == DT_OK)
    st = make_dir(path);
  for (int c = 0; st == DT_OK && c < 10; c++) {
    snprintf(path, sizeof path, "%s/%s/%s", job->out, split, job->classes[c]);
    st = make_dir(path);
  }
  int64_t per_class[10] = {0};
  const int64_t h = images.dims[1], w = images.dims[2];
  for (int64_t i = 0; st == DT_OK && i < images.dims[0]; i++) {
    int cls = labels.data[i];
    if (cls > 9) {
      st = DT_ERROR(DT_ERR_FORMAT, "%s: label %d of image %lld is not a class 0-9", dir, cls,
                    (long long)i);
      break;
    }
    if (job->per_class > 0 && per_class[cls] >= job->per_class)
      continue;
    per_class[cls]++;
    snprintf(path, sizeof path, "%s/%s/%s/%05lld.%s", job->out, split, job->classes[cls],
             (long long)i, job->jpeg ? "jpg" : "png");
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
      job->kept++;
      continue;
    }
    dt_image img = {(int)h, (int)w, 1, images.data + i * h * w};
    st = job->jpeg ? dt_image_write_jpeg(path, &img, job->quality) : dt_image_write_png(path, &img);
    job->written += st == DT_OK;
  }
  dt_idx_free(&images);
  dt_idx_free(&labels);
  return st;
}

int dt_cli_images(int argc, char **argv, FILE *err) {
  const char *from = NULL, *out = NULL, *format = "png";
  const char *data_dir = "data";
  if (dt_env_string(DT_ENV_DATA_DIR, &data_dir) != DT_OK) {
    dt_cli_print_error(err, NULL);
    return 1;
  }
  images_job job = {.quality = 95};
  dt_flag flags[] = {
      DT_CHOICE_FLAG("from", &from, "NAME", "the idx data set (a folder of --data-dir)",
                     "fashion-mnist|mnist"),
      DT_STRING_FLAG("out", &out, "DIR", "the image folder to write (created if missing)"),
      DT_CHOICE_FLAG("format", &format, "FMT", "image file format", "png|jpeg"),
      DT_INT_FLAG("quality", &job.quality, "Q", "JPEG quality", .min = 1, .max = 100),
      DT_INT_FLAG("per-class", &job.per_class, "N",
                  "only the first N images of each class in each split, 0 = all", .min = 0),
      dt_cli_flag_data_dir(&data_dir),
  };
  dt_flag_set set = {
      .command = "images",
      .usage = "images --from fashion-mnist|mnist --out DIR [--format png|jpeg]",
      .about =
          "Writes an idx data set out as an image folder (torchvision's ImageFolder):\n"
          "DIR/train/<class>/<n>.png from the training split and DIR/val/<class>/<n>.png\n"
          "from the test split, n the image's index in its split, classes named\n"
          "0_<name> .. 9_<name> so that their sorted order is the label order. Each file\n"
          "is written under a temporary name and renamed into place; files already there\n"
          "are kept, so a second run (or one after an interruption) finishes the tree.\n"
          "dtrain train --data DIR reads the folder.",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  if (!from || !out) {
    fprintf(err,
            "dtrain images: give --from fashion-mnist|mnist and --out DIR (see dtrain images "
            "--help)\n");
    return 2;
  }
  job.out = out;
  job.jpeg = !strcmp(format, "jpeg");
  job.classes = !strcmp(from, "mnist") ? digit_classes : fashion_classes;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", data_dir, from);
  dt_status st = make_dir(out);
  if (st == DT_OK)
    st = write_split(&job, dir, "train", "train");
  if (st == DT_OK)
    st = write_split(&job, dir, "t10k", "val");
  if (st != DT_OK) {
    dt_cli_print_error(err, NULL);
    return 1;
  }
  printf("images: %s: %lld written, %lld already there (%s, from %s)\n", out,
         (long long)job.written, (long long)job.kept, format, dir);
  return 0;
}
