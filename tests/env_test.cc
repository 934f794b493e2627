// The environment-variable table (core/env.h): the table itself, parsing,
// defaults and the messages for bad values.
#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "core/backend.h"
#include "core/status.h"
#include "dist/comm.h"

namespace {

// Sets (or, with nullptr, unsets) one variable for the scope of a test and
// restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    const char *old = std::getenv(name);
    had_ = old != nullptr;
    if (had_)
      old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

std::string Name(dt_env_param p) { return dt_env_info_of(p)->name; }

TEST(EnvTable, EveryRowIsComplete) {
  std::set<std::string> names;
  const std::set<std::string> groups = {"cpu", "cuda", "dist", "launch", "test"};
  for (int i = 0; i < DT_ENV_COUNT; i++) {
    const dt_env_info *e = dt_env_info_of((dt_env_param)i);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(std::string(e->name).rfind("DT_", 0), 0u) << e->name;
    EXPECT_TRUE(names.insert(e->name).second) << "listed twice: " << e->name;
    EXPECT_TRUE(groups.count(e->group)) << e->name << ": group " << e->group;
    EXPECT_GT(std::strlen(e->doc), 10u) << e->name;
    // A default, or a description of the computed one; never both.
    EXPECT_NE(e->default_value == nullptr, e->unset == nullptr) << e->name;
    if (e->type == DT_ENV_TYPE_CHOICE) {
      EXPECT_NE(e->choices, nullptr) << e->name;
    }
    if (e->type == DT_ENV_TYPE_INT) {
      EXPECT_LE(e->min, e->max) << e->name;
    }
  }
  EXPECT_EQ(dt_env_info_of(DT_ENV_COUNT), nullptr);
  EXPECT_EQ(dt_env_info_of((dt_env_param)-1), nullptr);
}

TEST(EnvTable, EveryDefaultParses) {
  for (int i = 0; i < DT_ENV_COUNT; i++) {
    dt_env_param p = (dt_env_param)i;
    ScopedEnv unset(dt_env_info_of(p)->name, nullptr);
    EXPECT_FALSE(dt_env_is_set(p));
    EXPECT_EQ(dt_env_raw(p), nullptr);
    EXPECT_EQ(DT_OK, dt_env_check(p)) << Name(p) << ": " << dt_last_error();
    EXPECT_GT(std::strlen(dt_env_default_text(p)), 0u) << Name(p);
  }
}

TEST(EnvInt, ComputedDefaultValueAndRange) {
  ScopedEnv env("DT_NUM_THREADS", nullptr);
  int64_t v = 7;  // the caller's computed default stays when unset
  EXPECT_EQ(DT_OK, dt_env_int(DT_ENV_NUM_THREADS, &v));
  EXPECT_EQ(v, 7);
  setenv("DT_NUM_THREADS", "", 1);  // empty is unset
  EXPECT_FALSE(dt_env_is_set(DT_ENV_NUM_THREADS));
  EXPECT_EQ(DT_OK, dt_env_int(DT_ENV_NUM_THREADS, &v));
  EXPECT_EQ(v, 7);
  setenv("DT_NUM_THREADS", "3", 1);
  EXPECT_EQ(DT_OK, dt_env_int(DT_ENV_NUM_THREADS, &v));
  EXPECT_EQ(v, 3);
  char max[32];
  std::snprintf(max, sizeof max, "%d", DT_CPU_MAX_THREADS);
  setenv("DT_NUM_THREADS", max, 1);
  EXPECT_EQ(DT_OK, dt_env_int(DT_ENV_NUM_THREADS, &v));
  EXPECT_EQ(v, DT_CPU_MAX_THREADS);
}

TEST(EnvInt, BadValuesNameTheVariableTheValueAndWhatIsAccepted) {
  for (const char *bad : {"abc", "0", "-2", "4097", "3x", " 3", "99999999999999999999"}) {
    ScopedEnv env("DT_NUM_THREADS", bad);
    int64_t v = 5;
    EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_int(DT_ENV_NUM_THREADS, &v)) << bad;
    EXPECT_EQ(v, 5) << "a bad value keeps the default";
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find("DT_NUM_THREADS"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("an integer in 1..4096"), std::string::npos) << msg;
    EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_check(DT_ENV_NUM_THREADS));
  }
}

