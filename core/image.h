/* Images: PNG (libpng) and JPEG (libjpeg-turbo) files, the ImageFolder
 * data set (torchvision's layout) and its augmentation.
 *
 *   dt_image_folder_config cfg = DT_IMAGE_FOLDER_CONFIG_DEFAULT;
 *   cfg.channels = 1;                       // grey sets; 3 (RGB) by default
 *   cfg.size = 28;                          // the samples' height and width
 *   dt_dataset *train;
 *   DT_CHECK(dt_dataset_image_folder("pics", "train", &cfg, &train));
 *
 * A folder holds one subfolder per class, split by split: pics/train/<class>/
 * and pics/val/<class>/. Classes are the subfolders' names sorted bytewise
 * (torchvision sorts them so: class i is the i-th); the files of a class are
 * sorted by name; only .png, .jpg and .jpeg (any case) are read, other files
 * are ignored, except the other image extensions torchvision reads (.bmp,
 * .gif, .pgm, .ppm, .tif, .tiff, .webp), which are refused as unsupported.
 * The content decides the decoder (a PNG named .jpg decodes as PNG).
 *
 * Samples are f32 (channels, size, size) with one i32 class id. Training
 * ("train"): RandomResizedCrop (area scale 0.08-1, aspect ratio 3/4-4/3,
 * torchvision's ten tries, then its centre fallback) and a horizontal flip
 * with probability 1/2; any other split: the shorter side resized to
 * floor(size / 0.875), then the centre size x size. Resizing is bilinear
 * with PIL's antialiasing (the filter widened by the downscale factor).
 * Then (x/255 - mean[c]) / std[c]. The random draws are a function of
 * (seed, epoch, sample index) only (dt_dataset_get_sample_at): neither the
 * number of loader workers, nor the rank, nor the position in an epoch
 * changes a sample, so a resumed run and a run on W ranks see the same
 * images as an uninterrupted single process.
 */
#ifndef DT_CORE_IMAGE_H
#define DT_CORE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/data.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PIL's Image.MAX_IMAGE_PIXELS: larger images are refused from their header,
 * before any pixel memory is allocated (a decompression bomb). */
#define DT_IMAGE_MAX_PIXELS_DEFAULT 89478485

/* A decoded image: height x width x channels bytes, row-major, interleaved. */
typedef struct dt_image {
  int height, width, channels;
  uint8_t *pixels; /* owned; free with dt_image_free */
} dt_image;

/* Decodes the PNG or JPEG file `path` (decided by its first bytes) into
 * `channels` 1 (grey, PIL's L: 0.299 R + 0.587 G + 0.114 B) or 3 (RGB):
 * palette, grey, 16-bit and alpha images are converted (alpha dropped, as
 * PIL's convert("RGB")). Errors, each naming the file: DT_ERR_IO (cannot
 * open or read), DT_ERR_FORMAT (not a PNG or JPEG, truncated or corrupt
 * data), DT_ERR_UNSUPPORTED (CMYK JPEG; an image above max_pixels, refused
 * from its header; max_pixels 0 = DT_IMAGE_MAX_PIXELS_DEFAULT). On failure
 * *out is zeroed. */
dt_status dt_image_read(const char *path, int channels, int64_t max_pixels, dt_image *out);
void dt_image_free(dt_image *img);

/* Writes `img` (1 or 3 channels) as PNG, or as JPEG of `quality` (1-100),
 * atomically: a temporary file in the same folder, flushed, then renamed
 * over `path`. Errors name the file. */
dt_status dt_image_write_png(const char *path, const dt_image *img);
dt_status dt_image_write_jpeg(const char *path, const dt_image *img, int quality);

/* ---- augmentation ---- */

/* A crop box: top row, left column, height, width. */
typedef struct dt_image_box {
  int top, left, height, width;
} dt_image_box;

/* torchvision's RandomResizedCrop.get_params for an image of h x w: up to
 * ten draws of an area fraction in [scale_min, scale_max] and a log-uniform
 * aspect ratio in [ratio_min, ratio_max] (w = round(sqrt(area * ratio)),
 * h = round(sqrt(area / ratio)), halves to even as Python's round); the
 * first that fits is placed uniformly; none fits: the centre crop of the
 * ratio nearest the image's. The draws are dt_rng_uniform(key, 0 .. 19)
 * for the tries and (key, 20), (key, 21) for the position. */
dt_image_box dt_image_random_resized_crop_box(int h, int w, double scale_min, double scale_max,
                                              double ratio_min, double ratio_max, uint64_t key);

/* The evaluation geometry: the size the shorter side is resized to
 * (floor(size / 0.875)), the resized image's height and width (the longer
 * side int(resize * long / short), as torchvision's Resize), and the centre
 * crop box in the resized image (top = round((rh - size) / 2)). Computed in
 * 64 bits; returns 1, or 0 (outputs zeroed) when a resized side would be
 * over INT_MAX pixels (a 1 x 8,400,000 image at size 224) or h, w < 1. */
int dt_image_eval_geometry(int h, int w, int size, int *resized_h, int *resized_w,
                           dt_image_box *crop);

