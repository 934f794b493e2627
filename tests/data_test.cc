// Data: idx reader (raw, gzip, every corruption), idx image datasets,
// samplers (PyTorch DistributedSampler rules) and the background loader.
#include "core/data.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tests/data_layout_util.h"
#include "tests/dt_assert.h"

namespace {

// ---- file helpers ----

std::string MakeIdx(int type, const std::vector<uint32_t> &dims, const std::string &body,
                    uint8_t m0 = 0, uint8_t m1 = 0) {
  std::string s;
  s.push_back((char)m0);
  s.push_back((char)m1);
  s.push_back((char)type);
  s.push_back((char)dims.size());
  for (uint32_t d : dims) {
    s.push_back((char)(d >> 24));
    s.push_back((char)(d >> 16));
    s.push_back((char)(d >> 8));
    s.push_back((char)d);
  }
  return s + body;
}

std::string Bytes(size_t n, uint32_t seed = 1) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    s[i] = (char)(x >> 24);
  }
  return s;
}

void WriteFile(const std::string &path, const std::string &content) {
  FILE *f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(fwrite(content.data(), 1, content.size(), f), content.size());
  fclose(f);
}

std::string ReadFile(const std::string &path) {
  std::string s;
  FILE *f = fopen(path.c_str(), "rb");
  if (!f)
    return s;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    s.append(buf, n);
  fclose(f);
  return s;
}

void WriteGz(const std::string &path, const std::string &content) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr) << path;
  ASSERT_EQ(gzwrite(gz, content.data(), (unsigned)content.size()), (int)content.size());
  ASSERT_EQ(gzclose(gz), Z_OK);
}

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/dt_data_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(mkdtemp(buf.data()), nullptr);
    dir_ = buf.data();
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!system(cmd.c_str());
  }
  std::string Path(const std::string &name) const { return dir_ + "/" + name; }

  // Reads `path` expecting failure `want`; checks the message names the file
  // and contains `problem`.
  void ExpectIdxError(const std::string &path, int expect_ndim, dt_status want,
                      const std::string &problem) {
    dt_idx idx;
    dt_status st = dt_idx_read(path.c_str(), expect_ndim, &idx);
    EXPECT_EQ(st, want) << dt_status_name(st) << ": " << dt_last_error();
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << "want \"" << problem << "\" in: " << msg;
    EXPECT_EQ(idx.data, nullptr);
    dt_idx_free(&idx);
  }

  std::string dir_;
};

// ---- idx reader ----

TEST_F(DataTest, ReadsRawIdx) {
  std::string body = Bytes(3 * 2 * 4);
  WriteFile(Path("a.idx"), MakeIdx(0x08, {3, 2, 4}, body));
  dt_idx idx;
  ASSERT_EQ(dt_idx_read(Path("a.idx").c_str(), 3, &idx), DT_OK) << dt_last_error();
  EXPECT_EQ(idx.type, 0x08);
  EXPECT_EQ(idx.ndim, 3);
  EXPECT_EQ(idx.dims[0], 3);
  EXPECT_EQ(idx.dims[1], 2);
  EXPECT_EQ(idx.dims[2], 4);
  EXPECT_EQ(idx.numel, 24);
  EXPECT_EQ(std::string((const char *)idx.data, 24), body);
  dt_idx_free(&idx);
  EXPECT_EQ(idx.data, nullptr);
  dt_idx_free(&idx);  // idempotent
  dt_idx_free(nullptr);

  // expect_ndim 0 accepts any.
  ASSERT_EQ(dt_idx_read(Path("a.idx").c_str(), 0, &idx), DT_OK) << dt_last_error();
  dt_idx_free(&idx);
}

TEST_F(DataTest, ReadsGzipIdxLargerThanFirstBuffer) {
  // 3 MiB: the gzip path starts with a 1 MiB buffer and must grow it.
  std::string body = Bytes(3 * 1024 * 1024, 7);
  WriteGz(Path("b.idx.gz"), MakeIdx(0x08, {3, 1024, 1024}, body));
  dt_idx idx;
  ASSERT_EQ(dt_idx_read(Path("b.idx.gz").c_str(), 3, &idx), DT_OK) << dt_last_error();
  EXPECT_EQ(idx.numel, 3 * 1024 * 1024);
  EXPECT_EQ(idx.dims[1], 1024);
  EXPECT_TRUE(std::string((const char *)idx.data, idx.numel) == body);
  dt_idx_free(&idx);

  WriteGz(Path("small.gz"), MakeIdx(0x08, {5}, "\x01\x02\x03\x04\x05"));
  ASSERT_EQ(dt_idx_read(Path("small.gz").c_str(), 1, &idx), DT_OK) << dt_last_error();
  EXPECT_EQ(idx.numel, 5);
  EXPECT_EQ(idx.data[4], 5);
  dt_idx_free(&idx);
}

TEST_F(DataTest, MissingFileIsIoError) {
  ExpectIdxError(Path("nope-idx1-ubyte"), 1, DT_ERR_IO, "No such file or directory");
  ExpectIdxError(dir_, 1, DT_ERR_IO, "directory");
}

TEST_F(DataTest, BadMagic) {
  WriteFile(Path("m.idx"), MakeIdx(0x08, {4}, "abcd", 0x12, 0x34));
  ExpectIdxError(Path("m.idx"), 1, DT_ERR_FORMAT, "bad magic 0x12 0x34");
  WriteFile(Path("short.idx"), std::string("\0\0", 2));
  ExpectIdxError(Path("short.idx"), 1, DT_ERR_FORMAT, "truncated header");
  WriteFile(Path("empty.idx"), "");
  ExpectIdxError(Path("empty.idx"), 1, DT_ERR_FORMAT, "truncated header");
  WriteFile(Path("dims.idx"), MakeIdx(0x08, {4, 4}, "").substr(0, 9));
  ExpectIdxError(Path("dims.idx"), 2, DT_ERR_FORMAT, "truncated header");
}

TEST_F(DataTest, UnsupportedType) {
  WriteFile(Path("f.idx"), MakeIdx(0x0D, {2}, std::string(8, '\0')));
  ExpectIdxError(Path("f.idx"), 1, DT_ERR_FORMAT, "unsupported element type 0x0d (float)");
  WriteFile(Path("i.idx"), MakeIdx(0x0C, {2}, std::string(8, '\0')));
  ExpectIdxError(Path("i.idx"), 1, DT_ERR_FORMAT, "unsupported element type 0x0c");
}

