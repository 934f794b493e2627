// CPU reference backend, convolution / pooling / normalisation kernels of
// dt_cpu_backend() against direct implementations in double (the dense,
// softmax, optimizer and memory kernels are in cpu_kernels_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/device.h"
#include "core/memory.h"
#include "core/rng.h"
#include "core/status.h"
#include "tests/cpu_kernels_test_util.h"

namespace {

using namespace dtk;  // the kernel-test helpers (tests/cpu_kernels_test_util.h)

/* ------------------------------------------------------- conv and pooling */

// Calls f(n, o, oy, ox, c, ki, kj, x index) for every valid (output, tap) pair.
template <typename F>
void for_each_tap(const dt_conv2d_geom &g, int channels_out, F f) {
  for (int n = 0; n < g.n; n++)
    for (int o = 0; o < channels_out; o++)
      for (int oy = 0; oy < g.oh; oy++)
        for (int ox = 0; ox < g.ow; ox++)
          for (int c = 0; c < g.c; c++)
            for (int ki = 0; ki < g.kh; ki++)
              for (int kj = 0; kj < g.kw; kj++) {
                int iy = oy * g.sh - g.ph + ki, ix = ox * g.sw - g.pw + kj;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w)
                  continue;
                f(n, o, oy, ox, c, ki, kj, ((n * g.c + c) * g.h + iy) * g.w + ix);
              }
}

std::vector<dt_conv2d_geom> conv_geoms() {
  return {
      geom(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1),    // 3x3 same
      geom(4, 2, 9, 8, 3, 5, 5, 2, 2, 2, 2),    // stride 2, padding 2
      geom(3, 5, 6, 5, 4, 1, 1, 1, 1, 0, 0),    // pointwise (no im2col)
      geom(5, 2, 8, 7, 3, 3, 2, 2, 1, 1, 0),    // rectangular kernel, mixed stride
      geom(1, 1, 28, 28, 6, 5, 5, 1, 1, 0, 0),  // LeNet conv1, one image
      // stride 1 runs on wide rows (one contiguous im2col run per tap):
      geom(4, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2),   // LeNet conv1, padded, a batch
      geom(5, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0),  // LeNet conv2, a batch
      geom(3, 2, 7, 9, 3, 3, 2, 1, 1, 1, 0),     // rectangular kernel, padding in h only
      geom(2, 3, 5, 4, 4, 1, 1, 1, 1, 1, 1),     // 1x1 kernel with padding
      geom(3, 2, 6, 5, 3, 2, 5, 1, 1, 0, 0),     // kernel as wide as the input (ow 1)
      // the direct kernels' tails: 13 channels (tiles of 6 and 4 rows), rows of
      // 21 and 34 columns, 7 input channels of 6 taps (dot tiles of 6)
      geom(3, 3, 12, 19, 13, 3, 4, 1, 1, 1, 2),
      geom(2, 7, 9, 33, 5, 2, 3, 1, 1, 0, 1),
      // ResNet's deep layers (outputs of <= 64 pixels: a run of images per
      // GEMM, im2col through the tap table): 2x2 (scalar table loops), 4x4
      // (one gather of 16), 3x3 of stride 2 from 5x5
      geom(3, 20, 2, 2, 6, 3, 3, 1, 1, 1, 1),
      geom(2, 9, 4, 4, 5, 3, 3, 1, 1, 1, 1),
      geom(4, 6, 5, 5, 7, 3, 3, 2, 2, 1, 1),
      // the batched GEMMs split along their longer side among the threads:
      // columns (216 of them, cut at multiples of 16 inside an image, on
      // path 0; the others' unpacked kernel takes 216 in four blocks; the
      // weight gradient's 45 too), then rows (40 output channels)
      geom(6, 5, 6, 6, 4, 3, 3, 1, 1, 1, 1),
      geom(2, 3, 2, 2, 40, 3, 3, 1, 1, 1, 1),
      // the unpacked products of a few columns (AVX-512), 1x1 of stride 2
      // (no padding to skip): 64 columns, four whole vectors, a depth of
      // 300 (slices of 128, 128 and 44), 13 rows (blocks of 6 and a last
      // of 1); 100 columns (a block of 64 and one of 36: three vectors,
      // the last masked)
      geom(16, 300, 4, 4, 13, 1, 1, 2, 2, 0, 0),
      geom(25, 4, 4, 4, 9, 1, 1, 2, 2, 0, 0),
      // the small-plane kernels that skip the padding (AVX-512, 8 images
      // or more, a fifth of the taps or more on the padding): 2x2 planes,
      // one block of 16 images; 20 images (a block and 4), stride 2 from
      // 4x4 (the forward: dx at stride 2 stays on the GEMMs); 3x3 planes (pixel groups of 4, 4 and
      // 1) of 5x5 taps; 40 output channels (dx's slices of 16, 16 and 8)
      geom(16, 12, 2, 2, 9, 3, 3, 1, 1, 1, 1),
      geom(20, 7, 4, 4, 13, 3, 3, 2, 2, 1, 1),
      geom(9, 5, 3, 3, 8, 5, 5, 1, 1, 2, 2),
      geom(8, 3, 2, 2, 40, 3, 3, 1, 1, 1, 1),
      // runs of 7 and 3 images: a run's operands are capped at 2^20 floats
      // (Winograd's where it is on: 640 tiles)
      geom(10, 256, 8, 8, 16, 3, 3, 1, 1, 1, 1),
      // Winograd F(2x2, 3x3) (3x3 stride 1, even outputs of >= 4x4, >= 128
      // tiles a thread at 1-3 threads): square; padding 0 and 2; a
      // rectangle; 4 chunks of 12, 12, 12 and 4 images (2^19 floats of V
      // and M each), shared unevenly by 2 and 3 threads
      geom(6, 16, 16, 16, 20, 3, 3, 1, 1, 1, 1),
      geom(12, 17, 18, 10, 16, 3, 3, 1, 1, 0, 0),
      geom(8, 16, 12, 12, 18, 3, 3, 1, 1, 2, 2),
      geom(7, 16, 12, 20, 16, 3, 3, 1, 1, 1, 1),
      geom(40, 96, 8, 8, 64, 3, 3, 1, 1, 1, 1),
  };
}

