// Data parallel training (Note [Data parallel accumulation] in engine/dist/communicator.cpp): the
// Trainer's guards in one process, then the app through mpirun on small generated IDX files:
// 1 x (16 x 4), 2 x (16 x 2) and 4 x (16 x 1) give the same weights after a subset that ends with
// a partial group; a checkpoint written by 4 ranks resumes on 2; one gradient reduction per
// optimizer step; ranks started with different options, or that loaded different data or
// checkpoints, are refused; a rank that fails or dies ends the job and leaves the last checkpoint
// usable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "cumulus/autograd/function.h"
#include "cumulus/core/timer.h"
#include "cumulus/dist/collective_times.h"
#include "cumulus/dist/communicator.h"
#include "cumulus/io/safetensors.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/report.h"
#include "cumulus/memory/tracker.h"
#include "cumulus/nn/clip_grad.h"
#include "cumulus/nn/flat_parameters.h"
#include "cumulus/ops/linear.h"
#include "cumulus/ops/pointwise.h"
#include "cumulus/ops/reduce.h"
#include "cumulus/optim/sgd.h"
#include "cumulus/train/trainer.h"
#include "test_util.h"
#include "toy_dataset.h"
#if CUMULUS_WITH_CUDA
#include "engine/core/cuda_context.h"
#endif

