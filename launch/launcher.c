#define _GNU_SOURCE
#include "launch/launcher.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/backend.h"

#define MAX_MPIRUN_ARGS 64
#define MAX_EXPORTS 64

extern char **environ;

static const char usage[] =
    "usage: dtrain launch [-n N] [--hosts H1,H2,... | --hostfile FILE] [--threads C]\n"
    "                     [--mpirun-arg ARG]... [--dry-run] -- <command> [flags]\n\n"
    "Runs N ranks of `dtrain <command>` (train or bench) under Open MPI's mpirun:\n"
    "  mpirun -np N --bind-to none --map-by slot -x OMP_NUM_THREADS=C -x DT_NUM_THREADS=C\n"
    "         [-x DT_DATA_DIR] [-x DT_COMM_BACKEND] [-x CUDA_VISIBLE_DEVICES] [-x NCCL_...]\n"
    "         [--oversubscribe] [--allow-run-as-root] <this dtrain> <command> [flags]\n"
    "C = max(1, cores / N) threads per rank, cores being the CPUs this process may use;\n"
    "--oversubscribe is added when N > cores, --allow-run-as-root when run as root;\n"
    "DT_DATA_DIR, DT_COMM_BACKEND, CUDA_VISIBLE_DEVICES and every NCCL_* variable are\n"
    "exported to the ranks when set here. The mpirun command line is printed to\n"
    "stderr before it runs.\n\n"
    "GPUs: without -n, on a machine with GPUs, N is the number of visible GPUs (one\n"
    "rank per GPU); give the command --device cuda and each rank takes the GPU of its\n"
    "local rank. Without GPUs (or with --hosts/--hostfile) -n is required.\n\n"
    "flags:\n"
    "  -n, --np N            ranks to start (default: one per visible GPU; required\n"
    "                        without GPUs)\n"
    "  --hosts H1,H2,...     hosts to run on (mpirun --host; H:SLOTS gives slots)\n"
    "  --hostfile FILE       an Open MPI hostfile (mpirun --hostfile; see launch/mpirun/)\n"
    "  --threads C           CPU threads per rank (default: cores / N)\n"
    "  --mpirun-arg ARG      pass ARG to mpirun (repeat for several)\n"
    "  --dry-run             print the mpirun command line and exit\n\n"
    "examples: dtrain launch -n 2 -- train --batch 32\n"
    "          dtrain launch -- train --device cuda --batch 64     (one rank per GPU)\n";

static int bad_usage(const char *fmt, const char *what) {
  fprintf(stderr, "dtrain launch: ");
  fprintf(stderr, fmt, what);
  fprintf(stderr, " (see dtrain launch --help)\n");
  return 2;
}

static int cores_available(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static int parse_positive(const char *text, int *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < 1 || v > INT_MAX)
    return 0;
  *out = (int)v;
  return 1;
}

/* mpirun's full path from PATH (or $DT_MPIRUN), or NULL. */
static const char *find_mpirun(char *buf, size_t cap) {
  const char *forced = getenv("DT_MPIRUN");
  if (forced && forced[0])
    return access(forced, X_OK) == 0 ? forced : NULL;
  const char *path = getenv("PATH");
  if (!path || !path[0])
    path = "/usr/local/bin:/usr/bin:/bin";
  const char *p = path;
  while (*p) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len > 0 && len + 8 < cap) {
      memcpy(buf, p, len);
      snprintf(buf + len, cap - len, "/mpirun");
      struct stat st;
      if (stat(buf, &st) == 0 && S_ISREG(st.st_mode) && access(buf, X_OK) == 0)
        return buf;
    }
    if (!end)
      break;
    p = end + 1;
  }
  return NULL;
}

/* 1 when the dtrain command line names a device (--device, --devices). */
static int names_device(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strncmp(argv[i], "--device", 8))
      return 1;
  return 0;
}

/* The variables the ranks need from this environment, for `-x NAME`:
 * DT_DATA_DIR, DT_COMM_BACKEND, CUDA_VISIBLE_DEVICES (even empty: it then
 * hides every GPU), and every NCCL_* (NCCL's transport settings). Names are
 * copied into `buf`; returns how many were found (at most `cap`). */
