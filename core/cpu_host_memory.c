/* The memory this process may use and the CPU allocator's default cap
 * (core/cpu.h: dt_host_memory). Reading the figures is kept apart from the
 * derivation, a pure function of them, so that every source can be tested
 * with figures of its own. */
#define _GNU_SOURCE
#include <ctype.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/cpu.h"
#include "core/memory.h"

/* Reads a small text file (a /proc or /sys file) into buf with read(2),
 * which works before stdio's users have started; false when it cannot. */
static bool read_text(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  size_t used = 0;
  ssize_t n;
  while (used + 1 < cap && (n = read(fd, buf + used, cap - 1 - used)) > 0)
    used += (size_t)n;
  close(fd);
  buf[used] = '\0';
  return used > 0;
}

bool dt_host_memory_field(const char *text, const char *key, size_t *out) {
  size_t klen = strlen(key);
  for (const char *line = text; line && *line;
       line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    if (strncmp(line, key, klen) != 0 || !isspace((unsigned char)line[klen]))
      continue;
    const char *p = line + klen;
    while (*p == ' ' || *p == '\t')
      p++;
    if (!isdigit((unsigned char)*p))
      return false;
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    while (*end == ' ' || *end == '\t')
      end++;
    bool kb = (end[0] == 'k' || end[0] == 'K') && end[1] == 'B';
    if (kb && v > SIZE_MAX / 1024)
      v = SIZE_MAX / 1024;
    *out = kb ? (size_t)v * 1024 : (size_t)v;
    return true;
  }
  return false;
}

/* A number file such as memory.max: false for "max", a missing file, or a
 * value of 2^62 or more (cgroup v1's "no limit" is 2^63 less a page). */
static bool read_limit(const char *dir, const char *name, size_t *out) {
  char path[PATH_MAX], text[64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!read_text(path, text, sizeof text) || !isdigit((unsigned char)text[0]))
    return false;
  unsigned long long v = strtoull(text, NULL, 10);
  if (v >= (1ULL << 62))
    return false;
  *out = (size_t)v;
  return true;
}

typedef struct cgroup_files {
  const char *limit, *usage, *cache; /* the cache: a memory.stat field */
} cgroup_files;

static const cgroup_files cgroup_v2 = {"memory.max", "memory.current", "file"};
static const cgroup_files cgroup_v1 = {"memory.limit_in_bytes", "memory.usage_in_bytes",
                                       "total_cache"};

/* From dir up to root (the mount point), the level whose limit leaves the
 * least room; its limit and its usage less page cache into out. */
static void read_cgroup_levels(const char *root, const char *rel, const cgroup_files *f,
                               dt_host_memory *out) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s%s", root, rel);
  size_t root_len = strlen(root), best_room = SIZE_MAX;
  for (;;) {
    size_t limit = 0, usage = 0, cache = 0;
    if (read_limit(dir, f->limit, &limit)) {
      char path[PATH_MAX], stat[8192];
      read_limit(dir, f->usage, &usage);
      snprintf(path, sizeof path, "%s/memory.stat", dir);
      if (read_text(path, stat, sizeof stat))
        dt_host_memory_field(stat, f->cache, &cache);
      size_t used = usage > cache ? usage - cache : 0;
      size_t room = limit > used ? limit - used : 0;
      if (room < best_room) {
        best_room = room;
        out->cgroup_limit = limit;
        out->cgroup_used = used;
      }
    }
    char *slash = strrchr(dir, '/');
    if (!slash || (size_t)(slash - dir) < root_len)
      break;
    *slash = '\0';
  }
}

/* /proc/self/cgroup: "0::/path" (v2) or "N:a,memory,b:/path" (v1). */
static void read_cgroup(dt_host_memory *out) {
  char text[4096];
  if (!read_text("/proc/self/cgroup", text, sizeof text))
    return;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    *c2 = '\0';
    const char *controllers = c1 + 1, *rel = c2 + 1;
    char probe[PATH_MAX];
    if (!controllers[0]) {
      if (access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0)
        read_cgroup_levels("/sys/fs/cgroup", rel, &cgroup_v2, out);
      continue;
    }
    snprintf(probe, sizeof probe, ",%s,", controllers);
    if (strstr(probe, ",memory,"))
      read_cgroup_levels("/sys/fs/cgroup/memory", rel, &cgroup_v1, out);
  }
}

static size_t rlimit_bytes(int resource) {
  struct rlimit rl;
  if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return 0;
  return rl.rlim_cur > SIZE_MAX ? 0 : (size_t)rl.rlim_cur;
}

void dt_host_memory_read_rlimits(dt_host_memory *out) {
  memset(out, 0, sizeof *out);
  out->as_limit = rlimit_bytes(RLIMIT_AS);
  out->data_limit = rlimit_bytes(RLIMIT_DATA);
  char status[8192];
  if ((out->as_limit || out->data_limit) && read_text("/proc/self/status", status, sizeof status)) {
    dt_host_memory_field(status, "VmSize:", &out->as_used);
    dt_host_memory_field(status, "VmData:", &out->data_used);
  }
}

