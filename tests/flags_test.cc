// The command-line flag parser (launch/flags.h): every type, the messages
// for bad values, and a help generated from the same table that lists
// exactly what the parser accepts.
#include "launch/flags.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Runs the parser over `args` and keeps what it printed.
struct Parsed {
  dt_flags_result result;
  int command_rc;  // as_command: what dt_flags_parse_command returned
  std::string err;
  dt_flags_args args;
};

// as_command: through dt_flags_parse_command (result is left unset).
Parsed Parse(const dt_flag_set &set, std::vector<std::string> args, bool as_command = false) {
  // The targets and p.args point into argv: keep every argv for good
  // (deque: elements never move).
  static std::deque<std::vector<std::string>> kept_strings;
  static std::deque<std::vector<char *>> kept_argv;
  kept_strings.push_back(args);
  kept_argv.emplace_back();
  std::vector<char *> &argv = kept_argv.back();
  for (std::string &a : kept_strings.back())
    argv.push_back(&a[0]);
  char *buf = nullptr;
  size_t len = 0;
  FILE *err = open_memstream(&buf, &len);
  Parsed p;
  p.args = {nullptr, 0, nullptr, 0};
  if (as_command)
    p.command_rc = dt_flags_parse_command(&set, (int)argv.size(), argv.data(), err, &p.args);
  else
    p.result = dt_flags_parse(&set, (int)argv.size(), argv.data(), err, &p.args);
  std::fclose(err);
  p.err.assign(buf, len);
  std::free(buf);
  return p;
}

std::string Help(const dt_flag_set &set) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  dt_flags_print_help(&set, out);
  std::fclose(out);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

// One flag of every type, with defaults.
struct Table {
  int n = 1, threads = 0;
  uint64_t seed = 0;
  float lr = 0.5f, gamma = 0.1f;
  double timeout = 300;
  const char *name = "x", *mode = "ddp", *dev = nullptr;
  bool fast = false;
  dt_flag_list extra = {{nullptr}, 0};
  std::vector<dt_flag> flags;
  dt_flag_set set;

  static bool CheckDev(const char *v, char *why, size_t cap) {
    if (std::string(v).rfind("cpu", 0) == 0)
      return true;
    std::snprintf(why, cap, "expected cpu or cpu:N");
    return false;
  }

  explicit Table(bool dashdash = false) {
    flags = {
        {"np", "-n", DT_FLAG_INT, &n, "N", "ranks", 1, 0, false, nullptr, nullptr, nullptr},
        {"threads", nullptr, DT_FLAG_INT, &threads, "N", "threads", 0, 64, false, nullptr, nullptr,
         "all cores"},
        {"seed", nullptr, DT_FLAG_U64, &seed, "N", "seed", 0, 0, false, nullptr, nullptr, nullptr},
        {"lr", nullptr, DT_FLAG_FLOAT, &lr, "LR", "rate", 0, 0, false, nullptr, nullptr, nullptr},
        {"gamma", nullptr, DT_FLAG_FLOAT, &gamma, "G", "factor", 0, 0, true, nullptr, nullptr,
         nullptr},
        {"timeout", nullptr, DT_FLAG_DOUBLE, &timeout, "S", "seconds", 0, 0, true, nullptr, nullptr,
         nullptr},
        {"name", nullptr, DT_FLAG_STRING, &name, "NAME", "a name", 0, 0, false, nullptr, nullptr,
         nullptr},
        {"mode", nullptr, DT_FLAG_CHOICE, &mode, "MODE", "the mode", 0, 0, false, "ddp|dp", nullptr,
         nullptr},
        {"device", nullptr, DT_FLAG_STRING, &dev, "DEV", "a device", 0, 0, false, nullptr, CheckDev,
         nullptr},
        {"fast", nullptr, DT_FLAG_BOOL, &fast, nullptr, "go fast", 0, 0, false, nullptr, nullptr,
         nullptr},
        {"extra", nullptr, DT_FLAG_LIST, &extra, "ARG", "extra args", 0, 0, false, nullptr, nullptr,
         nullptr},
    };
    set = dt_flag_set{"demo",
                      "demo [flags]",
                      "Does a demo.",
                      "example: dtrain demo",
                      flags.data(),
                      (int)flags.size(),
                      0,
                      dashdash,
                      "put the command after --"};
  }
};

