// core/checkpoint.h: CRC32, atomic files, safetensors, the trainer-state
// file and the manifest; every damage is an error naming file and section.
#include "core/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/nn.h"
#include "core/tensor.h"
#include "models/models.h"

namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/dt_ckpt_test_XXXXXX";
  const char *base = getenv("TEST_TMPDIR");
  std::string t = base ? std::string(base) + "/ckptXXXXXX" : tmpl;
  std::vector<char> buf(t.begin(), t.end());
  buf.push_back('\0');
  EXPECT_NE(mkdtemp(buf.data()), nullptr);
  return buf.data();
}

std::vector<unsigned char> ReadAll(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string &path, const std::vector<unsigned char> &b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char *>(b.data()), (std::streamsize)b.size());
}

// a's and b's parameters (or buffers) hold the same bytes.
void ExpectSameTensors(dt_module *a, dt_module *b, bool buffers) {
  int n = buffers ? dt_module_num_buffers(a) : dt_module_num_parameters(a);
  ASSERT_EQ(n, buffers ? dt_module_num_buffers(b) : dt_module_num_parameters(b));
  for (int i = 0; i < n; i++) {
    const char *name = nullptr;
    dt_tensor *ta =
        buffers ? dt_module_buffer_at(a, i, &name) : dt_module_parameter_at(a, i, &name);
    dt_tensor *tb =
        buffers ? dt_module_buffer_at(b, i, nullptr) : dt_module_parameter_at(b, i, nullptr);
    size_t bytes = dt_tensor_numel(ta) * dt_dtype_size(dt_tensor_dtype(ta));
    std::vector<unsigned char> va(bytes), vb(bytes);
    ASSERT_EQ(dt_tensor_to_host(ta, va.data(), bytes), DT_OK);
    ASSERT_EQ(dt_tensor_to_host(tb, vb.data(), bytes), DT_OK);
    EXPECT_EQ(va, vb) << name;
  }
}

// A trainer-state file with sections "meta" and "optimizer".
void WriteState(const std::string &dir) {
  dt_state_writer *w = nullptr;
  ASSERT_EQ(dt_state_writer_create(&w), DT_OK);
  const char meta[] = "step 7\nepoch 0\n";
  ASSERT_EQ(dt_state_writer_add(w, "meta", meta, sizeof meta - 1), DT_OK);
  std::vector<float> m(100);
  for (size_t i = 0; i < m.size(); i++)
    m[i] = 0.5f * (float)i;
  const uint64_t segs[4] = {0, 20, 20, 30};  // two segments covering [0, 50)
  dt_ckpt_optim_shard sh = {50, 2, 2, segs, m.data()};
  void *bytes = nullptr;
  size_t size = 0;
  ASSERT_EQ(dt_ckpt_optim_section_encode(&sh, &bytes, &size), DT_OK);
  ASSERT_EQ(dt_state_writer_add(w, "optimizer", bytes, size), DT_OK);
  free(bytes);
  EXPECT_EQ(dt_state_writer_add(w, "meta", "x", 1), DT_ERR_INVALID_ARG);
  ASSERT_EQ(dt_state_writer_write(w, dir.c_str(), "trainer_state.bin", nullptr, nullptr), DT_OK);
  dt_state_writer_destroy(w);
}

TEST(Checkpoint, Crc32IsZlibs) {
  EXPECT_EQ(dt_crc32(0, "123456789", 9), 0xcbf43926u);
  EXPECT_EQ(dt_crc32(dt_crc32(0, "1234", 4), "56789", 5), 0xcbf43926u);
}

TEST(Checkpoint, WriteFileIsAtomicAndLeavesNoTemporary) {
  std::string dir = TempDir();
  dt_ckpt_chunk c[2] = {{"ab", 2}, {"cd", 2}};
  uint32_t crc = 0;
  uint64_t size = 0;
  ASSERT_EQ(dt_ckpt_write_file(dir.c_str(), "f", c, 2, &crc, &size), DT_OK);
  EXPECT_EQ(size, 4u);
  EXPECT_EQ(crc, dt_crc32(0, "abcd", 4));
  auto got = ReadAll(dir + "/f");
  EXPECT_EQ(std::string(got.begin(), got.end()), "abcd");
  EXPECT_NE(access((dir + "/.f.tmp").c_str(), F_OK), 0);
  // A directory that does not exist: an error naming it, nothing written.
  EXPECT_EQ(dt_ckpt_write_file((dir + "/missing").c_str(), "f", c, 2, nullptr, nullptr), DT_ERR_IO);
  EXPECT_NE(std::string(dt_last_error()).find("missing/.f.tmp"), std::string::npos);
}

