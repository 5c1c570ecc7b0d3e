// Out-of-memory reports: the allocator keeps the failing request, the op that asked and what was
// live by category and by op; the tracker adds the micro-batch in progress; the JSON report and
// the table show them. Every number must add up to the allocator's state at the failure.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cumulus/autograd/grad_mode.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/reduce.h"
#include "test_util.h"

namespace cumulus {
namespace {

using testing::DeviceTest;
using testing::memory_table_text;

constexpr int64_t MiB = 1 << 20;

struct LimitGuard {
  CachingAllocator& a;
  ~LimitGuard() { a.set_memory_limit(0); }
};

int64_t sum_by_category(const OutOfMemoryRecord& r) {
  int64_t n = 0;
  for (int64_t b : r.live_by_category) n += b;
  return n;
}

int64_t sum_by_op(const OutOfMemoryRecord& r) {
  int64_t n = 0;
  for (const auto& [op, b] : r.live_by_op) n += b;
  return n;
}

int64_t live_of(const OutOfMemoryRecord& r, const std::string& op) {
  for (const auto& [name, b] : r.live_by_op)
    if (name == op) return b;
  return 0;
}

// The invariants every record must satisfy: it adds up to the allocator's state then.
void expect_adds_up(const OutOfMemoryRecord& r) {
  EXPECT_EQ(sum_by_category(r), r.allocated);
  EXPECT_EQ(sum_by_op(r), r.allocated);
  EXPECT_GE(r.peak_bytes, r.allocated);
  EXPECT_GE(r.reserved, r.allocated);
  EXPECT_EQ(r.rounded_bytes % CachingAllocator::kRounding, 0);
  EXPECT_GE(r.rounded_bytes, r.requested_bytes);
  EXPECT_GE(r.segment_bytes, r.rounded_bytes);
  if (r.limit > 0) EXPECT_GT(r.segment_bytes + r.reserved, r.limit);
  for (std::size_t i = 1; i < r.live_by_op.size(); ++i)
    EXPECT_GE(r.live_by_op[i - 1].second, r.live_by_op[i].second) << "largest first";
}

TEST(OpScope, NamesTheInnermostOpAndRestores) {
  EXPECT_EQ(current_op().name, nullptr);
  EXPECT_EQ(op_label(current_op().name, current_op().backward), "(no op)");
  {
    OpScope outer("conv2d");
    EXPECT_STREQ(current_op().name, "conv2d");
    {
      OpScope inner("linear", true);
      EXPECT_EQ(op_label(current_op().name, current_op().backward), "linear backward");
    }
    EXPECT_STREQ(current_op().name, "conv2d");
    EXPECT_FALSE(current_op().backward);
  }
  EXPECT_EQ(current_op().name, nullptr);
}

class OomReportTest : public DeviceTest {};

// x [192, 1024] and W [4096, 1024]: the output of linear is [192, 4096], 3 MiB, a large-pool
// request. The limit leaves 1 MiB above what is reserved, so linear's output is what fails.
struct Linear {
  Tensor x, w, b;
};

Linear make_linear(Device device) {
  Linear l;
  {
    MemoryCategoryScope data(MemoryCategory::data);
    l.x = Tensor::full(Shape{192, 1024}, 0.5f, device);
  }
  MemoryCategoryScope params(MemoryCategory::parameters);
  l.w = Tensor::full(Shape{4096, 1024}, 0.01f, device);
  l.b = Tensor::full(Shape{4096}, 0.0f, device);
  l.w.set_requires_grad(true);
  l.b.set_requires_grad(true);
  return l;
}

TEST_P(OomReportTest, ForwardFailureNamesLinearAndAddsUp) {
  CachingAllocator& alloc = allocator_for(device());
  LimitGuard guard{alloc};
  const Linear l = make_linear(device());
  memory::MemoryTracker::Options o;
  o.micro_batch_size = 192;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(device(), o);
  EXPECT_FALSE(tracker.out_of_memory().has_value()) << "an earlier failure is not this tracker's";

  alloc.empty_cache();
  alloc.set_memory_limit(alloc.stats().reserved + MiB);
  tracker.begin_micro_batch(2, 5, 192);
  std::string message;
  try {
    Tensor y = ops::linear(l.x, l.w, l.b);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    message = e.what();
  }
  const auto rec = alloc.last_out_of_memory();
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->op, "linear");
  EXPECT_EQ(rec->category, MemoryCategory::activations);
  EXPECT_EQ(rec->requested_bytes, 192 * 4096 * 4);
  EXPECT_EQ(rec->rounded_bytes, 192 * 4096 * 4);
  EXPECT_GT(rec->requested_bytes + rec->reserved, rec->limit);
  EXPECT_EQ(rec->sequence, alloc.stats().oom_count);
  expect_adds_up(*rec);
  // Tensors made outside any op (the input, the parameters) are "(no op)".
  EXPECT_GE(live_of(*rec, "(no op)"), (192 + 4096) * 1024 * 4);
  EXPECT_NE(message.find("(activations) in linear"), std::string::npos) << message;

