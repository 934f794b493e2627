// The GPT-2 tokenizer (core/text.h): loading and its errors, encode/decode
// round trips on any bytes, the pre-tokeniser's cover, the Brown detagging
// rules and the corpus split. Equality with the reference, tiktoken's gpt2
// encoding, is in text_reference_test.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/text.h"
#include "tests/dt_assert.h"
#include "tests/text_test_util.h"

namespace {

std::string Gpt2Dir() {
  std::string d = dtt::TextDataDir();
  return d.empty() ? "" : d + "/gpt2";
}

// The GPT-2 tokenizer, loaded once.
class Gpt2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string dir = Gpt2Dir();
    if (dt_bpe_load_dir(dir.c_str(), nullptr, &bpe_) != DT_OK)
      error_ = std::string(dt_last_error()) + " (run tools/setup.sh, or set DT_DATA_DIR)";
  }
  static void TearDownTestSuite() {
    dt_bpe_destroy(bpe_);
    bpe_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(bpe_, nullptr) << error_; }

  static std::vector<int32_t> Encode(const std::string &s, dt_bpe *b = nullptr) {
    dt_tokens t = {};
    EXPECT_EQ(dt_bpe_encode(b ? b : bpe_, s.data(), s.size(), &t), DT_OK) << dt_last_error();
    std::vector<int32_t> v(t.data, t.data + t.len);
    dt_tokens_free(&t);
    return v;
  }
  static std::string Decode(const std::vector<int32_t> &ids) {
    dt_bytes b = {};
    EXPECT_EQ(dt_bpe_decode(bpe_, ids.data(), (int64_t)ids.size(), &b), DT_OK) << dt_last_error();
    std::string s(reinterpret_cast<char *>(b.data), (size_t)b.len);
    dt_bytes_free(&b);
    return s;
  }

  static dt_bpe *bpe_;
  static std::string error_;
};
dt_bpe *Gpt2::bpe_ = nullptr;
std::string Gpt2::error_;

TEST_F(Gpt2, LoadsTheVocabularyAndMerges) {
  EXPECT_EQ(dt_bpe_vocab_size(bpe_), 50257);
  EXPECT_EQ(dt_bpe_eot(bpe_), 50256);
  const uint8_t *p;
  size_t n;
  ASSERT_DT_OK(dt_bpe_token_bytes(bpe_, 262, &p, &n));
  EXPECT_EQ(std::string(reinterpret_cast<const char *>(p), n), " the");
  ASSERT_DT_OK(dt_bpe_token_bytes(bpe_, 50256, &p, &n));
  EXPECT_EQ(std::string(reinterpret_cast<const char *>(p), n), "<|endoftext|>");
  EXPECT_EQ(dt_bpe_token_bytes(bpe_, 50257, &p, &n), DT_ERR_INVALID_ARG);
}

