// The C tokenizer against the reference: gpt-3-encoder@1.1.4's own
// Encoder.js, run by node (tests/gpt2_reference_encode.js), token for token:
// on the whole Brown corpus as dtrain detags it (training and validation
// files), on nasty inputs (scripts, emoji, whitespace runs, contractions,
// control bytes), on the pre-tokenisation of invalid UTF-8 (which JS sees as
// U+FFFD), and on a small vocabulary that exercises Encoder.js's "a,b"
// merge keys. Also: the Unicode class tables equal this node's, and the
// Brown unigram baseline is in its range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/text.h"
#include "tests/text_test_util.h"

namespace {

class Reference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = dtt::TextDataDir();
    if (data_.empty() || dt_bpe_load_dir((data_ + "/gpt2").c_str(), nullptr, &bpe_) != DT_OK)
      error_ = "no GPT-2 tokenizer files (" + std::string(dt_last_error()) +
               "): run tools/setup.sh, or set DT_DATA_DIR";
  }
  static void TearDownTestSuite() {
    dt_bpe_destroy(bpe_);
    bpe_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(bpe_, nullptr) << error_; }

  // Encodes the texts with both encoders and compares; returns the number
  // of tokens compared.
  static int64_t Compare(const std::vector<std::string> &texts,
                         const std::vector<std::string> &names = {}) {
    std::vector<std::vector<uint32_t>> want;
    std::string error;
    EXPECT_TRUE(dtt::ReferenceEncode(data_ + "/gpt2", texts, false, &want, &error)) << error;
    if (want.size() != texts.size())
      return 0;
    int64_t compared = 0;
    for (size_t i = 0; i < texts.size(); i++) {
      dt_tokens got = {};
      EXPECT_EQ(dt_bpe_encode(bpe_, texts[i].data(), texts[i].size(), &got), DT_OK);
      std::vector<uint32_t> g(got.data, got.data + got.len);
      dt_tokens_free(&got);
      std::string name = i < names.size() ? names[i] : "input " + std::to_string(i);
      EXPECT_EQ(g.size(), want[i].size()) << name;
      size_t n = std::min(g.size(), want[i].size()), k = 0;
      while (k < n && g[k] == want[i][k])
        k++;
      EXPECT_EQ(k, std::max(g.size(), want[i].size()))
          << name << ": first difference at token " << k << ": C "
          << (k < g.size() ? std::to_string(g[k]) : "end") << ", Encoder.js "
          << (k < want[i].size() ? std::to_string(want[i][k]) : "end");
      compared += (int64_t)n;
    }
    return compared;
  }

  static std::string data_, error_;
  static dt_bpe *bpe_;
};
std::string Reference::data_, Reference::error_;
dt_bpe *Reference::bpe_ = nullptr;

// The whole corpus, train and validation files, each detagged file encoded
// whole, as `dtrain tokenize` does.
TEST_F(Reference, WholeBrownCorpus) {
  std::string raw = data_ + "/brown/raw";
  std::vector<std::string> texts, names;
  for (char genre = 'a'; genre <= 'r'; genre++)
    for (int k = 1; k <= 99; k++) {
      char name[8];
      snprintf(name, sizeof name, "c%c%02d", genre, k);
      std::string tagged = dtt::ReadFile(raw + "/" + name);
      if (tagged.empty())
        continue;
      dt_bytes text = {};
      ASSERT_EQ(dt_brown_detag(tagged.data(), tagged.size(), &text), DT_OK);
      texts.emplace_back(reinterpret_cast<char *>(text.data), (size_t)text.len);
      names.push_back(name);
      dt_bytes_free(&text);
    }
  ASSERT_EQ(texts.size(), 500u) << "the Brown corpus in " << raw
                                << " is incomplete: run tools/setup.sh";
  int64_t compared = Compare(texts, names);
  printf("compared %lld tokens of the Brown corpus (500 files) with Encoder.js\n",
         (long long)compared);
  RecordProperty("tokens_compared", std::to_string(compared));
  EXPECT_GT(compared, 1200000);
}