namespace {

namespace fs = std::filesystem;
using namespace cumulus;
using cumulus::testing::quote;
using cumulus::testing::Result;
using cumulus::testing::run_command;

// ---- in one process ---------------------------------------------------------------------------

TEST(DataParallel, OwnerIsRoundRobinSoEveryFullGroupSplitsEvenly) {
  EXPECT_EQ(dist::owner_of_micro_batch(0, 4), 0);
  EXPECT_EQ(dist::owner_of_micro_batch(5, 4), 1);
  EXPECT_EQ(dist::owner_of_micro_batch(7, 1), 0);
  // A group of 8 micro-batches over 4 ranks: two each.
  std::vector<int> count(4);
  for (int64_t i = 8; i < 16; ++i) count[dist::owner_of_micro_batch(i, 4)] += 1;
  EXPECT_EQ(count, (std::vector<int>{2, 2, 2, 2}));
}

TEST(DataParallel, SingleWorldIsTheIdentity) {
  auto comm = dist::Communicator::single();
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  float x[2] = {1.5f, -2.0f};
  comm->all_reduce_sum(x, 2, dist::Element::f32, Device::cpu());
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(x[1], -2.0f);
  EXPECT_TRUE(comm->any(true));
  EXPECT_FALSE(comm->any(false));
  EXPECT_NO_THROW(dist::check_same_settings(*comm, {{"lr", "0.1"}}));
}

// Item 1 of issue 26: the device rule refuses a node with more ranks than GPUs on every one of its
// ranks (NCCL would refuse two ranks on one GPU only inside the first backward), naming both counts.
TEST(DataParallel, EachRankOfANodeGetsAGpuOfItsOwnOrAnErrorNamingRanksAndDevices) {
  EXPECT_EQ(dist::device_for_local_rank(0, 1, 1), 0);
  EXPECT_EQ(dist::device_for_local_rank(1, 2, 2), 1);
  EXPECT_EQ(dist::device_for_local_rank(2, 3, 8), 2);
  auto message = [](int local_rank, int local_ranks, int devices) {
    try {
      dist::device_for_local_rank(local_rank, local_ranks, devices);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  // Every rank of the node, the first one included: not only those past the last GPU.
  for (int local_rank : {0, 1})
    EXPECT_EQ(message(local_rank, 2, 1),
              "2 ranks run on this node but it has 1 CUDA device: each rank needs a GPU of its own (NCCL refuses "
              "two ranks on one GPU)");
  EXPECT_NE(message(0, 3, 2).find("3 ranks run on this node but it has 2 CUDA devices"), std::string::npos);
  EXPECT_NE(message(0, 1, 0).find("1 rank runs on this node but it has no CUDA devices"), std::string::npos);
  EXPECT_NE(message(2, 2, 4).find("local rank 2 of 2"), std::string::npos) << "a rank outside its node";
}

TEST(DataParallel, AProblemOfAnyRankIsNamedWithItsRank) {
  auto comm = dist::Communicator::single();
  EXPECT_EQ(dist::problem_of_any_rank(*comm, ""), "");
  EXPECT_EQ(dist::problem_of_any_rank(*comm, "too few GPUs"), "rank 0: too few GPUs");
}

// A world of two in one process: enough for the Trainer's guards, which never communicate.
class PretendWorld : public dist::Communicator {
 public:
  PretendWorld(int rank, int world) : Communicator(rank, world, rank, world) {}
  std::string backend() const override { return "pretend"; }
  void all_reduce_sum(void*, int64_t, dist::Element, Device) override {}
  void start_all_reduce_sum(void*, int64_t, dist::Element, Device) override {}
  void progress() override {}
  void wait_all() override {}
  void all_gather(float*, const std::vector<dist::Shard>&, Device) override {}
  void reduce_scatter_sum(float*, const std::vector<dist::Shard>&, Device) override {}
  void gather_to_root(float*, const std::vector<dist::Shard>&, Device) override {}
  bool any(bool mine) override { return mine; }
  std::string broadcast_from_root(const std::string& v) override { return v; }
  std::vector<std::string> gather_to_root(const std::string& v) override { return {v}; }
  void barrier() override {}
  void abort(int) override {}
};

// A node with more ranks than this host's GPUs: the message names the host and how many ranks fit.
TEST(DataParallel, TheRanksDeviceNamesTheHostWhenTheNodeHasTooFewGpus) {
  PretendWorld world(0, cuda_device_count() + 1);
  try {
    dist::device_for_rank(world);
    ADD_FAILURE() << "more ranks than GPUs accepted";
  } catch (const InvalidArgument& e) {
    const std::string n = std::to_string(cuda_device_count());
    EXPECT_EQ(std::string(e.what()).rfind("host ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("; start at most " + n + " per node (mpirun -npernode " + n + ")"),
              std::string::npos)
        << e.what();
  }
}

// Rank 0 of a pretend world whose ranks report `values` to it.
class GatheringWorld : public PretendWorld {
 public:
  explicit GatheringWorld(std::vector<std::string> values)
      : PretendWorld(0, static_cast<int>(values.size())), values_(std::move(values)) {}
  std::vector<std::string> gather_to_root(const std::string&) override { return values_; }

 private:
  std::vector<std::string> values_;
};

TEST(DataParallel, DifferencesAmongRanksListEveryRanksValue) {
  GatheringWorld same({"60000 samples", "60000 samples"});
  EXPECT_EQ(dist::difference_among_ranks(same, "60000 samples"), "");
  GatheringWorld differ({"60000 samples", "59000 samples", "60000 samples"});
  EXPECT_EQ(dist::difference_among_ranks(differ, "60000 samples"),
            "rank 0 60000 samples; rank 1 59000 samples; rank 2 60000 samples");
  EXPECT_EQ(dist::difference_among_ranks(*dist::Communicator::single(), "anything"), "");
}

struct TinyModel {
  Tensor w = Tensor::full(Shape{4, 3}, 0.5f).set_requires_grad(true);
  Tensor b = Tensor::zeros(Shape{4}).set_requires_grad(true);
  std::shared_ptr<nn::FlatParameters> flat =
      std::make_shared<nn::FlatParameters>(std::vector<std::pair<std::string, Tensor>>{{"w", w}, {"b", b}});
  std::shared_ptr<optim::SGD> sgd = std::make_shared<optim::SGD>(flat, optim::SGDOptions{});
  Tensor loss() { return ops::sum(ops::linear(Tensor::full(Shape{2, 3}, 1.0f), w, b)); }
};

TEST(DataParallel, TrainerRefusesStepsThatDoNotDivideOverTheRanks) {
  TinyModel m;
  train::TrainerOptions ao;
  ao.accum_steps = 3;
  ao.communicator = std::make_shared<PretendWorld>(0, 2);
  try {
    train::Trainer acc(m.sgd, ao);
    FAIL() << "3 accumulation steps over 2 ranks was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("do not divide over 2 ranks"), std::string::npos) << e.what();
  }
}

TEST(DataParallel, EachRankRunsOnlyItsOwnMicroBatches) {
  TinyModel m;
  train::TrainerOptions ao;
  ao.accum_steps = 4;
  ao.communicator = std::make_shared<PretendWorld>(1, 2);
  train::Trainer acc(m.sgd, ao);
  acc.begin_epoch(0, 4);
  // Micro-batch 0 is rank 0's: running it here is a mistake the Trainer names.
  EXPECT_THROW(acc.backward(m.loss(), 2), InvalidArgument);
  acc.skip_micro_batch();
  EXPECT_THROW(acc.skip_micro_batch(), InvalidArgument);  // micro-batch 1 is rank 1's own
  acc.backward(m.loss(), 2);
  acc.skip_micro_batch();
  EXPECT_FALSE(acc.ready());
  acc.backward(m.loss(), 2);
  EXPECT_TRUE(acc.ready());  // the group counts every rank's micro-batches
  EXPECT_EQ(acc.position().micro_batches_in_group, 4);
  EXPECT_EQ(acc.position().units_in_group, 4);  // this rank's samples; the step sums them across ranks
}

// ---- ZeRO stage 2 in one process (Note [ZeRO stage 2] in engine/dist/sharded_gradients.cpp) ------

// A pretend world that counts its reduce-scatters (each leaves this rank's data as its sum).
class CountingWorld : public PretendWorld {
 public:
  using PretendWorld::PretendWorld;
  void reduce_scatter_sum(float*, const std::vector<dist::Shard>&, Device) override { ++reduce_scatters; }
  int reduce_scatters = 0;
};

// Two parameters of one 64-element slot each: rank 0 of 2 keeps w's slot, rank 1 b's.
train::TrainerOptions zero_two_options(const std::shared_ptr<dist::Communicator>& world) {
  train::TrainerOptions o;
  o.accum_steps = 4;
  o.communicator = world;
  o.zero_stage = 2;
  o.bucket_bytes = 4;  // a bucket a slot
  return o;
}

// Each backward is reduced at once into the rank's shard (first written, then added to), no
// parameter keeps a gradient buffer between backwards, and the flat gradient returns with the Trainer gone.
TEST(ZeroStageTwo, TheShardSumsEachBackwardAndNoParameterKeepsAGradient) {
  TinyModel plain, sharded;
  for (int k = 0; k < 2; ++k) plain.loss().backward();  // w's gradient: the sum of two backwards
  const std::vector<float> expected = plain.w.grad().to_vector<float>();
  auto world = std::make_shared<CountingWorld>(0, 2);
  {
    train::Trainer trainer(sharded.sgd, zero_two_options(world));
    EXPECT_EQ(sharded.flat->gradients().numel(), 64);  // w's slot only
    EXPECT_EQ(sharded.flat->gradients_offset(), 0);
    trainer.begin_epoch(0, 4);
    for (int k = 0; k < 2; ++k) {
      trainer.backward(sharded.loss(), 2);
      trainer.skip_micro_batch();
      EXPECT_FALSE(sharded.w.grad_buffer().defined());
      const Tensor none = sharded.w.grad();
      ASSERT_NE(none.undefined_reason(), nullptr);
      EXPECT_NE(std::string(none.undefined_reason()).find("ZeRO stage 2"), std::string::npos);
    }
    EXPECT_EQ(world->reduce_scatters, 4);  // two buckets, two rounds
    std::vector<float> shard = sharded.flat->gradients().to_vector<float>();
    EXPECT_EQ(std::vector<float>(shard.begin(), shard.begin() + 12), expected);  // the same adds, the same bits
    EXPECT_EQ(std::vector<float>(shard.begin() + 12, shard.end()), std::vector<float>(52, 0.0f));  // padding
    EXPECT_THROW(nn::clip_grad_norm(*sharded.flat, 1.0f), InvalidArgument);
    EXPECT_TRUE(trainer.step_if_ready());
  }
  EXPECT_EQ(sharded.flat->gradients().numel(), sharded.flat->size());
  sharded.loss().backward();
  EXPECT_EQ(sharded.w.grad().to_vector<float>(), std::vector<float>(12, 2.0f));  // a buffer of its own again
}

// Data parallel in stage 2's order (reduce_every_micro_batch): the same reduce-scatters, each followed
// by an all-gather, and every rank keeps the whole sum of the rounds; no parameter keeps a buffer.
TEST(ZeroStageTwo, ReducingEveryMicroBatchKeepsTheWholeSumOnEveryRank) {
  TinyModel plain, every;
  for (int k = 0; k < 2; ++k) plain.loss().backward();
  const std::vector<float> w_sum = plain.w.grad().to_vector<float>(), b_sum = plain.b.grad().to_vector<float>();
  struct Counting : CountingWorld {
    using CountingWorld::CountingWorld;
    void all_gather(float*, const std::vector<dist::Shard>&, Device) override { ++all_gathers; }
    int all_gathers = 0;
  };
  auto world = std::make_shared<Counting>(1, 2);
  train::TrainerOptions o = zero_two_options(world);
  o.zero_stage = 0;
  o.reduce_every_micro_batch = true;
  train::Trainer trainer(every.sgd, o);
  EXPECT_EQ(every.flat->gradients().numel(), every.flat->size());  // the whole, on rank 1 too
  trainer.begin_epoch(0, 4);
  for (int k = 0; k < 2; ++k) {
    trainer.skip_micro_batch();
    trainer.backward(every.loss(), 2);
    EXPECT_FALSE(every.w.grad_buffer().defined());
  }
  EXPECT_EQ(world->reduce_scatters, 4);  // two buckets, two rounds
  EXPECT_EQ(world->all_gathers, 4);
  const std::vector<float> flat = every.flat->gradients().to_vector<float>();
  const int64_t b_offset = every.flat->slots()[1].offset;
  EXPECT_EQ(std::vector<float>(flat.begin(), flat.begin() + 12), w_sum);
  EXPECT_EQ(std::vector<float>(flat.begin() + b_offset, flat.begin() + b_offset + 4), b_sum);
  EXPECT_TRUE(trainer.step_if_ready());
}

// A short last group: rank 1 owns one micro-batch of three, rank 0 two, so rank 1 reduces a round
// of zeros at the step and both ranks make the same number of reductions.
TEST(ZeroStageTwo, ARankWithFewerMicroBatchesInAShortGroupReducesZeros) {
  for (int rank : {0, 1}) {
    TinyModel m;
    auto world = std::make_shared<CountingWorld>(rank, 2);
    train::Trainer trainer(m.sgd, zero_two_options(world));
    trainer.begin_epoch(0, 3);
    for (int64_t i = 0; i < 3; ++i) {
      if (dist::owner_of_micro_batch(i, 2) == rank) trainer.backward(m.loss(), 2);
      else trainer.skip_micro_batch();
    }
    EXPECT_TRUE(trainer.flush());
    EXPECT_EQ(world->reduce_scatters, 4) << "rank " << rank;  // two rounds of two buckets each
  }
}

// Passes its input on; its backward throws (a backward that fails half-way).
struct FailsInBackward : autograd::Function<FailsInBackward> {
  static constexpr const char* name = "fails_in_backward";
  static Tensor forward(autograd::FunctionContext&, const std::vector<Tensor>& in) { return in[0].detach().clone(); }
  static std::vector<Tensor> backward(autograd::FunctionContext&, const Tensor&) {
    throw Error("fails_in_backward: a backward that fails");
  }
};

// A backward that throws leaves no bucket's buffer behind, and the next one reduces as usual.
TEST(ZeroStageTwo, ABackwardThatThrowsLeavesNoBucketOpen) {
  const Tensor w = Tensor::full(Shape{3, 3}, 0.5f).set_requires_grad(true);
  const Tensor b = Tensor::zeros(Shape{3}).set_requires_grad(true);
  auto flat = std::make_shared<nn::FlatParameters>(std::vector<std::pair<std::string, Tensor>>{{"w", w}, {"b", b}});
  auto world = std::make_shared<CountingWorld>(0, 2);
  train::Trainer trainer(std::make_shared<optim::SGD>(flat, optim::SGDOptions{}), zero_two_options(world));
  trainer.begin_epoch(0, 4);
  CachingAllocator& alloc = allocator_for(Device::cpu());
  auto gradient_bytes = [&alloc] { return alloc.stats()[MemoryCategory::gradients].current; };
  const int64_t before = gradient_bytes();  // the shard
  const Tensor x = Tensor::full(Shape{2, 3}, 1.0f);
  {
    // The outer Linear's gradients open w's and b's buckets; the inner path to them throws first.
    const Tensor loss = ops::sum(ops::linear(FailsInBackward::apply({ops::linear(x, w, b)}), w, b));
    EXPECT_THROW(trainer.backward(loss, 2), Error);
  }
  EXPECT_EQ(gradient_bytes(), before);
  EXPECT_FALSE(w.grad_buffer().defined());
  trainer.begin_epoch(0, 4);
  trainer.backward(ops::sum(ops::linear(x, w, b)), 2);
  trainer.skip_micro_batch();
  EXPECT_EQ(flat->gradients().to_vector<float>().at(0), 2.0f);  // w's first element: a fresh round
}

TEST(ZeroStageTwo, OnlyStagesZeroToTwoAreAccepted) {
  TinyModel m;
  train::TrainerOptions o = zero_two_options(std::make_shared<PretendWorld>(0, 2));
  o.zero_stage = 3;
  EXPECT_THROW(train::Trainer(m.sgd, o), InvalidArgument);
}

// ---- communication time (Note [Communication time]) ----------------------------------------------

// A world whose reductions take a known host time, as MPI's waits do.
class TimedWorld : public PretendWorld {
 public:
  TimedWorld() : PretendWorld(0, 2) {}
  void reduce_for(std::chrono::milliseconds ms) {
    const TimePoint start = TimePoint::now(Device::cpu());
    std::this_thread::sleep_for(ms);
    add_span(start, TimePoint::now(Device::cpu()));
  }
};

// Item 6 of issue 26: the communication time is the reductions' spans, resolved when read: the
// totals in stats(), and each step's own spans handed over once (for the memory tracker).
TEST(CommunicationTime, StatsSumTheReductionsAndEachSpanIsTakenOnce) {
  TimedWorld w;
  w.reduce_for(std::chrono::milliseconds(20));
  w.reduce_for(std::chrono::milliseconds(10));
  const TimeSpans step = w.take_recent_spans();
  ASSERT_EQ(step.size(), 2u);
  EXPECT_GE(total_ms(step), 30.0);
  EXPECT_TRUE(w.take_recent_spans().empty()) << "taken twice";
  w.reduce_for(std::chrono::milliseconds(5));
  EXPECT_EQ(w.take_recent_spans().size(), 1u);
  const double seconds = w.stats().communication_seconds;
  EXPECT_GE(seconds, 0.035);
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(w.stats().communication_seconds, seconds) << "resolved once";
  w.count_gradient_reduction(int64_t{3} << 20);
  const std::string text = w.stats_text();
  EXPECT_EQ(text.rfind("1 gradient all-reduces (", 0), 0u) << text;
  EXPECT_NE(text.find("(0 transport calls, 3.0 MiB per rank), "), std::string::npos) << text;
  EXPECT_NE(text.find(" s in them (the host's wait for MPI)"), std::string::npos) << text;
}

TEST(CommunicationTime, UntakenSpansStayBoundedAndTheTotalCountsThemAll) {
  TimedWorld w;
  const std::size_t n = dist::Communicator::kMaxRecentSpans + 300;
  for (std::size_t i = 0; i < n; ++i) w.reduce_for(std::chrono::milliseconds(0));
  const TimeSpans kept = w.take_recent_spans();
  EXPECT_LT(kept.size(), dist::Communicator::kMaxRecentSpans);
  EXPECT_GE(kept.size(), 300u) << "the latest spans are kept";
  EXPECT_GT(w.stats().communication_seconds, 0.0);
}

// The memory tracker reads a step's spans with its other times: the step record's and the trace's
// communication figure.
TEST(CommunicationTime, TheTrackerReadsAStepsSpans) {
  TimedWorld w;
  memory::MemoryTracker tracker(Device::cpu(), memory::MemoryTracker::Options{});
  tracker.begin_micro_batch(0, 0, 1);  // opens the timeline window
  tracker.end_forward();
  tracker.end_backward();
  tracker.begin_step();
  w.reduce_for(std::chrono::milliseconds(20));
  tracker.end_step(1, 0, w.take_recent_spans());
  ASSERT_EQ(tracker.steps().size(), 1u);
  EXPECT_GE(tracker.steps()[0].communication_ms, 20.0);
  ASSERT_FALSE(tracker.slices().empty()) << "the first step is in the timeline";
  EXPECT_GE(tracker.slices().back().communication_ms, 20.0);
  const nlohmann::json trace = nlohmann::json::parse(memory::memory_trace_json(tracker));
  bool found = false;
  for (const auto& e : trace["traceEvents"])
    if (e.value("name", "") == "step") found = e["args"].value("all_reduce_ms", 0.0) >= 20.0;
  EXPECT_TRUE(found) << trace.dump();
}

#if CUMULUS_WITH_CUDA
// What NCCL's timing rests on: points on a stream other than the compute stream time that stream's
// work (a reduction on the communication stream), read later.
TEST(CommunicationTime, DevicePointsOnAnotherStreamTimeThatStreamsWork) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Device d = Device::cuda(0);
  cuda::DeviceGuard guard(0);
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  Tensor busy = Tensor::empty(Shape{int64_t{256} << 20}, DType::u8, d);
  cuda::synchronize_stream(cuda::stream(0));  // the allocation's stream has nothing queued after this
  const TimePoint start = TimePoint::now_on(d, side);
  for (int k = 0; k < 20; ++k) ASSERT_EQ(cudaMemsetAsync(busy.raw_data(), k, busy.nbytes(), side), cudaSuccess);
  const TimePoint end = TimePoint::now_on(d, side);
  const TimePoint compute_start = TimePoint::now(d), compute_end = TimePoint::now(d);
  const double ms = total_ms({{start, end}});
  EXPECT_GT(ms, 0.05) << "20 memsets of 256 MiB";
  EXPECT_LT(compute_end.ms_since(compute_start), ms) << "the compute stream had nothing to do";
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(side), cudaSuccess);
}
#endif

// ZeRO's partition: consecutive shards in rank order, 64-element multiples but the last.
TEST(DataParallel, ShardsTileTheArrayInAlignedParts) {
  const std::vector<dist::Shard> two = dist::shard_layout(1000, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].offset, 0);
  EXPECT_EQ(two[0].count, 512);
  EXPECT_EQ(two[1].offset, 512);
  EXPECT_EQ(two[1].count, 488);
  const std::vector<dist::Shard> small = dist::shard_layout(100, 4);  // 64 + 36 + 0 + 0
  EXPECT_EQ(small[1].count, 36);
  EXPECT_EQ(small[3].offset, 100);
  EXPECT_EQ(small[3].count, 0);
  EXPECT_EQ(dist::shard_layout(640, 1)[0].count, 640);
}

TEST(DataParallel, SkipIsOnlyForSeveralRanks) {
  TinyModel m;
  train::Trainer acc(m.sgd, train::TrainerOptions{});
  EXPECT_THROW(acc.skip_micro_batch(), InvalidArgument);
}

// ---- the collectives' time model (Note [Collective time model]) ---------------------------------

// One process, or a rank planned alone, moves nothing: nothing is timed and every line is 0.
TEST(CollectiveTimes, OneRankOrARankAloneMeasuresNothing) {
  const std::vector<int64_t> sizes = dist::collective_probe_sizes(1 << 20, 3 << 20);
  for (const auto& comm : {dist::Communicator::single(), dist::Communicator::alone(1, 2)}) {
    const dist::CollectiveTimes t = dist::measure_collective_times(*comm, sizes, Device::cpu());
    EXPECT_EQ(t.world_size, 1) << comm->backend();
    EXPECT_EQ(t.sizes, 0);
    for (const dist::CollectiveLine& line : {t.all_reduce, t.reduce_scatter, t.all_gather}) {
      EXPECT_EQ(line.latency_seconds, 0.0);
      EXPECT_EQ(line.seconds_per_byte, 0.0);
      EXPECT_EQ(line.predict(1 << 20), 0.0);
    }
    EXPECT_EQ(t.text(), "not measured (one rank)");
  }
  EXPECT_THROW(dist::measure_collective_times(*dist::Communicator::single(), {1000}, Device::cpu()), InvalidArgument)
      << "not whole 64-element shards";
}

// A latency, a quarter bucket, a bucket, their geometric middle with the gradient and the gradient,
// each rounded up to 256 bytes; a gradient smaller than a bucket caps them.
TEST(CollectiveTimes, ProbeSizesSpanTheLatencyTheBucketAndTheWholeGradient) {
  EXPECT_EQ(dist::collective_probe_sizes(1 << 20, 3200000),
            (std::vector<int64_t>{1024, 262144, 1048576, 1831936, 3200000}));  // sqrt(2^20 x 3.2e6) = 1831786.3
  EXPECT_EQ(dist::collective_probe_sizes(1 << 20, 10000), (std::vector<int64_t>{1024, 2560, 10240}));
  EXPECT_THROW(dist::collective_probe_sizes(0, 10000), InvalidArgument);
}

TEST(CollectiveTimes, TheLineIsLatencyPlusBytesAndNeverNegative) {
  std::vector<std::pair<int64_t, double>> points;
  for (int64_t b : {int64_t{1024}, int64_t{262144}, int64_t{1} << 20, int64_t{8} << 20})
    points.emplace_back(b, 2e-5 + 1e-9 * static_cast<double>(b));
  dist::CollectiveLine line = dist::fit_collective_line(points);
  EXPECT_NEAR(line.latency_seconds, 2e-5, 1e-12);
  EXPECT_NEAR(line.seconds_per_byte, 1e-9, 1e-16);
  EXPECT_NEAR(line.predict(4 << 20), 2e-5 + 1e-9 * (4 << 20), 1e-12);
  // 1000 bytes in 1 us and 2000 in 3 us would start at -1 us: through the origin instead, on
  // relative residuals (weights 1/y^2): sum(w x y) / sum(w x^2).
  line = dist::fit_collective_line({{1000, 1e-6}, {2000, 3e-6}});
  EXPECT_EQ(line.latency_seconds, 0.0);
  const double w1 = 1 / (1e-6 * 1e-6), w2 = 1 / (3e-6 * 3e-6);
  EXPECT_NEAR(line.seconds_per_byte, (w1 * 1000 * 1e-6 + w2 * 2000 * 3e-6) / (w1 * 1e6 + w2 * 4e6), 1e-18);
  line = dist::fit_collective_line({{4096, 8e-6}});  // one size: through the origin
  EXPECT_EQ(line.latency_seconds, 0.0);
  EXPECT_NEAR(line.seconds_per_byte, 8e-6 / 4096, 1e-18);
  line = dist::fit_collective_line({});
  EXPECT_EQ(line.predict(1 << 20), 0.0);
}

// What a measurement sends is not the run's communication: counters and spans are put back.
TEST(CollectiveTimes, AMeasurementLeavesTheCountersAndSpansAsTheyWere) {
  TimedWorld w;
  w.reduce_for(std::chrono::milliseconds(1));
  w.count_gradient_reduction(100);
  {
    const dist::Communicator::StatsUnchanged unchanged(w);
    w.reduce_for(std::chrono::milliseconds(30));
    w.count_gradient_reduction(7);
  }
  EXPECT_EQ(w.take_recent_spans().size(), 1u);
  const dist::Communicator::Stats st = w.stats();
  EXPECT_EQ(st.gradient_reductions, 1);
  EXPECT_EQ(st.bytes_reduced, 100);
  EXPECT_LT(st.communication_seconds, 0.030);
}

// Run by MpiRunTest.CollectiveTimesOnTwoRanksArePositiveAndTheSameOnEveryRank under mpirun (disabled
// in a plain run: it needs the launcher's world).
TEST(DISABLED_UnderMpirun, CollectiveTimes) {
  const auto comm = dist::Communicator::from_environment();
  ASSERT_EQ(comm->world_size(), 2) << "run under mpirun -np 2";
  const dist::Communicator::Stats before = comm->stats();
  const std::vector<int64_t> sizes = dist::collective_probe_sizes(1 << 20, 8 << 20);
  const dist::CollectiveTimes t = dist::measure_collective_times(*comm, sizes, Device::cpu(), 3);
  EXPECT_EQ(t.world_size, 2);
  EXPECT_EQ(t.sizes, static_cast<int>(sizes.size()));
  // What holds on a loaded machine too (a timed test may not ask for speed): finite lines that never
  // fall with the bytes, and time measured (a fit through positive medians predicts more than 0).
  for (const dist::CollectiveLine& line : {t.all_reduce, t.reduce_scatter, t.all_gather}) {
    EXPECT_TRUE(std::isfinite(line.latency_seconds) && line.latency_seconds >= 0) << line.latency_seconds;
    EXPECT_TRUE(std::isfinite(line.seconds_per_byte) && line.seconds_per_byte >= 0) << line.seconds_per_byte;
    EXPECT_GT(line.predict(sizes.back()), 0.0);
    EXPECT_LE(line.predict(sizes.front()), line.predict(sizes.back()));
  }
  const dist::Communicator::Stats after = comm->stats();
  EXPECT_EQ(after.messages, before.messages);
  EXPECT_EQ(after.communication_seconds, before.communication_seconds);
  std::printf("collective times on rank %d: %a %a %a %a %a %a (%s)\n", comm->rank(), t.all_reduce.latency_seconds,
              t.all_reduce.seconds_per_byte, t.reduce_scatter.latency_seconds, t.reduce_scatter.seconds_per_byte,
              t.all_gather.latency_seconds, t.all_gather.seconds_per_byte, t.text().c_str());
  std::fflush(stdout);
}

// ---- through mpirun -----------------------------------------------------------------------------

std::string read_log(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class MpiRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("cumulus_dist_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    // 1000 = 15 x 64 + 40: the last group of every epoch is partial (16 + 16 + 8 samples).
    cumulus::testing::write_toy_split(dir_ / "data", "train", 1000, 1);
    cumulus::testing::write_toy_split(dir_ / "data", "t10k", 200, 2);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    if (!dist::mpi_compiled()) GTEST_SKIP() << "built without MPI (CUMULUS_DIST): nothing to launch";
    ASSERT_EQ(run_command("command -v mpirun > /dev/null").exit_code, 0)
        << "cumulus was built with MPI but mpirun is not on PATH (install openmpi-bin)";
  }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  // The app on `ranks` processes. One OpenBLAS thread per rank (2 cores here); OpenMPI's own
  // allocations at exit are not ours to fix, so LeakSanitizer (in the sanitizer build) skips them.
  // The suppressions match library names anywhere in a leak's stack, so the stack must be whole:
  // Open MPI's plugins stay loaded at exit (disable_dlclose) and malloc stacks are unwound without
  // frame pointers (fast_unwind_on_malloc=0; Open MPI is built without them).
  static std::string mpi_env() {
    return "env LSAN_OPTIONS=suppressions=" + quote(std::string(CUMULUS_SOURCE_DIR) + "/tests/lsan_mpi.supp") +
           " ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0\"" +
           " OMPI_MCA_mca_base_component_disable_dlclose=1 ";
  }
  static Result launch(int ranks, const std::string& args) {
    const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
    return run_command(mpi_env() + "mpirun " + root + "--oversubscribe -np " + std::to_string(ranks) + " " +
                       std::string(FASHION_MNIST_BIN) + " " + args + " 2>&1");
  }
  static std::string common() {
    return "--data " + quote(path("data")) + " --device cpu --threads 1 --quiet --batch-size 16 --effective-batch 64";
  }
  static std::map<std::string, std::vector<float>> weights(const std::string& file) {
    std::map<std::string, std::vector<float>> out;
    for (const auto& [name, t] : io::load_safetensors(path(file)).tensors)
      if (t.dtype() == DType::f32) out[name] = t.to_vector<float>();
    return out;
  }
  // Per tensor, max |a - b| / max |b| <= `elementwise`; over all tensors together, the relative L2
  // distance ||a - b|| / ||b|| <= `overall`.
  static void expect_same_weights(const std::string& a, const std::string& b, double elementwise, double overall) {
    const auto wa = weights(a), wb = weights(b);
    ASSERT_EQ(wa.size(), wb.size());
    ASSERT_FALSE(wa.empty());
    double diff2 = 0, norm2 = 0;
    for (const auto& [name, values] : wa) {
      ASSERT_EQ(wb.count(name), 1u) << name;
      const std::vector<float>& other = wb.at(name);
      ASSERT_EQ(values.size(), other.size()) << name;
      EXPECT_LE(cumulus::testing::max_rel_diff(values, other), elementwise) << a << " vs " << b << ": " << name;
      for (std::size_t i = 0; i < values.size(); ++i) {
        diff2 += (double(values[i]) - other[i]) * (double(values[i]) - other[i]);
        norm2 += double(other[i]) * other[i];
      }
    }
    EXPECT_LE(std::sqrt(diff2 / norm2), overall) << a << " vs " << b << ": all weights";
  }
  // A small text for the GPT, as corpus.txt.
  static void write_corpus() {
    std::string text;
    for (int i = 0; i < 200; ++i)
      text += i % 3 == 0 ? "To be, or not to be: that is the question.\n" : "Ay, there's the rub.\n";
    std::ofstream(path("corpus.txt")) << text;
  }
  static std::vector<nlohmann::json> metrics(const std::string& file) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(path(file));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }
  static fs::path dir_;
};
fs::path MpiRunTest::dir_;

