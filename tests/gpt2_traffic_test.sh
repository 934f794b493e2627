#!/usr/bin/env bash
# tools/gpt2_traffic.py (docs/gpu-traffic.md): its GPT-2 124M is the
# model's (124,475,904 parameters with the padded vocabulary), its GEMMs'
# FLOPs are the linears' 6 N C x (12 C L + Vp) plus the attention's
# products, and the after table moves fewer bytes than today's.
set -euo pipefail
script="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}/tools/gpt2_traffic.py"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
out=$(python3 "$script") || fail "gpt2_traffic.py failed"
echo "$out" | tail -3
grep -q '^parameters 124475904;' <<<"$out" || fail "not GPT-2 124M's parameter count"
python3 - "$script" <<'PY' || fail "the FLOPs do not add up"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("t", sys.argv[1])
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
B, T, C, H, L, Vp = 16, 1024, 768, 12, 12, 50304
N, hs, TT = B * T, C // H, B * H * T * T
linears = 6.0 * N * C * (12 * C * L + Vp)
for after, att in ((False, 7 * 2.0 * TT * hs * L), (True, 7 * TT * hs * L)):
    rows, params = t.kernels(B, T, after)
    flops = sum(c * f for _, c, _, f, _ in rows)
    assert abs(flops - (linears + att)) < 1e-6 * flops, (after, flops, linears + att)
today = sum(c * b for _, c, b, _, _ in t.kernels(B, T, False)[0])
after = sum(c * b for _, c, b, _, _ in t.kernels(B, T, True)[0])
assert after < today / 3, (today, after)
print("flops and bytes: ok")
PY
