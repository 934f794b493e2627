// The C tokenizer against the reference: OpenAI's tiktoken (the npm package
// tiktoken@1.0.22, WebAssembly of the Rust original), its gpt2 encoding, run
// by node (tests/gpt2_reference_encode.js), token for token: on the whole
// Brown corpus as dtrain detags it (training and validation files), on the
// kept corpus tests/gpt2_tiktoken_corpus.txt (every Unicode whitespace,
// contractions, digits, combining marks, emoji, scripts), on 1,000 random
// strings drawn afresh each run (the seed is printed; TOKENIZER_TEST_SEED=N
// repeats one), on the pre-tokenisation of invalid UTF-8 (which tiktoken
// sees as U+FFFD), and on a small vocabulary where tiktoken's merge rules
// differ from a merge list's. Also: the Unicode class tables equal
// tiktoken's, and the Brown unigram baseline is in its range.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/text.h"
#include "tests/text_test_util.h"

namespace {

void AppendUtf8(std::string *s, uint32_t c) {
  if (c < 0x80) {
    *s += (char)c;
  } else if (c < 0x800) {
    *s += (char)(0xC0 | (c >> 6));
    *s += (char)(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    *s += (char)(0xE0 | (c >> 12));
    *s += (char)(0x80 | ((c >> 6) & 0x3F));
    *s += (char)(0x80 | (c & 0x3F));
  } else {
    *s += (char)(0xF0 | (c >> 18));
    *s += (char)(0x80 | ((c >> 12) & 0x3F));
    *s += (char)(0x80 | ((c >> 6) & 0x3F));
    *s += (char)(0x80 | (c & 0x3F));
  }
}

class Reference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = dtt::TextDataDir();
    tiktoken_ = data_ + "/tiktoken";
    if (data_.empty() || dt_bpe_load_dir((data_ + "/gpt2").c_str(), nullptr, &bpe_) != DT_OK)
      error_ = "no GPT-2 tokenizer files (" + std::string(dt_last_error()) +
               "): run tools/setup.sh, or set DT_DATA_DIR";
    else if (dtt::ReadFile(tiktoken_ + "/package.json").find("\"version\": \"1.0.22\"") ==
             std::string::npos)
      error_ = "no tiktoken 1.0.22 in " + tiktoken_ + ": run tools/setup.sh";
  }
  static void TearDownTestSuite() {
    dt_bpe_destroy(bpe_);
    bpe_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  // Encodes the texts with both encoders and compares; returns the number
  // of tokens compared.
  static int64_t Compare(const std::vector<std::string> &texts,
                         const std::vector<std::string> &names = {}) {
    std::vector<std::vector<uint32_t>> want;
    std::string error;
    EXPECT_TRUE(dtt::ReferenceEncode(tiktoken_, texts, false, &want, &error)) << error;
    if (want.size() != texts.size())
      return 0;
    int64_t compared = 0;
    for (size_t i = 0; i < texts.size(); i++) {
      dt_tokens got = {};
      EXPECT_EQ(dt_bpe_encode(bpe_, texts[i].data(), texts[i].size(), &got), DT_OK);
      std::vector<uint32_t> g(got.data, got.data + got.len);
      dt_tokens_free(&got);
      std::string name = i < names.size() ? names[i] : "input " + std::to_string(i);
      size_t n = std::min(g.size(), want[i].size()), k = 0;
      while (k < n && g[k] == want[i][k])
        k++;
      EXPECT_EQ(k, std::max(g.size(), want[i].size()))
          << name << ": first difference at token " << k << ": dtrain "
          << (k < g.size() ? std::to_string(g[k]) : "end") << ", tiktoken "
          << (k < want[i].size() ? std::to_string(want[i][k]) : "end") << "\n  dtrain   " << Ids(g)
          << "\n  tiktoken " << Ids(want[i]) << "\n  text     " << Escaped(texts[i]);
      compared += (int64_t)n;
    }
    return compared;
  }
  static std::string Ids(const std::vector<uint32_t> &v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size() && i < 40; i++)
      s += (i ? ", " : "") + std::to_string(v[i]);
    return s + (v.size() > 40 ? ", ...]" : "]");
  }
  // The text as the kept corpus writes it (\n \t \r \\ \u{HEX}; bytes that
  // are not UTF-8 as \xHH).
  static std::string Escaped(const std::string &t) {
    std::string o;
    char buf[16];
    for (size_t i = 0; i < t.size() && o.size() < 600;) {
      unsigned char c = (unsigned char)t[i];
      int len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
      if (len == 0 || i + (size_t)len > t.size()) {
        snprintf(buf, sizeof buf, "\\x%02X", c);
        o += buf;
        i++;
        continue;
      }
      uint32_t cp = len == 1 ? c : c & (0x7F >> len);
      for (int k = 1; k < len; k++)
        cp = (cp << 6) | ((unsigned char)t[i + k] & 0x3F);
      if (c == '\\')
        o += "\\\\";
      else if (c == '\n')
        o += "\\n";
      else if (c == '\t')
        o += "\\t";
      else if (c == '\r')
        o += "\\r";
      else if (c >= 0x21 && c < 0x7F)
        o += (char)c;
      else {
        snprintf(buf, sizeof buf, "\\u{%X}", cp);
        o += buf;
      }
      i += (size_t)len;
    }
    return o;
  }

