// One run per run directory (train/run_lock.h) through its C API: a second
// holder, also of the same process, is refused naming the directory, the
// holder's pid and host; a released lock or a dead holder's leftover
// record does not block (the latter is noted); a path that cannot hold
// the lock is named.
#include "train/run_lock.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/dt_assert.h"

namespace {

std::string ScratchDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string t = std::string(base ? base : "/tmp") + "/run_lock_XXXXXX";
  return mkdtemp(&t[0]) ? t : std::string();
}

std::string Slurp(const std::string &path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string HostName() {
  char host[256] = "";
  gethostname(host, sizeof host);
  return host;
}

TEST(RunLock, ASecondHolderIsRefusedNamingThePidAndHost) {
  std::string dir = ScratchDir() + "/run";  // created by the lock
  dt_train_run_lock *a = nullptr, *b = nullptr;
  ASSERT_DT_OK(dt_train_run_lock_acquire(dir.c_str(), &a));
  EXPECT_STREQ(dt_train_run_lock_note(a), "");
  std::string pid = "pid " + std::to_string(getpid());
  EXPECT_NE(Slurp(dir + "/run.lock").find(pid + "\n"), std::string::npos);

  EXPECT_EQ(dt_train_run_lock_acquire(dir.c_str(), &b), DT_ERR_STATE);  // this process too
  EXPECT_EQ(b, nullptr);
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("run directory " + dir + " is in use by another run: " + pid + " on host " +
                     HostName()),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(dir + "/run.lock"), std::string::npos) << msg;

  dt_train_run_lock_release(a);
  EXPECT_EQ(Slurp(dir + "/run.lock"), "");  // released: the record cleared
  ASSERT_DT_OK(dt_train_run_lock_acquire(dir.c_str(), &b));
  EXPECT_STREQ(dt_train_run_lock_note(b), "");
  dt_train_run_lock_release(b);
  dt_train_run_lock_release(nullptr);
}

TEST(RunLock, ADeadHoldersRecordDoesNotBlock) {
  std::string dir = ScratchDir();
  std::FILE *f = std::fopen((dir + "/run.lock").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("dtrain run lock\npid 99999999\nhost elsewhere\nstarted 2020-01-01T00:00:00Z\n", f);
  std::fclose(f);
  dt_train_run_lock *l = nullptr;
  ASSERT_DT_OK(dt_train_run_lock_acquire(dir.c_str(), &l));
  std::string note = dt_train_run_lock_note(l);
  EXPECT_NE(note.find("last held by pid 99999999 on host elsewhere"), std::string::npos) << note;
  EXPECT_NE(note.find("did not release it"), std::string::npos) << note;
  EXPECT_NE(Slurp(dir + "/run.lock").find("pid " + std::to_string(getpid()) + "\n"),
            std::string::npos);
  dt_train_run_lock_release(l);
}

TEST(RunLock, OneProcessJobIsThePlainLock) {
  std::string dir = ScratchDir();
  dt_train_run_lock *a = nullptr, *b = nullptr;
  dt_device cpu = {DT_DEVICE_CPU, 0};
  ASSERT_DT_OK(dt_train_run_lock_acquire_job(dir.c_str(), nullptr, cpu, 0, false, &a));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(dt_train_run_lock_acquire_job(dir.c_str(), nullptr, cpu, 0, false, &b), DT_ERR_STATE);
  dt_train_run_lock_release(a);
}

TEST(RunLock, APathThatCannotHoldTheLockIsNamed) {
  std::string file = ScratchDir() + "/not-a-dir";
  std::FILE *f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  dt_train_run_lock *l = nullptr;
  EXPECT_EQ(dt_train_run_lock_acquire(file.c_str(), &l), DT_ERR_IO);
  EXPECT_EQ(l, nullptr);
  EXPECT_NE(std::string(dt_last_error()).find(file), std::string::npos) << dt_last_error();
}

}  // namespace