// Values from tiktoken's gpt2 encoding; the last two are where
// gpt-3-encoder (a JavaScript port) differs: it takes U+0085 for "other" and
// U+FEFF for a space.
TEST_F(Gpt2, KnownEncodings) {
  EXPECT_EQ(Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(Encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(Encode("I can't"), (std::vector<int32_t>{40, 460, 470}));
  // Special tokens are ordinary text.
  EXPECT_EQ(Encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(Encode("\xc3\xa9t\xc3\xa9 \xf0\x9f\x91\x8d"),
            (std::vector<int32_t>{25125, 2634, 50169, 235}));
  EXPECT_EQ(Encode("Hello \xc2\x85world"), (std::vector<int32_t>{15496, 220, 126, 227, 6894}));
  EXPECT_EQ(Encode("a \xef\xbb\xbf b"), (std::vector<int32_t>{64, 27332, 119, 123, 275}));
  EXPECT_TRUE(Encode("").empty());
}

TEST_F(Gpt2, DecodeRejectsIdsOutsideTheVocabulary) {
  dt_bytes b = {};
  int32_t ids[] = {15496, 50257};
  EXPECT_EQ(dt_bpe_decode(bpe_, ids, 2, &b), DT_ERR_INVALID_ARG);
  EXPECT_NE(std::string(dt_last_error()).find("token 1 is 50257"), std::string::npos)
      << dt_last_error();
  ids[1] = -1;
  EXPECT_EQ(dt_bpe_decode(bpe_, ids, 2, &b), DT_ERR_INVALID_ARG);
  dt_bytes_free(&b);
}

// Random byte strings of several kinds: uniform bytes, UTF-8 fragments and
// junk, whitespace-heavy, one long run. decode(encode(x)) == x, and the
// cache changes nothing.
TEST_F(Gpt2, RoundTripsAnyBytes) {
  dt_bpe_config nocache = DT_BPE_CONFIG_DEFAULT;
  nocache.cache_entries = 0;
  dt_bpe *plain = nullptr;
  ASSERT_DT_OK(dt_bpe_load_dir(Gpt2Dir().c_str(), &nocache, &plain));
  const char *fragments[] = {"\xe2\x82\xac",
                             "\xf0\x9f\x98",
                             "\xed\xa0\x80",
                             "\xc0\xaf",
                             "\x80",
                             "\xff",
                             " ",
                             "\t\n",
                             "'s",
                             "a",
                             "7",
                             "\xc3",
                             "\xf4\x90\x80\x80"};
  dt_generator g;
  dt_generator_init(&g, 1234);
  int64_t bytes = 0;
  for (int trial = 0; trial < 400; trial++) {
    std::string s;
    int kind = trial % 4, len = (int)dt_generator_below(&g, 600);
    for (int i = 0; i < len; i++) {
      if (kind == 0)
        s += (char)dt_generator_below(&g, 256);
      else if (kind == 1)
        s += fragments[dt_generator_below(&g, sizeof fragments / sizeof *fragments)];
      else if (kind == 2)
        s += " \t\n\r\v\f\x1c\x85"[dt_generator_below(&g, 8)];
      else
        s += (char)(0x80 + dt_generator_below(&g, 128));
    }
    std::vector<int32_t> ids = Encode(s);
    ASSERT_EQ(Decode(ids), s) << "trial " << trial;
    ASSERT_EQ(Encode(s, plain), ids) << "trial " << trial;
    bytes += (int64_t)s.size();
  }
  std::string run(100000, 'q');  // one piece of 100 kB: the heap merge, not a quadratic one
  run += std::string(50000, '\xff');
  ASSERT_EQ(Decode(Encode(run)), run);
  dt_bpe_destroy(plain);
  EXPECT_GT(bytes, 50000);
}

TEST(Pretokenizer, PiecesCoverTheText) {
  dt_generator g;
  dt_generator_init(&g, 99);
  for (int trial = 0; trial < 200; trial++) {
    std::string s;
    for (int i = 0, n = (int)dt_generator_below(&g, 300); i < n; i++)
      s += "ab1 '\t\n\xc3\xa9\xe2\x80\x83\xff"[dt_generator_below(&g, 13)];
    size_t pos = 0, pieces = 0;
    while (pos < s.size()) {
      size_t end = dt_bpe_piece_end(s.data(), s.size(), pos);
      ASSERT_GT(end, pos);
      ASSERT_LE(end, s.size());
      pos = end;
      pieces++;
    }
    EXPECT_EQ(pos, s.size());
  }
  // The regex's whitespace rule: a run before a word leaves its last space
  // to the word; at the end of the text it is one piece.
  std::string t = "a   b  \n";
  std::vector<std::string> got;
  for (size_t p = 0; p < t.size();) {
    size_t e = dt_bpe_piece_end(t.data(), t.size(), p);
    got.push_back(t.substr(p, e - p));
    p = e;
  }
  EXPECT_EQ(got, (std::vector<std::string>{"a", "  ", " b", "  \n"}));
}

// ---- loading errors, on small byte-level vocabularies written here ----

// GPT-2's byte alphabet (bytes_to_unicode), as UTF-8 strings.
std::string ByteChar(int b) {
  static int cp[256];
  static bool init = false;
  if (!init) {
    int n = 0;
    for (int x = 0; x < 256; x++) {
      bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      cp[x] = printable ? x : 256 + n++;
    }
    init = true;
  }
  int c = cp[b];
  std::string s;
  if (c < 0x80) {
    s += (char)c;
  } else {
    s += (char)(0xC0 | (c >> 6));
    s += (char)(0x80 | (c & 0x3F));
  }
  return s;
}

std::string JsonString(const std::string &s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\';
    o += c;
  }
  return o + "\"";
}

// encoder.json with the 256 bytes and `extra` tokens (alphabet strings).
std::string EncoderJson(const std::vector<std::string> &extra) {
  std::string j = "{";
  int id = 0;
  for (int b = 0; b < 256; b++)
    j += (b ? ", " : "") + JsonString(ByteChar(b)) + ": " + std::to_string(id++);
  for (const std::string &e : extra)
    j += ", " + JsonString(e) + ": " + std::to_string(id++);
  return j + "}";
}

class SmallVocab : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = dtt::MakeTempDir("vocab"); }
  // Loads (encoder, merges); returns the status; the tokenizer in bpe_.
  dt_status Load(const std::string &encoder, const std::string &merges) {
    dtt::WriteFile(dir_ + "/encoder.json", encoder);
    dtt::WriteFile(dir_ + "/vocab.bpe", merges);
    dt_bpe_destroy(bpe_);
    bpe_ = nullptr;
    return dt_bpe_load_dir(dir_.c_str(), nullptr, &bpe_);
  }
  void ExpectFormat(const std::string &encoder, const std::string &merges, const std::string &file,
                    const std::string &detail) {
    EXPECT_EQ(Load(encoder, merges), DT_ERR_FORMAT) << file << ": " << detail;
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find(dir_ + "/" + file), std::string::npos) << msg;
    EXPECT_NE(msg.find(detail), std::string::npos) << msg;
  }
  void TearDown() override { dt_bpe_destroy(bpe_); }
  std::string dir_;
  dt_bpe *bpe_ = nullptr;
};

