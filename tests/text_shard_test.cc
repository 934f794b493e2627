// Token shards in llm.c's format (core/text.h): the exact bytes written,
// the round trip, every corruption the reader must name (file and byte
// offset, DT_ERR_FORMAT), a fuzz over truncated and bit-flipped files that
// must never crash or accept a bad token, and the unigram baseline.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/text.h"
#include "tests/text_test_util.h"

namespace {

class Shard : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dtt::MakeTempDir("shard"); }
  std::string Path(const std::string &name) { return dir_ + "/" + name; }
  std::string dir_;
};

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; i++)
    v.push_back((i * 7919) % 50257);
  return v;
}

int32_t Le32(const std::string &b, size_t at) {
  uint32_t v = 0;
  for (int k = 3; k >= 0; k--)
    v = v << 8 | (uint8_t)b[at + k];
  return (int32_t)v;
}

void PutLe32(std::string *b, size_t at, int32_t v) {
  for (int k = 0; k < 4; k++)
    (*b)[at + k] = (char)((uint32_t)v >> (8 * k));
}

TEST_F(Shard, WritesLlmcsLayout) {
  std::vector<int32_t> t = Tokens(1000);
  t[3] = 65535;
  ASSERT_EQ(dt_shard_write(Path("a.bin").c_str(), t.data(), (int64_t)t.size()), DT_OK)
      << dt_last_error();
  std::string b = dtt::ReadFile(Path("a.bin"));
  ASSERT_EQ(b.size(), 1024u + 2 * t.size());
  EXPECT_EQ(Le32(b, 0), 20240520);
  EXPECT_EQ(Le32(b, 4), 1);
  EXPECT_EQ(Le32(b, 8), 1000);
  for (size_t i = 12; i < 1024; i++)
    ASSERT_EQ(b[i], 0) << "header byte " << i;
  for (size_t i = 0; i < t.size(); i++)
    ASSERT_EQ((uint8_t)b[1024 + 2 * i] | (uint8_t)b[1024 + 2 * i + 1] << 8, t[i]);

  dt_shard s;
  ASSERT_EQ(dt_shard_read(Path("a.bin").c_str(), 0, &s), DT_OK) << dt_last_error();
  ASSERT_EQ(s.num_tokens, 1000);
  for (size_t i = 0; i < t.size(); i++)
    ASSERT_EQ(s.tokens[i], t[i]);
  dt_shard_free(&s);
  dt_shard_free(&s);  // freeing twice is safe: it was zeroed

  // Empty shards are valid; no temporary file is left behind.
  ASSERT_EQ(dt_shard_write(Path("empty.bin").c_str(), nullptr, 0), DT_OK);
  ASSERT_EQ(dt_shard_read(Path("empty.bin").c_str(), 50257, &s), DT_OK);
  EXPECT_EQ(s.num_tokens, 0);
  dt_shard_free(&s);
  std::vector<std::string> names;
  DIR *d = opendir(dir_.c_str());
  ASSERT_NE(d, nullptr);
  for (struct dirent *e; (e = readdir(d)) != nullptr;)
    if (e->d_name[0] != '.')
      names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.bin", "empty.bin"}));
}

TEST_F(Shard, WriteRejectsWhatUint16CannotHold) {
  int32_t bad[] = {1, 2, 65536};
  EXPECT_EQ(dt_shard_write(Path("b.bin").c_str(), bad, 3), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("token 2 is 65536"), std::string::npos);
  bad[2] = -1;
  EXPECT_EQ(dt_shard_write(Path("b.bin").c_str(), bad, 3), DT_ERR_INVALID_ARG);
  std::string nodir = Path("no/such/dir/x.bin");
  EXPECT_EQ(dt_shard_write(nodir.c_str(), bad, 2), DT_ERR_IO);
  EXPECT_NE(std::string(dt_last_error()).find(nodir), std::string::npos);
}

