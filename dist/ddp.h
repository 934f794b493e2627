/* The DDP reducer: data-parallel gradient averaging that overlaps backward.
 *
 *   dt_ddp_config cfg = DT_DDP_CONFIG_DEFAULT;
 *   dt_ddp *ddp;
 *   DT_CHECK(dt_ddp_create(model, arena, comm, &cfg, &ddp)); // collective
 *   for (;;) {
 *     dt_module_call(model, x, &logits);      // buffers broadcast from rank 0
 *     ... loss ...
 *     dt_backward(loss, NULL);                // buckets all-reduce as grads get ready
 *     DT_CHECK(dt_ddp_finish_backward(ddp));  // waits for every bucket
 *     dt_optim_step(opt); dt_optim_zero_grad(opt);
 *   }
 *   dt_ddp_destroy(ddp);
 *
 * Construction (collective over `comm`): checks that every rank registered
 * the same parameters (names, shapes, dtypes) — else DT_ERR_DIST_MISMATCH on
 * every rank naming the first difference — then broadcasts the parameters
 * (the arena, one flat buffer) and the buffers from rank 0.
 *
 * Buckets are contiguous slices of the arena's flat gradient buffer, formed
 * in reverse registration order (the order in which backward produces the
 * gradients): the first closes once it holds cfg.first_bucket_bytes, the
 * others at cfg.bucket_bytes.
 *
 * Split parameters (stage 0, cfg.split_bytes). The last bucket holds the
 * gradients backward completes last (the input layer's), so its
 * all-reduce could only start when backward ends, and the update after
 * it. A parameter of that bucket larger than cfg.split_bytes is therefore
 * split into parts of whole rows (dim 0; about split_bytes each, at most
 * 8, a multiple of 16 rows), each part closing its bucket, and the
 * reducer asks for its gradient by parts (dt_tensor_set_grad_rows_hook,
 * core/autograd.h): an op that supports it (linear: the bias, then the
 * weight's row blocks from the last to the first) reports each part as
 * soon as it is written and its bucket launches while the next part is
 * computed. Other ops report nothing and the parts launch together when
 * the parameter is ready. The gradients are the same bits either way.
 *
 * Update per bucket (stage 0, cfg.update_per_bucket, through the training
 * step: dt_ddp_finish_backward_update). The optimizer updates each
 * bucket's parameters as soon as its all-reduce completes, while the later
 * buckets are still in flight, instead of one pass after the last; the
 * step uses it when nothing needs all the gradients first (no clipping, no
 * GradScaler), and falls back to dt_ddp_finish_backward + dt_optim_step
 * otherwise. Bit for bit the same update. Each parameter's .grad is a view into the
 * flat buffer, hence into its bucket: no copies. A grad-ready hook on every
 * parameter counts down its bucket; when a bucket's last gradient is ready
 * its asynchronous all-reduce (average) is launched — in bucket order on
 * every rank (a bucket that completes early waits for the ones before it),
 * so the collectives match across ranks.
 *
 * Devices. For device gradients (cuda) each bucket records an event on the
 * compute stream when it launches, passed as the collective's `ready`
 * event: the communicator's stream waits on it, never the host.
 * dt_ddp_finish_backward makes the compute stream wait for every bucket
 * (dt_work_wait_stream) and returns without blocking on the device with
 * nccl, so the optimizer's kernels queue behind the all-reduces (llm.c's
 * zero.cuh pattern). With CPU tensors the same code runs; the CPU
 * backend's events are no-ops.
 *
 * No-sync: between dt_ddp_no_sync_begin and _end backward passes only
 * accumulate locally; the next synchronised backward reduces the
 * accumulated gradients (gradient accumulation, PyTorch's `no_sync`).
 *
 * Unused parameters: a parameter that received no gradient since the last
 * synchronised step makes dt_ddp_finish_backward fail with DT_ERR_STATE
 * naming it (every rank must launch every bucket, or the job would hang);
 * with cfg.allow_unused its gradient is zero-filled and reduced instead.
 *
 * ZeRO (cfg.zero_stage, DeepSpeed's stages; dist/zero.c). Stage 1: the
 * same buckets and hooks, but each bucket is reduce-scattered (average)
 * so that every rank holds the reduced gradient of its own piece of
 * every bucket (its shard of the flat space: buckets are padded to a
 * multiple of the world size, and the arena gets a zeroed tail, so any
 * parameter count works); the optimizer given to dt_ddp_shard_optimizer
 * updates only the shard and keeps state for it only, and gathers the
 * updated pieces (all-gather per bucket, launched as each piece's update
 * is issued; the compute stream waits for them at the end of the step).
 * Stage 2: also the gradients: the arena's flat gradient buffer is
 * dropped, each parameter's gradient is copied into its bucket's buffer
 * when ready and freed, and only the shard's reduced gradients persist
 * (plus the bucket buffers in flight, reused each pass). With ZeRO a
 * parameter's .grad is this rank's local gradient (stage 1), or absent
 * (stage 2): the reduced gradient exists for the shard only, where the
 * optimizer's clipping (dt_optim_clip_grad_norm) reads it, summing the
 * partial norms over the ranks. No-sync scopes accumulate locally as in
 * stage 0 (stage 2 then holds full gradients until the synchronised pass,
 * like PyTorch FSDP's no_sync). Stage 2 keeps no device timeline
 * (dt_ddp_read_device_timeline fails). A checkpoint saves each rank's
 * optimizer state with its segments (core/optim.h, "Shards": offset and
 * length in the flat space); dt_optim_state_to_flat / _from_flat put
 * shards of any world size into the arena's coordinates and back, so a
 * load may re-shard. The parameters are complete on every rank after
 * each step (rank 0 can save them as they are).
 *
 * Gradient compression (cfg.grad_compress f16 or bf16; PyTorch's
 * fp16_compress_hook / bf16_compress_hook). When a bucket is ready its f32
 * gradients are cast (round to nearest even) into a 16-bit buffer on the
 * compute stream, the buffer is all-reduced (average; ZeRO:
 * reduce-scattered) in 16 bits (dist/comm.h: summed in f32, rounded once,
 * on the host backends; natively on nccl), and the result is cast back
 * into the f32 gradients (ZeRO: the shard's) where the compute stream
 * waits for the bucket, before the optimizer: half the bytes on the wire,
 * the same buckets, hooks and overlap. Accumulation (no_sync) and
 * clipping work on the f32 gradients as without compression; ZeRO's
 * parameter all-gathers stay f32 (they carry the master weights). f16
 * overflow: a local or reduced gradient of magnitude 65520 or more becomes
 * inf in the f32 gradients, which a GradScaler treats as an overflow (the
 * step is skipped and the scale lowered); without one the update would
 * apply it, so use bf16 (f32's range) unless the loss is scaled. The
 * 16-bit buffers exist only while their bucket is in flight.
 *
 * The reducer keeps borrowed pointers to the module, arena and comm, which
 * must outlive it. One reducer per module; use it from one thread (the one
 * that runs forward and backward).
 */
