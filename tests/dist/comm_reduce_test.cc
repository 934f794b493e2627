// The host transports' one-pass f32 reduction (dist/comm_reduce.c,
// dt_comm_sum_f32_into) against the two-pass one it replaces
// (dt_comm_sum_f32): the same bits for every part count, with and without
// the average and the second destination, in place, and at every length
// around the vector widths (the common 2-part loop is compiled for
// AVX-512, AVX2 and SSE2; a tail or a path that went scalar or wrong shows
// here).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "dist/comm_internal.h"

namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto &x : v)
    x = d(gen) * (seed % 3 == 0 ? 1e-30f : 1.0f);  // denormal sums too
  return v;
}

bool SameBits(const std::vector<float> &a, const float *b, int64_t n) {
  return std::memcmp(a.data(), b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(CommReduce, OnePassSumHasTheBitsOfTheTwoPassSum) {
  const int64_t lengths[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 4099};
  for (int nparts = 1; nparts <= 4; nparts++)
    for (int avg = 0; avg <= 1; avg++)
      for (int64_t n : lengths) {
        std::vector<std::vector<float>> parts;
        std::vector<const void *> raw;
        std::vector<const float *> f;
        for (int k = 0; k < nparts; k++)
          parts.push_back(Random(n + 1, 17u * static_cast<uint32_t>(k) + static_cast<uint32_t>(n)));
        for (auto &p : parts) {
          raw.push_back(p.data());
          f.push_back(p.data());
        }
        std::vector<float> want(static_cast<size_t>(n + 1));
        dt_comm_sum_f32(raw.data(), nparts, DT_DTYPE_F32, n, avg, want.data());
        std::vector<float> dst(static_cast<size_t>(n + 1), -7.0f), dst2(dst);
        dt_comm_sum_f32_into(f.data(), nparts, n, avg, dst.data(), dst2.data());
        EXPECT_TRUE(SameBits(want, dst.data(), n))
            << nparts << " parts, avg " << avg << ", n " << n;
        EXPECT_TRUE(SameBits(want, dst2.data(), n)) << nparts << " parts, n " << n;
        EXPECT_EQ(dst[static_cast<size_t>(n)], -7.0f) << "wrote past the end, n " << n;
        EXPECT_EQ(dst2[static_cast<size_t>(n)], -7.0f) << "wrote past the end, n " << n;
        std::vector<float> only(static_cast<size_t>(n + 1), -7.0f);
        dt_comm_sum_f32_into(f.data(), nparts, n, avg, only.data(), nullptr);
        EXPECT_TRUE(SameBits(want, only.data(), n)) << nparts << " parts, no dst2, n " << n;
        // In place: the result over the first part (as the shm transport
        // reduces a rank's own slice of its buffer).
        std::vector<float> first = parts[0];
        f[0] = first.data();
        dt_comm_sum_f32_into(f.data(), nparts, n, avg, first.data(), nullptr);
        EXPECT_TRUE(SameBits(want, first.data(), n)) << nparts << " parts, in place, n " << n;
      }
}

}  // namespace
