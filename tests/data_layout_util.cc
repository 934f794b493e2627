#include "tests/data_layout_util.h"

#include <gtest/gtest.h>

namespace dtt {

void ExpectSameLayout(const dt_sample_layout *got, const dt_sample_layout &want) {
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->input_dtype, want.input_dtype);
  EXPECT_EQ(got->target_dtype, want.target_dtype);
  ASSERT_EQ(got->input_ndim, want.input_ndim);
  ASSERT_EQ(got->target_ndim, want.target_ndim);
  for (int i = 0; i < want.input_ndim; i++)
    EXPECT_EQ(got->input_shape[i], want.input_shape[i]) << "input dim " << i;
  for (int i = 0; i < want.target_ndim; i++)
    EXPECT_EQ(got->target_shape[i], want.target_shape[i]) << "target dim " << i;
}

}  // namespace dtt
