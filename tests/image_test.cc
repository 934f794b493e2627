// Image folders (core/image.h): PNG and JPEG decoding and its conversions,
// every bad-image case (truncated, corrupt, not an image, unsupported, an
// empty class folder, a decompression bomb, an aspect ratio past what the
// evaluation's resize can hold) as an error naming the file or, with
// skip_bad_images, a deterministic replacement that is counted; harmless
// JPEG warnings decoded through; the augmentation's geometry against hand
// computations, a resize's window the whole resize's, extreme aspect ratios
// in bounded memory; the loader's batches the same for any number of
// workers and on resume.
#include "core/image.h"

#include <gtest/gtest.h>
#include <png.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/data.h"
#include "tests/dt_assert.h"

namespace {

std::string TempDir() {
  const char *t = getenv("TEST_TMPDIR");
  std::string base = t ? t : "/tmp";
  char templ[4096];
  snprintf(templ, sizeof templ, "%s/image_test_XXXXXX", base.c_str());
  EXPECT_NE(mkdtemp(templ), nullptr);
  return templ;
}

void MkDir(const std::string &p) { ASSERT_EQ(mkdir(p.c_str(), 0777), 0) << p; }

void WriteBytes(const std::string &p, const std::vector<uint8_t> &bytes) {
  FILE *f = fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr) << p;
  fwrite(bytes.data(), 1, bytes.size(), f);
  fclose(f);
}

std::vector<uint8_t> ReadBytes(const std::string &p) {
  std::vector<uint8_t> b;
  FILE *f = fopen(p.c_str(), "rb");
  if (!f)
    return b;
  int c;
  while ((c = fgetc(f)) != EOF)
    b.push_back((uint8_t)c);
  fclose(f);
  return b;
}

// A PNG of any colour type and bit depth through libpng directly: rows
// gives each row's bytes (as libpng takes them for that type and depth).
void WritePngRaw(const std::string &path, int w, int h, int color, int depth,
                 const std::function<void(int, std::vector<uint8_t> &)> &row_fn,
                 const png_color *palette = nullptr, int n_palette = 0) {
  FILE *f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);  // 1 x 8,400,000 too
  png_init_io(png, f);
  png_set_IHDR(png, info, w, h, depth, color, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette)
    png_set_PLTE(png, info, palette, n_palette);
  png_write_info(png, info);
  std::vector<uint8_t> row;
  for (int y = 0; y < h; y++) {
    row_fn(y, row);
    png_write_row(png, row.data());
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  fclose(f);
}

// A grey image of value v(y, x).
dt_image Grey(int h, int w, const std::function<uint8_t(int, int)> &v) {
  dt_image img{h, w, 1, (uint8_t *)malloc((size_t)h * w)};
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      img.pixels[y * w + x] = v(y, x);
  return img;
}

// The pixels of `path` decoded to `channels` (empty on an error).
std::vector<uint8_t> Decode(const std::string &path, int channels) {
  dt_image img;
  if (dt_image_read(path.c_str(), channels, 0, &img) != DT_OK) {
    ADD_FAILURE() << dt_last_error();
    return {};
  }
  std::vector<uint8_t> px(img.pixels, img.pixels + (size_t)img.height * img.width * channels);
  dt_image_free(&img);
  return px;
}

TEST(ImageCodec, PngRoundTripGreyAndRgb) {
  std::string dir = TempDir();
  dt_image g = Grey(5, 7, [](int y, int x) { return (uint8_t)(y * 40 + x); });
  ASSERT_DT_OK(dt_image_write_png((dir + "/g.png").c_str(), &g));
  dt_image back;
  ASSERT_DT_OK(dt_image_read((dir + "/g.png").c_str(), 1, 0, &back));
  ASSERT_EQ(back.height, 5);
  ASSERT_EQ(back.width, 7);
  EXPECT_EQ(0, memcmp(back.pixels, g.pixels, 35));
  dt_image_free(&back);
  ASSERT_DT_OK(dt_image_read((dir + "/g.png").c_str(), 3, 0, &back));  // grey -> RGB
  ASSERT_EQ(back.channels, 3);
  for (int i = 0; i < 35; i++)
    for (int c = 0; c < 3; c++)
      ASSERT_EQ(back.pixels[i * 3 + c], g.pixels[i]);
  dt_image_free(&back);
  // No temporary file is left behind by the atomic write.
  EXPECT_NE(access((dir + "/g.png").c_str(), F_OK), -1);
  dt_image_free(&g);
}

