/* The CPU reference backend: host memory with per-device accounting and an
 * optional cap, synchronous streams and events, thread settings, and the
 * dt_backend_ops table assembled from the cpu_kernels_*.c files. */
#define _GNU_SOURCE
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/cpu_internal.h"
#include "core/env.h"
#include "core/memory.h"

/* ---- settings from the environment (read once, here) ---- */

static pthread_once_t cpu_env_once = PTHREAD_ONCE_INIT;
static atomic_int cpu_num_threads = 1;
static atomic_size_t cpu_memory_limit = 0;
/* Without DT_CPU_MEMORY_LIMIT: the default cap (core/cpu.h), on the live
 * tensors of all CPU devices together, from the figures read at start-up;
 * re-derived when the thread count (OpenBLAS's buffers) changes. */
static atomic_bool cpu_limit_is_default = false;
static dt_host_memory cpu_host;
static int cpu_blas_buffers_mapped; /* OpenBLAS's pool at start-up */
static char cpu_limit_source[192] = "no cap";
/* The allocator's block cache (see "memory" below); DT_CPU_ALLOC_CACHE=0
 * turns it off so that ASan / valgrind see every free. Off by default under
 * AddressSanitizer. */
#if defined(__SANITIZE_ADDRESS__)
static atomic_int cpu_cache_enabled = 0;
#else
static atomic_int cpu_cache_enabled = 1;
#endif
/* A DT_CPU_MEMORY_LIMIT that does not parse makes every allocation fail with
 * this text, rather than being silently ignored. */
static char cpu_limit_env_error[256];

static int cpu_cores_available(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0)
      return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void cpu_set_default_limit(int threads) {
  dt_host_memory_cap cap =
      dt_host_memory_default_cap(&cpu_host, dt_host_blas_reserve(threads, cpu_blas_buffers_mapped));
  atomic_store(&cpu_memory_limit, cap.bytes);
  dt_host_memory_cap_describe(&cap, cpu_limit_source, sizeof cpu_limit_source);
}

/* Under an address-space limit, OpenBLAS retries a buffer it cannot map
 * for ever: run no more threads than its buffers fit. */
