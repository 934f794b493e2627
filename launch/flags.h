/* The command-line flag parser of every dtrain subcommand.
 *
 * A subcommand describes its flags once, in a table (dt_flag: name, type,
 * target, accepted values, help), and its usage text around them
 * (dt_flag_set). dt_flags_parse reads argv against the table and
 * dt_flags_print_help writes `--help` from the same table, so the help
 * always says what the parser accepts and the defaults it would use.
 *
 * Flags are `--name value` or `--name=value` (an alias such as `-n` takes
 * `-n value`); switches (DT_FLAG_BOOL) take no value (`--nesterov`) or an
 * explicit `--nesterov=true|false`; a list flag marked `multi` takes every
 * argument up to the next flag (`--in a.txt b.txt`). Every value is checked against its
 * type, range, choices or check function; a bad one is reported as
 *   dtrain train: invalid value 'resnet18' for --model: expected one of lenet, mlp
 * (exit status 2). `--help` / `-h` before any `--` asks for the help.
 */
#ifndef DT_LAUNCH_FLAGS_H
#define DT_LAUNCH_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_flag_type {
  DT_FLAG_INT = 0, /* target: int*, in [min, max] */
  DT_FLAG_U64,     /* target: uint64_t*, no sign */
  DT_FLAG_FLOAT,   /* target: float*, finite, in [min, max] (or > min: min_exclusive) */
  DT_FLAG_DOUBLE,  /* target: double*, as FLOAT */
  DT_FLAG_STRING,  /* target: const char** (into argv), non-empty; `check` optional */
  DT_FLAG_CHOICE,  /* target: const char** (into argv), one of `choices` */
  DT_FLAG_BOOL,    /* target: bool* */
  DT_FLAG_LIST,    /* target: dt_flag_list*; repeatable, each value appended */
} dt_flag_type;

/* Values a list flag holds, all its occurrences together (a `multi` list
 * takes the files a shell glob expands to). */
#define DT_FLAG_LIST_MAX 4096
typedef struct dt_flag_list {
  const char *items[DT_FLAG_LIST_MAX];
  int n;
} dt_flag_list;

/* Further validation of a STRING value: false with `why` filled in
 * ("expected cpu, cpu:N, cuda or cuda:N") to refuse it. */
typedef bool (*dt_flag_check_fn)(const char *value, char *why, size_t cap);

typedef struct dt_flag {
  const char *name;  /* "batch" for --batch */
  const char *alias; /* "-n", or NULL */
  dt_flag_type type;
  void *target;        /* holds the default on entry, the parsed value on return */
  const char *metavar; /* "N", "LR" (shown in the help); not for BOOL */
  const char *help;
  double min, max;     /* INT/FLOAT/DOUBLE: accepted range; max 0 = no upper bound */
  bool min_exclusive;  /* FLOAT/DOUBLE: the value must be > min */
  const char *choices; /* CHOICE: "sgd|adamw" */
  dt_flag_check_fn check;
  const char *default_text; /* shown as the default instead of the target's value */
  bool per_rank;      /* may differ between the ranks of a job (device, threads, paths, logging):
                         left out of dt_flags_format_values */
  bool max_exclusive; /* FLOAT/DOUBLE: the value must be < max (a fraction in [0, 1)) */
  bool multi;         /* LIST: one occurrence takes every following argument up to the next one that
                         starts with '-' (`--in a b c`), and at least one */
  /* The library configuration field it sets (train/train_config.h), when
   * that is not its name with '-' as '_' ("min-lr" sets min_lr). */
  const char *field;
} dt_flag;

/* Table rows, one macro per type: name, target, metavar and help, then any
 * other field as a designated initializer:
 *   DT_INT_FLAG("batch", &cfg.batch, "N", "micro-batch size", .min = 1),
 *   DT_BOOL_FLAG("nesterov", &nesterov, "SGD with Nesterov momentum"),
 * The target's type is the flag's (int* for INT, const char** for STRING
 * and CHOICE, ...): a row pointing at the wrong type does not compile. */
#define DT_FLAG_ROW_(type_, ctype_, name_, target_, ...) \
  { .name = (name_), .type = (type_), .target = (ctype_ *){(target_)}, __VA_ARGS__ }
#define DT_VALUE_FLAG_(type_, ctype_, name_, target_, metavar_, help_, ...) \
  DT_FLAG_ROW_(type_, ctype_, name_, target_, .metavar = (metavar_), .help = (help_), __VA_ARGS__)