// The conv tests run with every path allowed (1: the direct AVX-512
// kernels and the unpacked products of a few columns where the CPU has
// them, Winograd where it is faster), with those but not Winograd (2), and
// with every convolution on the im2col + sgemm path (0).
class ConvPaths : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  void SetUp() override {
    saved_threads_ = dt_cpu_num_threads();
    dt_cpu_set_num_threads(std::get<0>(GetParam()));
    int path = std::get<1>(GetParam());
    saved_direct_ = dt_cpu_set_conv_direct(path != 0);
    saved_winograd_ = dt_cpu_set_conv_winograd(path == 1);
    saved_skinny_ = dt_cpu_set_gemm_skinny(path != 0);
  }
  void TearDown() override {
    dt_cpu_set_gemm_skinny(saved_skinny_);
    dt_cpu_set_conv_winograd(saved_winograd_);
    dt_cpu_set_conv_direct(saved_direct_);
    dt_cpu_set_num_threads(saved_threads_);
  }
  int saved_threads_ = 1, saved_direct_ = 1, saved_winograd_ = 1, saved_skinny_ = 1;
};

TEST(CpuConv, DirectKernelsTakeLeNetWhereTheCpuHasAvx512) {
  dt_conv2d_geom conv1 = geom(64, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2);
  dt_conv2d_geom conv2 = geom(64, 6, 14, 14, 16, 5, 5, 1, 1, 0, 0);
  dt_conv2d_geom strided = geom(4, 2, 9, 8, 3, 5, 5, 2, 2, 2, 2);
  dt_conv2d_geom huge = geom(1, 256, 64, 64, 64, 3, 3, 1, 1, 1, 1);
  __builtin_cpu_init();
  int avx512 = __builtin_cpu_supports("avx512f");
  EXPECT_EQ(avx512, dt_cpu_conv_direct_eligible(&conv1));
  EXPECT_EQ(avx512, dt_cpu_conv_direct_eligible(&conv2));
  EXPECT_EQ(0, dt_cpu_conv_direct_eligible(&strided));
  EXPECT_EQ(0, dt_cpu_conv_direct_eligible(&huge)) << "beyond the caches sgemm's blocking wins";
  int saved = dt_cpu_set_conv_direct(0);
  EXPECT_EQ(0, dt_cpu_conv_direct_eligible(&conv2));
  dt_cpu_set_conv_direct(saved);
  if (!avx512)
    GTEST_SKIP() << "this CPU has no AVX-512F: every convolution takes the im2col path";
}

TEST(CpuConv, WinogradTakesResNetsEvenLayersOfEnoughTiles) {
  int saved_threads = dt_cpu_num_threads();
  dt_cpu_set_num_threads(2);
  int saved = dt_cpu_set_conv_winograd(1);
  auto wg = [](dt_conv2d_geom g) { return dt_cpu_conv_winograd_eligible(&g); };
  // ResNet-18 at 64 px, batch 16: layer1 (16x16) and layer2 (8x8, 256 tiles)
  EXPECT_TRUE(wg(geom(16, 64, 16, 16, 64, 3, 3, 1, 1, 1, 1)));
  EXPECT_TRUE(wg(geom(16, 128, 8, 8, 128, 3, 3, 1, 1, 1, 1)));
  // layer3 (4x4: 64 tiles, 32 a thread), odd outputs, stride 2, 5x5, 1x1, few channels
  EXPECT_FALSE(wg(geom(16, 256, 4, 4, 256, 3, 3, 1, 1, 1, 1)));
  EXPECT_FALSE(wg(geom(64, 256, 5, 5, 256, 3, 3, 1, 1, 1, 1)));
  EXPECT_FALSE(wg(geom(64, 64, 16, 16, 128, 3, 3, 2, 2, 1, 1)));
  EXPECT_FALSE(wg(geom(64, 64, 16, 16, 64, 5, 5, 1, 1, 2, 2)));
  EXPECT_FALSE(wg(geom(64, 64, 16, 16, 64, 1, 1, 1, 1, 0, 0)));
  EXPECT_FALSE(wg(geom(64, 3, 16, 16, 64, 3, 3, 1, 1, 1, 1)));
  dt_cpu_set_conv_winograd(0);
  EXPECT_FALSE(wg(geom(16, 64, 16, 16, 64, 3, 3, 1, 1, 1, 1)));
  dt_cpu_set_conv_winograd(saved);
  dt_cpu_set_num_threads(saved_threads);
}