TEST(Flags, EveryTypeParses) {
  Table t;
  Parsed p = Parse(t.set, {"-n", "4", "--threads=8", "--seed", "7", "--lr", "0.25", "--gamma=2",
                           "--timeout", "1.5", "--name", "abc", "--mode=dp", "--device", "cpu:1",
                           "--fast", "--extra", "a", "--extra=b"});
  ASSERT_EQ(p.result, DT_FLAGS_OK) << p.err;
  EXPECT_EQ(t.n, 4);
  EXPECT_EQ(t.threads, 8);
  EXPECT_EQ(t.seed, 7u);
  EXPECT_FLOAT_EQ(t.lr, 0.25f);
  EXPECT_FLOAT_EQ(t.gamma, 2.0f);
  EXPECT_DOUBLE_EQ(t.timeout, 1.5);
  EXPECT_STREQ(t.name, "abc");
  EXPECT_STREQ(t.mode, "dp");
  EXPECT_STREQ(t.dev, "cpu:1");
  EXPECT_TRUE(t.fast);
  ASSERT_EQ(t.extra.n, 2);
  EXPECT_STREQ(t.extra.items[0], "a");
  EXPECT_STREQ(t.extra.items[1], "b");
  EXPECT_EQ(Parse(t.set, {"--fast=false", "--np=2"}).result, DT_FLAGS_OK);
  EXPECT_FALSE(t.fast);
  EXPECT_EQ(t.n, 2);
}

TEST(Flags, BadValuesNameTheFlagAndWhatIsAccepted) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"-n", "0"}, "dtrain demo: invalid value '0' for -n: expected a positive integer\n"},
      {{"--np", "x"}, "invalid value 'x' for --np: expected a positive integer"},
      {{"--threads", "65"}, "invalid value '65' for --threads: expected an integer in 0..64"},
      {{"--threads", "99999999999"}, "expected an integer in 0..64"},
      {{"--seed", "-1"}, "invalid value '-1' for --seed: expected a non-negative integer"},
      {{"--lr", "-0.1"}, "invalid value '-0.1' for --lr: expected a non-negative number"},
      {{"--lr", "inf"}, "invalid value 'inf' for --lr"},
      {{"--lr", "1e39"}, "invalid value '1e39' for --lr"},  // beyond float
      {{"--gamma", "0"}, "invalid value '0' for --gamma: expected a number > 0"},
      // Issue 32: hexadecimal is not a decimal number (strtod reads 0x10 as 16).
      {{"--lr", "0x10"}, "invalid value '0x10' for --lr: expected a non-negative number"},
      {{"--timeout", "0X1p3"}, "invalid value '0X1p3' for --timeout: expected a number > 0"},
      // Issue 32: a number beyond the type names the range, not "an integer" alone.
      {{"-n", "2147483648"},
       "invalid value '2147483648' for -n: expected a positive integer of at most 2147483647"},
      {{"--np", "18446744073709551615"}, "expected a positive integer of at most 2147483647"},
      {{"--seed", "18446744073709551616"},
       "invalid value '18446744073709551616' for --seed: expected a non-negative integer of at "
       "most 18446744073709551615"},
      {{"--timeout", "nan"}, "invalid value 'nan' for --timeout"},
      {{"--name", ""}, "invalid value '' for --name: expected a non-empty value"},
      {{"--mode", "zero"}, "invalid value 'zero' for --mode: expected one of ddp, dp"},
      {{"--device", "tpu"}, "invalid value 'tpu' for --device: expected cpu or cpu:N"},
      {{"--fast=maybe"}, "invalid value 'maybe' for --fast: expected true or false"},
      {{"--nope"}, "dtrain demo: unknown flag --nope (see dtrain demo --help)"},
      {{"--nope=3"}, "unknown flag --nope (see"},
      {{"-x"}, "unknown flag -x"},
      {{"--lr"}, "dtrain demo: flag --lr needs a value (see dtrain demo --help)"},
      {{"stray"}, "unexpected argument 'stray': put the command after -- (see dtrain demo --help)"},
  };
  for (const Case &c : cases) {
    Table t;
    Parsed p = Parse(t.set, c.args);
    EXPECT_EQ(p.result, DT_FLAGS_ERROR) << c.args[0];
    EXPECT_NE(p.err.find(c.message), std::string::npos) << p.err;
  }
}

