/* dtrain plan: per-rank memory, the micro-batch that fits and a predicted
 * step time for a model on a device (train/plan.h; docs/plan.md). */
#include "launch/plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/amp.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "launch/launcher.h"
#include "launch/plan_load.h"
#include "launch/threads.h"
#include "models/tasks.h"
#include "train/plan.h"

/* Device figures the flags override (0 = the device's own). */
typedef struct device_flags {
  double memory_gib, bf16_tflops, f32_tflops, mem_bw_gbs, nvlink_gbs, net_gbs, latency_us;
} device_flags;

static void apply_device_flags(const device_flags *f, dt_plan_device *d) {
  if (f->memory_gib > 0)
    d->memory = f->memory_gib * (double)DT_GIB;
  if (f->bf16_tflops > 0)
    d->bf16_flops = f->bf16_tflops * 1e12;
  if (f->f32_tflops > 0)
    d->f32_flops = d->tf32_flops = f->f32_tflops * 1e12;
  if (f->mem_bw_gbs > 0)
    d->mem_bw = f->mem_bw_gbs * 1e9;
  if (f->nvlink_gbs > 0)
    d->nvlink_bw = f->nvlink_gbs * 1e9;
  if (f->net_gbs > 0)
    d->net_bw = f->net_gbs * 1e9;
  if (f->latency_us > 0)
    d->latency = f->latency_us * 1e-6;
}

static double mib(double bytes) { return bytes / (double)DT_MIB; }

static void print_json(const dt_plan_config *c, const dt_plan_result *r, const char *model,
                       const char *precision) {
  const dt_plan_memory *m = &r->memory;
  printf(
      "{\"model\": \"%s\", \"device\": \"%s\", \"precision\": \"%s\", \"zero\": %d, "
      "\"ctx\": %lld, \"gpus_per_node\": %d, \"nodes\": %d, \"ranks\": %d, "
      "\"micro_batch\": %d, \"accumulation\": %d, \"global_batch\": %lld, "
      "\"max_micro_batch\": %d, \"rule_batch\": %d, \"recompute\": %s, "
      "\"peak_memory_mib\": %.1f, \"device_memory_mib\": %.1f, "
      "\"memory_mib\": {\"weights\": %.1f, \"copies\": %.1f, \"gradients\": %.1f, "
      "\"optimizer\": %.1f, \"activations\": %.1f, \"workspace\": %.1f, \"comm\": %.1f, "
      "\"overhead\": %.1f}, \"per_sample_mib\": %.3f, "
      "\"step_ms\": %.3f, \"compute_ms\": %.3f, \"memory_ms\": %.3f, \"optimizer_ms\": %.3f, "
      "\"comm_ms\": %.3f, \"comm_exposed_ms\": %.3f, \"straggler_ms\": %.3f, "
      "\"samples_per_s\": %.1f, "
      "\"tokens_per_s\": %.0f, \"mfu\": %.4f, \"peak_tflops\": %.2f, \"peak_source\": \"%s\", "
      "\"act_bw_gbs\": %.1f, \"matmul_eff\": %.3f}\n",
      model, c->device.name, precision, c->zero,
      c->task->sequence_targets ? (long long)c->task->input_shape[0] : 0LL, c->gpus_per_node,
      c->nodes, r->ranks, r->micro_batch, r->accumulation, (long long)r->global_batch,
      r->max_micro_batch, r->rule_batch, c->recompute ? "true" : "false", mib(m->total),
      mib(c->device.memory), mib(m->weights), mib(m->copies), mib(m->gradients), mib(m->optimizer),
      mib(m->activations), mib(m->workspace), mib(m->comm), mib(m->overhead), mib(r->per_sample),
      1e3 * r->step_s, 1e3 * r->compute_s, 1e3 * r->memory_s, 1e3 * r->optimizer_s, 1e3 * r->comm_s,
      1e3 * r->comm_exposed_s, 1e3 * r->straggler_s, r->samples_per_s, r->tokens_per_s, r->mfu,
      r->peak_flops / 1e12, c->device.cpu ? c->device.peak_source : c->device.source,
      (c->device.act_bw > 0 ? c->device.act_bw : c->device.mem_bw) / 1e9, r->matmul_eff);
}