TEST(EnvBool, Spellings) {
  struct Case {
    const char *text;
    bool want;
  } cases[] = {{"1", true},  {"0", false},   {"true", true}, {"FALSE", false},
               {"on", true}, {"off", false}, {"yes", true},  {"No", false}};
  for (const Case &c : cases) {
    ScopedEnv env("DT_CUDNN_BENCHMARK", c.text);
    bool v = !c.want;
    EXPECT_EQ(DT_OK, dt_env_bool(DT_ENV_CUDNN_BENCHMARK, &v)) << c.text;
    EXPECT_EQ(v, c.want) << c.text;
  }
}

TEST(EnvBool, DefaultsAndBadValues) {
  ScopedEnv tf32("DT_CUDA_TF32", nullptr);
  bool v = false;
  EXPECT_EQ(DT_OK, dt_env_bool(DT_ENV_CUDA_TF32, &v));
  EXPECT_TRUE(v) << "DT_CUDA_TF32 defaults to 1";
  ScopedEnv bench("DT_CUDNN_BENCHMARK", "maybe");
  v = true;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_bool(DT_ENV_CUDNN_BENCHMARK, &v));
  EXPECT_FALSE(v) << "a bad value keeps the default (0)";
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("environment variable DT_CUDNN_BENCHMARK: invalid value 'maybe'"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("1 or 0"), std::string::npos) << msg;
}

TEST(EnvBytes, ByteCounts) {
  ScopedEnv env("DT_CPU_MEMORY_LIMIT", "512M");
  size_t v = 0;
  EXPECT_EQ(DT_OK, dt_env_bytes(DT_ENV_CPU_MEMORY_LIMIT, &v));
  EXPECT_EQ(v, (size_t)512 << 20);
  setenv("DT_CPU_MEMORY_LIMIT", "1048576", 1);
  EXPECT_EQ(DT_OK, dt_env_bytes(DT_ENV_CPU_MEMORY_LIMIT, &v));
  EXPECT_EQ(v, (size_t)1048576);
  setenv("DT_CPU_MEMORY_LIMIT", "lots", 1);
  v = 9;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_bytes(DT_ENV_CPU_MEMORY_LIMIT, &v));
  EXPECT_EQ(v, 9u) << "no table default: the caller's stays";
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("DT_CPU_MEMORY_LIMIT"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'lots'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("512M"), std::string::npos) << msg;
}

TEST(EnvBytes, ZeroIsNotACap) {
  // 0 was accepted and meant "no cap"; unset gives the default cap instead.
  for (const char *zero : {"0", "0K", "0G"}) {
    ScopedEnv env("DT_CPU_MEMORY_LIMIT", zero);
    size_t v = 9;
    EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_bytes(DT_ENV_CPU_MEMORY_LIMIT, &v)) << zero;
    EXPECT_EQ(v, 9u);
    std::string msg = dt_last_error();
    EXPECT_NE(msg.find("DT_CPU_MEMORY_LIMIT: invalid value '" + std::string(zero) + "'"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("a byte count of at least 1"), std::string::npos) << msg;
    EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_check(DT_ENV_CPU_MEMORY_LIMIT));
  }
  ScopedEnv env("DT_CUDA_MEMORY_LIMIT", "0");
  size_t v = 0;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_bytes(DT_ENV_CUDA_MEMORY_LIMIT, &v));
  setenv("DT_CUDA_MEMORY_LIMIT", "1", 1);
  EXPECT_EQ(DT_OK, dt_env_bytes(DT_ENV_CUDA_MEMORY_LIMIT, &v));
  EXPECT_EQ(v, 1u);
}

