// --effective-batch with --memory-budget (or --plan-only): the library's planner with this run.
#pragma once

#include <memory>

#include "cumulus/models/fashion_mnist.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/model.h"
#include "run_config.h"

namespace fmnist {

// --effective-batch: the library's planner (cumulus::plan_batch, Note [Planning a micro-batch] in
// engine/runtime/planner.cpp) with this run's training micro-batch, optimizer and budget: every
// divisor predicted in reserved bytes with the optimizer state the first step allocates and in
// time, the fastest that fits verified by one probe under the limit. With --recompute, --data-on
// or --precision auto, each setting of those levers is weighed too (Note [Plan levers]) and the
// chosen one is left in place: the model's recompute segments set, `train` and `test` moved where
// the plan puts them. Parameters and batch norm's statistics are left as they were. Returns the
// micro-batch, the accumulation steps and the levers for with_plan() (run_config.h); an
// OutOfMemory error when nothing fits.
BatchPlan plan_batch(const RunConfig& c, cumulus::nn::Model& model,
                     const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                     cumulus::models::FashionMnistSplit& train, cumulus::models::FashionMnistSplit& test);

// --plan-only: the planner's table of every candidate, nothing verified, nothing trained.
void print_plan(const RunConfig& c, cumulus::nn::Model& model, const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                cumulus::models::FashionMnistSplit& train, cumulus::models::FashionMnistSplit& test);

}  // namespace fmnist
