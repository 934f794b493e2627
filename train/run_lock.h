/* One run per run directory: a run owns its directory through a lock on
 * <dir>/run.lock, taken before it writes anything there (config.json,
 * train.log, metrics.jsonl, checkpoints/) and held to its last write.
 *
 *   dt_train_run_lock *lock = NULL;
 *   dt_status st = dt_train_run_lock_acquire("runs/a", &lock);
 *   // DT_ERR_STATE: "run directory runs/a is in use by another run: pid
 *   // 4242 on host node07 (since ...)"
 *   ...
 *   dt_train_run_lock_release(lock);
 *
 * The lock is flock(2) on the file, which the kernel drops when the
 * process ends however it ends (SIGKILL, a crash, a lost rank killed by
 * mpirun), so a killed run never leaves its directory blocked: a leftover
 * run.lock (a dead process's record) is taken over. The file also holds
 * the holder's record (its pid, host and start), for the refusal's
 * message; the record is cleared when the lock is released, so a record
 * found by the next holder tells that the run before it did not end
 * cleanly (dt_train_run_lock_note).
 *
 * Ranks of one job: rank 0 holds the lock for the job
 * (dt_train_run_lock_acquire_job) and every rank learns the outcome, so a
 * refused job ends on every rank with the same message; ranks that write
 * into the directory themselves (optimizer shards) check that the lock
 * file they see is their rank 0's.
 *
 * Across nodes (a run directory on a shared file system): where the file
 * system's locks are coherent across clients (NFSv3 with lockd and NFSv4,
 * on which Linux implements flock as a whole-file POSIX lock; GPFS; Lustre
 * mounted with -o flock; CephFS) a run on another node is refused too. A
 * holder's node that dies releases its lock when the server's lease
 * expires (NFSv4: about 90 s), not at once. Where locks stay on one node
 * (Lustre -o localflock, NFS -o local_lock=flock or all, BeeGFS without
 * global locks) only runs on the same node are kept apart; where the
 * file system has no locks at all the run goes on unlocked, with a note
 * saying so. */
#ifndef DT_TRAIN_RUN_LOCK_H
#define DT_TRAIN_RUN_LOCK_H

#include <stdbool.h>

#include "core/device.h"
#include "core/status.h"
#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The lock file's name in the run directory. */
#define DT_TRAIN_RUN_LOCK_FILE "run.lock"

typedef struct dt_train_run_lock dt_train_run_lock;

/* Takes the lock of run directory `dir` for this process (creating `dir`
 * when it is missing) and writes this process's record into it; never
 * waits. Another live holder (another process, or another handle of this
 * one) is DT_ERR_STATE naming `dir`, the holder's pid and host and the
 * lock file; a directory or lock file that cannot be created or opened is
 * DT_ERR_IO naming it. Release with dt_train_run_lock_release. */
dt_status dt_train_run_lock_acquire(const char *dir, dt_train_run_lock **out);

/* The lock of a job's run directory (collective over `comm`, NULL = one
 * process): rank 0 takes it (dt_train_run_lock_acquire; *out is set on
 * rank 0 only) and every rank returns its outcome, rank 0's message on
 * every rank. `others_write` (the same on every rank): ranks other than 0
 * write into `dir` too, and each checks that the lock file it sees holds
 * rank 0's record: one that does not (another file system, another
 * directory) fails every rank, naming the rank. `dev`: the rank's device
 * (an nccl communicator moves device memory only). */
dt_status dt_train_run_lock_acquire_job(const char *dir, dt_comm *comm, dt_device dev, int rank,
                                        bool others_write, dt_train_run_lock **out);

/* A line for the run's log, "" = none: the previous holder's record when
 * it did not release the lock (it was killed, or its node failed), or that
 * the file system takes no locks. */
const char *dt_train_run_lock_note(const dt_train_run_lock *lock);

/* Clears the record and releases the lock. NULL is a no-op. */
void dt_train_run_lock_release(dt_train_run_lock *lock);

#ifdef __cplusplus
}
#endif
#endif
