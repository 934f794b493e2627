/* PNG and JPEG files: decoding with libpng / libjpeg-turbo from a file read
 * whole into memory, and writing (core/image.h).
 *
 * Both libraries report errors by calling a function that must not return
 * (libjpeg's default error_exit calls exit(), libpng's aborts): each decode
 * installs its own handler that formats the library's message into the
 * decode's context and longjmps back, so a corrupt file is a status naming
 * it. The image's dimensions are checked from the header, before the pixel
 * buffer is allocated (a 30000 x 30000 PNG of zeros is a few KB on disk). */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* jpeglib.h needs size_t and FILE declared before it. */
#include <jpeglib.h>
/* after jpeglib.h: the warning codes (JWRN_*) */
#include <jerror.h>
#include <png.h>

#include "core/image.h"

#define MAX_FILE_BYTES ((int64_t)1 << 30)
#define MSG_MAX 512

/* ---- reading the file ---- */

static dt_status read_whole(const char *path, uint8_t **data, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot open image %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return DT_ERROR(DT_ERR_IO, "image %s is not a regular file", path);
  }
  if (sb.st_size > MAX_FILE_BYTES) {
    fclose(f);
    return DT_ERROR(DT_ERR_UNSUPPORTED, "image %s: %lld bytes, more than the %lld an image may be",
                    path, (long long)sb.st_size, (long long)MAX_FILE_BYTES);
  }
  *size = (size_t)sb.st_size;
  *data = malloc(*size ? *size : 1);
  if (!*data) {
    fclose(f);
    return DT_ERROR(DT_ERR_OOM, "no memory for the %zu bytes of image %s", *size, path);
  }
  size_t got = fread(*data, 1, *size, f);
  int err = ferror(f);
  fclose(f);
  if (got != *size || err) {
    free(*data);
    *data = NULL;
    return DT_ERROR(DT_ERR_IO, "reading image %s: %s", path, err ? strerror(errno) : "short read");
  }
  return DT_OK;
}

static dt_status check_pixels(const char *path, const char *kind, uint32_t w, uint32_t h,
                              int64_t max_pixels) {
  if (max_pixels <= 0)
    max_pixels = DT_IMAGE_MAX_PIXELS_DEFAULT;
  if (w == 0 || h == 0)
    return DT_ERROR(DT_ERR_FORMAT, "%s image %s has size %ux%u", kind, path, w, h);
  if ((int64_t)w * h > max_pixels)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s image %s is %ux%u = %lld pixels, more than the limit of %lld "
                    "(a decompression bomb?): refused before decoding",
                    kind, path, w, h, (long long)w * h, (long long)max_pixels);
  return DT_OK;
}

/* ---- PNG ---- */

typedef struct png_ctx {
  jmp_buf jmp;
  char msg[MSG_MAX];
  const uint8_t *data;
  size_t size, pos;
} png_ctx;

static void png_on_error(png_structp png, png_const_charp text) {
  png_ctx *c = png_get_error_ptr(png);
  snprintf(c->msg, sizeof c->msg, "%s", text);
  longjmp(c->jmp, 1);
}

static void png_on_warning(png_structp png, png_const_charp text) {
  (void)png;
  (void)text;
}

static void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  png_ctx *c = png_get_io_ptr(png);
  if (n > c->size - c->pos)
    png_error(png, "truncated file (read past its end)");
  memcpy(out, c->data + c->pos, n);
  c->pos += n;
}

static dt_status decode_png(const char *path, const uint8_t *data, size_t size, int channels,
                            int64_t max_pixels, dt_image *out) {
  png_ctx ctx = {.data = data, .size = size};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_on_error, png_on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  if (!info) {
    png_destroy_read_struct(&png, NULL, NULL);
    return DT_ERROR(DT_ERR_OOM, "cannot start decoding PNG %s", path);
  }
  uint8_t *volatile pixels = NULL;
  png_bytep *volatile rows = NULL;
  dt_status st = DT_OK;
  if (setjmp(ctx.jmp)) {
    st = DT_ERROR(DT_ERR_FORMAT, "corrupt or truncated PNG %s: %s", path, ctx.msg);
    goto done;
  }
  png_set_read_fn(png, &ctx, png_read_mem);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  uint32_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  if ((st = check_pixels(path, "PNG", w, h, max_pixels)) != DT_OK)
    goto done;
  int color = png_get_color_type(png, info);
  png_set_expand(png); /* palette -> RGB, grey < 8 bits -> 8, tRNS -> alpha */
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  int grey = !(color & PNG_COLOR_MASK_COLOR);
  if (channels == 3 && grey)
    png_set_gray_to_rgb(png);
  if (channels == 1 && !grey) /* PIL's L: 0.299 R + 0.587 G + 0.114 B */
    png_set_rgb_to_gray_fixed(png, 1, 29900, 58700);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if ((int)png_get_channels(png, info) != channels) {
    st = DT_ERROR(DT_ERR_UNSUPPORTED, "PNG %s: cannot convert colour type %d to %d channels", path,
                  color, channels);
    goto done;
  }
  size_t row_bytes = (size_t)w * (size_t)channels;
  pixels = malloc(row_bytes * h);
  rows = malloc(h * sizeof *rows);
  if (!pixels || !rows) {
    st = DT_ERROR(DT_ERR_OOM, "no memory for PNG %s (%ux%u)", path, w, h);
    goto done;
  }
  for (uint32_t y = 0; y < h; y++)
    rows[y] = pixels + y * row_bytes;
  png_read_image(png, rows);
  png_read_end(png, NULL);
  *out = (dt_image){(int)h, (int)w, channels, pixels};
  pixels = NULL;
done:
  png_destroy_read_struct(&png, &info, NULL);
  free(rows);
  free(pixels);
  return st;
}