TEST(EnvChoice, IndexAndAgreementWithTheCommunicatorNames) {
  const char *choices = dt_env_info_of(DT_ENV_COMM_BACKEND)->choices;
  EXPECT_STREQ(choices, "auto|mpi|nccl");
  // The table's choices are the communicator's names, in its enum's order.
  const dt_comm_backend_choice all[] = {DT_COMM_BACKEND_AUTO, DT_COMM_BACKEND_MPI,
                                        DT_COMM_BACKEND_NCCL};
  for (int i = 0; i < 3; i++) {
    ScopedEnv env("DT_COMM_BACKEND", dt_comm_backend_choice_name(all[i]));
    int index = -1;
    EXPECT_EQ(DT_OK, dt_env_choice(DT_ENV_COMM_BACKEND, &index));
    EXPECT_EQ(index, (int)all[i]);
    dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
    EXPECT_EQ(DT_OK, dt_comm_config_from_env(&cc));
    EXPECT_EQ(cc.backend, all[i]);
  }
  ScopedEnv unset("DT_COMM_BACKEND", nullptr);
  int index = -1;
  EXPECT_EQ(DT_OK, dt_env_choice(DT_ENV_COMM_BACKEND, &index));
  EXPECT_EQ(index, 0) << "default auto";
}

TEST(EnvChoice, BadValue) {
  ScopedEnv env("DT_COMM_BACKEND", "gloo");
  int index = -1;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_choice(DT_ENV_COMM_BACKEND, &index));
  EXPECT_EQ(index, 0) << "a bad value keeps the default";
  std::string msg = dt_last_error();
  EXPECT_NE(msg.find("environment variable DT_COMM_BACKEND: invalid value 'gloo': expected one "
                     "of auto, mpi, nccl"),
            std::string::npos)
      << msg;
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_comm_config_from_env(&cc));
  EXPECT_NE(std::string(dt_last_error()).find("'gloo'"), std::string::npos);
}

TEST(EnvString, DefaultAndValue) {
  ScopedEnv env("DT_DATA_DIR", nullptr);
  const char *v = nullptr;
  EXPECT_EQ(DT_OK, dt_env_string(DT_ENV_DATA_DIR, &v));
  EXPECT_STREQ(v, "data");
  setenv("DT_DATA_DIR", "/srv/data", 1);
  EXPECT_EQ(DT_OK, dt_env_string(DT_ENV_DATA_DIR, &v));
  EXPECT_STREQ(v, "/srv/data");
  ScopedEnv mpirun("DT_MPIRUN", nullptr);
  v = "kept";
  EXPECT_EQ(DT_OK, dt_env_string(DT_ENV_MPIRUN, &v));
  EXPECT_STREQ(v, "kept") << "no table default: the caller's stays";
}

TEST(EnvGetters, WrongTypeIsRefused) {
  int64_t i = 0;
  bool b = false;
  const char *s = nullptr;
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_int(DT_ENV_DATA_DIR, &i));
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_bool(DT_ENV_NUM_THREADS, &b));
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_string(DT_ENV_DEBUG, &s));
  EXPECT_EQ(DT_ERR_INVALID_ARG, dt_env_check(DT_ENV_COUNT));
}

TEST(EnvAccepted, Texts) {
  char buf[128];
  EXPECT_STREQ(dt_env_accepted(DT_ENV_NUM_THREADS, buf, sizeof buf), "an integer in 1..4096");
  EXPECT_STREQ(dt_env_accepted(DT_ENV_COMM_BACKEND, buf, sizeof buf), "one of auto, mpi, nccl");
  EXPECT_STREQ(dt_env_default_text(DT_ENV_COMM_BACKEND), "auto");
  EXPECT_STREQ(dt_env_default_text(DT_ENV_CPU_MEMORY_LIMIT),
               "what the process may use, less headroom");
}

}  // namespace