// The small planes' im2col and col2im (2x2 to 8x8 outputs of a run of
// images): the AVX-512 permutes (planes of <= 32 floats) and gathers copy
// and add exactly what the scalar loops do, so every result is the same
// bit for bit with them switched off.
TEST(CpuConv, SmallPlaneTablesMatchTheScalarLoopsBitForBit) {
  int saved_wg = dt_cpu_set_conv_winograd(0);
  int saved_skinny = dt_cpu_set_gemm_skinny(0); /* sgemm's products on both sides */
  const dt_conv2d_geom geoms[] = {
      geom(3, 20, 2, 2, 6, 3, 3, 1, 1, 1, 1), geom(4, 9, 3, 3, 5, 3, 3, 1, 1, 1, 1),
      geom(2, 9, 4, 4, 5, 3, 3, 1, 1, 1, 1),  geom(3, 7, 5, 5, 6, 3, 3, 1, 1, 1, 1),
      geom(4, 6, 5, 5, 7, 3, 3, 2, 2, 1, 1),  geom(2, 5, 8, 4, 3, 3, 3, 1, 1, 1, 1),
      geom(3, 4, 8, 8, 5, 3, 3, 1, 1, 1, 1),  geom(2, 3, 6, 5, 4, 5, 5, 1, 1, 2, 2),
  };
  for (const dt_conv2d_geom &g : geoms) {
    size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.oc * g.c * g.kh * g.kw;
    size_t ny = (size_t)g.n * g.oc * g.oh * g.ow;
    Vec x = randn(nx, 30), w = randn(nw, 31), dy = randn(ny, 32);
    Vec y[2], dx[2], dw[2];
    for (int simd = 0; simd < 2; simd++) {
      int saved = dt_cpu_set_conv_direct(simd);
      y[simd].assign(ny, NAN), dx[simd].assign(nx, NAN), dw[simd].assign(nw, NAN);
      EXPECT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &g, x.data(), w.data(), nullptr,
                                                y[simd].data(), nullptr));
      EXPECT_EQ(DT_OK,
                dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                          dx[simd].data(), dw[simd].data(), nullptr, nullptr));
      dt_cpu_set_conv_direct(saved);
    }
    std::string shape = std::to_string(g.c) + "x" + std::to_string(g.h) + "x" +
                        std::to_string(g.w) + " stride " + std::to_string(g.sh);
    EXPECT_EQ(0, memcmp(y[0].data(), y[1].data(), ny * sizeof(float))) << "y, " << shape;
    EXPECT_EQ(0, memcmp(dx[0].data(), dx[1].data(), nx * sizeof(float))) << "dx, " << shape;
    EXPECT_EQ(0, memcmp(dw[0].data(), dw[1].data(), nw * sizeof(float))) << "dw, " << shape;
  }
  dt_cpu_set_gemm_skinny(saved_skinny);
  dt_cpu_set_conv_winograd(saved_wg);
}

// The unpacked products and the small-plane kernels split their rows
// among the threads and sum each element in one order: y and dx are the
// same bits at 1, 2 and 3 threads (ResNet-18's 512-channel 2x2 layer at
// batch 16 and 25 images of 2x2 on the small-plane kernels; 1x1 of stride
// 2 on the unpacked products).
TEST(CpuConv, UnpackedProductsAreTheSameBitsAtEveryThreadCount) {
  int saved_threads = dt_cpu_num_threads();
  const dt_conv2d_geom geoms[] = {geom(16, 512, 2, 2, 512, 3, 3, 1, 1, 1, 1),
                                  geom(25, 4, 2, 2, 9, 3, 3, 1, 1, 1, 1),
                                  geom(16, 300, 4, 4, 13, 1, 1, 2, 2, 0, 0)};
  for (const dt_conv2d_geom &g : geoms) {
    size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.oc * g.c * g.kh * g.kw;
    size_t ny = (size_t)g.n * g.oc * g.oh * g.ow;
    Vec x = randn(nx, 40), w = randn(nw, 41), dy = randn(ny, 42);
    Vec y[3], dx[3];
    for (int t = 0; t < 3; t++) {
      dt_cpu_set_num_threads(t + 1);
      y[t].assign(ny, NAN), dx[t].assign(nx, NAN);
      ASSERT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &g, x.data(), w.data(), nullptr,
                                                y[t].data(), nullptr));
      ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                                 dx[t].data(), nullptr, nullptr, nullptr));
    }
    for (int t = 1; t < 3; t++) {
      EXPECT_EQ(0, memcmp(y[0].data(), y[t].data(), ny * sizeof(float))) << t + 1 << " threads";
      EXPECT_EQ(0, memcmp(dx[0].data(), dx[t].data(), nx * sizeof(float))) << t + 1 << " threads";
    }
  }
  dt_cpu_set_num_threads(saved_threads);
}

