/* Winograd F(2x2, 3x3) convolution for 3x3 stride-1 layers (ResNet's and
 * VGG's), f32, NCHW. Private to the CPU backend.
 *
 * Each 2x2 block ("tile") of outputs is computed from the 4x4 input patch
 * under it: with V = B^T d B the patch's transform (per input channel),
 * U = G g G^T the filter's (per output and input channel), and
 * M[e] = U[e] V[e] summed over input channels for each of the 16 elements
 * e, the tile is A^T M A. The 16 products over channels are GEMMs of
 * (oc x c) by (c x tiles) instead of im2col's (oc x 9c) by (9c x pixels):
 * 16 multiply-adds per 4 outputs and channel pair instead of 36. The
 * backward runs the same transforms' adjoints: dM = A dY A^T,
 * dV[e] = U[e]^T dM[e] (then dx = the overlap-add of B dV B^T over the
 * patches), dU[e] = sum over tiles of dM[e] V[e]^T (then dw = G^T dU G).
 * The transforms add and halve; the sums differ from the im2col path's by
 * rounding only (relative 1e-6 on ResNet's layers), not bit for bit. */
#ifndef DT_CORE_CPU_CONV_WINOGRAD_H
#define DT_CORE_CPU_CONV_WINOGRAD_H

#include "core/backend.h"
#include "core/cpu.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The callers take these for the shapes dt_cpu_conv_winograd_eligible
 * (core/cpu.h) accepts: 3x3 stride-1 shapes where the path measured faster
 * (docs/decisions.md, "Winograd"), with it switched on
 * (dt_cpu_set_conv_winograd, DT_CONV_WINOGRAD).
 *
 * x (n,c,h,w), w (oc,c,3,3), bias (oc) or NULL -> y (n,oc,oh,ow), on nt
 * threads. */
dt_status dt_cpu_conv_winograd_forward(const dt_conv2d_geom *g, const float *x, const float *w,
                                       const float *bias, float *y, int nt);

/* dx (n,c,h,w) overwritten when not NULL; dw (oc,c,3,3) overwritten, or
 * added to with dw_acc, when not NULL. The bias gradient is the caller's. */
dt_status dt_cpu_conv_winograd_backward(const dt_conv2d_geom *g, const float *x, const float *w,
                                        const float *dy, float *dx, float *dw, int dw_acc, int nt);

#ifdef __cplusplus
}
#endif
#endif
