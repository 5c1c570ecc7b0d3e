#include "evaluation.h"

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/ops/metrics.h"
#include "cumulus/ops/ops.h"
#include "run_control.h"

using namespace cumulus;

namespace fmnist {

EvalResult evaluate(nn::Module& model, const data::DataLoader& loader) {
  NoGradGuard no_grad;
  model.eval();  // batch norm normalizes with its running statistics and leaves them alone
  struct BackToTraining {
    nn::Module& m;
    ~BackToTraining() { m.train(); }
  } restore{model};
  ops::ClassificationTally tally(loader.device());
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    throw_if_interrupted();
    const data::Batch b = loader.batch(i);
    const Tensor logits = model(b.x);
    tally.add(logits, b.y, ops::cross_entropy(logits, b.y, ops::Reduction::Mean));
  }
  const ops::ClassificationTally::Totals t = tally.read();
  EvalResult r;
  r.accuracy = static_cast<double>(t.correct) / static_cast<double>(loader.dataset().size());
  r.avg_loss = t.loss_sum / static_cast<double>(loader.num_batches());
  return r;
}

void print_test_results(const EvalResult& r) {
  say("Test Results:\n Accuracy: %.1f%%, Avg loss: %f\n\n", 100.0 * r.accuracy, r.avg_loss);
}

}  // namespace fmnist