TEST(Checkpoint, StateRoundTrip) {
  std::string dir = TempDir();
  WriteState(dir);
  dt_state_file *f = nullptr;
  ASSERT_EQ(dt_state_file_open((dir + "/trainer_state.bin").c_str(), &f), DT_OK) << dt_last_error();
  const void *data = nullptr;
  size_t size = 0;
  ASSERT_EQ(dt_state_file_section(f, "meta", &data, &size), DT_OK);
  char v[32];
  ASSERT_EQ(dt_state_meta_get((const char *)data, size, "epoch", "meta", v, sizeof v), DT_OK);
  EXPECT_STREQ(v, "0");
  EXPECT_EQ(dt_state_meta_get((const char *)data, size, "lr", "f: meta", v, sizeof v),
            DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("f: meta: the entry 'lr' is missing"),
            std::string::npos);
  ASSERT_EQ(dt_state_file_section(f, "optimizer", &data, &size), DT_OK);
  dt_ckpt_optim_shard sh;
  ASSERT_EQ(dt_ckpt_optim_section_decode(data, size, "opt", &sh), DT_OK);
  EXPECT_EQ(sh.total, 50u);
  EXPECT_EQ(sh.n_buffers, 2u);
  ASSERT_EQ(sh.n_segments, 2u);
  EXPECT_EQ(sh.segments[2], 20u);
  EXPECT_EQ(sh.data[99], 49.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(sh.data) % 4, 0u);
  EXPECT_EQ(dt_ckpt_optim_section_decode(data, size - 4, "opt", &sh), DT_ERR_FORMAT);
  EXPECT_EQ(dt_state_file_section(f, "scaler", &data, &size), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("section 'scaler' is missing"), std::string::npos);
  dt_state_file_close(f);
}

// Every cut point and a bit flip in every byte range: never accepted, and
// the message names the file and the part that is wrong.
TEST(Checkpoint, StateDamageNamesTheSection) {
  std::string dir = TempDir();
  WriteState(dir);
  std::string path = dir + "/trainer_state.bin";
  const auto good = ReadAll(path);
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    WriteAll(path, std::vector<unsigned char>(good.begin(), good.begin() + (long)cut));
    dt_state_file *f = nullptr;
    ASSERT_EQ(dt_state_file_open(path.c_str(), &f), DT_ERR_FORMAT) << "cut at " << cut;
    std::string e = dt_last_error();
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_TRUE(e.find("header") != std::string::npos || e.find("section '") != std::string::npos)
        << e;
  }
  for (size_t at = 0; at < good.size(); at += 13) {
    auto bad = good;
    bad[at] ^= 0x04;
    WriteAll(path, bad);
    dt_state_file *f = nullptr;
    dt_status st = dt_state_file_open(path.c_str(), &f);
    ASSERT_NE(st, DT_OK) << "flip at " << at;
    std::string e = dt_last_error();
    bool in_optimizer = at > good.size() - 400 - 24 - 32;
    if (in_optimizer)
      EXPECT_NE(e.find("section 'optimizer': CRC32 mismatch"), std::string::npos) << e;
    else
      EXPECT_TRUE(e.find("header") != std::string::npos || e.find("section '") != std::string::npos)
          << e;
  }
  WriteAll(path, good);
}

