/* Checkpoint files on disk: CRC32 (zlib), the atomic write (temporary
 * name, fsync, rename, directory fsync), reading, listing and removing
 * checkpoint directories. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/checkpoint.h"

uint32_t dt_crc32(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  uLong c = crc;
  while (n > 0) { /* zlib takes uInt lengths */
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

static dt_status fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO, "opening directory %s to fsync it: %s", dir, strerror(errno));
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  if (rc != 0)
    return DT_ERROR(DT_ERR_IO, "fsync of directory %s: %s", dir, strerror(e));
  return DT_OK;
}

static dt_status write_all(int fd, const void *data, size_t size, const char *path) {
  const char *p = data;
  while (size > 0) {
    ssize_t k = write(fd, p, size);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return DT_ERROR(DT_ERR_IO, "writing %s: %s", path, strerror(errno));
    p += k;
    size -= (size_t)k;
  }
  return DT_OK;
}

dt_status dt_ckpt_write_file(const char *dir, const char *name, const dt_ckpt_chunk *chunks,
                             int n_chunks, uint32_t *crc, uint64_t *size) {
  char tmp[4096], final[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name) >= sizeof tmp ||
      (size_t)snprintf(final, sizeof final, "%s/%s", dir, name) >= sizeof final)
    return DT_ERROR(DT_ERR_INVALID_ARG, "checkpoint path too long: %s/%s", dir, name);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO, "creating %s: %s", tmp, strerror(errno));
  dt_status st = DT_OK;
  uint32_t c = 0;
  uint64_t total = 0;
  for (int i = 0; i < n_chunks && st == DT_OK; i++) {
    st = write_all(fd, chunks[i].data, chunks[i].size, final);
    c = dt_crc32(c, chunks[i].data, chunks[i].size);
    total += chunks[i].size;
  }
  if (st == DT_OK && fsync(fd) != 0)
    st = DT_ERROR(DT_ERR_IO, "fsync of %s: %s", final, strerror(errno));
  if (close(fd) != 0 && st == DT_OK)
    st = DT_ERROR(DT_ERR_IO, "closing %s: %s", final, strerror(errno));
  if (st == DT_OK && rename(tmp, final) != 0)
    st = DT_ERROR(DT_ERR_IO, "renaming %s to %s: %s", tmp, final, strerror(errno));
  if (st != DT_OK) {
    unlink(tmp);
    return st;
  }
  DT_CHECK(fsync_dir(dir));
  if (crc)
    *crc = c;
  if (size)
    *size = total;
  return DT_OK;
}

dt_status dt_ckpt_read_file(const char *path, void **data, size_t *size) {
  *data = NULL;
  *size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO, "%s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return DT_ERROR(DT_ERR_IO, "%s: not a regular file", path);
  }
  size_t n = (size_t)sb.st_size;
  char *buf = malloc(n ? n : 1);
  if (!buf) {
    close(fd);
    return DT_ERROR(DT_ERR_OOM, "%s: cannot allocate %zu bytes to read it", path, n);
  }
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, buf + got, n - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      int e = errno;
      free(buf);
      close(fd);
      return DT_ERROR(DT_ERR_IO, "reading %s: %s", path, k < 0 ? strerror(e) : "file shrank");
    }
    got += (size_t)k;
  }
  close(fd);
  *data = buf;
  *size = n;
  return DT_OK;
}

dt_status dt_ckpt_make_dirs(const char *path) {
  char buf[4096];
  if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path too long: %s", path);
  size_t n = strlen(buf);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0')
      continue;
    char saved = buf[i];
    buf[i] = '\0';
    struct stat sb;
    if (stat(buf, &sb) != 0) {
      if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return DT_ERROR(DT_ERR_IO, "creating directory %s: %s", buf, strerror(errno));
      char parent[4096];
      snprintf(parent, sizeof parent, "%s", buf);
      char *slash = strrchr(parent, '/');
      if (slash)
        *slash = '\0';
      DT_CHECK(fsync_dir(slash ? (parent[0] ? parent : "/") : "."));
    } else if (!S_ISDIR(sb.st_mode)) {
      return DT_ERROR(DT_ERR_IO, "%s is not a directory", buf);
    }
    buf[i] = saved;
  }
  return DT_OK;
}

static int by_name_descending(const void *a, const void *b) {
  return -strcmp((const char *)a, (const char *)b);
}

dt_status dt_ckpt_list(const char *parent, char (*names)[64], int cap, int *n) {
  *n = 0;
  DIR *d = opendir(parent);
  if (!d) {
    if (errno == ENOENT)
      return DT_OK;
    return DT_ERROR(DT_ERR_IO, "listing checkpoints in %s: %s", parent, strerror(errno));
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *s = e->d_name;
    if (strncmp(s, "step_", 5) != 0 || strlen(s) != 13 || strspn(s + 5, "0123456789") != 8)
      continue;
    /* Zero-padded: by name = by step. Keep the `cap` newest, sorted. */
    if (*n == cap && (cap == 0 || strcmp(s, names[cap - 1]) < 0))
      continue;
    int k = *n < cap ? (*n)++ : cap - 1;
    snprintf(names[k], 64, "%s", s);
    qsort(names, (size_t)*n, 64, by_name_descending);
  }
  closedir(d);
  return DT_OK;
}

dt_status dt_ckpt_remove(const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_MANIFEST);
  if (unlink(path) != 0 && errno != ENOENT)
    return DT_ERROR(DT_ERR_IO, "removing %s: %s", path, strerror(errno));
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? DT_OK : DT_ERROR(DT_ERR_IO, "opening %s: %s", dir, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  if (rmdir(dir) != 0)
    return DT_ERROR(DT_ERR_IO, "removing %s: %s", dir, strerror(errno));
  return DT_OK;
}