#define DT_INT_FLAG(...) DT_VALUE_FLAG_(DT_FLAG_INT, int, __VA_ARGS__)
#define DT_U64_FLAG(...) DT_VALUE_FLAG_(DT_FLAG_U64, uint64_t, __VA_ARGS__)
#define DT_FLOAT_FLAG(...) DT_VALUE_FLAG_(DT_FLAG_FLOAT, float, __VA_ARGS__)
#define DT_DOUBLE_FLAG(...) DT_VALUE_FLAG_(DT_FLAG_DOUBLE, double, __VA_ARGS__)
#define DT_STRING_FLAG(...) DT_VALUE_FLAG_(DT_FLAG_STRING, const char *, __VA_ARGS__)
#define DT_LIST_FLAG(...) DT_VALUE_FLAG_(DT_FLAG_LIST, dt_flag_list, __VA_ARGS__)
/* DT_CHOICE_FLAG(name, target, metavar, help, choices, ...) */
#define DT_CHOICE_FLAG(name_, target_, metavar_, help_, choices_, ...)          \
  DT_VALUE_FLAG_(DT_FLAG_CHOICE, const char *, name_, target_, metavar_, help_, \
                 .choices = (choices_), __VA_ARGS__)
/* DT_BOOL_FLAG(name, target, help, ...): a switch has no metavar. */
#define DT_BOOL_FLAG(name_, target_, help_, ...) \
  DT_FLAG_ROW_(DT_FLAG_BOOL, bool, name_, target_, .help = (help_), __VA_ARGS__)

/* In a dt_flag_set initializer: `.flags` and `.nflags` from an array. */
#define DT_FLAG_TABLE(array_) \
  .flags = (array_), .nflags = (int)(sizeof(array_) / sizeof((array_)[0]))

typedef struct dt_flag_set {
  const char *command;  /* "train": messages start "dtrain train: " */
  const char *usage;    /* after "usage: dtrain ": "train [flags]" */
  const char *about;    /* what the command does (help, after the usage line) */
  const char *epilogue; /* after the flags (examples); NULL = none */
  dt_flag *flags;
  int nflags;
  int max_args;                /* positional arguments accepted (help: 1) */
  bool command_after_dashdash; /* `--` ends the flags and a command follows (launch) */
  const char *args_hint;       /* appended to "unexpected argument 'x'" */
} dt_flag_set;

typedef enum dt_flags_result {
  DT_FLAGS_OK = 0,
  DT_FLAGS_HELP = 1,  /* --help was given: print the help, exit 0 */
  DT_FLAGS_ERROR = 2, /* the message has been printed to `err`: exit 2 */
} dt_flags_result;

typedef struct dt_flags_args {
  char **args; /* positional arguments (at most set->max_args) */
  int nargs;
  char **rest; /* command_after_dashdash: what follows `--` (NULL when absent) */
  int nrest;
} dt_flags_args;

/* `msg` with every configuration field named between backquotes
 * ("`min_lr`", train/train_config.h) written as the set's flag that sets
 * it ("--min-lr"); a field no flag sets loses its backquotes. Into out
 * (always terminated). */
void dt_flags_name_fields(const dt_flag_set *set, const char *msg, char *out, size_t cap);

/* Parses argv[0..argc) (the arguments after the subcommand) into the
 * targets of set->flags. `out` (may be NULL when the set takes no
 * positional arguments) receives the positional arguments. */
dt_flags_result dt_flags_parse(const dt_flag_set *set, int argc, char **argv, FILE *err,
                               dt_flags_args *out);

/* What a subcommand does with its command line: dt_flags_parse, and on
 * --help the help printed to stdout. Returns DT_FLAGS_RUN when the command
 * should go on, else its exit status: 0 after the help, 2 after a bad
 * command line (the message is on `err`). */
#define DT_FLAGS_RUN (-1)
int dt_flags_parse_command(const dt_flag_set *set, int argc, char **argv, FILE *err,
                           dt_flags_args *out);
/* dt_flags_parse_command in a subcommand returning its exit status:
 * returns from the caller unless the command should go on. */
#define DT_FLAGS_PARSE_OR_RETURN(set, argc, argv, err, out)                         \
  do {                                                                              \
    int dt_flags_rc_ = dt_flags_parse_command((set), (argc), (argv), (err), (out)); \
    if (dt_flags_rc_ != DT_FLAGS_RUN)                                               \
      return dt_flags_rc_;                                                          \
  } while (0)

/* The help: usage, about, every flag with its metavar, help, accepted
 * values and default (the target's current value, so call it before
 * parsing or after a --help), then the epilogue. */
void dt_flags_print_help(const dt_flag_set *set, FILE *out);

/* The resolved value of every flag that is not per_rank, one line each,
 * "--name value\n" in table order, numbers exact (floats round-trip): what
 * the ranks of a job compare at start. Returns the length; a value that
 * does not fit in buf is cut (buf stays NUL-terminated). */
size_t dt_flags_format_values(const dt_flag_set *set, char *buf, size_t cap);

/* "a|b|c" -> "a, b, c" into buf. */
const char *dt_flags_format_choices(const char *choices, char *buf, size_t cap);

/* Whether `value` is one of "a|b|c". */
bool dt_flags_is_choice(const char *value, const char *choices);

#ifdef __cplusplus
}
#endif
#endif
