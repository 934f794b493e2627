#include "launch/doctor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "core/memory.h"
#include "core/status.h"
#include "cuda/cuda.h"
#include "dist/comm.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "launch/launcher.h"
#include "train/train_loop.h"

extern char **environ;

/* From OpenBLAS and Open MPI; declared here to keep their headers out. */
char *openblas_get_config(void);
int MPI_Get_library_version(char *version, int *resultlen);

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Reports whether dir/name holds the four idx files (raw or .gz); true
 * when it does. */
static bool report_data_set(const char *dir, const char *name) {
  static const char *const files[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                      "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  char path[4096];
  int found = 0;
  const char *missing = NULL;
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, files[i]);
    int ok = file_exists(path);
    if (!ok) {
      snprintf(path, sizeof path, "%s/%s/%s.gz", dir, name, files[i]);
      ok = file_exists(path);
    }
    if (ok)
      found++;
    else if (!missing)
      missing = files[i];
  }
  if (found == 4)
    printf("  %-14s ok (%s/%s)\n", name, dir, name);
  else
    printf("  %-14s missing %s under %s/%s (run tools/setup.sh)\n", name, missing, dir, name);
  return found == 4;
}

/* GPU-to-GPU reachability: cudaDeviceCanAccessPeer for every pair. */
static void report_peer_access(int gpus) {
  printf(
      "  P2P            cudaDeviceCanAccessPeer (row -> column; NCCL uses P2P where yes, host "
      "shared memory where no):\n");
  printf("                 %6s", "");
  for (int j = 0; j < gpus; j++)
    printf(" GPU%-3d", j);
  printf("\n");
  for (int i = 0; i < gpus; i++) {
    printf("                 GPU%-3d", i);
    for (int j = 0; j < gpus; j++) {
      int ok = 0;
      if (i == j)
        printf(" %-6s", "-");
      else if (dt_cuda_peer_access(i, j, &ok) != DT_OK)
        printf(" %-6s", "?");
      else
        printf(" %-6s", ok ? "yes" : "no");
    }
    printf("\n");
  }
  dt_clear_error();
  printf(
      "  NVLink         `nvidia-smi topo -m` shows the links: NV# = NVLink, PIX/PXB = one PCIe "
      "switch, NODE/SYS = across the host bridge or sockets (slowest); "
      "`nvidia-smi nvlink --status` the NVLink lanes\n");
}

/* How ranks will communicate: NCCL, its environment, and with GPUs whether
 * they reach each other (the backend choice is DT_COMM_BACKEND, reported
 * with the environment). */
static void report_distributed(void) {
  printf("distributed:\n");
  if (dt_nccl_built())
    printf("  nccl backend   built in (NCCL %d.%d.%d)\n", dt_nccl_version() / 10000,
           dt_nccl_version() / 100 % 100, dt_nccl_version() % 100);
  else
    printf("  nccl backend   not built: GPU ranks reduce through host memory (mpi, host-staged)\n");
  const char *visible = getenv("CUDA_VISIBLE_DEVICES");
  if (visible)
    printf("  CUDA_VISIBLE_DEVICES=%s\n", visible);
  else
    printf("  CUDA_VISIBLE_DEVICES not set: every GPU of the machine is visible\n");
  int nccl_vars = 0;
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "NCCL_", 5) != 0)
      continue;
    if (nccl_vars++ == 0)
      printf("  NCCL environment (passed to the ranks by dtrain launch):\n");
    printf("    %s\n", *e);
  }
  if (nccl_vars == 0)
    printf(
        "  NCCL environment: no NCCL_* variable set (NCCL picks its transports itself; "
        "NCCL_DEBUG=INFO makes it print them)\n");
  int gpus = dt_device_count(DT_DEVICE_CUDA);
  if (gpus <= 0) {
    printf("  GPUs           none visible: ranks train on the CPU and communicate over mpi\n");
  } else if (gpus == 1) {
    printf(
        "  GPUs           1 visible: one rank per node uses it with nccl; several ranks "
        "sharing it fall back to the host-staged mpi backend (NCCL refuses two ranks on "
        "one GPU)\n");
  } else {
    printf("  GPUs           %d visible: dtrain launch starts one rank per GPU by default\n", gpus);
    report_peer_access(gpus);
  }
}