static int exported_names(const char **names, int cap, char *buf, size_t buf_cap) {
  static const char *const fixed[] = {"DT_DATA_DIR", "DT_COMM_BACKEND", "CUDA_VISIBLE_DEVICES"};
  int n = 0;
  size_t used = 0;
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && n < cap; i++) {
    const char *v = getenv(fixed[i]);
    if (v && (v[0] || !strcmp(fixed[i], "CUDA_VISIBLE_DEVICES")))
      names[n++] = fixed[i];
  }
  for (char **e = environ; e && *e && n < cap; e++) {
    const char *eq = strchr(*e, '=');
    if (strncmp(*e, "NCCL_", 5) != 0 || !eq)
      continue;
    size_t len = (size_t)(eq - *e);
    if (used + len + 1 > buf_cap)
      break;
    memcpy(buf + used, *e, len);
    buf[used + len] = '\0';
    names[n++] = buf + used;
    used += len + 1;
  }
  return n;
}

/* Prints one argument quoted for a POSIX shell when it needs it. */
static void print_shell_word(FILE *out, const char *s) {
  if (s[0] && strspn(s,
                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                     "-_=./:,@%+") == strlen(s)) {
    fputs(s, out);
    return;
  }
  fputc('\'', out);
  for (; *s; s++) {
    if (*s == '\'')
      fputs("'\\''", out);
    else
      fputc(*s, out);
  }
  fputc('\'', out);
}