// A batch beyond one run of the small-plane kernels' buffers (16 MB of
// vectors: 65,536 images of 8 channels at 2x2) runs in several; each
// image's y and dx are the same bits as in a batch of its half.
TEST(CpuConv, SmallPlaneRunsSplitALargeBatchByImage) {
  const int n = 65600, half = n / 2;
  dt_conv2d_geom g = geom(n, 8, 2, 2, 8, 3, 3, 1, 1, 1, 1),
                 gh = geom(half, 8, 2, 2, 8, 3, 3, 1, 1, 1, 1);
  size_t nx = (size_t)n * 8 * 4, nw = 8 * 8 * 9;
  Vec x = randn(nx, 50), w = randn(nw, 51), dy = randn(nx, 52), y(nx, NAN), dx(nx, NAN);
  Vec yh(nx, NAN), dxh(nx, NAN);
  ASSERT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &g, x.data(), w.data(), nullptr, y.data(),
                                            nullptr));
  ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                             dx.data(), nullptr, nullptr, nullptr));
  for (int h = 0; h < 2; h++) {
    size_t off = (size_t)h * nx / 2;
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &gh, x.data() + off, w.data(), nullptr,
                                              yh.data() + off, nullptr));
    ASSERT_EQ(DT_OK,
              dt_kernel_conv2d_backward(cpu_exec(), &gh, x.data() + off, w.data(), dy.data() + off,
                                        dxh.data() + off, nullptr, nullptr, nullptr));
  }
  EXPECT_EQ(0, memcmp(y.data(), yh.data(), nx * sizeof(float)));
  EXPECT_EQ(0, memcmp(dx.data(), dxh.data(), nx * sizeof(float)));
  // and agree with the im2col path to rounding
  int saved = dt_cpu_set_gemm_skinny(0);
  Vec y0(nx, NAN);
  ASSERT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &g, x.data(), w.data(), nullptr, y0.data(),
                                            nullptr));
  dt_cpu_set_gemm_skinny(saved);
  std::vector<double> want(y0.begin(), y0.end());
  expect_close(y, want, 1e-5, 1e-5, "small-plane runs against im2col");
}

TEST_P(ConvPaths, Conv2dForwardVsDirect) {
  for (const dt_conv2d_geom &g : conv_geoms()) {
    size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.oc * g.c * g.kh * g.kw;
    size_t ny = (size_t)g.n * g.oc * g.oh * g.ow;
    Vec x = randn(nx, 20), w = randn(nw, 21), b = randn(g.oc, 22), y(ny, NAN);
    size_t ws = 1;
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_workspace(cpu_exec(), &g, &ws));
    ASSERT_EQ(0u, ws);
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &g, x.data(), w.data(), b.data(),
                                              y.data(), nullptr))
        << dt_last_error();
    std::vector<double> want(ny);
    for (int n = 0; n < g.n; n++)
      for (int o = 0; o < g.oc; o++)
        for (int i = 0; i < g.oh * g.ow; i++)
          want[(size_t)(n * g.oc + o) * g.oh * g.ow + i] = b[o];
    for_each_tap(g, g.oc, [&](int n, int o, int oy, int ox, int c, int ki, int kj, int xi) {
      want[((size_t)(n * g.oc + o) * g.oh + oy) * g.ow + ox] +=
          (double)x[xi] * w[((o * g.c + c) * g.kh + ki) * g.kw + kj];
    });
    // sums of c*kh*kw float products: their rounding grows with the depth
    double atol = 1e-5 * std::max(1.0, g.c * g.kh * g.kw / 256.0);
    expect_close(y, want, atol, 1e-5, "conv2d forward");
  }
}