TEST(Flags, HelpWinsAndStopsAtDashDash) {
  Table t(true);
  EXPECT_EQ(Parse(t.set, {"--nope", "--help"}).result, DT_FLAGS_HELP);
  EXPECT_EQ(Parse(t.set, {"-h"}).result, DT_FLAGS_HELP);
  Parsed p = Parse(t.set, {"-n", "2", "--", "train", "--help"});
  ASSERT_EQ(p.result, DT_FLAGS_OK) << p.err;
  ASSERT_EQ(p.args.nrest, 2);
  EXPECT_STREQ(p.args.rest[0], "train");
  EXPECT_STREQ(p.args.rest[1], "--help");
}

// The row macros fill the same fields as a row written out.
TEST(Flags, RowMacrosFillTheRow) {
  int n = 0;
  const char *mode = "ddp";
  bool fast = false;
  dt_flag rows[] = {
      DT_INT_FLAG("np", &n, "N", "ranks", .min = 1, .max = 8),
      DT_CHOICE_FLAG("mode", &mode, "MODE", "the mode", "ddp|dp", .per_rank = true),
      DT_BOOL_FLAG("fast", &fast, "go fast"),
  };
  EXPECT_STREQ(rows[0].name, "np");
  EXPECT_EQ(rows[0].type, DT_FLAG_INT);
  EXPECT_EQ(rows[0].target, &n);
  EXPECT_STREQ(rows[0].metavar, "N");
  EXPECT_STREQ(rows[0].help, "ranks");
  EXPECT_EQ(rows[0].min, 1);
  EXPECT_EQ(rows[0].max, 8);
  EXPECT_EQ(rows[1].type, DT_FLAG_CHOICE);
  EXPECT_EQ(rows[1].target, &mode);
  EXPECT_STREQ(rows[1].choices, "ddp|dp");
  EXPECT_TRUE(rows[1].per_rank);
  EXPECT_EQ(rows[2].type, DT_FLAG_BOOL);
  EXPECT_EQ(rows[2].target, &fast);
  EXPECT_EQ(rows[2].metavar, nullptr);
  EXPECT_FALSE(rows[2].per_rank);
}

// A subcommand's view: go on, exit 0 after the help, exit 2 after a bad
// command line (its message on err).
TEST(Flags, ParseCommandGivesTheExitStatus) {
  Table t;
  Parsed p = Parse(t.set, {"-n", "3"}, true);
  EXPECT_EQ(p.command_rc, DT_FLAGS_RUN) << p.err;
  EXPECT_EQ(t.n, 3);
  p = Parse(t.set, {"-n", "0"}, true);
  EXPECT_EQ(p.command_rc, 2);
  EXPECT_NE(p.err.find("invalid value '0' for -n"), std::string::npos) << p.err;
  p = Parse(t.set, {"--nope", "--help"}, true);
  EXPECT_EQ(p.command_rc, 0);
  EXPECT_EQ(p.err, "");
}

TEST(Flags, PositionalArguments) {
  dt_flag_set set = {"help", "help [COMMAND]", nullptr, nullptr, nullptr, 0, 1, false, nullptr};
  Parsed p = Parse(set, {"train"});
  ASSERT_EQ(p.result, DT_FLAGS_OK);
  ASSERT_EQ(p.args.nargs, 1);
  EXPECT_STREQ(p.args.args[0], "train");
  p = Parse(set, {"train", "bench"});
  EXPECT_EQ(p.result, DT_FLAGS_ERROR);
  EXPECT_NE(p.err.find("dtrain help: unexpected argument 'bench'"), std::string::npos) << p.err;
  EXPECT_EQ(Parse(set, {"--help"}).result, DT_FLAGS_HELP);
}

