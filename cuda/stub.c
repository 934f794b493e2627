/* cuda/cuda.h without CUDA: the library //cuda becomes when the toolkit is
 * absent or the build asked for none (--config=cpu). No backend is
 * registered, so dt_backend_get(cuda:N) fails with DT_ERR_UNSUPPORTED and
 * core's "this build of dtrain has no CUDA backend" message; everything
 * here says the same. */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda.h"

#define NOT_BUILT                                                                      \
  "this build of dtrain has no CUDA support (built without the CUDA toolkit, or with " \
  "--config=cpu): rebuild where the toolkit is installed (/usr/local/cuda or "         \
  "$CUDA_HOME), or use --device cpu"

int dt_cuda_built(void) { return 0; }

dt_status dt_cuda_probe(void) { return DT_ERROR(DT_ERR_UNSUPPORTED, NOT_BUILT); }

dt_status dt_cuda_get_versions(dt_cuda_versions *out) {
  memset(out, 0, sizeof *out);
  return DT_OK;
}

dt_status dt_cuda_get_device_info(int index, dt_cuda_device_info *out) {
  memset(out, 0, sizeof *out);
  return DT_ERROR(DT_ERR_UNSUPPORTED, "device info for cuda:%d: " NOT_BUILT, index);
}

dt_status dt_cuda_peer_access(int i, int j, int *ok) {
  *ok = 0;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "peer access cuda:%d -> cuda:%d: " NOT_BUILT, i, j);
}

dt_status dt_cuda_doctor(FILE *out, int *problems) {
  if (problems)
    *problems = 1;
  if (fprintf(out,
              "CUDA\n  build:    none: %s\n  summary:  1 problem above; --device cpu "
              "works regardless\n",
              NOT_BUILT) < 0)
    return DT_ERROR(DT_ERR_IO, "dtrain doctor: writing the CUDA report failed");
  return DT_OK;
}

dt_status dt_cuda_pinned_alloc(size_t bytes, void **out) {
  *out = NULL;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "pinned allocation of %zu bytes: " NOT_BUILT, bytes);
}

void dt_cuda_pinned_free(void *ptr) { (void)ptr; }

dt_status dt_cuda_pinned_stats(dt_memory_stats *out) {
  memset(out, 0, sizeof *out);
  return DT_ERROR(DT_ERR_UNSUPPORTED, NOT_BUILT);
}

dt_status dt_cuda_pinned_empty_cache(void) { return DT_OK; }

void *dt_cuda_stream_handle(dt_stream *s) {
  (void)s;
  return NULL;
}

void *dt_cuda_event_handle(dt_event *ev) {
  (void)ev;
  return NULL;
}

dt_status dt_cuda_mark_create(dt_device dev, dt_cuda_mark **out) {
  (void)dev;
  *out = NULL;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "timing marks: " NOT_BUILT);
}

void dt_cuda_mark_destroy(dt_cuda_mark *m) { (void)m; }

dt_status dt_cuda_mark_record(dt_cuda_mark *m, dt_stream *s) {
  (void)m, (void)s;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "timing marks: " NOT_BUILT);
}

dt_status dt_cuda_mark_elapsed(dt_cuda_mark *a, dt_cuda_mark *b, float *ms) {
  (void)a, (void)b;
  *ms = 0.0f;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "timing marks: " NOT_BUILT);
}

dt_status dt_cuda_mark_query(dt_cuda_mark *m, int *done) {
  (void)m;
  *done = 0;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "timing marks: " NOT_BUILT);
}

int dt_cuda_stream_ordered_memory(int index) {
  (void)index;
  return 0;
}

dt_status dt_cuda_timer_record(dt_device dev, void **event) {
  (void)dev;
  *event = NULL;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "CUDA timing events: " NOT_BUILT);
}

dt_status dt_cuda_timer_elapsed_ms(void *start, void *end, double *ms) {
  (void)start;
  (void)end;
  *ms = 0.0;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "CUDA timing events: " NOT_BUILT);
}

void dt_cuda_timer_destroy(void *event) { (void)event; }

void dt_cuda_nvtx_push(const char *name) { (void)name; }

void dt_cuda_nvtx_pop(void) {}

void dt_cuda_set_tf32(int enabled) { (void)enabled; }

int dt_cuda_tf32_enabled(void) { return 0; }

dt_status dt_cuda_set_memory_limit(int index, size_t bytes) {
  (void)bytes;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "memory limit for cuda:%d: " NOT_BUILT, index);
}

dt_status dt_cuda_gemm_ex(dt_device dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const void *a, int lda, int64_t stride_a, const void *b, int ldb,
                          int64_t stride_b, dt_dtype ab_type, float beta, void *c, int ldc,
                          int64_t stride_c, dt_dtype c_type, int batch) {
  (void)dev, (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a;
  (void)lda, (void)stride_a, (void)b, (void)ldb, (void)stride_b, (void)ab_type, (void)beta;
  (void)c, (void)ldc, (void)stride_c, (void)c_type, (void)batch;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "gemm_ex: " NOT_BUILT);
}

dt_status dt_cuda_bn_counts_get(dt_device dev, dt_cuda_bn_counts *out) {
  (void)dev;
  memset(out, 0, sizeof *out);
  return DT_ERROR(DT_ERR_UNSUPPORTED, "batch norm counts: " NOT_BUILT);
}

dt_status dt_cuda_gemm_counts_get(dt_device dev, dt_cuda_gemm_counts *out) {
  (void)dev;
  memset(out, 0, sizeof *out);
  return DT_ERROR(DT_ERR_UNSUPPORTED, "gemm counts: " NOT_BUILT);
}