// Note [Data parallel tolerance]
// The ranks sum the same gradients in another order than one process does (each rank's buffer
// first, then across ranks), so results agree up to float rounding, as 16 x 4 and 64 x 1 do in one
// process. SGD carries that rounding through linearly: every weight agrees to 1e-6 of its tensor's
// largest. AdamW divides by sqrt(v), so where a gradient element is a near-cancellation (a few
// ulps of its terms) its rounding becomes a visible part of that element's update: single weights
// then differ by ~1e-5 of the tensor's largest (the same happens between 16 x 4 and 64 x 1 in one
// process), while the weight vector as a whole agrees to 1e-6.

// The three layouts of an effective batch of 64, with SGD-momentum, AdamW and clipping.
TEST_F(MpiRunTest, OneTwoAndFourRanksGiveTheSameWeights) {
  struct Case {
    std::string options;
    double elementwise, overall;
  };
  const std::vector<Case> cases = {{"--optimizer sgd --momentum 0.9 --lr 0.05 --clip-grad-norm 0.5", 1e-6, 1e-6},
                                   {"--optimizer adamw --lr 0.002 --clip-grad-norm 0.5", 1e-4, 1e-6}};
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const std::string tag = std::to_string(k);
    for (int ranks : {1, 2, 4}) {
      const Result r = launch(ranks, common() + " --epochs 1 --shuffle " + cases[k].options + " --save " +
                                         quote(path("w" + tag + "_" + std::to_string(ranks) + ".safetensors")));
      ASSERT_EQ(r.exit_code, 0) << ranks << " ranks: " << r.out;
    }
    for (const char* ranks : {"2", "4"})
      expect_same_weights("w" + tag + "_" + ranks + ".safetensors", "w" + tag + "_1.safetensors", cases[k].elementwise,
                          cases[k].overall);
  }
}