  static std::string data_, tiktoken_, error_;
  static dt_bpe *bpe_;
};
std::string Reference::data_, Reference::tiktoken_, Reference::error_;
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
  printf("compared %lld tokens of the Brown corpus (500 files) with tiktoken\n",
         (long long)compared);
  RecordProperty("tokens_compared", std::to_string(compared));
  EXPECT_GT(compared, 1200000);
}

// tests/gpt2_tiktoken_corpus.txt: one string a line, with the escapes \n \t
// \r \\ and \u{HEX}; # lines and empty lines are not strings.
TEST_F(Reference, KeptCorpus) {
  std::string path = dtt::RepoRoot() + "/tests/gpt2_tiktoken_corpus.txt";
  std::string file = dtt::ReadFile(path);
  ASSERT_FALSE(file.empty()) << path;
  std::vector<std::string> texts, names;
  size_t line_no = 0;
  for (size_t at = 0; at < file.size();) {
    size_t end = file.find('\n', at);
    if (end == std::string::npos)
      end = file.size();
    std::string line = file.substr(at, end - at), text;
    at = end + 1;
    line_no++;
    if (line.empty() || line[0] == '#')
      continue;
    for (size_t i = 0; i < line.size(); i++) {
      if (line[i] != '\\') {
        text += line[i];
        continue;
      }
      ASSERT_LT(i + 1, line.size()) << path << ":" << line_no << ": a \\ ends the line";
      char e = line[++i];
      if (e == 'n' || e == 't' || e == 'r' || e == '\\') {
        text += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : '\\';
        continue;
      }
      size_t close = line.find('}', i);
      ASSERT_TRUE(e == 'u' && i + 1 < line.size() && line[i + 1] == '{' &&
                  close != std::string::npos)
          << path << ":" << line_no << ": unknown escape at column " << i;
      uint32_t cp = (uint32_t)std::strtoul(line.substr(i + 2, close - i - 2).c_str(), nullptr, 16);
      ASSERT_TRUE(cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF))
          << path << ":" << line_no << ": U+" << std::hex << cp << " is not a scalar value";
      AppendUtf8(&text, cp);
      i = close;
    }
    texts.push_back(text);
    names.push_back("gpt2_tiktoken_corpus.txt:" + std::to_string(line_no));
  }
  int64_t compared = Compare(texts, names);
  printf("compared %lld tokens of %zu kept strings with tiktoken\n", (long long)compared,
         texts.size());
  EXPECT_GT(texts.size(), 200u);
}