TEST(ImageCodec, PaletteSixteenBitAlphaConverted) {
  std::string dir = TempDir();
  // Palette: index k -> (k*10, 255 - k*10, 7).
  std::vector<png_color> pal(16);
  for (int k = 0; k < 16; k++)
    pal[k] = png_color{(png_byte)(k * 10), (png_byte)(255 - k * 10), 7};
  WritePngRaw(
      dir + "/p.png", 4, 2, PNG_COLOR_TYPE_PALETTE, 8,
      [](int y, std::vector<uint8_t> &r) {
        r = {(uint8_t)(y * 4), 1, 2, 15};
      },
      pal.data(), 16);
  EXPECT_EQ(Decode(dir + "/p.png", 3),
            (std::vector<uint8_t>{0,  255, 7, 10, 245, 7, 20, 235, 7, 150, 105, 7,
                                  40, 215, 7, 10, 245, 7, 20, 235, 7, 150, 105, 7}));
  // 16-bit grey: the high byte survives.
  WritePngRaw(dir + "/g16.png", 2, 1, PNG_COLOR_TYPE_GRAY, 16, [](int, std::vector<uint8_t> &r) {
    r = {0x12, 0x34, 0xab, 0xcd};
  });
  EXPECT_EQ(Decode(dir + "/g16.png", 1), (std::vector<uint8_t>{0x12, 0xab}));
  // RGBA: alpha dropped; to grey, PIL's L weights (0.299, 0.587, 0.114):
  // 59.8 + 58.7 + 5.7 = 124.2.
  WritePngRaw(dir + "/a.png", 1, 1, PNG_COLOR_TYPE_RGBA, 8, [](int, std::vector<uint8_t> &r) {
    r = {200, 100, 50, 0};
  });
  EXPECT_EQ(Decode(dir + "/a.png", 3), (std::vector<uint8_t>{200, 100, 50}));
  std::vector<uint8_t> grey = Decode(dir + "/a.png", 1);
  ASSERT_EQ(grey.size(), 1u);
  EXPECT_NEAR(grey[0], 124.2, 1.0);
}

TEST(ImageCodec, JpegRoundTripClose) {
  std::string dir = TempDir();
  dt_image g = Grey(16, 16, [](int y, int x) { return (uint8_t)(8 * x + 4 * y); });
  ASSERT_DT_OK(dt_image_write_jpeg((dir + "/g.jpg").c_str(), &g, 95));
  dt_image back;
  ASSERT_DT_OK(dt_image_read((dir + "/g.jpg").c_str(), 1, 0, &back));
  ASSERT_EQ(back.width, 16);
  for (int i = 0; i < 256; i++)
    ASSERT_NEAR(back.pixels[i], g.pixels[i], 6) << i;
  dt_image_free(&back);
  dt_image_free(&g);
}

// Every bad file: a status naming it, never a crash.
void ExpectBad(const std::string &path, dt_status want, const char *words) {
  dt_image img;
  dt_status st = dt_image_read(path.c_str(), 3, 0, &img);
  EXPECT_EQ(st, want) << dt_last_error();
  EXPECT_NE(strstr(dt_last_error(), path.c_str()), nullptr) << dt_last_error();
  EXPECT_NE(strstr(dt_last_error(), words), nullptr) << dt_last_error();
  EXPECT_EQ(img.pixels, nullptr);
}