TEST_P(ConvPaths, Conv2dBackwardVsNaive) {
  for (const dt_conv2d_geom &g : conv_geoms()) {
    size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.oc * g.c * g.kh * g.kw;
    size_t ny = (size_t)g.n * g.oc * g.oh * g.ow;
    Vec x = randn(nx, 23), w = randn(nw, 24), dy = randn(ny, 25);
    Vec dx(nx, NAN), dw(nw, NAN), db(g.oc, NAN);
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                               dx.data(), dw.data(), db.data(), nullptr))
        << dt_last_error();
    std::vector<double> wdx(nx, 0.0), wdw(nw, 0.0), wdb(g.oc, 0.0);
    for_each_tap(g, g.oc, [&](int n, int o, int oy, int ox, int c, int ki, int kj, int xi) {
      double gy = dy[((size_t)(n * g.oc + o) * g.oh + oy) * g.ow + ox];
      int wi = ((o * g.c + c) * g.kh + ki) * g.kw + kj;
      wdx[xi] += gy * w[wi];
      wdw[wi] += gy * x[xi];
    });
    for (int n = 0; n < g.n; n++)
      for (int o = 0; o < g.oc; o++)
        for (int i = 0; i < g.oh * g.ow; i++)
          wdb[o] += dy[(size_t)(n * g.oc + o) * g.oh * g.ow + i];
    expect_close(dx, wdx, 1e-5, 1e-5, "conv2d dx");
    expect_close(dw, wdw, 1e-4, 1e-5, "conv2d dw");
    expect_close(db, wdb, 1e-5, 1e-5, "conv2d db");
    // each output is optional
    Vec dw2(nw, NAN);
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                               nullptr, dw2.data(), nullptr, nullptr));
    expect_close(dw2, wdw, 1e-4, 1e-5, "conv2d dw only");
    Vec dx2(nx, NAN);
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                               dx2.data(), nullptr, nullptr, nullptr));
    expect_close(dx2, wdx, 1e-5, 1e-5, "conv2d dx only");
    // conv2d_backward_acc adds dw into what dw holds (the weight's .grad),
    // its other outputs as conv2d_backward's; with dw zeroed, the same bits
    Vec prior = randn(nw, 26), dw3 = prior, dx3(nx, NAN), zero(nw, 0.0f);
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward_acc(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                                   dx3.data(), dw3.data(), nullptr, nullptr))
        << dt_last_error();
    std::vector<double> wacc(nw);
    for (size_t i = 0; i < nw; i++)
      wacc[i] = prior[i] + wdw[i];
    expect_close(dw3, wacc, 1e-4, 1e-5, "conv2d_backward_acc dw");
    expect_close(dx3, wdx, 1e-5, 1e-5, "conv2d_backward_acc dx");
    ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward_acc(cpu_exec(), &g, x.data(), w.data(), dy.data(),
                                                   nullptr, zero.data(), nullptr, nullptr));
    EXPECT_EQ(0, memcmp(zero.data(), dw2.data(), nw * sizeof(float)))
        << "conv2d_backward_acc into zeros != conv2d_backward";
  }
}

TEST(CpuConv, FiniteDifferenceAndBadGeometry) {
  // d/dx of L = sum(r * conv(x)) by central differences, stride 2 padding 1
  dt_conv2d_geom g = geom(1, 2, 5, 5, 2, 3, 3, 2, 2, 1, 1);
  size_t nx = 50, nw = 36, ny = (size_t)2 * g.oh * g.ow;
  Vec x = randn(nx, 26), w = randn(nw, 27), r = randn(ny, 28), y(ny), dx(nx), dw(nw);
  ASSERT_EQ(DT_OK, dt_kernel_conv2d_backward(cpu_exec(), &g, x.data(), w.data(), r.data(),
                                             dx.data(), dw.data(), nullptr, nullptr));
  auto loss = [&](const Vec &xx, const Vec &ww) {
    EXPECT_EQ(DT_OK, dt_kernel_conv2d_forward(cpu_exec(), &g, xx.data(), ww.data(), nullptr,
                                              y.data(), nullptr));
    double s = 0;
    for (size_t i = 0; i < ny; i++)
      s += (double)r[i] * y[i];
    return s;
  };
  const float h = 1e-2f;
  for (size_t i = 0; i < nx; i += 7) {
    Vec xp = x, xm = x;
    xp[i] += h, xm[i] -= h;
    EXPECT_NEAR(dx[i], (loss(xp, w) - loss(xm, w)) / (2 * h), 2e-3) << "dx " << i;
  }
  for (size_t i = 0; i < nw; i += 5) {
    Vec wp = w, wm = w;
    wp[i] += h, wm[i] -= h;
    EXPECT_NEAR(dw[i], (loss(x, wp) - loss(x, wm)) / (2 * h), 2e-3) << "dw " << i;
  }
  dt_conv2d_geom bad = g;
  bad.oh += 1;
  EXPECT_EQ(DT_ERR_SHAPE, dt_kernel_conv2d_forward(cpu_exec(), &bad, x.data(), w.data(), nullptr,
                                                   y.data(), nullptr));
}

