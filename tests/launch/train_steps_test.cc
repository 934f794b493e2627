// The length of a run: --max-steps counts optimizer steps over the whole
// run (not micro-batches, not per epoch), stops mid-epoch, and the LR
// schedule spans exactly the steps taken, so it ends at its floor.
// Trains on a tiny data set written here (60 training, 16 test images).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cpu.h"
#include "launch/observe.h"
#include "train/train_loop.h"

namespace {

constexpr int kTrain = 60, kTest = 16;

void put_be32(std::FILE *f, uint32_t v) {
  unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                        static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
  std::fwrite(b, 1, 4, f);
}

// idx files of n random 28x28 images and their labels under dir.
void write_split(const std::string &dir, const char *prefix, int n, uint32_t seed) {
  std::FILE *f = std::fopen((dir + "/" + prefix + "-images-idx3-ubyte").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  put_be32(f, 0x803);
  put_be32(f, static_cast<uint32_t>(n));
  put_be32(f, 28);
  put_be32(f, 28);
  for (int i = 0; i < n * 28 * 28; i++)
    std::fputc(static_cast<int>((static_cast<uint32_t>(i) * 2654435761u + seed) >> 24), f);
  std::fclose(f);
  f = std::fopen((dir + "/" + prefix + "-labels-idx1-ubyte").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  put_be32(f, 0x801);
  put_be32(f, static_cast<uint32_t>(n));
  for (int i = 0; i < n; i++)
    std::fputc((i * 7 + static_cast<int>(seed)) % 10, f);
  std::fclose(f);
}

class TrainSteps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char *tmp = std::getenv("TEST_TMPDIR");
    data_dir_ = std::string(tmp ? tmp : "/tmp") + "/train_steps_data";
    std::string dir = data_dir_ + "/fashion-mnist";
    std::system(("mkdir -p '" + dir + "'").c_str());
    write_split(dir, "train", kTrain, 1);
    write_split(dir, "t10k", kTest, 2);
  }
  void SetUp() override { dt_cpu_set_num_threads(1); }

  // mlp, batch 4: 15 micro-batches an epoch; accum 2: 8 optimizer steps an
  // epoch (the last on a group of one). Cosine decay to 1e-3 after a
  // warm-up of 2 steps.
  dt_train_config config() const {
    dt_train_config c = dt_train_config_default();
    EXPECT_EQ(dt_task_find("mlp", &c.task), DT_OK);
    c.data_dir = data_dir_.c_str();
    c.batch = 4;
    c.accum = 2;
    c.lr = 0.05f;
    c.min_lr = 1e-3f;
    c.warmup = 2;
    c.schedule = DT_LR_DECAY_COSINE;
    c.threads = 1;
    c.log_interval = 1;
    c.eval_batch = 8;
    return c;
  }

  // Runs c and checks its length: `steps` optimizer steps over `epochs`
  // epochs, the progress lines `seen` there and `unseen` not; the schedule
  // spans exactly the steps taken and ends at its floor.
  void expect_run(const dt_train_config &given, int64_t steps, int epochs,
                  const std::vector<std::string> &seen, const std::vector<std::string> &unseen) {
    char *buf = nullptr;
    size_t len = 0;
    std::FILE *log = open_memstream(&buf, &len);
    dt_train_result r{};
    dt_train_config c = given;  // the progress lines: the command line's observer as hooks
    dt_observe_config oc = DT_OBSERVE_CONFIG_DEFAULT;
    dt_observe_hooks obs;
    dt_observe_hooks_init(&obs, &oc, nullptr, &c.hooks);
    dt_status st = dt_train_run(&c, log, &r);
    std::fclose(log);
    std::string out(buf, len);
    std::free(buf);
    ASSERT_EQ(st, DT_OK) << dt_last_error() << "\n" << out;
    EXPECT_EQ(r.optimizer_steps, steps) << out;
    EXPECT_EQ(r.epochs, epochs) << out;
    EXPECT_EQ(r.schedule_steps, steps);
    EXPECT_FLOAT_EQ(static_cast<float>(r.final_lr), c.min_lr);
    EXPECT_TRUE(has_line(out, "test_accuracy=")) << "the run ends with an evaluation\n" << out;
    for (const std::string &l : seen)
      EXPECT_TRUE(has_line(out, l)) << "no line " << l << "\n" << out;
    for (const std::string &l : unseen)
      EXPECT_FALSE(has_line(out, l)) << "a line " << l << "\n" << out;
  }

  // log has a line starting with prefix.
  static bool has_line(const std::string &log, const std::string &prefix) {
    return log.rfind(prefix, 0) == 0 || log.find("\n" + prefix) != std::string::npos;
  }

  static std::string data_dir_;
};
std::string TrainSteps::data_dir_;

TEST_F(TrainSteps, MaxStepsCountsOptimizerStepsAndStopsMidEpoch) {
  dt_train_config c = config();
  c.epochs = 3;
  c.max_steps = 5;  // 10 of the first epoch's 15 micro-batches
  expect_run(c, 5, 1, {"epoch 1 step 10/10 "}, {"epoch 1 step 11", "epoch 2 "});
}

TEST_F(TrainSteps, MaxStepsCarriesAcrossEpochs) {
  dt_train_config c = config();
  c.epochs = 3;
  c.max_steps = 11;  // 8 steps (15 micro-batches) in epoch 1, 3 steps (6) in epoch 2
  expect_run(c, 11, 2, {"epoch 1 step 15/15 ", "epoch 2 step 6/6 "}, {"epoch 3 "});
}

TEST_F(TrainSteps, EpochsBoundTheRunWhenTheyEndFirst) {
  for (int max_steps : {0, 100}) {
    SCOPED_TRACE(max_steps);
    dt_train_config c = config();
    c.epochs = 2;
    c.max_steps = max_steps;
    expect_run(c, 16, 2, {"epoch 2 step 15/15 "}, {"epoch 3 "});
  }
}

TEST_F(TrainSteps, DataParallelModeCountsTheSameSteps) {
  dt_train_config c = config();
  c.mode = DT_TRAIN_MODE_DP;
  c.devices[0] = (dt_device){DT_DEVICE_CPU, 0};
  c.devices[1] = (dt_device){DT_DEVICE_CPU, 1};
  c.n_devices = 2;
  c.epochs = 2;
  c.max_steps = 3;
  expect_run(c, 3, 1, {"epoch 1 step 6/6 "}, {"epoch 1 step 7"});
}

}  // namespace
