// The mpi backend's two transports, shared memory (dist/comm_shm.c) and MPI
// point-to-point, under `mpirun -np W` (dist_shm_test.sh: 2, 3 and 4 ranks):
// every collective, every element type it takes, at sizes of 0 and 1
// elements, below the world size, not divisible by it, and around the
// shared-memory transport's chunks. Exact results (small integers, or the
// documented 16-bit rounding), the same bits on both transports.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "dist/process_group.h"
#include "tests/dist/dist_test_util.h"

namespace {

dt_pg *g_pg = nullptr;
dt_comm *g_comm = nullptr;  // DT_COMM_SHM from the environment

// comm_shm.c's slot: 1 MiB per rank and chunk, split into W pieces for
// the reductions.
constexpr int64_t kSlotBytes = 1 << 20;

class DistShm : public ::testing::Test {
 protected:
  void SetUp() override {
    dt_cpu_set_num_threads(1);
    ASSERT_NE(g_comm, nullptr);
    w_ = dt_comm_size(g_comm);
    r_ = dt_comm_rank(g_comm);
  }
  // A communicator of its own on one transport (shm 1 or 0).
  dt_comm *Comm(int shm) {
    dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
    cc.timeout_s = 30;
    cc.shm = shm;
    dt_comm *c = nullptr;
    EXPECT_EQ(dt_comm_create_mpi(g_pg, &cc, &c), DT_OK) << dt_last_error();
    return c;
  }
  // Sizes around the chunks of elements of `elem` bytes: per segment of a
  // reduction (`per_rank` pieces of the world's data), or whole slots.
  std::vector<int64_t> Sizes(size_t elem, bool reduction) const {
    int64_t q = reduction ? kSlotBytes / w_ / static_cast<int64_t>(elem) / 64 * 64
                          : kSlotBytes / static_cast<int64_t>(elem);
    int64_t span = reduction ? q * w_ : q;
    std::vector<int64_t> s = {0, 1, 2, 3, w_ - 1 > 0 ? w_ - 1 : 1, w_ + 1, 1000, 4099};
    for (int64_t k : {1, 2, 5})
      for (int64_t d : {-1, 0, 1})
        s.push_back(k * span + d);
    s.push_back(2 * span + span / 3 + 7);
    return s;
  }
  int w_ = 1, r_ = 0;
};

// Small integers: every sum exact in f32 (and in 16 bits below 256).
float Value(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 41 - 20); }

std::vector<float> Values(int rank, int64_t n, int64_t from = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++)
    v[static_cast<size_t>(i)] = Value(rank, from + i);
  return v;
}

dt_tensor *Tensor(dt_dtype t, const std::vector<float> &v) {
  return t == DT_DTYPE_F32 ? dtt::VectorOn(DT_CPU, v) : dtt::Vector16(t, v);
}

// The expected bits of the reduction over ranks of their values[k].
std::vector<uint8_t> ExpectedBits(dt_dtype t, const std::vector<std::vector<float>> &values,
                                  bool avg) {
  std::vector<uint8_t> out;
  if (t == DT_DTYPE_F32) {
    std::vector<float> acc(values[0].size());
    for (size_t i = 0; i < acc.size(); i++) {
      float sum = 0;
      for (const auto &v : values)
        sum += v[i];
      acc[i] = avg ? sum / static_cast<float>(values.size()) : sum;
    }
    out.resize(acc.size() * sizeof(float));
    std::memcpy(out.data(), acc.data(), out.size());
  } else {
    std::vector<uint16_t> h = dtt::expected_reduce16(t, values, avg);
    out.resize(h.size() * 2);
    std::memcpy(out.data(), h.data(), out.size());
  }
  return out;
}

std::vector<uint8_t> BitsOf(dt_tensor *t) {
  std::vector<uint8_t> v(static_cast<size_t>(dt_tensor_numel(t)) * dt_dtype_size(dt_tensor_dtype(t)));
  EXPECT_EQ(dt_tensor_to_host(t, v.data(), v.size()), DT_OK) << dt_last_error();
  return v;
}

// A tensor of type t whose elements are the bytes b.
dt_tensor *FromBytes(dt_dtype t, const std::vector<uint8_t> &b) {
  int64_t n = static_cast<int64_t>(b.size() / dt_dtype_size(t));
  dt_tensor *x = nullptr;
  EXPECT_EQ(dt_tensor_from_host(b.data(), &n, 1, t, DT_CPU, &x), DT_OK) << dt_last_error();
  return x;
}

// Index of the first differing element (of `elem` bytes), -1 when equal.
int64_t FirstDifference(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b,
                        size_t elem) {
  if (a.size() != b.size())
    return -2;
  for (size_t i = 0; i < a.size(); i += elem)
    if (std::memcmp(&a[i], &b[i], elem) != 0)
      return static_cast<int64_t>(i / elem);
  return -1;
}

