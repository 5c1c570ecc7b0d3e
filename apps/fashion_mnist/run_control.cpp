#include "run_control.h"

#include <algorithm>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <thread>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/core/threads.h"
#include "cumulus/io/run_files.h"
#include "cumulus/models/fashion_mnist.h"

using namespace cumulus;

namespace fmnist {

bool g_root = true;
bool g_agreed_exit = false;

void say(const char* format, ...) {
  if (!g_root) return;
  std::va_list args;
  va_start(args, format);
  std::vfprintf(stdout, format, args);
  va_end(args);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) app::request_stop(SIGPIPE);
}

namespace {

// One GPU per rank on each node: the rank's place among the node's ranks (--device auto or cuda;
// an explicit cuda:N is taken as given on every rank, for launchers that give each rank its own
// CUDA_VISIBLE_DEVICES). Sets `device` and returns this rank's problem ("" if none) instead of
// throwing, so that every rank can learn of it and all stop together.
std::string choose_rank_device(const RunConfig& c, const dist::Communicator& comm, Device& device) {
  if (!c.device.is_cuda() || !c.one_gpu_per_rank) return "";
  try {
    device = dist::device_for_rank(comm);
    return "";
  } catch (const InvalidArgument& e) {
    return std::string(e.what()) +
           ", or give --device cpu (or --device cuda:0 where each rank sees a GPU of its own through "
           "CUDA_VISIBLE_DEVICES)";
  }
}

std::vector<io::RunFile> outputs_of(const RunConfig& o, const std::string& owner = "") {
  std::vector<io::RunFile> out;
  for (const io::RunFile& f :
       {io::RunFile{"--save", o.save_path}, io::RunFile{"--checkpoint", o.checkpoint_path},
        io::RunFile{"--memory-report", o.memory_report_path}, io::RunFile{"--trace", o.trace_path},
        io::RunFile{"--memory-plot", o.memory_plot_path}, io::RunFile{"--metrics", o.metrics_path},
        io::RunFile{"--op-profile", o.op_profile_path}})
    if (!f.path.empty()) out.push_back({owner + f.name, f.path});
  return out;
}

// Note [The job's outputs]
// Under mpirun rank k > 0 writes its reports under names with ".rank<k>" and rank 0 writes the
// checkpoint, the weights and the metrics, so one rank's outputs alone cannot show that rank 1's
// memory report is named like rank 0's checkpoint: the whole job's outputs are compared, every
// rank's names computed from the same resolved configuration (the ranks agree on it), each named
// with its rank in a message.
std::vector<io::RunFile> job_outputs(const RunConfig& resolved, const RunConfig& placed) {
  if (placed.world_size == 1) return outputs_of(placed);
  std::vector<io::RunFile> out;
  for (int k = 0; k < placed.world_size; ++k) {
    const std::vector<io::RunFile> rank_k = outputs_of(
        on_ranks(resolved, RankPlacement{k, placed.world_size, placed.device}), "rank " + std::to_string(k) + "'s ");
    out.insert(out.end(), rank_k.begin(), rank_k.end());
  }
  return out;
}

}  // namespace

RankPlacement place_on_ranks(const RunConfig& c, dist::Communicator& comm) {
  RankPlacement placement{comm.rank(), comm.world_size(), c.device};
  g_root = comm.is_root();
  if (placement.world_size == 1) return placement;
  // Ranks on one host share its cores: without --threads, each takes its share.
  if (c.threads == 0)
    fit_cpu_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm.local_size()));
  if (c.batch_source == BatchSource::planner && c.effective_batch % placement.world_size != 0)
    throw UsageFailure("--effective-batch " + std::to_string(c.effective_batch) + " does not divide over " +
                       std::to_string(placement.world_size) + " ranks; give a multiple of the world size");
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
    dist::check_same_settings(comm, settings_table().named(app::kRanksAgree, {c, ""}));
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

void check_run_paths(const RunConfig& resolved, const RunConfig& o) {
  as_usage([&] {
    io::check_outputs_writable(outputs_of(o));
    // Resuming from a checkpoint and writing the next ones to the same file is the normal use: the
    // checkpoint is read in full before anything is written.
    io::check_outputs_distinct(job_outputs(resolved, o), {{"--init", o.init_path}, {"--resume", o.resume_path}},
                               [](const io::RunFile& in, const io::RunFile& out) {
                                 const std::string checkpoint = "--checkpoint";  // any rank's
                                 return in.name == "--resume" && out.name.size() >= checkpoint.size() &&
                                        out.name.compare(out.name.size() - checkpoint.size(), checkpoint.size(),
                                                         checkpoint) == 0;
                               });
    io::check_outputs_not_standard_streams(outputs_of(o));
  });
}

void check_outputs_against_data(const RunConfig& resolved, const RunConfig& o, const std::string& data_dir) {
  as_usage([&] { io::check_outputs_outside(job_outputs(resolved, o), data_dir, "the dataset"); });
}

std::string locate_fashion_mnist(const std::string& data_flag, bool quiet) {
  models::FashionMnistSearch search;
  search.dir = data_flag;
  search.dir_option = "--data";
  search.quiet = quiet;
  std::string dir;
  as_usage([&] { dir = models::locate_fashion_mnist(search); });  // the directory given lacks files
  return dir;
}

}  // namespace fmnist