int dt_cli_launch(int argc, char **argv) {
  int np = 0, threads = 0, dry_run = 0;
  const char *hosts = NULL, *hostfile = NULL;
  const char *extra[MAX_MPIRUN_ARGS];
  int n_extra = 0, sep = -1;

  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--")) {
      sep = i;
      break;
    }
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
  }
  int nflags = sep >= 0 ? sep : argc;
  for (int i = 0; i < nflags; i++) {
    const char *a = argv[i];
    const char *value = NULL;
    const char *name = a;
    char namebuf[32];
    const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    if (eq && (size_t)(eq - a) < sizeof namebuf) {
      memcpy(namebuf, a, (size_t)(eq - a));
      namebuf[eq - a] = '\0';
      name = namebuf;
      value = eq + 1;
    }
    int is_switch = !strcmp(name, "--dry-run");
    if (!is_switch && !value) {
      if (!strcmp(name, "-n") || !strcmp(name, "--np") || !strcmp(name, "--hosts") ||
          !strcmp(name, "--hostfile") || !strcmp(name, "--threads") ||
          !strcmp(name, "--mpirun-arg")) {
        if (i + 1 >= nflags)
          return bad_usage("flag %s needs a value", name);
        value = argv[++i];
      }
    }
    if (!strcmp(name, "-n") || !strcmp(name, "--np")) {
      if (!parse_positive(value, &np))
        return bad_usage("invalid value '%s' for -n: expected a positive integer", value);
    } else if (!strcmp(name, "--threads")) {
      if (!parse_positive(value, &threads))
        return bad_usage("invalid value '%s' for --threads: expected a positive integer", value);
    } else if (!strcmp(name, "--hosts")) {
      if (!value[0])
        return bad_usage("%s needs a host list, e.g. --hosts node1,node2", name);
      hosts = value;
    } else if (!strcmp(name, "--hostfile")) {
      if (access(value, R_OK) != 0)
        return bad_usage("cannot read the hostfile '%s'", value);
      hostfile = value;
    } else if (!strcmp(name, "--mpirun-arg")) {
      if (n_extra >= MAX_MPIRUN_ARGS)
        return bad_usage("too many --mpirun-arg flags (at most %s)", "64");
      extra[n_extra++] = value;
    } else if (is_switch) {
      dry_run = 1;
    } else if (a[0] == '-') {
      return bad_usage("unknown flag %s", a);
    } else {
      return bad_usage(
          "unexpected argument '%s': put the dtrain command after --, e.g. "
          "dtrain launch -n 2 -- train",
          a);
    }
  }
  if (hosts && hostfile)
    return bad_usage("%s", "give --hosts or --hostfile, not both");
  if (sep < 0 || sep + 1 >= argc)
    return bad_usage("%s",
                     "missing the command to run after --, e.g. dtrain launch -n 2 -- "
                     "train");
  const char *command = argv[sep + 1];
  if (strcmp(command, "train") && strcmp(command, "bench"))
    return bad_usage("'%s' cannot run on several ranks: launch train or bench", command);
  if (np == 0) {
    int gpus = hosts || hostfile ? 0 : dt_device_count(DT_DEVICE_CUDA);
    if (hosts || hostfile)
      return bad_usage("%s",
                       "the number of ranks is required: -n N (with --hosts or --hostfile "
                       "there is no default)");
    if (gpus <= 0)
      return bad_usage("%s",
                       "the number of ranks is required: -n N (no GPU is visible here, so "
                       "there is no one-rank-per-GPU default)");
    np = gpus;
    fprintf(stderr, "dtrain launch: %d GPU%s visible: one rank per GPU (-n %d)%s\n", gpus,
            gpus == 1 ? "" : "s", gpus,
            names_device(argc - sep - 1, argv + sep + 1)
                ? ""
                : "; add --device cuda to the command so that each rank trains on its GPU");
  }
  const char *env_rank = getenv("OMPI_COMM_WORLD_SIZE");
  if (env_rank && env_rank[0]) {
    fprintf(stderr,
            "dtrain launch: already running under mpirun (OMPI_COMM_WORLD_SIZE=%s): "
            "run `dtrain %s ...` directly in the job\n",
            env_rank, command);
    return 2;
  }

  char mpirun_buf[PATH_MAX];
  const char *mpirun = find_mpirun(mpirun_buf, sizeof mpirun_buf);
  if (!mpirun) {
    fprintf(stderr,
            "dtrain: error: dtrain launch needs Open MPI's mpirun, which is not on PATH "
            "(or DT_MPIRUN): install it (Debian: apt-get install openmpi-bin, or run "
            "tools/setup.sh) or run a single process with `dtrain %s`\n",
            command);
    return 1;
  }
  /* The ranks run this very binary, by its real path (/proc/self/exe
   * would name orted's binary on the other side). */
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    fprintf(stderr, "dtrain: error: cannot find the dtrain binary (/proc/self/exe): %s\n",
            strerror(errno));
    return 1;
  }
  self[len] = '\0';

  int cores = cores_available();
  int per_rank = threads > 0 ? threads : (cores / np > 0 ? cores / np : 1);
  char np_text[16], omp[48], dtn[48];
  snprintf(np_text, sizeof np_text, "%d", np);
  snprintf(omp, sizeof omp, "OMP_NUM_THREADS=%d", per_rank);
  snprintf(dtn, sizeof dtn, "DT_NUM_THREADS=%d", per_rank);

  const char *exports[MAX_EXPORTS];
  char export_names[4096];
  int n_exports = exported_names(exports, MAX_EXPORTS, export_names, sizeof export_names);

  int cap = 32 + n_extra + argc + 2 * n_exports;
  char **args = calloc((size_t)cap, sizeof *args);
  if (!args) {
    fprintf(stderr, "dtrain: error: out of memory\n");
    return 1;
  }
  int k = 0;
  args[k++] = (char *)mpirun;
  args[k++] = "-np";
  args[k++] = np_text;
  args[k++] = "--bind-to";
  args[k++] = "none";
  args[k++] = "--map-by";
  args[k++] = "slot";
  args[k++] = "-x";
  args[k++] = omp;
  args[k++] = "-x";
  args[k++] = dtn;
  for (int i = 0; i < n_exports; i++) {
    args[k++] = "-x";
    args[k++] = (char *)exports[i];
  }
  if (np > cores && !hosts && !hostfile)
    args[k++] = "--oversubscribe";
  if (geteuid() == 0)
    args[k++] = "--allow-run-as-root";
  if (hosts) {
    args[k++] = "--host";
    args[k++] = (char *)hosts;
  }
  if (hostfile) {
    args[k++] = "--hostfile";
    args[k++] = (char *)hostfile;
  }
  for (int i = 0; i < n_extra; i++)
    args[k++] = (char *)extra[i];
  args[k++] = self;
  for (int i = sep + 1; i < argc; i++)
    args[k++] = argv[i];
  args[k] = NULL;

  fprintf(stderr, "dtrain launch: ");
  for (int i = 0; i < k; i++) {
    if (i)
      fputc(' ', stderr);
    print_shell_word(stderr, i == 0 ? "mpirun" : args[i]);
  }
  fputc('\n', stderr);
  fflush(stderr);
  if (dry_run) {
    free(args);
    return 0;
  }
  execv(mpirun, args);
  fprintf(stderr, "dtrain: error: could not run %s: %s\n", mpirun, strerror(errno));
  free(args);
  return 1;
}
