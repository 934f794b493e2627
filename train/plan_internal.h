/* The plan's probe, between its files (train/plan.c, train/plan_zero2.c). */
#ifndef DT_TRAIN_PLAN_INTERNAL_H
#define DT_TRAIN_PLAN_INTERNAL_H

#include "train/plan.h"

/* ZeRO 2's peak lines (out->z2, out->z2_lines) from one traced step at
 * micro-batch b1 and one at 2 x b1 (`units` units at b1; context ctx) on
 * the probe's replica `rep`, whose phase hook leaves the backward's last
 * peak in *backward_peak; out->units_per_sample set. */
dt_status dt_plan_probe_zero2(const dt_task *task, dt_replica *rep, int b1, int64_t ctx,
                              double units, const double *backward_peak, dt_plan_probe_result *out);

#endif
