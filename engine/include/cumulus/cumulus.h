// cumulus in one include: everything a training loop needs, as `import torch` gives it. The models
// are a library of their own on top of the engine (cumulus::models, <cumulus/models/mlp.h> and
// <cumulus/models/cnn.h>), with the datasets they are trained on (<cumulus/models/fashion_mnist.h>,
// <cumulus/models/text.h>); a model of the user's own implements nn::Model (cumulus/nn/model.h).
// File-format readers and tools behind those datasets (data/idx.h, io/checksum.h) are included
// where they are used.
//
//   #include <cumulus/cumulus.h>
//   #include <cumulus/models/mlp.h>
//   using namespace cumulus;
//   Generator gen(0);
//   models::SeedMLP model(gen);
//   auto params = std::make_shared<nn::FlatParameters>(model);
//   train::TrainerOptions options;
//   options.accum_steps = 4;
//   train::Trainer trainer(std::make_shared<optim::SGD>(params, optim::SGDOptions{}), options);
//   trainer.begin_epoch(0);
//   // The units are what the summed loss adds up: a classifier's samples, x [B, 784], y [B] ...
//   trainer.micro_batch(x.size(0), [&] { return ops::cross_entropy(model(x), y, ops::Reduction::Sum); });
//   // ... a language model's tokens, tokens and next [B, T]: B x T, never its B rows (checked)
//   trainer.micro_batch(next.numel(), [&] { return ops::cross_entropy(lm(tokens), next, ops::Reduction::Sum); });
//   trainer.step_if_ready();                             // per micro-batch; flush() at an epoch's end
//   io::save_state_dict("weights.safetensors", model);  // PyTorch's load_state_dict takes it
//
// No header here includes the CUDA toolkit's: the CUDA backend's are private (docs/ARCHITECTURE.md),
// so a program using the installed library needs no CUDA toolkit.
#pragma once

#include "cumulus/core/device.h"
#include "cumulus/core/error.h"
#include "cumulus/core/op_profile.h"
#include "cumulus/core/precision.h"
#include "cumulus/core/threads.h"
#include "cumulus/core/timer.h"

#include "cumulus/tensor/dtype.h"
#include "cumulus/tensor/random.h"
#include "cumulus/tensor/shape.h"
#include "cumulus/tensor/tensor.h"

#include "cumulus/autograd/function.h"
#include "cumulus/autograd/grad_mode.h"

#include "cumulus/ops/attention.h"
#include "cumulus/ops/compare.h"
#include "cumulus/ops/convolution.h"
#include "cumulus/ops/fused_mlp.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/loss.h"
#include "cumulus/ops/math.h"
#include "cumulus/ops/metrics.h"
#include "cumulus/ops/normalization.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/ops/rotary.h"
#include "cumulus/ops/shape.h"

#include "cumulus/nn/activation_layers.h"
#include "cumulus/nn/clip_grad.h"
#include "cumulus/nn/conv_layers.h"
#include "cumulus/nn/embedding.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/init.h"
#include "cumulus/nn/layers.h"
#include "cumulus/nn/model.h"
#include "cumulus/nn/module.h"
#include "cumulus/nn/norm_layers.h"

#include "cumulus/optim/adamw.h"
#include "cumulus/optim/lr_schedule.h"
#include "cumulus/optim/optimizer.h"
#include "cumulus/optim/sgd.h"

#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"

#include "cumulus/plan/planner.h"

#include "cumulus/train/accumulation.h"
#include "cumulus/train/checkpoint.h"
#include "cumulus/train/trainer.h"

#include "cumulus/data/csv.h"
#include "cumulus/data/dataset.h"
#include "cumulus/data/token_windows.h"

#include "cumulus/io/run_files.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/io/state_dict.h"
