/* The growable token and byte buffers of core/text.h, and whole files. */
#define _GNU_SOURCE /* F_DUPFD_CLOEXEC, O_CLOEXEC */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "core/data_text_internal.h"

#define PIPEFS_MAGIC_ 0x50495045 /* an unnamed pipe's file system (linux/magic.h) */

/* Grows *data (elements of `size` bytes) to hold `need`; doubles. */
static dt_status grow(void **data, int64_t *cap, int64_t need, size_t size, const char *what) {
  if (need <= *cap)
    return DT_OK;
  if (need > (INT64_C(1) << 40) / (int64_t)size)
    return DT_ERROR(DT_ERR_OOM, "%s buffer of %lld elements: too large", what, (long long)need);
  int64_t c = *cap ? *cap : 256;
  while (c < need)
    c *= 2;
  void *p = realloc(*data, (size_t)c * size);
  if (!p)
    return DT_ERROR(DT_ERR_OOM, "cannot grow a %s buffer to %lld elements", what, (long long)c);
  *data = p;
  *cap = c;
  return DT_OK;
}

/* Appends n elements of `size` bytes from src to the buffer (*data, *len,
 * *cap) of dt_tokens or dt_bytes. */
static dt_status append(void **data, int64_t *len, int64_t *cap, const void *src, int64_t n,
                        size_t size, const char *what) {
  DT_CHECK(grow(data, cap, *len + n, size, what));
  if (n > 0)
    memcpy((char *)*data + (size_t)*len * size, src, (size_t)n * size);
  *len += n;
  return DT_OK;
}

dt_status dt_tokens_append(dt_tokens *t, const int32_t *ids, int64_t n) {
  if (!t || n < 0 || (n > 0 && !ids))
    return DT_ERROR(DT_ERR_INVALID_ARG, "tokens NULL, or ids NULL with n %lld", (long long)n);
  return append((void **)&t->data, &t->len, &t->cap, ids, n, sizeof *t->data, "token");
}

void dt_tokens_free(dt_tokens *t) {
  if (!t)
    return;
  free(t->data);
  memset(t, 0, sizeof *t);
}

dt_status dt_bytes_append(dt_bytes *b, const void *data, int64_t n) {
  if (!b || n < 0 || (n > 0 && !data))
    return DT_ERROR(DT_ERR_INVALID_ARG, "bytes NULL, or data NULL with n %lld", (long long)n);
  return append((void **)&b->data, &b->len, &b->cap, data, n, 1, "byte");
}

void dt_bytes_free(dt_bytes *b) {
  if (!b)
    return;
  free(b->data);
  memset(b, 0, sizeof *b);
}

/* What a file that is not read is, for the message. */
static const char *file_kind(mode_t m) {
  return S_ISDIR(m)    ? "a folder"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
         : S_ISFIFO(m) ? "a named pipe (FIFO)"
                       : "not a regular file";
}

/* A descriptor this process holds, readable, on the pipe (dev, ino): the
 * shell's /dev/stdin, /dev/fd/N of `<(cmd)`. -1 when none. */
static int held_pipe(dev_t dev, ino_t ino) {
  DIR *d = opendir("/proc/self/fd");
  if (!d)
    return -1;
  int found = -1;
  struct dirent *e;
  while (found < 0 && (e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    struct stat sb;
    if (end == e->d_name || *end || fd == dirfd(d) || fd > INT32_MAX)
      continue;
    int flags = fcntl((int)fd, F_GETFL);
    if (flags >= 0 && (flags & O_ACCMODE) != O_WRONLY && fstat((int)fd, &sb) == 0 &&
        S_ISFIFO(sb.st_mode) && sb.st_dev == dev && sb.st_ino == ino)
      found = (int)fd;
  }
  closedir(d);
  return found;
}

/* Whether path may be read (see dt_text_read_file): *pipe when it is a
 * pipe, *held the descriptor of it this process holds (or -1). */
static dt_status check_input(const char *path, int *pipe, int *held) {
  struct stat sb;
  struct statfs fs;
  if (stat(path, &sb) != 0)
    return DT_ERROR(DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  *pipe = S_ISFIFO(sb.st_mode);
  *held = *pipe ? held_pipe(sb.st_dev, sb.st_ino) : -1;
  if (*pipe && *held < 0 && !(statfs(path, &fs) == 0 && fs.f_type == PIPEFS_MAGIC_))
    return DT_ERROR(DT_ERR_IO,
                    "%s is a named pipe (FIFO): opening it waits, for ever, for a writer; "
                    "give its text as a file, or through a pipe of this process "
                    "(/dev/stdin, with < %s or cmd | ...)",
                    path, path);
  if (!*pipe && !S_ISREG(sb.st_mode))
    return DT_ERROR(DT_ERR_IO,
                    "%s is %s, not a regular file: text comes from files, folders of them, or "
                    "a pipe (/dev/stdin in cmd | ...)",
                    path, file_kind(sb.st_mode));
  return DT_OK;
}

dt_status dt_text_check_input(const char *path) {
  int pipe, held;
  return check_input(path, &pipe, &held);
}

/* Opens path for reading, refusing what could block or never end. */
static dt_status open_input(const char *path, int *fd, int *pipe) {
  int held;
  DT_CHECK(check_input(path, pipe, &held));
  if (held >= 0)
    *fd = fcntl(held, F_DUPFD_CLOEXEC, 0);
  else /* a regular file, or an unnamed pipe, whose open never waits */
    *fd = open(path, O_RDONLY | O_CLOEXEC | (*pipe ? 0 : O_NONBLOCK));
  if (*fd < 0)
    return DT_ERROR(DT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  /* What was opened is what was checked (not swapped for a device since). */
  struct stat sb;
  if (fstat(*fd, &sb) != 0 || (*pipe ? !S_ISFIFO(sb.st_mode) : !S_ISREG(sb.st_mode))) {
    close(*fd);
    return DT_ERROR(DT_ERR_IO, "%s changed while it was opened", path);
  }
  if (!*pipe)
    fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK);
  return DT_OK;
}

dt_status dt_text_read_file(const char *path, int pipe_limit_mb, dt_bytes *out) {
  int fd, pipe;
  DT_CHECK(open_input(path, &fd, &pipe));
  int64_t limit = (int64_t)pipe_limit_mb << 20, got = 0;
  dt_status st = DT_OK;
  uint8_t buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      st = DT_ERROR(DT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
      break;
    }
    if (n == 0)
      break;
    got += n;
    if (pipe && got > limit) {
      st = DT_ERROR(DT_ERR_IO,
                    "%s: more than %d MiB came through the pipe and it has not ended: a "
                    "document is held in memory whole, up to `pipe_limit_mb` (%d MiB); split "
                    "the text into files, or raise the limit",
                    path, pipe_limit_mb, pipe_limit_mb);
      break;
    }
    if ((st = dt_bytes_append(out, buf, (int64_t)n)) != DT_OK)
      break;
  }
  close(fd);
  return st;
}