TEST(Checkpoint, SafetensorsRoundTripAndMismatch) {
  std::string dir = TempDir();
  dt_module *a = nullptr, *b = nullptr, *lenet = nullptr;
  ASSERT_EQ(dt_model_create("mlp", 1, &a), DT_OK);
  ASSERT_EQ(dt_model_create("mlp", 2, &b), DT_OK);
  ASSERT_EQ(dt_model_create("lenet", 1, &lenet), DT_OK);
  ASSERT_EQ(dt_safetensors_save_module(a, dir.c_str(), "model.safetensors", nullptr, nullptr),
            DT_OK);
  std::string path = dir + "/model.safetensors";
  ASSERT_EQ(dt_safetensors_load_module(path.c_str(), b), DT_OK) << dt_last_error();
  ExpectSameTensors(a, b, false);
  // The header is standard: u64 length, then JSON naming dotted parameters.
  auto bytes = ReadAll(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)bytes[i] << (8 * i);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + (long)n);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_NE(header.find("\"1.weight\":{\"dtype\":\"F32\",\"shape\":[512,784]"), std::string::npos)
      << header.substr(0, 300);
  // Another model: the first tensor that differs is named.
  EXPECT_NE(dt_safetensors_load_module(path.c_str(), lenet), DT_OK);
  EXPECT_NE(std::string(dt_last_error()).find(path), std::string::npos);
  // A flipped data byte names the tensor.
  auto bad = bytes;
  bad[bad.size() - 3] ^= 1;
  WriteAll(path, bad);
  EXPECT_EQ(dt_safetensors_load_module(path.c_str(), b), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("tensor 5.bias: CRC32 mismatch"), std::string::npos)
      << dt_last_error();
  // Truncated: named, never read past the end.
  WriteAll(path, std::vector<unsigned char>(bytes.begin(), bytes.begin() + 100));
  EXPECT_EQ(dt_safetensors_load_module(path.c_str(), b), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("header: truncated"), std::string::npos)
      << dt_last_error();
  WriteAll(path, std::vector<unsigned char>(bytes.begin(), bytes.end() - 20));
  EXPECT_EQ(dt_safetensors_load_module(path.c_str(), b), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("tensor 5.bias"), std::string::npos)
      << dt_last_error();
  dt_module_destroy(a);
  dt_module_destroy(b);
  dt_module_destroy(lenet);
}

// BatchNorm's buffers (running_mean/var f32, num_batches_tracked i64 of
// rank 0, as PyTorch's state_dict) round-trip through model.safetensors.
TEST(Checkpoint, SafetensorsHoldsBatchNormBuffers) {
  std::string dir = TempDir();
  dt_module *a = nullptr, *b = nullptr;
  ASSERT_EQ(dt_nn_batch_norm2d(3, 1e-5f, 0.1f, &a), DT_OK);
  ASSERT_EQ(dt_nn_batch_norm2d(3, 1e-5f, 0.1f, &b), DT_OK);
  std::vector<float> x(2 * 3 * 4);
  for (size_t i = 0; i < x.size(); i++)
    x[i] = 0.25f * (float)(i * i % 7) - 0.5f;
  const int64_t shape[4] = {2, 3, 2, 2};
  dt_tensor *in = nullptr, *out = nullptr;
  ASSERT_EQ(dt_tensor_from_host(x.data(), shape, 4, DT_DTYPE_F32, DT_CPU, &in), DT_OK);
  for (int step = 0; step < 2; step++) {  // two training forwards: running stats move
    ASSERT_EQ(dt_module_call(a, in, &out), DT_OK) << dt_last_error();
    dt_tensor_release(out);
  }
  ASSERT_EQ(dt_safetensors_save_module(a, dir.c_str(), "model.safetensors", nullptr, nullptr),
            DT_OK)
      << dt_last_error();
  std::string path = dir + "/model.safetensors";
  ASSERT_EQ(dt_safetensors_load_module(path.c_str(), b), DT_OK) << dt_last_error();
  ExpectSameTensors(a, b, true);
  int64_t count = 0;
  ASSERT_EQ(dt_tensor_to_host(dt_module_buffer(b, "num_batches_tracked"), &count, 8), DT_OK);
  EXPECT_EQ(count, 2);
  auto bytes = ReadAll(path);
  std::string header(bytes.begin() + 8, bytes.end());
  EXPECT_NE(header.find("\"num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[]"),
            std::string::npos);
  dt_tensor_release(in);
  dt_module_destroy(a);
  dt_module_destroy(b);
}