TEST_P(ConvPaths, MaxPoolForwardBackward) {
  for (dt_conv2d_geom g :
       {geom(2, 3, 8, 8, 0, 2, 2, 2, 2, 0, 0), geom(1, 2, 7, 6, 0, 3, 3, 2, 2, 1, 1),
        geom(2, 1, 5, 5, 0, 3, 2, 1, 2, 1, 1)}) {
    size_t nx = (size_t)g.n * g.c * g.h * g.w, ny = (size_t)g.n * g.c * g.oh * g.ow;
    Vec x = randn(nx, 29), y(ny), dy = randn(ny, 30), dx(nx, NAN);
    std::vector<int32_t> am(ny);
    ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_forward(cpu_exec(), &g, x.data(), y.data(), am.data()))
        << dt_last_error();
    std::vector<double> wdx(nx, 0.0);
    for (int p = 0; p < g.n * g.c; p++)
      for (int oy = 0; oy < g.oh; oy++)
        for (int ox = 0; ox < g.ow; ox++) {
          float best = -INFINITY;
          int at = -1;
          for (int ki = 0; ki < g.kh; ki++)
            for (int kj = 0; kj < g.kw; kj++) {
              int iy = oy * g.sh - g.ph + ki, ix = ox * g.sw - g.pw + kj;
              if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w)
                continue;
              if (x[(size_t)p * g.h * g.w + iy * g.w + ix] > best)
                best = x[(size_t)p * g.h * g.w + iy * g.w + ix], at = iy * g.w + ix;
            }
          size_t o = ((size_t)p * g.oh + oy) * g.ow + ox;
          ASSERT_EQ(y[o], best);
          ASSERT_EQ(am[o], at);
          wdx[(size_t)p * g.h * g.w + at] += dy[o];
        }
    ASSERT_EQ(DT_OK,
              dt_kernel_max_pool2d_backward(cpu_exec(), &g, dy.data(), am.data(), dx.data()));
    expect_close(dx, wdx, 1e-6, 0, "maxpool dx");
  }
}

// The 2x2 stride-2 window has its own branch-free loop, other windows a
// row-by-row one (scalar, or 16 outputs per step on AVX-512; the second
// parameter switches the AVX-512 path off): each picks the general scan's winner (the first maximum
// in scan order; the first NaN wins), odd sizes drop the last row and column, and argmax may be
// NULL. The 3x3 stride-2 padded window is ResNet's stem pool; 301 columns give rows of 151 outputs,
// more than one chunk.
TEST_P(ConvPaths, MaxPoolTiesNanAndOddSizes) {
  for (dt_conv2d_geom g :
       {geom(2, 3, 7, 9, 0, 2, 2, 2, 2, 0, 0), geom(2, 2, 7, 301, 0, 3, 3, 2, 2, 1, 1)}) {
    size_t nx = (size_t)g.n * g.c * g.h * g.w, ny = (size_t)g.n * g.c * g.oh * g.ow;
    Vec x = randn(nx, 33);
    for (size_t i = 0; i < nx; i++)  // many ties
      x[i] = std::round(x[i] * 2.0f) / 2.0f;
    x[0] = x[1] = x[g.w] = x[g.w + 1] = -INFINITY;  // a window of -inf: its first entry
    if (g.kh == 3)
      x[2] = x[g.w + 2] = -INFINITY;
    x[2 * g.w + 3] = NAN;  // window (1, 1): NaN in the second slot...
    x[3 * g.w + 3] = NAN;  // ...and another NaN after it
    x[g.h * g.w + 4] = NAN;
    x[g.h * g.w + g.w + 7] = INFINITY;
    Vec y(ny), y2(ny);
    std::vector<int32_t> am(ny);
    ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_forward(cpu_exec(), &g, x.data(), y.data(), am.data()));
    ASSERT_EQ(DT_OK, dt_kernel_max_pool2d_forward(cpu_exec(), &g, x.data(), y2.data(), nullptr));
    for (int p = 0; p < g.n * g.c; p++)
      for (int oy = 0; oy < g.oh; oy++)
        for (int ox = 0; ox < g.ow; ox++) {
          int y0 = std::max(oy * g.sh - g.ph, 0), x0 = std::max(ox * g.sw - g.pw, 0);
          int y1 = std::min(oy * g.sh - g.ph + g.kh, g.h),
              x1 = std::min(ox * g.sw - g.pw + g.kw, g.w);
          float best = -INFINITY;
          int at = y0 * g.w + x0;
          for (int iy = y0; iy < y1 && !std::isnan(best); iy++)
            for (int ix = x0; ix < x1; ix++) {
              int i = iy * g.w + ix;
              float v = x[(size_t)p * g.h * g.w + i];
              if (v > best || std::isnan(v)) {
                best = v, at = i;
                if (std::isnan(v))
                  break;
              }
            }
          size_t o = ((size_t)p * g.oh + oy) * g.ow + ox;
          if (std::isnan(best)) {
            ASSERT_TRUE(std::isnan(y[o]) && std::isnan(y2[o])) << o;
          } else {
            ASSERT_EQ(y[o], best) << o;
            ASSERT_EQ(y2[o], best) << o;
          }
          ASSERT_EQ(am[o], at) << o;
        }
    EXPECT_EQ(am[0], 0);  // the -inf window
  }
}

