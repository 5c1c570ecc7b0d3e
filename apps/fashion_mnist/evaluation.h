// The test pass: the seed's accuracy and mean loss, and the line it prints.
#pragma once

#include "cumulus/data/dataset.h"
#include "cumulus/nn/module.h"

namespace fmnist {

struct EvalResult {
  double accuracy = 0.0;
  double avg_loss = 0.0;
};

// The seed's test loop: accuracy over all samples, and the mean over batches of each batch's mean
// loss. The totals stay on the device until the pass ends: one read per pass, not three per batch.
// Throws Interrupted at a signal.
EvalResult evaluate(cumulus::nn::Module& model, const cumulus::data::DataLoader& loader);

void print_test_results(const EvalResult& r);

}  // namespace fmnist
