// Data parallelism: ranks, and the sums across them. See Note [Data parallel accumulation] in
// engine/dist/communicator.cpp and docs/ARCHITECTURE.md, "Data parallel".
//
//   auto comm = dist::Communicator::from_environment();  // world 1 unless started by mpirun
//   AccumulationOptions ao; ao.communicator = comm; ...    // one all-reduce per optimizer step
//
// Two real transports, never a hand-made one: MPI (OpenMPI) launches the ranks and carries CPU
// tensors between them; NCCL carries CUDA tensors, one GPU per rank, its id exchanged over MPI.
// Without either compiled in, or when not started by a launcher, the communicator is the world of
// one rank and every collective is a no-op.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/device.h"
#include "cumulus/core/timer.h"

namespace cumulus::dist {

// Which transports this build has.
bool mpi_compiled();
bool nccl_compiled();
// "MPI: Open MPI v4.1.4, NCCL: not compiled", for --version and reports.
std::string transports_text();

// The rank that processes micro-batch `index` of an epoch: round-robin, so every global group of
// accumulation steps x world micro-batches gives each rank the same number, and a short last group
// spreads over the lowest ranks. The same function everywhere makes the split deterministic.
inline int owner_of_micro_batch(int64_t index, int world_size) { return static_cast<int>(index % world_size); }

// What a reduction sums: gradients are f32, the step's sample and loss sums f64.
enum class Element { f32, f64 };

// Each rank's part of a flat array of `size` f32 elements (ZeRO's partition of the flat parameters,
// their gradients and the optimizer state): consecutive, in rank order, each a multiple of
// `align` elements but the last, as equal as that allows (a rank may own none when size is small).
struct Shard {
  int64_t offset = 0, count = 0;
};
std::vector<Shard> shard_layout(int64_t size, int world_size, int64_t align = 64);

class Communicator {
 public:
  struct Stats {
    int64_t gradient_reductions = 0;  // logical all-reduces of the gradient: one per optimizer step
    int64_t messages = 0;             // transport calls they took (buckets), plus small collectives
    int64_t bytes_reduced = 0;        // payload of the gradient reductions, per rank
    // Time in the reductions (Note [Communication time] in engine/dist/communicator.cpp): MPI's,
    // the host's wait for them; NCCL's, their device time from events on the communication stream.
    double communication_seconds = 0.0;
  };

  // The world this process belongs to: MPI's when started by mpirun/srun (OMPI_COMM_WORLD_SIZE,
  // PMI_SIZE or PMIX_RANK set), else a world of one. Initializes MPI once; MPI is finalized at
  // exit. Throws when started by a launcher but built without MPI (every rank would otherwise
  // train alone and write the same files).
  static std::shared_ptr<Communicator> from_environment();
  // A world of one (tests, and library users who want no MPI).
  static std::shared_ptr<Communicator> single();
  // Rank `rank` of `world` ranks, alone: every collective leaves the data as it is (a sum over this
  // rank only). What the planner's probes of a ZeRO setting run with, so one rank's memory is
  // measured in one process. Backend "alone" ("single" for a world of one).
  static std::shared_ptr<Communicator> alone(int rank, int world);

  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool is_root() const { return rank_ == 0; }
  // The rank among those on this host, and their number (MPI's shared-memory split): which GPU a
  // rank takes, and how many CPU threads it should use.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // "MPI", "MPI+NCCL" or "single".
  virtual std::string backend() const = 0;

  // Sums `count` elements (f32 or f64) at `data`, in place, across ranks; `data` lives on `device`.
  // CPU memory goes through MPI, CUDA memory through NCCL on the device's stream (stream-ordered:
  // the host does not wait). Every rank must call with the same count and element type.
  virtual void all_reduce_sum(void* data, int64_t count, Element type, Device device) = 0;
  // The same, started now and finished by wait_all(): for buckets reduced while backward still
  // runs. `data` must not be touched until wait_all() returns.
  virtual void start_all_reduce_sum(void* data, int64_t count, Element type, Device device) = 0;
  // Lets started reductions progress (MPI progresses non-blocking collectives only inside MPI
  // calls); cheap, called between backward ops.
  virtual void progress() = 0;
  virtual void wait_all() = 0;

  // ZeRO's two collectives over a flat f32 array laid out by `shards` (shard_layout: one per rank),
  // in place, blocking on the CPU, stream-ordered on CUDA. all_gather: each rank's shard of `data`
  // (its own values) reaches every rank, so all hold the same array. reduce_scatter_sum: the sum
  // across ranks of the whole array, of which this rank keeps its own shard (the other elements
  // are left undefined). Every rank must call with the same layout.
  virtual void all_gather(float* data, const std::vector<Shard>& shards, Device device) = 0;
  virtual void reduce_scatter_sum(float* data, const std::vector<Shard>& shards, Device device) = 0;
  // Every rank's shard to the root only (a checkpoint of sharded state): on the root `data` is the
  // whole array, its own shard in place; on the others `data` is just this rank's shard.
  virtual void gather_to_root(float* data, const std::vector<Shard>& shards, Device device) = 0;

