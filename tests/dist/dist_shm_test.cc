// The mpi backend's two transports, shared memory (dist/comm_shm.c) and MPI
// point-to-point, under `mpirun -np W` (dist_shm_test.sh: 2, 3 and 4 ranks):
// every collective, every element type it takes, at sizes of 0 and 1
// elements, below the world size, not divisible by it, and around the
// shared-memory transport's chunks. Exact results (small integers, or the
// documented 16-bit rounding), the same bits on both transports.
#include <gtest/gtest.h>

#include <cmath>
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

// comm_shm_protocol.c's slot: 1 MiB per rank and chunk, split into W pieces for
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
  std::vector<uint8_t> v(static_cast<size_t>(dt_tensor_numel(t)) *
                         dt_dtype_size(dt_tensor_dtype(t)));
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
int64_t FirstDifference(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, size_t elem) {
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
              << "allreduce " << dt_dtype_name(t) << " n " << n << (avg ? " avg" : " sum") << " on "
              << dt_comm_transport(c) << ", W=" << w_ << " rank " << r_;
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
            << "reduce_scatter " << dt_dtype_name(t) << " n " << n << " on " << dt_comm_transport(c)
            << ", W=" << w_ << " rank " << r_;
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
          EXPECT_EQ(BitsOf(out), want)
              << "allgather " << dt_dtype_name(t) << " n " << n << (in_place ? " in place" : "")
              << " on " << dt_comm_transport(c);
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
    EXPECT_EQ(FirstDifference(BitsOf(ts[static_cast<size_t>(i)]),
                              ExpectedBits(DT_DTYPE_F32, all, false), 4),
              -1)
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

// ---- shared buffers: the in-place all-reduce ----

// Whole buffer bytes: every element `fill` (of type t).
void Fill(dt_tensor *buf, dt_dtype t, float fill) {
  dt_tensor *src = Tensor(t, std::vector<float>(static_cast<size_t>(dt_tensor_numel(buf)), fill));
  ASSERT_DT_OK(dt_tensor_copy_(buf, src));
  dt_tensor_release(src);
}

// A view of n elements of `buf` from `off`, holding `bytes`.
dt_tensor *SliceWith(dt_tensor *buf, int64_t off, int64_t n, const std::vector<uint8_t> &bytes) {
  dt_tensor *view = nullptr, *src = FromBytes(dt_tensor_dtype(buf), bytes);
  EXPECT_EQ(dt_tensor_view_flat(buf, off, &n, 1, &view), DT_OK) << dt_last_error();
  if (view != nullptr) {
    EXPECT_EQ(dt_tensor_copy_(view, src), DT_OK) << dt_last_error();
  }
  dt_tensor_release(src);
  return view;
}

// The bytes of elements [from, from + n) of `buf`.
std::vector<uint8_t> BitsOfRange(dt_tensor *buf, int64_t from, int64_t n) {
  dt_tensor *view = nullptr;
  EXPECT_EQ(dt_tensor_view_flat(buf, from, &n, 1, &view), DT_OK) << dt_last_error();
  std::vector<uint8_t> b = view != nullptr ? BitsOf(view) : std::vector<uint8_t>{};
  dt_tensor_release(view);
  return b;
}

std::vector<uint8_t> AsBytes(dt_dtype t, const std::vector<float> &v) {
  dt_tensor *x = Tensor(t, v);
  std::vector<uint8_t> b = BitsOf(x);
  dt_tensor_release(x);
  return b;
}

// All-reduces of slices of a shared buffer (every type, sum and average,
// the sizes of the staged tests and around the in-place chunks of 32768
// elements, at two offsets): the exact result, bit for bit, nothing
// outside the slice touched; random f32 data gives the staged path's bits
// (the same order of addition). MPI's path offers no shared buffer.
TEST_F(DistShm, SharedBuffersAllReduceInPlaceWithTheStagedBits) {
  dt_comm *on = Comm(1), *off = Comm(0);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  dt_tensor *none = nullptr;
  ASSERT_DT_OK(dt_comm_shared_buffer(off, 100, DT_DTYPE_F32, &none));
  EXPECT_EQ(none, nullptr) << "MPI's path has no shared memory";
  for (dt_dtype t : {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16}) {
    size_t elem = dt_dtype_size(t);
    std::vector<int64_t> sizes = Sizes(elem, true);
    for (int64_t k : {1, 3 * w_})
      for (int64_t d : {-1, 0, 1})
        sizes.push_back(k * 32768 + d);
    int64_t longest = 0;
    for (int64_t n : sizes)
      longest = n > longest ? n : longest;
    const int64_t numel = longest + 8;
    dt_tensor *buf = nullptr;
    ASSERT_DT_OK(dt_comm_shared_buffer(on, numel, t, &buf));
    if (w_ == 1) {
      EXPECT_EQ(buf, nullptr) << "one rank needs no shared memory";
      continue;
    }
    ASSERT_NE(buf, nullptr);
    EXPECT_EQ(dt_tensor_numel(buf), numel);
    EXPECT_EQ(dt_tensor_dtype(buf), t);
    Fill(buf, t, 77.0f);
    for (int64_t n : sizes)
      for (int64_t at : {int64_t{0}, int64_t{5}})
        for (bool avg : {false, true}) {
          if (at > 0 && n > 100000 && avg)
            continue;  // the large ones once at an offset
          std::vector<std::vector<float>> all;
          for (int k = 0; k < w_; k++)
            all.push_back(Values(k, n, at));
          // The elements beside the slice (the buffer is 8 longer than the
          // longest slice) must keep their bytes.
          const int64_t tail = numel - at - n < 8 ? numel - at - n : 8;
          std::vector<uint8_t> before = BitsOfRange(buf, 0, at),
                               after = BitsOfRange(buf, at + n, tail);
          dt_tensor *view = SliceWith(buf, at, n, AsBytes(t, all[static_cast<size_t>(r_)]));
          ASSERT_NE(view, nullptr);
          ASSERT_DT_OK(dt_comm_allreduce_sync(on, view, avg ? DT_REDUCE_AVG : DT_REDUCE_SUM));
          std::vector<uint8_t> want = ExpectedBits(t, all, avg), got = BitsOf(view);
          EXPECT_EQ(FirstDifference(got, want, elem), -1)
              << "in place " << dt_dtype_name(t) << " n " << n << " at " << at
              << (avg ? " avg" : " sum") << ", W=" << w_ << " rank " << r_;
          EXPECT_EQ(BitsOfRange(buf, 0, at), before) << "wrote before the slice: n " << n;
          EXPECT_EQ(BitsOfRange(buf, at + n, tail), after) << "wrote after the slice: n " << n;
          dt_tensor_release(view);
        }
    if (t == DT_DTYPE_F32) {  // rounding: the staged path's order of addition
      const int64_t n = 3 * 32768 * w_ + 11;
      std::vector<float> mine(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; i++)
        mine[static_cast<size_t>(i)] =
            static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r_)) * (1.0f + r_);
      dt_tensor *staged = Tensor(t, mine), *view = SliceWith(buf, 3, n, AsBytes(t, mine));
      ASSERT_NE(view, nullptr);
      ASSERT_DT_OK(dt_comm_allreduce_sync(on, staged, DT_REDUCE_AVG));
      ASSERT_DT_OK(dt_comm_allreduce_sync(on, view, DT_REDUCE_AVG));
      EXPECT_EQ(FirstDifference(BitsOf(view), BitsOf(staged), elem), -1) << "W=" << w_;
      dt_tensor_release(staged);
      dt_tensor_release(view);
    }
    dt_tensor_release(buf);
  }
  dt_comm_destroy(on);
  dt_comm_destroy(off);
}