#ifndef DT_DIST_DDP_H
#define DT_DIST_DDP_H

#include <stddef.h>

#include "core/memory.h"
#include "core/module.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/step.h"
#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_ddp_config {
  size_t first_bucket_bytes; /* 128 KiB: small, so the first all-reduce starts early */
  size_t bucket_bytes;       /* 25 MiB */
  int broadcast_buffers;     /* 1: buffers from rank 0 before each training forward */
  int allow_unused;          /* 1: zero-fill gradients of unused parameters */
  int check_parameters;      /* 1: verify names/shapes/dtypes across ranks at creation */
  int zero_stage;            /* 0: all-reduce; 1, 2: ZeRO (below) */
  dt_dtype grad_compress;    /* f32: none; f16, bf16: reduce the buckets in 16 bits (below) */
  /* Stage 0: a parameter of the last bucket larger than this is split into
   * parts of about this size (whole rows, at most 8 parts), each closing
   * its bucket, launched as the backward writes it (below); 0 = never, the
   * default (docs/decisions.md: per-message costs outweighed the overlap). */
  size_t split_bytes;
  int update_per_bucket; /* 1: offer the step the update per bucket (below); 0 = one pass */
  /* 1 (the default): stage 0 without compression on CPU tensors keeps the
   * gradient arena in memory the ranks share (dt_comm_shared_buffer: the
   * mpi backend's shared-memory transport), so each bucket's all-reduce
   * reads the peers' gradients where backward wrote them, without staging
   * copies; the same bits either way. 0: a private arena. The same value
   * on every rank. */
  int shared_grads;
} dt_ddp_config;
#define DT_DDP_CONFIG_DEFAULT \
  ((dt_ddp_config){DT_MIB / 8, 25 * DT_MIB, 1, 0, 1, 0, DT_DTYPE_F32, 0, 0, 1})

/* The names of cfg.grad_compress (the --grad-compress flag): none (f32),
 * bf16, fp16. Parse: DT_ERR_INVALID_ARG naming the choices otherwise;
 * name: NULL for other types. */