TEST_F(DistShm, OneNodeUsesSharedMemoryUnlessTurnedOff) {
  dt_comm *on = Comm(1), *off = Comm(0);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  EXPECT_STREQ(dt_comm_transport(on), w_ > 1 ? "shm" : "mpi");
  EXPECT_STREQ(dt_comm_transport(off), "mpi");
  EXPECT_STREQ(dt_comm_backend_name(on), "mpi");
  dt_comm_destroy(on);
  dt_comm_destroy(off);
}

// All-reduce and reduce-scatter of f32, bf16 and f16, sum and average, on
// both transports: the exact result, identical bits on both.
TEST_F(DistShm, ReductionsOfEveryTypeAndSizeOnBothTransports) {
  dt_comm *comms[2] = {Comm(1), Comm(0)};
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
  for (dt_dtype t : {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16}) {
    size_t elem = dt_dtype_size(t);
    for (int64_t n : Sizes(elem, true)) {
      std::vector<std::vector<float>> all;
      for (int k = 0; k < w_; k++)
        all.push_back(Values(k, n));
      for (bool avg : {false, true}) {
        std::vector<uint8_t> want = ExpectedBits(t, all, avg);
        for (dt_comm *c : comms) {
          dt_tensor *x = Tensor(t, all[static_cast<size_t>(r_)]);
          ASSERT_DT_OK(dt_comm_allreduce_sync(c, x, avg ? DT_REDUCE_AVG : DT_REDUCE_SUM));
          EXPECT_EQ(FirstDifference(BitsOf(x), want, elem), -1)
              << "allreduce " << dt_dtype_name(t) << " n " << n << (avg ? " avg" : " sum")
              << " on " << dt_comm_transport(c) << ", W=" << w_ << " rank " << r_;
          dt_tensor_release(x);
        }
      }
      // reduce-scatter: n elements out per rank, from w * n in.
      if (n > 3 * kSlotBytes / static_cast<int64_t>(elem) / w_)
        continue;  // the large ones are the all-reduce's
      std::vector<float> in;
      for (int s = 0; s < w_; s++) {
        std::vector<float> part = Values(r_, n, s * n);
        in.insert(in.end(), part.begin(), part.end());
      }
      std::vector<std::vector<float>> mine;
      for (int k = 0; k < w_; k++)
        mine.push_back(Values(k, n, static_cast<int64_t>(r_) * n));
      std::vector<uint8_t> want = ExpectedBits(t, mine, true);
      for (dt_comm *c : comms) {
        dt_tensor *x = Tensor(t, in), *out = Tensor(t, std::vector<float>(n, 99.0f));
        dt_work *work = nullptr;
        ASSERT_DT_OK(dt_comm_reduce_scatter(c, x, out, DT_REDUCE_AVG, nullptr, &work));
        ASSERT_DT_OK(dt_work_wait(work, 0));
        dt_work_release(work);
        EXPECT_EQ(FirstDifference(BitsOf(out), want, elem), -1)
            << "reduce_scatter " << dt_dtype_name(t) << " n " << n << " on "
            << dt_comm_transport(c) << ", W=" << w_ << " rank " << r_;
        dt_tensor_release(x);
        dt_tensor_release(out);
      }
    }
  }
  dt_comm_destroy(comms[0]);
  dt_comm_destroy(comms[1]);
}

// Rank k's byte i: a pattern that differs between ranks and positions.
uint8_t Byte(int rank, int64_t i) { return static_cast<uint8_t>((i * 31 + rank * 97 + 5) & 0xff); }

std::vector<uint8_t> Bytes(int rank, int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++)
    v[static_cast<size_t>(i)] = Byte(rank, i);
  return v;
}