TEST_F(SmallVocab, LoadsAndMerges) {
  ASSERT_DT_OK(Load(EncoderJson({"ab", "abc"}), "#version: 0.2\na b\nab c\n"));
  EXPECT_EQ(dt_bpe_vocab_size(bpe_), 258);
  EXPECT_EQ(dt_bpe_eot(bpe_), -1);
  dt_tokens t = {};
  ASSERT_DT_OK(dt_bpe_encode(bpe_, "abcab", 5, &t));
  ASSERT_EQ(t.len, 2);
  EXPECT_EQ(t.data[0], 257);
  EXPECT_EQ(t.data[1], 256);
  dt_tokens_free(&t);
  // A last line without a newline is not a merge (encoder.py, tiktoken).
  ASSERT_DT_OK(Load(EncoderJson({"ab", "abc"}), "#version: 0.2\na b\nab c"));
  ASSERT_DT_OK(dt_bpe_encode(bpe_, "abc", 3, &t));
  EXPECT_EQ(t.len, 2);
  dt_tokens_free(&t);
}

TEST_F(SmallVocab, EncoderJsonErrorsNameTheFileAndOffset) {
  std::string good = EncoderJson({"ab"}), m = "#version: 0.2\na b\n";
  // Each malformed encoder.json and the detail its message gives.
  const std::pair<std::string, const char *> bad[] = {
      {"", "byte offset 0: expected '{'"},
      {"[1, 2]", "byte offset 0"},
      {good.substr(0, good.size() - 1), "expected ',' or '}'"},
      {good + "x", "data after the object"},
      {"{\"a\" 1}", "byte offset 5: expected ':'"},
      {"{\"a\": -1}", "byte offset 6: expected a non-negative"},
      {"{\"a\": 1.5}", "expected an integer id"},
      {"{\"a\": 99999999999}", "id too large"},
      {"{\"\\q\": 1}", "byte offset 2: unknown escape"},
      {"{\"\\ud800\": 1}", "without its low half"},
      {"{\"\\udc00\": 1}", "lone low surrogate"},
      {"{\"a\xff\": 1}", "byte offset 3: invalid UTF-8"},
      {"{\"a\n\": 1}", "control character"},
      {"{\"abc", "unterminated string"},
      {"{\"\": 0}", "empty token string"},
      {"{\"a\": 0, \"b\": 1}", "at least 256"},
  };
  for (const auto &[encoder, detail] : bad)
    ExpectFormat(encoder, m, "encoder.json", detail);
  // ids: dense and unique; every byte has a token; no repeated token.
  std::string gap = good;
  gap.replace(gap.rfind("256"), 3, "300");
  ExpectFormat(gap, m, "encoder.json", "id 300 out of range");
  std::string twice = good;
  twice.replace(twice.rfind("256"), 3, "255");
  ExpectFormat(twice, m, "encoder.json", "used twice");
  std::string nobyte = EncoderJson({"ab"});
  nobyte.replace(nobyte.find("\"A\""), 3, "\"AA\"");
  ExpectFormat(nobyte, m, "encoder.json", "no token for byte 0x41");
  std::string repeat = good;
  repeat.replace(repeat.rfind("\"ab\""), 4, "\"A\"");
  ExpectFormat(repeat, m, "encoder.json", "repeats an earlier token");
}