#define DT_DDP_GRAD_COMPRESS_CHOICES "none|bf16|fp16"
dt_status dt_ddp_grad_compress_parse(const char *s, dt_dtype *out);
const char *dt_ddp_grad_compress_name(dt_dtype t);

typedef struct dt_ddp dt_ddp;

/* `arena` must have been created from `model` (dt_param_arena_create).
 * Collective over comm. Registers a forward pre-hook on `model` (buffer
 * broadcast and state checks) and a grad-ready hook on every parameter;
 * dt_ddp_destroy removes them. */
dt_status dt_ddp_create(dt_module *model, dt_param_arena *arena, dt_comm *comm,
                        const dt_ddp_config *cfg, dt_ddp **out);
/* Waits for launched buckets, removes the hooks, frees. NULL is a no-op. */
void dt_ddp_destroy(dt_ddp *d);
/* 1 when the gradient arena lives in memory the ranks share
 * (cfg.shared_grads, and the communicator had some). */
int dt_ddp_grads_shared(const dt_ddp *d);

/* Call after dt_backward and before the optimizer: launches what is left
 * (in bucket order), waits for every bucket's all-reduce and reports
 * unused parameters and communication errors. In a no-sync scope it only
 * ends the pass. */
dt_status dt_ddp_finish_backward(dt_ddp *d);

/* dt_ddp_finish_backward with the optimizer's update fused with the
 * buckets' arrival (the training step calls it when it may: core/step.h):
 * begins a step of `opt` (dt_optim_step_begin) and, as each bucket's
 * all-reduce completes, in bucket order, updates that bucket's range of
 * the flat space (dt_optim_step_range) while the later buckets are still
 * in flight; the caller ends the step (dt_optim_step_end), having set the
 * learning rate before. The same bits as dt_ddp_finish_backward followed
 * by dt_optim_step. Nothing is updated when the pass fails before the
 * first bucket is waited for (a hook error, an unused parameter without
 * allow_unused); a bucket that fails stops the updates and abandons the
 * step (dt_optim_step_end with the error). In a no-sync scope it only ends
 * the pass and begins nothing. DT_ERR_STATE, after finishing the pass as
 * dt_ddp_finish_backward does, with ZeRO (its optimizer steps the shard)
 * or when a step of `opt` is begun already. */
dt_status dt_ddp_finish_backward_update(dt_ddp *d, dt_optimizer *opt);

/* Gradient accumulation scopes (do not nest). */
dt_status dt_ddp_no_sync_begin(dt_ddp *d);
dt_status dt_ddp_no_sync_end(dt_ddp *d);
int dt_ddp_in_no_sync(const dt_ddp *d);

/* The reducer as the training step's gradient sync (core/step.h): its
 * no_sync scopes, dt_ddp_finish_backward and, in stage 0 with
 * cfg.update_per_bucket, dt_ddp_finish_backward_update. NULL gives
 * DT_GRAD_SYNC_NONE. */
dt_grad_sync dt_ddp_grad_sync(dt_ddp *d);

/* ZeRO (cfg.zero_stage 1 or 2): makes `opt` update only this rank's shard
 * (dt_optim_set_shard) and gather the updated parameters from every rank
 * in its dt_optim_step. Call once, after dt_ddp_create and before the
 * first step; `opt` must be over the reducer's arena, and the reducer
 * must outlive every step. A no-op with zero_stage 0. */
dt_status dt_ddp_shard_optimizer(dt_ddp *d, dt_optimizer *opt);
int dt_ddp_zero_stage(const dt_ddp *d);
/* Stages 1 and 2's buckets on `world` ranks with these bucket caps, for
 * planning (train/plan.c): n_buckets buckets, bucket 0 at the end of the
 * flat space (the first to fill in backward), padded[b] elements each;
 * parameter i of `arena` overlaps buckets first[i] to last[i]. In stage 2
 * a parameter within one bucket is written into its buffer in place; one
 * a boundary cuts (first < last) is made whole, then copied into its
 * buckets. A bucket's buffer is allocated when its first gradient arrives
 * and freed once reduced; the oldest launched are waited for while the
 * buffers would exceed DT_ZERO_BUFFERS_IN_FLIGHT of the largest bucket.
 * Free with dt_zero_layout_free. */
#define DT_ZERO_BUFFERS_IN_FLIGHT 2
typedef struct dt_zero_layout {
  int n_buckets, n_params;
  int64_t *padded;
  int *first, *last;
} dt_zero_layout;
dt_status dt_zero_layout_get(const dt_param_arena *arena, int world, size_t first_bucket_bytes,
                             size_t bucket_bytes, dt_zero_layout *out);
