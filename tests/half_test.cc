// core/half.h: f32 <-> f16/bf16, scalar and array, nearest-even and
// stochastic rounding.
#include "core/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "tests/dt_assert.h"

namespace {

float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float widen(dt_dtype t, uint16_t h) {
  return t == DT_DTYPE_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
}
uint16_t narrow(dt_dtype t, float f) {
  return t == DT_DTYPE_F16 ? dt_f32_to_f16(f) : dt_f32_to_bf16(f);
}

const dt_dtype kHalves[] = {DT_DTYPE_F16, DT_DTYPE_BF16};

TEST(Half, EveryCodeRoundTrips) {
  for (dt_dtype t : kHalves)
    for (uint32_t c = 0; c < 65536; c++) {
      float v = widen(t, (uint16_t)c);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(widen(t, narrow(t, v)))) << c;
        continue;
      }
      ASSERT_EQ(narrow(t, v), (uint16_t)c) << dt_dtype_name(t) << " code " << c;
    }
}

TEST(Half, RoundsToNearestEven) {
  for (dt_dtype t : kHalves)
    for (uint32_t c = 0; c < 65535; c++) {
      float a = widen(t, (uint16_t)c), b = widen(t, (uint16_t)(c + 1));
      if (!std::isfinite(a) || !std::isfinite(b) || ((c + 1) & 0x7fffu) == 0)
        continue;  // Inf/NaN neighbours, or the sign boundary
      double mid = ((double)a + (double)b) / 2;
      float m = (float)mid;
      if ((double)m != mid)
        continue;  // the midpoint is not an f32 (never for these formats)
      uint16_t even = (c & 1u) ? (uint16_t)(c + 1) : (uint16_t)c;
      ASSERT_EQ(narrow(t, m), even) << dt_dtype_name(t) << " tie after code " << c;
      ASSERT_EQ(narrow(t, std::nextafter(m, a)), (uint16_t)c);
      ASSERT_EQ(narrow(t, std::nextafter(m, b)), (uint16_t)(c + 1));
    }
}

