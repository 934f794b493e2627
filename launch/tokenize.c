/* `dtrain tokenize --in FILE|DIR... --out DIR [--val-fraction F] [--brown]`
 *
 * Its flags are a table for launch/flags.h's parser (--in a list that takes
 * several values). DT_DATA_DIR comes from the environment table. */
#include "launch/tokenize.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/env.h"
#include "core/text.h"
#include "launch/cli.h"
#include "launch/flags.h"

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A command line the flags accept but the command cannot run: exit 2. */
static int bad_usage(FILE *err, const char *what) {
  fprintf(err, "dtrain tokenize: %s (see dtrain tokenize --help)\n", what);
  return 2;
}

static int make_dir(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0)
    return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
  return mkdir(path, 0777) == 0 ? 0 : errno;
}

/* `--brown` alone: the default Brown shards (dt_brown_shards_ensure). */
static int brown_default(const char *data_dir, FILE *err) {
  double t0 = seconds_now();
  if (dt_brown_shards_ensure(data_dir) != DT_OK) {
    dt_cli_print_error(err, NULL);
    return 1;
  }
  printf("tokenize: %s/brown/train.bin and val.bin are ready (%.2f s)\n", data_dir,
         seconds_now() - t0);
  return 0;
}

int dt_cli_tokenize(int argc, char **argv, FILE *err) {
  dt_flag_list inputs = {{NULL}, 0};
  const char *out_dir = NULL, *vocab_dir = NULL;
  const char *data_dir = "data";
  if (dt_env_string(DT_ENV_DATA_DIR, &data_dir) != DT_OK) {
    dt_cli_print_error(err, NULL);
    return 1;
  }
  dt_corpus_config cfg = DT_CORPUS_CONFIG_DEFAULT;
  bool brown = cfg.brown != 0;
  dt_flag flags[] = {
      DT_LIST_FLAG("in", &inputs, "FILE|DIR...", "text files and folders, in order", .multi = true),
      DT_STRING_FLAG("out", &out_dir, "DIR", "where train.bin and val.bin go (created if missing)"),
      DT_DOUBLE_FLAG("val-fraction", &cfg.val_fraction, "F", "share of files for validation",
                     .min = 0, .max = 1, .max_exclusive = true),
      DT_BOOL_FLAG("brown", &brown,
                   "read every input as the tagged Brown corpus; alone: tokenize brown/raw of "
                   "--data-dir into brown/train.bin and val.bin if they are missing"),
      DT_STRING_FLAG("vocab", &vocab_dir, "DIR", "GPT-2's encoder.json and vocab.bpe",
                     .default_text = "gpt2 of --data-dir"),
      DT_INT_FLAG("pipe-limit-mb", &cfg.pipe_limit_mb, "MB",
                  "the most MiB one document may take from a pipe (--in /dev/stdin); more, or "
                  "a pipe that never ends, is an error",
                  .min = 1, .max = 1 << 20),
      dt_cli_flag_data_dir(&data_dir),
  };
  dt_flag_set set = {
      .command = "tokenize",
      .usage =
          "tokenize --in FILE|DIR... --out DIR [--val-fraction F] [--brown]\n"
          "       dtrain tokenize --brown",
      .about =
          "Tokenizes text with GPT-2's BPE into token shards in llm.c's format: DIR/train.bin\n"
          "and DIR/val.bin (a 256-int32 header, magic 20240520, then uint16 tokens). Every\n"
          "file is one document, preceded by <|endoftext|>. Files go to validation by\n"
          "position, every 1/F-th (F = 0.1: the 10th, 20th, ...); a single file is split by\n"
          "tokens (its last fraction F). A folder stands for its files, by name; a folder of\n"
          "Brown corpus files (ca01 ... cr09) is detagged into readable text. A pipe is read\n"
          "to its end: cmd | dtrain tokenize --in /dev/stdin ...; named FIFOs (give them as\n"
          "< FIFO with --in /dev/stdin), devices and sockets are refused.",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  cfg.brown = brown;
  int num_inputs = inputs.n;
  if (num_inputs == 0 && !out_dir && cfg.brown)
    return brown_default(data_dir, err);
  if (num_inputs == 0)
    return bad_usage(err,
                     "no input: give --in FILE|DIR... (or --brown alone for the Brown corpus)");
  if (!out_dir)
    return bad_usage(err, "no output folder: give --out DIR");

  char vocab_buf[4096];
  if (!vocab_dir) {
    snprintf(vocab_buf, sizeof vocab_buf, "%s/gpt2", data_dir);
    vocab_dir = vocab_buf;
  }
  dt_bpe *bpe = NULL;
  dt_tokens train = {0}, val = {0};
  dt_corpus_stats stats;
  char train_path[4096], val_path[4096];
  int rc = 1, mkdir_err;
  double t0, t1;
  if (dt_bpe_load_dir(vocab_dir, NULL, &bpe) != DT_OK)
    goto fail;
  t0 = seconds_now();
  if (dt_corpus_tokenize(bpe, inputs.items, num_inputs, &cfg, &train, &val, &stats) != DT_OK)
    goto fail;
  t1 = seconds_now();
  if ((mkdir_err = make_dir(out_dir)) != 0) {
    DT_ERROR(DT_ERR_IO, "cannot create the output folder %s: %s", out_dir, strerror(mkdir_err));
    goto fail;
  }
  snprintf(train_path, sizeof train_path, "%s/train.bin", out_dir);
  snprintf(val_path, sizeof val_path, "%s/val.bin", out_dir);
  if (dt_shard_write(train_path, train.data, train.len) != DT_OK ||
      (cfg.val_fraction > 0 && dt_shard_write(val_path, val.data, val.len) != DT_OK))
    goto fail;
  printf(
      "tokenize: %lld files (%lld train, %lld val), %.1f MB of text -> %lld train and %lld "
      "val tokens in %.2f s (%.0f tokens/s)\n",
      (long long)(stats.train_files + stats.val_files), (long long)stats.train_files,
      (long long)stats.val_files, (double)stats.text_bytes / 1e6, (long long)train.len,
      (long long)val.len, t1 - t0, (double)(train.len + val.len) / (t1 - t0 > 0 ? t1 - t0 : 1));
  printf("tokenize: wrote %s%s%s\n", train_path, cfg.val_fraction > 0 ? " and " : "",
         cfg.val_fraction > 0 ? val_path : "");
  rc = 0;
fail:
  if (rc != 0) {
    char msg[DT_ERROR_MAX];
    dt_flags_name_fields(&set, dt_last_error(), msg, sizeof msg);
    dt_error_replace_message(msg);
    dt_cli_print_error(err, NULL);
  }
  dt_tokens_free(&train);
  dt_tokens_free(&val);
  dt_bpe_destroy(bpe);
  return rc;
}