static void cpu_apply_threads(int n) {
  static int warned_for; /* say it once per count asked for */
  int fit = dt_host_blas_threads_fitting(&cpu_host, n, cpu_blas_buffers_mapped);
  if (fit < n && warned_for != n) {
    warned_for = n;
    char room[32];
    fprintf(stderr,
            "dtrain: the address-space limit (ulimit -v / -d) leaves %s: room for OpenBLAS's "
            "buffers (%zu MiB per thread, twice) of %d thread%s, not %d: using %d\n",
            dt_format_bytes(dt_host_address_room(&cpu_host), room, sizeof room),
            DT_HOST_BLAS_BUFFER_BYTES >> 20, fit, fit == 1 ? "" : "s", n, fit);
  }
  n = fit;
  if (atomic_load(&cpu_limit_is_default))
    cpu_set_default_limit(n);
  atomic_store(&cpu_num_threads, n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

static void cpu_read_env(void) {
  dt_cpu_blas_choose_kernels();
  dt_host_memory_read(&cpu_host);
  cpu_blas_buffers_mapped = openblas_get_num_threads();
  size_t limit = 0;
  if (!dt_env_is_set(DT_ENV_CPU_MEMORY_LIMIT)) {
    atomic_store(&cpu_limit_is_default, true);
  } else if (dt_env_bytes(DT_ENV_CPU_MEMORY_LIMIT, &limit) == DT_OK) {
    atomic_store(&cpu_memory_limit, limit);
    snprintf(cpu_limit_source, sizeof cpu_limit_source, "DT_CPU_MEMORY_LIMIT");
  } else {
    snprintf(cpu_limit_env_error, sizeof cpu_limit_env_error, "%s", dt_last_error());
  }

  int64_t threads = cpu_cores_available();
  if (dt_env_int(DT_ENV_NUM_THREADS, &threads) != DT_OK)
    fprintf(stderr, "dtrain: %s; using %lld (the cores available to this process)\n",
            dt_last_error(), (long long)threads);
  cpu_apply_threads((int)threads);

  bool cache = atomic_load(&cpu_cache_enabled);
  if (dt_env_is_set(DT_ENV_CPU_ALLOC_CACHE) && dt_env_bool(DT_ENV_CPU_ALLOC_CACHE, &cache) == DT_OK)
    atomic_store(&cpu_cache_enabled, cache);
}

static void cpu_init(void) { pthread_once(&cpu_env_once, cpu_read_env); }

int dt_cpu_threads(void) {
  cpu_init();
  return atomic_load_explicit(&cpu_num_threads, memory_order_relaxed);
}

void dt_cpu_set_num_threads(int n) {
  cpu_init();
  if (n < 1)
    n = cpu_cores_available();
  if (n > DT_CPU_MAX_THREADS)
    n = DT_CPU_MAX_THREADS;
  cpu_apply_threads(n);
}

int dt_cpu_num_threads(void) { return dt_cpu_threads(); }

void dt_cpu_set_memory_limit(size_t bytes) {
  cpu_init();
  atomic_store(&cpu_limit_is_default, false);
  atomic_store(&cpu_memory_limit, bytes);
  snprintf(cpu_limit_source, sizeof cpu_limit_source, "%s",
           bytes ? "set by the program" : "no cap");
  cpu_limit_env_error[0] = '\0'; /* an explicit setting overrides a bad env value */
}

const char *dt_cpu_memory_limit_source(void) {
  cpu_init();
  return cpu_limit_source;
}

/* ---- memory ----
 *
 * A per-device cache of freed blocks in size classes (8 per power of two
 * above 1 KiB, so a block wastes at most 1/8 of its size): steady-state
 * training frees and re-allocates the same sizes every step, and handing
 * them back to malloc makes glibc return large blocks to the kernel and
 * page-fault them in again. `allocated` counts the bytes of live tensors as
 * requested (the cap applies to it); `reserved` counts the class sizes of
 * live and cached blocks. A cache hit still counts in num_allocs. */

typedef struct cpu_mem_stats {
  size_t allocated;
  size_t reserved;
  size_t cached;
  size_t peak;
  uint64_t num_allocs;
  uint64_t num_ooms;
} cpu_mem_stats;

#define CPU_ALIGN 64
#define CPU_SMALL_CLASSES 16                  /* 64 B .. 1 KiB in 64 B steps */
#define CPU_CLASS_STEPS 8                     /* classes per power of two above 1 KiB */
#define CPU_CACHE_MAX_BLOCK ((size_t)1 << 28) /* larger blocks go back to the system */
#define CPU_CACHE_MAX_BYTES ((size_t)1 << 30) /* cap on cached bytes per device */
#define CPU_NUM_CLASSES (CPU_SMALL_CLASSES + (28 - 10) * CPU_CLASS_STEPS)

/* A cached block stores the next pointer of its class list in itself. */
typedef struct cpu_free_block {
  struct cpu_free_block *next;
} cpu_free_block;

static pthread_mutex_t cpu_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static cpu_mem_stats cpu_mem[DT_CPU_MAX_DEVICES];
static size_t cpu_allocated_all; /* the sum of the devices' allocated */
static cpu_free_block *cpu_free_lists[DT_CPU_MAX_DEVICES][CPU_NUM_CLASSES];

/* Size class of a request: the rounded block size, and its class index
 * (-1 for blocks too large to cache). */
static size_t cpu_block_size(size_t bytes, int *cls) {
  size_t s = bytes < CPU_ALIGN ? CPU_ALIGN : bytes;
  if (s <= (size_t)CPU_SMALL_CLASSES * CPU_ALIGN) {
    size_t size = (s + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    *cls = (int)(size / CPU_ALIGN) - 1;
    return size;
  }
  int k = 63 - __builtin_clzll((unsigned long long)(s - 1)); /* s in (2^k, 2^(k+1)] */
  size_t step = (size_t)1 << (k - 3);
  size_t size = (s + step - 1) / step * step;
  if (size > CPU_CACHE_MAX_BLOCK || size < s) {
    *cls = -1;
    return (s + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
  }
  *cls =
      CPU_SMALL_CLASSES + (k - 10) * CPU_CLASS_STEPS + (int)((size - ((size_t)1 << k)) / step) - 1;
  return size;
}

/* Frees every cached block of a device; call with cpu_mem_lock held. */
static void cpu_cache_release_locked(int dev_index) {
  cpu_mem_stats *st = &cpu_mem[dev_index];
  for (int c = 0; c < CPU_NUM_CLASSES; c++) {
    cpu_free_block *b = cpu_free_lists[dev_index][c];
    while (b) {
      cpu_free_block *next = b->next;
      free(b);
      b = next;
    }
    cpu_free_lists[dev_index][c] = NULL;
  }
  st->reserved -= st->cached;
  st->cached = 0;
}

static dt_status cpu_check_device(const char *what, dt_device dev) {
  if (dev.type != DT_DEVICE_CPU || dev.index < 0 || dev.index >= DT_CPU_MAX_DEVICES) {
    char buf[32];
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: device %s is not a CPU device cpu:0..cpu:%d", what,
                    dt_device_format(dev, buf, sizeof buf), DT_CPU_MAX_DEVICES - 1);
  }
  return DT_OK;
}

/* The out-of-memory text, in PyTorch's spirit: what was asked, where, what
 * is held, the cap, and what to do. */
static void cpu_oom_message(char *buf, size_t cap_len, dt_device dev, size_t bytes,
                            size_t allocated, size_t limit, bool whole, const char *why) {
  char req[32], al[32], cap[32], held[48];
  dt_format_bytes(bytes, req, sizeof req);
  dt_format_bytes(allocated, al, sizeof al);
  if (limit)
    dt_format_bytes(limit, cap, sizeof cap);
  else
    snprintf(cap, sizeof cap, "none");
  if (whole)
    snprintf(held, sizeof held, "the CPU devices have");
  else
    snprintf(held, sizeof held, "cpu:%d has", dev.index);
  snprintf(buf, cap_len,
           "CPU out of memory: tried to allocate %s (%zu bytes) on cpu:%d (%s); %s %s allocated, "
           "cap %s (%s%s): reduce the batch size / use gradient accumulation (--accum), or raise "
           "DT_CPU_MEMORY_LIMIT",
           req, bytes, dev.index, why, held, al, cap, cpu_limit_source,
           whole ? "; DT_CPU_MEMORY_LIMIT sets another" : "");
}

static dt_status cpu_alloc(dt_device dev, size_t bytes, void **out) {
  *out = NULL;
  DT_CHECK(cpu_check_device("cpu alloc", dev));
  cpu_init();
  if (cpu_limit_env_error[0])
    return DT_ERROR(DT_ERR_INVALID_ARG, "cpu alloc of %zu bytes on cpu:%d: %s", bytes, dev.index,
                    cpu_limit_env_error);
  size_t limit = atomic_load(&cpu_memory_limit);
  cpu_mem_stats *st = &cpu_mem[dev.index];
  int cls;
  size_t size = cpu_block_size(bytes, &cls);
  int use_cache = atomic_load_explicit(&cpu_cache_enabled, memory_order_relaxed);

  /* Reserve first so that concurrent allocations cannot both pass the cap. */
  pthread_mutex_lock(&cpu_mem_lock);
  bool whole = atomic_load(&cpu_limit_is_default); /* the default caps all devices together */
  size_t allocated = whole ? cpu_allocated_all : st->allocated;
  if (limit && (bytes > limit || allocated > limit - bytes)) {
    st->num_ooms++;
    pthread_mutex_unlock(&cpu_mem_lock);
    char msg[768];
    cpu_oom_message(msg, sizeof msg, dev, bytes, allocated, limit, whole, "over the cap");
    return DT_ERROR(DT_ERR_OOM, "%s", msg);
  }
  st->allocated += bytes;
  cpu_allocated_all += bytes;
  void *p = NULL;
  if (cls >= 0 && cpu_free_lists[dev.index][cls]) {
    cpu_free_block *b = cpu_free_lists[dev.index][cls];
    cpu_free_lists[dev.index][cls] = b->next;
    st->cached -= size;
    p = b;
  } else {
    /* Under a cap, cached blocks must not keep the process above it. */
    if (limit && st->cached && st->reserved + size > limit)
      cpu_cache_release_locked(dev.index);
    st->reserved += size;
  }
  pthread_mutex_unlock(&cpu_mem_lock);

  if (!p && size >= bytes) {
    p = aligned_alloc(CPU_ALIGN, size);
    if (!p && use_cache) { /* give the cache back and try once more */
      pthread_mutex_lock(&cpu_mem_lock);
      cpu_cache_release_locked(dev.index);
      pthread_mutex_unlock(&cpu_mem_lock);
      p = aligned_alloc(CPU_ALIGN, size);
    }
  }

  pthread_mutex_lock(&cpu_mem_lock);
  if (!p) {
    st->allocated -= bytes;
    cpu_allocated_all -= bytes;
    st->reserved -= size;
    st->num_ooms++;
    allocated = st->allocated;
    pthread_mutex_unlock(&cpu_mem_lock);
    char msg[768];
    cpu_oom_message(msg, sizeof msg, dev, bytes, allocated, limit, false, "malloc failed");
    return DT_ERROR(DT_ERR_OOM, "%s", msg);
  }
  if (st->allocated > st->peak)
    st->peak = st->allocated;
  st->num_allocs++;
  pthread_mutex_unlock(&cpu_mem_lock);
  *out = p;
  return DT_OK;
}

static void cpu_free(dt_device dev, void *ptr, size_t bytes) {
  if (!ptr)
    return;
  if (dev.index < 0 || dev.index >= DT_CPU_MAX_DEVICES) {
    free(ptr);
    return;
  }
  int cls;
  size_t size = cpu_block_size(bytes, &cls);
  int keep = cls >= 0 && atomic_load_explicit(&cpu_cache_enabled, memory_order_relaxed);
  pthread_mutex_lock(&cpu_mem_lock);
  cpu_mem_stats *st = &cpu_mem[dev.index];
  size_t freed = st->allocated >= bytes ? bytes : st->allocated;
  st->allocated -= freed;
  cpu_allocated_all -= freed;
  if (keep && st->cached + size <= CPU_CACHE_MAX_BYTES) {
    cpu_free_block *b = ptr;
    b->next = cpu_free_lists[dev.index][cls];
    cpu_free_lists[dev.index][cls] = b;
    st->cached += size;
    ptr = NULL;
  } else {
    st->reserved = st->reserved >= size ? st->reserved - size : 0;
  }
  pthread_mutex_unlock(&cpu_mem_lock);
  free(ptr);
}

static dt_status cpu_memory_stats(dt_device dev, dt_memory_stats *out) {
  DT_CHECK(cpu_check_device("cpu memory_stats", dev));
  cpu_init();
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&cpu_mem_lock);
  const cpu_mem_stats *st = &cpu_mem[dev.index];
  out->allocated = st->allocated;
  out->reserved = st->reserved > st->allocated ? st->reserved : st->allocated;
  out->peak_allocated = st->peak;
  out->num_allocs = st->num_allocs;
  out->num_ooms = st->num_ooms;
  pthread_mutex_unlock(&cpu_mem_lock);
  out->limit = atomic_load(&cpu_memory_limit);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  out->capacity = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
  return DT_OK;
}

static dt_status cpu_empty_cache(dt_device dev) {
  DT_CHECK(cpu_check_device("cpu empty_cache", dev));
  pthread_mutex_lock(&cpu_mem_lock);
  cpu_cache_release_locked(dev.index);
  pthread_mutex_unlock(&cpu_mem_lock);
  dt_cpu_scratch_free_idle(); /* host scratch is one pool for every CPU device */
  return DT_OK;
}

static dt_status cpu_reset_peak_stats(dt_device dev) {
  DT_CHECK(cpu_check_device("cpu reset_peak_stats", dev));
  pthread_mutex_lock(&cpu_mem_lock);
  cpu_mem[dev.index].peak = cpu_mem[dev.index].allocated;
  pthread_mutex_unlock(&cpu_mem_lock);
  return DT_OK;
}

#define CPU_COPY_CHUNK ((size_t)1 << 22)

static dt_status cpu_copy(void *dst, dt_device dst_dev, const void *src, dt_device src_dev,
                          size_t bytes, dt_stream *stream) {
  (void)stream;
  if (dst_dev.type != DT_DEVICE_CPU || src_dev.type != DT_DEVICE_CPU) {
    char a[32], b[32];
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                    "cpu copy: %s -> %s involves a non-CPU device: copy through that "
                    "device's backend",
                    dt_device_format(src_dev, a, sizeof a), dt_device_format(dst_dev, b, sizeof b));
  }
  if (bytes == 0 || dst == src)
    return DT_OK;
  const char *s = (const char *)src;
  char *d = (char *)dst;
  if ((d + bytes <= s || s + bytes <= d) && bytes >= 4 * CPU_COPY_CHUNK) {
    int64_t chunks = (int64_t)((bytes + CPU_COPY_CHUNK - 1) / CPU_COPY_CHUNK);
#pragma omp parallel for num_threads(dt_cpu_threads())
    for (int64_t i = 0; i < chunks; i++) {
      size_t off = (size_t)i * CPU_COPY_CHUNK;
      size_t len = bytes - off < CPU_COPY_CHUNK ? bytes - off : CPU_COPY_CHUNK;
      memcpy(d + off, s + off, len);
    }
    return DT_OK;
  }
  memmove(dst, src, bytes);
  return DT_OK;
}

/* Large buffers (zero_grad's whole gradient arena: 45 MB for ResNet-18)
 * in one slice per thread: one core's stores did not reach the memory's
 * bandwidth. */
#define MEMSET_SLICE_MIN ((size_t)4 << 20)

static dt_status cpu_memset_zero(dt_device dev, void *ptr, size_t bytes) {
  (void)dev;
  int nt = dt_cpu_threads();
  if (bytes < 2 * MEMSET_SLICE_MIN || nt <= 1) {
    if (bytes)
      memset(ptr, 0, bytes);
    return DT_OK;
  }
  size_t parts = bytes / MEMSET_SLICE_MIN < (size_t)nt ? bytes / MEMSET_SLICE_MIN : (size_t)nt;
#pragma omp parallel for num_threads((int)parts) schedule(static)
  for (size_t t = 0; t < parts; t++) {
    size_t lo = bytes * t / parts / 64 * 64,
           hi = t + 1 == parts ? bytes : bytes * (t + 1) / parts / 64 * 64;
    memset((char *)ptr + lo, 0, hi - lo);
  }
  return DT_OK;
}

/* ---- devices, streams and events: the CPU runs everything synchronously ---- */

static int cpu_device_count(void) { return DT_CPU_MAX_DEVICES; }

/* Distinct addresses per kind; never dereferenced. */
static char cpu_stream_tokens[3];

static dt_stream *cpu_stream(dt_device dev, dt_stream_kind kind) {
  (void)dev;
  int k = (int)kind >= 0 && (int)kind < 3 ? (int)kind : 0;
  return (dt_stream *)&cpu_stream_tokens[k];
}

static dt_status cpu_event_create(dt_device dev, dt_event **out) {
  (void)dev;
  void *ev = malloc(1);
  if (!ev)
    return DT_ERROR(DT_ERR_OOM, "cpu event_create: malloc of 1 byte failed: free host memory");
  *out = (dt_event *)ev;
  return DT_OK;
}

static void cpu_event_destroy(dt_event *ev) { free(ev); }

static dt_status cpu_event_record(dt_event *ev, dt_stream *s) {
  (void)ev;
  (void)s;
  return DT_OK;
}

static dt_status cpu_stream_wait_event(dt_stream *s, dt_event *ev) {
  (void)ev;
  (void)s;
  return DT_OK;
}

static dt_status cpu_event_synchronize(dt_event *ev) {
  (void)ev;
  return DT_OK;
}

static dt_status cpu_stream_synchronize(dt_stream *s) {
  (void)s;
  return DT_OK;
}

static dt_status cpu_device_synchronize(dt_device dev) {
  (void)dev;
  return DT_OK;
}

/* ---- the table ---- */

static const dt_backend_ops cpu_ops = {
    .name = "cpu",
    .device_count = cpu_device_count,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .memory_stats = cpu_memory_stats,
    .empty_cache = cpu_empty_cache,
    .reset_peak_stats = cpu_reset_peak_stats,
    .stream = cpu_stream,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .stream_synchronize = cpu_stream_synchronize,
    .device_synchronize = cpu_device_synchronize,
#define DT_KERNEL(name, dtypes, check, params, args) .name = dt_cpu_##name,
#include "core/op_table.def"
};

const dt_backend_ops *dt_cpu_backend(void) {
  cpu_init();
  return &cpu_ops;
}

/* Linked in (alwayslink), the CPU backend is always there: registering does
 * not touch the environment (cpu_init runs on first use). */
__attribute__((constructor)) static void dt_cpu_register_backend(void) {
  dt_backend_register(DT_DEVICE_CPU, &cpu_ops);
}
