/* manifest.json: the file that makes a checkpoint exist, written last. It
 * lists every file of the checkpoint with its size and CRC32:
 *   {"format": "dtrain-checkpoint", "version": 1, "step": 20,
 *    "files": [{"name": "model.safetensors", "bytes": 2681400, "crc32": "89abcdef"}, ...]} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/ckpt_internal.h"

dt_status dt_ckpt_manifest_write(const char *dir, const dt_ckpt_manifest *m) {
  char buf[DT_CKPT_MAX_FILES * 200 + 256];
  size_t n = (size_t)snprintf(buf, sizeof buf,
                              "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"step\": "
                              "%lld,\n \"files\": [",
                              (long long)m->step);
  for (int i = 0; i < m->n_files && n < sizeof buf; i++)
    n += (size_t)snprintf(
        buf + n, sizeof buf - n, "%s\n  {\"name\": \"%s\", \"bytes\": %llu, \"crc32\": \"%08x\"}",
        i ? "," : "", m->files[i].name, (unsigned long long)m->files[i].size, m->files[i].crc32);
  if (n < sizeof buf)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "]}\n");
  if (n >= sizeof buf)
    return DT_ERROR(DT_ERR_INTERNAL, "manifest of %s too long", dir);
  dt_ckpt_chunk c = {buf, n};
  return dt_ckpt_write_file(dir, DT_CKPT_MANIFEST, &c, 1, NULL, NULL);
}

static dt_status parse_file_entry(ckpt_json *j, dt_ckpt_file_entry *e) {
  DT_CHECK(ckpt_json_expect(j, '{'));
  int seen = 0;
  for (bool more = true; more;) {
    char key[32], hex[16];
    int64_t v = 0;
    DT_CHECK(ckpt_json_string(j, key, sizeof key));
    DT_CHECK(ckpt_json_expect(j, ':'));
    if (!strcmp(key, "name")) {
      DT_CHECK(ckpt_json_string(j, e->name, sizeof e->name));
      seen |= 1;
    } else if (!strcmp(key, "bytes")) {
      DT_CHECK(ckpt_json_int(j, &v));
      if (v < 0)
        return DT_ERROR(DT_ERR_FORMAT, "%s: a file entry's bytes is %lld, negative", j->what,
                        (long long)v);
      e->size = (uint64_t)v;
      seen |= 2;
    } else if (!strcmp(key, "crc32")) {
      DT_CHECK(ckpt_json_string(j, hex, sizeof hex));
      if (!ckpt_parse_hex32(hex, &e->crc32))
        return DT_ERROR(DT_ERR_FORMAT, "%s: crc32 '%s' is not 8 hex digits", j->what, hex);
      seen |= 4;
    } else {
      DT_CHECK(ckpt_json_skip(j));
    }
    DT_CHECK(ckpt_json_next(j, '}', &more));
  }
  if (seen != 7)
    return DT_ERROR(DT_ERR_FORMAT, "%s: a file entry lacks its %s", j->what,
                    !(seen & 1)   ? "name"
                    : !(seen & 2) ? "bytes"
                                  : "crc32");
  if (strchr(e->name, '/') || strchr(e->name, '\\') || e->name[0] == '.' || !e->name[0])
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: file entry '%s' is not a plain file name of the checkpoint's directory "
                    "(no path, no leading '.')",
                    j->what, e->name);
  return DT_OK;
}

static dt_status parse_manifest(ckpt_json *j, dt_ckpt_manifest *m) {
  DT_CHECK(ckpt_json_expect(j, '{'));
  int has_step = 0, has_files = 0;
  for (bool more = true; more;) {
    char key[32];
    DT_CHECK(ckpt_json_string(j, key, sizeof key));
    DT_CHECK(ckpt_json_expect(j, ':'));
    if (!strcmp(key, "step")) {
      DT_CHECK(ckpt_json_int(j, &m->step));
      if (m->step < 0)
        return DT_ERROR(DT_ERR_FORMAT, "%s: step %lld is negative", j->what, (long long)m->step);
      has_step = 1;
    } else if (!strcmp(key, "version")) {
      int64_t v;
      DT_CHECK(ckpt_json_int(j, &v));
      if (v != 1)
        return DT_ERROR(DT_ERR_VERSION, "%s: version %lld, this dtrain reads 1", j->what,
                        (long long)v);
    } else if (!strcmp(key, "files")) {
      DT_CHECK(ckpt_json_expect(j, '['));
      for (bool f = ckpt_json_peek(j) != ']'; f;) {
        if (m->n_files >= DT_CKPT_MAX_FILES)
          return DT_ERROR(DT_ERR_FORMAT, "%s: more than %d files", j->what, DT_CKPT_MAX_FILES);
        DT_CHECK(parse_file_entry(j, &m->files[m->n_files++]));
        DT_CHECK(ckpt_json_next(j, ']', &f));
      }
      if (m->n_files == 0)
        return DT_ERROR(DT_ERR_FORMAT, "%s: the file list is empty", j->what);
      has_files = 1;
    } else {
      DT_CHECK(ckpt_json_skip(j));
    }
    DT_CHECK(ckpt_json_next(j, '}', &more));
  }
  if (!has_step || !has_files)
    return DT_ERROR(DT_ERR_FORMAT, "%s: the step or the file list is missing", j->what);
  return DT_OK;
}

dt_status dt_ckpt_manifest_read(const char *dir, dt_ckpt_manifest *m) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_MANIFEST);
  memset(m, 0, sizeof *m);
  void *buf = NULL;
  size_t size = 0;
  dt_status st = dt_ckpt_read_file(path, &buf, &size);
  if (st != DT_OK)
    return dt_error_wrap(st, "checkpoint %s has no readable manifest (an interrupted save?)", dir);
  ckpt_json j = {buf, size, 0, path};
  st = parse_manifest(&j, m);
  free(buf);
  return st;
}

/* Which check names the bad section of a file whose CRC32 differs. */
static dt_status locate_damage(const char *path, const void *buf, size_t size) {
  size_t n = strlen(path);
  if (n > 12 && !strcmp(path + n - 12, ".safetensors"))
    return ckpt_safetensors_check(path, buf, size);
  if (n > 4 && !strcmp(path + n - 4, ".bin"))
    return ckpt_state_check(path, buf, size);
  return DT_OK;
}