/* Appends "; <text>" (or "<text>" first) to the list of needs. */
static void add_need(char *list, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_need(char *list, size_t cap, const char *fmt, ...) {
  size_t used = strlen(list);
  if (used > 0 && used + 2 < cap) {
    memcpy(list + used, "; ", 3);
    used += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(list + used, cap - used, fmt, ap);
  va_end(ap);
}

/* Every DT_* variable with its value and default; every bad value is
 * shown, and counted unless only tests read it (a run never does). */
static int report_environment(void) {
  int problems = 0;
  printf("environment (every variable dtrain reads; the README describes them):\n");
  for (int p = 0; p < DT_ENV_COUNT; p++) {
    const dt_env_info *e = dt_env_info_of((dt_env_param)p);
    const char *raw = dt_env_raw((dt_env_param)p);
    bool test = !strcmp(e->group, "test");
    char value[80];
    snprintf(value, sizeof value, "%s", raw ? raw : "unset");
    printf("  %-26s %-14s default: %s%s\n", e->name, value, dt_env_default_text((dt_env_param)p),
           test ? " (tests only)" : "");
    if (dt_env_check((dt_env_param)p) != DT_OK) {
      problems += !test; /* a test's own value stops that test, not a run */
      printf("    PROBLEM%s: %s\n", test ? " (for the tests that read it)" : "", dt_last_error());
      dt_clear_error();
    }
  }
  return problems;
}

int dt_cli_doctor(int argc, char **argv, FILE *err) {
  dt_train_config job = dt_train_config_default(); /* what `dtrain train` runs */
  const char *data_dir = job.data_dir;
  dt_env_string(DT_ENV_DATA_DIR, &data_dir);
  dt_flag flags[] = {dt_cli_flag_data_dir(&data_dir)};
  dt_flag_set set = {
      .command = "doctor",
      .usage = "doctor [flags]",
      .about =
          "Reports the devices, CPU threads, memory cap, libraries, GPUs, the communication\n"
          "set-up, the data sets, mpirun and every DT_* environment variable, then one line\n"
          "  verdict: ...\n"
          "Exit status 0 when the default job (./dtrain train: dtrain launch -n 2 -- train,\n"
          "LeNet-5 on Fashion-MNIST on the CPU) can run; 1 when something it needs is\n"
          "missing or wrong (the data set, mpirun, a DT_* value), each named in the verdict.\n"
          "GPU problems are reported but do not fail the verdict.",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);

  char buf[64];
  printf("devices:\n");
  printf("  cpu:0          ok, %d threads (DT_NUM_THREADS or --threads to change)\n",
         dt_cpu_num_threads());
  const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
  printf(
      "  openmp waits   OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s (dtrain sets a short spin unless "
      "either is given)\n",
      policy ? policy : "unset", spin ? spin : "unset");
  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get((dt_device){DT_DEVICE_CPU, 0}, &ms) == DT_OK)
    printf("  cpu memory cap %s (%s)\n",
           ms.limit ? dt_format_bytes(ms.limit, buf, sizeof buf) : "none",
           dt_cpu_memory_limit_source());
  printf(
      "                 a run's own: train and bench --max-memory MIB (the CPU's, or a GPU's "
      "caching allocator); train then recovers from an out-of-memory error in a step\n");
  dt_clear_error();
  const dt_backend_ops *ops = NULL;
  dt_device gpu = {DT_DEVICE_CUDA, 0};
  if (dt_backend_get(gpu, &ops) == DT_OK)
    printf("  cuda           %d device(s)\n", dt_device_count(DT_DEVICE_CUDA));
  else
    printf("  cuda           unavailable: %s\n", dt_last_error());
  dt_clear_error();
  printf("libraries:\n");
  printf("  OpenBLAS       %s\n", openblas_get_config());
  printf("  BLAS kernels   %s\n", dt_cpu_blas_kernels());
  char mpi[8192];
  int mpi_len = 0;
  if (MPI_Get_library_version(mpi, &mpi_len) == 0) {
    char *nl = strchr(mpi, ',');
    if (nl)
      *nl = '\0';
    printf("  MPI            %s\n", mpi);
  }
  int gpu_problems = 0;
  dt_cuda_doctor(stdout, &gpu_problems);
  report_distributed();

  /* What the default job needs, named in the verdict when missing. */
  char missing[1024] = "";
  printf("data sets (--data-dir %s):\n", data_dir);
  char names[128];
  snprintf(names, sizeof names, "%s", DT_CLI_DATA_SETS);
  for (char *save = NULL, *name = strtok_r(names, "|", &save); name;
       name = strtok_r(NULL, "|", &save)) {
    const char *job_data = job.data ? job.data->name : job.task ? job.task->data[0].name : "";
    if (!report_data_set(data_dir, name) && !strcmp(name, job_data)) {
      add_need(missing, sizeof missing,
               "the %s data set under %s (run tools/setup.sh, or give --data-dir / DT_DATA_DIR)",
               name, data_dir);
    }
  }
  printf("launcher:\n");
  char mpirun_buf[4096];
  const char *mpirun = dt_cli_find_mpirun(mpirun_buf, sizeof mpirun_buf);
  if (mpirun) {
    printf("  mpirun         %s%s\n", mpirun, dt_env_is_set(DT_ENV_MPIRUN) ? " (DT_MPIRUN)" : "");
  } else {
    printf(
        "  mpirun         missing: dtrain launch and the 2-rank default job need Open MPI's "
        "mpirun (apt-get install openmpi-bin, or tools/setup.sh; or set DT_MPIRUN)\n");
    add_need(missing, sizeof missing, "mpirun (%s)",
             dt_env_is_set(DT_ENV_MPIRUN) ? "DT_MPIRUN is not an executable file" : "not on PATH");
  }
  int env_problems = report_environment();
  if (env_problems > 0) {
    add_need(missing, sizeof missing, "valid DT_* values (%d PROBLEM%s above)", env_problems,
             env_problems == 1 ? "" : "s");
  }

  char gpu_text[128];
  if (gpu_problems == 0)
    snprintf(gpu_text, sizeof gpu_text, "GPU training: ready");
  else
    snprintf(gpu_text, sizeof gpu_text, "GPU training: %d problem%s (see CUDA above)", gpu_problems,
             gpu_problems == 1 ? "" : "s");
  if (missing[0]) {
    printf("verdict: NOT READY: the default job (dtrain launch -n 2 -- train) needs %s; %s\n",
           missing, gpu_text);
    return 1;
  }
  printf("verdict: ready for the default job (dtrain launch -n 2 -- train); %s\n", gpu_text);
  return 0;
}
