// Helpers of the text-data suites: where the fetched data lives, the
// reference encoder (tiktoken's gpt2 encoding under node), temporary
// files, and the Brown corpus's unigram baseline (the loss a language model
// must beat; the training suites reuse it).
#ifndef DT_TESTS_TEXT_TEST_UTIL_H
#define DT_TESTS_TEXT_TEST_UTIL_H

#include <cstdint>
#include <string>
#include <vector>

#include "core/text.h"

namespace dtt {

// The data folder: $DT_DATA_DIR, else the repository's data/ (found from a
// runfile's real path; tools/setup.sh fills it). "" when neither exists.
std::string TextDataDir();
// The repository root ("" when not found): the source tree behind the
// runfiles.
std::string RepoRoot();

// A fresh folder under $TEST_TMPDIR (or /tmp).
std::string MakeTempDir(const std::string &name);
void WriteFile(const std::string &path, const std::string &bytes);
std::string ReadFile(const std::string &path);

// Runs tests/gpt2_reference_encode.js with node over `texts` (each written
// to a file of its own) using the npm package tiktoken in `tiktoken_dir`:
// its gpt2 encoding, or with `vocab_dir`, an encoding made from that
// folder's encoder.json and vocab.bpe as tiktoken makes one. Per text the
// ids (or, with pieces, one value: the number of pre-tokenisation pieces).
// Returns false, with the reason in *error, when node or the script fails.
bool ReferenceEncode(const std::string &tiktoken_dir, const std::vector<std::string> &texts,
                     bool pieces, std::vector<std::vector<uint32_t>> *out, std::string *error,
                     const std::string &vocab_dir = "");

// The Brown corpus tokenized as dtrain does it (data_dir/brown/raw, every
// 10th file for validation), and the validation set's cross-entropy under
// the training set's unigram counts (dt_unigram_cross_entropy), in nats.
struct BrownBaseline {
  int64_t train_tokens = 0, val_tokens = 0;
  double unigram_nats = 0;
};
dt_status BrownUnigramBaseline(const std::string &data_dir, BrownBaseline *out);

}  // namespace dtt

#endif  // DT_TESTS_TEXT_TEST_UTIL_H
