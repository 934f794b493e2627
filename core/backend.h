/* Device backends: one vtable per device type, and the kernel dispatch.
 *
 * The CPU backend (core/cpu_backend.c) registers itself when //core:cpu is
 * linked; the CUDA backend (cuda/) when it is linked and finds a GPU.
 * Everything above the kernels (ops, autograd, modules, optimizers, DDP)
 * calls kernels through dt_kernel_<name>(), never through the table and
 * never branching on the device type.
 *
 * The kernels are listed once, in core/op_table.def (shapes and contracts
 * there): it generates the table's kernel slots, the dispatch prototypes
 * below and each backend's prototypes. A kernel receives the execution
 * context (dt_exec: backend, device, stream, element type) it runs in;
 * arguments are validated by the dispatch, once, before any backend sees
 * them, so backends check only what depends on the data or on themselves.
 * Pointers are device pointers to contiguous data; sizes are element
 * counts. A kernel returns DT_OK or a status with the message set.
 */
#ifndef DT_CORE_BACKEND_H
#define DT_CORE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_stream dt_stream; /* opaque, backend-defined */
typedef struct dt_event dt_event;   /* opaque, backend-defined */

typedef enum dt_stream_kind {
  DT_STREAM_COMPUTE = 0,
  DT_STREAM_COPY = 1,
  DT_STREAM_COMM = 2,
} dt_stream_kind;

typedef enum dt_unary_op {
  DT_UNARY_RELU = 0,
  DT_UNARY_GELU, /* tanh approximation, as GPT-2 / llm.c */
  DT_UNARY_TANH,
} dt_unary_op;

typedef enum dt_binary_op {
  DT_BINARY_ADD = 0,
  DT_BINARY_SUB,
  DT_BINARY_MUL,
  DT_BINARY_DIV, /* IEEE: x/0 is +-inf, 0/0 NaN */
} dt_binary_op;

typedef struct dt_memory_stats {
  size_t allocated;      /* bytes in live tensors */
  size_t reserved;       /* bytes held from the system (>= allocated) */
  size_t peak_allocated; /* max of allocated since the last reset */
  size_t limit;          /* cap in bytes, 0 = none */
  size_t capacity;       /* device capacity in bytes, 0 = unknown */
  uint64_t num_allocs;   /* successful allocations */
  uint64_t num_ooms;     /* failed allocations */
} dt_memory_stats;

/* Arguments of a strided binary op: out = a (op) b over `shape`, with a and b
 * given by element strides (0 = broadcast); out is contiguous. */
typedef struct dt_binary_args {
  dt_binary_op op;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t a_strides[DT_MAX_DIMS];
  int64_t b_strides[DT_MAX_DIMS];
} dt_binary_args;

/* Up to three operands' element strides over a shape, with size-1 dims
 * dropped and neighbours that are contiguous in every operand merged (most
 * plans end up 1-D or 2-D): what the strided kernels (binary, copy_strided)
 * of every backend iterate over. */
typedef struct dt_strided_plan {
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t s[3][DT_MAX_DIMS]; /* strides of operands 0, 1, 2 */
  int64_t numel;
} dt_strided_plan;

/* Builds the plan of `shape` (ndim dims) for operands with strides s0, s1,
 * s2 (each ndim entries). */
void dt_strided_plan_build(dt_strided_plan *p, int ndim, const int64_t *shape, const int64_t *s0,
                           const int64_t *s1, const int64_t *s2);

/* The plan of a binary op: operand 0 the contiguous output, 1 a, 2 b. */
void dt_binary_plan(const dt_binary_args *args, dt_strided_plan *p);

/* A 2-D convolution / pooling geometry. nhwc 0: the activations (x, y,
 * dx, dy) are NCHW; 1: channels-last, (N, H, W, C) in memory. The filters
 * are (OC, C, KH, KW) either way (torchvision's layout; a backend that
 * wants them channels-last too transposes them itself), and a max
 * pooling's argmax is the flat index into H*W either way. */
typedef struct dt_conv2d_geom {
  int n, c, h, w; /* input */
  int oc, kh, kw; /* filters (oc unused for pooling) */
  int sh, sw;     /* stride */
  int ph, pw;     /* padding */
  int oh, ow;     /* output */
  int nhwc;       /* 0 or 1: the activations' layout */
} dt_conv2d_geom;

/* A 16-bit copy an f32 kernel writes beside its result (the optimizer's
 * working copy of the weights, core/optim.h): data[i] = the 16-bit value of
 * f32 result element i, rounded to nearest even, or stochastically with
 * the draw dt_rng_uniform(seed, offset + i) (core/half.h). */
typedef struct dt_half_out {
  uint16_t *data; /* n elements on the kernel's device */
  dt_dtype dtype; /* DT_DTYPE_BF16 or DT_DTYPE_F16 */
  bool stochastic;
  uint64_t seed, offset;
} dt_half_out;

typedef struct dt_backend_ops dt_backend_ops;

/* Where a kernel runs: the backend and device, the stream it is enqueued on
 * (the device's compute stream unless the caller chose another), and the
 * element type of its float arguments. */
typedef struct dt_exec {
  const dt_backend_ops *be;
  dt_device dev;
  dt_stream *stream;
  dt_dtype dtype;
} dt_exec;

/* Element-type sets of the op table's DT_KERNEL entries. */
#define DT_KDTYPE(t) (1u << (t))
#define DT_KF32 DT_KDTYPE(DT_DTYPE_F32)
#define DT_KF16 DT_KDTYPE(DT_DTYPE_F16)
#define DT_KBF16 DT_KDTYPE(DT_DTYPE_BF16)
#define DT_KANY ((1u << DT_DTYPE_COUNT) - 1u)

