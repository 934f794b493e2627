/* The default CPU thread count of train and bench. OpenMP threads that
 * busy-wait at every barrier are 10-20x slower than one thread when the
 * cores are shared with other busy processes (another build, another job):
 * a waiting thread spins on a core the thread it waits for needs. So when
 * neither --threads nor DT_NUM_THREADS chose, and this is the only rank on
 * its host, dtrain measures how much of its cores it can actually get: one
 * spinning thread per core for about 40 ms, each thread's CPU time over the
 * wall time. All of it free: one thread per core; otherwise the whole cores
 * that are free, at least one. The header says what was chosen and why
 * ("threads 1 (auto: 1.0 of 2 cores free)").
 */
#ifndef DT_LAUNCH_THREADS_H
#define DT_LAUNCH_THREADS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Cores this process may run on (sched_getaffinity). */
int dt_threads_cores(void);

/* The cores' worth of CPU time a busy thread per core gets now, in
 * [0, cores]: cores on an idle machine, about 1.0 of 2 with two busy
 * processes beside it. Takes about `ms` milliseconds. */
double dt_threads_free_cores(int cores, int ms);

/* The thread count for `free` of `cores` cores (the rule above). */
int dt_threads_for_free_cores(double free, int cores);

/* Unless DT_NUM_THREADS is set or local_ranks > 1 (the cores are then
 * shared out among the ranks): probes and sets the CPU backend's thread
 * count (dt_cpu_set_num_threads), keeping the reason for dt_threads_note.
 * Call when --threads was not given. */
void dt_threads_choose_default(int local_ranks);

/* " (auto: 1.0 of 2 cores free)" after dt_threads_choose_default, else ""
 * (the count was given, or shared out among local ranks). */
const char *dt_threads_note(void);

#ifdef __cplusplus
}
#endif
#endif