// The help lists every flag of the table with its accepted values and
// default, and every flag it lists is one the parser accepts.
TEST(Flags, HelpComesFromTheTable) {
  Table t;
  std::string help = Help(t.set);
  EXPECT_EQ(help.rfind("usage: dtrain demo [flags]\n\nDoes a demo.\n\nflags:\n", 0), 0u) << help;
  EXPECT_NE(help.find("-n, --np N"), std::string::npos) << help;
  EXPECT_NE(help.find("the mode; one of ddp, dp (default: ddp)"), std::string::npos) << help;
  EXPECT_NE(help.find("threads; 0..64 (default: all cores)"), std::string::npos) << help;
  EXPECT_NE(help.find("--fast "), std::string::npos) << help;
  EXPECT_NE(help.find("(default: off)"), std::string::npos) << help;
  EXPECT_NE(help.find("-h, --help"), std::string::npos) << help;
  EXPECT_NE(help.find("example: dtrain demo"), std::string::npos) << help;
  std::istringstream lines(help);
  std::string line;
  int listed = 0;
  while (std::getline(lines, line)) {
    size_t dash = line.find("--");
    if (line.rfind("  -", 0) != 0 || dash == std::string::npos)
      continue;
    std::string name = line.substr(dash, line.find(' ', dash) - dash);
    if (name == "--help")
      continue;
    listed++;
    Table fresh;
    Parsed p = Parse(fresh.set, {name + "=__bad__"});
    EXPECT_EQ(p.err.find("unknown flag"), std::string::npos) << name << ": " << p.err;
  }
  EXPECT_EQ(listed, (int)t.flags.size());
}

// A multi list takes every argument up to the next flag, over several
// occurrences; a range can exclude its upper end.
TEST(Flags, MultiValueListAndHalfOpenRange) {
  dt_flag_list in = {{nullptr}, 0};
  const char *out = nullptr;
  double fraction = 0.1;
  dt_flag rows[] = {
      DT_LIST_FLAG("in", &in, "FILE...", "inputs", .multi = true),
      DT_STRING_FLAG("out", &out, "DIR", "output"),
      DT_DOUBLE_FLAG("fraction", &fraction, "F", "a share", .max = 1, .max_exclusive = true),
  };
  dt_flag_set set = {"demo", "demo [flags]", nullptr, nullptr, rows, 3, 0, false, nullptr};
  std::string help = Help(set);
  EXPECT_NE(help.find("inputs; one or more"), std::string::npos) << help;
  EXPECT_NE(help.find("a share; [0, 1) (default: 0.1)"), std::string::npos) << help;
  Parsed p = Parse(set, {"--in", "a", "b", "--out", "o", "--in=c", "d", "--fraction", "0.5"});
  ASSERT_EQ(p.result, DT_FLAGS_OK) << p.err;
  ASSERT_EQ(in.n, 4);
  EXPECT_STREQ(in.items[0], "a");
  EXPECT_STREQ(in.items[1], "b");
  EXPECT_STREQ(in.items[2], "c");
  EXPECT_STREQ(in.items[3], "d");
  EXPECT_STREQ(out, "o");
  EXPECT_DOUBLE_EQ(fraction, 0.5);
  EXPECT_EQ(Parse(set, {"--fraction", "0"}).result, DT_FLAGS_OK);
  p = Parse(set, {"--in", "--out", "o"});
  EXPECT_EQ(p.result, DT_FLAGS_ERROR);
  EXPECT_NE(p.err.find("dtrain demo: flag --in needs at least one value (see dtrain demo --help)"),
            std::string::npos)
      << p.err;
  p = Parse(set, {"--fraction", "1"});
  EXPECT_EQ(p.result, DT_FLAGS_ERROR);
  EXPECT_NE(p.err.find("invalid value '1' for --fraction: expected a number in [0, 1)"),
            std::string::npos)
      << p.err;
}

TEST(Flags, Choices) {
  char buf[64];
  EXPECT_STREQ(dt_flags_format_choices("sgd|adamw", buf, sizeof buf), "sgd, adamw");
  EXPECT_TRUE(dt_flags_is_choice("dp", "ddp|dp"));
  EXPECT_FALSE(dt_flags_is_choice("d", "ddp|dp"));
  EXPECT_FALSE(dt_flags_is_choice("", "ddp|dp"));
}

}  // namespace
