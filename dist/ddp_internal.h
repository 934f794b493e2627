/* DDP internals shared by ddp.c (the reducer), zero.c (its ZeRO stages)
 * and ddp_verify.c. */
#ifndef DT_DIST_DDP_INTERNAL_H
#define DT_DIST_DDP_INTERNAL_H

#include <stdbool.h>

#include "core/module.h"
#include "core/optim.h"
#include "dist/comm.h"
#include "dist/ddp.h"

typedef struct ddp_bucket {
  int first, last;       /* parameters overlapping it, first <= last */
  int64_t offset, numel; /* its parameters' elements in the flat space */
  dt_tensor *view;       /* stage 0: slice of the flat gradient buffer (all-reduced in place) */
  int n_params;          /* what it waits for: stage 0 its units (below), ZeRO its parameters */
  int pending;           /* of those, still to become ready in this pass */
  int ready;
  dt_event *ready_ev; /* recorded on the compute stream when the bucket is ready */
  dt_work *work;      /* in flight */
  dt_work *last_work; /* the last pass's, kept for its device times (not in stage 2) */
  /* ZeRO: the bucket padded to `padded` = world x `shard` elements; this
   * rank's piece is [offset + rank * shard, + shard), its reduced
   * gradient at `local_offset` of the shard gradients. */
  int64_t padded, shard, local_offset;
  dt_tensor *rs_in;    /* stage 1: view of the padded flat gradients; stage 2: its buffer */
  dt_tensor *rs_out;   /* view of the shard gradients */
  dt_tensor *ag_in;    /* view of the padded flat parameters: this rank's piece */
  dt_tensor *ag_out;   /* the whole padded bucket of parameters */
  dt_event *gather_ev; /* the piece's update is issued on the compute stream */
  dt_work *gather;
  /* cfg.grad_compress, while the bucket is in flight: the 16-bit copy of
   * its gradients (reduced in place; ZeRO: the reduce-scatter's input) and
   * ZeRO's 16-bit shard of the result. */
  dt_tensor *comp_in, *comp_out;
} ddp_bucket;

/* Stage 0: a piece of a parameter's gradient that lies in one bucket:
 * the whole parameter, or, for a parameter split by cfg.split_bytes, a
 * block of its rows (dim 0), which the backward may report as soon as it
 * is written (dt_tensor_set_grad_rows_hook). */
typedef struct ddp_unit {
  int64_t row0, rows;
  int bucket;
  bool ready; /* in this pass */
} ddp_unit;

/* Per parameter: its buckets, this pass's state and its grad-ready hook
 * (whose context is this struct). Stage 0 buckets hold whole parameters
 * (bucket == bucket_end); ZeRO's may split one. */
typedef struct ddp_param {
  dt_ddp *d;
  int index;
  int bucket, bucket_end; /* the buckets it overlaps: [bucket, bucket_end] */
  bool ready_this_pass;
  bool used_since_sync;
  dt_hook_handle hook;
  /* stage 0: its units d->units[unit0 ..], from its last rows to its first
   * (the order of the buckets); part_rows > 0 when it is split */
  int unit0, n_units;
  int64_t part_rows;
  bool rows_hook; /* its rows-ready hook is set */
  bool dest_hook; /* its grad-destination hook is set (ZeRO stage 2) */
} ddp_param;

struct dt_ddp {
  dt_module *model;
  dt_param_arena *arena;
  dt_comm *comm;
  dt_ddp_config cfg;
  dt_device dev;    /* where the gradients live */
  int grads_shared; /* the arena's gradients are in a shared buffer (cfg.shared_grads) */
  const dt_backend_ops *ops;
  dt_stream *compute;
  double dev_backward_end_ms;

  int n_params;
  ddp_param *params;
  dt_hook_handle pre_hook;

  int n_units;
  ddp_unit *units; /* stage 0 */

  int n_buckets;
  ddp_bucket *buckets;
  dt_ddp_bucket_timing *timings;
  int next_launch; /* buckets launch strictly in index order */

  int in_pass; /* a synchronised backward has started and is not finished */
  int no_sync;
  dt_status error; /* first error raised inside a hook (hooks return void) */
  char error_msg[1024];
  double first_grad_s, last_grad_s, backward_end_s, finish_end_s;
  double update_s; /* of the last pass: the buckets' updates inside finish (update_per_bucket) */
  long sync_count;

  /* ZeRO (cfg.zero_stage > 0) */
  int rank, world;
  dt_tensor *shard_grads; /* (shard_numel): this rank's reduced gradients */
  int64_t shard_numel;
  dt_optim_segment *segments; /* per bucket: what the optimizer updates */
  dt_optimizer *opt;          /* borrowed, from dt_ddp_shard_optimizer */
  int next_gather;            /* buckets gather in index order too */
  size_t buffer_bytes;        /* stage 2: bucket buffers alive now */
  size_t buffer_peak;         /* and the most at once since creation */
};

/* Records the first error raised where no status can be returned (hooks). */
void dt_ddp_record_error(dt_ddp *d, dt_status st);
/* Bucket b's collective is launched: waits for it (on_host, or the compute
 * stream waits), keeps its times and releases it (stage 2: with its
 * buffer; else it stays as last_work for the device timeline). */
dt_status dt_ddp_finish_bucket(dt_ddp *d, int b, int on_host);

/* Checks (collectively) that every rank registered the same parameters and
 * buffers, in the same order, with the same names, shapes and dtypes.
 * DT_ERR_DIST_MISMATCH on every rank, naming the first difference between
 * rank 0 and the lowest rank that differs from it. */
dt_status dt_ddp_verify_parameters(dt_comm *comm, dt_module *model, dt_param_arena *arena);

/* Sums values[0..n) over the ranks in place, the same result on every rank
 * (collective; ctx is the dt_ddp): ZeRO's sum_over_shards and the step's
 * sum_over_ranks (the GradScaler's found-inf agreement). */
dt_status dt_ddp_sum_over_ranks(void *ctx, double *values, int n);

/* ---- ZeRO (zero.c) ---- */
/* Buckets over the flat space padded per bucket to the world size, their
 * views, the shard gradients; pads the arena and (stage 2) drops its
 * gradient buffer. Replaces the stage-0 bucket builder. */
dt_status dt_zero_build_buckets(dt_ddp *d);
/* Bucket b's reduce-scatter: its input (the padded gradients; stage 2:
 * its buffer, allocated zeroed if no gradient arrived) and its output
 * (this rank's piece of the shard gradients). Borrowed. */
dt_status dt_zero_bucket_io(dt_ddp *d, int b, dt_tensor **in, dt_tensor **out);
/* Stage 2: copies parameter pa's gradient into its buckets' buffers (not
 * when dt_zero_grad_dest had it written there) and frees it (no gradient:
 * nothing to copy, the buffers start at zero). */
dt_status dt_zero_take_gradient(dt_ddp *d, const ddp_param *pa);
/* Stage 2's grad-destination hook (core/autograd.h): a parameter within one
 * bucket gets its slice of the bucket's buffer as .grad, so its backward
 * writes the gradient there and dt_zero_take_gradient copies nothing. */
dt_status dt_zero_grad_dest(dt_tensor *leaf, void *user, dt_tensor **grad);
/* Stage 2, end of a pass: the bucket buffers are freed. */
void dt_zero_end_pass(dt_ddp *d);
void dt_zero_destroy(dt_ddp *d);

#endif
