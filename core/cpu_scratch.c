/* Kernel scratch of the CPU backend (core/cpu_internal.h): a pool of host
 * buffers shared by every thread. A kernel takes one for the length of a
 * call and gives it back, so steady-state training reuses the same
 * buffers without page faults; concurrent callers (the replicas of the
 * data-parallel mode, a DDP rank's threads) each get their own. Buffers
 * not in use are freed by dt_empty_cache. */
#include <pthread.h>
#include <stdlib.h>

#include "core/cpu_internal.h"

#define SCRATCH_ALIGN 64

struct dt_cpu_scratch {
  void *data;
  size_t cap;
  struct dt_cpu_scratch *next; /* in the idle list */
};

static pthread_mutex_t scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_cpu_scratch *scratch_idle;

dt_status dt_cpu_scratch_acquire(size_t bytes, dt_cpu_scratch **out, void **data) {
  *out = NULL;
  *data = NULL;
  size_t want = (bytes < SCRATCH_ALIGN ? SCRATCH_ALIGN : bytes + SCRATCH_ALIGN - 1) /
                SCRATCH_ALIGN * SCRATCH_ALIGN;
  /* the smallest idle buffer that is large enough, else the largest one
   * (grown below), else a new one */
  pthread_mutex_lock(&scratch_lock);
  dt_cpu_scratch **best = NULL;
  for (dt_cpu_scratch **p = &scratch_idle; *p; p = &(*p)->next) {
    size_t cap = (*p)->cap, best_cap = best ? (*best)->cap : 0;
    if (!best || (best_cap >= want ? cap >= want && cap < best_cap : cap > best_cap))
      best = p;
  }
  dt_cpu_scratch *s = NULL;
  if (best) {
    s = *best;
    *best = s->next;
  }
  pthread_mutex_unlock(&scratch_lock);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s)
      return DT_ERROR(DT_ERR_OOM, "cpu scratch: malloc of %zu bytes failed: free host memory",
                      sizeof *s);
  }
  if (s->cap < want) {
    free(s->data);
    s->data = aligned_alloc(SCRATCH_ALIGN, want);
    s->cap = s->data ? want : 0;
    if (!s->data) {
      free(s);
      return DT_ERROR(DT_ERR_OOM,
                      "cpu scratch: %zu bytes for a kernel's workspace: malloc failed: free "
                      "host memory or use a smaller batch",
                      want);
    }
  }
  s->next = NULL;
  *out = s;
  *data = s->data;
  return DT_OK;
}

void dt_cpu_scratch_release(dt_cpu_scratch *s) {
  if (!s)
    return;
  pthread_mutex_lock(&scratch_lock);
  s->next = scratch_idle;
  scratch_idle = s;
  pthread_mutex_unlock(&scratch_lock);
}

void dt_cpu_scratch_free_idle(void) {
  pthread_mutex_lock(&scratch_lock);
  dt_cpu_scratch *s = scratch_idle;
  scratch_idle = NULL;
  pthread_mutex_unlock(&scratch_lock);
  while (s) {
    dt_cpu_scratch *next = s->next;
    free(s->data);
    free(s);
    s = next;
  }
}