// In-place all-reduces of disjoint slices queued with staged ones and
// barriers (the counters of both paths stay in step), then a buffer that
// outlives its communicator: still mapped, still the results.
TEST_F(DistShm, SharedBufferQueuesWithStagedCollectivesAndOutlivesTheCommunicator) {
  if (w_ < 2)
    GTEST_SKIP() << "shared buffers need 2 ranks";
  dt_comm *c = Comm(1);
  ASSERT_NE(c, nullptr);
  const int rounds = 24;
  const int64_t piece = 50000;
  dt_tensor *buf = nullptr;
  ASSERT_DT_OK(dt_comm_shared_buffer(c, rounds * piece, DT_DTYPE_F32, &buf));
  ASSERT_NE(buf, nullptr);
  std::vector<dt_tensor *> ts;
  std::vector<dt_work *> works;
  for (int i = 0; i < rounds; i++) {
    int64_t n = 1 + (i * 7919) % piece;
    dt_tensor *x = i % 3 == 1
                       ? dtt::VectorOn(DT_CPU, Values(r_, n, i))
                       : SliceWith(buf, i * piece, n, AsBytes(DT_DTYPE_F32, Values(r_, n, i)));
    ASSERT_NE(x, nullptr);
    dt_work *work = nullptr;
    ASSERT_DT_OK(dt_comm_allreduce(c, x, DT_REDUCE_SUM, nullptr, &work));
    ts.push_back(x);
    works.push_back(work);
    if (i % 5 == 4) {
      ASSERT_DT_OK(dt_comm_barrier(c, nullptr, &work));
      ts.push_back(nullptr);
      works.push_back(work);
    }
  }
  for (size_t j = 0; j < works.size(); j++) {
    ASSERT_DT_OK(dt_work_wait(works[j], 0));
    dt_work_release(works[j]);
  }
  dt_comm_destroy(c);  // the buffer stays mapped while a tensor holds it
  for (size_t j = 0, i = 0; j < ts.size(); j++) {
    if (ts[j] == nullptr)
      continue;
    int64_t n = dt_tensor_numel(ts[j]);
    std::vector<std::vector<float>> all;
    for (int k = 0; k < w_; k++)
      all.push_back(Values(k, n, static_cast<int64_t>(i)));
    EXPECT_EQ(FirstDifference(BitsOf(ts[j]), ExpectedBits(DT_DTYPE_F32, all, false), 4), -1)
        << "round " << i << (i % 3 == 1 ? " (staged)" : " (in place)");
    dt_tensor_release(ts[j]);
    i++;
  }
  Fill(buf, DT_DTYPE_F32, 1.0f);  // writable after the communicator is gone
  EXPECT_EQ(dtt::HostOf<float>(buf)[static_cast<size_t>(rounds * piece - 1)], 1.0f);
  dt_tensor_release(buf);
}