TEST_F(DataTest, WrongNumberOfDimensions) {
  WriteFile(Path("w.idx"), MakeIdx(0x08, {2, 2, 2}, Bytes(8)));
  ExpectIdxError(Path("w.idx"), 1, DT_ERR_FORMAT, "expected 1, the header says 3");
  WriteFile(Path("zero.idx"), MakeIdx(0x08, {}, ""));
  ExpectIdxError(Path("zero.idx"), 0, DT_ERR_FORMAT, "number of dimensions 0");
  WriteFile(Path("five.idx"), MakeIdx(0x08, {1, 1, 1, 1, 1}, "x"));
  ExpectIdxError(Path("five.idx"), 0, DT_ERR_FORMAT, "number of dimensions 5");
  dt_idx idx;
  EXPECT_EQ(dt_idx_read(Path("w.idx").c_str(), 7, &idx), DT_ERR_INVALID_ARG);
}

TEST_F(DataTest, ZeroAndHugeDimensions) {
  WriteFile(Path("z.idx"), MakeIdx(0x08, {3, 0, 2}, ""));
  ExpectIdxError(Path("z.idx"), 3, DT_ERR_FORMAT, "dimension 1 is 0");
  WriteFile(Path("h.idx"), MakeIdx(0x08, {0x80000000u}, "x"));
  ExpectIdxError(Path("h.idx"), 1, DT_ERR_FORMAT, "dimension 0 is 2147483648");
  // 2^31-1 x 2^31-1: each dim valid, the product absurd.
  WriteFile(Path("abs.idx"), MakeIdx(0x08, {0x7FFFFFFFu, 0x7FFFFFFFu}, "xyz"));
  ExpectIdxError(Path("abs.idx"), 2, DT_ERR_FORMAT, "absurd dimensions");
  WriteGz(Path("abs.gz"), MakeIdx(0x08, {0x7FFFFFFFu, 0x7FFFFFFFu}, "xyz"));
  ExpectIdxError(Path("abs.gz"), 2, DT_ERR_FORMAT, "absurd dimensions");
  // Raw file claiming exactly 2^32 bytes: rejected from the file size.
  WriteFile(Path("big.idx"), MakeIdx(0x08, {65536, 65536}, "0123456789"));
  ExpectIdxError(Path("big.idx"), 2, DT_ERR_FORMAT,
                 "truncated: expected 4294967296 bytes of data, found 10");
}

// A tiny gzip file claiming 2^32 bytes must fail as truncated without ever
// allocating them: run it in a child process whose address space is capped
// at 512 MiB above its current size.
TEST_F(DataTest, TinyGzipClaimingFourGigabytesDoesNotAllocateThem) {
  WriteGz(Path("claim.gz"), MakeIdx(0x08, {65536, 65536}, Bytes(1000)));
  std::string path = Path("claim.gz");
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    long vm_kb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
      if (sscanf(line, "VmSize: %ld kB", &vm_kb) == 1)
        break;
    if (f)
      fclose(f);
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = (rlim_t)vm_kb * 1024 + (512ull << 20);
    if (vm_kb == 0 || setrlimit(RLIMIT_AS, &rl) != 0)
      _exit(90);
    dt_idx idx;
    dt_status st = dt_idx_read(path.c_str(), 2, &idx);
    std::string msg = dt_last_error();
    if (st != DT_ERR_FORMAT)
      _exit(st == DT_ERR_OOM ? 91 : 92);
    if (msg.find("truncated: expected 4294967296 bytes of data, found 1000") == std::string::npos)
      _exit(93);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "90: setup failed, 91: tried to allocate the claimed size (OOM), 92: wrong status, "
         "93: wrong message";
}

TEST_F(DataTest, TruncatedAndTrailingRaw) {
  WriteFile(Path("t.idx"), MakeIdx(0x08, {10}, Bytes(7)));
  ExpectIdxError(Path("t.idx"), 1, DT_ERR_FORMAT, "truncated: expected 10 bytes of data, found 7");
  WriteFile(Path("g.idx"), MakeIdx(0x08, {10}, Bytes(12)));
  ExpectIdxError(Path("g.idx"), 1, DT_ERR_FORMAT,
                 "trailing garbage: expected 10 bytes of data, found 12");
}

TEST_F(DataTest, TruncatedCorruptAndTrailingGzip) {
  // Decompressed stream shorter than the header says.
  WriteGz(Path("short.gz"), MakeIdx(0x08, {100, 10}, Bytes(600)));
  ExpectIdxError(Path("short.gz"), 2, DT_ERR_FORMAT,
                 "truncated: expected 1000 bytes of data, found 600");

  // Compressed file cut in the middle.
  WriteGz(Path("full.gz"), MakeIdx(0x08, {200, 1000}, Bytes(200000, 3)));
  std::string gz = ReadFile(Path("full.gz"));
  ASSERT_GT(gz.size(), 1000u);
  WriteFile(Path("cut.gz"), gz.substr(0, gz.size() / 2));
  ExpectIdxError(Path("cut.gz"), 2, DT_ERR_FORMAT, "truncated: expected 200000 bytes of data");

  // Valid gzip header, garbage deflate data.
  std::string bad = gz.substr(0, 10) + Bytes(5000, 9);
  WriteFile(Path("corrupt.gz"), bad);
  ExpectIdxError(Path("corrupt.gz"), 2, DT_ERR_FORMAT, "corrupt gzip stream");

  // Decompressed content longer than the header says.
  WriteGz(Path("long.gz"), MakeIdx(0x08, {10}, Bytes(11)));
  ExpectIdxError(Path("long.gz"), 1, DT_ERR_FORMAT, "trailing garbage");
}

