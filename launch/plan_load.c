/* dtrain plan on the CPU for several ranks per node: the other ranks'
 * load while the probe measures (plan_load.h). */
#include "launch/plan_load.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOAD_READY_TIMEOUT_MS 600000 /* a copy's first step: GPT-2 1.5B's is minutes */

static void close_fd(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

void dt_cli_plan_load_stop(dt_cli_plan_load *l) {
  for (int i = 0; i < l->n; i++)
    close_fd(&l->stop_fd[i]); /* the copy's stdin ends: it stops after its step */
  for (int i = 0; i < l->n; i++) {
    close_fd(&l->ready_fd[i]);
    if (l->pid[i] > 0)
      while (waitpid(l->pid[i], NULL, 0) < 0 && errno == EINTR)
        ;
    l->pid[i] = 0;
  }
  l->n = 0;
}

/* One copy: `dtrain plan <argv> --probe-load`, its stdin the stop pipe, its
 * stdout the ready pipe. */
static int start_copy(int argc, char **argv, dt_cli_plan_load *l, FILE *err) {
  int in[2], out[2];
  if (pipe(in) != 0)
    return -1;
  if (pipe(out) != 0) {
    close(in[0]), close(in[1]);
    return -1;
  }
  char **args = calloc((size_t)argc + 4, sizeof *args);
  if (args == NULL) {
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    return -1;
  }
  args[0] = "dtrain";
  args[1] = "plan";
  for (int k = 0; k < argc; k++)
    args[k + 2] = argv[k];
  args[argc + 2] = "--probe-load";
  fflush(err);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    for (int i = 0; i < l->n; i++) /* the earlier copies' pipes stay the parent's */
      close(l->stop_fd[i]), close(l->ready_fd[i]);
    execv("/proc/self/exe", args);
    fprintf(err, "dtrain plan: cannot run the probe's load: %s\n", strerror(errno));
    _exit(127);
  }
  int saved = errno;
  free(args);
  close(in[0]), close(out[1]);
  if (pid < 0) {
    close(in[1]), close(out[0]);
    errno = saved;
    return -1;
  }
  l->pid[l->n] = pid;
  l->stop_fd[l->n] = in[1];
  l->ready_fd[l->n] = out[0];
  l->n++;
  return 0;
}

int dt_cli_plan_load_copies(int ranks, int threads, int cores) {
  int fit = cores / (threads > 0 ? threads : 1) - 1;
  int copies = ranks - 1 < fit ? ranks - 1 : fit;
  return copies > 0 ? copies : 0;
}

int dt_cli_plan_load_start(int copies, int argc, char **argv, dt_cli_plan_load *l, FILE *err) {
  memset(l, 0, sizeof *l);
  if (copies > DT_CLI_PLAN_LOAD_MAX)
    copies = DT_CLI_PLAN_LOAD_MAX;
  signal(SIGPIPE, SIG_IGN);
  for (int i = 0; i < copies; i++)
    if (start_copy(argc, argv, l, err) != 0) {
      fprintf(err, "dtrain plan: cannot start the probe's load (%d other ranks): %s\n", copies,
              strerror(errno));
      dt_cli_plan_load_stop(l);
      return -1;
    }
  /* each copy says so once its first step is done (its memory allocated) */
  for (int i = 0; i < l->n; i++) {
    struct pollfd p = {l->ready_fd[i], POLLIN, 0};
    char c = 0;
    int r = poll(&p, 1, LOAD_READY_TIMEOUT_MS);
    if (r != 1 || read(l->ready_fd[i], &c, 1) != 1) {
      fprintf(err,
              "dtrain plan: the probe's load (a copy of the model's steps for the other %d "
              "ranks of the node) did not start\n",
              copies);
      dt_cli_plan_load_stop(l);
      return -1;
    }
  }
  return 0;
}

bool dt_cli_plan_load_go_on(void *user, int steps) {
  (void)user;
  if (steps == 1) { /* the first step done: ready */
    if (write(STDOUT_FILENO, "r", 1) != 1)
      return false;
  }
  struct pollfd p = {STDIN_FILENO, POLLIN, 0};
  return poll(&p, 1, 0) == 0; /* stdin readable: ended (or written to): stop */
}
