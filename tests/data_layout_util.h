// The sample-layout check of the data suites (data_test, text_loader_test).
#ifndef DT_TESTS_DATA_LAYOUT_UTIL_H
#define DT_TESTS_DATA_LAYOUT_UTIL_H

#include "core/data.h"

namespace dtt {

// Expects `got` to describe samples as `want` does: the input's and the
// target's dtype, rank and every dim of that rank.
void ExpectSameLayout(const dt_sample_layout *got, const dt_sample_layout &want);

}  // namespace dtt

#endif