// The gzip trailer (CRC-32 and length) is required and checked; members may
// be concatenated; anything else after the data is refused.
TEST_F(DataTest, GzipTrailerMembersAndJunk) {
  std::string body = Bytes(600, 5);
  WriteGz(Path("ok.gz"), MakeIdx(0x08, {600}, body));
  std::string gz = ReadFile(Path("ok.gz"));
  dt_idx idx;
  for (size_t cut = 1; cut <= 8; cut++) {  // the 8-byte trailer, partly or wholly missing
    std::string p = Path("notrailer" + std::to_string(cut) + ".gz");
    WriteFile(p, gz.substr(0, gz.size() - cut));
    EXPECT_EQ(dt_idx_read(p.c_str(), 1, &idx), DT_ERR_FORMAT) << "cut " << cut;
    EXPECT_NE(std::string(dt_last_error()).find("truncated gzip stream"), std::string::npos)
        << dt_last_error();
  }
  std::string crc = gz;
  crc[crc.size() - 6] ^= 0x40;  // a bit of the stored CRC-32
  WriteFile(Path("crc.gz"), crc);
  ExpectIdxError(Path("crc.gz"), 1, DT_ERR_FORMAT, "incorrect data check");
  std::string len = gz;
  len[len.size() - 2] ^= 0x01;  // a bit of the stored length
  WriteFile(Path("len.gz"), len);
  ExpectIdxError(Path("len.gz"), 1, DT_ERR_FORMAT, "incorrect length check");
  WriteFile(Path("junk.gz"), gz + "not gzip");
  ExpectIdxError(Path("junk.gz"), 1, DT_ERR_FORMAT, "trailing garbage");
  // The same data split over two members reads back whole.
  std::string idxbytes = MakeIdx(0x08, {600}, body);
  WriteGz(Path("m1.gz"), idxbytes.substr(0, 300));
  WriteGz(Path("m2.gz"), idxbytes.substr(300));
  WriteFile(Path("two.gz"), ReadFile(Path("m1.gz")) + ReadFile(Path("m2.gz")));
  ASSERT_EQ(dt_idx_read(Path("two.gz").c_str(), 1, &idx), DT_OK) << dt_last_error();
  EXPECT_EQ(std::string((const char *)idx.data, 600), body);
  dt_idx_free(&idx);
}

TEST_F(DataTest, FifoIsRefusedNotWaitedOn) {
  std::string p = Path("fifo");
  ASSERT_EQ(mkfifo(p.c_str(), 0600), 0);
  ExpectIdxError(p, 1, DT_ERR_IO, "is not a regular file");
}

// ---- idx image datasets ----

class IdxDatasetTest : public DataTest {
 protected:
  // n images of h x w with pixel (i, j) = (i * 37 + j) % 256, labels i % 10.
  void WriteSet(const std::string &images, const std::string &labels, int n, int h, int w,
                int n_labels, bool gz, int bad_label_at = -1) {
    std::string px(n * h * w, '\0'), lb(n_labels, '\0');
    for (int i = 0; i < n; i++)
      for (int j = 0; j < h * w; j++)
        px[i * h * w + j] = (char)((i * 37 + j) % 256);
    for (int i = 0; i < n_labels; i++)
      lb[i] = (char)(i == bad_label_at ? 12 : i % 10);
    std::string a = MakeIdx(0x08, {(uint32_t)n, (uint32_t)h, (uint32_t)w}, px);
    std::string b = MakeIdx(0x08, {(uint32_t)n_labels}, lb);
    if (gz) {
      WriteGz(images, a);
      WriteGz(labels, b);
    } else {
      WriteFile(images, a);
      WriteFile(labels, b);
    }
  }
};

TEST_F(IdxDatasetTest, LoadsAndNormalises) {
  WriteSet(Path("img"), Path("lab"), 5, 2, 3, 5, false);
  dt_dataset *d = nullptr;
  const float mean = 0.5f, std = 0.25f;
  ASSERT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 10, mean, std, &d),
            DT_OK)
      << dt_last_error();
  EXPECT_EQ(dt_dataset_length(d), 5);
  ASSERT_EQ(dt_dataset_input_ndim(d), 3);
  EXPECT_EQ(dt_dataset_input_shape(d)[0], 1);
  EXPECT_EQ(dt_dataset_input_shape(d)[1], 2);
  EXPECT_EQ(dt_dataset_input_shape(d)[2], 3);
  EXPECT_EQ(dt_dataset_input_numel(d), 6);
  EXPECT_EQ(dt_dataset_num_classes(d), 10);
  float x[6];
  int32_t y = -1;
  for (int i = 0; i < 5; i++) {
    ASSERT_EQ(dt_dataset_get(d, i, x, &y), DT_OK);
    EXPECT_EQ(y, i % 10);
    for (int j = 0; j < 6; j++)
      EXPECT_NEAR(x[j], (((i * 37 + j) % 256) / 255.0f - mean) / std, 1e-6) << i << "," << j;
  }
  EXPECT_EQ(dt_dataset_get(d, 5, x, &y), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("out of range"), std::string::npos);
  EXPECT_EQ(dt_dataset_get(d, -1, x, &y), DT_ERR_INVALID_ARG);
  dt_dataset_destroy(d);
  dt_dataset_destroy(nullptr);

  // mean 0, std 1: [0, 1].
  ASSERT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 10, 0, 1, &d), DT_OK);
  ASSERT_EQ(dt_dataset_get(d, 0, x, &y), DT_OK);
  EXPECT_FLOAT_EQ(x[0], 0.0f);
  EXPECT_FLOAT_EQ(x[5], 5.0f / 255.0f);
  dt_dataset_destroy(d);
  EXPECT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 10, 0, 0, &d),
            DT_ERR_INVALID_ARG);
}

TEST_F(IdxDatasetTest, MismatchedCounts) {
  WriteSet(Path("img"), Path("lab"), 5, 2, 2, 4, false);
  dt_dataset *d = nullptr;
  EXPECT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 10, 0, 1, &d),
            DT_ERR_FORMAT);
  EXPECT_EQ(d, nullptr);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find(Path("img") + " holds 5 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find(Path("lab") + " holds 4 labels"), std::string::npos) << msg;
}

TEST_F(IdxDatasetTest, LabelOutOfRange) {
  WriteSet(Path("img"), Path("lab"), 6, 2, 2, 6, true, 3);
  dt_dataset *d = nullptr;
  EXPECT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 10, 0, 1, &d),
            DT_ERR_FORMAT);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find(Path("lab")), std::string::npos) << msg;
  EXPECT_NE(msg.find("label 12 at index 3 is out of range for 10 classes"), std::string::npos)
      << msg;
  // With enough classes the same files load.
  ASSERT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 13, 0, 1, &d), DT_OK)
      << dt_last_error();
  dt_dataset_destroy(d);
}