TEST_F(SmallVocab, MergeErrorsNameTheFileLineAndOffset) {
  std::string e = EncoderJson({"ab", "abc"});
  ExpectFormat(e, "#v\na b c\n", "vocab.bpe", "line 2 (byte offset 3): 3 tokens");
  ExpectFormat(e, "#v\na b\n\n", "vocab.bpe", "line 3 (byte offset 7): 0 tokens");
  ExpectFormat(e, "#v\na zz\n", "vocab.bpe", "byte offset 5): token 'zz' is not in");
  ExpectFormat(e, "#v\nb c\n", "vocab.bpe", "the merge of 'b c' is not in");
  ExpectFormat(e, "#v\na b\na b\n", "vocab.bpe",
               "line 3 (byte offset 7): the merge repeats line 2");
  ExpectFormat(e, "#v\nab c\na b\n", "vocab.bpe", "the merge on line 2 uses a token made by");
  ExpectFormat(e, "#v\na \xff\n", "vocab.bpe", "invalid UTF-8");
  EXPECT_EQ(Load(e, "#v\na b\n"), DT_OK);
  std::string missing = dir_ + "/nothing";
  dt_bpe *b = nullptr;
  EXPECT_EQ(dt_bpe_load_dir(missing.c_str(), nullptr, &b), DT_ERR_IO);
  EXPECT_NE(std::string(dt_last_error()).find("tools/setup.sh"), std::string::npos);
}

