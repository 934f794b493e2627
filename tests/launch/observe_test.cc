// The pieces of issue 15 on their own: --trace-steps and {rank} paths, the
// metrics writer (JSON numbers, null for what is not finite or not there,
// optional keys only when recorded), the progress ETA, the rule that turns
// the free cores into a thread count, the free-core probe, the report's
// errors and the GPU monitor's message without a driver.
#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/status.h"
#include "launch/gpu_monitor.h"
#include "launch/metrics.h"
#include "launch/progress.h"
#include "launch/report.h"
#include "launch/threads.h"
#include "launch/trace.h"

namespace {

std::string temp_path(const char *name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::vector<std::string> lines_of(const std::string &path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

TEST(Trace, StepsParse) {
  int64_t a = 0, b = 0;
  ASSERT_EQ(dt_trace_parse_steps("3:7", &a, &b), DT_OK);
  EXPECT_EQ(a, 3);
  EXPECT_EQ(b, 7);
  ASSERT_EQ(dt_trace_parse_steps("5:5", &a, &b), DT_OK);
  for (const char *bad : {"", "5", "0:3", "4:2", "1:2x", "a:b", "-1:3"})
    EXPECT_EQ(dt_trace_parse_steps(bad, &a, &b), DT_ERR_INVALID_ARG) << bad;
  EXPECT_NE(std::string(dt_last_error()).find("--trace-steps '-1:3'"), std::string::npos);
}

TEST(Trace, RankInPath) {
  char buf[64];
  ASSERT_EQ(dt_trace_path_for_rank("t-{rank}.json", 12, buf, sizeof buf), DT_OK);
  EXPECT_STREQ(buf, "t-12.json");
  ASSERT_EQ(dt_trace_path_for_rank("a{rank}b{rank}", 3, buf, sizeof buf), DT_OK);
  EXPECT_STREQ(buf, "a3b3");
  ASSERT_EQ(dt_trace_path_for_rank("plain", 3, buf, sizeof buf), DT_OK);
  EXPECT_STREQ(buf, "plain");
  EXPECT_EQ(dt_trace_path_for_rank("0123456789{rank}", 1, buf, 8), DT_ERR_INVALID_ARG);
}

TEST(Metrics, RecordsAreJsonWithNullsForMissingValues) {
  std::string path = temp_path("metrics_unit.jsonl");
  dt_metrics *m = nullptr;
  ASSERT_EQ(dt_metrics_open(path.c_str(), false, &m), DT_OK);
  dt_metrics_step r = dt_metrics_step_default();
  double ranks[2] = {10.0, 11.0};
  dt_metrics_device dev = {"cpu:0", 1.0, 2.0, 3.0};
  r.step = 5;
  r.loss = NAN;  // not finite -> null
  r.lr = 0.1;
  r.grad_norm = 2.5;
  r.samples_per_s = 100;
  r.rank_step_ms = ranks;
  r.n_ranks = 2;
  r.devices = &dev;
  r.n_devices = 1;
  ASSERT_EQ(dt_metrics_write_step(m, &r), DT_OK);
  r.allreduce_ms = 4.0;
  r.allreduce_hidden = 0.25;
  r.loss_scale = 65536.0;
  r.skipped_steps = 2;
  ASSERT_EQ(dt_metrics_write_step(m, &r), DT_OK);
  dt_metrics_eval ev = {5, 1, 1.5, "test", 0.7, 0.6, 0.8, "accuracy", -1};
  ASSERT_EQ(dt_metrics_write_eval(m, &ev), DT_OK);
  ASSERT_EQ(dt_metrics_close(m), DT_OK);

  std::vector<std::string> lines = lines_of(path);
  ASSERT_EQ(lines.size(), 3u);
  cJSON *a = cJSON_Parse(lines[0].c_str()), *b = cJSON_Parse(lines[1].c_str());
  cJSON *e = cJSON_Parse(lines[2].c_str());
  ASSERT_TRUE(a && b && e);
  EXPECT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(a, "loss")));
  EXPECT_TRUE(cJSON_IsNull(cJSON_GetObjectItem(a, "allreduce_ms")));
  EXPECT_EQ(cJSON_GetObjectItem(a, "loss_scale"), nullptr);  // optional: absent
  EXPECT_EQ(cJSON_GetObjectItem(a, "mfu"), nullptr);
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(a, "grad_norm")->valuedouble, 2.5);
  EXPECT_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(a, "rank_step_ms")), 2);
  cJSON *mem = cJSON_GetArrayItem(cJSON_GetObjectItem(a, "memory"), 0);
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(mem, "peak_mib")->valuedouble, 3.0);
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(b, "allreduce_hidden")->valuedouble, 0.25);
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(b, "loss_scale")->valuedouble, 65536.0);
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(b, "skipped_steps")->valuedouble, 2.0);
  EXPECT_STREQ(cJSON_GetObjectItem(e, "type")->valuestring, "eval");
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(e, "test_accuracy")->valuedouble, 0.8);
  cJSON_Delete(a);
  cJSON_Delete(b);
  cJSON_Delete(e);
}