TEST(ImageCodec, BadFilesAreErrorsNamingTheFile) {
  std::string dir = TempDir();
  dt_image g = Grey(32, 32, [](int y, int x) { return (uint8_t)(x * y); });
  ASSERT_DT_OK(dt_image_write_png((dir + "/ok.png").c_str(), &g));
  ASSERT_DT_OK(dt_image_write_jpeg((dir + "/ok.jpg").c_str(), &g, 90));
  dt_image_free(&g);
  std::vector<uint8_t> png = ReadBytes(dir + "/ok.png"), jpg = ReadBytes(dir + "/ok.jpg");
  WriteBytes(dir + "/trunc.png", std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  ExpectBad(dir + "/trunc.png", DT_ERR_FORMAT, "truncated");
  WriteBytes(dir + "/trunc.jpg", std::vector<uint8_t>(jpg.begin(), jpg.begin() + jpg.size() / 2));
  ExpectBad(dir + "/trunc.jpg", DT_ERR_FORMAT, "JPEG");
  std::vector<uint8_t> flipped = png;
  flipped[png.size() / 2] ^= 0xff;  // inside IDAT: the chunk's CRC no longer holds
  WriteBytes(dir + "/flip.png", flipped);
  ExpectBad(dir + "/flip.png", DT_ERR_FORMAT, "PNG");
  std::vector<uint8_t> jflip = jpg;
  for (size_t i = jpg.size() / 2; i < jpg.size() / 2 + 40; i++)
    jflip[i] = 0xff;
  WriteBytes(dir + "/flip.jpg", jflip);
  ExpectBad(dir + "/flip.jpg", DT_ERR_FORMAT, "JPEG");
  WriteBytes(dir + "/text.png", {'h', 'e', 'l', 'l', 'o', '\n'});
  ExpectBad(dir + "/text.png", DT_ERR_FORMAT, "neither a PNG nor a JPEG");
  WriteBytes(dir + "/empty.jpg", {});
  ExpectBad(dir + "/empty.jpg", DT_ERR_FORMAT, "neither a PNG nor a JPEG");
  WriteBytes(dir + "/x.gif", {'G', 'I', 'F', '8', '9', 'a'});
  ExpectBad(dir + "/x.gif", DT_ERR_FORMAT, "neither");
  ExpectBad(dir + "/missing.png", DT_ERR_IO, "cannot open");
}

// libjpeg warns about harmless oddities PIL decodes silently: one 0x00 byte
// between the APP0 and DQT segments ("Corrupt JPEG data: 1 extraneous bytes
// before marker 0xdb") decodes to the clean file's pixels; the warnings
// after which libjpeg fills with grey (a premature end) stay errors.
TEST(ImageCodec, HarmlessJpegWarningIgnoredGreyFillAnError) {
  std::string dir = TempDir();
  dt_image g = Grey(24, 24, [](int y, int x) { return (uint8_t)(9 * x + 3 * y); });
  ASSERT_DT_OK(dt_image_write_jpeg((dir + "/ok.jpg").c_str(), &g, 90));
  dt_image_free(&g);
  std::vector<uint8_t> jpg = ReadBytes(dir + "/ok.jpg");
  ASSERT_GT(jpg.size(), 30u);
  ASSERT_EQ(jpg[2], 0xff);
  ASSERT_EQ(jpg[3], 0xe0);  // APP0 (JFIF) first
  size_t app0_end = 4 + ((size_t)jpg[4] << 8 | jpg[5]);
  ASSERT_EQ(jpg[app0_end], 0xff);
  ASSERT_EQ(jpg[app0_end + 1], 0xdb);  // then DQT
  std::vector<uint8_t> extra = jpg;
  extra.insert(extra.begin() + (long)app0_end, 0x00);
  WriteBytes(dir + "/extra.jpg", extra);
  std::vector<uint8_t> clean = Decode(dir + "/ok.jpg", 3);
  ASSERT_EQ(clean.size(), 24u * 24 * 3);
  EXPECT_EQ(Decode(dir + "/extra.jpg", 3), clean);
  WriteBytes(dir + "/cut.jpg", std::vector<uint8_t>(jpg.begin(), jpg.end() - 40));
  ExpectBad(dir + "/cut.jpg", DT_ERR_FORMAT, "Premature end of JPEG file");
}

long MaxRssKiB() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// A 30000 x 30000 1-bit PNG of zeros (about 110 KB on disk, 900 M pixels):
// refused from its header before any pixel memory; memory stays flat.
TEST(ImageCodec, DecompressionBombRefusedFromTheHeader) {
  std::string dir = TempDir(), bomb = dir + "/bomb.png";
  WritePngRaw(bomb, 30000, 30000, PNG_COLOR_TYPE_GRAY, 1,
              [](int, std::vector<uint8_t> &r) { r.assign(30000 / 8, 0); });
  struct stat sb;
  ASSERT_EQ(stat(bomb.c_str(), &sb), 0);
  EXPECT_LT(sb.st_size, 1 << 20);
  long before = MaxRssKiB();
  for (int k = 0; k < 3; k++)
    ExpectBad(bomb, DT_ERR_UNSUPPORTED, "30000x30000");
  EXPECT_NE(strstr(dt_last_error(), "decompression bomb"), nullptr);
  EXPECT_LT(MaxRssKiB() - before, 64 * 1024) << "KiB grown decoding the bomb";
  // A limit of our own: 16 x 16 = 256 pixels is over 255.
  dt_image g = Grey(16, 16, [](int, int) { return 0; }), img;
  ASSERT_DT_OK(dt_image_write_png((dir + "/s.png").c_str(), &g));
  EXPECT_EQ(dt_image_read((dir + "/s.png").c_str(), 1, 255, &img), DT_ERR_UNSUPPORTED);
  ASSERT_DT_OK(dt_image_read((dir + "/s.png").c_str(), 1, 256, &img));
  dt_image_free(&img);
  dt_image_free(&g);
}

// ---- geometry ----

TEST(ImageGeometry, EvalResizeAndCentreCropByHand) {
  int rh, rw;
  dt_image_box b;
  // 40 wide, 30 high, size 28: shorter side to int(28 / 0.875) = 32, the
  // longer int(32 * 40 / 30) = 42; crop top round(4 / 2) = 2, left 7.
  dt_image_eval_geometry(30, 40, 28, &rh, &rw, &b);
  EXPECT_EQ(rh, 32);
  EXPECT_EQ(rw, 42);
  EXPECT_EQ(b.top, 2);
  EXPECT_EQ(b.left, 7);
  EXPECT_EQ(b.height, 28);
  EXPECT_EQ(b.width, 28);
  // 224: 256, a 300 x 200 (h x w) image -> 384 x 256, top round(160 / 2) = 80.
  dt_image_eval_geometry(300, 200, 224, &rh, &rw, &b);
  EXPECT_EQ(rh, 384);
  EXPECT_EQ(rw, 256);
  EXPECT_EQ(b.top, 80);
  EXPECT_EQ(b.left, 16);
  // Halves round to even as Python's round: 33 - 28 = 5 -> 2.5 -> 2.
  dt_image_eval_geometry(33, 33, 28, &rh, &rw, &b);  // resized to 32: (32 - 28) / 2 = 2
  EXPECT_EQ(b.top, 2);
}

TEST(ImageGeometry, RandomResizedCropFallbackAndBounds) {
  // Ten tries of area 1000 and ratio 1 (w = h = 32) never fit a 10 x 100
  // image: torchvision's fallback, the image's ratio 10 above 1: h = 10,
  // w = round(10 * 1) = 10, centred: left (100 - 10) / 2 = 45.
  dt_image_box b = dt_image_random_resized_crop_box(10, 100, 1.0, 1.0, 1.0, 1.0, 7);
  EXPECT_EQ(b.top, 0);
  EXPECT_EQ(b.left, 45);
  EXPECT_EQ(b.height, 10);
  EXPECT_EQ(b.width, 10);
  // Ratio below the range (100 x 10): w = 10, h = round(10 / 1) = 10, top 45.
  b = dt_image_random_resized_crop_box(100, 10, 1.0, 1.0, 1.0, 1.0, 7);
  EXPECT_EQ(b.top, 45);
  EXPECT_EQ(b.height, 10);
  // Scale 1, ratio 1 on a square: the whole image.
  b = dt_image_random_resized_crop_box(28, 28, 1.0, 1.0, 1.0, 1.0, 3);
  EXPECT_EQ(b.top, 0);
  EXPECT_EQ(b.left, 0);
  EXPECT_EQ(b.height, 28);
  // The default ranges: every box inside the image, its area in [0.08, 1]
  // of it (up to rounding), its ratio in [3/4, 4/3] (up to rounding).
  int distinct = 0;
  dt_image_box prev{-1, -1, -1, -1};
  for (uint64_t key = 0; key < 2000; key++) {
    b = dt_image_random_resized_crop_box(60, 80, 0.08, 1.0, 0.75, 4.0 / 3.0, key);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 60);
    ASSERT_LE(b.left + b.width, 80);
    double area = (double)b.height * b.width / (60.0 * 80.0);
    ASSERT_GE(area, 0.06);
    double ratio = (double)b.width / b.height;
    ASSERT_GT(ratio, 0.6);
    ASSERT_LT(ratio, 1.6);
    distinct += memcmp(&b, &prev, sizeof b) != 0;
    prev = b;
  }
  EXPECT_GT(distinct, 1500);
}

