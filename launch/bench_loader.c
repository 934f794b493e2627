/* `dtrain bench --loader --data DIR --workers N`: images per second of the
 * image-folder loader (decode, augmentation, normalisation, batching), no
 * model (launch/bench.h). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"
#include "core/data.h"
#include "core/image.h"
#include "launch/bench.h"
#include "launch/cli.h"
#include "launch/flags.h"

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct loader_bench {
  const char *data, *split;
  dt_image_folder_config image;
  int batch, batches, warmup, workers;
  double images_per_s, seconds;
  int64_t images;
} loader_bench;

/* warmup untimed batches, then `batches` timed ones, the epochs running on
 * (each epoch reshuffled) when the split is shorter. */
static dt_status bench_loader_run(loader_bench *b) {
  dt_dataset *d = NULL;
  dt_sampler *s = NULL;
  dt_loader *l = NULL;
  dt_tensor *x = NULL, *y = NULL;
  DT_CHECK(dt_dataset_image_folder(b->data, b->split, &b->image, &d));
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = b->batch;
  lc.workers = b->workers;
  lc.drop_last = 1;
  dt_status st = dt_sampler_create(dt_dataset_length(d), &sc, &s);
  if (st == DT_OK)
    st = dt_loader_create(d, s, &lc, &l);
  if (st == DT_OK && dt_loader_num_batches(l) < 1)
    st = DT_ERROR(DT_ERR_INVALID_ARG, "%s/%s holds %lld images, less than one batch of %d", b->data,
                  b->split, (long long)dt_dataset_length(d), b->batch);
  int64_t epoch = 0, taken = 0;
  double t0 = 0.0;
  if (st == DT_OK)
    st = dt_loader_start_epoch(l, epoch);
  while (st == DT_OK && taken < b->warmup + b->batches) {
    if (taken == b->warmup)
      t0 = seconds_now();
    st = dt_loader_next(l, &x, &y);
    if (st == DT_OK && !x) {
      st = dt_loader_start_epoch(l, ++epoch);
      continue;
    }
    if (st == DT_OK && taken >= b->warmup)
      b->images += dt_tensor_dim(x, 0);
    taken++;
    dt_tensor_release(x);
    dt_tensor_release(y);
    x = y = NULL;
  }
  b->seconds = seconds_now() - t0;
  b->images_per_s = b->seconds > 0 ? (double)b->images / b->seconds : 0.0;
  dt_loader_destroy(l);
  dt_sampler_destroy(s);
  dt_dataset_destroy(d);
  return st;
}

bool dt_cli_bench_wants_loader(int argc, char **argv) {
  for (int i = 0; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "--loader") || !strncmp(argv[i], "--loader=", 9))
      return true;
  return false;
}

int dt_cli_bench_loader(int argc, char **argv, FILE *err) {
  loader_bench b = {.split = "train", .batch = 64, .batches = 50, .warmup = 2, .workers = 1};
  b.image = DT_IMAGE_FOLDER_CONFIG_DEFAULT;
  bool loader = true, eval = false;
  int threads = 1;
  dt_flag flags[] = {
      DT_BOOL_FLAG("loader", &loader, "time the image-folder loader (no model)"),
      DT_STRING_FLAG("data", &b.data, "DIR", "the image folder (DIR/train/<class>/...)"),
      DT_INT_FLAG("workers", &b.workers, "N", "loader threads", .min = 1, .max = 64),
      DT_INT_FLAG("batch", &b.batch, "N", "images per batch", .min = 1),
      DT_INT_FLAG("batches", &b.batches, "N", "timed batches", .min = 1),
      DT_INT_FLAG("warmup", &b.warmup, "N", "untimed batches first", .min = 0),
      DT_INT_FLAG("image-size", &b.image.size, "PX", "the samples' height and width", .min = 1,
                  .max = 4096),
      DT_INT_FLAG("channels", &b.image.channels, "C", "1 (grey) or 3 (RGB)", .min = 1, .max = 3),
      DT_BOOL_FLAG("eval", &eval,
                   "the evaluation's transform (resize, centre crop) on val/ instead of "
                   "training's (RandomResizedCrop, flip) on train/"),
      DT_INT_FLAG("threads", &threads, "N", "CPU threads of the main thread's copies", .min = 1),
  };
  dt_flag_set set = {
      .command = "bench",
      .usage = "bench --loader --data DIR [--workers N] [--batch N] [--image-size PX]",
      .about =
          "Times the image-folder loader alone: decoding (libjpeg-turbo, libpng),\n"
          "augmentation, normalisation into batches by --workers threads, as train\n"
          "reads --data DIR; prints\n"
          "  loader: images_per_s=... workers=N batch=B size=S channels=C images=...",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  if (!b.data) {
    fprintf(err, "dtrain bench: --loader needs --data DIR (an image folder)\n");
    return 2;
  }
  if (eval)
    b.split = "val";
  dt_cpu_set_num_threads(threads);
  if (bench_loader_run(&b) != DT_OK) {
    dt_cli_print_error(err, NULL);
    return 1;
  }
  printf(
      "loader: images_per_s=%.1f workers=%d batch=%d size=%d channels=%d images=%lld "
      "seconds=%.3f split=%s\n",
      b.images_per_s, b.workers, b.batch, b.image.size, b.image.channels, (long long)b.images,
      b.seconds, b.split);
  return 0;
}
