/* What the attention's CUDA files share (kernels_attention.cu: the f32
 * tiles, the dispatch and the GEMM path's row kernels;
 * kernels_attention_mma.cu: 16-bit qkv on the tensor cores): the launch
 * geometry and the tensor-core entry points. Internal; CUDA C++ only. */
#ifndef DT_CUDA_KERNELS_ATTENTION_CUH
#define DT_CUDA_KERNELS_ATTENTION_CUH

#include "cuda/kernels_common.cuh"

#define ATT_TILE 32
#define ATT_WARPS 4
#define ATT_ROWS 8 /* rows per warp: ATT_TILE / ATT_WARPS */
#define ATT_THREADS (32 * ATT_WARPS)
#define ATT_MAX_HD 128

/* The geometry of a launch: b sequences of t positions, h heads of hd. */
struct att_dims {
  int64_t b, t, h, hd, c, row; /* c = h * hd, row = 3c (qkv's row stride) */
  int tiles;                   /* ceil(t / ATT_TILE) */
  float scale;
  bool vec; /* the tensor-core kernels: qkv's tiles copied 16 bytes at a time */
};

/* The tensor cores (WMMA) take a 16-bit qkv with these head sizes. */
bool dt_attention_mma_head(int64_t hd);
/* The forward and the backward's dQ, dK, dV passes on the tensor cores for
 * qkv, out, dout and dqkv of `dtype` (f16 or bf16) and a head size
 * dt_attention_mma_head takes; g as the f32 kernels' (its tiles are
 * recomputed for 64-row blocks). */
dt_status dt_attention_mma_forward(dt_dtype dtype, const void *qkv, void *out, float *lse,
                                   const att_dims &g, cudaStream_t stream);
dt_status dt_attention_mma_backward(dt_dtype dtype, const void *qkv, const float *lse,
                                    const float *dsum, const void *dout, void *dqkv,
                                    const att_dims &g, cudaStream_t stream);

#endif