TEST_F(IdxDatasetTest, ImagesMustBeThreeDimensional) {
  WriteFile(Path("img"), MakeIdx(0x08, {4, 4}, Bytes(16)));
  WriteFile(Path("lab"), MakeIdx(0x08, {4}, std::string(4, '\0')));
  dt_dataset *d = nullptr;
  EXPECT_EQ(dt_dataset_idx_images(Path("img").c_str(), Path("lab").c_str(), 10, 0, 1, &d),
            DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find(Path("img")), std::string::npos);
}

TEST_F(IdxDatasetTest, MnistLikeFindsGzipAndPlainNames) {
  WriteSet(Path("train-images-idx3-ubyte.gz"), Path("train-labels-idx1-ubyte.gz"), 7, 3, 3, 7,
           true);
  WriteSet(Path("t10k-images-idx3-ubyte"), Path("t10k-labels-idx1-ubyte"), 4, 3, 3, 4, false);
  dt_dataset *d = nullptr;
  ASSERT_EQ(dt_dataset_mnist_like(dir_.c_str(), "mnist", "train", &d), DT_OK) << dt_last_error();
  EXPECT_EQ(dt_dataset_length(d), 7);
  EXPECT_EQ(dt_dataset_num_classes(d), 10);
  float x[9];
  int32_t y;
  ASSERT_EQ(dt_dataset_get(d, 0, x, &y), DT_OK);
  EXPECT_NEAR(x[0], (0.0f - 0.1307f) / 0.3081f, 1e-5);  // MNIST statistics
  dt_dataset_destroy(d);
  ASSERT_EQ(dt_dataset_mnist_like(dir_.c_str(), "mnist", "test", &d), DT_OK) << dt_last_error();
  EXPECT_EQ(dt_dataset_length(d), 4);
  dt_dataset_destroy(d);

  EXPECT_EQ(dt_dataset_mnist_like(dir_.c_str(), "mnist", "valid", &d), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("valid"), std::string::npos);
  std::string missing = Path("nothing-here");
  EXPECT_EQ(dt_dataset_mnist_like(missing.c_str(), "mnist", "train", &d), DT_ERR_IO);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("train-images-idx3-ubyte"), std::string::npos) << msg;
}

// The normalisation follows the data set's name, not the folder's: the
// same files under a folder named "fashion-stuff" are still MNIST.
TEST_F(IdxDatasetTest, NormalisationComesFromTheNameNotThePath) {
  std::string dir = Path("fashion-stuff");
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  WriteSet(dir + "/train-images-idx3-ubyte", dir + "/train-labels-idx1-ubyte", 2, 3, 3, 2, false);
  float x[9];
  int32_t y;
  for (const char *name : {"mnist", "fashion-mnist"}) {
    dt_dataset *d = nullptr;
    ASSERT_EQ(dt_dataset_mnist_like(dir.c_str(), name, "train", &d), DT_OK) << dt_last_error();
    ASSERT_EQ(dt_dataset_get(d, 0, x, &y), DT_OK);
    float want =
        std::string(name) == "mnist" ? (0.0f - 0.1307f) / 0.3081f : (0.0f - 0.2860f) / 0.3530f;
    EXPECT_NEAR(x[0], want, 1e-5) << name;
    dt_dataset_destroy(d);
  }
  dt_dataset *d = nullptr;
  EXPECT_EQ(dt_dataset_mnist_like(dir.c_str(), "cifar", "train", &d), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("fashion-mnist"), std::string::npos);
}

TEST(FashionMnist, LoadsTheInstalledDataset) {
  const char *dir = "/usr/share/datasets/fashion-mnist";
  struct stat sb;
  ASSERT_EQ(stat(dir, &sb), 0) << dir
                               << " is missing: install the Debian package dataset-fashion-mnist "
                               << "(tools/setup.sh does)";
  const float mean = 0.2860f, std = 0.3530f;
  const char *splits[2] = {"train", "test"};
  const int64_t sizes[2] = {60000, 10000};
  for (int s = 0; s < 2; s++) {
    dt_dataset *d = nullptr;
    ASSERT_EQ(dt_dataset_mnist_like(dir, "fashion-mnist", splits[s], &d), DT_OK) << dt_last_error();
    EXPECT_EQ(dt_dataset_length(d), sizes[s]);
    EXPECT_EQ(dt_dataset_input_shape(d)[0], 1);
    EXPECT_EQ(dt_dataset_input_shape(d)[1], 28);
    EXPECT_EQ(dt_dataset_input_shape(d)[2], 28);
    std::vector<float> x(784);
    int counts[10] = {0};
    for (int64_t i = 0; i < sizes[s]; i += 97) {
      int32_t y = -1;
      ASSERT_EQ(dt_dataset_get(d, i, x.data(), &y), DT_OK);
      ASSERT_GE(y, 0);
      ASSERT_LT(y, 10);
      counts[y]++;
      for (float v : x) {
        ASSERT_GE(v, (0.0f - mean) / std - 1e-5f);
        ASSERT_LE(v, (1.0f - mean) / std + 1e-5f);
      }
    }
    for (int c = 0; c < 10; c++)
      EXPECT_GT(counts[c], 0) << "class " << c;
    dt_dataset_destroy(d);
  }
}

// ---- samplers ----

std::vector<int64_t> Indices(const dt_sampler *s) {
  return std::vector<int64_t>(dt_sampler_indices(s), dt_sampler_indices(s) + dt_sampler_length(s));
}