TEST(Metrics, UnwritablePathIsAnIoError) {
  dt_metrics *m = nullptr;
  EXPECT_EQ(dt_metrics_open("/nonexistent-dir/m.jsonl", false, &m), DT_ERR_IO);
  EXPECT_NE(std::string(dt_last_error()).find("/nonexistent-dir/m.jsonl"), std::string::npos);
}

TEST(Progress, Eta) {
  char buf[32];
  dt_progress_format_eta(59.6, buf, sizeof buf);
  EXPECT_STREQ(buf, "1:00");
  dt_progress_format_eta(3723, buf, sizeof buf);
  EXPECT_STREQ(buf, "1:02:03");
  dt_progress_format_eta(-1, buf, sizeof buf);
  EXPECT_STREQ(buf, "?");
  dt_progress_format_eta(NAN, buf, sizeof buf);
  EXPECT_STREQ(buf, "?");
}

TEST(Threads, EveryCoreByDefault) {
  // No measurement of the load: the only rank on its host gets every core,
  // always (the waits yield instead, see dt_threads_spincount).
  for (int cores = 1; cores <= 256; cores++)
    EXPECT_EQ(dt_threads_for(cores, 1), cores) << cores;
  EXPECT_EQ(dt_threads_for(2, 0), 2);  // no launcher
  // Ranks of one host share its cores, at least one thread each.
  EXPECT_EQ(dt_threads_for(2, 2), 1);
  EXPECT_EQ(dt_threads_for(8, 3), 2);
  EXPECT_EQ(dt_threads_for(2, 4), 1);
}

TEST(Threads, ShortSpinUnlessTheUserChose) {
  EXPECT_STREQ(dt_threads_spincount(nullptr, nullptr), DT_THREADS_SPINCOUNT);
  EXPECT_STREQ(dt_threads_spincount("", ""), DT_THREADS_SPINCOUNT);  // empty = unset
  EXPECT_EQ(dt_threads_spincount("active", nullptr), nullptr);
  EXPECT_EQ(dt_threads_spincount("passive", nullptr), nullptr);
  EXPECT_EQ(dt_threads_spincount(nullptr, "300000"), nullptr);
  // Well below libgomp's 300000 iterations, above 0 (passive: a sleep at
  // every barrier).
  long spin = strtol(DT_THREADS_SPINCOUNT, nullptr, 10);
  EXPECT_GT(spin, 0);
  EXPECT_LT(spin, 300000);
}

TEST(Report, Errors) {
  std::string empty = temp_path("empty.jsonl");
  std::ofstream(empty).close();
  std::string page = temp_path("page.html");
  EXPECT_EQ(dt_report_write(empty.c_str(), page.c_str()), DT_ERR_FORMAT);
  EXPECT_NE(std::string(dt_last_error()).find("holds no train or eval records"), std::string::npos);
  std::string cut = temp_path("cut.jsonl");
  // a live run's last line, cut off mid-record, is skipped
  std::ofstream(cut) << "{\"type\":\"train\",\"step\":1,\"loss\":2}\n{\"type\":\"tr";
  EXPECT_EQ(dt_report_write(cut.c_str(), page.c_str()), DT_OK) << dt_last_error();
  std::ifstream in(page);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);
  EXPECT_EQ(ss.str().find("<script"), std::string::npos);
}

TEST(GpuMonitor, SaysWhyWithoutADriver) {
  dt_gpu_monitor *m = nullptr;
  dt_status st = dt_gpu_monitor_open(&m);
  if (st == DT_OK) {
    EXPECT_GT(dt_gpu_monitor_count(m), 0);
    dt_gpu_sample s;
    EXPECT_EQ(dt_gpu_monitor_sample(m, 0, &s), DT_OK);
    dt_gpu_monitor_close(m);
    GTEST_SKIP() << "NVML is here: the GPU path ran instead";
  }
  EXPECT_EQ(st, DT_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(dt_last_error()).find("GPU monitor unavailable: "), std::string::npos);
}

}  // namespace
