#define _GNU_SOURCE
#include "launch/launcher.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/env.h"
#include "dist/comm.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "launch/job_watch.h"

#define MAX_EXPORTS 64

extern char **environ;

static const char about[] =
    "Runs N ranks of `dtrain <command>` (train or bench) under Open MPI's mpirun:\n"
    "  mpirun -np N --map-by slot:PE=C --bind-to core -x OMP_NUM_THREADS=C -x DT_NUM_THREADS=C\n"
    "         [-x DT_...] [-x CUDA_VISIBLE_DEVICES] [-x NCCL_...] [--mca NAME VALUE]...\n"
    "         [--oversubscribe] [--allow-run-as-root] <this dtrain> <command> [flags]\n"
    "C = max(1, cores / N) threads per rank, cores being the CPUs this process may use;\n"
    "each rank is bound to C cores of its own when N x C physical cores are there and\n"
    "the ranks run on this machine, else (--hosts, --hostfile, SMT siblings counted in C,\n"
    "a --bind-to, --map-by, --cpu-set, --rankfile or --use-hwthread-cpus of yours among\n"
    "the --mpirun-arg) `--bind-to none --map-by slot` leaves placement to the OS;\n"
    "the --mca settings are launch/mca_params.def's (on one node: btl self,vader; always:\n"
    "btl_vader_single_copy_mechanism none), each unless set with --mpirun-arg or\n"
    "OMPI_MCA_<name>; --oversubscribe is added when N > cores, --allow-run-as-root when\n"
    "run as root;\n"
    "every DT_* variable of dtrain's (dtrain doctor lists them), CUDA_VISIBLE_DEVICES\n"
    "and every NCCL_* variable are exported to the ranks when set here. The mpirun\n"
    "command line is printed to stderr before it runs; mpirun is DT_MPIRUN, or the\n"
    "one on PATH.\n\n"
    "GPUs: without -n, on a machine with GPUs, N is the number of visible GPUs (one\n"
    "rank per GPU); give the command --device cuda and each rank takes the GPU of its\n"
    "local rank. Without GPUs (or with --hosts/--hostfile) -n is required.";

static const char examples[] =
    "examples: dtrain launch -n 2 -- train --batch 32\n"
    "          dtrain launch -- train --device cuda --batch 64     (one rank per GPU)";

static bool check_readable(const char *value, char *why, size_t cap) {
  if (access(value, R_OK) == 0)
    return true;
  snprintf(why, cap, "cannot read the file: %s", strerror(errno));
  return false;
}

static int bad_usage(FILE *err, const char *fmt, const char *what) {
  fprintf(err, "dtrain launch: ");
  fprintf(err, fmt, what);
  fprintf(err, " (see dtrain launch --help)\n");
  return 2;
}

enum { DT_MCA_ONE_NODE, DT_MCA_ANY_NODES };

typedef struct mca_param {
  const char *name, *value;
  int scope;
} mca_param;

static const mca_param mca_params[] = {
#define DT_MCA(name, value, scope, why) {name, value, scope},
#include "launch/mca_params.def"
};
#define NUM_MCA_PARAMS ((int)(sizeof mca_params / sizeof mca_params[0]))

/* The user set MCA parameter `name` already: in mpirun's arguments
 * (--mca/-mca NAME VALUE) or as OMPI_MCA_<name> in the environment. */
static bool mca_set_by_user(const char *name, const dt_flag_list *extra) {
  for (int i = 0; i + 1 < extra->n; i++)
    if ((!strcmp(extra->items[i], "--mca") || !strcmp(extra->items[i], "-mca")) &&
        !strcmp(extra->items[i + 1], name))
      return true;
  char var[128];
  snprintf(var, sizeof var, "OMPI_MCA_%s", name);
  return getenv(var) != NULL;
}