TEST(Checkpoint, ManifestMakesACheckpointExist) {
  std::string dir = TempDir();
  dt_module *m = nullptr;
  ASSERT_EQ(dt_model_create("lenet", 3, &m), DT_OK);
  dt_ckpt_manifest man = {};
  man.step = 12;
  man.n_files = 2;
  snprintf(man.files[0].name, sizeof man.files[0].name, "model.safetensors");
  snprintf(man.files[1].name, sizeof man.files[1].name, "trainer_state.bin");
  ASSERT_EQ(dt_safetensors_save_module(m, dir.c_str(), man.files[0].name, &man.files[0].crc32,
                                       &man.files[0].size),
            DT_OK);
  WriteState(dir);
  auto state = ReadAll(dir + "/trainer_state.bin");
  man.files[1].size = state.size();
  man.files[1].crc32 = dt_crc32(0, state.data(), state.size());
  dt_ckpt_manifest got;
  EXPECT_EQ(dt_ckpt_verify(dir.c_str(), &got), DT_ERR_IO);  // no manifest yet
  EXPECT_NE(std::string(dt_last_error()).find("no readable manifest"), std::string::npos);
  ASSERT_EQ(dt_ckpt_manifest_write(dir.c_str(), &man), DT_OK);
  ASSERT_EQ(dt_ckpt_verify(dir.c_str(), &got), DT_OK) << dt_last_error();
  EXPECT_EQ(got.step, 12);
  EXPECT_EQ(got.n_files, 2);
  // A flipped bit in the optimizer section is found through the manifest.
  auto bad = state;
  bad[bad.size() - 10] ^= 0x80;
  WriteAll(dir + "/trainer_state.bin", bad);
  EXPECT_EQ(dt_ckpt_verify(dir.c_str(), &got), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("trainer_state.bin: section 'optimizer'"),
            std::string::npos)
      << dt_last_error();
  // Truncated weights: the size says so, and which tensor is cut.
  WriteAll(dir + "/trainer_state.bin", state);
  auto w = ReadAll(dir + "/model.safetensors");
  WriteAll(dir + "/model.safetensors", std::vector<unsigned char>(w.begin(), w.end() - 8));
  EXPECT_EQ(dt_ckpt_verify(dir.c_str(), &got), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("the manifest says"), std::string::npos)
      << dt_last_error();
  // A truncated manifest is no manifest.
  auto mf = ReadAll(dir + "/manifest.json");
  WriteAll(dir + "/model.safetensors", w);
  WriteAll(dir + "/manifest.json", std::vector<unsigned char>(mf.begin(), mf.begin() + 40));
  EXPECT_EQ(dt_ckpt_verify(dir.c_str(), &got), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("manifest.json: malformed JSON"), std::string::npos)
      << dt_last_error();
  dt_module_destroy(m);
}

// A manifest.json of `files` (a JSON array's inside) and `step`: the
// message of dt_ckpt_manifest_read.
std::string ManifestError(const std::string &dir, const std::string &step,
                          const std::string &files) {
  std::string text = "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"step\": " + step +
                     ", \"files\": [" + files + "]}";
  WriteAll(dir + "/manifest.json", std::vector<unsigned char>(text.begin(), text.end()));
  dt_ckpt_manifest m;
  if (dt_ckpt_manifest_read(dir.c_str(), &m) == DT_OK)
    return "accepted";
  return dt_last_error();
}

TEST(Checkpoint, ManifestRefusesWhatItCannotHold) {
  std::string dir = TempDir();
  const std::string ok = R"({"name": "model.safetensors", "bytes": 8, "crc32": "0000abcd"})";
  EXPECT_EQ(ManifestError(dir, "12", ok), "accepted");
  // A 20-digit step is no step (it was read as 9223372036854775807).
  EXPECT_NE(ManifestError(dir, "12345678901234567890", ok)
                .find("the integer 12345678901234567890 is out of range (at most "
                      "9223372036854775807)"),
            std::string::npos);
  EXPECT_NE(ManifestError(dir, "-3", ok).find("step -3 is negative"), std::string::npos);
  EXPECT_NE(ManifestError(dir, "12", "").find("the file list is empty"), std::string::npos);
  // A path is named as such, not as a missing name.
  std::string e = ManifestError(
      dir, "12",
      R"({"name": "../step_00000001/model.safetensors", "bytes": 8, "crc32": "0000abcd"})");
  EXPECT_NE(e.find("file entry '../step_00000001/model.safetensors' is not a plain file name"),
            std::string::npos)
      << e;
  e = ManifestError(dir, "12", R"({"name": "model.safetensors", "crc32": "0000abcd"})");
  EXPECT_NE(e.find("a file entry lacks its bytes"), std::string::npos) << e;
  e = ManifestError(dir, "12",
                    R"({"name": "m", "bytes": 18446744073709551000, "crc32": "0000abcd"})");
  EXPECT_NE(e.find("the integer 18446744073709551000 is out of range"), std::string::npos) << e;
}