TEST(Sampler, ShuffleIsASeededPermutation) {
  dt_sampler_config cfg = DT_SAMPLER_CONFIG_DEFAULT;
  cfg.seed = 42;
  dt_sampler *a = nullptr, *b = nullptr;
  ASSERT_EQ(dt_sampler_create(100, &cfg, &a), DT_OK);
  ASSERT_EQ(dt_sampler_create(100, &cfg, &b), DT_OK);
  ASSERT_EQ(dt_sampler_length(a), 100);
  std::vector<int64_t> e0 = Indices(a);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 100; i++)
    ASSERT_EQ(sorted[i], i);
  std::vector<int64_t> identity(100);
  for (int i = 0; i < 100; i++)
    identity[i] = i;
  EXPECT_NE(e0, identity);
  EXPECT_EQ(Indices(b), e0);  // same seed, same epoch

  ASSERT_EQ(dt_sampler_set_epoch(a, 1), DT_OK);
  std::vector<int64_t> e1 = Indices(a);
  EXPECT_NE(e1, e0);
  ASSERT_EQ(dt_sampler_set_epoch(b, 1), DT_OK);
  EXPECT_EQ(Indices(b), e1);
  ASSERT_EQ(dt_sampler_set_epoch(a, 0), DT_OK);
  EXPECT_EQ(Indices(a), e0);
  EXPECT_EQ(dt_sampler_set_epoch(a, -1), DT_ERR_INVALID_ARG);

  dt_sampler *c = nullptr;
  cfg.seed = 43;
  ASSERT_EQ(dt_sampler_create(100, &cfg, &c), DT_OK);
  EXPECT_NE(Indices(c), e0);
  dt_sampler_destroy(c);

  cfg.shuffle = 0;
  ASSERT_EQ(dt_sampler_create(100, &cfg, &c), DT_OK);
  EXPECT_EQ(Indices(c), identity);
  ASSERT_EQ(dt_sampler_set_epoch(c, 5), DT_OK);
  EXPECT_EQ(Indices(c), identity);
  dt_sampler_destroy(c);
  dt_sampler_destroy(a);
  dt_sampler_destroy(b);
  dt_sampler_destroy(nullptr);
}

TEST(Sampler, RejectsBadConfig) {
  dt_sampler_config cfg = DT_SAMPLER_CONFIG_DEFAULT;
  dt_sampler *s = nullptr;
  cfg.num_replicas = 2;
  cfg.rank = 2;
  EXPECT_EQ(dt_sampler_create(10, &cfg, &s), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("rank 2"), std::string::npos);
  cfg.rank = -1;
  EXPECT_EQ(dt_sampler_create(10, &cfg, &s), DT_ERR_INVALID_ARG);
  cfg.num_replicas = 0;
  cfg.rank = 0;
  EXPECT_EQ(dt_sampler_create(10, &cfg, &s), DT_ERR_INVALID_ARG);
  cfg.num_replicas = 1;
  EXPECT_EQ(dt_sampler_create(-1, &cfg, &s), DT_ERR_INVALID_ARG);
  ASSERT_EQ(dt_sampler_create(0, &cfg, &s), DT_OK);
  EXPECT_EQ(dt_sampler_length(s), 0);
  dt_sampler_destroy(s);
}

// torch.utils.data.DistributedSampler.__iter__, transcribed.
std::vector<int64_t> TorchShard(std::vector<int64_t> indices, int replicas, int rank,
                                bool drop_last) {
  int64_t len = (int64_t)indices.size();
  int64_t num_samples;
  if (drop_last && len % replicas != 0)
    num_samples = (int64_t)std::ceil((double)(len - replicas) / replicas);
  else
    num_samples = (int64_t)std::ceil((double)len / replicas);
  int64_t total = num_samples * replicas;
  if (!drop_last) {
    int64_t padding = total - len;
    if (padding <= len) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding);
    } else {
      std::vector<int64_t> rep;
      int64_t times = (int64_t)std::ceil((double)padding / len);
      for (int64_t t = 0; t < times; t++)
        rep.insert(rep.end(), indices.begin(), indices.end());
      indices.insert(indices.end(), rep.begin(), rep.begin() + padding);
    }
  } else {
    indices.resize(total);
  }
  std::vector<int64_t> out;
  for (int64_t i = rank; i < total; i += replicas)
    out.push_back(indices[i]);
  return out;
}

TEST(Sampler, DistributedMatchesPyTorch) {
  const int64_t lens[] = {2, 7, 10, 11, 12, 100, 101};
  for (int64_t len : lens) {
    for (int world : {2, 3, 5}) {
      for (int drop_last : {0, 1}) {
        for (int shuffle : {0, 1}) {
          dt_sampler_config cfg = DT_SAMPLER_CONFIG_DEFAULT;
          cfg.shuffle = shuffle;
          cfg.seed = 7;
          dt_sampler *whole = nullptr;
          ASSERT_EQ(dt_sampler_create(len, &cfg, &whole), DT_OK);
          ASSERT_EQ(dt_sampler_set_epoch(whole, 3), DT_OK);
          std::vector<int64_t> order = Indices(whole);
          dt_sampler_destroy(whole);

          std::multiset<int64_t> seen;
          int64_t per_rank = -1;
          for (int r = 0; r < world; r++) {
            cfg.num_replicas = world;
            cfg.rank = r;
            cfg.drop_last = drop_last;
            dt_sampler *s = nullptr;
            ASSERT_EQ(dt_sampler_create(len, &cfg, &s), DT_OK);
            ASSERT_EQ(dt_sampler_set_epoch(s, 3), DT_OK);
            std::vector<int64_t> mine = Indices(s);
            EXPECT_EQ(mine, TorchShard(order, world, r, drop_last))
                << "len " << len << " world " << world << " rank " << r << " drop_last "
                << drop_last << " shuffle " << shuffle;
            if (per_rank >= 0) {
              EXPECT_EQ((int64_t)mine.size(), per_rank);  // equal shards: no collective hangs
            }
            per_rank = (int64_t)mine.size();
            seen.insert(mine.begin(), mine.end());
            dt_sampler_destroy(s);
          }
          std::set<int64_t> distinct(seen.begin(), seen.end());
          if (drop_last) {
            // Disjoint, floor(len / world) each.
            EXPECT_EQ(per_rank, len / world);
            EXPECT_EQ(distinct.size(), seen.size()) << "shards overlap, len " << len;
          } else {
            // Covering; only the padding repeats.
            EXPECT_EQ(per_rank, (len + world - 1) / world);
            EXPECT_EQ((int64_t)distinct.size(), len) << "shards miss samples, len " << len;
            if (len >= world) {
              EXPECT_EQ((int64_t)seen.size() - len, per_rank * world - len);
            }
          }
        }
      }
    }
  }
}

// ---- loader ----

// Sample i: input (2, 3) with values i * 10 + j; label i % 7. Optionally
// fails at one index or sleeps per sample.
struct FakeSet {
  int64_t n = 0;
  int64_t fail_at = -1;
  useconds_t sleep_us = 0;
  std::atomic<int64_t> gets{0};
};