TEST(CpuPool, AvgPoolCountsPaddingInDivisor) {
  // 1x1x3x3 input 1..9, kernel 3, stride 1, padding 1 -> corner = (1+2+4+5)/9
  dt_conv2d_geom g = geom(1, 1, 3, 3, 0, 3, 3, 1, 1, 1, 1);
  Vec x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y(9), dx(9);
  ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_forward(cpu_exec(), &g, x.data(), y.data()));
  EXPECT_FLOAT_EQ(y[0], 12.0f / 9);
  EXPECT_FLOAT_EQ(y[4], 45.0f / 9);
  EXPECT_FLOAT_EQ(y[8], (5 + 6 + 8 + 9) / 9.0f);
  Vec dy(9, 9.0f);
  ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_backward(cpu_exec(), &g, dy.data(), dx.data()));
  // each input gets 1 from every window covering it: corner 4, edge 6, centre 9
  EXPECT_EQ(dx, (Vec{4, 6, 4, 6, 9, 6, 4, 6, 4}));
  // adjointness on a strided geometry: <avgpool(x), r> == <x, avgpool^T(r)>
  dt_conv2d_geom g2 = geom(2, 3, 9, 8, 0, 3, 3, 2, 2, 1, 1);
  size_t nx = (size_t)2 * 3 * 9 * 8, ny = (size_t)2 * 3 * g2.oh * g2.ow;
  Vec x2 = randn(nx, 31), y2(ny), r = randn(ny, 32), dx2(nx);
  ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_forward(cpu_exec(), &g2, x2.data(), y2.data()));
  ASSERT_EQ(DT_OK, dt_kernel_avg_pool2d_backward(cpu_exec(), &g2, r.data(), dx2.data()));
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < ny; i++)
    lhs += (double)y2[i] * r[i];
  for (size_t i = 0; i < nx; i++)
    rhs += (double)x2[i] * dx2[i];
  EXPECT_NEAR(lhs, rhs, 1e-4);
}

/* ---------------------------------------------------------- normalisation */

TEST_P(ThreadCounts, BatchNormTrainingStatsRunningAndBackward) {
  const int64_t n = 4, c = 3, hw = 5, cnt = n * hw;
  Vec x = randn(n * c * hw, 33, -2.0f, 3.0f), gamma = {1.0f, 2.0f, -0.5f},
      beta = {0.0f, 1.0f, 2.0f};
  Vec rm = {0.5f, 0.0f, -1.0f}, rv = {1.0f, 2.0f, 0.5f}, rm0 = rm, rv0 = rv;
  Vec y(x.size()), mean(c), invstd(c);
  const float mom = 0.1f, eps = 1e-5f;
  ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_forward(
                       cpu_exec(), x.data(), y.data(), DT_DTYPE_F32, gamma.data(), beta.data(),
                       rm.data(), rv.data(), mean.data(), invstd.data(), n, c, hw, 1, mom, eps))
      << dt_last_error();
  std::vector<double> wy(x.size()), mu(c), var(c);
  for (int64_t ci = 0; ci < c; ci++) {
    double s = 0, ss = 0;
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t i = 0; i < hw; i++)
        s += x[(ni * c + ci) * hw + i];
    mu[ci] = s / cnt;
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t i = 0; i < hw; i++) {
        double d = x[(ni * c + ci) * hw + i] - mu[ci];
        ss += d * d;
      }
    var[ci] = ss / cnt;  // biased, for normalising
    EXPECT_NEAR(mean[ci], mu[ci], 1e-6);
    EXPECT_NEAR(invstd[ci], 1 / std::sqrt(var[ci] + eps), 1e-5);
    EXPECT_NEAR(rm[ci], 0.9 * rm0[ci] + 0.1 * mu[ci], 1e-6);
    EXPECT_NEAR(rv[ci], 0.9 * rv0[ci] + 0.1 * var[ci] * cnt / (cnt - 1), 1e-6);  // unbiased
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t i = 0; i < hw; i++) {
        int64_t k = (ni * c + ci) * hw + i;
        wy[k] = (x[k] - mu[ci]) / std::sqrt(var[ci] + eps) * gamma[ci] + beta[ci];
      }
  }
  expect_close(y, wy, 1e-5, 1e-5, "batchnorm y");

  // backward vs the closed form in double
  Vec dy = randn(x.size(), 34), dx(x.size()), dg(c, NAN), dbt(c, NAN);
  ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_backward(
                       cpu_exec(), x.data(), dy.data(), DT_DTYPE_F32, gamma.data(), mean.data(),
                       invstd.data(), dx.data(), dg.data(), dbt.data(), n, c, hw, eps));
  std::vector<double> wdx(x.size()), wdg(c), wdb(c);
  for (int64_t ci = 0; ci < c; ci++) {
    double is = 1 / std::sqrt(var[ci] + eps), sdy = 0, sdyx = 0;
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t i = 0; i < hw; i++) {
        int64_t k = (ni * c + ci) * hw + i;
        sdy += dy[k];
        sdyx += dy[k] * (x[k] - mu[ci]) * is;
      }
    wdg[ci] = sdyx, wdb[ci] = sdy;
    for (int64_t ni = 0; ni < n; ni++)
      for (int64_t i = 0; i < hw; i++) {
        int64_t k = (ni * c + ci) * hw + i;
        double xh = (x[k] - mu[ci]) * is;
        wdx[k] = gamma[ci] * is / cnt * (cnt * dy[k] - sdy - xh * sdyx);
      }
  }
  expect_close(dx, wdx, 1e-5, 1e-4, "batchnorm dx");
  expect_close(dg, wdg, 1e-5, 1e-5, "batchnorm dgamma (overwritten)");
  expect_close(dbt, wdb, 1e-5, 1e-5, "batchnorm dbeta (overwritten)");

  // eval mode uses the running statistics and leaves them alone
  Vec rm1 = rm, rv1 = rv;
  ASSERT_EQ(DT_OK, dt_kernel_batch_norm2d_forward(
                       cpu_exec(), x.data(), y.data(), DT_DTYPE_F32, gamma.data(), beta.data(),
                       rm.data(), rv.data(), mean.data(), invstd.data(), n, c, hw, 0, mom, eps));
  EXPECT_EQ(rm, rm1);
  EXPECT_EQ(rv, rv1);
  EXPECT_NEAR(y[0], (x[0] - rm[0]) / std::sqrt(rv[0] + eps) * gamma[0] + beta[0], 1e-5);
  // one value per channel cannot be normalised in training
  EXPECT_EQ(DT_ERR_INVALID_ARG,
            dt_kernel_batch_norm2d_forward(cpu_exec(), x.data(), y.data(), DT_DTYPE_F32,
                                           gamma.data(), beta.data(), rm.data(), rv.data(),
                                           mean.data(), invstd.data(), 1, c, 1, 1, mom, eps));
}