/* ---- JPEG ---- */

typedef struct jpeg_ctx {
  struct jpeg_error_mgr mgr; /* first: libjpeg hands back a pointer to it */
  jmp_buf jmp;
  char msg[JMSG_LENGTH_MAX];
  int warnings;
} jpeg_ctx;

static void jpeg_on_error(j_common_ptr cinfo) {
  jpeg_ctx *c = (jpeg_ctx *)cinfo->err;
  c->mgr.format_message(cinfo, c->msg);
  longjmp(c->jmp, 1);
}

/* The corrupt-data warnings after which libjpeg fills the rest with grey
 * (premature end of the file or of a data segment, a bad Huffman or
 * arithmetic code, a lost restart marker): a truncated file would decode
 * silently, so they count as errors. The other warnings (extraneous bytes
 * before a marker, an unknown JFIF revision, ...) leave the pixels whole,
 * and PIL decodes through them: so do we. */
static int jpeg_warning_fills_grey(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
#if JPEG_LIB_VERSION >= 70 || defined(C_ARITH_CODING_SUPPORTED) || \
    defined(D_ARITH_CODING_SUPPORTED) /* jerror.h's condition for it */
    case JWRN_ARITH_BAD_CODE:
#endif
      return 1;
    default: return 0;
  }
}

static void jpeg_on_message(j_common_ptr cinfo, int level) {
  jpeg_ctx *c = (jpeg_ctx *)cinfo->err;
  if (level < 0 && jpeg_warning_fills_grey(c->mgr.msg_code)) {
    c->mgr.format_message(cinfo, c->msg);
    longjmp(c->jmp, 1);
  }
}

static dt_status decode_jpeg(const char *path, const uint8_t *data, size_t size, int channels,
                             int64_t max_pixels, dt_image *out) {
  struct jpeg_decompress_struct cinfo;
  jpeg_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  cinfo.err = jpeg_std_error(&ctx.mgr);
  ctx.mgr.error_exit = jpeg_on_error;
  ctx.mgr.emit_message = jpeg_on_message;
  uint8_t *volatile pixels = NULL;
  dt_status st = DT_OK;
  if (setjmp(ctx.jmp)) {
    st = DT_ERROR(DT_ERR_FORMAT, "corrupt or truncated JPEG %s: %s", path, ctx.msg);
    goto done;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)size);
  jpeg_read_header(&cinfo, TRUE);
  if ((st = check_pixels(path, "JPEG", cinfo.image_width, cinfo.image_height, max_pixels)) != DT_OK)
    goto done;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    st = DT_ERROR(DT_ERR_UNSUPPORTED, "JPEG %s is CMYK: only grey and RGB JPEGs are read", path);
    goto done;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  size_t row_bytes = (size_t)cinfo.output_width * (size_t)channels;
  pixels = malloc(row_bytes * cinfo.output_height);
  if (!pixels) {
    st = DT_ERROR(DT_ERR_OOM, "no memory for JPEG %s (%ux%u)", path, cinfo.output_width,
                  cinfo.output_height);
    goto done;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels + cinfo.output_scanline * row_bytes;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  *out = (dt_image){(int)cinfo.output_height, (int)cinfo.output_width, channels, pixels};
  pixels = NULL;
done:
  jpeg_destroy_decompress(&cinfo);
  free(pixels);
  return st;
}

/* ---- dispatch ---- */