void dt_host_memory_read(dt_host_memory *out) {
  dt_host_memory_read_rlimits(out);
  char meminfo[8192];
  if (read_text("/proc/meminfo", meminfo, sizeof meminfo))
    dt_host_memory_field(meminfo, "MemAvailable:", &out->mem_available);
  read_cgroup(out);
}

static size_t room_under(size_t limit, size_t used, size_t reserve) {
  if (!limit)
    return SIZE_MAX;
  size_t taken = used > SIZE_MAX - reserve ? SIZE_MAX : used + reserve;
  return limit > taken ? limit - taken : 0;
}

size_t dt_host_address_room(const dt_host_memory *m) {
  size_t as = room_under(m->as_limit, m->as_used, 0),
         data = room_under(m->data_limit, m->data_used, 0);
  return as < data ? as : data;
}

size_t dt_host_blas_reserve(int threads, int mapped) {
  int buffers = 2 * (threads > 0 ? threads : 1) - (mapped > 0 ? mapped : 0);
  return buffers > 0 ? (size_t)buffers * DT_HOST_BLAS_BUFFER_BYTES : 0;
}

int dt_host_blas_pool(const char *omp_num_threads, long cpus) {
  long n = omp_num_threads ? strtol(omp_num_threads, NULL, 10) : 0;
  if (n <= 0)
    n = cpus;
  return n < 1 ? 1 : n > DT_CPU_MAX_THREADS ? DT_CPU_MAX_THREADS : (int)n;
}

size_t dt_host_blas_room_needed(int pool) {
  return (size_t)(pool + 1) * DT_HOST_BLAS_BUFFER_BYTES + DT_HOST_MIN_ROOM;
}

int dt_host_blas_threads_fitting(const dt_host_memory *m, int want, int mapped) {
  size_t room = dt_host_address_room(m);
  int n = want > 1 ? want : 1;
  if (room == SIZE_MAX)
    return n;
  while (n > 1 && dt_host_blas_reserve(n, mapped) + DT_HOST_MIN_ROOM > room)
    n--;
  return n;
}

dt_host_memory_cap dt_host_memory_default_cap(const dt_host_memory *m, size_t address_reserve) {
  dt_host_memory_cap c = {0, SIZE_MAX, DT_HOST_CAP_NONE};
  const struct {
    dt_host_cap_source source;
    size_t room;
  } rooms[] = {
      {DT_HOST_CAP_CGROUP, room_under(m->cgroup_limit, m->cgroup_used, 0)},
      {DT_HOST_CAP_MEM_AVAILABLE, m->mem_available ? m->mem_available : SIZE_MAX},
      {DT_HOST_CAP_RLIMIT_AS, room_under(m->as_limit, m->as_used, address_reserve)},
      {DT_HOST_CAP_RLIMIT_DATA, room_under(m->data_limit, m->data_used, address_reserve)},
  };
  for (size_t i = 0; i < sizeof rooms / sizeof rooms[0]; i++)
    if (rooms[i].room < c.room) {
      c.room = rooms[i].room;
      c.source = rooms[i].source;
    }
  if (c.source == DT_HOST_CAP_NONE) {
    c.room = 0;
    return c;
  }
  size_t floor = (size_t)256 << 20;
  size_t headroom = c.room / 8;
  size_t least = floor < c.room / 2 ? floor : c.room / 2;
  if (headroom < least)
    headroom = least;
  c.bytes = c.room - headroom;
  if (c.bytes < DT_MIB)
    c.bytes = DT_MIB;
  return c;
}

char *dt_host_memory_cap_describe(const dt_host_memory_cap *c, char *buf, size_t cap) {
  static const char *const what[] = {
      [DT_HOST_CAP_NONE] = "nothing",
      [DT_HOST_CAP_CGROUP] = "the cgroup's memory limit",
      [DT_HOST_CAP_MEM_AVAILABLE] = "MemAvailable (/proc/meminfo)",
      [DT_HOST_CAP_RLIMIT_AS] =
          "the address-space limit (RLIMIT_AS, ulimit -v), after OpenBLAS's buffers,",
      [DT_HOST_CAP_RLIMIT_DATA] =
          "the data limit (RLIMIT_DATA, ulimit -d), after OpenBLAS's buffers,",
  };
  char bytes[32], room[32];
  if (c->source == DT_HOST_CAP_NONE) {
    snprintf(buf, cap, "no cap: no memory limit could be read");
    return buf;
  }
  snprintf(buf, cap, "default: %s of the %s %s leaves",
           dt_format_bytes(c->bytes, bytes, sizeof bytes),
           dt_format_bytes(c->room, room, sizeof room), what[c->source]);
  return buf;
}