// Each corruption: DT_ERR_FORMAT, naming the file and the byte offset.
TEST_F(Shard, ReaderNamesEachCorruption) {
  std::vector<int32_t> t = Tokens(100);
  std::string path = Path("c.bin");
  ASSERT_EQ(dt_shard_write(path.c_str(), t.data(), 100), DT_OK);
  const std::string good = dtt::ReadFile(path);
  struct Case {
    const char *what;
    std::string bytes;
    const char *message;
  };
  std::vector<Case> cases;
  std::string b = good;
  PutLe32(&b, 0, 20240521);
  cases.push_back({"magic", b, "byte offset 0: magic 20240521, expected 20240520"});
  b = good;
  PutLe32(&b, 4, 2);
  cases.push_back({"version", b, "byte offset 4: version 2, expected 1"});
  b = good;
  PutLe32(&b, 8, -5);
  cases.push_back({"negative count", b, "byte offset 8: token count -5 is negative"});
  b = good;
  PutLe32(&b, 8, 101);
  cases.push_back(
      {"count too large", b, "needs a file of 1226 bytes, this one has 1224 (truncated)"});
  cases.push_back({"trailing data", good + "xx", "this one has 1226 (trailing data)"});
  cases.push_back({"truncated tokens", good.substr(0, 1100), "(truncated)"});
  cases.push_back(
      {"truncated header", good.substr(0, 1000), "byte offset 1000: the file has 1000"});
  cases.push_back({"empty file", "", "byte offset 0: the file has 0 bytes"});
  b = good;
  b[1024 + 2 * 37] = (char)0xFF;
  b[1024 + 2 * 37 + 1] = (char)0xC8;  // 51455 >= 50257
  cases.push_back({"token outside the vocabulary", b,
                   "byte offset 1098: token 37 is 51455, outside the vocabulary of 50257"});
  for (const Case &c : cases) {
    dtt::WriteFile(path, c.bytes);
    dt_shard s;
    s.num_tokens = 123;
    EXPECT_EQ(dt_shard_read(path.c_str(), 50257, &s), DT_ERR_FORMAT) << c.what;
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find(path), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << msg;
    EXPECT_EQ(s.tokens, nullptr) << c.what;
    EXPECT_EQ(s.num_tokens, 0) << c.what;
  }
  dt_shard s;
  std::string missing = Path("missing.bin");
  EXPECT_EQ(dt_shard_read(missing.c_str(), 50257, &s), DT_ERR_IO);
  EXPECT_NE(std::string(dt_last_error()).find(missing), std::string::npos);
  EXPECT_EQ(dt_shard_read(dir_.c_str(), 50257, &s), DT_ERR_IO) << "a folder is not a shard";
}

// Truncations, bit flips and random junk: the reader returns DT_OK or
// DT_ERR_FORMAT, never crashes, and what it accepts is consistent.
TEST_F(Shard, FuzzNeverCrashesOrAcceptsBadTokens) {
  std::vector<int32_t> t = Tokens(300);
  std::string path = Path("f.bin");
  ASSERT_EQ(dt_shard_write(path.c_str(), t.data(), 300), DT_OK);
  const std::string good = dtt::ReadFile(path);
  dt_generator g;
  dt_generator_init(&g, 2024);
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 1500; trial++) {
    std::string b = good;
    switch (trial % 4) {
      case 0:  // truncate anywhere
        b.resize(dt_generator_below(&g, good.size() + 1));
        break;
      case 1:    // flip one bit anywhere
      case 2: {  // flip a few bits, mostly in the header
        int flips = trial % 4 == 1 ? 1 : 1 + (int)dt_generator_below(&g, 4);
        for (int k = 0; k < flips; k++) {
          size_t at =
              trial % 4 == 1 ? dt_generator_below(&g, b.size()) : dt_generator_below(&g, 16);
          b[at] ^= (char)(1 << dt_generator_below(&g, 8));
        }
        break;
      }
      case 3:  // random bytes behind a valid magic and version
        b.resize(dt_generator_below(&g, 2000));
        for (char &c : b)
          c = (char)dt_generator_below(&g, 256);
        if (b.size() >= 8) {
          PutLe32(&b, 0, 20240520);
          PutLe32(&b, 4, 1);
        }
        break;
    }
    dtt::WriteFile(path, b);
    dt_shard s;
    dt_status st = dt_shard_read(path.c_str(), 50257, &s);
    ASSERT_TRUE(st == DT_OK || st == DT_ERR_FORMAT)
        << "trial " << trial << ": " << dt_status_name(st) << " " << dt_last_error();
    if (st == DT_OK) {
      accepted++;
      ASSERT_EQ(1024 + 2 * s.num_tokens, (int64_t)b.size());
      for (int64_t i = 0; i < s.num_tokens; i++)
        ASSERT_LT(s.tokens[i], 50257);
    } else {
      rejected++;
      ASSERT_NE(std::string(dt_last_error()).find("byte offset"), std::string::npos);
    }
    dt_shard_free(&s);
  }
  EXPECT_GT(accepted, 50) << "flips in the 253 unused header words and in tokens stay valid";
  EXPECT_GT(rejected, 800);
}

TEST(Unigram, CrossEntropyWithAddOneSmoothing) {
  // train: 0 0 0 1, vocab 4 -> p = (4/8, 2/8, 1/8, 1/8)
  std::vector<uint16_t> tr = {0, 0, 0, 1}, ev = {0, 1, 2};
  dt_shard train = {tr.data(), 4}, eval = {ev.data(), 3};
  double nats = 0;
  ASSERT_EQ(dt_unigram_cross_entropy(&train, &eval, 4, &nats), DT_OK) << dt_last_error();
  EXPECT_NEAR(nats, -(std::log(0.5) + std::log(0.25) + std::log(0.125)) / 3, 1e-12);
  ev[2] = 9;
  EXPECT_EQ(dt_unigram_cross_entropy(&train, &eval, 4, &nats), DT_ERR_INVALID_ARG);
  dt_shard empty = {nullptr, 0};
  EXPECT_EQ(dt_unigram_cross_entropy(&train, &empty, 4, &nats), DT_ERR_INVALID_ARG);
}

}  // namespace