  const auto tracked = tracker.out_of_memory();
  ASSERT_TRUE(tracked.has_value());
  EXPECT_TRUE(tracked->in_progress);
  EXPECT_STREQ(tracked->phase, "forward");
  EXPECT_EQ(tracked->epoch, 2);
  EXPECT_EQ(tracked->index, 5);
  EXPECT_EQ(tracked->units, 192);
  alloc.set_memory_limit(0);

  // No micro-batch completed, yet the summary's peak is the one reached before the failure.
  EXPECT_EQ(tracker.micro_batches_seen(), 0);
  EXPECT_EQ(tracker.summary().peak_bytes, rec->peak_bytes);
  EXPECT_GT(tracker.summary().peak_bytes, 0);

  const auto j = nlohmann::ordered_json::parse(memory::memory_report_json(tracker));
  std::string after_summary;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() == "summary" && std::next(it) != j.end()) after_summary = std::next(it).key();
  EXPECT_EQ(after_summary, "out_of_memory");
  const auto& oom = j["out_of_memory"];
  EXPECT_EQ(oom["op"], "linear");
  EXPECT_EQ(oom["category"], "activations");
  EXPECT_EQ(oom["requested_bytes"], rec->requested_bytes);
  EXPECT_EQ(oom["limit_bytes"], rec->limit);
  EXPECT_EQ(oom["reserved_bytes"], rec->reserved);
  EXPECT_EQ(oom["allocated_bytes"], rec->allocated);
  int64_t cats = 0, ops = 0;
  for (const auto& [k, v] : oom["live_by_category"].items()) cats += v.get<int64_t>();
  for (const auto& [k, v] : oom["live_by_op"].items()) ops += v.get<int64_t>();
  EXPECT_EQ(cats, rec->allocated);
  EXPECT_EQ(ops, rec->allocated);
  EXPECT_EQ(oom["micro_batch"]["phase"], "forward");
  EXPECT_EQ(oom["micro_batch"]["epoch"], 3);  // reports count epochs from 1
  EXPECT_EQ(oom["micro_batch"]["index"], 5);
  EXPECT_EQ(oom["micro_batch"]["units"], 192);
  EXPECT_EQ(j["summary"]["peak_bytes"], rec->peak_bytes);

  // The table prints one line about it, naming the op.
  const std::string table = memory_table_text(tracker);
  EXPECT_NE(table.find("out of memory in the forward of epoch 3, micro-batch 5: linear asked for 3.0 MiB"),
            std::string::npos)
      << table;
}

TEST_P(OomReportTest, BackwardFailureNamesTheBackwardOpAndLiveOutputs) {
  CachingAllocator& alloc = allocator_for(device());
  LimitGuard guard{alloc};
  const Linear l = make_linear(device());
  memory::MemoryTracker::Options o;
  o.micro_batch_size = 192;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(device(), o);
  tracker.begin_micro_batch(0, 0, 192);
  Tensor y = ops::linear(l.x, l.w, l.b);
  Tensor loss = ops::sum(y);
  tracker.end_forward();
  // Room for nothing large: sum's backward needs dy [192, 4096] (3 MiB) first.
  alloc.empty_cache();
  alloc.set_memory_limit(alloc.stats().reserved + MiB);
  EXPECT_THROW(loss.backward(), OutOfMemory);
  alloc.set_memory_limit(0);

  const auto rec = alloc.last_out_of_memory();
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->op, "sum backward");
  EXPECT_EQ(rec->category, MemoryCategory::backward_temporaries);
  EXPECT_EQ(rec->requested_bytes, 192 * 4096 * 4);
  expect_adds_up(*rec);
  // Linear's output is alive (held here and by nothing else), attributed to linear.
  EXPECT_GE(live_of(*rec, "linear"), 192 * 4096 * 4);
  EXPECT_GE(live_of(*rec, "sum"), 1);  // the loss scalar
  EXPECT_EQ(live_of(*rec, "linear") + live_of(*rec, "sum") + live_of(*rec, "(no op)") +
                live_of(*rec, "sum backward"),
            rec->allocated);

  const auto tracked = tracker.out_of_memory();
  ASSERT_TRUE(tracked.has_value());
  EXPECT_STREQ(tracked->phase, "backward");
}

TEST_P(OomReportTest, NoFailureMeansNoOutOfMemoryObject) {
  const Linear l = make_linear(device());
  memory::MemoryTracker::Options o;
  o.micro_batch_size = 192;
  o.timeline_steps = 0;
  memory::MemoryTracker tracker(device(), o);
  tracker.begin_micro_batch(0, 0, 192);
  Tensor loss = ops::sum(ops::linear(l.x, l.w, l.b));
  tracker.end_forward();
  loss.backward();
  loss = Tensor();
  tracker.end_backward();
  EXPECT_FALSE(tracker.out_of_memory().has_value());
  const auto j = nlohmann::json::parse(memory::memory_report_json(tracker));
  EXPECT_FALSE(j.contains("out_of_memory"));
}

CUMULUS_INSTANTIATE_DEVICES(OomReportTest);

}  // namespace
}  // namespace cumulus