// 1,000 strings drawn afresh each run from a mix of ASCII words, spaces,
// every Unicode whitespace (and the look-alikes that regex engines
// disagree on), contractions in any case, letters of many scripts, digits
// of many scripts, combining marks, emoji with skin tones, ZWJ, flags and
// keycaps, and any code point at all.
TEST_F(Reference, RandomStrings) {
  uint64_t seed = (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();
  if (const char *env = std::getenv("TOKENIZER_TEST_SEED"))
    seed = std::strtoull(env, nullptr, 10);
  printf("seed %llu (repeat with bazel test --test_env=TOKENIZER_TEST_SEED=%llu)\n",
         (unsigned long long)seed, (unsigned long long)seed);
  RecordProperty("seed", std::to_string(seed));
  static const uint32_t spaces[] = {0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,
                                    0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
                                    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028,
                                    0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF, 0x180E, 0x200B,
                                    0x200C, 0x200D, 0x2060, 0x1C,   0x1D,   0x1E,   0x1F};
  // [lo, hi] ranges: letters of scripts, digits and numbers, combining marks, emoji.
  static const uint32_t letters[][2] = {
      {0xC0, 0x24F},      {0x391, 0x3C9},     {0x410, 0x44F},    {0x531, 0x586},
      {0x5D0, 0x5EA},     {0x621, 0x64A},     {0x905, 0x939},    {0xE01, 0xE30},
      {0x10D0, 0x10FA},   {0x1200, 0x1248},   {0x3041, 0x3096},  {0x30A1, 0x30FA},
      {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},   {0xFF21, 0xFF5A},  {0x1D400, 0x1D6A5},
      {0x10400, 0x1044F}, {0x10D40, 0x10D8F}, {0x16100, 0x1613F}};
  static const uint32_t digits[][2] = {
      {0x30, 0x39},     {0x660, 0x669},     {0x6F0, 0x6F9},    {0x966, 0x96F}, {0xE50, 0xE59},
      {0xFF10, 0xFF19}, {0x1D7CE, 0x1D7FF}, {0x2460, 0x249B},  {0xB2, 0xB3},   {0xBC, 0xBE},
      {0x2150, 0x2188}, {0x3007, 0x3007},   {0x10107, 0x10133}};
  static const uint32_t marks[][2] = {{0x300, 0x36F},   {0x483, 0x489},   {0x591, 0x5BD},
                                      {0x64B, 0x65F},   {0x93C, 0x94D},   {0xE31, 0xE3A},
                                      {0x20D0, 0x20F0}, {0xFE20, 0xFE2F}, {0x1AB0, 0x1ACE}};
  static const uint32_t emoji[][2] = {{0x1F300, 0x1F5FF}, {0x1F600, 0x1F64F}, {0x1F680, 0x1F6FF},
                                      {0x1F900, 0x1F9FF}, {0x2600, 0x26FF},   {0x2700, 0x27BF}};
  static const char *contractions[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  dt_generator g;
  dt_generator_init(&g, seed);
  auto below = [&](uint64_t n) { return dt_generator_below(&g, n); };
  auto from = [&](const uint32_t(*r)[2], size_t n) {
    const uint32_t *p = r[below(n)];
    return p[0] + (uint32_t)below(p[1] - p[0] + 1);
  };
  std::vector<std::string> texts;
  for (int t = 0; t < 1000; t++) {
    std::string s;
    for (int units = 1 + (int)below(40); units > 0; units--) {
      switch (below(14)) {
        case 0:
        case 1:  // an ASCII word, any case
          for (int k = 1 + (int)below(8); k > 0; k--)
            s += (char)((below(3) ? 'a' : 'A') + below(26));
          break;
        case 2:
        case 3: s += ' '; break;
        case 4:
        case 5: AppendUtf8(&s, spaces[below(sizeof spaces / sizeof *spaces)]); break;
        case 6:  // a contraction, each letter in either case, or after U+2019
          s += below(6) ? "'" : "\xe2\x80\x99";
          for (const char *c = contractions[below(7)]; *c; c++)
            s += (char)(below(3) ? *c : *c - 'a' + 'A');
          break;
        case 7:
          for (int k = 1 + (int)below(5); k > 0; k--)
            AppendUtf8(&s, from(letters, sizeof letters / sizeof *letters));
          break;
        case 8:
          for (int k = 1 + (int)below(6); k > 0; k--)
            AppendUtf8(&s, from(digits, below(2) ? 1 : sizeof digits / sizeof *digits));
          break;
        case 9:
          for (int k = 1 + (int)below(3); k > 0; k--)
            AppendUtf8(&s, from(marks, sizeof marks / sizeof *marks));
          break;
        case 10:  // an emoji: skin tone, VS16, a ZWJ sequence; a flag; a keycap
          if (below(5) == 0) {
            AppendUtf8(&s, 0x1F1E6 + (uint32_t)below(26));
            AppendUtf8(&s, 0x1F1E6 + (uint32_t)below(26));
          } else if (below(5) == 0) {
            s += (char)('0' + below(10));
            s += "\xef\xb8\x8f\xe2\x83\xa3";
          } else {
            for (int k = 1 + (int)below(3); k > 0; k--) {
              AppendUtf8(&s, from(emoji, sizeof emoji / sizeof *emoji));
              if (below(3) == 0)
                AppendUtf8(&s, 0x1F3FB + (uint32_t)below(5));
              if (below(3) == 0)
                AppendUtf8(&s, 0xFE0F);
              if (k > 1)
                AppendUtf8(&s, 0x200D);
            }
          }
          break;
        case 11:  // ASCII punctuation
          s += "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'"[below(33)];
          break;
        case 12: s += below(2) ? "\n" : below(2) ? "\r\n" : "\t"; break;
        default: {  // any scalar value
          uint32_t c = 0x80 + (uint32_t)below(0x110000 - 0x80 - 0x800);
          AppendUtf8(&s, c < 0xD800 ? c : c + 0x800);
        }
      }
    }
    texts.push_back(s);
  }
  int64_t compared = Compare(texts);
  printf("compared %lld tokens of 1000 random strings (seed %llu) with tiktoken\n",
         (long long)compared, (unsigned long long)seed);
  EXPECT_GT(compared, 10000);
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
      // JSON-ish punctuation (where gpt-3-encoder's "a,b" merge keys went wrong)
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
      AppendUtf8(&s, c);
    }
    texts.push_back(s);
  }
  int64_t compared = Compare(texts);
  printf("compared %lld tokens of %zu nasty inputs with tiktoken\n", (long long)compared,
         texts.size());
  EXPECT_GT(compared, 20000);
}