TEST(ImageGeometry, ResizeOfARampByHand) {
  // v(y, x) = 6 x, pixel x centred at x + 0.5: the interpolation of the
  // ramp at position p is 6 (p - 0.5). Box left 4, width 20 -> 10 columns:
  // output x is centred at box position (x + 0.5) * 2 = 2x + 1, image
  // position 4 + 2x + 1, so its value is 6 (4 + 2x + 0.5) away from the
  // edges (the bilinear weights are symmetric and sum to 1); flipped, the
  // columns come mirrored.
  dt_image img = Grey(12, 40, [](int, int x) { return (uint8_t)(6 * x); });
  dt_image_box box{2, 4, 8, 20};
  std::vector<float> scratch(8 * 10), out(4 * 10), flipped(4 * 10);
  dt_image_resize_box(&img, box, 4, 10, 0, scratch.data(), out.data());
  dt_image_resize_box(&img, box, 4, 10, 1, scratch.data(), flipped.data());
  for (int y = 0; y < 4; y++)
    for (int x = 1; x < 9; x++) {
      EXPECT_NEAR(out[y * 10 + x], 6.0 * (4 + 2 * x + 0.5), 1e-3) << y << "," << x;
      EXPECT_EQ(flipped[y * 10 + (9 - x)], out[y * 10 + x]);
    }
  dt_image_free(&img);
}

// 64-bit geometry: a 1 x 65500 image at 224 resizes to 256 x 16,768,000
// (its centre at left round(16,767,776 / 2)); at 1 x 8,400,000 the width,
// 2,150,400,000, is over INT_MAX: refused, never a negative width.
TEST(ImageGeometry, EvalGeometryOfExtremeAspectRatios) {
  int rh, rw;
  dt_image_box b;
  EXPECT_EQ(dt_image_eval_geometry(1, 65500, 224, &rh, &rw, &b), 1);
  EXPECT_EQ(rh, 256);
  EXPECT_EQ(rw, 16768000);
  EXPECT_EQ(b.top, 16);
  EXPECT_EQ(b.left, 8383888);
  EXPECT_EQ(b.width, 224);
  EXPECT_EQ(dt_image_eval_geometry(65500, 1, 224, &rh, &rw, &b), 1);
  EXPECT_EQ(rh, 16768000);
  EXPECT_EQ(dt_image_eval_geometry(1, 8400000, 224, &rh, &rw, &b), 0);
  EXPECT_EQ(rw, 0);
  EXPECT_EQ(dt_image_eval_geometry(8400000, 1, 224, &rh, &rw, &b), 0);
  EXPECT_EQ(rh, 0);
}

// A window of the resize is the window of the whole resize, bit for bit:
// shrinking and enlarging, grey and RGB, mirrored or not.
TEST(ImageGeometry, ResizeWindowIsTheWholeResizeCropped) {
  for (int C : {1, 3}) {
    dt_image img{37, 53, C, (uint8_t *)malloc(37 * 53 * C)};
    for (int i = 0; i < 37 * 53 * C; i++)
      img.pixels[i] = (uint8_t)((i * 7919) % 251);
    dt_image_box box{3, 5, 31, 44};
    for (int out_h : {9, 31, 70})
      for (int out_w : {12, 44, 101})
        for (int flip = 0; flip < 2; flip++) {
          std::vector<float> scratch((size_t)out_w * C), whole((size_t)out_h * out_w * C);
          dt_image_resize_box(&img, box, out_h, out_w, flip, scratch.data(), whole.data());
          for (dt_image_box win :
               {dt_image_box{0, 0, out_h, out_w}, dt_image_box{2, 3, 5, 7},
                dt_image_box{out_h - 4, out_w - 6, 4, 6}, dt_image_box{out_h / 2, 0, 1, out_w}}) {
            std::vector<float> part((size_t)win.height * win.width * C, -1.0f);
            ASSERT_EQ(dt_image_resize_window(&img, box, out_h, out_w, win, flip, scratch.data(),
                                             part.data()),
                      1);
            for (int y = 0; y < win.height; y++)
              ASSERT_EQ(0, memcmp(&part[(size_t)y * win.width * C],
                                  &whole[((size_t)(win.top + y) * out_w + win.left) * C],
                                  (size_t)win.width * C * sizeof(float)))
                  << C << " channels, " << out_h << "x" << out_w << " flip " << flip
                  << ", window row " << y;
          }
        }
    std::vector<float> scratch(8 * C), out(64 * C);
    EXPECT_EQ(dt_image_resize_window(&img, box, 8, 8, dt_image_box{4, 0, 5, 8}, 0, scratch.data(),
                                     out.data()),
              0);  // a window past the output
    dt_image_free(&img);
  }
}