TEST(Half, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(dt_f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(dt_f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(dt_f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(dt_f32_to_bf16(-inf), 0xff80);
  EXPECT_EQ(dt_f32_to_f16(65504.0f), 0x7bff);  // largest finite f16
  EXPECT_EQ(dt_f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(dt_f32_to_f16(65520.0f), 0x7c00);               // rounds to Inf
  EXPECT_EQ(dt_f32_to_f16(1e-8f), 0x0000);                  // below half the smallest subnormal
  EXPECT_EQ(dt_f32_to_f16(bits_f32(0x33000000u)), 0x0000);  // 2^-25: tie to even 0
  EXPECT_EQ(dt_f32_to_f16(bits_f32(0x33800000u)), 0x0001);  // 2^-24: smallest subnormal
  EXPECT_EQ(dt_f32_to_f16(bits_f32(0x33c00000u)), 0x0002);  // 1.5 * 2^-24: tie to even 2
  EXPECT_EQ(dt_f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(dt_f32_to_bf16(bits_f32(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to Inf
  // NaN stays NaN (quiet, sign kept), also a signalling one whose payload
  // would truncate to an Inf pattern
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u};
  for (uint32_t n : nans) {
    float f = bits_f32(n);
    EXPECT_TRUE(std::isnan(dt_f16_to_f32(dt_f32_to_f16(f)))) << std::hex << n;
    EXPECT_TRUE(std::isnan(dt_bf16_to_f32(dt_f32_to_bf16(f)))) << std::hex << n;
    EXPECT_EQ(dt_f32_to_bf16(f) >> 15, n >> 31);
    EXPECT_EQ(dt_f32_to_f16(f) >> 15, n >> 31);
  }
}

TEST(Half, ArraysEqualScalars) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); i++)
    x[i] = (dt_rng_uniform(7, i) - 0.5f) * 1e5f * dt_rng_uniform(8, i);
  x[3] = std::numeric_limits<float>::infinity();
  x[4] = std::nanf("");
  for (dt_dtype t : kHalves) {
    std::vector<uint16_t> h(x.size());
    std::vector<float> back(x.size());
    ASSERT_DT_OK(dt_half_from_f32(t, x.data(), h.data(), (int64_t)x.size()));
    ASSERT_DT_OK(dt_half_to_f32(t, h.data(), back.data(), (int64_t)x.size()));
    for (size_t i = 0; i < x.size(); i++) {
      ASSERT_EQ(h[i], narrow(t, x[i])) << i;
      float w = widen(t, h[i]);
      if (!std::isnan(w)) {
        ASSERT_EQ(back[i], w) << i;
      }
    }
  }
}

TEST(Half, BadArguments) {
  float f = 1.0f;
  uint16_t h = 0;
  EXPECT_EQ(dt_half_from_f32(DT_DTYPE_F32, &f, &h, 1), DT_ERR_DTYPE);
  EXPECT_NE(std::string(dt_last_error()).find("not a 16-bit float"), std::string::npos);
  EXPECT_EQ(dt_half_to_f32(DT_DTYPE_I32, &h, &f, 1), DT_ERR_DTYPE);
  EXPECT_EQ(dt_half_from_f32(DT_DTYPE_BF16, nullptr, &h, 1), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_half_from_f32_stochastic(DT_DTYPE_F16, &f, &h, -1, 0, 0), DT_ERR_INVALID_ARG);
  EXPECT_EQ(DT_OK, dt_half_from_f32(DT_DTYPE_BF16, nullptr, nullptr, 0));
  EXPECT_EQ(dt_dtype_is_half(DT_DTYPE_F16), 1);
  EXPECT_EQ(dt_dtype_is_half(DT_DTYPE_BF16), 1);
  EXPECT_EQ(dt_dtype_is_half(DT_DTYPE_F32), 0);
}

// Stochastic rounding picks one of the two neighbours, the mean is x, and
// representable values, Inf and NaN are left alone.
TEST(Half, StochasticRoundingIsUnbiased) {
  const int n = 200000;
  const float xs[] = {1.0f + 1.0f / 3.0f, -0.1f, 3e-6f, 1000.7f};
  for (dt_dtype t : kHalves)
    for (float x : xs) {
      std::vector<float> in(n, x);
      std::vector<uint16_t> out(n);
      ASSERT_DT_OK(dt_half_from_f32_stochastic(t, in.data(), out.data(), n, 42, 0));
      uint16_t near = narrow(t, x);
      float vnear = widen(t, near);
      double sum = 0, lo = vnear, hi = vnear;
      for (uint16_t h : out) {
        float v = widen(t, h);
        sum += v;
        lo = std::min(lo, (double)v);
        hi = std::max(hi, (double)v);
        ASSERT_LE(std::abs((int)h - (int)near), 1);
      }
      double gap = hi - lo;
      ASSERT_GT(gap, 0.0) << "both neighbours are drawn for " << x;
      // the standard error of the mean is at most gap / (2 sqrt(n))
      EXPECT_NEAR(sum / n, (double)x, 5 * gap / (2 * std::sqrt((double)n)))
          << dt_dtype_name(t) << " " << x;
    }
  for (dt_dtype t : kHalves) {
    const float fixed[] = {0.5f, -2.0f, 0.0f, std::numeric_limits<float>::infinity()};
    for (float x : fixed)
      for (int i = 0; i < 64; i++)
        ASSERT_EQ(dt_f32_to_half_stochastic(t, x, dt_rng_uniform(1, i)), narrow(t, x)) << x;
    EXPECT_TRUE(std::isnan(widen(t, dt_f32_to_half_stochastic(t, std::nanf(""), 0.0f))));
  }
  // f16 beyond its range is Inf, and just below Inf's threshold it never
  // rounds up to Inf
  EXPECT_EQ(dt_f32_to_half_stochastic(DT_DTYPE_F16, 1e30f, 0.0f), 0x7c00);
  for (int i = 0; i < 64; i++)
    ASSERT_EQ(dt_f32_to_half_stochastic(DT_DTYPE_F16, 65510.0f, dt_rng_uniform(3, i)), 0x7bff);
}

// ---- the vector paths: every instruction set this CPU runs, forced one
// at a time, gives the scalar functions' bits for every input class ----

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Restores the instruction set a test found.
struct IsaScope {
  dt_half_isa saved = dt_half_isa_active();
  ~IsaScope() { EXPECT_EQ(dt_half_isa_force(saved), DT_OK); }
};

std::vector<dt_half_isa> SupportedIsas() {
  std::vector<dt_half_isa> isas;
  for (int i = DT_HALF_ISA_SCALAR; i <= DT_HALF_ISA_AVX512_BF16; i++)
    if (dt_half_isa_force((dt_half_isa)i) == DT_OK)
      isas.push_back((dt_half_isa)i);
  return isas;
}

// f32 bit patterns: for every value of the top 16 bits (sign, exponent and
// bf16's mantissa) low halves around every rounding boundary of both
// formats: bf16's ties (0x8000) and f16's (bit 12 set, bits 13..15 any, for
// its normals; a single bit for its subnormals), each +-1 ulp, and two
// random low halves. This holds every tie of both formats, f32 subnormals,
// +-0, +-Inf, NaNs of every top-16 payload and the overflow boundaries.
std::vector<float> NarrowingSample() {
  std::vector<uint32_t> lows = {0x0000, 0xffff};
  for (int b = 0; b < 16; b++)
    for (uint32_t d : {0u, 1u, 0xffffffffu})
      lows.push_back(((1u << b) + d) & 0xffffu);
  for (uint32_t k = 0; k < 8; k++)
    for (uint32_t d : {0x0fffu, 0x1000u, 0x1001u, 0x0000u, 0x1fffu})
      lows.push_back(k * 0x2000u + d);
  std::sort(lows.begin(), lows.end());
  lows.erase(std::unique(lows.begin(), lows.end()), lows.end());
  std::vector<float> x;
  x.reserve((size_t)65536 * (lows.size() + 2));
  for (uint32_t hi = 0; hi < 65536; hi++) {
    for (uint32_t lo : lows)
      x.push_back(bits_f32(hi << 16 | lo));
    for (uint64_t r = 0; r < 2; r++)
      x.push_back(bits_f32(hi << 16 | (uint32_t)(dt_rng_uniform(11 + r, hi) * 65536.0f)));
  }
  return x;
}

TEST(HalfIsa, EveryPathWidensEveryCodeAsScalar) {
  IsaScope scope;
  std::vector<uint16_t> codes(65536);
  for (uint32_t c = 0; c < 65536; c++)
    codes[c] = (uint16_t)c;
  for (dt_half_isa isa : SupportedIsas()) {
    ASSERT_DT_OK(dt_half_isa_force(isa));
    for (dt_dtype t : kHalves)
      for (int64_t start : {0, 1, 7}) {  // misaligned starts and tails
        int64_t n = 65536 - start;
        std::vector<float> out(n);
        ASSERT_DT_OK(dt_half_to_f32(t, codes.data() + start, out.data(), n));
        for (int64_t i = 0; i < n; i++)
          ASSERT_EQ(f32_bits(out[i]), f32_bits(widen(t, codes[start + i])))
              << dt_half_isa_name(isa) << " " << dt_dtype_name(t) << " code " << start + i;
      }
  }
}

TEST(HalfIsa, EveryPathNarrowsAsScalar) {
  IsaScope scope;
  const std::vector<float> x = NarrowingSample();
  for (dt_dtype t : kHalves) {
    std::vector<uint16_t> want(x.size());
    for (size_t i = 0; i < x.size(); i++)
      want[i] = narrow(t, x[i]);
    for (dt_half_isa isa : SupportedIsas()) {
      ASSERT_DT_OK(dt_half_isa_force(isa));
      for (int64_t start : {0, 3}) {
        int64_t n = (int64_t)x.size() - start;
        std::vector<uint16_t> out(n);
        ASSERT_DT_OK(dt_half_from_f32(t, x.data() + start, out.data(), n));
        for (int64_t i = 0; i < n; i++)
          ASSERT_EQ(out[i], want[start + i]) << dt_half_isa_name(isa) << " " << dt_dtype_name(t)
                                             << " f32 bits " << std::hex << f32_bits(x[start + i]);
      }
    }
  }
}

// A vector holding one f32 subnormal among normal values: AVX512-BF16's
// instruction would flush it to zero, the conversion must not.
TEST(HalfIsa, SubnormalAmongNormals) {
  IsaScope scope;
  std::vector<float> x(64, 1.5f);
  x[37] = bits_f32(0x00018000u);  // bf16 0x0002 by nearest even
  x[5] = bits_f32(0x80000001u);   // -0 in bf16
  for (dt_half_isa isa : SupportedIsas()) {
    ASSERT_DT_OK(dt_half_isa_force(isa));
    std::vector<uint16_t> out(x.size());
    ASSERT_DT_OK(dt_half_from_f32(DT_DTYPE_BF16, x.data(), out.data(), (int64_t)x.size()));
    EXPECT_EQ(out[37], 0x0002) << dt_half_isa_name(isa);
    EXPECT_EQ(out[5], 0x8000) << dt_half_isa_name(isa);
    EXPECT_EQ(out[0], 0x3fc0) << dt_half_isa_name(isa);
  }
}

TEST(HalfIsa, ForcingChecksItsArgument) {
  IsaScope scope;
  EXPECT_EQ(dt_half_isa_force((dt_half_isa)99), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_half_isa_force(DT_HALF_ISA_SCALAR), DT_OK);
  EXPECT_EQ(dt_half_isa_active(), DT_HALF_ISA_SCALAR);
  EXPECT_STREQ(dt_half_isa_name(DT_HALF_ISA_AVX512_BF16), "avx512-bf16");
  // the best level is supported, and so is every level below it here
  dt_half_isa best = dt_half_isa_best();
  for (int i = DT_HALF_ISA_SCALAR; i <= (int)best; i++)
    EXPECT_EQ(dt_half_isa_force((dt_half_isa)i), DT_OK) << dt_half_isa_name((dt_half_isa)i);
  for (int i = (int)best + 1; i <= DT_HALF_ISA_AVX512_BF16; i++) {
    EXPECT_EQ(dt_half_isa_force((dt_half_isa)i), DT_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(dt_last_error()).find("does not run"), std::string::npos);
  }
  std::printf("half conversions: best instruction set here %s\n", dt_half_isa_name(best));
}

}  // namespace