TEST_F(Reference, NastyInputs) {
  std::vector<std::string> texts = {
      // contractions, in and out of words, cased, doubled
      "I'm he's they're we've she'll it'd can't 'S 'RE ''s '''t x'ss rock'n'roll  's\t're\n've "
      "don\xe2\x80\x99t",
      // whitespace: runs, Unicode spaces (NBSP, em space, ideographic, BOM, line separator), NEL
      // and the information separators (not \s in JS), CRLF, trailing spaces
      "a  b   c\t\td\n\n\ne \xc2\xa0\xc2\xa0"
      "f\xe2\x80\x83g\r\n\r\nh   \n  i\xe3\x80\x80\xe3\x80\x80j \xef\xbb\xbfk "
      "\xe2\x80\xa8l\xc2\x85m\x1c\x1dn       \n",
      "end with spaces   ",
      " \t \n ",
      "\xef\xbb\xbfstarts with a BOM",
      // emoji: skin tone, ZWJ family, flags, keycap, snowman + VS16, math letters/digits
      "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family: "
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 flags "
      "\xf0\x9f\x87\xab\xf0\x9f\x87\xb7 keycap 1\xef\xb8\x8f\xe2\x83\xa3 \xe2\x98\x83\xef\xb8\x8f "
      "\xf0\x9d\x94\x98\xf0\x9d\x94\xab \xf0\x9d\x9f\x98\xf0\x9d\x9f\x99",
      // scripts, fractions, superscripts, Roman numerals, Arabic-Indic and Thai digits
      "\xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac "
      "\xd0\xa0\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 \xe4\xb8\xad\xe6\x96\x87 "
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 "
      "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9 "
      "\xd7\xa2\xd7\x91\xd7\xa8\xd7\x99\xd7\xaa "
      "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80 "
      "\xc2\xbd \xc2\xb2 \xe2\x85\xab \xd9\xa3\xd9\xa4\xd9\xa5 \xe0\xb9\x91\xe0\xb9\x92",
      // combining marks (letters? no: \p{M}, so "other")
      "e\xcc\x81 n\xcc\x83 a\xcc\x8a\xcc\xa3 \xe0\xa4\x95\xe0\xa5\x8d\xe0\xa4\xb7",
      // control bytes, NUL and DEL
      std::string("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x1b\x7f a\x00"
                  "b \x01\x02 c",
                  23),
      // JSON-ish punctuation: Encoder.js's "a,b" merge keys
      "{\"a\",\"b\"},[\"x\",\"y\"],[\",\",\",[\"],'','x',',\",\",\",\".\",\" \",\"],\" \" "
      "\",,,\",\"",
      "1234567890 3.14159 1,000,000 0x1F 1e10",
      "Hello, World! It's 2024... (really?) -- \"quotes\" & 'single' <tag> <|endoftext|>",
      "!!!???...,,,;;;:::---___***&&&###@@@$$$%%%^^^~~~```|||\\\\\\///",
      std::string(3000, 'a') + " " + std::string(2000, 'b') + " supercalifragilistic",
  };
  // Random text over a mix of ASCII, Latin, Greek, CJK, emoji and spaces.
  std::vector<uint32_t> pool;
  for (uint32_t c = 32; c < 127; c++)
    for (int k = 0; k < 3; k++)
      pool.push_back(c);
  for (uint32_t c : {0xA0u, 0x370u, 0x4E00u, 0x1F600u, 0x2000u, 0x660u})
    for (uint32_t k = 0; k < 80; k++)
      pool.push_back(c + k);
  for (int k = 0; k < 40; k++)
    for (uint32_t c : {0x20u, 0x20u, 0x0Au, 0x09u, 0x27u, 0x2019u})
      pool.push_back(c);
  dt_generator g;
  dt_generator_init(&g, 5);
  for (int t = 0; t < 20; t++) {
    std::string s;
    for (int i = 0; i < 2000; i++) {
      uint32_t c = pool[dt_generator_below(&g, pool.size())];
      if (c >= 0xD800 && c <= 0xDFFF)
        continue;
      if (c < 0x80) {
        s += (char)c;
      } else if (c < 0x800) {
        s += (char)(0xC0 | (c >> 6));
        s += (char)(0x80 | (c & 0x3F));
      } else if (c < 0x10000) {
        s += (char)(0xE0 | (c >> 12));
        s += (char)(0x80 | ((c >> 6) & 0x3F));
        s += (char)(0x80 | (c & 0x3F));
      } else {
        s += (char)(0xF0 | (c >> 18));
        s += (char)(0x80 | ((c >> 12) & 0x3F));
        s += (char)(0x80 | ((c >> 6) & 0x3F));
        s += (char)(0x80 | (c & 0x3F));
      }
    }
    texts.push_back(s);
  }
  int64_t compared = Compare(texts);
  printf("compared %lld tokens of %zu nasty inputs with Encoder.js\n", (long long)compared,
         texts.size());
  EXPECT_GT(compared, 20000);
}

// Invalid UTF-8 has no JS string; Encoder.js would see U+FFFD ("other") for
// it. dtrain counts each bad byte as an "other" character, so it cuts the
// text into as many pieces as the regex cuts the replaced text.
TEST_F(Reference, InvalidUtf8PiecesMatchTheReplacedText) {
  std::vector<std::string> texts = {
      "a\xff"
      "b",
      " \x80\x80 word",
      "caf\xc3 ok",
      "\xed\xa0\x80surrogate",
      "\xc0\xaf overlong",
      "x \xf4\x90\x80\x80 y",
      "trunc\xe2\x82",
      "\xfe\xfe\xfe  \xff",
      "it\xff's",
      "1\xff"
      "2 3",
  };
  dt_generator g;
  dt_generator_init(&g, 77);
  for (int t = 0; t < 30; t++) {
    std::string s;
    for (int i = 0; i < 200; i++)
      s += "ab1 '\n\xc3\xa9\x80\xff\xe2\x82"[dt_generator_below(&g, 12)];
    texts.push_back(s);
  }
  std::vector<std::vector<uint32_t>> want;
  std::string error;
  ASSERT_TRUE(dtt::ReferenceEncode(data_ + "/gpt2", texts, true, &want, &error)) << error;
  for (size_t i = 0; i < texts.size(); i++) {
    uint32_t pieces = 0;
    for (size_t p = 0; p < texts[i].size(); pieces++)
      p = dt_bpe_piece_end(texts[i].data(), texts[i].size(), p);
    EXPECT_EQ(pieces, want[i][0]) << "input " << i;
    // And any bytes round-trip.
    dt_tokens ids = {};
    dt_bytes back = {};
    ASSERT_EQ(dt_bpe_encode(bpe_, texts[i].data(), texts[i].size(), &ids), DT_OK);
    ASSERT_EQ(dt_bpe_decode(bpe_, ids.data, ids.len, &back), DT_OK);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(back.data), (size_t)back.len), texts[i]);
    dt_tokens_free(&ids);
    dt_bytes_free(&back);
  }
}