/* The scaling table: 1, 2, 4, 8 GPUs on one node, then 8 per node up to
 * 1024, at the plan's global batch (the micro-batch the largest that fits
 * and divides a rank's share; while the ranks divide it; beyond, a
 * micro-batch of 1 per rank, marked *). */
static void print_scaling(const dt_plan_config *c0, const dt_plan_probe_result *probe,
                          const dt_plan_result *r0) {
  printf("\nscaling (global batch %lld; 8 GPUs per node):\n", (long long)r0->global_batch);
  printf("%6s %6s %6s %6s %10s %10s %14s %7s %11s\n", "gpus", "nodes", "micro", "accum", "step_ms",
         "exposed_ms", c0->task->sequence_targets ? "tokens/s" : "samples/s", "mfu", "efficiency");
  double base = 0.0;
  for (int g = 1; g <= 1024; g *= 2) {
    dt_plan_config c = *c0;
    c.gpus_per_node = g < 8 ? g : 8;
    c.nodes = g < 8 ? 1 : g / 8;
    bool weak = r0->global_batch % g != 0;
    c.micro_batch = weak ? 1 : c0->micro_batch;
    if (!weak && c.micro_batch > 0 && (r0->global_batch / g) % c.micro_batch != 0)
      c.micro_batch = 0; /* the largest that fits and divides the rank's share */
    c.global_batch = weak ? 0 : r0->global_batch;
    dt_plan_result r;
    if (dt_plan_compute(&c, probe, &r) != DT_OK)
      continue;
    double rate = c.task->sequence_targets ? r.tokens_per_s : r.samples_per_s;
    if (g == 1)
      base = rate;
    printf("%6d %6d %6d %6d %10.1f %10.2f %14.0f %6.1f%% %10.0f%%%s\n", g, c.nodes, r.micro_batch,
           r.accumulation, 1e3 * r.step_s, 1e3 * r.comm_exposed_s, rate, 100.0 * r.mfu,
           base > 0 ? 100.0 * rate / (base * g) : 0.0, weak ? " *" : "");
  }
}