/* A kernel's parameter list with the execution context first. */
#define DT_KPARAMS(...) (const dt_exec *ex, __VA_ARGS__)
#define DT_KARGS(...) (ex, __VA_ARGS__)

/* The cast kernels' double -> integer conversion, one expression that the
 * CPU and CUDA kernels both use: truncation toward zero like C and
 * PyTorch, saturating at the int64 range, NaN -> 0 (no undefined
 * behaviour). v is evaluated several times. */
#define DT_CAST_F64_TO_I64(v)                   \
  ((v) != (v)                      ? (int64_t)0 \
   : (v) >= 9223372036854775807.0  ? INT64_MAX  \
   : (v) <= -9223372036854775808.0 ? INT64_MIN  \
                                   : (int64_t)(v))

struct dt_backend_ops {
  const char *name; /* "cpu", "cuda" */

  /* ---- devices ---- */
  int (*device_count)(void);
  /* Optional: when device_count() is 0, records why (driver missing, driver
   * older than the runtime, ...) and returns the status to report. */
  dt_status (*unavailable)(void);

  /* ---- memory ---- */
  dt_status (*alloc)(dt_device dev, size_t bytes, void **out);
  void (*free)(dt_device dev, void *ptr, size_t bytes);
  /* Copy between this backend's device memory and host memory or itself.
   * `dst_dev` / `src_dev` say where each side lives (CPU = host). Async on
   * `stream` when not NULL, else synchronous (ordered after the compute
   * stream's work). Device memory comes cached per compute stream, so an
   * async copy on another stream is the caller's to order: its destination
   * may have been freed by the host while queued compute work still used
   * it (the data loader waits on the events that guard its buffers). */
  dt_status (*copy)(void *dst, dt_device dst_dev, const void *src, dt_device src_dev, size_t bytes,
                    dt_stream *stream);
  dt_status (*memset_zero)(dt_device dev, void *ptr, size_t bytes);
  /* Optional (NULL: plain host memory is as good): page-locked host memory
   * from which `copy` on a stream runs asynchronously (the data loader's
   * batch buffers). */
  dt_status (*host_alloc)(size_t bytes, void **out);
  void (*host_free)(void *ptr);
  dt_status (*memory_stats)(dt_device dev, dt_memory_stats *out);
  dt_status (*empty_cache)(dt_device dev);
  dt_status (*reset_peak_stats)(dt_device dev);

  /* ---- streams and events ---- */
  dt_stream *(*stream)(dt_device dev, dt_stream_kind kind); /* owned by the backend */
  dt_status (*event_create)(dt_device dev, dt_event **out);
  void (*event_destroy)(dt_event *ev);
  dt_status (*event_record)(dt_event *ev, dt_stream *s);
  dt_status (*stream_wait_event)(dt_stream *s, dt_event *ev);
  dt_status (*event_synchronize)(dt_event *ev);
  /* Optional (NULL: waiters call event_synchronize): *done = 1 once the
   * work before `ev` has executed, else 0; never blocks. For waits that
   * must keep a deadline (the communicator's watchdog). */
  dt_status (*event_query)(dt_event *ev, int *done);
  /* The synchronisation points of the training thread (a synchronous
   * copy, device_synchronize, stream_synchronize of the compute stream):
   * errors that kernels found on the device without stopping the host (an
   * index out of range, core/op_table.def) are returned by the next of
   * them. Waits on the comm or copy stream (other threads) do not. */
  dt_status (*stream_synchronize)(dt_stream *s);
  dt_status (*device_synchronize)(dt_device dev);

  /* ---- kernels: one slot per DT_KERNEL of core/op_table.def ---- */
#define DT_KERNEL(name, dtypes, check, params, args) dt_status(*name) DT_KPARAMS params;
#include "core/op_table.def"
};

/* Registers (or replaces) the backend for a device type. Not thread-safe:
 * call at start-up (backends register from a constructor when linked:
 * //core:cpu always, //cuda when built with the toolkit). */
dt_status dt_backend_register(dt_device_type type, const dt_backend_ops *ops);
/* The backend for `dev`, checking that the device exists; clear error
 * (DT_ERR_NO_DEVICE / DT_ERR_UNSUPPORTED) otherwise. */
dt_status dt_backend_get(dt_device dev, const dt_backend_ops **out);
/* Number of devices of a type (0 when the backend is absent). */
int dt_device_count(dt_device_type type);

/* The most CPU threads a process may ask for (core/cpu.h, DT_NUM_THREADS). */
#define DT_CPU_MAX_THREADS 4096

/* The execution context for kernels on `dev` with elements of `dtype`:
 * the device's backend (checked as dt_backend_get does) and its compute
 * stream. */
dt_status dt_exec_init(dt_device dev, dt_dtype dtype, dt_exec *out);

/* The dispatch, one function per kernel of core/op_table.def:
 *   dt_exec ex;
 *   DT_CHECK(dt_exec_init(dev, DT_DTYPE_F32, &ex));
 *   DT_CHECK(dt_kernel_axpby(&ex, n, 1.0f, x, 0.0f, y));
 * Checks that the backend implements the kernel for ex->dtype
 * (DT_ERR_DTYPE / DT_ERR_UNSUPPORTED otherwise) and the entry's argument
 * checks (DT_ERR_INVALID_ARG / DT_ERR_SHAPE naming the kernel and the
 * values), then runs the backend's kernel. */
#define DT_KERNEL(name, dtypes, check, params, args) dt_status dt_kernel_##name DT_KPARAMS params;
#include "core/op_table.def"

/* The gemm entry's argument check (sizes >= 0, leading dimensions), for
 * backend-specific GEMM variants outside the table (dt_cuda_gemm_ex). */
dt_status dt_kcheck_gemm(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc,
                         int batch);

#ifdef __cplusplus
}
#endif
#endif