// Encoder.js itself, on a small vocabulary where its "a,b" keys change the
// result: ['",' '"'] merges through the key of '"' + ',"'.
TEST_F(Reference, JsPairKeysOnASmallVocabulary) {
  std::string dir = dtt::MakeTempDir("small_vocab");
  std::string encoder = "{";
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int c = printable ? b : 256 + n++;
    std::string s;
    if (c == '"' || c == '\\')
      s = std::string("\\") + (char)c;
    else if (c < 0x80)
      s = std::string(1, (char)c);
    else {
      char u[8];
      snprintf(u, sizeof u, "\\u%04x", c);
      s = u;
    }
    encoder += (b ? ", \"" : "\"") + s + "\": " + std::to_string(b);
  }
  encoder += ", \"\\\",\": 256, \",\\\"\": 257, \"\\\",\\\"\": 258}";
  dtt::WriteFile(dir + "/encoder.json", encoder);
  dtt::WriteFile(dir + "/vocab.bpe", "#v\n\" ,\n, \"\n\" ,\"\n");
  dtt::WriteFile(dir + "/Encoder.js", dtt::ReadFile(data_ + "/gpt2/Encoder.js"));
  std::vector<std::string> texts = {"\",\"", "x\",\",\"\"\",\"", "\"\",\",\",\",,\""};
  std::vector<std::vector<uint32_t>> want;
  std::string error;
  ASSERT_TRUE(dtt::ReferenceEncode(dir, texts, false, &want, &error)) << error;
  dt_bpe *small = nullptr;
  ASSERT_EQ(dt_bpe_load_dir(dir.c_str(), nullptr, &small), DT_OK) << dt_last_error();
  for (size_t i = 0; i < texts.size(); i++) {
    dt_tokens got = {};
    ASSERT_EQ(dt_bpe_encode(small, texts[i].data(), texts[i].size(), &got), DT_OK);
    EXPECT_EQ(std::vector<uint32_t>(got.data, got.data + got.len), want[i]) << texts[i];
    dt_tokens_free(&got);
  }
  EXPECT_EQ(want[0], (std::vector<uint32_t>{258}));
  dt_bpe_destroy(small);
}

// core/data_unicode_tables.c is tools/gen_unicode_classes.js's output for
// this node: regenerate and compare.
TEST(UnicodeTables, EqualThisNodesRegexClasses) {
  std::string root = dtt::RepoRoot();
  ASSERT_FALSE(root.empty());
  std::string out = dtt::MakeTempDir("unicode") + "/tables.c";
  std::string cmd = "node '" + root + "/tools/gen_unicode_classes.js' > '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::string want = dtt::ReadFile(out), have = dtt::ReadFile(root + "/core/data_unicode_tables.c");
  // The first two lines name the versions; the tables are what must agree.
  auto body = [](const std::string &s) {
    size_t p = s.find('\n', s.find('\n') + 1);
    return p == std::string::npos ? s : s.substr(p);
  };
  EXPECT_EQ(body(want), body(have))
      << "this node's Unicode classes differ from core/data_unicode_tables.c: run "
         "node tools/gen_unicode_classes.js > core/data_unicode_tables.c";
}

// The loss of a model that knows only token frequencies (validation under
// the training counts); the GPT-2 training issue must beat it by 1 nat.
TEST_F(Reference, BrownUnigramBaseline) {
  dtt::BrownBaseline b;
  ASSERT_EQ(dtt::BrownUnigramBaseline(data_, &b), DT_OK) << dt_last_error();
  printf("Brown: %lld training tokens, %lld validation tokens, unigram cross-entropy %.4f nats\n",
         (long long)b.train_tokens, (long long)b.val_tokens, b.unigram_nats);
  RecordProperty("unigram_nats", std::to_string(b.unigram_nats));
  auto expect_between = [](const char *what, double v, double lo, double hi) {
    EXPECT_GT(v, lo) << what;
    EXPECT_LT(v, hi) << what;
  };
  expect_between("training tokens", (double)b.train_tokens, 1100000, 1250000);
  expect_between("validation tokens", (double)b.val_tokens, 110000, 150000);
  expect_between("unigram nats", b.unigram_nats, 7.0, 7.8);
}

}  // namespace
