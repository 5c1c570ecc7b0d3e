// The checks of a micro-batch's loss before its backward (loss_checks.h): a mean (Note
// [Mean-reduced losses] in trainer_accumulation.cpp), a sum scaled by a constant, and units other
// than the positions the loss summed.
//
// Note [Loss normalized once]
// The step divides the group's summed gradient by its units (Note [Exact normalization] in
// trainer_step.cpp), so a loss the caller divided already is normalized twice and trains with a
// gradient smaller by that factor, silently: clipping never acts, validation ends worse. Told
// that Reduction::Mean is refused, a PyTorch user writes the next habit, cross_entropy(..., Sum) /
// (B * T * accum), so the check walks the loss's tail: the nodes that combine losses rather than
// compute them. Pass-on nodes (OutputReduction::none: views, casts, x + s, -x), sums of losses
// (added: a + b, a - b) and constant scalings (scaled: x * s, x / s, and x * t, x / t for a tensor
// t with no gradient, such as a count made by hand) are walked through; anything else ends the
// walk: a sum, a mean, a leaf, an op of unknown meaning. A sum reached through a scaling is
// refused, naming the scaling, the sum's op and the fix (return the sum); a mean anywhere in the
// tail is refused as a mean. A scaling of an op of unknown meaning (0.5 * a custom loss) is taken:
// nothing says what it scales. A deliberate weighting (ce + 0.1 * aux, the 1/2 in front of a
// squared error) says so with AccumulationOptions::weighted_loss: then only a loss that is a mean
// as a whole is refused (the walk through pass-on nodes alone) and the units are not checked.
// Normalization::none divides by nothing, so it takes any loss. The walk visits each node of the
// tail once: a few pointer reads per micro-batch.
//
// Note [Units checked against the loss]
// The units a micro-batch declares (Trainer::micro_batch's; Batch::units in train_epoch) are what
// the step divides by, so a language model passing its rows (x.size(0): 8 windows) where its loss
// summed 512 tokens trains with gradients 64 times too large, silently. A loss whose op knows how
// many positions it summed (cross_entropy and mlp_cross_entropy: Node::summed_positions, the
// labels that are not ignore_index) is checked against them, and a mismatch stops the micro-batch
// before its backward, naming both numbers and the fix. The count is that of the one counting
// term of the tail (through pass-on nodes and sums of losses: ce + a weight penalty is checked
// against ce's positions). A loss adding several counting terms (two heads' cross-entropies) is
// not checked: whether its unit is a position of one or of both is the caller's choice, and
// summing their counts would refuse the common case. Nor is a loss with no counting term (a custom
// loss, ops::sum of a squared error), nor a micro-batch whose labels are all ignored (it adds no
// loss, and the Trainer takes no micro-batch of 0 units). Normalization::units divides by the
// units and micro_batches by units x N, so both check; none divides by nothing and checks nothing;
// weighted_loss turns the check off. Where the count is known on the host (the CPU) every
// micro-batch is checked. Labels on a GPU would cost a wait per micro-batch, so there the check
// reads them at the first micro-batch of each unit count the Trainer sees (the first one, an
// epoch's shorter last), which runs eagerly, never inside a graph capture; later micro-batches of
// a count already checked are not.
#include "loss_checks.h"

#include <sstream>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cumulus/autograd/node.h"
#include "cumulus/core/error.h"