// ---- the data set ----

// root/<split>/<class>/<n>.png: class c's images are filled with 20 c + n.
std::string MakeFolder(int classes, int per_class, int size = 12) {
  std::string root = TempDir();
  for (const char *split : {"train", "val"}) {
    MkDir(root + "/" + split);
    for (int c = 0; c < classes; c++) {
      std::string d = root + "/" + split + "/class" + std::to_string(c);
      MkDir(d);
      for (int n = 0; n < per_class; n++) {
        dt_image g =
            Grey(size, size + 4, [&](int y, int x) { return (uint8_t)(20 * c + n + x + y); });
        char name[64];
        snprintf(name, sizeof name, "/%03d.png", n);
        EXPECT_EQ(dt_image_write_png((d + name).c_str(), &g), DT_OK);
        dt_image_free(&g);
      }
    }
  }
  return root;
}

dt_image_folder_config GreyConfig(int size) {
  dt_image_folder_config c = DT_IMAGE_FOLDER_CONFIG_DEFAULT;
  c.channels = 1;
  c.size = size;
  c.mean[0] = 0.0f;
  c.std[0] = 1.0f;
  return c;
}

TEST(ImageFolder, ClassesSortedFilesSortedLabels) {
  std::string root = MakeFolder(3, 4);
  dt_image_folder_config cfg = GreyConfig(8);
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d));
  EXPECT_EQ(dt_dataset_length(d), 12);
  EXPECT_EQ(dt_dataset_num_classes(d), 3);
  EXPECT_STREQ(dt_image_folder_class_name(d, 2), "class2");
  EXPECT_NE(strstr(dt_image_folder_file(d, 5), "/class1/001.png"), nullptr);
  std::vector<float> x(64);
  int32_t label = -1;
  ASSERT_DT_OK(dt_dataset_get_sample(d, 5, x.data(), &label));
  EXPECT_EQ(label, 1);
  // Evaluation: a 12 x 16 image -> 9 x 12 (int(8 / 0.875) = 9), centre 8 x 8.
  for (float v : x) {
    EXPECT_GE(v, 21.0f / 255 - 1e-6);
    EXPECT_LE(v, (21.0f + 30) / 255);
  }
  dt_dataset_destroy(d);
}

TEST(ImageFolder, FolderErrorsNameTheFolder) {
  std::string root = MakeFolder(2, 2);
  dt_image_folder_config cfg = GreyConfig(8);
  dt_dataset *d = nullptr;
  MkDir(root + "/train/class9_empty");
  EXPECT_EQ(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d), DT_ERR_FORMAT);
  EXPECT_NE(strstr(dt_last_error(), "class9_empty"), nullptr) << dt_last_error();
  EXPECT_NE(strstr(dt_last_error(), "holds no image"), nullptr) << dt_last_error();
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(dt_dataset_image_folder(root.c_str(), "test", &cfg, &d), DT_ERR_IO);
  EXPECT_NE(strstr(dt_last_error(), (root + "/test").c_str()), nullptr) << dt_last_error();
  std::string none = TempDir();
  MkDir(none + "/train");
  EXPECT_EQ(dt_dataset_image_folder(none.c_str(), "train", &cfg, &d), DT_ERR_FORMAT);
  EXPECT_NE(strstr(dt_last_error(), "no class folders"), nullptr) << dt_last_error();
  cfg.channels = 2;
  EXPECT_EQ(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d), DT_ERR_INVALID_ARG);
}

// A class folder whose only images are of formats not read (.gif, .bmp)
// holds no image: the listing's error naming it, not a class of bad files.
TEST(ImageFolder, ClassOfUnsupportedImagesOnlyHoldsNoImage) {
  std::string root = MakeFolder(2, 2);
  MkDir(root + "/val/class2");
  WriteBytes(root + "/val/class2/a.gif", {'G', 'I', 'F', '8', '9', 'a'});
  WriteBytes(root + "/val/class2/b.BMP", {'B', 'M', 0, 0});
  dt_image_folder_config cfg = GreyConfig(8);
  dt_dataset *d = nullptr;
  EXPECT_EQ(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d), DT_ERR_FORMAT);
  EXPECT_NE(strstr(dt_last_error(), (root + "/val/class2").c_str()), nullptr) << dt_last_error();
  EXPECT_NE(strstr(dt_last_error(), "holds no image"), nullptr) << dt_last_error();
  EXPECT_EQ(d, nullptr);
  // One readable image beside them: a class, its .gif a bad file.
  dt_image g = Grey(4, 4, [](int, int) { return 1; });
  ASSERT_DT_OK(dt_image_write_png((root + "/val/class2/c.png").c_str(), &g));
  dt_image_free(&g);
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d));
  EXPECT_EQ(dt_dataset_length(d), 7);
  dt_dataset_destroy(d);
}

