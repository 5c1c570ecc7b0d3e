// --effective-batch with --memory-budget (or --plan-only): the library's planner with this run.
#pragma once

#include <memory>

#include "cumulus/data/dataset.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/model.h"
#include "options.h"

namespace fmnist {

// --effective-batch: the library's planner (cumulus::plan_batch, Note [Planning a micro-batch] in
// engine/memory/planner.cpp) with this run's training micro-batch, optimizer and budget: every
// divisor predicted in reserved bytes with the optimizer state the first step allocates, the
// largest that fits verified by one probe under the limit (--recompute auto: recompute only if it
// lets a larger micro-batch fit). Parameters and batch norm's statistics are left as they were.
// Sets the options' batch_size, accum_steps and recompute. Returns false when --plan-only asks to
// stop after the table.
bool plan_batch(Options& o, cumulus::nn::Model& model, const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                const cumulus::data::ImageDataset& train);

}  // namespace fmnist