int64_t FakeLength(void *impl) { return ((FakeSet *)impl)->n; }

dt_status FakeGet(void *impl, int64_t i, float *input, int32_t *label) {
  FakeSet *s = (FakeSet *)impl;
  s->gets++;
  if (s->sleep_us)
    usleep(s->sleep_us);
  if (i == s->fail_at)
    return DT_ERROR(DT_ERR_FORMAT, "fake.bin: bad record %lld", (long long)i);
  for (int j = 0; j < 6; j++)
    input[j] = (float)(i * 10 + j);
  *label = (int32_t)(i % 7);
  return DT_OK;
}

const dt_dataset_vtable kFakeVt = {FakeLength, FakeGet, nullptr};  // impl owned by the test

class LoaderTest : public ::testing::Test {
 protected:
  void Make(int64_t n, int shuffle, int batch, int drop_last, int prefetch) {
    fake_.n = n;
    fake_.fail_at = -1;
    fake_.sleep_us = 0;
    int64_t shape[2] = {2, 3};
    ASSERT_EQ(dt_dataset_create(&kFakeVt, &fake_, shape, 2, 7, &d_), DT_OK) << dt_last_error();
    dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
    sc.shuffle = shuffle;
    sc.seed = 11;
    ASSERT_EQ(dt_sampler_create(n, &sc, &s_), DT_OK);
    dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
    lc.batch_size = batch;
    lc.drop_last = drop_last;
    lc.prefetch = prefetch;
    ASSERT_EQ(dt_loader_create(d_, s_, &lc, &l_), DT_OK) << dt_last_error();
  }
  void TearDown() override {
    dt_loader_destroy(l_);
    dt_sampler_destroy(s_);
    dt_dataset_destroy(d_);
  }
  // Runs an epoch; returns the sample ids in order and each batch's size.
  void RunEpoch(int64_t epoch, std::vector<int64_t> *ids, std::vector<int64_t> *sizes) {
    ASSERT_EQ(dt_loader_start_epoch(l_, epoch), DT_OK);
    for (;;) {
      dt_tensor *x = nullptr, *y = nullptr;
      ASSERT_EQ(dt_loader_next(l_, &x, &y), DT_OK) << dt_last_error();
      if (!x) {
        EXPECT_EQ(y, nullptr);
        break;
      }
      ASSERT_EQ(dt_tensor_ndim(x), 3);
      int64_t b = dt_tensor_dim(x, 0);
      EXPECT_EQ(dt_tensor_dim(x, 1), 2);
      EXPECT_EQ(dt_tensor_dim(x, 2), 3);
      EXPECT_EQ(dt_tensor_dtype(x), DT_DTYPE_F32);
      EXPECT_EQ(dt_tensor_dtype(y), DT_DTYPE_I32);
      ASSERT_EQ(dt_tensor_ndim(y), 1);
      ASSERT_EQ(dt_tensor_dim(y, 0), b);
      EXPECT_TRUE(dt_device_equal(dt_tensor_device(x), DT_CPU));
      std::vector<float> xs(b * 6);
      std::vector<int32_t> ys(b);
      ASSERT_EQ(dt_tensor_to_host(x, xs.data(), xs.size() * sizeof(float)), DT_OK);
      ASSERT_EQ(dt_tensor_to_host(y, ys.data(), ys.size() * sizeof(int32_t)), DT_OK);
      for (int64_t k = 0; k < b; k++) {
        int64_t id = (int64_t)xs[k * 6] / 10;
        for (int j = 0; j < 6; j++)
          ASSERT_EQ(xs[k * 6 + j], (float)(id * 10 + j));
        EXPECT_EQ(ys[k], id % 7);
        ids->push_back(id);
      }
      sizes->push_back(b);
      dt_tensor_release(x);
      dt_tensor_release(y);
    }
  }

  // One epoch, whose batches must have the sizes `want` (and
  // dt_loader_num_batches count them beforehand); the ids, in order.
  std::vector<int64_t> EpochWithBatches(int64_t epoch, const std::vector<int64_t> &want) {
    EXPECT_EQ(dt_loader_num_batches(l_), (int64_t)want.size());
    std::vector<int64_t> ids, sizes;
    RunEpoch(epoch, &ids, &sizes);
    EXPECT_EQ(sizes, want);
    return ids;
  }

  FakeSet fake_;
  dt_dataset *d_ = nullptr;
  dt_sampler *s_ = nullptr;
  dt_loader *l_ = nullptr;
};

TEST_F(LoaderTest, EverySampleOnceWithShuffleAndPartialLastBatch) {
  Make(103, 1, 10, 0, 2);
  std::vector<int64_t> batches(10, 10);
  batches.push_back(3);
  std::vector<int64_t> ids = EpochWithBatches(0, batches);
  ASSERT_EQ(ids.size(), 103u);
  EXPECT_EQ(ids, Indices(s_));  // the sampler's order
  std::vector<int64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 103; i++)
    ASSERT_EQ(sorted[i], i);

  // Next epoch: a different order, still every sample once; after the end
  // next keeps answering "done".
  std::vector<int64_t> ids1, sizes1;
  RunEpoch(1, &ids1, &sizes1);
  EXPECT_NE(ids1, ids);
  std::sort(ids1.begin(), ids1.end());
  EXPECT_EQ(ids1, sorted);
  dt_tensor *x = nullptr, *y = nullptr;
  EXPECT_EQ(dt_loader_next(l_, &x, &y), DT_OK);
  EXPECT_EQ(x, nullptr);
}

TEST_F(LoaderTest, DropLastDropsThePartialBatch) {
  Make(103, 0, 10, 1, 3);
  std::vector<int64_t> ids = EpochWithBatches(0, std::vector<int64_t>(10, 10));
  ASSERT_EQ(ids.size(), 100u);
  for (int i = 0; i < 100; i++)
    EXPECT_EQ(ids[i], i);  // sequential sampler
}

TEST_F(LoaderTest, PrefetchOneAndBatchLargerThanDataset) {
  Make(5, 1, 8, 0, 1);
  std::vector<int64_t> ids, sizes;
  RunEpoch(0, &ids, &sizes);
  ASSERT_EQ(sizes.size(), 1u);
  EXPECT_EQ(sizes[0], 5);
  dt_loader_destroy(l_);
  l_ = nullptr;
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = 8;
  lc.drop_last = 1;
  ASSERT_EQ(dt_loader_create(d_, s_, &lc, &l_), DT_OK);
  EXPECT_EQ(dt_loader_num_batches(l_), 0);
  ids.clear();
  sizes.clear();
  RunEpoch(0, &ids, &sizes);
  EXPECT_TRUE(sizes.empty());
}

