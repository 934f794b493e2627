/* The augmentation's geometry (torchvision's RandomResizedCrop and the
 * evaluation's Resize + CenterCrop) and PIL's antialiased bilinear resize
 * (core/image.h). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/image.h"
#include "core/rng.h"

#define CROP_TRIES 10

/* Python's round(): halves to even (the default rounding mode). */
static int round_half_even(double x) { return (int)nearbyint(x); }

dt_image_box dt_image_random_resized_crop_box(int h, int w, double scale_min, double scale_max,
                                              double ratio_min, double ratio_max, uint64_t key) {
  double area = (double)h * (double)w;
  double log_lo = log(ratio_min), log_hi = log(ratio_max);
  uint64_t draw = 0;
  for (int t = 0; t < CROP_TRIES; t++) {
    double target = area * (scale_min + (scale_max - scale_min) * dt_rng_uniform(key, draw++));
    double aspect = exp(log_lo + (log_hi - log_lo) * dt_rng_uniform(key, draw++));
    int cw = round_half_even(sqrt(target * aspect));
    int ch = round_half_even(sqrt(target / aspect));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      int top = (int)(dt_rng_uniform(key, 2 * CROP_TRIES) * (float)(h - ch + 1));
      int left = (int)(dt_rng_uniform(key, 2 * CROP_TRIES + 1) * (float)(w - cw + 1));
      if (top > h - ch) /* a uniform draw of 1 - 2^-24 times a large range */
        top = h - ch;
      if (left > w - cw)
        left = w - cw;
      return (dt_image_box){top, left, ch, cw};
    }
  }
  double in_ratio = (double)w / (double)h;
  int cw = w, ch = h;
  if (in_ratio < ratio_min)
    ch = round_half_even(cw / ratio_min);
  else if (in_ratio > ratio_max)
    cw = round_half_even(ch * ratio_max);
  return (dt_image_box){(h - ch) / 2, (w - cw) / 2, ch, cw};
}

int dt_image_eval_geometry(int h, int w, int size, int *resized_h, int *resized_w,
                           dt_image_box *crop) {
  int64_t resize = (int64_t)((double)size / 0.875);
  int64_t rh = resize, rw = resize;
  if (h < w)
    rw = resize * w / h;
  else if (w < h)
    rh = resize * h / w;
  if (h < 1 || w < 1 || rh > INT_MAX || rw > INT_MAX) {
    *resized_h = *resized_w = 0;
    *crop = (dt_image_box){0, 0, 0, 0};
    return 0;
  }
  *resized_h = (int)rh;
  *resized_w = (int)rw;
  crop->height = size < rh ? size : (int)rh;
  crop->width = size < rw ? size : (int)rw;
  crop->top = round_half_even((double)(rh - size) / 2.0);
  crop->left = round_half_even((double)(rw - size) / 2.0);
  return 1;
}

/* PIL's precompute_coeffs for the bilinear filter, for outputs off ..
 * off + n - 1 of a resize of `in` to `out`: output off + i reads inputs
 * first[i] .. first[i] + count[i] - 1 of `in` with `weights` (max_taps per
 * output), the filter's support widened by in/out when shrinking. Each
 * output's taps are those of the whole resize, whatever the window. */
typedef struct taps {
  int *first, *count;
  float *weights;
  int max_taps;
} taps;

static int taps_make(int in, int out, int off, int n, taps *t) {
  double scale = (double)in / out, ss = scale > 1.0 ? scale : 1.0, support = ss;
  t->max_taps = (int)ceil(support) * 2 + 1;
  t->first = malloc((size_t)n * sizeof *t->first);
  t->count = malloc((size_t)n * sizeof *t->count);
  t->weights = malloc((size_t)n * (size_t)t->max_taps * sizeof *t->weights);
  if (!t->first || !t->count || !t->weights)
    return 0;
  for (int i = 0; i < n; i++) {
    double center = ((double)off + i + 0.5) * scale;
    int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
    if (lo < 0)
      lo = 0;
    if (hi > in)
      hi = in;
    if (hi - lo > t->max_taps)
      hi = lo + t->max_taps;
    float *wt = t->weights + (size_t)i * (size_t)t->max_taps;
    double sum = 0.0;
    for (int k = lo; k < hi; k++) {
      double x = fabs((k - center + 0.5) / ss);
      double v = x < 1.0 ? 1.0 - x : 0.0;
      wt[k - lo] = (float)v;
      sum += v;
    }
    for (int k = 0; k < hi - lo && sum > 0.0; k++)
      wt[k] = (float)(wt[k] / sum);
    t->first[i] = lo;
    t->count[i] = hi - lo;
  }
  return 1;
}

static void taps_free(taps *t) {
  free(t->first);
  free(t->count);
  free(t->weights);
}

