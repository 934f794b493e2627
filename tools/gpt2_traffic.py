#!/usr/bin/env python3
"""Bytes moved and FLOPs of every kernel of one GPT-2 124M training step in
bf16 on the CUDA path, as dtrain runs it today (issue 30's "before" table)
or with the kernels issue 30 asks for (--after), from the op shapes.

    tools/gpt2_traffic.py [--batch 16] [--ctx 1024] [--after] [--markdown]

Each row is one kernel launch kind with its count per step: bytes read +
written in global memory (every operand once: no cache reuse between
kernels, none lost inside a GEMM) and FLOPs (2 per multiply-add). The
dtypes and buffers follow the code (docs/mixed-precision.md; the
attention's GEMM path of core/ops_attention.c, DT_ATTENTION=auto's choice
on a GPU; the bias gradients, the LM head's weight gradient, the
classifier and dqkv as stop 31 left them: from the 16-bit gradient, one
GEMM, two reads of the logits, rounded before the copy into rows). The "unavoidable" line is the issue's floor: weights read in
forward and backward (bf16), the f32 gradients written, AdamW's update of
f32 master weights, two moments and the bf16 working copy, and the
activations a step must keep, each written once and read once in bf16
(with attention that never writes the T x T square). The prediction per
GPU runs each kernel at the larger of its FLOPs at the dense bf16 peak
and its bytes at the memory bandwidth, each derated (GEMMs 70 % of the
peak, memory 80 % of the bandwidth), summed: no overlap between kernels,
no launch gaps.

--after: LayerNorm writes 16-bit y (no cast kernels before the linears);
GELU in c_fc's GELU_AUX epilogue and its backward in the DGELU epilogue of
mlp.c_proj's dx; flash attention (16-bit qkv, out and dqkv; no T x T
square; the causal half of its FLOPs); 16-bit gradients for 16-bit
inputs throughout. The optimizer, the bias gradients, the wte gradient
(one GEMM) and the classifier (two reads of the logits, f32 reductions)
are already as the issue asks.
"""
import argparse

GPUS = {  # dense bf16 FLOP/s, HBM bytes/s (data sheets)
    "h100": (989e12, 3.35e12),
    "h200": (989e12, 4.8e12),
}
GEMM_EFF, MEM_EFF = 0.70, 0.80


# Issue 30's list, one feature each: "ln16": the norms write 16-bit y
# (no cast kernels before the linears; their dx GEMMs round to bf16 and
# the norms' backward reads a 16-bit dy); "gelu": GELU in c_fc's GELU_AUX
# epilogue, its backward in mlp.c_proj's DGELU epilogue; "flash": the flash
# kernels (16-bit qkv, out and dqkv, no T x T square, the causal half of
# the FLOPs); "lnadd": the norms' backward adds the residual's gradient
# and writes the 16-bit sublayer gradient itself. LANDED: what the code
# does today.
FEATURES = ("ln16", "gelu", "flash", "lnadd")
LANDED = ("ln16", "gelu")