int dt_cli_cores_available(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Distinct physical cores among the CPUs this process may use (SMT
 * siblings count once), from sysfs; 0 when the topology cannot be read. */
static int physical_cores_available(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return 0;
  long seen[CPU_SETSIZE];
  int n = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &set))
      continue;
    long id[2];
    const char *leaf[2] = {"physical_package_id", "core_id"};
    for (int i = 0; i < 2; i++) {
      char path[128];
      snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, leaf[i]);
      FILE *f = fopen(path, "r");
      int ok = f && fscanf(f, "%ld", &id[i]) == 1;
      if (f)
        fclose(f);
      if (!ok)
        return 0;
    }
    long key = id[0] * 1000003L + id[1];
    int dup = 0;
    for (int j = 0; j < n && !dup; j++)
      dup = seen[j] == key;
    if (!dup)
      seen[n++] = key;
  }
  return n;
}

/* The user placed the ranks already through --mpirun-arg. */
static bool placement_set_by_user(const dt_flag_list *extra) {
  static const char *const options[] = {
      "--bind-to",           "-bind-to",           "--map-by",        "-map-by",
      "--cpu-set",           "-cpu-set",           "--rankfile",      "-rf",
      "--use-hwthread-cpus", "-use-hwthread-cpus", "--cpus-per-proc", "-cpus-per-proc"};
  for (int i = 0; i < extra->n; i++)
    for (size_t j = 0; j < sizeof options / sizeof options[0]; j++)
      if (!strncmp(extra->items[i], options[j], strlen(options[j])))
        return true;
  return false;
}