// ZeRO-1 (Note [ZeRO] in engine/train/trainer_step.cpp): the optimizer's state sharded over the
// ranks gives plain data parallel's weights bit for bit, each rank holding about half the state.
// ZeRO-2 (Note [ZeRO stage 2]) also holds half the gradient and sums it in another order: data
// parallel's weights to Note [Data parallel tolerance]'s bounds, through the partial last group of
// every epoch (rank 1 makes up its missing micro-batch with zeros).
TEST_F(MpiRunTest, ZeroStagesGiveDataParallelsWeightsWithHalfTheStatePerRank) {
  struct Case {
    std::string options;
    double elementwise, overall;  // stage 2 against 0
  };
  // 8-bit moments round to the nearest of 256 codes: a moment that another gradient rounding moves
  // across the midpoint of two codes moves by a whole code, so 8 bits carry float rounding further,
  // as far as the number of moments that cross, which any change of rounding reshuffles (2.8e-5 and
  // 1.3e-4 overall with two forward GEMMs of equal accuracy). A wrong shard moves weights by O(1).
  const std::vector<Case> cases = {{"--optimizer adamw --lr 0.002 --clip-grad-norm 0.5", 1e-4, 1e-6},
                                   {"--optimizer sgd --momentum 0.9 --lr 0.05", 1e-6, 1e-6},
                                   {"--optimizer adamw --lr 0.002 --optimizer-bits 8", 1e-2, 5e-4}};
  auto summary = [](const std::string& report, const char* key) {
    return nlohmann::json::parse(read_log(path(report)))["summary"][key].get<int64_t>();
  };
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const std::string tag = "zero" + std::to_string(k);
    for (int stage : {0, 1, 2}) {
      const std::string run = tag + "_" + std::to_string(stage);
      const Result r = launch(2, common() + " --epochs 1 --shuffle " + cases[k].options + " --zero " +
                                     std::to_string(stage) + " --save " + quote(path(run + ".safetensors")) +
                                     " --memory-report " + quote(path(run + ".json")));
      ASSERT_EQ(r.exit_code, 0) << cases[k].options << " --zero " << stage << ": " << r.out;
    }
    const Result every = launch(2, common() + " --epochs 1 --shuffle " + cases[k].options +
                                       " --zero 0 --reduce-every-micro-batch --save " +
                                       quote(path(tag + "_every.safetensors")));
    ASSERT_EQ(every.exit_code, 0) << cases[k].options << " --reduce-every-micro-batch: " << every.out;
    expect_same_weights(tag + "_1.safetensors", tag + "_0.safetensors", 0.0, 0.0);
    expect_same_weights(tag + "_2.safetensors", tag + "_0.safetensors", cases[k].elementwise, cases[k].overall);
    // Data parallel summing in stage 2's order gives its bits (Note [ZeRO stage 2]).
    expect_same_weights(tag + "_every.safetensors", tag + "_2.safetensors", 0.0, 0.0);
    const int64_t whole_state = summary(tag + "_0.json", "optimizer_state_bytes");
    const int64_t whole_gradient = summary(tag + "_0.json", "gradients_bytes");
    for (const std::string rank : {"", ".rank1"}) {
      for (int stage : {1, 2}) {
        const std::string report = tag + "_" + std::to_string(stage) + rank + ".json";
        const int64_t shard = summary(report, "optimizer_state_bytes");
        EXPECT_GT(shard, 0) << report;
        EXPECT_LE(shard, whole_state / 2 + 1024) << report;
      }
      const std::string report = tag + "_2" + rank + ".json";
      EXPECT_GT(summary(report, "gradients_bytes"), 0) << report;
      EXPECT_LE(summary(report, "gradients_bytes"), whole_gradient / 2 + 1024) << report;
    }
  }
}