// tiktoken's rules: the adjacent pair whose concatenation is the
// lowest-ranked token merges, listed as a merge or not (a + bc -> abc,
// where only ab + c is listed); a piece that is a whole token is that
// token (stuv, which merging t + u first cannot reach: s tu v). A merge
// list applied as encoder.py does would give [a, bc] and [s, tu, v].
// text_reference_test checks these against tiktoken itself.
TEST_F(SmallVocab, TiktokenMergeRules) {
  ASSERT_DT_OK(Load(EncoderJson({"bc", "ab", "abc", "tu", "st", "uv", "stuv"}),
                    "#v\nb c\na b\nab c\nt u\ns t\nu v\nst uv\n"));
  auto encode = [&](const std::string &s) {
    dt_tokens t = {};
    EXPECT_EQ(dt_bpe_encode(bpe_, s.data(), s.size(), &t), DT_OK) << dt_last_error();
    std::vector<int32_t> v(t.data, t.data + t.len);
    dt_tokens_free(&t);
    return v;
  };
  EXPECT_EQ(encode("abc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(encode("stuv"), (std::vector<int32_t>{262}));
  EXPECT_EQ(encode("stuvw"), (std::vector<int32_t>{'s', 259, 'v', 'w'}));
  EXPECT_EQ(encode("xabc"), (std::vector<int32_t>{'x', 258}));
}

// ---- the Brown corpus ----

std::string Detag(const std::string &tagged) {
  dt_bytes b = {};
  EXPECT_EQ(dt_brown_detag(tagged.data(), tagged.size(), &b), DT_OK) << dt_last_error();
  std::string s(reinterpret_cast<char *>(b.data), (size_t)b.len);
  dt_bytes_free(&b);
  return s;
}

TEST(Brown, DetagRules) {
  EXPECT_EQ(Detag("\n\n\tThe/at jury/nn said/vbd ,/, ``/`` it's/pps+bez fine/jj ''/'' ./.\n"
                  "Costs/nns (/( 1/2/cd )/) rose/vbd ;/. why/wrb ?/.\n\n\n"
                  "\tHe/pps said/vbd '/' go/vb '/' !/.\n"),
            "The jury said, \"it's fine\". Costs (1/2) rose; why?\n\n"
            "He said 'go'!\n");
  // A headline (most words tagged -hl) is a paragraph of its own.
  EXPECT_EQ(Detag("Big/jj-hl news/nn-hl \nThe/at story/nn ./.\n"), "Big news\n\nThe story.\n");
  // Latin-1 bytes become UTF-8; an empty file stays empty.
  EXPECT_EQ(Detag("caf\xe9/nn\n"), "caf\xc3\xa9\n");
  EXPECT_EQ(Detag(""), "");
  EXPECT_EQ(Detag("\n \n\t\n"), "");
  EXPECT_TRUE(dt_brown_is_file_name("ca01"));
  EXPECT_TRUE(dt_brown_is_file_name("cr09"));
  EXPECT_FALSE(dt_brown_is_file_name("cs01"));
  EXPECT_FALSE(dt_brown_is_file_name("README"));
  EXPECT_FALSE(dt_brown_is_file_name("ca1"));
}

// Corpora are split by file: every 10th file to validation, each document
// preceded by <|endoftext|>; a Brown folder is detected and detagged.
TEST_F(Gpt2, CorpusSplitsByFile) {
  std::string dir = dtt::MakeTempDir("corpus");
  for (int i = 0; i < 20; i++)
    dtt::WriteFile(dir + "/doc" + std::string(i < 10 ? "0" : "") + std::to_string(i),
                   "file " + std::to_string(i));
  dtt::WriteFile(dir + "/.hidden", "not read");
  const char *inputs[] = {dir.c_str()};
  dt_tokens train = {}, val = {};
  dt_corpus_stats st;
  ASSERT_DT_OK(dt_corpus_tokenize(bpe_, inputs, 1, nullptr, &train, &val, &st));
  EXPECT_EQ(st.train_files, 18);
  EXPECT_EQ(st.val_files, 2);
  std::vector<int32_t> expect;
  for (int i : {9, 19}) {
    expect.push_back(50256);
    for (int32_t id : Encode("file " + std::to_string(i)))
      expect.push_back(id);
  }
  EXPECT_EQ(std::vector<int32_t>(val.data, val.data + val.len), expect);
  EXPECT_EQ(train.data[0], 50256);
  dt_tokens_free(&train);
  dt_tokens_free(&val);

  // One file: its last ceil(f * n) tokens are the validation part.
  std::string one = dir + "/doc05";
  inputs[0] = one.c_str();
  dt_corpus_config cfg = DT_CORPUS_CONFIG_DEFAULT;
  cfg.val_fraction = 0.5;
  ASSERT_DT_OK(dt_corpus_tokenize(bpe_, inputs, 1, &cfg, &train, &val, nullptr));
  EXPECT_EQ(train.len + val.len, 1 + (int64_t)Encode("file 5").size());
  EXPECT_EQ(val.len, (train.len + val.len + 1) / 2);
  dt_tokens_free(&train);
  dt_tokens_free(&val);

  // Brown: only the tagged files, detagged.
  std::string brown = dtt::MakeTempDir("brown");
  dtt::WriteFile(brown + "/ca01", "\tThe/at end/nn ./.\n");
  dtt::WriteFile(brown + "/README", "not a corpus file");
  inputs[0] = brown.c_str();
  cfg.val_fraction = 0;
  ASSERT_DT_OK(dt_corpus_tokenize(bpe_, inputs, 1, &cfg, &train, nullptr, nullptr));
  std::vector<int32_t> want = {50256};
  for (int32_t id : Encode("The end.\n"))
    want.push_back(id);
  EXPECT_EQ(std::vector<int32_t>(train.data, train.data + train.len), want);
  dt_tokens_free(&train);

  cfg.val_fraction = 1.0;
  EXPECT_EQ(dt_corpus_tokenize(bpe_, inputs, 1, &cfg, &train, &val, nullptr), DT_ERR_INVALID_ARG);
  std::string missing = dir + "/missing";
  inputs[0] = missing.c_str();
  EXPECT_EQ(dt_corpus_tokenize(bpe_, inputs, 1, nullptr, &train, &val, nullptr), DT_ERR_IO);
  EXPECT_NE(std::string(dt_last_error()).find(missing), std::string::npos);
}

}  // namespace