TEST_F(LoaderTest, RejectsBadConfigAndNextBeforeStart) {
  Make(10, 0, 4, 0, 2);
  dt_tensor *x = nullptr, *y = nullptr;
  EXPECT_EQ(dt_loader_next(l_, &x, &y), DT_ERR_STATE);
  EXPECT_NE(std::string(dt_last_error()).find("dt_loader_start_epoch"), std::string::npos);
  dt_loader *l = nullptr;
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = 0;
  EXPECT_EQ(dt_loader_create(d_, s_, &lc, &l), DT_ERR_INVALID_ARG);
  lc.batch_size = 4;
  lc.prefetch = 0;
  EXPECT_EQ(dt_loader_create(d_, s_, &lc, &l), DT_ERR_INVALID_ARG);
  EXPECT_EQ(l, nullptr);
  dt_loader_destroy(nullptr);
}

TEST_F(LoaderTest, DestroyMidEpochDoesNotHang) {
  Make(1000, 1, 16, 0, 4);
  fake_.sleep_us = 200;
  ASSERT_EQ(dt_loader_start_epoch(l_, 0), DT_OK);
  dt_tensor *x = nullptr, *y = nullptr;
  ASSERT_EQ(dt_loader_next(l_, &x, &y), DT_OK);
  ASSERT_NE(x, nullptr);
  dt_tensor_release(x);
  dt_tensor_release(y);
  // Restarting mid-epoch stops the old worker and begins afresh.
  ASSERT_EQ(dt_loader_start_epoch(l_, 1), DT_OK);
  ASSERT_EQ(dt_loader_next(l_, &x, &y), DT_OK);
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_loader_destroy(l_);  // worker blocked on a full ring or inside get
  l_ = nullptr;
  // The worker stopped well before the epoch's 1000 + 16 samples.
  EXPECT_LT(fake_.gets.load(), 1000);

  // Destroy right after start, before any next.
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  ASSERT_EQ(dt_loader_create(d_, s_, &lc, &l_), DT_OK);
  ASSERT_EQ(dt_loader_start_epoch(l_, 0), DT_OK);
}

TEST_F(LoaderTest, WorkerErrorsReachTheCaller) {
  Make(100, 0, 10, 0, 2);
  fake_.fail_at = 42;
  ASSERT_EQ(dt_loader_start_epoch(l_, 0), DT_OK);
  for (int b = 0; b < 4; b++) {
    dt_tensor *x = nullptr, *y = nullptr;
    ASSERT_EQ(dt_loader_next(l_, &x, &y), DT_OK) << "batch " << b << ": " << dt_last_error();
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  for (int again = 0; again < 2; again++) {
    dt_tensor *x = nullptr, *y = nullptr;
    dt_clear_error();
    EXPECT_EQ(dt_loader_next(l_, &x, &y), DT_ERR_FORMAT);
    EXPECT_EQ(x, nullptr);
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find("fake.bin: bad record 42"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sample 42 (batch 4)"), std::string::npos) << msg;
  }
  // A new epoch without the fault runs to the end.
  fake_.fail_at = -1;
  std::vector<int64_t> ids, sizes;
  RunEpoch(1, &ids, &sizes);
  EXPECT_EQ(ids.size(), 100u);
}

TEST_F(LoaderTest, DistributedShardsThroughTheLoader) {
  Make(10, 1, 4, 0, 2);
  std::multiset<int64_t> all;
  for (int r = 0; r < 3; r++) {
    dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
    sc.seed = 5;
    sc.num_replicas = 3;
    sc.rank = r;
    dt_sampler *s = nullptr;
    ASSERT_EQ(dt_sampler_create(10, &sc, &s), DT_OK);
    dt_loader *l = nullptr;
    dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
    lc.batch_size = 4;
    ASSERT_EQ(dt_loader_create(d_, s, &lc, &l), DT_OK);
    EXPECT_EQ(dt_loader_num_batches(l), 1);  // 4 samples per rank
    std::swap(l, l_);
    std::vector<int64_t> ids, sizes;
    RunEpoch(2, &ids, &sizes);
    std::swap(l, l_);
    EXPECT_EQ(ids, Indices(s));
    all.insert(ids.begin(), ids.end());
    dt_loader_destroy(l);
    dt_sampler_destroy(s);
  }
  EXPECT_EQ(all.size(), 12u);  // 10 samples + 2 padding
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 10u);
}

// ---- in-memory data sets (dt_dataset_from_memory) ----

// A layout: inputs (2, 3) of `in`, targets (2) of `tgt`.
dt_sample_layout MemoryLayout(dt_dtype in, dt_dtype tgt) {
  dt_sample_layout lay = {};
  lay.input_dtype = in;
  lay.input_ndim = 2;
  lay.input_shape[0] = 2;
  lay.input_shape[1] = 3;
  lay.target_dtype = tgt;
  lay.target_ndim = 1;
  lay.target_shape[0] = 2;
  return lay;
}

TEST(MemoryDataset, HoldsACopyOfTheSamplesBitForBit) {
  const int64_t n = 5;
  // f16 inputs (raw bit patterns, NaN and -0 among them) and i64 targets.
  std::vector<uint16_t> in(n * 6);
  std::vector<int64_t> tgt(n * 2);
  for (size_t i = 0; i < in.size(); i++)
    in[i] = (uint16_t)(0x3c00u + 97u * i);
  in[3] = 0x7e01;  // a NaN with a payload
  in[4] = 0x8000;  // -0
  for (size_t i = 0; i < tgt.size(); i++)
    tgt[i] = (int64_t)(i * 1000003) - 7;
  dt_sample_layout lay = MemoryLayout(DT_DTYPE_F16, DT_DTYPE_I64);
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_from_memory(&lay, in.data(), tgt.data(), n, 7, &d));
  std::vector<uint16_t> want_in = in;
  std::vector<int64_t> want_tgt = tgt;
  std::fill(in.begin(), in.end(), 0);  // the caller's buffers are its own again
  std::fill(tgt.begin(), tgt.end(), 0);

  EXPECT_EQ(dt_dataset_length(d), n);
  EXPECT_EQ(dt_dataset_num_classes(d), 7);
  EXPECT_EQ(dt_dataset_input_numel(d), 6);
  dtt::ExpectSameLayout(dt_dataset_layout(d), MemoryLayout(DT_DTYPE_F16, DT_DTYPE_I64));
  for (int64_t i = 0; i < n; i++) {
    uint16_t x[6];
    int64_t y[2];
    ASSERT_DT_OK(dt_dataset_get_sample(d, i, x, y));
    EXPECT_EQ(memcmp(x, &want_in[i * 6], sizeof x), 0) << "sample " << i;
    EXPECT_EQ(memcmp(y, &want_tgt[i * 2], sizeof y), 0) << "sample " << i;
  }
  uint16_t x[6];
  int64_t y[2];
  EXPECT_EQ(dt_dataset_get_sample(d, n, x, y), DT_ERR_INVALID_ARG);
  // Not f32 images with i32 labels: dt_dataset_get refuses.
  float fx[6];
  int32_t label;
  EXPECT_EQ(dt_dataset_get(d, 0, fx, &label), DT_ERR_DTYPE);
  dt_dataset_destroy(d);
  dt_dataset_destroy(nullptr);
}