TEST_P(ThreadCounts, LayerNormForwardBackwardAccumulates) {
  const int64_t rows = 300, cols = 260;  // cols > one column block
  const float eps = 1e-5f;
  Vec x = randn(rows * cols, 35, -2, 2), gamma = randn(cols, 36), beta = randn(cols, 37);
  Vec y(x.size()), mean(rows), rstd(rows);
  ASSERT_EQ(DT_OK,
            dt_kernel_layer_norm_forward(cpu_exec(), x.data(), gamma.data(), beta.data(), y.data(),
                                         DT_DTYPE_F32, mean.data(), rstd.data(), rows, cols, eps));
  Vec dy = randn(x.size(), 38), dx(x.size()), dg(cols, 1.0f), db(cols, 2.0f);
  ASSERT_EQ(DT_OK, dt_kernel_layer_norm_backward(cpu_exec(), x.data(), gamma.data(), mean.data(),
                                                 rstd.data(), dy.data(), DT_DTYPE_F32, dx.data(),
                                                 dg.data(), db.data(), rows, cols));
  std::vector<double> wy(x.size()), wdx(x.size()), wdg(cols, 1.0), wdb(cols, 2.0);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = &x[r * cols], *gr = &dy[r * cols];
    double s = 0, ss = 0;
    for (int64_t j = 0; j < cols; j++)
      s += xr[j];
    double m = s / cols;
    for (int64_t j = 0; j < cols; j++)
      ss += (xr[j] - m) * (xr[j] - m);
    double rs = 1 / std::sqrt(ss / cols + eps), a = 0, b = 0;
    ASSERT_NEAR(mean[r], m, 1e-6);
    ASSERT_NEAR(rstd[r], rs, 1e-5 * rs);
    for (int64_t j = 0; j < cols; j++) {
      double xh = (xr[j] - m) * rs;
      wy[r * cols + j] = xh * gamma[j] + beta[j];
      a += gr[j] * gamma[j];
      b += gr[j] * gamma[j] * xh;
      wdg[j] += gr[j] * xh;
      wdb[j] += gr[j];
    }
    for (int64_t j = 0; j < cols; j++) {
      double xh = (xr[j] - m) * rs;
      wdx[r * cols + j] = rs * (gr[j] * gamma[j] - a / cols - xh * b / cols);
    }
  }
  expect_close(y, wy, 1e-5, 1e-5, "layernorm y");
  expect_close(dx, wdx, 1e-5, 1e-4, "layernorm dx");
  expect_close(dg, wdg, 1e-4, 1e-5, "layernorm dgamma (+=)");
  expect_close(db, wdb, 1e-4, 1e-5, "layernorm dbeta (+=)");
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadCounts, ::testing::Values(1, 2, 3));
INSTANTIATE_TEST_SUITE_P(ThreadsAndPaths, ConvPaths,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(1, 2, 0)));

}  // namespace