// Invalid UTF-8 has no JS (or Python) string: tiktoken would see U+FFFD
// ("other") for it. dtrain counts each bad byte as an "other" character, so
// it cuts the text into as many pieces as tiktoken's pattern cuts the
// replaced text (counted by JavaScript's engine over tiktoken's classes).
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
  // Bytes and fragments: letters, digits, spaces (NEL, BOM and the line
  // separator among them), an apostrophe, and bad bytes of every kind.
  const char *fragments[] = {"a",
                             "b",
                             "1",
                             " ",
                             "'",
                             "s",
                             "\n",
                             "\xc3\xa9",
                             "\xc2\x85",
                             "\xef\xbb\xbf",
                             "\xe2\x80\xa8",
                             "\xcc\x81",
                             "\x80",
                             "\xff",
                             "\xe2\x82",
                             "\xc3",
                             "\xed\xa0\x80"};
  dt_generator g;
  dt_generator_init(&g, 77);
  for (int t = 0; t < 60; t++) {
    std::string s;
    for (int i = 0; i < 200; i++)
      s += fragments[dt_generator_below(&g, sizeof fragments / sizeof *fragments)];
    texts.push_back(s);
  }
  std::vector<std::vector<uint32_t>> want;
  std::string error;
  ASSERT_TRUE(dtt::ReferenceEncode(tiktoken_, texts, true, &want, &error)) << error;
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

// tiktoken's merge rules on a small vocabulary where a merge list's would
// differ: the adjacent pair whose concatenation is the lowest-ranked token
// merges (a + bc gives abc though only ab + c is listed), and a piece that
// is a whole token is that token (stuv, which merging t + u first cannot
// reach). tiktoken builds its encoding from the same two files.
TEST_F(Reference, TiktokenMergeRulesOnASmallVocabulary) {
  std::string dir = dtt::MakeTempDir("small_vocab");
  // GPT-2's byte order: the printable bytes first, then the others.
  std::string encoder = "{";
  int id = 0, n = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int b = 0; b < 256; b++) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      if (printable != (pass == 0))
        continue;
      int c = printable ? b : 256 + n++;
      char u[16];
      snprintf(u, sizeof u, "\"\\u%04x\": %d, ", c, id++);
      encoder += u;
    }
  encoder +=
      "\"bc\": 256, \"ab\": 257, \"abc\": 258, \"tu\": 259, \"st\": 260, \"uv\": 261, "
      "\"stuv\": 262}";
  dtt::WriteFile(dir + "/encoder.json", encoder);
  dtt::WriteFile(dir + "/vocab.bpe", "#v\nb c\na b\nab c\nt u\ns t\nu v\nst uv\n");
  std::vector<std::string> texts = {"abc", "stuv", " abc", "abcstuv", "stuvstuv xabcx ab bc"};
  std::vector<std::vector<uint32_t>> want;
  std::string error;
  ASSERT_TRUE(dtt::ReferenceEncode(tiktoken_, texts, false, &want, &error, dir)) << error;
  dt_bpe *small = nullptr;
  ASSERT_EQ(dt_bpe_load_dir(dir.c_str(), nullptr, &small), DT_OK) << dt_last_error();
  for (size_t i = 0; i < texts.size(); i++) {
    dt_tokens got = {};
    ASSERT_EQ(dt_bpe_encode(small, texts[i].data(), texts[i].size(), &got), DT_OK);
    EXPECT_EQ(std::vector<uint32_t>(got.data, got.data + got.len), want[i]) << texts[i];
    dt_tokens_free(&got);
  }
  EXPECT_EQ(want[0], (std::vector<uint32_t>{258}));
  EXPECT_EQ(want[1], (std::vector<uint32_t>{262}));
  dt_bpe_destroy(small);
}

// core/data_unicode_tables.c is tools/gen_unicode_classes.js's output for
// tiktoken: regenerate and compare.
TEST_F(Reference, UnicodeTablesEqualTiktokensClasses) {
  std::string root = dtt::RepoRoot();
  ASSERT_FALSE(root.empty());
  std::string out = dtt::MakeTempDir("unicode") + "/tables.c";
  std::string cmd =
      "node '" + root + "/tools/gen_unicode_classes.js' '" + tiktoken_ + "' > '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::string want = dtt::ReadFile(out), have = dtt::ReadFile(root + "/core/data_unicode_tables.c");
  EXPECT_EQ(want, have) << "tiktoken's Unicode classes differ from core/data_unicode_tables.c: "
                           "run node tools/gen_unicode_classes.js > core/data_unicode_tables.c";
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