dt_status dt_image_read(const char *path, int channels, int64_t max_pixels, dt_image *out) {
  if (!out || !path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path and out must not be NULL");
  memset(out, 0, sizeof *out);
  if (channels != 1 && channels != 3)
    return DT_ERROR(DT_ERR_INVALID_ARG, "channels %d: expected 1 or 3", channels);
  uint8_t *data = NULL;
  size_t size = 0;
  DT_CHECK(read_whole(path, &data, &size));
  static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  dt_status st;
  if (size >= 8 && memcmp(data, png_magic, 8) == 0)
    st = decode_png(path, data, size, channels, max_pixels, out);
  else if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
    st = decode_jpeg(path, data, size, channels, max_pixels, out);
  else
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s is neither a PNG nor a JPEG file (%zu bytes, starting %02x %02x %02x %02x)",
                  path, size, size > 0 ? data[0] : 0, size > 1 ? data[1] : 0,
                  size > 2 ? data[2] : 0, size > 3 ? data[3] : 0);
  free(data);
  return st;
}

void dt_image_free(dt_image *img) {
  if (img) {
    free(img->pixels);
    *img = (dt_image){0};
  }
}

/* ---- writing ---- */

static dt_status check_writable(const char *path, const dt_image *img, char *tmp, size_t cap) {
  if (!path || !img || !img->pixels || img->width < 1 || img->height < 1 ||
      (img->channels != 1 && img->channels != 3))
    return DT_ERROR(DT_ERR_INVALID_ARG, "writing image %s: needs 1 or 3 channels of pixels",
                    path ? path : "(null)");
  if ((size_t)snprintf(tmp, cap, "%s.tmp%ld", path, (long)getpid()) >= cap)
    return DT_ERROR(DT_ERR_INVALID_ARG, "image path too long: %s", path);
  return DT_OK;
}

/* Closes `f`; renames tmp over path when everything went well, else removes it. */
static dt_status finish_write(FILE *f, const char *tmp, const char *path, dt_status st) {
  if (fclose(f) != 0 && st == DT_OK)
    st = DT_ERROR(DT_ERR_IO, "writing image %s: %s", path, strerror(errno));
  if (st == DT_OK && rename(tmp, path) != 0)
    st = DT_ERROR(DT_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
  if (st != DT_OK)
    unlink(tmp);
  return st;
}

dt_status dt_image_write_png(const char *path, const dt_image *img) {
  char tmp[4096];
  DT_CHECK(check_writable(path, img, tmp, sizeof tmp));
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  png_ctx ctx = {0};
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, png_on_error, png_on_warning);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  dt_status st = DT_OK;
  if (!info) {
    st = DT_ERROR(DT_ERR_OOM, "cannot start writing PNG %s", path);
  } else if (setjmp(ctx.jmp)) {
    st = DT_ERROR(DT_ERR_IO, "writing PNG %s: %s", path, ctx.msg);
  } else {
    png_init_io(png, f);
    png_set_IHDR(png, info, (uint32_t)img->width, (uint32_t)img->height, 8,
                 img->channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    size_t row_bytes = (size_t)img->width * (size_t)img->channels;
    for (int y = 0; y < img->height; y++)
      png_write_row(png, img->pixels + (size_t)y * row_bytes);
    png_write_end(png, NULL);
  }
  png_destroy_write_struct(&png, &info);
  return finish_write(f, tmp, path, st);
}

dt_status dt_image_write_jpeg(const char *path, const dt_image *img, int quality) {
  char tmp[4096];
  DT_CHECK(check_writable(path, img, tmp, sizeof tmp));
  if (quality < 1 || quality > 100)
    return DT_ERROR(DT_ERR_INVALID_ARG, "JPEG quality %d: expected 1 to 100", quality);
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return DT_ERROR(DT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  struct jpeg_compress_struct cinfo;
  jpeg_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  cinfo.err = jpeg_std_error(&ctx.mgr);
  ctx.mgr.error_exit = jpeg_on_error;
  dt_status st = DT_OK;
  if (setjmp(ctx.jmp)) {
    st = DT_ERROR(DT_ERR_IO, "writing JPEG %s: %s", path, ctx.msg);
  } else {
    jpeg_create_compress(&cinfo);
    jpeg_stdio_dest(&cinfo, f);
    cinfo.image_width = (JDIMENSION)img->width;
    cinfo.image_height = (JDIMENSION)img->height;
    cinfo.input_components = img->channels;
    cinfo.in_color_space = img->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    size_t row_bytes = (size_t)img->width * (size_t)img->channels;
    while (cinfo.next_scanline < cinfo.image_height) {
      JSAMPROW row = img->pixels + cinfo.next_scanline * row_bytes;
      jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
  }
  jpeg_destroy_compress(&cinfo);
  return finish_write(f, tmp, path, st);
}