namespace cumulus::train {

namespace {

// What the loss's tail holds (Note [Loss normalized once]).
struct LossTail {
  Node* mean = nullptr;        // the first mean-reduced term met
  Node* scaled_sum = nullptr;  // the first sum met under a scaling
  Node* scaling = nullptr;     // the outermost scaling above it
  std::vector<Node*> sums;     // the sums met under no scaling
};

// The nodes the walk goes through: those that combine losses rather than compute them.
bool walks_through(OutputReduction r) {
  return r == OutputReduction::none || r == OutputReduction::added || r == OutputReduction::scaled;
}

LossTail walk_tail(const Tensor& loss) {
  LossTail tail;
  std::vector<std::pair<Node*, Node*>> pending;  // a node, and the outermost scaling above it
  std::unordered_set<const Node*> seen;
  if (loss.grad_fn()) pending.emplace_back(loss.grad_fn().get(), nullptr);
  while (!pending.empty()) {
    const auto [node, scaling] = pending.back();
    pending.pop_back();
    if (!seen.insert(node).second) continue;
    const OutputReduction r = node->output_reduction();
    if (walks_through(r)) {
      Node* above = scaling != nullptr ? scaling : r == OutputReduction::scaled ? node : nullptr;
      for (const Edge& e : node->next_edges())
        if (e.node != nullptr) pending.emplace_back(e.node.get(), above);
    } else if (r == OutputReduction::mean && tail.mean == nullptr) {
      tail.mean = node;
    } else if (r == OutputReduction::sum && scaling == nullptr) {
      tail.sums.push_back(node);
    } else if (r == OutputReduction::sum && tail.scaled_sum == nullptr) {
      tail.scaled_sum = node;
      tail.scaling = scaling;
    }
  }
  return tail;
}

// The mean the loss is as a whole: reached from its grad_fn through pass-on nodes alone.
Node* mean_as_a_whole(const Tensor& loss) {
  Node* node = loss.grad_fn().get();
  while (node != nullptr && node->output_reduction() == OutputReduction::none && node->next_edges().size() == 1)
    node = node->next_edges().front().node.get();
  return node != nullptr && node->output_reduction() == OutputReduction::mean ? node : nullptr;
}

bool takes_reduction(const std::string& op) { return op == "cross_entropy" || op == "mlp_cross_entropy"; }

// The fix for a mean-reduced loss made by `op`.
std::string summed_instead(const std::string& op) {
  if (op == "mean") return "ops::sum instead of ops::mean";
  if (takes_reduction(op)) return "ops::" + op + "(..., ops::Reduction::Sum)";
  return "the sum over the samples instead";
}

// The opt-out, with the Note that says why the check exists.
std::string weighted_loss_instead(const char* note) {
  return std::string("to weight the loss on purpose, set TrainerOptions::weighted_loss (Note [") + note + "])";
}

// Refuses a mean (Note [Mean-reduced losses]): `whole` when the loss is the mean itself.
[[noreturn]] void refuse_mean(const Node& mean, bool whole, const char* caller) {
  const std::string op = mean.name();
  throw InvalidArgument(std::string("Trainer::") + caller + ": the loss " + (whole ? "is" : "holds") +
                        " a mean (made by op '" + op + "'" + (takes_reduction(op) ? " with Reduction::Mean" : "") +
                        "), so its gradient would be 1/B of the right one: the step divides by the group's "
                        "units itself. Pass the summed loss: " +
                        summed_instead(op) + (whole ? "" : "; " + weighted_loss_instead("Loss normalized once")));
}

// "divided by 2048 (op 'div')", "multiplied by a tensor with no gradient (op 'mul')".
std::string scaling_text(const Node& scaling) {
  std::ostringstream s;
  s << (scaling.scale_divides() ? "divided by " : "multiplied by ");
  if (scaling.scale_is_tensor()) s << "a tensor with no gradient";
  else s << scaling.scale_constant();
  s << " (op '" << scaling.name() << "')";
  return s.str();
}

[[noreturn]] void refuse_scaled_sum(const Node& sum, const Node& scaling, const char* caller) {
  const std::string op = sum.name();
  const std::string sum_itself =
      takes_reduction(op) ? "ops::" + op + "(..., ops::Reduction::Sum) itself" : "the ops::" + op + " itself";
  throw InvalidArgument(std::string("Trainer::") + caller + ": the loss is a sum (made by op '" + op + "') " +
                        scaling_text(scaling) +
                        ", and the step divides by the group's units itself: the loss would be normalized twice "
                        "and its gradient scaled by that constant. Return the summed loss (" +
                        sum_itself + ", no division by a count) and let the Trainer divide by the units; " +
                        weighted_loss_instead("Loss normalized once"));
}

// "64 times", "1/64 of".
std::string factor_text(int64_t positions, int64_t units) {
  std::ostringstream s;
  if (positions >= units) s << static_cast<double>(positions) / static_cast<double>(units) << " times";
  else s << "1/" << static_cast<double>(units) / static_cast<double>(positions) << " of";
  return s.str();
}

void check_units(const std::vector<Node*>& sums, const LossCheck& check) {
  Node* counter = nullptr;
  for (Node* sum : sums) {
    if (sum->summed_positions(false) == Node::kNoPositions) continue;
    if (counter != nullptr) return;  // several counting terms: the unit is the caller's choice
    counter = sum;
  }
  if (counter == nullptr) return;
  int64_t positions = counter->summed_positions(false);
  if (positions == Node::kPositionsOnDevice) {
    if (!check.read_device) return;
    positions = counter->summed_positions(true);
  }
  if (positions <= 0 || positions == check.units) return;
  throw InvalidArgument(detail::concat(
      "Trainer::", check.caller, ": the micro-batch declares ", check.units, " units, but its loss's ", counter->name(),
      " summed ", positions, " positions (labels not ignore_index); the step divides by the declared units, so the ",
      "gradient would be ", factor_text(positions, check.units), " the right one. Declare the units the loss sums ",
      "over: tokens for a language model (B x T, less the labels equal to ignore_index), samples for a classifier ",
      "(in train_epoch: Batch::units, set by TensorDataset::set_units_per_row); ",
      weighted_loss_instead("Units checked against the loss")));
}

}  // namespace

void check_loss(const Tensor& loss, const LossCheck& check) {
  if (Node* whole = mean_as_a_whole(loss)) refuse_mean(*whole, true, check.caller);
  if (check.weighted) return;
  const LossTail tail = walk_tail(loss);
  if (tail.mean != nullptr) refuse_mean(*tail.mean, false, check.caller);
  if (tail.scaled_sum != nullptr) refuse_scaled_sum(*tail.scaled_sum, *tail.scaling, check.caller);
  check_units(tail.sums, check);
}

}  // namespace cumulus::train
