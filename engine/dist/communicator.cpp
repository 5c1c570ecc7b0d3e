// Note [Data parallel accumulation]
// Data parallelism and gradient accumulation are the same sum split two ways. A global group (one
// optimizer step) is accumulation steps x world size micro-batches of the epoch's order, exactly
// the group a single process would form; rank r processes the micro-batches i with
// i % world == r (dist::owner_of_micro_batch) and counts the others without running them
// (Trainer::skip_micro_batch), so every rank agrees on where each group ends, a short last
// group included, and the Trainer's counters, checkpoints and learning-rate schedule are
// those of one process whatever the world size.
//
// At the step the flat gradient buffer, and the step state's sample and loss sums, are summed
// across ranks: one logical all-reduce per optimizer step, never per micro-batch. It is split
// into buckets of whole parameter slots, in reverse order, and a bucket starts as soon as the
// backward of the rank's last micro-batch in the group has finished writing it (the backward
// engine's leaf-gradient hook), so communication overlaps the rest of that backward; the rest
// are started at the step. Each rank then normalizes by the global sample count, computes the
// global norm, decides on clipping and on a non-finite skip, and updates: all from identical
// inputs, so the decision and the optimizer state are the same on every rank without another
// message. The reductions work in place on the persistent gradient buffer (its slices never move
// or get freed), so they need no buffer of their own and no allocator support for a second stream.
//
// Batch norm's running statistics are not reduced: each rank's see its own micro-batches (as with
// PyTorch DDP without SyncBatchNorm) and rank 0's are saved.
//
// Note [Communication time]
// The time a rank spends communicating is measured where the transport spends it. MPI (CPU memory)
// progresses the reductions inside MPI calls, so its figure is the host's wait in wait_all(). NCCL
// (CUDA memory) runs them as kernels on the communication stream and the host never waits for them
// (the compute stream does, through an event), so a host clock around wait_all() reads about 0:
// instead each NCCL reduction is bracketed by two timing events on the communication stream, and
// its time is the device time between them, from the moment the stream reaches it (its bucket
// written by backward, the previous reduction done) to its end, the wait for the slowest rank
// included. Reading an event's time waits for it, so spans are kept unread: stats() resolves them
// where the host waits anyway (the app reads it at an epoch's end), every kMaxUnresolvedSpans
// spans those the device has finished are resolved in a batch (never waiting), and
// take_recent_spans() hands a step's spans to the memory tracker, which reads them with its other
// device times.
#include "cumulus/dist/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cumulus/core/error.h"