dt_status dt_ckpt_verify(const char *dir, dt_ckpt_manifest *m) {
  DT_CHECK(dt_ckpt_manifest_read(dir, m));
  for (int i = 0; i < m->n_files; i++) {
    const dt_ckpt_file_entry *e = &m->files[i];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->name);
    void *buf = NULL;
    size_t size = 0;
    DT_CHECK(dt_ckpt_read_file(path, &buf, &size));
    dt_status st = DT_OK;
    if (size != e->size) {
      st = locate_damage(path, buf, size);
      if (st == DT_OK)
        st = DT_ERROR(DT_ERR_FORMAT, "%s: %zu bytes, the manifest says %llu (%s)", path, size,
                      (unsigned long long)e->size, size < e->size ? "truncated" : "grown");
      else
        st = dt_error_wrap(st, "%s: %zu bytes, the manifest says %llu", path, size,
                           (unsigned long long)e->size);
    } else {
      uint32_t c = dt_crc32(0, buf, size);
      if (c != e->crc32) {
        st = locate_damage(path, buf, size);
        if (st == DT_OK)
          st = DT_ERROR(DT_ERR_FORMAT,
                        "%s: header: CRC32 of the file %08x, the manifest says %08x: the file "
                        "is corrupt",
                        path, c, e->crc32);
      }
    }
    free(buf);
    DT_CHECK(st);
  }
  return DT_OK;
}
