// --effective-batch with --memory-budget (or --plan-only): the library's planner with this run.
#pragma once

#include <memory>

#include "cumulus/models/fashion_mnist.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/nn/model.h"
#include "run_config.h"

namespace fmnist {

// --effective-batch: the library's planner (cumulus::plan_batch) with this run's micro-batch,
// optimizer and budget, and the levers --recompute, --data-on and --precision auto give it (Note
// [Plan levers]); the chosen setting is left in place (the model's recompute segments, `train` and
// `test` moved). Returns what with_plan() takes; OutOfMemory when nothing fits.
BatchPlan plan_batch(const RunConfig& c, cumulus::nn::Model& model,
                     const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                     cumulus::models::FashionMnistSplit& train, cumulus::models::FashionMnistSplit& test);

// --plan-only: the planner's table of every candidate, nothing verified, nothing trained.
void print_plan(const RunConfig& c, cumulus::nn::Model& model, const std::shared_ptr<cumulus::nn::FlatParameters>& flat,
                cumulus::models::FashionMnistSplit& train, cumulus::models::FashionMnistSplit& test);

}  // namespace fmnist
