// Token windows and the token loader (core/text.h): batch contents are the
// right windows with targets shifted by one; under data parallelism the
// ranks' batches are disjoint, together are exactly the single-process
// global batch, and follow one schedule; epochs reshuffle with the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "core/text.h"
#include "tests/data_layout_util.h"
#include "tests/dt_assert.h"

namespace {

// A shard whose token i is i % 50000: a window is known by its first token.
struct CountingShard {
  std::vector<uint16_t> tokens;
  dt_shard shard;
  explicit CountingShard(int64_t n) : tokens((size_t)n) {
    for (int64_t i = 0; i < n; i++)
      tokens[(size_t)i] = (uint16_t)(i % 50000);
    shard = {tokens.data(), n};
  }
};

std::vector<int32_t> ToHost(const dt_tensor *t) {
  std::vector<int32_t> v((size_t)dt_tensor_numel(t));
  EXPECT_EQ(dt_tensor_dtype(t), DT_DTYPE_I32);
  EXPECT_EQ(dt_tensor_to_host(t, v.data(), v.size() * sizeof(int32_t)), DT_OK);
  return v;
}

// One epoch of a loader: per batch, the window index of each row (after
// checking that the row holds that window and its shifted targets).
std::vector<std::vector<int64_t>> Epoch(dt_token_loader *l, int64_t epoch, int B, int T) {
  std::vector<std::vector<int64_t>> batches;
  EXPECT_EQ(dt_token_loader_start_epoch(l, epoch), DT_OK) << dt_last_error();
  for (;;) {
    dt_tensor *x = nullptr, *y = nullptr;
    EXPECT_EQ(dt_token_loader_next(l, &x, &y), DT_OK) << dt_last_error();
    if (!x)
      break;
    EXPECT_EQ(dt_tensor_ndim(x), 2);
    EXPECT_EQ(dt_tensor_shape(x)[0], B);
    EXPECT_EQ(dt_tensor_shape(x)[1], T);
    EXPECT_EQ(dt_tensor_shape(y)[0], B);
    EXPECT_EQ(dt_tensor_shape(y)[1], T);
    std::vector<int32_t> xv = ToHost(x), yv = ToHost(y);
    std::vector<int64_t> rows;
    for (int b = 0; b < B; b++) {
      int64_t first = xv[(size_t)b * T];
      EXPECT_EQ(first % T, 0) << "windows start at multiples of T";
      for (int t = 0; t < T; t++) {
        EXPECT_EQ(xv[(size_t)b * T + t], (first + t) % 50000);
        EXPECT_EQ(yv[(size_t)b * T + t], (first + t + 1) % 50000);
      }
      rows.push_back(first / T);
    }
    batches.push_back(rows);
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  return batches;
}

dt_token_loader *MakeLoader(const dt_shard *s, int B, int T, int R, int r, uint64_t seed,
                            int shuffle = 1) {
  dt_token_loader_config c = DT_TOKEN_LOADER_CONFIG_DEFAULT;
  c.batch = B;
  c.seq_len = T;
  c.num_replicas = R;
  c.rank = r;
  c.seed = seed;
  c.shuffle = shuffle;
  c.prefetch = 3;
  dt_token_loader *l = nullptr;
  EXPECT_EQ(dt_token_loader_create(s, 50257, &c, &l), DT_OK) << dt_last_error();
  return l;
}

TEST(TokenWindows, DatasetLayoutAndContents) {
  CountingShard cs(993);  // (993 - 1) / 16 = 62 windows
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_token_windows(&cs.shard, 16, 50257, &d));
  EXPECT_EQ(dt_dataset_length(d), 62);
  const dt_sample_layout windows = {DT_DTYPE_I32, 1, {16}, DT_DTYPE_I32, 1, {16}};
  dtt::ExpectSameLayout(dt_dataset_layout(d), windows);
  EXPECT_EQ(dt_dataset_num_classes(d), 50257);
  std::vector<int32_t> x(16), y(16);
  ASSERT_DT_OK(dt_dataset_get_sample(d, 61, x.data(), y.data()));
  EXPECT_EQ(x[0], 976);
  EXPECT_EQ(y[15], 992) << "the last window ends on the shard's last token";
  float fx[16];
  int32_t label;
  EXPECT_EQ(dt_dataset_get(d, 0, fx, &label), DT_ERR_DTYPE) << "not an f32/label dataset";
  dt_dataset_destroy(d);

  CountingShard tiny(16);
  EXPECT_EQ(dt_dataset_token_windows(&tiny.shard, 16, 50257, &d), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("no window"), std::string::npos);
}

TEST(TokenLoader, SequentialBatchesInOrder) {
  CountingShard cs(10 * 8 + 5);  // 10 windows of T = 8
  dt_token_loader *l = MakeLoader(&cs.shard, 3, 8, 1, 0, 0, /*shuffle=*/0);
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(dt_token_loader_num_batches(l), 3) << "floor(10 / 3): the tail is dropped";
  std::vector<std::vector<int64_t>> b = Epoch(l, 0, 3, 8);
  EXPECT_EQ(b, (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}}));
  dt_token_loader_destroy(l);
}

