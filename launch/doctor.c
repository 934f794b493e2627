#include "launch/doctor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/backend.h"
#include "core/memory.h"
#include "core/status.h"
#include "cuda/cuda.h"
#include "launch/flags.h"

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
  printf("data sets (--data-dir %s):\n", data_dir);
  report_data_set(data_dir, "fashion-mnist");
  report_data_set(data_dir, "mnist");
  if (problems == 0)
    printf("verdict: ok\n");
  else
    printf("verdict: %d problem(s) for GPU training (see above); CPU training works\n",
           problems);
  return 0;
}
