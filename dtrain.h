/* dtrain as a library: the one header an embedder includes.
 *
 *   #include <dtrain.h>          // cc prog.c $(pkg-config --cflags --libs dtrain)
 *
 * It includes every public header of the layers an embedder uses (docs/api.md
 * says what each is for); the headers are plain C11, `extern "C"` for C++,
 * and name each other relative to the installed root (PREFIX/include/dtrain),
 * as "core/tensor.h". Every fallible function returns a dt_status; the
 * message is dt_last_error() on the calling thread. The creator of an object
 * destroys it; destroying NULL is a no-op; tensors are reference-counted
 * (dt_tensor_retain / dt_tensor_release).
 *
 * Linking the library registers the CPU backend (and the CUDA backend where
 * the build has the toolkit and the machine a GPU) from constructors.
 */
#ifndef DTRAIN_H
#define DTRAIN_H

/* ---- core: errors, random numbers, settings, trace spans ---- */
#include "core/env.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/trace.h"

/* ---- core: devices, backends, memory, 16-bit floats ---- */
#include "core/backend.h"
#include "core/cpu.h"
#include "core/device.h"
#include "core/half.h"
#include "core/memory.h"

/* ---- core: tensors, autograd, ops, mixed precision ---- */
#include "core/amp.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

/* ---- core: modules and layers, optimizers and LR schedules, the step ---- */
#include "core/module.h"
#include "core/nn.h"
#include "core/optim.h"
#include "core/step.h"

/* ---- core: data sets, samplers, loaders, text; checkpoints ---- */
#include "core/checkpoint.h"
#include "core/data.h"
#include "core/image.h"
#include "core/text.h"

/* ---- the CUDA backend's own calls (they refuse cleanly without CUDA) ---- */
#include "cuda/cuda.h"

/* ---- dist: process group, communicators, DDP, replicas, data parallel ---- */
#include "dist/agree.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/dp.h"
#include "dist/process_group.h"
#include "dist/replica.h"

/* ---- models: the zoo and the tasks ---- */
#include "models/models.h"
#include "models/tasks.h"

/* ---- the trainer ---- */
#include "train/mfu.h"
#include "train/run_lock.h"
#include "train/sample.h"
#include "train/train_checkpoint.h"
#include "train/train_lm.h"
#include "train/train_loop.h"

#endif
