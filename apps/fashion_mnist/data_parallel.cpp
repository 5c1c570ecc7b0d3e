#include "data_parallel.h"

#include <algorithm>
#include <thread>

#include <unistd.h>

#include "checkpoint.h"
#include "cumulus/core/threads.h"
#include "run_control.h"
#include "settings.h"

using namespace cumulus;

namespace fmnist {
namespace {

// "memory.json" -> "memory.rank1.json": each rank's own report.
std::string rank_path(const std::string& path, int rank) {
  if (path.empty()) return path;
  const std::string suffix = ".rank" + std::to_string(rank);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) return path + suffix;
  return path.substr(0, dot) + suffix + path.substr(dot);
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string("unknown");
}

// One GPU per rank on each node: the rank's place among the node's ranks (--device auto or cuda;
// an explicit cuda:N is taken as given on every rank, for launchers that give each rank its own
// CUDA_VISIBLE_DEVICES). Returns this rank's problem ("" if none) instead of throwing, so that
// every rank can learn of it and all stop together.
std::string choose_rank_device(Options& o, const dist::Communicator& comm) {
  if (!o.resolved_device.is_cuda() || (o.device != "auto" && o.device != "cuda")) return "";
  const int devices = cuda_device_count();
  try {
    o.resolved_device = Device::cuda(dist::device_for_local_rank(comm.local_rank(), comm.local_size(), devices));
    return "";
  } catch (const InvalidArgument& e) {
    const std::string n = std::to_string(devices);
    return "host " + host_name() + ": " + e.what() + "; start at most " + n + " per node (mpirun -npernode " + n +
           "), or give --device cpu (or --device cuda:0 where each rank sees a GPU of its own through "
           "CUDA_VISIBLE_DEVICES)";
  }
}

// --effective-batch with --batch-size: the accumulation steps that keep the effective batch on
// any number of ranks.
void set_elastic_accum_steps(Options& o) {
  if (!o.elastic) return;
  const int64_t per_step = o.batch_size * o.world_size;
  if (o.effective_batch % per_step != 0)
    throw UsageFailure("--effective-batch " + std::to_string(o.effective_batch) +
                       " is not a multiple of --batch-size " + std::to_string(o.batch_size) + " x " +
                       std::to_string(o.world_size) + " rank(s) = " + std::to_string(per_step));
  o.accum_steps = static_cast<int>(o.effective_batch / per_step);
}

// Rank 0 writes the checkpoint, the weights and the metrics; every rank its own memory report.
void assign_rank_outputs(Options& o) {
  if (g_root) return;
  o.checkpoint_path.clear();
  o.save_path.clear();
  o.metrics_path.clear();
  o.memory_report_path = rank_path(o.memory_report_path, o.rank);
  o.trace_path = rank_path(o.trace_path, o.rank);
  o.memory_plot_path = rank_path(o.memory_plot_path, o.rank);
}

void check_same_settings_on_every_rank(const Options& o, dist::Communicator& comm) {
  try {
    dist::check_same_settings(comm, named_settings(kRanksAgree, {o, ""}));
  } catch (const InvalidArgument& e) {
    throw SameOnEveryRank(e.what());
  }
}

}  // namespace

void run_data_parallel_setup(Options& o, dist::Communicator& comm) {
  o.rank = comm.rank();
  o.world_size = comm.world_size();
  g_root = comm.is_root();
  set_elastic_accum_steps(o);
  if (o.world_size == 1) return;
  // Ranks on one host share its cores: without --threads, each takes its share.
  if (o.threads == 0)
    set_cpu_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm.local_size()));
  if (o.effective_batch > 0 && !o.elastic)
    throw UsageFailure("the planner (--effective-batch without --batch-size) runs in one process; with " +
                       std::to_string(o.world_size) + " ranks give --effective-batch and --batch-size");
  if (o.resolved_device.is_cuda()) {
    if (o.graphs == "on") throw UsageFailure("--graphs on: CUDA graphs with several ranks are not supported yet");
    o.use_graphs = false;
  }
  // Before any work: NCCL would refuse two ranks on one GPU only in the first backward.
  if (const std::string problem = dist::problem_of_any_rank(comm, choose_rank_device(o, comm)); !problem.empty())
    throw SameOnEveryRank(problem);
  assign_rank_outputs(o);
  check_same_settings_on_every_rank(o, comm);
}

}  // namespace fmnist