// At most 16 shared buffers are held at once: the 17th is refused on every
// rank alike (NULL, staged all-reduces), and one let go makes room again.
TEST_F(DistShm, SharedBuffersBeyondTheTableAreRefusedOnEveryRank) {
  if (w_ < 2)
    GTEST_SKIP() << "shared buffers need 2 ranks";
  dt_comm *c = Comm(1);
  ASSERT_NE(c, nullptr);
  std::vector<dt_tensor *> held;
  for (int i = 0; i < 16; i++) {
    dt_tensor *b = nullptr;
    ASSERT_DT_OK(dt_comm_shared_buffer(c, 1000 + i, DT_DTYPE_F32, &b));
    ASSERT_NE(b, nullptr) << "buffer " << i;
    held.push_back(b);
  }
  dt_tensor *extra = nullptr;
  ASSERT_DT_OK(dt_comm_shared_buffer(c, 10, DT_DTYPE_F32, &extra));
  EXPECT_EQ(extra, nullptr) << "the 17th buffer";
  dt_tensor_release(held[3]);
  held[3] = nullptr;
  ASSERT_DT_OK(dt_comm_shared_buffer(c, 10, DT_DTYPE_F32, &extra));
  ASSERT_NE(extra, nullptr) << "a buffer let go makes room";
  dt_tensor *x = SliceWith(extra, 2, 8, AsBytes(DT_DTYPE_F32, Values(r_, 8)));
  ASSERT_DT_OK(dt_comm_allreduce_sync(c, x, DT_REDUCE_SUM));
  std::vector<std::vector<float>> all;
  for (int k = 0; k < w_; k++)
    all.push_back(Values(k, 8));
  EXPECT_EQ(FirstDifference(BitsOf(x), ExpectedBits(DT_DTYPE_F32, all, false), 4), -1);
  dt_tensor_release(x);
  dt_tensor_release(extra);
  for (dt_tensor *b : held)
    dt_tensor_release(b);
  dt_comm_destroy(c);
}

// Ranks whose all-reduces lie at different places of a shared buffer, or
// in it on one rank and not on another, are refused on every rank before
// data moves.
TEST_F(DistShm, SharedBufferAtDifferentPlacesFailsOnEveryRank) {
  if (w_ < 2)
    GTEST_SKIP() << "a mismatch needs at least 2 ranks";
  for (int private_on_rank0 : {0, 1}) {
    dt_comm *c = Comm(1);
    ASSERT_NE(c, nullptr);
    dt_tensor *buf = nullptr;
    ASSERT_DT_OK(dt_comm_shared_buffer(c, 64, DT_DTYPE_F32, &buf));
    ASSERT_NE(buf, nullptr);
    std::vector<float> v = Values(r_, 16);
    dt_tensor *x = r_ == 0 && private_on_rank0
                       ? dtt::VectorOn(DT_CPU, v)
                       : SliceWith(buf, r_ == 0 ? 0 : 16, 16, AsBytes(DT_DTYPE_F32, v));
    ASSERT_NE(x, nullptr);
    dt_status st = dt_comm_allreduce_sync(c, x, DT_REDUCE_SUM);
    std::string msg = dt_last_error();
    EXPECT_EQ(st, DT_ERR_DIST_MISMATCH) << msg;
    EXPECT_NE(msg.find("same slice"), std::string::npos) << msg;
    EXPECT_EQ(dtt::HostOf<float>(x), v) << "the data must not have moved";
    dt_tensor_release(x);
    dt_tensor_release(buf);
    dt_comm_destroy(c);
  }
  ASSERT_DT_OK(dt_comm_barrier_sync(g_comm));
}

}  // namespace

int main(int argc, char **argv) {
  return dtt::mpi_suite_main(argc, argv, "dist_shm_test", &g_pg, &g_comm);
}