static void print_text(const dt_plan_config *c, const dt_plan_probe_result *probe,
                       const dt_plan_result *r, const char *model, const char *precision) {
  const dt_plan_memory *m = &r->memory;
  printf("dtrain plan: model %s (%s) on %d x %d %s, precision %s, zero %d%s\n", model,
         c->task->summary, c->nodes, c->gpus_per_node, c->device.name, precision, c->zero,
         c->recompute ? ", recompute" : "");
  printf(
      "device: %.0f MiB, %.3g TFLOP/s at %s, %.0f GB/s memory, %.0f GB/s NVLink, "
      "%.0f GB/s network (%s)\n",
      mib(c->device.memory), r->peak_flops / 1e12, precision, c->device.mem_bw / 1e9,
      c->device.nvlink_bw / 1e9, c->device.net_bw / 1e9, c->device.source);
  printf(
      "memory per rank at micro-batch %d: %.1f MiB (weights %.1f, copies %.1f, gradients "
      "%.1f, optimizer %.1f, activations %.1f, workspace %.1f, comm %.1f, overhead %.1f)\n",
      r->micro_batch, mib(m->total), mib(m->weights), mib(m->copies), mib(m->gradients),
      mib(m->optimizer), mib(m->activations), mib(m->workspace), mib(m->comm), mib(m->overhead));
  printf(
      "batch: %.3f MiB per sample; largest micro-batch that fits %d; the seed's rule "
      "min(free / per-sample x 0.9, samples / 10) = %d\n",
      mib(r->per_sample), r->max_micro_batch, r->rule_batch);
  printf("step: micro-batch %d x accumulation %d x %d ranks = global batch %lld\n", r->micro_batch,
         r->accumulation, r->ranks, (long long)r->global_batch);
  printf(
      "time: step_ms=%.2f (per micro-batch: compute %.2f, memory %.2f; optimizer %.2f; "
      "comm %.2f, exposed %.2f)\n",
      1e3 * r->step_s, 1e3 * r->compute_s, 1e3 * r->memory_s, 1e3 * r->optimizer_s, 1e3 * r->comm_s,
      1e3 * r->comm_exposed_s);
  if (c->device.cpu)
    printf(
        "calibration: the model's probe steps on this CPU reach %.0f %% of the roof (traffic "
        "included); the optimizer's time is the probe's update; the steps vary by %.1f %% "
        "(the wait for the slowest of %d ranks: %.2f ms)\n",
        100.0 * r->matmul_eff, 100.0 * probe->step_cv, r->ranks, 1e3 * r->straggler_s);
  printf("throughput: samples_per_s=%.1f", r->samples_per_s);
  if (r->tokens_per_s > 0)
    printf(" tokens_per_s=%.0f", r->tokens_per_s);
  printf(" mfu=%.1f%%\n", 100.0 * r->mfu);
  if (r->max_micro_batch < r->micro_batch)
    printf(
        "does not fit: micro-batch %d needs %.1f MiB of %.1f MiB; levers: a smaller "
        "--batch with --global-batch (accumulation), --zero 1 or 2, --recompute, "
        "--precision bf16\n",
        r->micro_batch, mib(m->total), mib(c->device.memory));
}

/* --device's names, in dt_plan_device_kind's order. */
static const char *const device_names[] = {"cpu", "a100", "h100", "h200"};

static bool check_plan_device(const char *value, char *why, size_t cap) {
  for (size_t i = 0; i < sizeof device_names / sizeof device_names[0]; i++)
    if (!strcmp(value, device_names[i]))
      return true;
  snprintf(why, cap, "expected cpu, a100, h100 or h200 (or set the figures with the flags)");
  return false;
}

