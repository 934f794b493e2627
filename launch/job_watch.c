/* `dtrain launch`'s watch over the end of a job (launch/job_watch.h). */
#define _GNU_SOURCE
#include "launch/job_watch.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WATCHED 1024
/* The least time the others get after a rank's exit: when a rank fails,
 * mpirun ends the rest itself (SIGTERM, which a training rank only notes,
 * then SIGKILL a moment later) and must not be taken for a hang. */
#define MIN_END_TIMEOUT_S 5.0

/* A process mpirun started on this host. */
typedef struct watched {
  int pid;
  int rank; /* OMPI_COMM_WORLD_RANK; -1 until its environment has it (after exec) */
  int gone;
} watched;

typedef struct watch {
  int mpirun;
  watched procs[MAX_WATCHED];
  int n;
  double first_exit_s; /* when a rank was first seen gone, 0 none */
  int first_rank;
} watch;

static volatile sig_atomic_t child_pid;

/* A signal sent to the launcher with kill(2) goes on to mpirun; the
 * terminal's (si_code SI_KERNEL) reached mpirun itself. */
static void forward(int sig, siginfo_t *info, void *ctx) {
  (void)ctx;
  if (child_pid > 0 && info->si_code <= 0)
    kill(child_pid, sig);
}

static const int forwarded[] = {SIGTERM, SIGHUP, SIGINT, SIGUSR1, SIGUSR2};
#define N_FORWARDED ((int)(sizeof forwarded / sizeof forwarded[0]))

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* /proc/PID/stat's state letter and parent; 0 when the process is gone. */
static char proc_state(int pid, int *ppid) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  const char *close = strrchr(text, ')'); /* the name in parentheses may hold anything */
  char state = 0;
  if (close == NULL || sscanf(close + 1, " %c %d", &state, ppid) != 2)
    return 0;
  return state;
}

/* The MPI rank in the environment of process pid, or -1. */
static int proc_rank(int pid) {
  static const char key[] = "OMPI_COMM_WORLD_RANK=";
  char path[64], env[65536];
  snprintf(path, sizeof path, "/proc/%d/environ", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  size_t n = fread(env, 1, sizeof env - 1, f);
  fclose(f);
  env[n] = '\0';
  for (size_t i = 0; i < n; i += strlen(env + i) + 1)
    if (strncmp(env + i, key, sizeof key - 1) == 0)
      return atoi(env + i + sizeof key - 1);
  return -1;
}

static watched *find(watch *w, int pid) {
  for (int i = 0; i < w->n; i++)
    if (w->procs[i].pid == pid)
      return &w->procs[i];
  return NULL;
}

/* Notes mpirun's children that appeared, and the ranks that are gone
 * (exited, or a zombie mpirun has not reaped yet). */
static void scan(watch *w) {
  for (int i = 0; i < w->n; i++)
    w->procs[i].gone = 1;
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d != NULL && (e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0]))
      continue;
    int pid = atoi(e->d_name), ppid = 0;
    char state = proc_state(pid, &ppid);
    if (state == 0 || ppid != w->mpirun || state == 'Z' || state == 'X')
      continue;
    watched *p = find(w, pid);
    if (p == NULL && w->n < MAX_WATCHED) {
      p = &w->procs[w->n++];
      *p = (watched){pid, -1, 0};
    }
    if (p != NULL) {
      p->gone = 0;
      if (p->rank < 0)
        p->rank = proc_rank(pid);
    }
  }
  if (d != NULL)
    closedir(d);
  for (int i = 0; i < w->n && w->first_exit_s == 0; i++)
    if (w->procs[i].gone && w->procs[i].rank >= 0) {
      w->first_exit_s = now_s();
      w->first_rank = w->procs[i].rank;
    }
}

/* Names the ranks still running `late_s` after a peer exited and kills
 * them; mpirun then ends the job (or is ended). */
static void end_job(watch *w, double late_s) {
  for (int i = 0; i < w->n; i++) {
    watched *p = &w->procs[i];
    int ppid = 0;
    char state = p->gone ? 0 : proc_state(p->pid, &ppid);
    if (state == 0 || ppid != w->mpirun || p->rank < 0)
      continue;
    fprintf(stderr,
            "dtrain launch: rank %d (pid %d, %s) had not ended %.0f s after rank %d exited: it is "
            "stuck at the end of the job (its peers were through MPI_Finalize, so none of them "
            "can see it); ending the job (exit %d)\n",
            p->rank, p->pid, state == 'T' || state == 't' ? "stopped" : "running", late_s,
            w->first_rank, DT_JOB_WATCH_EXIT_CODE);
    kill(p->pid, SIGKILL);
  }
  fflush(stderr);
}

/* Waits for mpirun at most `seconds`; 1 when it ended (status set). */
static int reap_within(int pid, double seconds, int *status) {
  double until = now_s() + seconds;
  do {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR))
      return 1;
    struct timespec pause = {0, 100000000L};
    nanosleep(&pause, NULL);
  } while (now_s() < until);
  return 0;
}

int dt_job_run_watched(const char *path, char **argv, double end_timeout_s, int *status) {
  struct sigaction act, old[N_FORWARDED];
  memset(&act, 0, sizeof act);
  act.sa_sigaction = forward;
  act.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&act.sa_mask);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "dtrain: error: cannot start mpirun: %s\n", strerror(errno));
    return -1;
  }
  if (pid == 0) {
    execv(path, argv);
    fprintf(stderr, "dtrain: error: could not run %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  child_pid = pid;
  for (int i = 0; i < N_FORWARDED; i++)
    sigaction(forwarded[i], &act, &old[i]);
  static watch w; /* 16 KiB: not on the stack */
  memset(&w, 0, sizeof w);
  w.mpirun = pid;
  if (end_timeout_s < MIN_END_TIMEOUT_S)
    end_timeout_s = MIN_END_TIMEOUT_S;
  int ended = 0;
  while (!reap_within(pid, 0.1, status)) {
    scan(&w);
    if (ended || w.first_exit_s == 0 || now_s() - w.first_exit_s <= end_timeout_s)
      continue;
    end_job(&w, now_s() - w.first_exit_s);
    ended = 1;
    /* mpirun ends on the killed rank; one that does not is ended too. */
    if (!reap_within(pid, 10, status)) {
      kill(pid, SIGTERM);
      if (!reap_within(pid, 5, status)) {
        kill(pid, SIGKILL);
        reap_within(pid, 5, status);
      }
    }
    break;
  }
  child_pid = 0;
  for (int i = 0; i < N_FORWARDED; i++)
    sigaction(forwarded[i], &old[i], NULL);
  if (ended)
    *status = DT_JOB_WATCH_EXIT_CODE << 8; /* W_EXITCODE(70, 0) */
  return 0;
}