// R ranks with B each against one process with B * R: for every epoch and
// global batch, the ranks' windows are disjoint and their union is the
// single process's batch; all ranks have the same number of batches.
TEST(TokenLoader, DistributedShardsAreDisjointAndCoverTheGlobalBatch) {
  const int B = 2, T = 4;
  CountingShard cs(4 * 97 + 1);  // 97 windows
  for (int R : {2, 3}) {
    dt_token_loader *single = MakeLoader(&cs.shard, B * R, T, 1, 0, 42);
    std::vector<dt_token_loader *> ranks;
    for (int r = 0; r < R; r++)
      ranks.push_back(MakeLoader(&cs.shard, B, T, R, r, 42));
    int64_t global = 97 / (B * R);
    EXPECT_EQ(dt_token_loader_num_batches(single), global);
    for (int r = 0; r < R; r++)
      EXPECT_EQ(dt_token_loader_num_batches(ranks[r]), global) << "R " << R << " rank " << r;
    std::vector<std::set<int64_t>> epochs;
    for (int64_t epoch = 0; epoch < 3; epoch++) {
      std::vector<std::vector<int64_t>> want = Epoch(single, epoch, B * R, T);
      std::vector<std::vector<std::vector<int64_t>>> got;
      for (int r = 0; r < R; r++)
        got.push_back(Epoch(ranks[r], epoch, B, T));
      ASSERT_EQ((int64_t)want.size(), global);
      std::set<int64_t> all;
      for (int64_t g = 0; g < global; g++) {
        std::multiset<int64_t> merged;
        for (int r = 0; r < R; r++) {
          ASSERT_EQ((int64_t)got[r].size(), global);
          merged.insert(got[r][g].begin(), got[r][g].end());
        }
        EXPECT_EQ(merged, std::multiset<int64_t>(want[g].begin(), want[g].end()))
            << "R " << R << " epoch " << epoch << " global batch " << g;
        all.insert(merged.begin(), merged.end());
      }
      EXPECT_EQ((int64_t)all.size(), global * B * R) << "no window twice in an epoch";
      epochs.push_back(all);
    }
    dt_token_loader_destroy(single);
    for (dt_token_loader *l : ranks)
      dt_token_loader_destroy(l);
  }
}

TEST(TokenLoader, DeterministicPerSeedAndReshuffledPerEpoch) {
  CountingShard cs(8 * 200 + 1);
  dt_token_loader *a = MakeLoader(&cs.shard, 4, 8, 2, 1, 7);
  dt_token_loader *b = MakeLoader(&cs.shard, 4, 8, 2, 1, 7);
  dt_token_loader *c = MakeLoader(&cs.shard, 4, 8, 2, 1, 8);
  std::vector<std::vector<int64_t>> a0 = Epoch(a, 0, 4, 8), a1 = Epoch(a, 1, 4, 8);
  EXPECT_EQ(a0, Epoch(b, 0, 4, 8)) << "same seed, same epoch: same batches";
  EXPECT_EQ(a1, Epoch(b, 1, 4, 8));
  EXPECT_NE(a0, a1) << "each epoch reshuffles";
  EXPECT_NE(a0, Epoch(c, 0, 4, 8)) << "another seed, another order";
  EXPECT_EQ(a0, Epoch(a, 0, 4, 8)) << "an epoch can be replayed";
  // Shuffled: not in shard order.
  std::vector<int64_t> flat;
  for (auto &batch : a0)
    flat.insert(flat.end(), batch.begin(), batch.end());
  EXPECT_FALSE(std::is_sorted(flat.begin(), flat.end()));
  dt_token_loader_destroy(a);
  dt_token_loader_destroy(b);
  dt_token_loader_destroy(c);
}

TEST(TokenLoader, RejectsShardsTooSmallForOneGlobalBatch) {
  CountingShard cs(8 * 5 + 1);  // 5 windows
  dt_token_loader_config c = DT_TOKEN_LOADER_CONFIG_DEFAULT;
  c.seq_len = 8;
  c.batch = 3;
  c.num_replicas = 2;
  dt_token_loader *l = nullptr;
  EXPECT_EQ(dt_token_loader_create(&cs.shard, 50257, &c, &l), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("no global batch of 3 x 2"), std::string::npos)
      << dt_last_error();
  EXPECT_EQ(l, nullptr);
  c.batch = 0;
  EXPECT_EQ(dt_token_loader_create(&cs.shard, 50257, &c, &l), DT_ERR_INVALID_ARG);
  c.batch = 2;
  c.rank = 2;
  EXPECT_EQ(dt_token_loader_create(&cs.shard, 50257, &c, &l), DT_ERR_INVALID_ARG);
  dt_tensor *x, *y;
  EXPECT_EQ(dt_token_loader_next(nullptr, &x, &y), DT_ERR_INVALID_ARG);
}

}  // namespace
