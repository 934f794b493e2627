/* `dtrain tokenize --in FILE|DIR... --out DIR [--val-fraction F] [--brown]`
 *
 * Its flags are parsed here, minimally: --in takes several values, which
 * launch/flags.h's parser does not offer (a repeatable LIST flag takes one
 * value per occurrence). DT_DATA_DIR comes from the environment table. */
#include "launch/tokenize.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/env.h"
#include "core/text.h"

#define MAX_INPUTS 4096

static void print_usage(FILE *out) {
  fprintf(out,
          "usage: dtrain tokenize --in FILE|DIR... --out DIR [--val-fraction F] [--brown]\n"
          "       dtrain tokenize --brown\n\n"
          "Tokenizes text with GPT-2's BPE into token shards in llm.c's format: DIR/train.bin\n"
          "and DIR/val.bin (a 256-int32 header, magic 20240520, then uint16 tokens). Every\n"
          "file is one document, preceded by <|endoftext|>. Files go to validation by\n"
          "position, every 1/F-th (F = 0.1: the 10th, 20th, ...); a single file is split by\n"
          "tokens (its last fraction F). A folder stands for its files, by name; a folder of\n"
          "Brown corpus files (ca01 ... cr09) is detagged into readable text.\n\n"
          "flags:\n"
          "  --in FILE|DIR...    text files and folders, in order\n"
          "  --out DIR           where train.bin and val.bin go (created if missing)\n"
          "  --val-fraction F    share of files for validation, in [0, 1) (default 0.1)\n"
          "  --brown             read every input as the tagged Brown corpus; alone: tokenize\n"
          "                      DATA/brown/raw into DATA/brown/{train,val}.bin if missing\n"
          "  --vocab DIR         GPT-2's encoder.json and vocab.bpe (default DATA/gpt2)\n"
          "  --data-dir DATA     the data folder (default: env DT_DATA_DIR, else data)\n");
}

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* "--name=value" or "--name value": the value, advancing *i; NULL when the
 * flag is not `name`. *missing is set when the value is absent. */
static const char *flag_value(const char *name, int argc, char **argv, int *i, int *missing) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0)
    return NULL;
  if (a[n] == '=')
    return a + n + 1;
  if (a[n] != '\0')
    return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

static int bad_usage(const char *fmt, const char *arg) {
  fprintf(stderr, "dtrain tokenize: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see dtrain tokenize --help)\n");
  return 2;
}

static int make_dir(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0)
    return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
  return mkdir(path, 0777) == 0 ? 0 : errno;
}

/* `--brown` alone: the default Brown shards (dt_brown_shards_ensure). */
static int brown_default(const char *data_dir) {
  double t0 = seconds_now();
  if (dt_brown_shards_ensure(data_dir) != DT_OK) {
    fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
    return 1;
  }
  printf("tokenize: %s/brown/train.bin and val.bin are ready (%.2f s)\n", data_dir,
         seconds_now() - t0);
  return 0;
}

int dt_cli_tokenize(int argc, char **argv) {
  const char *inputs[MAX_INPUTS];
  int num_inputs = 0;
  const char *out_dir = NULL, *vocab_dir = NULL;
  const char *data_dir = "data";
  if (dt_env_string(DT_ENV_DATA_DIR, &data_dir) != DT_OK) {
    fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
    return 1;
  }
  dt_corpus_config cfg = DT_CORPUS_CONFIG_DEFAULT;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v;
    int missing = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      print_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--in") || !strncmp(a, "--in=", 5)) {
      int before = num_inputs;
      if (a[4] == '=' && a[5] != '\0')
        inputs[num_inputs++] = a + 5;
      while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
        if (num_inputs == MAX_INPUTS)
          return bad_usage("more than %s inputs: pass folders instead", "4096");
        inputs[num_inputs++] = argv[++i];
      }
      if (num_inputs == before)
        return bad_usage("%s needs at least one file or folder", a);
    } else if ((v = flag_value("--out", argc, argv, &i, &missing)) != NULL) {
      out_dir = v;
    } else if ((v = flag_value("--vocab", argc, argv, &i, &missing)) != NULL) {
      vocab_dir = v;
    } else if ((v = flag_value("--data-dir", argc, argv, &i, &missing)) != NULL) {
      data_dir = v;
    } else if ((v = flag_value("--val-fraction", argc, argv, &i, &missing)) != NULL) {
      char *end;
      errno = 0;
      cfg.val_fraction = strtod(v, &end);
      if (errno || end == v || *end || !(cfg.val_fraction >= 0 && cfg.val_fraction < 1))
        return bad_usage("invalid value '%s' for --val-fraction: expected a number in [0, 1)", v);
    } else if (!strcmp(a, "--brown")) {
      cfg.brown = 1;
    } else if (missing) {
      return bad_usage("%s needs a value", a);
    } else {
      return bad_usage("unknown argument '%s'", a);
    }
  }
  if (num_inputs == 0 && !out_dir && cfg.brown)
    return brown_default(data_dir);
  if (num_inputs == 0)
    return bad_usage("%s: give --in FILE|DIR... (or --brown alone for the Brown corpus)",
                     "no input");
  if (!out_dir)
    return bad_usage("%s: give --out DIR", "no output folder");

  char vocab_buf[4096];
  if (!vocab_dir) {
    snprintf(vocab_buf, sizeof vocab_buf, "%s/gpt2", data_dir);
    vocab_dir = vocab_buf;
  }
  dt_bpe *bpe = NULL;
  dt_tokens train = {0}, val = {0};
  dt_corpus_stats stats;
  char train_path[4096], val_path[4096];
  int rc = 1, err;
  double t0, t1;
  if (dt_bpe_load_dir(vocab_dir, NULL, &bpe) != DT_OK)
    goto fail;
  t0 = seconds_now();
  if (dt_corpus_tokenize(bpe, inputs, num_inputs, &cfg, &train, &val, &stats) != DT_OK)
    goto fail;
  t1 = seconds_now();
  if ((err = make_dir(out_dir)) != 0) {
    DT_ERROR(DT_ERR_IO, "cannot create the output folder %s: %s", out_dir, strerror(err));
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
  if (rc != 0)
    fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
  dt_tokens_free(&train);
  dt_tokens_free(&val);
  dt_bpe_destroy(bpe);
  return rc;
}
