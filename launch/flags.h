/* A small command-line flag parser for the dtrain subcommands.
 *
 * Flags are `--name value` or `--name=value`; switches (DT_FLAG_BOOL) take
 * no value (`--nesterov`) or an explicit `--nesterov=true|false`. Each flag
 * is typed and validated: a number below its minimum or a string outside
 * its choices is rejected with a message naming the flag and the value.
 * `--help` / `-h` anywhere asks for the usage text.
 */
#ifndef DT_LAUNCH_FLAGS_H
#define DT_LAUNCH_FLAGS_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_flag_type {
  DT_FLAG_INT = 0, /* value: int*, at least `min` */
  DT_FLAG_U64,     /* value: uint64_t* */
  DT_FLAG_FLOAT,   /* value: float*, finite, at least `min` */
  DT_FLAG_STRING,  /* value: const char** (points into argv); `choices` optional */
  DT_FLAG_BOOL,    /* value: int* (0/1) */
} dt_flag_type;

typedef struct dt_flag {
  const char *name; /* without the leading "--" */
  dt_flag_type type;
  void *value;         /* holds the default on entry, the parsed value on return */
  const char *metavar; /* "N", "LR" (shown in the usage) */
  const char *help;
  double min;          /* INT/FLOAT: smallest accepted value */
  const char *choices; /* STRING: "sgd|adamw", or NULL for any non-empty string */
} dt_flag;

typedef enum dt_flags_result {
  DT_FLAGS_OK = 0,
  DT_FLAGS_HELP = 1,  /* --help was given: print the usage, exit 0 */
  DT_FLAGS_ERROR = 2, /* the message has been printed to `err`: exit 2 */
} dt_flags_result;

/* Parses argv[0..argc) (the arguments after the subcommand) into `flags`.
 * `command` ("train") names the subcommand in messages. Positional
 * arguments are errors. */
dt_flags_result dt_flags_parse(const char *command, dt_flag *flags, int nflags, int argc,
                               char **argv, FILE *err);

/* Prints every flag with its metavar, help text and current value (the
 * default when called before parsing). */
void dt_flags_print(const dt_flag *flags, int nflags, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