void dt_zero_layout_free(dt_zero_layout *l);
/* Bytes of gradient memory the reducer and the arena keep on this rank:
 * stage 0 the flat gradient buffer; stage 1 the padded flat buffer and
 * the shard's reduced gradients; stage 2 the shard's gradients only. */
size_t dt_ddp_gradient_bytes(const dt_ddp *d);
/* Stage 2: the most bytes of bucket buffers alive at once so far (the
 * buckets in flight during backward; 0 in the other stages). Stage 2's
 * per-parameter gradients exist only from their first accumulation to
 * their hook (and across no_sync passes). */
size_t dt_ddp_bucket_buffer_peak(const dt_ddp *d);

/* Broadcasts the module's buffers from rank 0 now (the forward pre-hook
 * calls this when cfg.broadcast_buffers and the module is training). */
dt_status dt_ddp_broadcast_buffers(dt_ddp *d);

/* ---- introspection ---- */
int dt_ddp_num_buckets(const dt_ddp *d);
/* Bucket b: first element offset and length in the flat gradient buffer,
 * and the range of parameter indices [first_param, last_param]. */
void dt_ddp_bucket_info(const dt_ddp *d, int b, int64_t *offset, int64_t *numel, int *first_param,
                        int *last_param);

/* Timeline of the last synchronised backward, in dt_comm_now() seconds. */
typedef struct dt_ddp_bucket_timing {
  double ready_s;  /* last gradient of the bucket ready */
  double launch_s; /* all-reduce submitted */
  double start_s;  /* all-reduce started on the communication thread */
  double end_s;    /* all-reduce complete (device communicators: its host part) */
  size_t bytes;
  /* On the device clock (ms since the communicator's creation), filled by
   * dt_ddp_read_device_timeline; -1 until then: the all-reduce's start and
   * end on the communication stream. */
  double dev_start_ms, dev_end_ms;
} dt_ddp_bucket_timing;

typedef struct dt_ddp_timeline {
  double first_grad_s;   /* first grad-ready hook of the pass */
  double last_grad_s;    /* last grad-ready hook of the pass */
  double backward_end_s; /* dt_ddp_finish_backward entered */
  double finish_end_s;   /* dt_ddp_finish_backward returned (all buckets done) */
  double update_s;       /* of which the update per bucket took (dt_ddp_finish_backward_update) */
  int n_buckets;
  const dt_ddp_bucket_timing *buckets; /* valid until the next pass */
  /* Device clock: where the compute stream stood when
   * dt_ddp_finish_backward made it wait for the buckets, i.e. the end of
   * backward on the device; -1 until dt_ddp_read_device_timeline. */
  double dev_backward_end_ms;
} dt_ddp_timeline;
void dt_ddp_get_timeline(const dt_ddp *d, dt_ddp_timeline *out);

/* A pass's communication in seconds: the all-reduces' total time (host
 * clock, start to end on the communication thread), the part of it before
 * backward ended (hidden behind backward), the wait after backward for the
 * last buckets (exposed: dt_ddp_finish_backward's time less the updates
 * per bucket it ran), and those updates' time. */
typedef struct dt_ddp_comm_times {
  double allreduce_s, hidden_s, exposed_s, update_s;
} dt_ddp_comm_times;
dt_ddp_comm_times dt_ddp_timeline_comm_times(const dt_ddp_timeline *tl);
/* The same for the reducer's last synchronised pass. */
dt_ddp_comm_times dt_ddp_last_comm_times(const dt_ddp *d);

/* Fills the device-clock fields of the last synchronised pass's timeline
 * (blocks until those points have executed; call after the step, for
 * traces and tests). Overlap shows as buckets[0].dev_start_ms <
 * dev_backward_end_ms. DT_ERR_UNSUPPORTED for communicators without device
 * timing (host backends, host staging). */
dt_status dt_ddp_read_device_timeline(dt_ddp *d);

/* Bytes each synchronised pass hands the communicator for the gradients
 * (all-reduce, or ZeRO's reduce-scatter, summed over the buckets): the
 * f32 bucket sizes, or half of them with cfg.grad_compress. */
size_t dt_ddp_comm_bytes_per_pass(const dt_ddp *d);

/* Synchronised backward passes completed. */
long dt_ddp_sync_count(const dt_ddp *d);

#ifdef __cplusplus
}
#endif
#endif