/* One row through the horizontal taps; inlined with C a constant (1, 3)
 * so that the channel loops unroll. */
static inline __attribute__((always_inline)) void horizontal_row(const uint8_t *row, const taps *th,
                                                                 int out_w, int flip, const int C,
                                                                 float *dst) {
  for (int x = 0; x < out_w; x++) {
    const float *wt = th->weights + (size_t)x * th->max_taps;
    const uint8_t *src = row + (size_t)th->first[x] * C;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < th->count[x]; k++)
      for (int c = 0; c < C; c++)
        acc[c] += wt[k] * (float)src[k * C + c];
    float *o = dst + (size_t)(flip ? out_w - 1 - x : x) * C;
    for (int c = 0; c < C; c++)
      o[c] = acc[c];
  }
}

/* out (win.height, win.width, C) += w * row (win.width, C): output row y's
 * taps summed in input row order, as a whole vertical pass would. */
static void add_row(float *restrict dst, const float *restrict row, float w, size_t len) {
  for (size_t i = 0; i < len; i++)
    dst[i] += w * row[i];
}

int dt_image_resize_window(const dt_image *img, dt_image_box box, int out_h, int out_w,
                           dt_image_box win, int flip, float *scratch, float *out) {
  const int C = img->channels;
  const size_t row_len = (size_t)win.width * (size_t)C;
  if (C < 1 || C > 4 || box.height < 1 || box.width < 1 || win.top < 0 || win.left < 0 ||
      win.height < 1 || win.width < 1 || win.height > out_h - win.top ||
      win.width > out_w - win.left)
    return 0;
  /* The window's columns before the mirror: flipped, output column x is
   * the resize's out_w - 1 - x. */
  int col0 = flip ? out_w - win.left - win.width : win.left;
  taps th = {0}, tv = {0};
  int ok = taps_make(box.width, out_w, col0, win.width, &th) &&
           taps_make(box.height, out_h, win.top, win.height, &tv);
  if (ok) {
    for (size_t i = 0; i < (size_t)win.height * row_len; i++)
      out[i] = 0.0f;
    /* Horizontal then vertical, a box row at a time: each row the window's
     * outputs read goes through the horizontal taps into scratch and is
     * added to the output rows whose vertical taps take it, in row order
     * (the sums of a whole horizontal pass, then a vertical one, term for
     * term), so that memory is one row however tall the box. */
    int r0 = tv.first[0], r1 = r0, y0 = 0;
    for (int y = 0; y < win.height; y++)
      if (tv.first[y] + tv.count[y] > r1)
        r1 = tv.first[y] + tv.count[y];
    for (int r = r0; r < r1; r++) {
      while (y0 < win.height && tv.first[y0] + tv.count[y0] <= r)
        y0++;
      const uint8_t *row = img->pixels + ((size_t)(box.top + r) * img->width + box.left) * C;
      if (C == 1)
        horizontal_row(row, &th, win.width, flip, 1, scratch);
      else if (C == 3)
        horizontal_row(row, &th, win.width, flip, 3, scratch);
      else
        horizontal_row(row, &th, win.width, flip, C, scratch);
      for (int y = y0; y < win.height && tv.first[y] <= r; y++)
        if (r < tv.first[y] + tv.count[y])
          add_row(out + (size_t)y * row_len, scratch,
                  tv.weights[(size_t)y * tv.max_taps + (size_t)(r - tv.first[y])], row_len);
    }
  }
  taps_free(&th);
  taps_free(&tv);
  return ok;
}

void dt_image_resize_box(const dt_image *img, dt_image_box box, int out_h, int out_w, int flip,
                         float *scratch, float *out) {
  dt_image_box whole = {0, 0, out_h, out_w};
  if (!dt_image_resize_window(img, box, out_h, out_w, whole, flip, scratch, out))
    for (size_t i = 0; i < (size_t)out_h * (size_t)out_w * (size_t)img->channels; i++)
      out[i] = 0.0f; /* no memory for a few hundred floats: a black sample, never garbage */
}

static const char *const augment_names[] = {"resized-crop", "pad-crop", "flip", "none"};

const char *dt_image_augment_name(dt_image_augment a) {
  return (unsigned)a <= DT_IMAGE_AUGMENT_NONE ? augment_names[a] : "?";
}

dt_status dt_image_augment_parse(const char *name, dt_image_augment *out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
  for (int a = 0; a <= DT_IMAGE_AUGMENT_NONE; a++)
    if (name && strcmp(name, augment_names[a]) == 0) {
      *out = (dt_image_augment)a;
      return DT_OK;
    }
  return DT_ERROR(DT_ERR_INVALID_ARG, "augmentation '%s': expected one of %s",
                  name ? name : "(null)", DT_IMAGE_AUGMENT_CHOICES);
}