TEST(MemoryDataset, RefusesBadArguments) {
  float in[6 * 2] = {0};
  int32_t tgt[2 * 2] = {0};
  dt_sample_layout lay = MemoryLayout(DT_DTYPE_F32, DT_DTYPE_I32);
  dt_dataset *d = reinterpret_cast<dt_dataset *>(&lay);  // must come back NULL
  EXPECT_EQ(dt_dataset_from_memory(&lay, in, tgt, 2, 2, nullptr), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_dataset_from_memory(nullptr, in, tgt, 2, 2, &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(d, nullptr);
  EXPECT_EQ(dt_dataset_from_memory(&lay, nullptr, tgt, 2, 2, &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_dataset_from_memory(&lay, in, nullptr, 2, 2, &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_dataset_from_memory(&lay, in, tgt, 0, 2, &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_dataset_from_memory(&lay, in, tgt, -1, 2, &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(dt_dataset_from_memory(&lay, in, tgt, 2, 0, &d), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("num_classes"), std::string::npos) << dt_last_error();
  dt_sample_layout bad = lay;
  bad.input_ndim = 0;  // an input has at least one dim
  EXPECT_EQ(dt_dataset_from_memory(&bad, in, tgt, 2, 2, &d), DT_ERR_INVALID_ARG);
  bad = lay;
  bad.input_ndim = DT_MAX_DIMS;  // no dim left for the batch
  EXPECT_EQ(dt_dataset_from_memory(&bad, in, tgt, 2, 2, &d), DT_ERR_INVALID_ARG);
  bad = lay;
  bad.target_shape[0] = 0;
  EXPECT_EQ(dt_dataset_from_memory(&bad, in, tgt, 2, 2, &d), DT_ERR_INVALID_ARG);
  bad = lay;
  bad.input_dtype = (dt_dtype)99;
  EXPECT_EQ(dt_dataset_from_memory(&bad, in, tgt, 2, 2, &d), DT_ERR_INVALID_ARG);
  // More samples than memory can address (refused before any copy).
  bad = lay;
  bad.input_ndim = 1;
  bad.input_shape[0] = INT64_C(1) << 31;
  EXPECT_EQ(dt_dataset_from_memory(&bad, in, tgt, INT64_C(1) << 40, 2, &d), DT_ERR_INVALID_ARG);
  EXPECT_EQ(d, nullptr);
}

TEST(MemoryDataset, TheLoaderBatchesItsSamples) {
  // 10 samples, f32 inputs (3) = i + j / 10, one i32 label each = i % 4.
  const int n = 10;
  std::vector<float> in(n * 3);
  std::vector<int32_t> tgt(n);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < 3; j++)
      in[i * 3 + j] = (float)i + (float)j / 10.0f;
    tgt[i] = i % 4;
  }
  dt_sample_layout lay = {};
  lay.input_dtype = DT_DTYPE_F32;
  lay.input_ndim = 1;
  lay.input_shape[0] = 3;
  lay.target_dtype = DT_DTYPE_I32;
  lay.target_ndim = 0;
  dt_dataset *d = nullptr;
  ASSERT_DT_OK(dt_dataset_from_memory(&lay, in.data(), tgt.data(), n, 4, &d));
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.seed = 3;
  dt_sampler *s = nullptr;
  ASSERT_DT_OK(dt_sampler_create(n, &sc, &s));
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = 4;
  dt_loader *l = nullptr;
  ASSERT_DT_OK(dt_loader_create(d, s, &lc, &l));
  EXPECT_EQ(dt_loader_num_batches(l), 3);
  ASSERT_DT_OK(dt_loader_start_epoch(l, 0));
  std::vector<int> seen;
  for (;;) {
    dt_tensor *x = nullptr, *y = nullptr;
    ASSERT_DT_OK(dt_loader_next(l, &x, &y));
    if (!x)
      break;
    int64_t b = dt_tensor_dim(x, 0);
    ASSERT_EQ(dt_tensor_ndim(x), 2);
    ASSERT_EQ(dt_tensor_dim(x, 1), 3);
    ASSERT_EQ(dt_tensor_ndim(y), 1);
    ASSERT_EQ(dt_tensor_dim(y, 0), b);
    const float *xs = static_cast<const float *>(dt_tensor_data(x));
    const int32_t *ys = static_cast<const int32_t *>(dt_tensor_data(y));
    for (int64_t k = 0; k < b; k++) {
      int i = (int)xs[k * 3];
      for (int j = 0; j < 3; j++)
        EXPECT_EQ(xs[k * 3 + j], in[i * 3 + j]);
      EXPECT_EQ(ys[k], i % 4);
      seen.push_back(i);
    }
    dt_tensor_release(x);
    dt_tensor_release(y);
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(n);
  for (int i = 0; i < n; i++)
    all[i] = i;
  EXPECT_EQ(seen, all);
  dt_loader_destroy(l);
  dt_sampler_destroy(s);
  dt_dataset_destroy(d);
}

}  // namespace