/* Resizes the box `box` of `img` to out_h x out_w (bilinear, antialiased
 * when shrinking, as PIL), optionally mirrored left-right, and writes the
 * window `win` of the result (in the mirrored image's coordinates, inside
 * out_h x out_w) into `out` (win.height x win.width x img->channels floats
 * in [0, 255], row-major, channels interleaved): bit for bit the window of
 * the whole resize, computed from the box rows it reads, a row at a time,
 * so that neither the resized image nor the box resized across is ever in
 * memory. `scratch` holds win.width x channels floats. Returns 1, or 0 (out
 * untouched) for 0 or over 4 channels, a window outside the output or no
 * memory for the filter taps (a few floats per box pixel across, and down). */
int dt_image_resize_window(const dt_image *img, dt_image_box box, int out_h, int out_w,
                           dt_image_box win, int flip, float *scratch, float *out);

/* dt_image_resize_window of the whole out_h x out_w (zeros where it
 * returns 0): `scratch` holds out_w x channels floats. */
void dt_image_resize_box(const dt_image *img, dt_image_box box, int out_h, int out_w, int flip,
                         float *scratch, float *out);

/* ---- the ImageFolder data set ---- */

/* The augmentation recipe: the training transform and the evaluation
 * geometry that goes with it.
 *   RESIZED_CROP (torchvision's ImageNet recipe): RandomResizedCrop and a
 *     horizontal flip; evaluation resizes the shorter side to size / 0.875
 *     and takes the centre crop (dt_image_eval_geometry).
 *   PAD_CROP (the CIFAR recipe): the image resized to size x size, shifted
 *     by up to pad = (size + 4) / 8 pixels each way with zeros (black) let
 *     in (RandomCrop with padding) and flipped; evaluation: the image
 *     resized to size x size.
 *   FLIP: resized to size x size and flipped; evaluation: resized.
 *   NONE: resized to size x size in training and evaluation. */
typedef enum dt_image_augment {
  DT_IMAGE_AUGMENT_RESIZED_CROP = 0,
  DT_IMAGE_AUGMENT_PAD_CROP,
  DT_IMAGE_AUGMENT_FLIP,
  DT_IMAGE_AUGMENT_NONE,
} dt_image_augment;
/* "resized-crop", "pad-crop", "flip", "none"; parse: DT_ERR_INVALID_ARG. */
const char *dt_image_augment_name(dt_image_augment a);
dt_status dt_image_augment_parse(const char *name, dt_image_augment *out);
#define DT_IMAGE_AUGMENT_CHOICES "resized-crop|pad-crop|flip|none"

typedef struct dt_image_folder_config {
  int channels;            /* 1 (grey) or 3 (RGB) */
  int size;                /* samples are size x size (>= 1) */
  float mean[3], std[3];   /* per channel, on [0, 1] values */
  int skip_bad_images;     /* 0: a bad file fails the sample; 1: see below */
  int64_t max_pixels;      /* 0 = DT_IMAGE_MAX_PIXELS_DEFAULT */
  uint64_t seed;           /* of the augmentation (with the epoch and the index) */
  int augment;             /* -1: by split (train augments), 0: never, 1: always */
  dt_image_augment recipe; /* what augmenting does, and the evaluation geometry */
} dt_image_folder_config;
/* RGB, 224 px, ImageNet's mean and std, bad images fail, seed 0. */
#define DT_IMAGE_FOLDER_CONFIG_DEFAULT                \
  ((dt_image_folder_config){3,                        \
                            224,                      \
                            {0.485f, 0.456f, 0.406f}, \
                            {0.229f, 0.224f, 0.225f}, \
                            0,                        \
                            0,                        \
                            0,                        \
                            -1,                       \
                            DT_IMAGE_AUGMENT_RESIZED_CROP})

/* The split `split` ("train", "val") of the image folder `root`. The
 * folder is listed here (no file is decoded): errors name the folder or
 * file: DT_ERR_IO (root/split missing or unreadable), DT_ERR_FORMAT (no
 * class folder, an empty class folder: no .png/.jpg/.jpeg in it),
 * DT_ERR_INVALID_ARG (config out of range). A file that cannot be decoded
 * (dt_image_read's errors), or whose evaluation resize (RESIZED_CROP, not
 * augmenting) would be over INT_MAX pixels a side (DT_ERR_UNSUPPORTED: a
 * 1 x 8,400,000 image at size 224), fails its sample, naming the file; with
 * skip_bad_images the sample is replaced by the next good file in index
 * order (wrapping around), the same replacement for every worker count and
 * epoch, and each bad file is counted once (dt_image_folder_bad_count). */
dt_status dt_dataset_image_folder(const char *root, const char *split,
                                  const dt_image_folder_config *cfg, dt_dataset **out);

/* The class names of an image folder data set, in class-id order (NULL
 * past the last or for another kind of data set). */
const char *dt_image_folder_class_name(const dt_dataset *d, int cls);
/* The distinct bad files met so far (skip_bad_images), 0 for another kind
 * of data set. */
int64_t dt_image_folder_bad_count(const dt_dataset *d);
/* mask[i] = 1 for each file i of the first n known to be bad, else 0;
 * returns how many are (0, mask zeroed, for another kind of data set).
 * Summed over ranks, the masks count each bad file once. */
int64_t dt_image_folder_bad_mask(const dt_dataset *d, float *mask, int64_t n);
/* The file of sample i (NULL out of range or another kind of data set). */
const char *dt_image_folder_file(const dt_dataset *d, int64_t i);

#ifdef __cplusplus
}
#endif
#endif