int dt_cli_plan(int argc, char **argv, FILE *err) {
  const char *model = "mlp", *device = "cpu", *precision = NULL, *optimizer = NULL;
  int batch = 0, zero = 0, ctx = 0, image_size = 0, channels = 0, gpus = 1, nodes = 1, threads = 0;
  int64_t global_batch = 0, data_samples = 0;
  double global_batch_d = 0, data_samples_d = 0;
  bool recompute = false, json = false, scaling = false, probe_load = false;
  device_flags df = {0};
  const dt_task *task = NULL;
  if (dt_cli_peek_flag(argc, argv, "model") &&
      dt_task_find(dt_cli_peek_flag(argc, argv, "model"), &task) == DT_OK && task->defaults &&
      task->defaults->optimizer == DT_TASK_OPTIMIZER_ADAMW)
    optimizer = "adamw";
  dt_clear_error();
  dt_flag flags[] = {
      dt_cli_flag_model(&model),
      DT_STRING_FLAG("device", &device, "KIND",
                     "cpu (this machine: the allocator's cap, the measured roof), a100, h100 or "
                     "h200 (data-sheet figures; the flags below override them)",
                     .check = check_plan_device),
      DT_INT_FLAG("batch", &batch, "N", "micro-batch per rank, 0 = the largest that fits", .min = 0,
                  .field = "micro_batch"),
      DT_DOUBLE_FLAG("global-batch", &global_batch_d, "G",
                     "samples per optimizer step over all ranks (micro-batch x accumulation x "
                     "ranks), 0 = one micro-batch per rank",
                     .min = 0),
      dt_cli_flag_precision(&precision),
      dt_cli_flag_zero(&zero),
      dt_cli_flag_ctx(&ctx),
      DT_CLI_IMAGE_SHAPE_FLAGS(&image_size, &channels),
      DT_INT_FLAG("gpus", &gpus, "N", "devices (ranks) per node", .min = 1, .max = 1024,
                  .field = "gpus_per_node"),
      DT_INT_FLAG("nodes", &nodes, "N", "nodes", .min = 1, .max = 1024),
      dt_cli_flag_optimizer(&optimizer,
                            "optimizer (its state): sgd or adamw (a language "
                            "model's default)"),
      dt_cli_flag_recompute(&recompute),
      DT_DOUBLE_FLAG("data-samples", &data_samples_d, "N",
                     "training set size for the seed's rule (samples / 10), 0 = unknown", .min = 0),
      DT_DOUBLE_FLAG("memory-gib", &df.memory_gib, "GIB", "device memory", .min = 0),
      DT_DOUBLE_FLAG("bf16-tflops", &df.bf16_tflops, "T", "dense bf16/fp16 peak", .min = 0),
      DT_DOUBLE_FLAG("f32-tflops", &df.f32_tflops, "T", "f32 (and tf32) peak", .min = 0),
      DT_DOUBLE_FLAG("mem-bw-gbs", &df.mem_bw_gbs, "GB/s", "memory bandwidth", .min = 0),
      DT_DOUBLE_FLAG("nvlink-gbs", &df.nvlink_gbs, "GB/s",
                     "bandwidth per device within a node (one direction)", .min = 0),
      DT_DOUBLE_FLAG("net-gbs", &df.net_gbs, "GB/s", "bandwidth per device between nodes",
                     .min = 0),
      DT_DOUBLE_FLAG("latency-us", &df.latency_us, "US", "latency of one collective hop", .min = 0),
      DT_BOOL_FLAG("scaling", &scaling, "also the scaling table, 1 to 1024 GPUs (8 per node)"),
      DT_BOOL_FLAG("json", &json, "one JSON object (peak_memory_mib, step_ms, the breakdown)"),
      dt_cli_flag_threads(&threads),
      DT_BOOL_FLAG("probe-load", &probe_load,
                   "run the probe's steps until stdin ends (what a plan for several ranks per "
                   "node on cpu starts for the other ranks while it measures; docs/plan.md)"),
  };
  dt_flag_set set = {
      .command = "plan",
      .usage = "plan --model M --device D [flags]",
      .about =
          "Predicts per-rank memory (weights, gradients, optimizer state, activations,\n"
          "workspaces, communication buffers, allocator overhead), the largest micro-batch\n"
          "that fits, the seed's batch rule and the step time (a roofline of the step's\n"
          "FLOPs and bytes plus the gradient collectives) for a model on cpu, a100, h100\n"
          "or h200. Activations come from three training steps of the model on this\n"
          "CPU at micro-batch 1 and 2. Assumptions: docs/plan.md.",
      .epilogue =
          "example: dtrain plan --model gpt2 --device h100 --gpus 8 --precision bf16 "
          "--global-batch 512 --scaling",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  if (!dt_cli_check_ctx("plan", model, ctx, err))
    return 2;
  global_batch = (int64_t)global_batch_d;
  data_samples = (int64_t)data_samples_d;
  if ((double)global_batch != global_batch_d || (double)data_samples != data_samples_d) {
    fprintf(err, "dtrain plan: --%s %g: expected a whole number\n",
            (double)global_batch != global_batch_d ? "global-batch" : "data-samples",
            (double)global_batch != global_batch_d ? global_batch_d : data_samples_d);
    return 2;
  }
  dt_precision prec = DT_PRECISION_DEVICE_DEFAULT;
  if (precision && dt_precision_parse(precision, &prec) != DT_OK) {
    fprintf(err, "dtrain plan: --precision %s: %s\n", precision, dt_last_error());
    return 2;
  }
  if (!strcmp(device, "cpu") && prec == DT_PRECISION_TF32) {
    fprintf(err, "dtrain plan: --precision tf32 needs a GPU --device (a100, h100, h200)\n");
    return 2;
  }
  if (dt_cli_check_env() != DT_OK)
    return 1;
  if (threads == 0)
    dt_threads_choose_default(1);
  else
    dt_cpu_set_num_threads(threads);

  dt_status st = DT_OK;
  dt_plan_config c = DT_PLAN_CONFIG_DEFAULT;
  dt_task ctx_task;
  dt_mfu_cache roof = {0.0, 0};
  DT_CHECK_GOTO(dt_task_find(model, &task), st, fail);
  ctx_task = *task;
  if (ctx > 0)
    DT_CHECK_GOTO(dt_task_with_context(task, ctx, &ctx_task), st, fail);
  if (dt_cli_task_image_shape(&ctx_task, image_size, channels) != DT_OK) {
    fprintf(err, "dtrain plan: %s\n", dt_last_error());
    return 2;
  }
  c.task = &ctx_task;
  c.precision = prec;
  if (probe_load) {
    dt_optimizer_spec ls =
        dt_train_bench_optimizer(c.task, optimizer && !strcmp(optimizer, "adamw"));
    DT_CHECK_GOTO(dt_plan_probe_load(c.task, prec, recompute, &ls, dt_cli_plan_load_go_on, NULL),
                  st, fail);
    return 0;
  }
  dt_plan_device_kind kind = DT_PLAN_DEVICE_CPU;
  for (int i = 0; i < (int)(sizeof device_names / sizeof device_names[0]); i++)
    if (!strcmp(device, device_names[i]))
      kind = (dt_plan_device_kind)i;
  DT_CHECK_GOTO(dt_plan_device_get(kind, &roof, &c.device), st, fail);
  apply_device_flags(&df, &c.device);
  c.zero = zero;
  c.gpus_per_node = gpus;
  c.nodes = nodes;
  c.micro_batch = batch;
  c.global_batch = global_batch;
  c.data_samples = data_samples;
  c.adamw = optimizer && !strcmp(optimizer, "adamw");
  c.recompute = recompute;
  dt_optimizer_spec spec = dt_train_bench_optimizer(c.task, c.adamw);
  /* the settings first (on an empty probe), then the model's minutes */
  dt_plan_probe_result probe = {.units_per_sample = 1.0};
  dt_plan_result r;
  if (dt_plan_compute(&c, &probe, &r) == DT_OK) {
    /* on cpu, the probe measures with the node's other ranks running */
    dt_cli_plan_load load = {0};
    int copies = c.device.cpu
                     ? dt_cli_plan_load_copies(gpus, dt_cpu_num_threads(), dt_cli_cores_available())
                     : 0;
    if (copies > 0 && dt_cli_plan_load_start(copies, argc, argv, &load, err) != 0)
      return 1;
    st = dt_plan_probe(c.task, prec, recompute, &spec, &probe);
    dt_cli_plan_load_stop(&load);
    if (st != DT_OK)
      goto fail;
    if (dt_plan_compute(&c, &probe, &r) == DT_OK)
      DT_CHECK_GOTO(dt_plan_cpu_shapes(&c, &probe, &r, &roof), st, fail);
  }
  if (dt_plan_compute(&c, &probe, &r) != DT_OK) {
    char msg[1024];
    dt_flags_name_fields(&set, dt_last_error(), msg, sizeof msg);
    fprintf(err, "dtrain plan: %s\n", msg);
    return 2;
  }
  const char *pname = precision ? precision : c.device.cpu ? "fp32" : "tf32";
  if (json) {
    print_json(&c, &r, model, pname);
    return 0;
  }
  print_text(&c, &probe, &r, model, pname);
  if (scaling)
    print_scaling(&c, &probe, &r);
  return 0;
fail:
  (void)st;
  fprintf(err, "dtrain plan: %s\n", dt_last_error());
  return 1;
}