  // Host-side control, through MPI (never NCCL): whether any rank says true; the root's string on
  // every rank; every rank's string at the root (empty elsewhere).
  virtual bool any(bool mine) = 0;
  virtual std::string broadcast_from_root(const std::string& root_value) = 0;
  virtual std::vector<std::string> gather_to_root(const std::string& mine) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job (MPI_Abort) after an error on this one, with `exit_code`; the
  // launcher names the rank. Returns at once in a world of one.
  virtual void abort(int exit_code) = 0;

  // Counts a finished logical gradient reduction of `bytes` (the Trainer calls this once per
  // step, however many buckets it took).
  void count_gradient_reduction(int64_t bytes) {
    stats_.gradient_reductions += 1;
    stats_.bytes_reduced += bytes;
  }
  // The counters, with communication_seconds complete: waits for reductions still running on the
  // device, so read it where the host waits anyway (an epoch's end), not inside a step.
  Stats stats();
  // stats() as a line: "40 gradient all-reduces (80 transport calls, 12.5 MiB per rank), 0.031 s in
  // them (the host's wait for MPI)"; NCCL's time is its device time.
  std::string stats_text();
  // The reductions' spans since the last call, for a figure per step read later without waiting
  // now (MemoryTracker::end_step). Fewer than kMaxRecentSpans are kept for it: the latest.
  TimeSpans take_recent_spans();
  static constexpr std::size_t kMaxRecentSpans = 1024;

  // Within its scope the counters and the spans stay as they were: a measurement of the transport
  // (measure_collective_times) is not the run's communication.
  class StatsUnchanged {
   public:
    explicit StatsUnchanged(Communicator& comm)
        : comm_(comm), stats_(comm.stats_), unresolved_(comm.unresolved_), recent_(comm.recent_) {}
    ~StatsUnchanged() {
      comm_.stats_ = stats_;
      comm_.unresolved_ = std::move(unresolved_);
      comm_.recent_ = std::move(recent_);
    }
    StatsUnchanged(const StatsUnchanged&) = delete;
    StatsUnchanged& operator=(const StatsUnchanged&) = delete;

   private:
    Communicator& comm_;
    Stats stats_;
    TimeSpans unresolved_, recent_;
  };

 protected:
  Communicator(int rank, int world, int local_rank, int local_size)
      : rank_(rank), world_(world), local_rank_(local_rank), local_size_(local_size) {}
  // A transport's reduction took from `start` to `end` (points on the host or on the device).
  void add_span(const TimePoint& start, const TimePoint& end);
  int rank_, world_, local_rank_, local_size_;
  Stats stats_;

 private:
  void resolve_spans();
  void resolve_finished_spans();
  TimeSpans unresolved_;  // not yet in stats_.communication_seconds
  TimeSpans recent_;      // not yet taken
};

// The CUDA device of the rank that is `local_rank`-th of the `local_ranks` ranks on a node with
// `device_count` GPUs: its own GPU, index local_rank. NCCL refuses two ranks on one GPU ("Duplicate
// GPU detected", ncclInvalidUsage), and only inside the first reduction, after loading and a first
// backward; so a node with more ranks than GPUs throws InvalidArgument here, naming both counts, for
// every rank of that node.
int device_for_local_rank(int local_rank, int local_ranks, int device_count);
// This rank's own GPU (device_for_local_rank with this host's CUDA devices). A node with too many
// ranks is an InvalidArgument naming the host and the counts, ending "; start at most N per node
// (mpirun -npernode N)".
Device device_for_rank(const Communicator& comm);

// A problem any rank found, known to every rank: each passes its own (empty: none); every rank gets
// "rank R: <problem>" for the lowest rank R that has one, or "" if none has. Lets all ranks stop
// together with one message where one rank's error alone would end the job through abort(). A
// collective: every rank must call it.
std::string problem_of_any_rank(Communicator& comm, const std::string& mine);

// What each rank loaded from its own files (a dataset's size, a checkpoint's position), compared: ""
// when every rank's `mine` equals rank 0's, else "rank 0 <value>; rank 1 <value>; ..." on every
// rank, so all can stop together before a collective that depends on it (one rank waiting in a
// reduction the others never reach would hang the job). A collective: every rank must call it.
std::string difference_among_ranks(Communicator& comm, const std::string& mine);

// Refuses ranks started with different settings: every rank passes its (name, value) pairs; if any
// rank differs from rank 0, every rank throws InvalidArgument naming the first differing setting,
// the rank and both values. A no-op in a world of one.
void check_same_settings(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& settings);

}  // namespace cumulus::dist
