/* Direct stride-1 convolution on AVX-512 for small images (LeNet's
 * layers): the products of cpu_kernels_conv.c's wide-row formulation
 * without im2col, col2im or sgemm. Private to the CPU backend.
 *
 * With stride 1 and the outputs numbered p = oy * wp + ox over the padded
 * input's rows (wp wide), the im2col row of tap r = (ci, ki, kj) is the
 * padded input itself from off[r] = ci*hp*wp + ki*wp + kj on. The three
 * products of a convolution are then small GEMMs whose B rows are runs of
 * one buffer at per-row offsets, which these kernels read in place:
 *   forward  wide (oc, L)   = w (oc, ckk) . X           X[r][p] = xp[off[r] + p]
 *   dw       dw (oc, ckk)  += dwide (oc, L) . X^T
 *   dx       dxp (c, plane) = wt (c, oc*taps) . G       G[(o,t)][q] = dwide[o][q - tap_t]
 * (wt[ci][o*taps + t] = w[o][ci*taps + t]; dwide is dy on wide rows with
 * zeros in the columns between output rows and around it). Register tiles
 * of 6 x 64 (forward, dx) and 4 x 6 dot products of 16 lanes (dw); the
 * sums run in another order than sgemm's, so results agree with the
 * im2col path to rounding, not bit for bit. */
#ifndef DT_CORE_CPU_CONV_DIRECT_H
#define DT_CORE_CPU_CONV_DIRECT_H

#include <stddef.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the direct kernels run g: stride 1, a kernel larger than 1x1, an
 * image and its products small enough to stay in the core's caches, the
 * CPU has AVX-512F, and they are not switched off. */
int dt_cpu_conv_direct_usable(const dt_conv2d_geom *g);

/* The setting of dt_cpu_set_conv_direct (core/cpu.h): 0 also keeps the
 * small-plane table kernels (core/cpu_conv_table.h) scalar. */
int dt_cpu_conv_simd_enabled(void);

/* Floats of per-image scratch the kernels below need (offsets included). */
size_t dt_cpu_conv_direct_scratch_floats(const dt_conv2d_geom *g);

/* One image: x (c,h,w), w (oc, c*kh*kw), bias (oc) or NULL -> y (oc,oh,ow). */
void dt_cpu_conv_direct_forward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                                      const float *bias, float *y, float *scratch);

/* wt (c, oc*kh*kw) from w (oc, c*kh*kw): the dx product's left operand. */
void dt_cpu_conv_direct_pack_wt(const dt_conv2d_geom *g, const float *w, float *wt);

/* One image of the backward: dw_acc (oc, c*kh*kw) = (accumulate ? dw_acc :
 * 0) + the image's weight gradient when dw_acc is not NULL; dx (c,h,w)
 * overwritten when dx is not NULL (wt from dt_cpu_conv_direct_pack_wt). */
void dt_cpu_conv_direct_backward_image(const dt_conv2d_geom *g, const float *x, const float *wt,
                                       const float *dy, float *dx, float *dw_acc, int accumulate,
                                       float *scratch);

#ifdef __cplusplus
}
#endif
#endif