TEST(ImageFolder, BadImageFailsOrIsReplacedAndCounted) {
  std::string root = MakeFolder(2, 3);
  // class0/001.png truncated; class1/002.bmp: an unsupported format.
  std::string bad = root + "/train/class0/001.png";
  std::vector<uint8_t> b = ReadBytes(bad);
  WriteBytes(bad, std::vector<uint8_t>(b.begin(), b.begin() + 30));
  WriteBytes(root + "/train/class1/003.bmp", {'B', 'M', 0, 0});
  WriteBytes(root + "/train/class1/notes.txt", {'x'});  // not an image: not listed
  dt_image_folder_config cfg = GreyConfig(8);
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d));
  ASSERT_EQ(dt_dataset_length(d), 7);
  std::vector<float> x(64), y(64);
  int32_t label = -1;
  EXPECT_EQ(dt_dataset_get_sample_at(d, 1, 0, x.data(), &label), DT_ERR_FORMAT);
  EXPECT_NE(strstr(dt_last_error(), bad.c_str()), nullptr) << dt_last_error();
  EXPECT_EQ(dt_dataset_get_sample_at(d, 6, 0, x.data(), &label), DT_ERR_UNSUPPORTED);
  EXPECT_NE(strstr(dt_last_error(), "003.bmp"), nullptr) << dt_last_error();
  dt_dataset_destroy(d);

  cfg.skip_bad_images = 1;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d));
  // Sample 1 (bad) is file 2 (the next good one) with sample 1's draws.
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 1, 3, x.data(), &label));
  EXPECT_EQ(label, 0);
  EXPECT_EQ(dt_image_folder_bad_count(d), 1);
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 1, 3, y.data(), &label));
  EXPECT_EQ(x, y);                             // the same replacement every time
  EXPECT_EQ(dt_image_folder_bad_count(d), 1);  // a file counts once
  // The last sample (the .bmp) wraps around to file 0.
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 6, 0, x.data(), &label));
  EXPECT_EQ(label, 0);
  EXPECT_EQ(dt_image_folder_bad_count(d), 2);
  dt_dataset_destroy(d);
}

// Every batch of an epoch, inputs and labels as bytes.
std::vector<std::vector<uint8_t>> Epoch(const dt_dataset *d, int workers, int64_t epoch,
                                        int64_t first_batch = 0) {
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.seed = 5;
  dt_sampler *s = nullptr;
  EXPECT_EQ(dt_sampler_create(dt_dataset_length(d), &sc, &s), DT_OK);
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = 4;
  lc.workers = workers;
  dt_loader *l = nullptr;
  EXPECT_EQ(dt_loader_create(d, s, &lc, &l), DT_OK);
  EXPECT_EQ(dt_loader_start_epoch_at(l, epoch, first_batch), DT_OK);
  std::vector<std::vector<uint8_t>> out;
  for (;;) {
    dt_tensor *x = nullptr, *y = nullptr;
    EXPECT_EQ(dt_loader_next(l, &x, &y), DT_OK) << dt_last_error();
    if (!x)
      break;
    std::vector<uint8_t> bytes((size_t)dt_tensor_numel(x) * 4 + (size_t)dt_tensor_numel(y) * 4);
    EXPECT_EQ(dt_tensor_to_host(x, bytes.data(), (size_t)dt_tensor_numel(x) * 4), DT_OK);
    EXPECT_EQ(
        dt_tensor_to_host(y, bytes.data() + dt_tensor_numel(x) * 4, (size_t)dt_tensor_numel(y) * 4),
        DT_OK);
    out.push_back(bytes);
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  dt_loader_destroy(l);
  dt_sampler_destroy(s);
  return out;
}

TEST(ImageFolder, LoaderSameForAnyWorkersAndOnResume) {
  std::string root = MakeFolder(3, 7, 20);
  dt_image_folder_config cfg = GreyConfig(10);
  cfg.seed = 11;
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d));
  auto one = Epoch(d, 1, 2);
  ASSERT_EQ(one.size(), 6u);  // 21 samples in batches of 4
  EXPECT_EQ(Epoch(d, 3, 2), one);
  EXPECT_EQ(Epoch(d, 8, 2), one);
  // Resumed at batch 4 of the epoch: the tail of the same epoch.
  auto tail = Epoch(d, 2, 2, 4);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0], one[4]);
  EXPECT_EQ(tail[1], one[5]);
  // Another epoch draws other crops (and another order).
  EXPECT_NE(Epoch(d, 2, 3), one);
  // The draws are the data set's: the same sample in the same epoch is
  // the same, another epoch (almost always) differs.
  std::vector<float> a(100), b(100);
  int32_t la, lb;
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 9, 4, a.data(), &la));
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 9, 4, b.data(), &lb));
  EXPECT_EQ(a, b);
  int differ = 0;
  for (int e = 5; e < 10; e++) {
    ASSERT_DT_OK(dt_dataset_get_sample_at(d, 9, e, b.data(), &lb));
    differ += a != b;
  }
  EXPECT_GE(differ, 4);
  dt_dataset_destroy(d);
}

