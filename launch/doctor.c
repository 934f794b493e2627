#include "launch/doctor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "core/status.h"
#include "cuda/cuda.h"
#include "dist/comm.h"
#include "launch/flags.h"

extern char **environ;

/* From OpenBLAS and Open MPI; declared here to keep their headers out. */
char *openblas_get_config(void);
int MPI_Get_library_version(char *version, int *resultlen);

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Reports whether dir/name holds the four idx files (raw or .gz). */
static void report_data_set(const char *dir, const char *name) {
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
}

/* GPU-to-GPU reachability: cudaDeviceCanAccessPeer for every pair. */
static void report_peer_access(int gpus) {
  printf("  P2P            cudaDeviceCanAccessPeer (row -> column; NCCL uses P2P where yes, host "
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
  printf("  NVLink         `nvidia-smi topo -m` shows the links: NV# = NVLink, PIX/PXB = one PCIe "
         "switch, NODE/SYS = across the host bridge or sockets (slowest); "
         "`nvidia-smi nvlink --status` the NVLink lanes\n");
}

/* How ranks will communicate: the backend choice, NCCL's environment, and
 * with GPUs whether they reach each other. Returns the problems found. */
static int report_distributed(void) {
  int problems = 0;
  printf("distributed:\n");
  const char *backend = getenv("DT_COMM_BACKEND");
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  if (dt_comm_config_from_env(&cc) != DT_OK) {
    problems++;
    printf("  DT_COMM_BACKEND=%s  PROBLEM: %s; runs that read it stop with this error\n", backend,
           dt_last_error());
    dt_clear_error();
  } else if (backend && backend[0]) {
    printf("  DT_COMM_BACKEND=%s (--comm-backend overrides it)\n", backend);
  } else {
    printf("  DT_COMM_BACKEND not set: auto (nccl for GPU tensors, mpi for CPU ones; "
           "--comm-backend to choose)\n");
  }
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
    printf("  NCCL environment: no NCCL_* variable set (NCCL picks its transports itself; "
           "NCCL_DEBUG=INFO makes it print them)\n");
  int gpus = dt_device_count(DT_DEVICE_CUDA);
  if (gpus <= 0) {
    printf("  GPUs           none visible: ranks train on the CPU and communicate over mpi\n");
  } else if (gpus == 1) {
    printf("  GPUs           1 visible: one rank per node uses it with nccl; several ranks "
           "sharing it fall back to the host-staged mpi backend (NCCL refuses two ranks on "
           "one GPU)\n");
  } else {
    printf("  GPUs           %d visible: dtrain launch starts one rank per GPU by default\n",
           gpus);
    report_peer_access(gpus);
  }
  return problems;
}

int dt_cli_doctor(int argc, char **argv) {
  const char *data_dir = getenv("DT_DATA_DIR");
  if (!data_dir || !data_dir[0])
    data_dir = "data";
  dt_flag flags[] = {
      {"data-dir", DT_FLAG_STRING, &data_dir, "DIR",
       "folder holding the data sets (env DT_DATA_DIR)", 0, NULL},
  };
  switch (dt_flags_parse("doctor", flags, 1, argc, argv, stderr)) {
    case DT_FLAGS_OK: break;
    case DT_FLAGS_HELP:
      printf(
          "usage: dtrain doctor [flags]\n\nReports the devices, CPU threads, memory cap and "
          "data sets this build can use.\n\nflags:\n");
      dt_flags_print(flags, 1, stdout);
      return 0;
    case DT_FLAGS_ERROR: return 2;
  }

  char buf[64];
  printf("devices:\n");
  printf("  cpu:0          ok, %d threads (DT_NUM_THREADS or --threads to change)\n",
         dt_cpu_num_threads());
  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get((dt_device){DT_DEVICE_CPU, 0}, &ms) == DT_OK && ms.limit > 0)
    printf("  cpu memory cap %s (DT_CPU_MEMORY_LIMIT)\n",
           dt_format_bytes(ms.limit, buf, sizeof buf));
  const dt_backend_ops *ops = NULL;
  dt_device gpu = {DT_DEVICE_CUDA, 0};
  if (dt_backend_get(gpu, &ops) == DT_OK)
    printf("  cuda           %d device(s)\n", dt_device_count(DT_DEVICE_CUDA));
  else
    printf("  cuda           unavailable: %s\n", dt_last_error());
  printf("libraries:\n");
  printf("  OpenBLAS       %s\n", openblas_get_config());
  char mpi[8192];
  int mpi_len = 0;
  if (MPI_Get_library_version(mpi, &mpi_len) == 0) {
    char *nl = strchr(mpi, ',');
    if (nl)
      *nl = '\0';
    printf("  MPI            %s\n", mpi);
  }
  int problems = 0;
  dt_cuda_doctor(stdout, &problems);
  int dist_problems = report_distributed();
  printf("data sets (--data-dir %s):\n", data_dir);
  report_data_set(data_dir, "fashion-mnist");
  report_data_set(data_dir, "mnist");
  if (dist_problems > 0)
    printf("verdict: %d problem(s) (see above): the distributed settings are invalid%s\n",
           dist_problems + problems, problems ? ", and CUDA is not ready" : "");
  else if (problems == 0)
    printf("verdict: ok\n");
  else
    printf("verdict: %d problem(s) for GPU training (see above); CPU training works\n",
           problems);
  return 0;
}
