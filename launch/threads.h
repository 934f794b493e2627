/* The default CPU thread count of train and bench, and what dtrain settles
 * before the libraries start (launch/preinit.c).
 *
 * OpenMP threads that busy-wait at every barrier were 10-20x slower than
 * one thread when the cores were shared with other busy processes: a
 * waiting thread spun on a core the thread it waited for needed. A 40 ms
 * probe of the free cores at start-up avoided that but flapped on a shared
 * host (1 or 2 threads on an idle 2-core machine, half the speed a third of
 * the time). Now a waiting thread spins only briefly (GOMP_SPINCOUNT, set
 * before libgomp starts unless the user chose a policy) and then sleeps,
 * so contention cannot collapse a run, and the default is every core: one
 * thread per core for the only rank on its host, the cores shared out
 * among the ranks of a host otherwise. --threads and DT_NUM_THREADS
 * override it. The header says what was chosen ("threads 2 (auto: every
 * core)").
 */
#ifndef DT_LAUNCH_THREADS_H
#define DT_LAUNCH_THREADS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Cores this process may run on (sched_getaffinity). */
int dt_threads_cores(void);

/* The default thread count: cores / local_ranks, at least 1. */
int dt_threads_for(int cores, int local_ranks);

/* Unless DT_NUM_THREADS is set: sets the CPU backend's thread count to
 * dt_threads_for(cores, local_ranks) (dt_cpu_set_num_threads), keeping the
 * reason for dt_threads_note. Call when --threads was not given. */
void dt_threads_choose_default(int local_ranks);

/* " (auto: every core)" after dt_threads_choose_default chose for the only
 * rank on its host, else "" (the count was given, or shared out among the
 * local ranks). */
const char *dt_threads_note(void);

/* libgomp's spin before a waiting thread sleeps, in iterations (its
 * default, 300000, is some hundreds of microseconds). */
#define DT_THREADS_SPINCOUNT "1000"

/* The GOMP_SPINCOUNT dtrain sets before libgomp starts, given the user's
 * OMP_WAIT_POLICY and GOMP_SPINCOUNT (NULL when unset): NULL when the user
 * chose either, else DT_THREADS_SPINCOUNT. */
const char *dt_threads_spincount(const char *wait_policy, const char *spincount);

#ifdef __cplusplus
}
#endif
#endif