// Broadcast from every root and all-gather (into a separate buffer and in
// place, as ZeRO gathers) of bytes and of i64, on both transports.
TEST_F(DistShm, BroadcastAndAllgatherOfAnyTypeAndSize) {
  dt_comm *comms[2] = {Comm(1), Comm(0)};
  ASSERT_NE(comms[0], nullptr);
  ASSERT_NE(comms[1], nullptr);
  for (dt_dtype t : {DT_DTYPE_U8, DT_DTYPE_I64}) {
    size_t elem = dt_dtype_size(t);
    for (int64_t n : Sizes(elem, false)) {
      int64_t nbytes = n * static_cast<int64_t>(elem);
      for (dt_comm *c : comms) {
        for (int root : {0, w_ - 1}) {
          dt_tensor *b = FromBytes(t, Bytes(r_, nbytes));
          ASSERT_DT_OK(dt_comm_broadcast_sync(c, b, root));
          EXPECT_EQ(BitsOf(b), Bytes(root, nbytes))
              << "broadcast " << dt_dtype_name(t) << " n " << n << " from " << root << " on "
              << dt_comm_transport(c);
          dt_tensor_release(b);
        }
        std::vector<uint8_t> want;
        for (int k = 0; k < w_; k++) {
          std::vector<uint8_t> part = Bytes(k, nbytes);
          want.insert(want.end(), part.begin(), part.end());
        }
        for (bool in_place : {false, true}) {
          int64_t whole = n * w_;
          dt_tensor *out = nullptr, *in = nullptr;
          ASSERT_DT_OK(dt_tensor_zeros(&whole, 1, t, DT_CPU, &out));
          if (in_place) {
            ASSERT_DT_OK(dt_tensor_view_flat(out, r_ * n, &n, 1, &in));
            std::vector<uint8_t> mine = Bytes(r_, nbytes);
            if (nbytes > 0)
              std::memcpy(dt_tensor_data(in), mine.data(), mine.size());
          } else {
            in = FromBytes(t, Bytes(r_, nbytes));
          }
          ASSERT_DT_OK(dt_comm_allgather_sync(c, in, out));
          EXPECT_EQ(BitsOf(out), want) << "allgather " << dt_dtype_name(t) << " n " << n
                                       << (in_place ? " in place" : "") << " on "
                                       << dt_comm_transport(c);
          dt_tensor_release(in);
          dt_tensor_release(out);
        }
      }
    }
  }
  for (dt_comm *c : comms) {
    ASSERT_DT_OK(dt_comm_barrier_sync(c));
    dt_comm_destroy(c);
  }
}

// Many small collectives in a row, queued before any is waited for: the
// pipeline's slots wrap around many times and the results stay exact.
TEST_F(DistShm, QueuedCollectivesWrapTheSlots) {
  dt_comm *c = Comm(1);
  ASSERT_NE(c, nullptr);
  const int rounds = 40;
  std::vector<dt_tensor *> ts;
  std::vector<dt_work *> works;
  for (int i = 0; i < rounds; i++) {
    int64_t n = 1 + (i * 7919) % 70000;
    dt_tensor *x = dtt::VectorOn(DT_CPU, Values(r_, n, i));
    dt_work *work = nullptr;
    if (i % 5 == 4)
      ASSERT_DT_OK(dt_comm_barrier(c, nullptr, &work));
    else
      ASSERT_DT_OK(dt_comm_allreduce(c, x, DT_REDUCE_SUM, nullptr, &work));
    ts.push_back(x);
    works.push_back(work);
  }
  for (int i = 0; i < rounds; i++) {
    ASSERT_DT_OK(dt_work_wait(works[static_cast<size_t>(i)], 0));
    dt_work_release(works[static_cast<size_t>(i)]);
    if (i % 5 == 4)
      continue;
    int64_t n = dt_tensor_numel(ts[static_cast<size_t>(i)]);
    std::vector<std::vector<float>> all;
    for (int k = 0; k < w_; k++)
      all.push_back(Values(k, n, i));
    EXPECT_EQ(FirstDifference(BitsOf(ts[static_cast<size_t>(i)]), ExpectedBits(DT_DTYPE_F32, all, false), 4), -1)
        << "round " << i;
  }
  for (dt_tensor *x : ts)
    dt_tensor_release(x);
  dt_comm_destroy(c);
}

// Ranks at different collectives are refused on every rank before data
// moves, on the shared-memory transport as on MPI's.
TEST_F(DistShm, MismatchFailsOnEveryRankBeforeDataMoves) {
  if (w_ < 2)
    GTEST_SKIP() << "a mismatch needs at least 2 ranks";
  dt_comm *c = Comm(1);
  ASSERT_NE(c, nullptr);
  int64_t n = r_ == 0 ? 5 : 9;
  std::vector<float> v = Values(r_, n);
  dt_tensor *x = dtt::VectorOn(DT_CPU, v);
  dt_status st = dt_comm_allreduce_sync(c, x, DT_REDUCE_SUM);
  std::string msg = dt_last_error();
  EXPECT_EQ(st, DT_ERR_DIST_MISMATCH) << msg;
  EXPECT_NE(msg.find("sizes 20..36 bytes"), std::string::npos) << msg;
  EXPECT_EQ(dtt::HostOf<float>(x), v) << "the data must not have moved";
  dt_tensor_release(x);
  dt_comm_destroy(c);
  ASSERT_DT_OK(dt_comm_barrier_sync(g_comm));
}

}  // namespace

int main(int argc, char **argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!dtt::start_mpi("dist_shm_test", &g_pg, &g_comm))
    return 1;
  return dtt::run_all_then_stop_mpi(g_pg, g_comm);
}
