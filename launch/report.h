/* `dtrain report RUN_DIR|METRICS_FILE [--out FILE]`: one self-contained
 * HTML page (inline SVG, no script, nothing fetched) from a run's metrics
 * file (launch/metrics.h; RUN_DIR/metrics.jsonl for a folder), read with
 * cJSON: the run's settings, and plots of the training loss with the test
 * loss, the test metric, throughput, learning rate, gradient norm, memory
 * over time, each rank's step time and the all-reduce time with the part
 * of it hidden behind backward. Written to RUN_DIR/report.html (beside the
 * metrics file) unless --out says otherwise. */
#ifndef DT_LAUNCH_REPORT_H
#define DT_LAUNCH_REPORT_H

#include <stdio.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the page for the metrics file `metrics` to `out_path`. DT_ERR_IO
 * (unreadable, unwritable), DT_ERR_FORMAT naming the line that is not a
 * JSON object (a cut-off last line of a live run is skipped). */
dt_status dt_report_write(const char *metrics, const char *out_path);

/* argv: the arguments after "report". Exit status 0, 1 (message on err),
 * 2 (bad command line). */
int dt_cli_report(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