// Three ranks: shards of unequal size (the flat buffer does not divide by 3), two micro-batches per
// rank and step, and the epoch's last group of 40 samples one short micro-batch on each rank. Stage
// 1 keeps data parallel's bits, stage 2 its weights to float rounding (and the bits of data parallel
// reducing every micro-batch); each rank holds a third.
TEST_F(MpiRunTest, ZeroStagesOnThreeRanks) {
  auto summary = [](const std::string& report, const char* key) {
    return nlohmann::json::parse(read_log(path(report)))["summary"][key].get<int64_t>();
  };
  const std::pair<std::string, std::string> runs[] = {{"three_0", "--zero 0"},
                                                      {"three_1", "--zero 1"},
                                                      {"three_2", "--zero 2"},
                                                      {"three_every", "--zero 0 --reduce-every-micro-batch"}};
  for (const auto& [run, levers] : runs) {
    const Result r = launch(3, "--data " + quote(path("data")) +
                                   " --device cpu --threads 1 --quiet --batch-size 16 --effective-batch 96 --epochs 1 "
                                   "--shuffle --optimizer sgd --momentum 0.9 --lr 0.05 " +
                                   levers + " --save " + quote(path(run + ".safetensors")) +
                                   " --memory-report " + quote(path(run + ".json")));
    ASSERT_EQ(r.exit_code, 0) << levers << ": " << r.out;
  }
  expect_same_weights("three_1.safetensors", "three_0.safetensors", 0.0, 0.0);
  expect_same_weights("three_2.safetensors", "three_0.safetensors", 1e-6, 1e-6);
  expect_same_weights("three_every.safetensors", "three_2.safetensors", 0.0, 0.0);
  const int64_t whole_state = summary("three_0.json", "optimizer_state_bytes");
  const int64_t whole_gradient = summary("three_0.json", "gradients_bytes");
  for (const std::string rank : {"", ".rank1", ".rank2"}) {
    EXPECT_GT(summary("three_1" + rank + ".json", "optimizer_state_bytes"), 0) << rank;
    EXPECT_LE(summary("three_1" + rank + ".json", "optimizer_state_bytes"), whole_state / 3 + 1024) << rank;
    EXPECT_LE(summary("three_2" + rank + ".json", "optimizer_state_bytes"), whole_state / 3 + 1024) << rank;
    EXPECT_GT(summary("three_2" + rank + ".json", "gradients_bytes"), 0) << rank;
    EXPECT_LE(summary("three_2" + rank + ".json", "gradients_bytes"), whole_gradient / 3 + 1024) << rank;
  }
}

