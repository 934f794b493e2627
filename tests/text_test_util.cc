#include "tests/text_test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/env.h"

namespace dtt {

static bool IsDir(const std::string &p) {
  struct stat sb;
  return stat(p.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

std::string RepoRoot() {
  // Under Bazel the runfiles are links into the source tree.
  std::string runfile = "tests/gpt2_reference_encode.js";
  const char *srcdir = std::getenv("TEST_SRCDIR");
  const char *ws = std::getenv("TEST_WORKSPACE");
  std::vector<std::string> tries;
  if (srcdir && ws)
    tries.push_back(std::string(srcdir) + "/" + ws + "/" + runfile);
  tries.push_back(runfile);
  for (const std::string &t : tries) {
    char real[PATH_MAX];
    if (realpath(t.c_str(), real)) {
      std::string r = real;
      return r.substr(0, r.size() - runfile.size() - 1);
    }
  }
  return "";
}

std::string TextDataDir() {
  const char *env = nullptr;
  if (dt_env_is_set(DT_ENV_DATA_DIR) && dt_env_string(DT_ENV_DATA_DIR, &env) == DT_OK)
    return env;
  std::string root = RepoRoot();
  if (!root.empty() && IsDir(root + "/data"))
    return root + "/data";
  return "";
}

std::string MakeTempDir(const std::string &name) {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base && base[0] ? base : "/tmp") + "/" + name + ".XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  return mkdtemp(buf.data()) ? std::string(buf.data()) : std::string();
}

void WriteFile(const std::string &path, const std::string &bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

std::string ReadFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool ReferenceEncode(const std::string &tiktoken_dir, const std::vector<std::string> &texts,
                     bool pieces, std::vector<std::vector<uint32_t>> *out, std::string *error,
                     const std::string &vocab_dir) {
  std::string root = RepoRoot();
  std::string script = root + "/tests/gpt2_reference_encode.js";
  std::string tmp = MakeTempDir("reference");
  std::vector<std::string> files;  // relative to tmp: a short command line
  for (size_t i = 0; i < texts.size(); i++) {
    files.push_back("in" + std::to_string(i) + ".txt");
    WriteFile(tmp + "/" + files.back(), texts[i]);
  }
  std::string result = tmp + "/ids.bin";
  auto absolute = [](const std::string &p) {
    char real[PATH_MAX];
    return realpath(p.c_str(), real) ? std::string(real) : p;
  };
  std::string cmd =
      "cd '" + tmp + "' && node '" + script + "' '" + absolute(tiktoken_dir) + "' '" + result + "'";
  if (!vocab_dir.empty())
    cmd += " --vocab '" + absolute(vocab_dir) + "'";
  if (pieces)
    cmd += " --pieces";
  for (const std::string &f : files)
    cmd += " '" + f + "'";
  cmd += " 2>'" + tmp + "/node.err'";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    *error = "node failed (exit " + std::to_string(rc) + "): " + ReadFile(tmp + "/node.err") +
             " (is node installed? apt-get install nodejs; is tiktoken in " + tiktoken_dir +
             "? run tools/setup.sh)";
    return false;
  }
  std::string bin = ReadFile(result);
  out->clear();
  size_t at = 0;
  auto u32 = [&](size_t i) {
    uint32_t v;
    std::memcpy(&v, bin.data() + i, 4);
    return v;
  };
  for (size_t f = 0; f < files.size(); f++) {
    if (at + 4 > bin.size()) {
      *error = "the reference output is short";
      return false;
    }
    uint32_t n = u32(at);
    at += 4;
    std::vector<uint32_t> ids;
    if (pieces) {
      ids.push_back(n);
    } else {
      if (at + 4ull * n > bin.size()) {
        *error = "the reference output is short";
        return false;
      }
      for (uint32_t k = 0; k < n; k++)
        ids.push_back(u32(at + 4ull * k));
      at += 4ull * n;
    }
    out->push_back(std::move(ids));
  }
  return true;
}

dt_status BrownUnigramBaseline(const std::string &data_dir, BrownBaseline *out) {
  dt_bpe *bpe = nullptr;
  dt_status st = dt_bpe_load_dir((data_dir + "/gpt2").c_str(), nullptr, &bpe);
  if (st != DT_OK)
    return st;
  std::string raw = data_dir + "/brown/raw";
  const char *inputs[] = {raw.c_str()};
  dt_tokens train = {}, val = {};
  dt_corpus_config cfg = DT_CORPUS_CONFIG_DEFAULT;
  st = dt_corpus_tokenize(bpe, inputs, 1, &cfg, &train, &val, nullptr);
  if (st == DT_OK) {
    std::vector<uint16_t> t(train.data, train.data + train.len), v(val.data, val.data + val.len);
    dt_shard ts = {t.data(), (int64_t)t.size()}, vs = {v.data(), (int64_t)v.size()};
    out->train_tokens = train.len;
    out->val_tokens = val.len;
    st = dt_unigram_cross_entropy(&ts, &vs, dt_bpe_vocab_size(bpe), &out->unigram_nats);
  }
  dt_tokens_free(&train);
  dt_tokens_free(&val);
  dt_bpe_destroy(bpe);
  return st;
}

}  // namespace dtt
