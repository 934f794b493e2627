// The op table: one row per op case, written once in tests/op_table_cases.cc
// and checked by tests/op_table_test.cc in two ways, as ggml's
// test-backend-ops does:
//   Grad    the finite-difference gradient of every input that requires
//           grad, on the CPU backend (dtt::GradCheck);
//   Parity  the forward output, the input gradients after backward with a
//           fixed random upstream gradient, and the inputs after the call
//           (in-place updates: running statistics, optimizer state), on the
//           device under test against the CPU.
// A row is an op (a callable on public-API tensors), its inputs (shapes and
// how their values are drawn), the dtype of its float inputs (which picks
// the tolerances), an accuracy class and flags.
#ifndef DT_TESTS_OP_TABLE_H
#define DT_TESTS_OP_TABLE_H

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace optable {

// How an input's values are drawn (as f32, then converted to the row's
// dtype); each input of each row gets its own seed, derived from the row's
// name, so adding a row changes no other row's values.
enum class Fill {
  kUniform,       // uniform in [lo, hi)
  kAwayFromZero,  // uniform in [-1, 1) pushed out to |x| >= lo (relu's kink)
  kDistinct,      // distinct values lo apart, shuffled (max pooling without near-ties)
  kIndex,         // integer ids (index_dtype): `ids`, or uniform in [0, hi)
};

struct Input {
  std::vector<int64_t> shape;
  Fill fill = Fill::kUniform;
  float lo = -1.0f, hi = 1.0f;
  bool requires_grad = true;
  std::vector<float> head;  // overrides the first values (zeros, ties, NaN, Inf)
  dt_dtype index_dtype = DT_DTYPE_I64;
  std::vector<int64_t> ids;  // kIndex: the ids (empty: uniform in [0, hi))
  int64_t ignore_every = 0;  // kIndex, random: id i is `ignore` when i % every == every / 2
  int64_t ignore = -100;
  // In a 16-bit row: stored in the row's dtype (as a low-precision op's
  // result reaches the next op under autocast), so its gradient is 16-bit
  // too; the row's f32 reference takes it in f32.
  bool half = false;

  Input Range(float l, float h) const;
  Input Const() const;  // requires_grad false
  Input Away(float margin) const;
  Input Distinct(float gap) const;
  Input Head(std::vector<float> values) const;
  Input Half() const;
};

// A float input of `shape`, uniform in [-1, 1), requiring grad.
Input X(std::vector<int64_t> shape);
// Index inputs: the given ids, or `classes` random ids with every
// `ignore_every`-th one set to `ignore` (0: none).
Input Ids(std::vector<int64_t> ids, std::vector<int64_t> shape, dt_dtype dtype = DT_DTYPE_I64);
Input RandIds(std::vector<int64_t> shape, int64_t classes, dt_dtype dtype = DT_DTYPE_I64,
              int64_t ignore_every = 0, int64_t ignore = -100);

// How close a backend must come to the CPU; the numbers per dtype are in
// the tolerance table of op_table_test.cc.
enum class Acc {
  kExact,          // bit for bit: copies, casts, pooling, dropout masks, lookups
  kElementwise,    // one rounding per element: unary, binary, optimizer updates
  kReduction,      // sums of many terms in an order the backend picks: GEMM, conv, softmax
  kNormalisation,  // mean/variance and their gradients: layer norm, batch norm
};

enum Flags : unsigned {
  kParityOnly = 1u << 0,    // no finite differences: large, non-smooth or not differentiable
  kExactForward = 1u << 1,  // the output bit for bit; gradients and inputs at `acc`
};

struct OpCase {
  std::string op;       // the API entry point it checks: "conv2d" for dt_op_conv2d, "sgd", ...
  std::string variant;  // what this row varies ("" for none)
  dt_dtype dtype;       // of its float inputs; picks the tolerances
  std::vector<Input> inputs;
  dtt::OpFn fn;  // the op on the inputs, which are all on one device
  Acc acc = Acc::kElementwise;
  unsigned flags = 0;
  // Bad-input rows: the status every backend must return, and a piece of
  // its message.
  dt_status expect = DT_OK;
  std::string expect_msg;

  // "<op>_<dtype>[_<variant>]": the test's name.
  std::string Name() const;
};

// The table (tests/op_table_cases.cc).
const std::vector<OpCase> &OpCases();
// Appends the rows of attention and the language-model ops
// (tests/op_table_cases_lm.cc).
void AddLanguageModelCases(std::vector<OpCase> *table);
// Appends the rows of the Llama-family ops: RMS norm, RoPE, SwiGLU and
// grouped-query attention's repeat_kv (tests/op_table_cases_llama.cc).
void AddLlamaCases(std::vector<OpCase> *table);

// *out (an op's output) checked against `reference` (its definition in
// other ops or on the host, computed without recording): |got - want| <=
// atol + rtol * |want| everywhere (NaN matches NaN), else an error naming
// the element (and *out released). What the row's gradient and parity
// checks see is the op's own output (tests/op_table_cases_lm.cc).
dt_status CheckedAgainst(dt_status st, dt_tensor **out,
                         const std::function<dt_status(dt_tensor **)> &reference, double atol,
                         double rtol, const char *what);

void PrintTo(const OpCase *c, std::ostream *os);

}  // namespace optable

#endif  // DT_TESTS_OP_TABLE_H