def kernels(B, T, after=False, C=768, H=12, L=12, V=50257, Vp=50304, features=None):
    """(name, count, bytes, flops, note) rows of one step: today's kernels
    (LANDED), or with after every feature of issue 30's list (FEATURES),
    or exactly `features`."""
    on = set(features if features is not None else (FEATURES if after else LANDED))
    ln16, gelu, flash, lnadd = (f in on for f in FEATURES)
    N, hs = B * T, C // H
    NC, TT = N * C, B * H * T * T  # activations (B, T, C); the attention's square
    bf, f32 = 2, 4
    ydt, yb = ("bf16", bf) if ln16 else ("f32", f32)  # the norms' y
    rows = []

    def k(name, count, read, write, flops=0.0, note=""):
        rows.append((name, count, read + write, flops, note))

    def weight_grads(name, fin, fout):
        """A linear's weight gradient (fout, fin) added into its f32 .grad by
        one GEMM of the bf16 g and x, and its bias's, reduced from g."""
        k(name + " dW: gemm, += f32 grad", L, bf * N * fout + bf * N * fin + f32 * fin * fout,
          f32 * fin * fout, 2.0 * N * fin * fout)
        k(name + " db: reduce_sum of the bf16 g", L, bf * N * fout, f32 * fout)

    def norm_input_dx(name, fin, count=L):
        """The dx GEMM of a linear whose input is a norm's y: f32 dx for an
        f32 y (the cast's backward folded in), else rounded to bf16."""
        k("%s dx: %s" % (name, "gemm_rounded -> bf16 (its input, the norm's y, is bf16)"
                         if ln16 else "gemm, f32 (its input was the norm's f32 y)"), count,
          bf * N * fin + bf * fin * C, yb * NC, 2.0 * N * fin * C)

    # ---- forward, once ----
    k("embedding: wte rows + wpe, add (f32)", 1, f32 * NC + f32 * T * C + f32 * NC, f32 * NC)
    # ---- forward, per layer ----
    k("ln_1: layer_norm_forward (f32 x -> %s y)" % ydt, L, f32 * NC, yb * NC)
    if not ln16:
        k("cast ln_1 y f32 -> bf16 (c_attn's input)", L, f32 * NC, bf * NC)
    k("c_attn: linear_forward (bias epilogue)", L, bf * NC + bf * 3 * C * C, bf * 3 * NC,
      2.0 * N * C * 3 * C)
    if flash:
        k("attention: flash forward (bf16 qkv -> bf16 out, lse)", L, bf * 3 * NC,
          bf * NC + f32 * B * H * T, 2.0 * TT * hs)
    else:
        k("attention: qkv to heads (copy_strided, bf16)", L, bf * 3 * NC, bf * 3 * NC)
        k("attention: S = q k^T (f32 scores, the whole square)", L, bf * 2 * NC, f32 * TT,
          2.0 * TT * hs)
        k("attention: P = exp(S - lse) (attention_probs)", L, f32 * TT, bf * TT + f32 * B * H * T)
        k("attention: O = P v (f32)", L, bf * TT + bf * NC, f32 * NC, 2.0 * TT * hs)
        k("attention: O to rows (copy_strided, f32)", L, f32 * NC, f32 * NC)
        k("attention: y f32 -> bf16 (the result under autocast)", L, f32 * NC, bf * NC)
    k("attn.c_proj: linear_forward", L, bf * NC + bf * C * C, bf * NC, 2.0 * N * C * C)
    k("ln_2: residual_layer_norm_forward (bf16 a + f32 x -> f32 sum, %s y)" % ydt, L,
      bf * NC + f32 * NC, f32 * NC + yb * NC)
    if not ln16:
        k("cast ln_2 y f32 -> bf16 (c_fc's input)", L, f32 * NC, bf * NC)
    if gelu:
        k("c_fc + gelu: linear_forward, GELU_AUX epilogue (pre-activation kept)", L,
          bf * NC + bf * 4 * C * C, 2 * bf * 4 * NC, 2.0 * N * C * 4 * C)
    else:
        k("c_fc: linear_forward", L, bf * NC + bf * 4 * C * C, bf * 4 * NC, 2.0 * N * C * 4 * C)
        k("gelu (bf16)", L, bf * 4 * NC, bf * 4 * NC)
    k("mlp.c_proj: linear_forward", L, bf * 4 * NC + bf * 4 * C * C, bf * NC, 2.0 * N * 4 * C * C)
    k("residual add (f32 x1 + bf16 f -> f32)", L, f32 * NC + bf * NC, f32 * NC)
    # ---- forward and loss, once ----
    k("ln_f: layer_norm_forward (%s y)" % ydt, 1, f32 * NC, yb * NC)
    if not ln16:
        k("cast ln_f y -> bf16", 1, f32 * NC, bf * NC)
    k("lm_head: linear_forward (bf16 logits)", 1, bf * NC + bf * Vp * C, bf * N * Vp,
      2.0 * N * C * Vp)
    k("classifier_loss_forward (logits read twice: an online f32 max and sum, then the"
      " gradient written in place)", 1, 2 * bf * N * Vp, bf * N * Vp)
    # ---- backward, once ----
    k("classifier_loss_backward (scale dlogits)", 1, bf * N * Vp, bf * N * Vp)
    norm_input_dx("lm_head", Vp, 1)
    k("lm_head dW: one gemm accumulating into the f32 wte gradient", 1,
      bf * N * Vp + bf * NC + f32 * Vp * C, f32 * Vp * C, 2.0 * N * Vp * C)
    k("ln_f backward (%s dy)" % ydt, 1, f32 * NC + yb * NC, f32 * NC)
    # ---- backward, per layer ----
    k("residual add backward: g f32 -> bf16 for f", L, f32 * NC, bf * NC)
    if gelu:
        k("mlp.c_proj dx: gemm_rounded -> bf16, DGELU epilogue (gelu's backward)", L,
          bf * NC + bf * 4 * C * C + bf * 4 * NC, bf * 4 * NC, 2.0 * N * C * 4 * C)
    else:
        k("mlp.c_proj dx: gemm_rounded -> bf16", L, bf * NC + bf * 4 * C * C, bf * 4 * NC,
          2.0 * N * C * 4 * C)
    weight_grads("mlp.c_proj", 4 * C, C)
    if not gelu:
        k("gelu backward (bf16)", L, 2 * bf * 4 * NC, bf * 4 * NC)
    norm_input_dx("c_fc", 4 * C)
    weight_grads("c_fc", C, 4 * C)
    if lnadd:
        k("ln_2 backward (%s dy) with the sum's own gradient added" % ydt, L,
          f32 * NC + yb * NC + f32 * NC, f32 * NC + bf * NC)
    else:
        k("ln_2 backward (layer_norm_backward of the f32 sum, %s dy)" % ydt, L,
          f32 * NC + yb * NC, f32 * NC)
        k("the sum's gradient: add (its own + ln_2's)", L, 2 * f32 * NC, f32 * NC)
        k("a's gradient f32 -> bf16", L, f32 * NC, bf * NC)
    k("attn.c_proj dx: gemm_rounded -> bf16", L, bf * NC + bf * C * C, bf * NC, 2.0 * N * C * C)
    weight_grads("attn.c_proj", C, C)
    if flash:
        k("attention: flash backward (bf16 qkv, out, dout, lse -> bf16 dqkv)", L,
          bf * 3 * NC + 2 * bf * NC + f32 * B * H * T, bf * 3 * NC, 5.0 * TT * hs)
    else:
        k("attention bwd: dO to heads (copy_strided, bf16)", L, bf * NC, bf * NC)
        k("attention bwd: S = q k^T again (f32 square)", L, bf * 2 * NC, f32 * TT, 2.0 * TT * hs)
        k("attention bwd: P from lse (attention_probs)", L, f32 * TT + f32 * B * H * T, bf * TT)
        k("attention bwd: dV = P^T dO (f32)", L, bf * TT + bf * NC, f32 * NC, 2.0 * TT * hs)
        k("attention bwd: dP = dO v^T (f32, over S)", L, 2 * bf * NC, f32 * TT, 2.0 * TT * hs)
        k("attention bwd: dS (attention_dscores, over P)", L, bf * TT + f32 * TT, bf * TT)
        k("attention bwd: dQ = dS k (f32)", L, bf * TT + bf * NC, f32 * NC, 2.0 * TT * hs)
        k("attention bwd: dK = dS^T q (f32)", L, bf * TT + bf * NC, f32 * NC, 2.0 * TT * hs)
        k("attention bwd: the heads' f32 dq, dk, dv rounded to bf16", L, f32 * 3 * NC,
          bf * 3 * NC)
        k("attention bwd: dqkv to rows (copy_strided, bf16)", L, bf * 3 * NC, bf * 3 * NC)
    norm_input_dx("c_attn", 3 * C)
    weight_grads("c_attn", C, 3 * C)
    if lnadd:
        k("ln_1 backward (%s dy) with the residual's gradient added" % ydt, L,
          f32 * NC + yb * NC + f32 * NC, f32 * NC)
    else:
        k("ln_1 backward (%s dy)" % ydt, L, f32 * NC + yb * NC, f32 * NC)
        k("the block input's gradient: add (residual + ln_1's)", L, 2 * f32 * NC, f32 * NC)
    # ---- embedding backward, optimizer, once ----
    params = Vp * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
    k("embedding backward: wte rows += g, wpe += sum over the batch", 1, 2 * f32 * NC,
      f32 * NC + f32 * T * C)
    k("zero_grad (f32 gradients)", 1, 0, f32 * params)
    k("clip: gradient norm (sum of squares) and scale", 1, 2 * f32 * params, f32 * params)
    k("AdamW: f32 p, g, m, v read; p, m, v and the bf16 working copy written", 1,
      4 * f32 * params, 3 * f32 * params + bf * params)
    return rows, params


