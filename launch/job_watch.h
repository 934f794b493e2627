/* `dtrain launch`'s watch over the end of a job. A rank that stops
 * (SIGSTOP, a debugger, a hung NFS write) after its peers' last point of
 * contact with it, MPI_Finalize, is seen by no rank: they exit, and mpirun
 * waits for it for ever. Only the launcher outlives them all, so it
 * watches the ranks mpirun started on this host (mpirun's children): once
 * one of them has exited, the others must follow within the job's
 * --comm-timeout (5 s at least: after a rank's error exit mpirun itself
 * takes a moment to end the rest). One still there then is named with its
 * state, killed,
 * and the job ends with the watchdog's exit status 70, as a stuck
 * collective would. (Ranks on other hosts are orted's children there, not
 * visible from here: their peers' deadlines cover them up to MPI_Finalize.)
 *
 *   int status;
 *   if (dt_job_run_watched(mpirun, argv, 300, &status) != 0) ...
 */
#ifndef DT_LAUNCH_JOB_WATCH_H
#define DT_LAUNCH_JOB_WATCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status of a job the launcher ended (the watchdog's). */
#define DT_JOB_WATCH_EXIT_CODE 70

/* Runs `path` with `argv` (mpirun's command line) in a child and waits for
 * it, forwarding SIGTERM, SIGHUP, SIGINT, SIGUSR1 and SIGUSR2 sent to this
 * process with kill(2) (a terminal's signals reach mpirun already: it is in
 * the same process group). While it runs, the watch above with
 * `end_timeout_s`. *status is waitpid's status of mpirun, or exit status
 * 70 when the watch ended the job. Returns 0, or -1 when mpirun could not
 * be started (the message printed). */
int dt_job_run_watched(const char *path, char **argv, double end_timeout_s, int *status);

#ifdef __cplusplus
}
#endif
#endif