// The safetensors header of `path` with `from` replaced by `to` (the
// length field follows; the offsets count from the data, so they hold).
void EditHeader(const std::string &path, const std::string &from, const std::string &to) {
  auto b = ReadAll(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)b[i] << (8 * i);
  std::string header(b.begin() + 8, b.begin() + 8 + (long)n);
  size_t at = header.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  header.replace(at, from.size(), to);
  std::vector<unsigned char> out(8);
  for (int i = 0; i < 8; i++)
    out[i] = (unsigned char)(header.size() >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), b.begin() + 8 + (long)n, b.end());
  WriteAll(path, out);
}

TEST(Checkpoint, SafetensorsOffsetsAndCrcsAreChecked) {
  std::string dir = TempDir();
  dt_module *m = nullptr;
  ASSERT_EQ(dt_model_create("mlp", 1, &m), DT_OK);
  ASSERT_EQ(dt_safetensors_save_module(m, dir.c_str(), "model.safetensors", nullptr, nullptr),
            DT_OK);
  std::string path = dir + "/model.safetensors";
  auto good = ReadAll(path);
  std::string header(good.begin() + 8, good.begin() + 300);
  // An offset beyond int64 is named as written (it was 9223372036854775807).
  size_t at = header.find("\"data_offsets\":[0,");
  ASSERT_NE(at, std::string::npos) << header;
  std::string first = header.substr(at, header.find(']', at) + 1 - at);
  EditHeader(path, first, "\"data_offsets\":[0,18446744073709551000]");
  EXPECT_EQ(dt_safetensors_load_module(path.c_str(), m), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("the integer 18446744073709551000 is out of range"),
            std::string::npos)
      << dt_last_error();
  // A tensor whose CRC was stripped from the metadata is refused, named.
  WriteAll(path, good);
  EditHeader(path, "\"crc32.1.weight\"", "\"crc32.1.wXight\"");
  EXPECT_EQ(dt_safetensors_load_module(path.c_str(), m), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("tensor 1.weight has no CRC32 in the metadata"),
            std::string::npos)
      << dt_last_error();
  dt_module_destroy(m);
}

TEST(Checkpoint, ListNewestFirstAndRemove) {
  std::string dir = TempDir();
  for (const char *n : {"step_00000002", "step_00000010", "step_00000001", "other", "step_12"})
    ASSERT_EQ(mkdir((dir + "/" + n).c_str(), 0755), 0);
  char names[8][64];
  int n = 0;
  ASSERT_EQ(dt_ckpt_list(dir.c_str(), names, 8, &n), DT_OK);
  ASSERT_EQ(n, 3);
  EXPECT_STREQ(names[0], "step_00000010");
  EXPECT_STREQ(names[2], "step_00000001");
  ASSERT_EQ(dt_ckpt_list(dir.c_str(), names, 1, &n), DT_OK);  // the newest only
  ASSERT_EQ(n, 1);
  EXPECT_STREQ(names[0], "step_00000010");
  ASSERT_EQ(dt_ckpt_remove((dir + "/step_00000010").c_str()), DT_OK);
  ASSERT_EQ(dt_ckpt_list(dir.c_str(), names, 8, &n), DT_OK);
  EXPECT_EQ(n, 2);
  ASSERT_EQ(dt_ckpt_list((dir + "/none").c_str(), names, 8, &n), DT_OK);
  EXPECT_EQ(n, 0);
}

}  // namespace