def unavoidable(B, T, params, C=768, L=12, Vp=50304):
    """The floor: weights (bf16) read in forward and twice in backward (dx, dW
    reads x and g, not w: once), f32 gradients written once, AdamW (f32 p,
    g, m, v read; p, m, v and the bf16 copy written), and per layer the
    activations kept for the backward written once and read once in bf16
    (ln_1 y, qkv, the attention's output, ln_2's sum and y, c_fc's output,
    gelu's: 1 + 3 + 1 + 2 + 4 + 4 = 15 (B, T, C)), plus the logits'
    gradient written and read once."""
    N = B * T
    weights = 2 * 2 * params
    grads = 4 * params
    adamw = 30 * params
    acts = L * 15 * N * C * 2 * 2
    logits = 2 * 2 * N * Vp
    return weights + grads + adamw + acts + logits


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--after", action="store_true",
                   help="the kernels issue 30 asks for instead of today's")
    p.add_argument("--markdown", action="store_true", help="the table as Markdown")
    a = p.parse_args()
    rows, params = kernels(a.batch, a.ctx, a.after)
    floor = unavoidable(a.batch, a.ctx, params)
    if a.markdown:
        print("| kernel | per step | GB per launch | GB per step | GFLOP per step | H100 ms |")
        print("|---|---|---|---|---|---|")
    peak, bw = GPUS["h100"]
    for name, count, b, f, note in rows:
        ms = count * max(f / (peak * GEMM_EFF), b / (bw * MEM_EFF)) * 1e3
        cells = (name + (" (" + note + ")" if note else ""), count, b / 1e9, count * b / 1e9,
                 count * f / 1e9, ms)
        if a.markdown:
            print("| %s | %d | %.3f | %.2f | %.1f | %.2f |" % cells)
        else:
            print("%-86s x%-3d %8.3f GB %8.2f GB %9.1f GFLOP %7.2f ms" % cells)
    tokens = a.batch * a.ctx
    print()
    print("parameters %d; the floor %.1f GB a step" % (params, floor / 1e9))
    for which in (False, True):
        rs, _ = kernels(a.batch, a.ctx, which)
        tot_b = sum(c * b for _, c, b, _, _ in rs)
        tot_f = sum(c * f for _, c, _, f, _ in rs)
        line = "%s: %.1f GB moved (%.2fx the floor), %.2f TFLOP;" % (
            "after" if which else "today", tot_b / 1e9, tot_b / floor, tot_f / 1e12)
        for gpu, (peak, bw) in GPUS.items():
            step = sum(c * max(f / (peak * GEMM_EFF), b / (bw * MEM_EFF)) for _, c, b, f, _ in rs)
            mem = sum(c * b / (bw * MEM_EFF) for _, c, b, f, _ in rs
                      if b / (bw * MEM_EFF) >= f / (peak * GEMM_EFF))
            line += " %s %.1f ms (%.1f ms memory-bound), %.0fK tokens/s;" % (
                gpu, step * 1e3, mem * 1e3, tokens / step / 1e3)
        print(line.rstrip(";"))


if __name__ == "__main__":
    main()