// The recipes other than resized-crop on square 8 x 8 images of value
// 10 y + x + 1 (never 0): none is the image, flip the image or its mirror,
// pad-crop a shift of up to (8 + 4) / 8 = 1 pixel each way with zeros let
// in, then maybe mirrored; their evaluation is the image itself.
TEST(ImageFolder, AugmentRecipesByHand) {
  const int S = 8;
  std::string root = TempDir();
  for (const char *split : {"train", "val"}) {
    MkDir(root + "/" + split);
    MkDir(root + "/" + split + "/c0");
    dt_image g = Grey(S, S, [](int y, int x) { return (uint8_t)(10 * y + x + 1); });
    EXPECT_EQ(dt_image_write_png((root + "/" + split + "/c0/0.png").c_str(), &g), DT_OK);
    dt_image_free(&g);
  }
  // out == the image shifted by (dy, dx), mirrored first when flip.
  auto shifted = [&](const std::vector<float> &out, int dy, int dx, bool flip) {
    for (int y = 0; y < S; y++)
      for (int x = 0; x < S; x++) {
        int sy = y + dy, sx = x + dx;
        float want = 0.0f;
        if (sy >= 0 && sy < S && sx >= 0 && sx < S)
          want = (10.0f * sy + (flip ? S - 1 - sx : sx) + 1) / 255.0f;
        if (std::fabs(out[y * S + x] - want) > 1e-6f)
          return false;
      }
    return true;
  };
  dt_image_augment parsed;
  for (int r = 0; r <= DT_IMAGE_AUGMENT_NONE; r++) {
    ASSERT_DT_OK(dt_image_augment_parse(dt_image_augment_name((dt_image_augment)r), &parsed));
    EXPECT_EQ(parsed, r);
  }
  EXPECT_EQ(dt_image_augment_parse("cutout", &parsed), DT_ERR_INVALID_ARG);
  EXPECT_NE(strstr(dt_last_error(), "resized-crop|pad-crop|flip|none"), nullptr);
  for (dt_image_augment r :
       {DT_IMAGE_AUGMENT_PAD_CROP, DT_IMAGE_AUGMENT_FLIP, DT_IMAGE_AUGMENT_NONE}) {
    dt_image_folder_config cfg = GreyConfig(S);
    cfg.recipe = r;
    std::vector<float> out(S * S);
    int32_t label;
    dt_dataset *d = nullptr;
    ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d));
    ASSERT_DT_OK(dt_dataset_get_sample_at(d, 0, 3, out.data(), &label));
    EXPECT_TRUE(shifted(out, 0, 0, false)) << "evaluation of " << dt_image_augment_name(r);
    dt_dataset_destroy(d);
    ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d));
    int seen[3][3][2] = {};  // (dy + 1, dx + 1, flip) met over the epochs
    for (int epoch = 0; epoch < 200; epoch++) {
      ASSERT_DT_OK(dt_dataset_get_sample_at(d, 0, epoch, out.data(), &label));
      int found = 0;
      for (int dy = -1; dy <= 1; dy++)
        for (int dx = -1; dx <= 1; dx++)
          for (int flip = 0; flip < 2; flip++)
            if (shifted(out, dy, dx, flip)) {
              seen[dy + 1][dx + 1][flip]++;
              found = 1;
            }
      ASSERT_TRUE(found) << dt_image_augment_name(r) << " epoch " << epoch;
    }
    int shifts = 0, flips = seen[1][1][1];
    for (int dy = 0; dy < 3; dy++)
      for (int dx = 0; dx < 3; dx++)
        shifts += (dy != 1 || dx != 1) && (seen[dy][dx][0] || seen[dy][dx][1]);
    if (r == DT_IMAGE_AUGMENT_PAD_CROP) {
      EXPECT_EQ(shifts, 8) << "every shift of up to one pixel is drawn";
      for (int dy = 0; dy < 3; dy++)
        for (int dx = 0; dx < 3; dx++)
          flips += (dy != 1 || dx != 1) ? seen[dy][dx][1] : 0;
    } else {
      EXPECT_EQ(shifts, 0);
    }
    if (r == DT_IMAGE_AUGMENT_NONE)
      EXPECT_EQ(flips, 0);
    else
      EXPECT_GT(flips, 40) << dt_image_augment_name(r) << " mirrors about half the draws";
    dt_dataset_destroy(d);
  }
  dt_image_folder_config bad = GreyConfig(S);
  bad.recipe = (dt_image_augment)7;
  dt_dataset *d = nullptr;
  EXPECT_EQ(dt_dataset_image_folder(root.c_str(), "train", &bad, &d), DT_ERR_INVALID_ARG);
}

// A grey PNG of w x h whose row y is row_value(y, x), written a row at a
// time (a tall image is never whole in memory).
void WriteGreyPng(const std::string &path, int w, int h,
                  const std::function<uint8_t(int, int)> &v) {
  WritePngRaw(path, w, h, PNG_COLOR_TYPE_GRAY, 8, [&](int y, std::vector<uint8_t> &r) {
    r.resize((size_t)w);
    for (int x = 0; x < w; x++)
      r[(size_t)x] = v(y, x);
  });
}

