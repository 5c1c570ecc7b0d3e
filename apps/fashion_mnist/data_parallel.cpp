#include "data_parallel.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "checkpoint.h"
#include "cumulus/core/threads.h"
#include "run_control.h"
#include "settings.h"

using namespace cumulus;

namespace fmnist {
namespace {

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("unknown");
}

// One GPU per rank on each node: the rank's place among the node's ranks (--device auto or cuda;
// an explicit cuda:N is taken as given on every rank, for launchers that give each rank its own
// CUDA_VISIBLE_DEVICES). Sets `device` and returns this rank's problem ("" if none) instead of
// throwing, so that every rank can learn of it and all stop together.
std::string choose_rank_device(const RunConfig& c, const dist::Communicator& comm, Device& device) {
  if (!c.device.is_cuda() || !c.one_gpu_per_rank) return "";
  const int devices = cuda_device_count();
  try {
    device = Device::cuda(dist::device_for_local_rank(comm.local_rank(), comm.local_size(), devices));
    return "";
  } catch (const InvalidArgument& e) {
    const std::string n = std::to_string(devices);
    return "host " + host_name() + ": " + e.what() + "; start at most " + n + " per node (mpirun -npernode " + n +
           "), or give --device cpu (or --device cuda:0 where each rank sees a GPU of its own through "
           "CUDA_VISIBLE_DEVICES)";
  }
}

}  // namespace

RankPlacement place_on_ranks(const RunConfig& c, dist::Communicator& comm) {
  RankPlacement placement{comm.rank(), comm.world_size(), c.device};
  g_root = comm.is_root();
  if (placement.world_size == 1) return placement;
  // Ranks on one host share its cores: without --threads, each takes its share.
  if (c.threads == 0)
    fit_cpu_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm.local_size()));
  if (c.batch_source == BatchSource::planner)
    throw UsageFailure("the planner (--effective-batch without --batch-size) runs in one process; with " +
                       std::to_string(placement.world_size) + " ranks give --effective-batch and --batch-size");
  if (c.device.is_cuda() && c.graphs == GraphsChoice::on)
    throw UsageFailure("--graphs on: CUDA graphs with several ranks are not supported yet");
  // Before any work: NCCL would refuse two ranks on one GPU only in the first backward.
  if (const std::string problem = dist::problem_of_any_rank(comm, choose_rank_device(c, comm, placement.device));
      !problem.empty())
    throw SameOnEveryRank(problem);
  return placement;
}

void check_same_settings_on_every_rank(const RunConfig& c, dist::Communicator& comm) {
  if (c.world_size == 1) return;
  try {
    dist::check_same_settings(comm, named_settings(kRanksAgree, {c, ""}));
  } catch (const InvalidArgument& e) {
    throw SameOnEveryRank(e.what());
  }
}

void usage_check_on_every_rank(dist::Communicator& comm, const std::function<void()>& check) {
  if (comm.world_size() == 1) return check();
  std::string problem;
  try {
    check();
  } catch (const UsageFailure& e) {
    problem = e.what();
  }
  if (const std::string first = dist::problem_of_any_rank(comm, problem); !first.empty()) throw SameOnEveryRank(first);
}

void check_same_loaded_on_every_rank(const char* what, const std::string& mine, const std::string& advice,
                                     dist::Communicator& comm) {
  if (const std::string listed = dist::difference_among_ranks(comm, mine); !listed.empty())
    throw ErrorOnEveryRank(std::string("the ranks loaded different ") + what + ": " + listed + "; " + advice);
}

}  // namespace fmnist