const char *dt_cli_find_mpirun(char *buf, size_t cap) {
  const char *forced = NULL;
  if (dt_env_string(DT_ENV_MPIRUN, &forced) == DT_OK && forced)
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
 * every DT_* parameter that is set (core/env_params.def; DT_NUM_THREADS is
 * passed with its per-rank value), CUDA_VISIBLE_DEVICES (even empty: it
 * then hides every GPU), and every NCCL_* (NCCL's transport settings).
 * Names are copied into `buf`; returns how many were found (at most
 * `cap`). */
static int exported_names(const char **names, int cap, char *buf, size_t buf_cap) {
  int n = 0;
  size_t used = 0;
  for (int p = 0; p < DT_ENV_COUNT && n < cap; p++) {
    const dt_env_info *e = dt_env_info_of((dt_env_param)p);
    if (p != DT_ENV_NUM_THREADS && strcmp(e->group, "test") && dt_env_is_set((dt_env_param)p))
      names[n++] = e->name;
  }
  if (getenv("CUDA_VISIBLE_DEVICES") && n < cap)
    names[n++] = "CUDA_VISIBLE_DEVICES";
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

/* Why a job ended, and whether a restart from its last checkpoint can
 * help: a rank that died (killed by a signal: mpirun exits 128+N, or its
 * own status, or 69 from a rank that found its process gone) or the watchdog (70). Errors (1), a
 * bad command line (2) and a requested stop (75) are final. */
static bool restartable(int status, char *why, size_t cap) {
  if (WIFSIGNALED(status)) {
    snprintf(why, cap, "mpirun was killed by signal %d", WTERMSIG(status));
    return false;
  }
  int rc = WEXITSTATUS(status);
  if (rc == 70) {
    snprintf(why, cap,
             "the watchdog ended the job (a collective did not complete in time; exit 70)");
    return true;
  }
  if (rc == DT_COMM_PEER_LOST_EXIT_CODE) {
    snprintf(why, cap, "a rank died (another rank found its process gone; exit %d)", rc);
    return true;
  }
  if (rc > 128) {
    snprintf(why, cap, "a rank died (killed by signal %d: mpirun exited %d)", rc - 128, rc);
    return true;
  }
  snprintf(why, cap, "the job exited %d (%s)", rc,
           rc == 0    ? "success"
           : rc == 2  ? "a bad command line"
           : rc == 75 ? "stopped by SIGTERM/SIGUSR1 after saving"
                      : "an error, reported above");
  return false;
}

/* The value of the command's flag (--flag V or --flag=V), or NULL. */
static const char *command_flag(int n, char **args, const char *flag) {
  size_t len = strlen(flag);
  for (int i = 0; i < n; i++) {
    if (!strcmp(args[i], flag) && i + 1 < n)
      return args[i + 1];
    if (!strncmp(args[i], flag, len) && args[i][len] == '=')
      return args[i] + len + 1;
  }
  return NULL;
}

/* The exit status of `status` (waitpid's): its code, or 128 + its signal. */
static int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* mpirun in a child under the end-of-job watch (launch/job_watch.h),
 * again after each restartable failure (at most max_restarts times),
 * resuming from the newest complete checkpoint. */
static int run_with_restarts(const char *mpirun, char **mpi_argv, int k, int max_restarts,
                             bool has_resume, double end_timeout_s) {
  for (int restart = 0;; restart++) {
    int status = 0;
    if (dt_job_run_watched(mpirun, mpi_argv, end_timeout_s, &status) != 0)
      return 1;
    char why[160];
    bool again = restartable(status, why, sizeof why);
    if (max_restarts == 0)
      return exit_code(status);
    if (!again || restart >= max_restarts) {
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "dtrain launch: %s%s\n", why,
                again ? "; no restarts left (--max-restarts)" : ": not restarting");
      return exit_code(status);
    }
    fprintf(stderr,
            "dtrain launch: restart %d of %d: %s; the whole job starts again from the newest "
            "complete checkpoint (--resume auto)\n",
            restart + 1, max_restarts, why);
    if (!has_resume) { /* the slots after the command were reserved for this */
      mpi_argv[k++] = "--resume";
      mpi_argv[k++] = "auto";
      mpi_argv[k] = NULL;
      has_resume = true;
    }
  }
}

/* The command's --comm-timeout (the ranks' deadline), else the default. */
static double command_timeout(int n, char **args) {
  const char *v = command_flag(n, args, "--comm-timeout");
  char *end = NULL;
  double t = v ? strtod(v, &end) : 0.0;
  return v && end != v && *end == '\0' && t > 0 && t < 1e9 ? t : DT_COMM_CONFIG_DEFAULT.timeout_s;
}

int dt_cli_launch(int argc, char **argv, FILE *err) {
  int np = 0, threads = 0, max_restarts = 0;
  bool dry_run = false;
  const char *hosts = NULL, *hostfile = NULL;
  dt_flag_list extra = {{NULL}, 0};
  dt_flag flags[] = {
      DT_INT_FLAG("np", &np, "N", "ranks to start", .alias = "-n", .min = 1,
                  .default_text = "one per visible GPU; required without GPUs"),
      DT_STRING_FLAG("hosts", &hosts, "H1,H2,...",
                     "hosts to run on (mpirun --host; H:SLOTS gives slots)"),
      DT_STRING_FLAG("hostfile", &hostfile, "FILE",
                     "an Open MPI hostfile (mpirun --hostfile; see launch/mpirun/)",
                     .check = check_readable),
      DT_INT_FLAG("threads", &threads, "C", "CPU threads per rank", .min = 1,
                  .max = DT_CPU_MAX_THREADS, .default_text = "cores / N"),
      DT_LIST_FLAG("mpirun-arg", &extra, "ARG", "pass ARG to mpirun"),
      DT_BOOL_FLAG("dry-run", &dry_run, "print the mpirun command line and exit"),
      DT_INT_FLAG("max-restarts", &max_restarts, "N",
                  "train: when a rank dies or the watchdog fires, start the whole job again from "
                  "the newest complete checkpoint of its --run-dir, at most N times"),
  };
  dt_flag_set set = {
      .command = "launch",
      .usage =
          "launch [-n N] [--hosts H1,H2,... | --hostfile FILE] [--threads C]\n"
          "                     [--mpirun-arg ARG]... [--dry-run] -- <command> [flags]",
      .about = about,
      .epilogue = examples,
      DT_FLAG_TABLE(flags),
      .command_after_dashdash = true,
      .args_hint = "put the dtrain command after --, e.g. dtrain launch -n 2 -- train",
  };
  dt_flags_args args;
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, &args);
  if (hosts && hostfile)
    return bad_usage(err, "%s", "give --hosts or --hostfile, not both");
  if (args.nrest < 1)
    return bad_usage(err, "%s",
                     "missing the command to run after --, e.g. dtrain launch -n 2 -- "
                     "train");
  const char *command = args.rest[0];
  if (strcmp(command, "train") && strcmp(command, "bench"))
    return bad_usage(err, "'%s' cannot run on several ranks: launch train or bench", command);
  if (np == 0) {
    int gpus = hosts || hostfile ? 0 : dt_device_count(DT_DEVICE_CUDA);
    if (hosts || hostfile)
      return bad_usage(err, "%s",
                       "the number of ranks is required: -n N (with --hosts or --hostfile "
                       "there is no default)");
    if (gpus <= 0)
      return bad_usage(err, "%s",
                       "the number of ranks is required: -n N (no GPU is visible here, so "
                       "there is no one-rank-per-GPU default)");
    np = gpus;
    fprintf(stderr, "dtrain launch: %d GPU%s visible: one rank per GPU (-n %d)%s\n", gpus,
            gpus == 1 ? "" : "s", gpus,
            names_device(args.nrest, args.rest)
                ? ""
                : "; add --device cuda to the command so that each rank trains on its GPU");
  }
  if (max_restarts > 0 && strcmp(command, "train") != 0)
    return bad_usage(err, "%s", "--max-restarts restarts train (from its checkpoints), not bench");
  if (max_restarts > 0 && !command_flag(args.nrest, args.rest, "--run-dir"))
    return bad_usage(err, "%s",
                     "--max-restarts resumes from the run's checkpoints: give train a --run-dir");
  const char *env_rank = getenv("OMPI_COMM_WORLD_SIZE");
  if (env_rank && env_rank[0]) {
    fprintf(err,
            "dtrain launch: already running under mpirun (OMPI_COMM_WORLD_SIZE=%s): "
            "run `dtrain %s ...` directly in the job\n",
            env_rank, command);
    return 2;
  }

  if (dt_cli_check_env() != DT_OK) {
    dt_cli_print_error(stderr, NULL);
    return 1;
  }
  char mpirun_buf[PATH_MAX];
  const char *mpirun = dt_cli_find_mpirun(mpirun_buf, sizeof mpirun_buf);
  if (!mpirun) {
    if (dt_env_is_set(DT_ENV_MPIRUN))
      fprintf(stderr,
              "dtrain: error: DT_MPIRUN=%s is not an executable file: point it at Open MPI's "
              "mpirun, or unset it to use the one on PATH\n",
              dt_env_raw(DT_ENV_MPIRUN));
    else
      fprintf(stderr,
              "dtrain: error: dtrain launch needs Open MPI's mpirun, which is not on PATH: "
              "install it (Debian: apt-get install openmpi-bin, or run tools/setup.sh), set "
              "DT_MPIRUN to its path, or run a single process with `dtrain %s`\n",
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

  int cores = dt_cli_cores_available();
  int per_rank = threads > 0 ? threads : (cores / np > 0 ? cores / np : 1);
  char np_text[16], omp[48], dtn[48];
  snprintf(np_text, sizeof np_text, "%d", np);
  snprintf(omp, sizeof omp, "OMP_NUM_THREADS=%d", per_rank);
  snprintf(dtn, sizeof dtn, "DT_NUM_THREADS=%d", per_rank);

  const char *exports[MAX_EXPORTS];
  char export_names[4096];
  int n_exports = exported_names(exports, MAX_EXPORTS, export_names, sizeof export_names);

  int cap = 34 + extra.n + args.nrest + 2 * n_exports + 3 * NUM_MCA_PARAMS; /* 2: --resume auto */
  char **mpi_argv = calloc((size_t)cap, sizeof *mpi_argv);
  if (!mpi_argv) {
    fprintf(stderr, "dtrain: error: out of memory\n");
    return 1;
  }
  int k = 0;
  mpi_argv[k++] = (char *)mpirun;
  mpi_argv[k++] = "-np";
  mpi_argv[k++] = np_text;
  /* Each rank on cores of its own: its computation, its communication
   * thread and its OpenMP threads stay on them instead of migrating over
   * the other ranks' (2 ranks of 1 thread on 2 cores: 3.5 % more samples/s
   * for the MLP and LeNet-5, docs/decisions.md). */
  char pe_text[32];
  snprintf(pe_text, sizeof pe_text, "slot:PE=%d", per_rank);
  bool bind = !hosts && !hostfile && !placement_set_by_user(&extra) &&
              (int64_t)np * per_rank <= physical_cores_available();
  if (bind) {
    mpi_argv[k++] = "--map-by";
    mpi_argv[k++] = pe_text;
    mpi_argv[k++] = "--bind-to";
    mpi_argv[k++] = "core";
  } else if (!placement_set_by_user(&extra)) {
    mpi_argv[k++] = "--bind-to";
    mpi_argv[k++] = "none";
    mpi_argv[k++] = "--map-by";
    mpi_argv[k++] = "slot";
  }
  mpi_argv[k++] = "-x";
  mpi_argv[k++] = omp;
  mpi_argv[k++] = "-x";
  mpi_argv[k++] = dtn;
  for (int i = 0; i < n_exports; i++) {
    mpi_argv[k++] = "-x";
    mpi_argv[k++] = (char *)exports[i];
  }
  for (int i = 0; i < NUM_MCA_PARAMS; i++) {
    const mca_param *m = &mca_params[i];
    if ((m->scope == DT_MCA_ONE_NODE && (hosts || hostfile)) || mca_set_by_user(m->name, &extra))
      continue;
    mpi_argv[k++] = "--mca";
    mpi_argv[k++] = (char *)m->name;
    mpi_argv[k++] = (char *)m->value;
  }
  /* The ranks write to mpirun's pseudo-terminal whatever mpirun's own
   * output is: tell them (launch/progress.h). */
  if (!dt_env_is_set(DT_ENV_PROGRESS) && isatty(STDOUT_FILENO)) {
    mpi_argv[k++] = "-x";
    mpi_argv[k++] = "DT_PROGRESS=bar";
  }
  if (np > cores && !hosts && !hostfile)
    mpi_argv[k++] = "--oversubscribe";
  if (geteuid() == 0)
    mpi_argv[k++] = "--allow-run-as-root";
  if (hosts) {
    mpi_argv[k++] = "--host";
    mpi_argv[k++] = (char *)hosts;
  }
  if (hostfile) {
    mpi_argv[k++] = "--hostfile";
    mpi_argv[k++] = (char *)hostfile;
  }
  for (int i = 0; i < extra.n; i++)
    mpi_argv[k++] = (char *)extra.items[i];
  mpi_argv[k++] = self;
  for (int i = 0; i < args.nrest; i++)
    mpi_argv[k++] = args.rest[i];
  mpi_argv[k] = NULL;

  fprintf(stderr, "dtrain launch: ");
  for (int i = 0; i < k; i++) {
    if (i)
      fputc(' ', stderr);
    print_shell_word(stderr, i == 0 ? "mpirun" : mpi_argv[i]);
  }
  fputc('\n', stderr);
  fflush(stderr);
  if (dry_run) {
    free(mpi_argv);
    return 0;
  }
  int rc = run_with_restarts(mpirun, mpi_argv, k, max_restarts,
                             command_flag(args.nrest, args.rest, "--resume") != NULL,
                             command_timeout(args.nrest, args.rest));
  free(mpi_argv);
  return rc;
}