// Images of extreme aspect ratio, 1 x 65500 and 500,000 x 1 grey ramps
// (well under max_pixels): every recipe, training and evaluation, loads
// them without taking memory in proportion to the resized image (the
// evaluation's resized-crop resizes the 1 x 65500 one to 73 x 4,781,500
// before cutting its centre 64 x 64; the others resized 500,000 rows to
// 64 columns before shrinking them) and the evaluation's centre is the
// ramp's middle. A 1 x 8,400,000 one, whose evaluation resize is wider
// than 2^31 - 1 pixels at 224 px, is a bad file naming it (skipped with
// skip_bad_images), never an allocation failure that ends the run.
TEST(ImageFolder, ExtremeAspectRatiosInBoundedMemoryOrBad) {
  std::string root = TempDir();
  for (const char *split : {"train", "val"}) {
    std::string d = root + "/" + split + "/c0";
    MkDir(root + "/" + split);
    MkDir(d);
    WriteGreyPng(d + "/tall.png", 1, 500000, [](int y, int) { return (uint8_t)(y / 1954); });
    WriteGreyPng(d + "/wide.png", 65500, 1, [](int, int x) { return (uint8_t)(x * 256 / 65500); });
  }
  const int S = 64;
  std::vector<float> x(3 * S * S);
  int32_t label;
  long before = MaxRssKiB();
  for (int r = 0; r <= DT_IMAGE_AUGMENT_NONE; r++)
    for (const char *split : {"train", "val"}) {
      dt_image_folder_config cfg = DT_IMAGE_FOLDER_CONFIG_DEFAULT;  // RGB
      cfg.size = S;
      cfg.recipe = (dt_image_augment)r;
      for (int c = 0; c < 3; c++)
        cfg.mean[c] = 0.0f, cfg.std[c] = 1.0f;
      dt_dataset *d = nullptr;
      ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), split, &cfg, &d));
      for (int64_t i = 0; i < 2; i++) {
        std::string what = std::string(split) + " " + dt_image_folder_file(d, i) + " " +
                           dt_image_augment_name((dt_image_augment)r);
        ASSERT_EQ(dt_dataset_get_sample_at(d, i, 1, x.data(), &label), DT_OK)
            << what << ": " << dt_last_error();
        for (float v : x)
          ASSERT_TRUE(v >= 0.0f && v <= 1.0f + 1e-6f) << what << ": " << v;
        if (r == DT_IMAGE_AUGMENT_RESIZED_CROP && strcmp(split, "val") == 0) {
          for (float v : x)  // the centre of a ramp from 0 to 255
            ASSERT_NEAR(v * 255.0f, 127.5f, 1.0f) << what;
        }
      }
      dt_dataset_destroy(d);
    }
  EXPECT_LT(MaxRssKiB() - before, 100 * 1024) << "KiB grown loading them";

  std::string bad = root + "/val/c0/wider.png";
  WriteGreyPng(bad, 8400000, 1, [](int, int) { return 7; });
  dt_image_folder_config cfg = GreyConfig(224);
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d));
  ASSERT_STREQ(dt_image_folder_file(d, 2), bad.c_str());
  x.resize(224 * 224);
  EXPECT_EQ(dt_dataset_get_sample_at(d, 2, 0, x.data(), &label), DT_ERR_UNSUPPORTED);
  EXPECT_NE(strstr(dt_last_error(), bad.c_str()), nullptr) << dt_last_error();
  EXPECT_NE(strstr(dt_last_error(), "aspect ratio"), nullptr) << dt_last_error();
  dt_dataset_destroy(d);
  cfg.skip_bad_images = 1;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "val", &cfg, &d));
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 2, 0, x.data(), &label));  // file 0 instead
  EXPECT_EQ(dt_image_folder_bad_count(d), 1);
  dt_dataset_destroy(d);
  // Training crops it (its centre 1 x 1, the nearest ratio): no refusal.
  std::string train_bad = root + "/train/c0/wider.png";
  ASSERT_EQ(rename(bad.c_str(), train_bad.c_str()), 0);
  cfg.skip_bad_images = 0;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d));
  ASSERT_DT_OK(dt_dataset_get_sample_at(d, 2, 0, x.data(), &label));
  for (float v : x)
    ASSERT_NEAR(v * 255.0f, 7.0f, 1e-3f);
  dt_dataset_destroy(d);
}

TEST(ImageFolder, LoaderReportsTheBadFile) {
  std::string root = MakeFolder(2, 4);
  WriteBytes(root + "/train/class1/002.png", {'n', 'o', 'p', 'e'});
  dt_image_folder_config cfg = GreyConfig(8);
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_image_folder(root.c_str(), "train", &cfg, &d));
  dt_sampler *s = nullptr;
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  ASSERT_DT_OK(dt_sampler_create(8, &sc, &s));
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = 2;
  lc.workers = 3;
  dt_loader *l = nullptr;
  ASSERT_DT_OK(dt_loader_create(d, s, &lc, &l));
  ASSERT_DT_OK(dt_loader_start_epoch(l, 0));
  dt_status st = DT_OK;
  for (int k = 0; k < 5 && st == DT_OK; k++) {
    dt_tensor *x = nullptr, *y = nullptr;
    st = dt_loader_next(l, &x, &y);
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  EXPECT_EQ(st, DT_ERR_FORMAT);
  EXPECT_NE(strstr(dt_last_error(), "class1/002.png"), nullptr) << dt_last_error();
  dt_loader_destroy(l);
  dt_sampler_destroy(s);
  dt_dataset_destroy(d);
}

}  // namespace