namespace cumulus::dist {

namespace {

// A world of one: every collective is the identity.
// A rank whose collectives move nothing: the world of one, or one rank of a world planned alone.
class Alone final : public Communicator {
 public:
  Alone(int rank, int world) : Communicator(rank, world, rank, world) {}
  std::string backend() const override { return world_ == 1 ? "single" : "alone"; }
  void all_reduce_sum(void*, int64_t, Element, Device) override {}
  void start_all_reduce_sum(void*, int64_t, Element, Device) override {}
  void progress() override {}
  void wait_all() override {}
  void all_gather(float*, const std::vector<Shard>&, Device) override {}
  void reduce_scatter_sum(float*, const std::vector<Shard>&, Device) override {}
  void gather_to_root(float*, const std::vector<Shard>&, Device) override {}
  bool any(bool mine) override { return mine; }
  std::string broadcast_from_root(const std::string& root_value) override { return root_value; }
  std::vector<std::string> gather_to_root(const std::string& mine) override { return {mine}; }
  void barrier() override {}
  void abort(int) override {}
};

bool started_by_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace

#if CUMULUS_WITH_MPI
// mpi_communicator.cpp
std::shared_ptr<Communicator> make_mpi_communicator();
std::string mpi_library_version();
#endif

std::shared_ptr<Communicator> Communicator::single() { return std::make_shared<Alone>(0, 1); }

std::shared_ptr<Communicator> Communicator::alone(int rank, int world) {
  CUMULUS_CHECK(world >= 1 && rank >= 0 && rank < world, InvalidArgument, "Communicator::alone: rank ", rank,
                " of a world of ", world);
  return std::make_shared<Alone>(rank, world);
}

std::vector<Shard> shard_layout(int64_t size, int world_size, int64_t align) {
  CUMULUS_CHECK(size >= 0 && world_size >= 1 && align >= 1, InvalidArgument, "shard_layout: size ", size,
                ", world size ", world_size, ", alignment ", align);
  const int64_t per_rank = (size + world_size - 1) / world_size;
  const int64_t step = (per_rank + align - 1) / align * align;
  std::vector<Shard> shards(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const int64_t begin = std::min(size, r * step);
    shards[static_cast<std::size_t>(r)] = {begin, std::min(size, begin + step) - begin};
  }
  return shards;
}

std::shared_ptr<Communicator> Communicator::from_environment() {
  if (!started_by_launcher()) return single();
#if CUMULUS_WITH_MPI
  return make_mpi_communicator();
#else
  throw Error(
      "started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set) but cumulus was built "
      "without MPI: every rank would train alone; rebuild with OpenMPI (libopenmpi-dev) and CUMULUS_DIST=ON");
#endif
}

namespace {
constexpr std::size_t kMaxUnresolvedSpans = 256;  // resolved in batches, long after they ended
}  // namespace

void Communicator::add_span(const TimePoint& start, const TimePoint& end) {
  unresolved_.emplace_back(start, end);
  if (unresolved_.size() >= kMaxUnresolvedSpans) resolve_finished_spans();
  // Bounded for callers that never take them (the older half goes); one taking them per step
  // stays far below.
  if (recent_.size() >= kMaxRecentSpans)
    recent_.erase(recent_.begin(), recent_.begin() + static_cast<std::ptrdiff_t>(kMaxRecentSpans / 2));
  recent_.emplace_back(start, end);
}

void Communicator::resolve_spans() {
  stats_.communication_seconds += total_ms(unresolved_) / 1e3;
  unresolved_.clear();
}

// Inside a step: only the spans the device has finished, oldest first (a stream finishes its
// work in order), so that this never waits.
void Communicator::resolve_finished_spans() {
  std::size_t done = 0;
  while (done < unresolved_.size() && unresolved_[done].second.reached()) ++done;
  const auto end = unresolved_.begin() + static_cast<std::ptrdiff_t>(done);
  stats_.communication_seconds += total_ms(TimeSpans(unresolved_.begin(), end)) / 1e3;
  unresolved_.erase(unresolved_.begin(), end);
}

Communicator::Stats Communicator::stats() {
  resolve_spans();
  return stats_;
}

std::string Communicator::stats_text() {
  const Stats st = stats();
  char line[256];
  std::snprintf(
      line, sizeof line, "%lld gradient all-reduces (%lld transport calls, %.1f MiB per rank), %.3f s in them (%s)",
      static_cast<long long>(st.gradient_reductions), static_cast<long long>(st.messages),
      static_cast<double>(st.bytes_reduced) / (1 << 20), st.communication_seconds,
      backend() == "MPI+NCCL" ? "NCCL's device time" : "the host's wait for MPI");  // Note [Communication time]
  return line;
}

TimeSpans Communicator::take_recent_spans() { return std::exchange(recent_, {}); }

bool mpi_compiled() { return CUMULUS_WITH_MPI != 0; }
bool nccl_compiled() { return CUMULUS_WITH_NCCL != 0; }

std::string transports_text() {
#if CUMULUS_WITH_MPI
  std::string s = "MPI: " + mpi_library_version();
#else
  std::string s = "MPI: not compiled";
#endif
  return s + (nccl_compiled() ? ", NCCL: compiled" : ", NCCL: not compiled");
}

int device_for_local_rank(int local_rank, int local_ranks, int device_count) {
  CUMULUS_CHECK(local_ranks > 0 && local_rank >= 0 && local_rank < local_ranks, InvalidArgument,
                "device_for_local_rank: local rank ", local_rank, " of ", local_ranks);
  CUMULUS_CHECK(local_ranks <= device_count, InvalidArgument, local_ranks,
                local_ranks == 1 ? " rank runs" : " ranks run", " on this node but it has ",
                device_count == 0 ? "no" : std::to_string(device_count), " CUDA device", device_count == 1 ? "" : "s",
                ": each rank needs a GPU of its own (NCCL refuses two ranks on one GPU)");
  return local_rank;
}

Device device_for_rank(const Communicator& comm) {
  const int devices = cuda_device_count();
  try {
    return Device::cuda(device_for_local_rank(comm.local_rank(), comm.local_size(), devices));
  } catch (const InvalidArgument& e) {
    char host[256] = {};
    const std::string n = std::to_string(devices);
    throw InvalidArgument("host " + std::string(::gethostname(host, sizeof host - 1) == 0 ? host : "unknown") + ": " +
                          e.what() + "; start at most " + n + " per node (mpirun -npernode " + n + ")");
  }
}

std::string problem_of_any_rank(Communicator& comm, const std::string& mine) {
  if (comm.world_size() == 1) return mine.empty() ? mine : "rank 0: " + mine;
  const std::vector<std::string> all = comm.gather_to_root(mine);  // empty except at the root
  std::string first;
  for (std::size_t r = 0; r < all.size() && first.empty(); ++r)
    if (!all[r].empty()) first = "rank " + std::to_string(r) + ": " + all[r];
  return comm.broadcast_from_root(first);
}

std::string difference_among_ranks(Communicator& comm, const std::string& mine) {
  if (comm.world_size() == 1) return "";
  const std::vector<std::string> all = comm.gather_to_root(mine);  // empty except at the root
  std::string listed;
  if (comm.is_root() && std::any_of(all.begin(), all.end(), [&](const std::string& v) { return v != all[0]; }))
    for (std::size_t r = 0; r < all.size(); ++r)
      listed += (r == 0 ? "" : "; ") + std::string("rank ") + std::to_string(r) + " " + all[r];
  return comm.broadcast_from_root(listed);
}

void check_same_settings(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& settings) {
  if (comm.world_size() == 1) return;
  // One line per setting, "name=value"; values hold no newline (they are flag values).
  std::string mine;
  for (const auto& [name, value] : settings) mine += name + "=" + value + "\n";
  const std::vector<std::string> all = comm.gather_to_root(mine);
  std::string verdict;
  if (comm.is_root()) {
    auto lines = [](const std::string& text) {
      std::vector<std::string> out;
      for (std::size_t pos = 0; pos < text.size();) {
        const std::size_t end = text.find('\n', pos);
        out.push_back(text.substr(pos, end - pos));
        pos = end + 1;
      }
      return out;
    };
    const std::vector<std::string> root = lines(all[0]);
    for (std::size_t r = 1; r < all.size() && verdict.empty(); ++r) {
      const std::vector<std::string> other = lines(all[r]);
      for (std::size_t i = 0; i < std::max(root.size(), other.size()) && verdict.empty(); ++i) {
        const std::string a = i < root.size() ? root[i] : "(nothing)";
        const std::string b = i < other.size() ? other[i] : "(nothing)";
        if (a == b) continue;
        const std::string name = a.substr(0, a.find('='));
        verdict = "rank " + std::to_string(r) + " was started with other settings than rank 0: --" + name + " " +
                  (b.find('=') == std::string::npos ? b : b.substr(b.find('=') + 1)) + " on rank " + std::to_string(r) +
                  ", " + (a.find('=') == std::string::npos ? a : a.substr(a.find('=') + 1)) +
                  " on rank 0; start every rank with the same options";
      }
    }
  }
  verdict = comm.broadcast_from_root(verdict);
  CUMULUS_CHECK(verdict.empty(), InvalidArgument, verdict);
}

}  // namespace cumulus::dist