// The planner under mpirun (Note [Plan levers]): rank 0 plans its part of the effective batch for
// both ranks. Under a budget AdamW's whole state breaks, --zero 0 is refused, naming what the
// smallest candidate's peak holds; --zero auto takes stage 1, and both ranks train within the
// budget, rank 0's peak the predicted one to the byte (rank 1's shard is no larger).
TEST_F(MpiRunTest, ThePlannerOnTwoRanksShardsTheStateOnlyWhenNothingElseFits) {
  const std::string planned = "--data " + quote(path("data")) +
                              " --device cpu --threads 1 --quiet --epochs 1 --effective-batch 64 --optimizer adamw"
                              " --memory-budget 10MiB --memory-report " +
                              quote(path("planned.json"));
  Result r = launch(2, planned + " --zero 0");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("no micro-batch dividing 32 fits --memory-budget 10MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("whose peak holds optimizer_state"), std::string::npos) << r.out;
  r = launch(2, planned + " --zero auto");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json root = nlohmann::json::parse(read_log(path("planned.json")));
  const nlohmann::json other = nlohmann::json::parse(read_log(path("planned.rank1.json")));
  EXPECT_NE(root["planner"]["setting"].get<std::string>().find("ZeRO stage 1"), std::string::npos) << root["planner"];
  const int64_t predicted = root["planner"]["predicted_peak_bytes"].get<int64_t>();
  EXPECT_EQ(root["planner"]["measured_peak_bytes"].get<int64_t>(), predicted);
  EXPECT_LE(other["planner"]["measured_peak_bytes"].get<int64_t>(), predicted);
  for (const nlohmann::json* report : {&root, &other}) {
    const nlohmann::json& s = (*report)["summary"];
    EXPECT_LE(s["reserved_peak_bytes"].get<int64_t>(), int64_t{10} << 20);
    EXPECT_LE(s["optimizer_state_bytes"].get<int64_t>(), s["parameters_bytes"].get<int64_t>() + 1024);  // half of 2x
  }
}

// A --zero 1 checkpoint holds the whole optimizer state (every rank's shard gathered at rank 0), so
// it resumes sharded or not, and either gives the uninterrupted run's weights bit for bit.
TEST_F(MpiRunTest, ZeroCheckpointHoldsTheWholeStateAndResumesShardedOrNot) {
  const std::string opt = " --optimizer adamw --lr 0.002 --clip-grad-norm 0.5 --shuffle";
  Result r = launch(2, common() + opt + " --epochs 2 --save " + quote(path("zck_plain.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = launch(2, common() + opt + " --zero 1 --epochs 1 --checkpoint " + quote(path("zck.ckpt")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* stage : {"1", "0"}) {
    const std::string out = std::string("zck_resumed") + stage + ".safetensors";
    r = launch(2, common() + opt + " --zero " + stage + " --epochs 2 --resume " + quote(path("zck.ckpt")) + " --save " +
                      quote(path(out)));
    ASSERT_EQ(r.exit_code, 0) << "--zero " << stage << ": " << r.out;
    expect_same_weights(out, "zck_plain.safetensors", 0.0, 0.0);
  }
}

// The GPT under mpirun (Note [Data parallel gpt] in apps/gpt/train.cpp), 50 steps with clipping:
// 2 ranks of --accum-steps 2 train one process's groups of 4 (the same windows, the gradients summed in another order:
// Note [Data parallel tolerance]), ZeRO-1 gives data parallel's weights and checkpoint bit for bit with about half the
// state per rank, ZeRO-2 its weights to the same tolerance with half the gradient too, and the ranks' checkpoint
// resumes in one process, and on the two ranks with --zero 1 or 0 bit for bit (--zero 2's on --zero 2).
TEST_F(MpiRunTest, TheGptOnTwoRanksTrainsOneProcesssGroupsAndZeroKeepsItsNumbers) {
#ifndef GPT_BIN
  GTEST_SKIP() << "built without apps/gpt";
#else
  write_corpus();
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  auto gpt = [&](int ranks, const std::string& args) {
    const std::string base = std::string(GPT_BIN) + " train --data " + quote(path("corpus.txt")) +
                             " --context 16 --width 16 --heads 2 --layers 2 --micro-batch 4 --warmup 5 --steps 50" +
                             " --eval-every 25 --eval-windows 8 --clip 0.5 --threads 1 --quiet " + args + " 2>&1";
    return run_command(
        ranks == 1 ? base : mpi_env() + "mpirun " + root + "--oversubscribe -np " + std::to_string(ranks) + " " + base);
  };
  auto state_bytes = [](const std::string& report) {
    return nlohmann::json::parse(read_log(path(report)))["summary"]["optimizer_state_bytes"].get<int64_t>();
  };
  auto gradient_bytes = [](const std::string& report) {
    return nlohmann::json::parse(read_log(path(report)))["summary"]["gradients_bytes"].get<int64_t>();
  };
  Result r = gpt(1, "--accum-steps 4 --save " + quote(path("g_one.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* stage : {"0", "1", "2"}) {
    const std::string run = std::string("g_zero") + stage;
    r = gpt(2, "--accum-steps 2 --zero " + std::string(stage) + " --save " + quote(path(run + ".safetensors")) +
                   " --memory-report " + quote(path(run + ".json")));
    ASSERT_EQ(r.exit_code, 0) << "--zero " << stage << ": " << r.out;
  }
  expect_same_weights("g_zero1.safetensors", "g_zero0.safetensors", 0.0, 0.0);
  EXPECT_EQ(read_log(path("g_zero1.safetensors.state")), read_log(path("g_zero0.safetensors.state")));
  expect_same_weights("g_zero0.safetensors", "g_one.safetensors", 1e-4, 1e-6);
  // ZeRO-2: every micro-batch reduced, so another order (Note [ZeRO stage 2]), which data parallel
  // takes too when asked: then the same bits.
  expect_same_weights("g_zero2.safetensors", "g_zero0.safetensors", 1e-4, 1e-6);
  r = gpt(2, "--accum-steps 2 --zero 1 --reduce-every-micro-batch --save " + quote(path("g_every.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_same_weights("g_every.safetensors", "g_zero2.safetensors", 0.0, 0.0);
  EXPECT_EQ(read_log(path("g_every.safetensors.state")), read_log(path("g_zero2.safetensors.state")));
  const int64_t whole = state_bytes("g_zero0.json");
  const int64_t whole_gradient = gradient_bytes("g_zero0.json");
  for (const std::string rank : {"", ".rank1"}) {
    for (const char* stage : {"1", "2"})
      EXPECT_LE(state_bytes(std::string("g_zero") + stage + ".json" + rank), whole / 2 + 1024) << stage << rank;
    EXPECT_LE(gradient_bytes("g_zero2.json" + rank), whole_gradient / 2 + 1024) << rank;
  }

  r = gpt(2, "--accum-steps 2 --zero 1 --stop-after 25 --save " + quote(path("g_half.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = gpt(1, "--accum-steps 4 --resume " + quote(path("g_half.safetensors")) + " --save " +
                 quote(path("g_half.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_same_weights("g_half.safetensors", "g_one.safetensors", 1e-4, 1e-6);
  // On the ranks that wrote it, sharded or not: the uninterrupted run's bits.
  for (const char* stage : {"1", "0"}) {
    const std::string half = std::string("g_half_zero") + stage + ".safetensors";
    r = gpt(2, "--accum-steps 2 --zero 1 --stop-after 25 --save " + quote(path(half)));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    r = gpt(2, "--accum-steps 2 --zero " + std::string(stage) + " --resume " + quote(path(half)) + " --save " +
                   quote(path(half)));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    expect_same_weights(half, "g_zero1.safetensors", 0.0, 0.0);
  }
  // ZeRO-2's checkpoint resumes on its ranks bit for bit.
  r = gpt(2, "--accum-steps 2 --zero 2 --stop-after 25 --save " + quote(path("g_half_zero2.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = gpt(2, "--accum-steps 2 --zero 2 --resume " + quote(path("g_half_zero2.safetensors")) + " --save " +
                 quote(path("g_half_zero2.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_same_weights("g_half_zero2.safetensors", "g_zero2.safetensors", 0.0, 0.0);
#endif
}

// Past the model-state wall (issue 57): a GPT of 12.6 M parameters whose weights, gradients and
// AdamW state (193 MiB) are more than twice a per-rank --memory-budget of 90 MiB. Without the state
// levers the planner refuses, naming what the budget holds; with --zero auto and --optimizer-state
// auto it takes ZeRO stage 2 with the state on the host, and both ranks train within the budget,
// rank 0's measured peak the predicted one (Note [Plan levers]).
TEST_F(MpiRunTest, TheGptPastTheModelStateWallTrainsOnTwoRanksWithThePlannersLevers) {
#ifndef GPT_BIN
  GTEST_SKIP() << "built without apps/gpt";
#else
  write_corpus();
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  auto gpt = [&](const std::string& args) {
    return run_command(mpi_env() + "mpirun " + root + "--oversubscribe -np 2 " + std::string(GPT_BIN) +
                       " train --data " + quote(path("corpus.txt")) +
                       " --context 16 --width 512 --heads 8 --layers 4 --effective-batch 8 --steps 3 --warmup 1"
                       " --eval-every 0 --threads 1 --quiet --memory-budget 90MiB " +
                       args + " 2>&1");
  };
  Result r = gpt("--zero 0");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("needs more than --memory-budget 90MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters 48.2 MiB, gradients 48.2 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the first step adds optimizer state 96.4 MiB"), std::string::npos) << r.out;

  r = gpt("--zero auto --optimizer-state auto --memory-report " + quote(path("wall.json")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const int64_t budget = int64_t{90} << 20;
  for (const std::string rank : {"", ".rank1"}) {
    const nlohmann::json report = nlohmann::json::parse(read_log(path("wall.json" + rank)));
    const nlohmann::json& s = report["summary"];
    const int64_t parameters = s["parameters_bytes"].get<int64_t>();
    EXPECT_GE(4 * parameters, 2 * budget) << "weights, gradients and AdamW's two moments: twice the budget";
    EXPECT_LE(s["reserved_peak_bytes"].get<int64_t>(), budget) << rank;
    EXPECT_EQ(s["optimizer_state_bytes"].get<int64_t>(), 0) << rank;
    EXPECT_GT(s["host_optimizer_state_bytes"].get<int64_t>(), parameters) << rank;  // half of 2 moments, and copies
    EXPECT_LE(s["gradients_bytes"].get<int64_t>(), parameters / 2 + 1024) << rank;
    if (rank.empty()) {
      const nlohmann::json& plan = report["planner"];
      EXPECT_EQ(plan["predicted_peak_bytes"].get<int64_t>(), plan["measured_peak_bytes"].get<int64_t>());
    }
  }
#endif
}

// The collectives' times measured on two ranks (Note [Collective time model]): this binary's
// DISABLED_UnderMpirun.CollectiveTimes on each rank checks its lines (finite, positive, never
// falling with the bytes; the counters left alone) and prints them, and both ranks hold the same
// lines.
TEST_F(MpiRunTest, CollectiveTimesOnTwoRanksArePositiveAndTheSameOnEveryRank) {
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  // The ranks run one test: not the shard of it ctest's sharding variables would give them.
  const Result r = run_command(
      "env -u GTEST_SHARD_INDEX -u GTEST_TOTAL_SHARDS " + mpi_env() + "mpirun " + root + "--oversubscribe -np 2 " +
      quote(self) + " --gtest_also_run_disabled_tests --gtest_filter=DISABLED_UnderMpirun.CollectiveTimes 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::map<int, std::string> lines;  // rank: its lines, exactly (%a)
  std::istringstream out(r.out);
  const std::string prefix = "collective times on rank ";
  for (std::string line; std::getline(out, line);)
    if (line.rfind(prefix, 0) == 0) lines[std::stoi(line.substr(prefix.size()))] = line.substr(line.find(':'));
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0], lines[1]) << "every rank holds the ranks' mean";
  EXPECT_NE(lines[0].find("(2 ranks, 5 sizes)"), std::string::npos) << lines[0];
}

// all_gather and reduce_scatter_sum over MPI, on uneven shards (tests/dist_collectives.cpp).
TEST_F(MpiRunTest, ZeroCollectivesGatherAndReduceScatterUnevenShards) {
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  for (int ranks : {2, 3}) {
    const Result r = run_command(mpi_env() + "mpirun " + root + "--oversubscribe -np " + std::to_string(ranks) + " " +
                                 DIST_COLLECTIVES_BIN + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    for (int rank = 0; rank < ranks; ++rank)
      EXPECT_NE(r.out.find("collectives ok on rank " + std::to_string(rank) + " of " + std::to_string(ranks)),
                std::string::npos)
          << r.out;
  }
}

TEST_F(MpiRunTest, CheckpointOfFourRanksResumesOnTwo) {
  const std::string opt = " --optimizer sgd --momentum 0.9 --lr 0.05 --shuffle";
  Result r = launch(1, common() + opt + " --epochs 2 --save " + quote(path("elastic_1.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = launch(4, common() + opt + " --epochs 1 --checkpoint " + quote(path("elastic.ckpt")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = launch(2, common() + opt + " --epochs 2 --resume " + quote(path("elastic.ckpt")) + " --save " +
                    quote(path("elastic_2.safetensors")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  expect_same_weights("elastic_2.safetensors", "elastic_1.safetensors", 1e-6, 1e-6);
}

TEST_F(MpiRunTest, OneGradientReductionPerOptimizerStep) {
  const Result r =
      launch(2, common() + " --epochs 2 --metrics " + quote(path("reductions.jsonl")) + " --memory-report " +
                    quote(path("memory.json")) + " --trace " + quote(path("trace.json")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // Each rank's own report, and the reductions' time (Note [Communication time]) in every step
  // record and trace step, and in the metrics.
  for (const char* name : {"memory.json", "memory.rank1.json"}) {
    const nlohmann::json report = nlohmann::json::parse(read_log(path(name)));
    ASSERT_FALSE(report["steps"].empty()) << name;
    for (const auto& step : report["steps"]) EXPECT_GT(step.value("communication_ms", 0.0), 0.0) << name << step.dump();
  }
  int trace_steps = 0;
  const nlohmann::json trace = nlohmann::json::parse(read_log(path("trace.json")));
  for (const auto& e : trace["traceEvents"])
    if (e.value("name", "") == "step") {
      ++trace_steps;
      EXPECT_GT(e["args"].value("all_reduce_ms", 0.0), 0.0) << e.dump();
    }
  EXPECT_GT(trace_steps, 0);
  const auto lines = metrics("reductions.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  // 1000 samples in micro-batches of 16: 63 micro-batches, 16 steps of 4 (the last one of 3).
  int64_t steps_before = 0;
  for (const auto& line : lines) {
    const int64_t steps = line["optimizer_steps"].get<int64_t>() - steps_before;
    steps_before = line["optimizer_steps"].get<int64_t>();
    EXPECT_EQ(steps, 16);
    EXPECT_EQ(line["gradient_reductions"].get<int64_t>(), steps) << line.dump();
    EXPECT_GT(line.value("communication_seconds", 0.0), 0.0) << line.dump();
    EXPECT_EQ(line["world_size"].get<int>(), 2);
    EXPECT_EQ(line["accum_steps"].get<int>(), 2) << "per rank";
    // Rank 0 (which writes the metrics) runs the first micro-batch of every group, so every one of
    // its steps had a backward to overlap: each bucket started before the step.
    EXPECT_GE(line["gradient_buckets"].get<int64_t>(), 2) << line.dump();
    EXPECT_EQ(line["buckets_started_in_backward"].get<int64_t>(), steps * line["gradient_buckets"].get<int64_t>())
        << line.dump();
  }
}

TEST_F(MpiRunTest, RanksStartedWithDifferentOptionsAreRefused) {
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  const std::string app = std::string(FASHION_MNIST_BIN) + " " + common() + " --epochs 1";
  const Result r = run_command(mpi_env() + "mpirun " + root + "--oversubscribe -np 1 " + app + " --lr 0.1 : -np 1 " +
                               app + " --lr 0.2 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 was started with other settings than rank 0: --lr 0.2 on rank 1, 0.1 on rank 0"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Epoch 1"), std::string::npos) << "trained anyway: " << r.out;
}

// Issue 30 item 10: ranks whose data (or resumed checkpoint) differ would issue different numbers of
// collectives and wait forever; they are refused before training with every rank's value named,
// and a rank that fails alone ends the job. Each launch runs under `timeout`: a hang fails the test.
std::string two_ranks(const std::string& rank0, const std::string& rank1) {
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  return "timeout -k 10 120 mpirun " + root + "--oversubscribe -np 1 " + rank0 + " : -np 1 " + rank1 + " 2>&1";
}

TEST_F(MpiRunTest, RanksThatLoadedDifferentDataAreRefusedNamingEachRanksSizes) {
  fs::create_directories(path("data_small"));
  cumulus::testing::write_toy_split(path("data_small"), "train", 500, 1);
  cumulus::testing::write_toy_split(path("data_small"), "t10k", 200, 2);
  const std::string app = std::string(FASHION_MNIST_BIN) +
                          " --device cpu --threads 1 --quiet --batch-size 16 "
                          "--effective-batch 64 --epochs 1 --data ";
  Result r = run_command(mpi_env() + two_ranks(app + quote(path("data")), app + quote(path("data_small"))));
  ASSERT_NE(r.exit_code, 124) << "the ranks hung: " << r.out;
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the ranks loaded different data: rank 0 1000 training and 200 test samples; rank 1 500 "
                       "training and 200 test samples; give every rank the same --data"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Epoch 1"), std::string::npos) << "trained anyway: " << r.out;

  // A rank whose data cannot be read at all ends the job instead of leaving rank 0 waiting.
  r = run_command(mpi_env() + two_ranks(app + quote(path("data")), app + quote(path("no_such_dir"))));
  ASSERT_NE(r.exit_code, 124) << "rank 0 was left waiting: " << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("no_such_dir"), std::string::npos) << r.out;
}

TEST_F(MpiRunTest, RanksThatResumeDifferentCheckpointsAreRefused) {
  // The same --resume path, read in each rank's own working directory: epoch 1's and epoch 2's.
  const std::string opt = common() + " --optimizer sgd --lr 0.05";
  for (const char* epochs : {"1", "2"}) {
    fs::create_directories(path(std::string("wd") + epochs));
    const Result r =
        launch(1, opt + " --epochs " + epochs + " --checkpoint " + quote(path(std::string("wd") + epochs + "/ck.st")));
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  const std::string app = std::string(FASHION_MNIST_BIN) + " " + opt + " --epochs 3 --resume ck.st";
  const Result r = run_command(
      mpi_env() + two_ranks("-wdir " + quote(path("wd1")) + " " + app, "-wdir " + quote(path("wd2")) + " " + app));
  ASSERT_NE(r.exit_code, 124) << "the ranks hung: " << r.out;
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the ranks loaded different checkpoints: rank 0 at epoch 2, micro-batch 0 (16 steps); rank 1 "
                       "at epoch 3, micro-batch 0 (32 steps)"),
            std::string::npos)
      << r.out;
}

// Issue 30 item 3: rank k > 0 writes its reports under ".rank<k>" names, so an output of rank 1 can
// be named like one of rank 0 or like an input; the whole job's outputs are compared before any
// work (Note [The job's outputs] in apps/fashion_mnist/run_control.cpp), a usage error on every rank.
TEST_F(MpiRunTest, OneRanksOutputNamedLikeAnotherRanksOutputOrAnInputIsRefused) {
  const std::string out = path("job_out");
  fs::create_directories(out);
  const std::string args = common() + " --epochs 1 --memory-report " + quote(out + "/r.json");
  Result r = launch(2, args + " --checkpoint " + quote(out + "/r.rank1.json"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("rank 0's --checkpoint '" + out + "/r.rank1.json' and rank 1's --memory-report '" + out +
                       "/r.rank1.json' are the same file"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Epoch 1"), std::string::npos) << "trained anyway: " << r.out;
  EXPECT_FALSE(fs::exists(out + "/r.rank1.json")) << "an output was written";

  // Rank 1's trace named like the --init file (read by every rank): refused before it is read.
  std::ofstream(out + "/w.rank1.st") << "weights";
  r = launch(2, common() + " --epochs 1 --init " + quote(out + "/w.rank1.st") + " --trace " + quote(out + "/w.st"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("rank 1's --trace '" + out + "/w.rank1.st' is the --init file"), std::string::npos) << r.out;
  EXPECT_EQ(read_log(out + "/w.rank1.st"), "weights");
}

TEST_F(MpiRunTest, EffectiveBatchThatDoesNotDivideIsAUsageError) {
  const Result r = launch(
      3, "--data " + quote(path("data")) + " --device cpu --threads 1 --epochs 1 --batch-size 16 --effective-batch 64");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--effective-batch 64 is not a multiple of --batch-size 16 x 3 rank(s) = 48"), std::string::npos)
      << r.out;
}

// Item 1 of issue 26 on a machine with GPUs: one rank more than the node has GPUs is a usage error
// before any work (no data read, no epoch), said once by rank 0, naming the ranks and the devices.
TEST_F(MpiRunTest, MoreRanksThanGpusIsAUsageErrorBeforeAnyWork) {
  const int gpus = cuda_device_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU: the app never picks a device per rank";
  if (!dist::nccl_compiled()) GTEST_SKIP() << "built without NCCL";
  const int ranks = gpus + 1;
  const std::string batches = " --batch-size 16 --effective-batch " + std::to_string(16 * ranks);
  const Result r = launch(ranks, "--data " + quote(path("data")) + " --device cuda --quiet --epochs 1" + batches);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  const std::string expected = std::to_string(ranks) + " ranks run on this node but it has " + std::to_string(gpus) +
                               " CUDA device" + (gpus == 1 ? "" : "s");
  const std::size_t at = r.out.find(expected);
  EXPECT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(expected, at + 1), std::string::npos) << "said more than once: " << r.out;
  EXPECT_EQ(r.out.find("NCCL: "), std::string::npos) << "reached NCCL: " << r.out;
  EXPECT_EQ(r.out.find("Epoch 1"), std::string::npos) << "trained anyway: " << r.out;
}

// Item 6 of issue 26 on a machine with two GPUs or more: NCCL's reductions are timed from events on
// the communication stream (Note [Communication time]); a host clock read about 0 for them.
TEST_F(MpiRunTest, NcclReductionsAreTimedOnTheDevice) {
  if (cuda_device_count() < 2 || !dist::nccl_compiled()) GTEST_SKIP() << "needs 2 CUDA GPUs and NCCL";
  const Result r = launch(2, "--data " + quote(path("data")) +
                                 " --device cuda --quiet --epochs 1 --batch-size 16 --effective-batch 64 --metrics " +
                                 quote(path("nccl.jsonl")) + " --memory-report " + quote(path("nccl_memory.json")));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = metrics("nccl.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_GT(lines[0].value("communication_seconds", 0.0), 0.0) << lines[0].dump();
  const nlohmann::json report = nlohmann::json::parse(read_log(path("nccl_memory.json")));
  ASSERT_FALSE(report["steps"].empty());
  for (const auto& step : report["steps"]) EXPECT_GT(step.value("communication_ms", 0.0), 0.0) << step.dump();
}

// A rank killed mid-run: the job ends on every rank (not a hang), the launcher names the rank, and
// the checkpoint of the last finished epoch resumes.
TEST_F(MpiRunTest, ARankThatDiesEndsTheJobAndTheCheckpointResumes) {
  const std::string ckpt = path("fault.ckpt");
  const std::string log = path("fault.log");
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  const std::string app = std::string(FASHION_MNIST_BIN) + " " + common() + " --epochs 400 --checkpoint " + quote(ckpt);
  // In the background through sh, so the test can find the ranks (mpirun's children) and kill one.
  const Result started =
      run_command("(" + mpi_env() + "mpirun " + root + "--oversubscribe -np 2 " + app + " > " + quote(log) +
                  " 2>&1; echo \"job exit status $?\" >> " + quote(log) + ") > /dev/null 2>&1 & echo $!");
  ASSERT_EQ(started.exit_code, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(ckpt) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(fs::exists(ckpt)) << "no checkpoint after 120 s";
  // The ranks: the processes whose command line starts with the app binary (not the shell or mpirun).
  const Result pids =
      run_command("pgrep -f -- " + quote("^" + std::string(FASHION_MNIST_BIN) + " .*--checkpoint " + ckpt) +
                  " | sort -n | tail -1");
  ASSERT_FALSE(pids.out.empty());
  const pid_t victim = static_cast<pid_t>(std::stol(pids.out));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  std::string out;
  const auto end_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < end_deadline) {
    out = read_log(log);
    if (out.find("job exit status ") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(out.find("job exit status "), std::string::npos)
      << "the job did not end within 60 s of a rank's death: " << out;
  EXPECT_EQ(out.find("job exit status 0"), std::string::npos) << out;
  EXPECT_NE(out.find("exited on signal 9"), std::string::npos) << "the launcher does not name the dead rank: " << out;
  // The checkpoint is whole: it resumes, for one more epoch, on one rank.
  const io::SafetensorsHeader header = io::read_safetensors_header(ckpt);
  const int epochs_done = std::stoi(header.metadata.at("epoch"));
  const Result resumed =
      launch(1, common() + " --resume " + quote(ckpt) + " --epochs " + std::to_string(epochs_done + 1) + " --save " +
                    quote(path("after_fault.safetensors")));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_TRUE(fs::exists(path("after_fault.safetensors"))) << resumed.out;
}

}  // namespace
