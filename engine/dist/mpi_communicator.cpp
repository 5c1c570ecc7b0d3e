// The MPI communicator (Note [Data parallel accumulation] in communicator.cpp): MPI for the
// processes and CPU tensors, NCCL for CUDA tensors when compiled in (one GPU per rank, the NCCL
// id broadcast over MPI, reductions on a communication stream ordered after the compute stream by
// events, so they overlap later kernels and the host never waits; their time is taken from timing
// events on that stream, Note [Communication time] in communicator.cpp).
#if CUMULUS_WITH_MPI
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "cumulus/core/error.h"
#include "cumulus/dist/communicator.h"

#if CUMULUS_WITH_NCCL
#include <nccl.h>

#include "engine/core/cuda_context.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace cumulus::dist {

namespace {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("MPI: ") + what + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

#if CUMULUS_WITH_NCCL
void check_nccl(ncclResult_t code, const char* what) {
  if (code == ncclSuccess) return;
  throw DeviceError(std::string("NCCL: ") + what + " failed: " + ncclGetErrorString(code));
}
#endif

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int world, int local_rank, int local_size)
      : Communicator(rank, world, local_rank, local_size) {}
  ~MpiCommunicator() override {
#if CUMULUS_WITH_NCCL
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
#endif
  }

  std::string backend() const override {
#if CUMULUS_WITH_NCCL
    if (nccl_ != nullptr) return "MPI+NCCL";
#endif
    return "MPI";
  }

  void all_reduce_sum(void* data, int64_t count, Element type, Device device) override {
    start_all_reduce_sum(data, count, type, device);
    wait_all();
  }

  void start_all_reduce_sum(void* data, int64_t count, Element type, Device device) override {
    if (count == 0) return;
    CUMULUS_CHECK(count <= INT32_MAX, InvalidArgument, "all_reduce_sum: ", count, " elements (at most 2^31 - 1)");
    ++stats_.messages;
    if (device.is_cuda()) return start_nccl(data, count, type, device);
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), type == Element::f32 ? MPI_FLOAT : MPI_DOUBLE,
                             MPI_SUM, MPI_COMM_WORLD, &request),
              "MPI_Iallreduce");
    requests_.push_back(request);
  }

  void progress() override {
    if (requests_.empty()) return;
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (done) requests_.clear();
  }

  void wait_all() override {
    if (!requests_.empty()) {
      const TimePoint start = TimePoint::now(Device::cpu());  // MPI's time: the host's wait
      check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      requests_.clear();
      add_span(start, TimePoint::now(Device::cpu()));
    }
#if CUMULUS_WITH_NCCL
    if (nccl_pending_) {
      // Stream-ordered: later work on the compute stream waits for the reductions, the host does not.
      cuda::Context& ctx = cuda::context(nccl_device_);
      CUMULUS_CUDA_CHECK(cudaEventRecord(comm_done_, comm_stream_));
      CUMULUS_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), comm_done_, 0));
      nccl_pending_ = false;
    }
#endif
  }

  void all_gather(float* data, const std::vector<Shard>& shards, Device device) override {
    const std::vector<int> counts = shard_ints(shards, "all_gather"), offsets = shard_offsets(shards);
    ++stats_.messages;
    if (device.is_cuda()) return nccl_all_gather(data, shards, device);
    const TimePoint start = TimePoint::now(Device::cpu());
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), offsets.data(), MPI_FLOAT,
                             MPI_COMM_WORLD),
              "MPI_Allgatherv");
    add_span(start, TimePoint::now(Device::cpu()));
  }
  void reduce_scatter_sum(float* data, const std::vector<Shard>& shards, Device device) override {
    const std::vector<int> counts = shard_ints(shards, "reduce_scatter_sum");
    ++stats_.messages;
    if (device.is_cuda()) return nccl_reduce_scatter(data, shards, device);
    const TimePoint start = TimePoint::now(Device::cpu());
    // In place, MPI leaves this rank's sums at the front of the buffer: moved to its shard after.
    check_mpi(MPI_Reduce_scatter(MPI_IN_PLACE, data, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Reduce_scatter");
    const Shard& own = shards[static_cast<std::size_t>(rank_)];
    std::memmove(data + own.offset, data, static_cast<std::size_t>(own.count) * sizeof(float));
    add_span(start, TimePoint::now(Device::cpu()));
  }
  void gather_to_root(float* data, const std::vector<Shard>& shards, Device device) override {
    const std::vector<int> counts = shard_ints(shards, "gather_to_root"), offsets = shard_offsets(shards);
    ++stats_.messages;
    if (device.is_cuda()) return nccl_gather_to_root(data, shards, device);
    const int own = counts[static_cast<std::size_t>(rank_)];
    check_mpi(MPI_Gatherv(is_root() ? MPI_IN_PLACE : data, own, MPI_FLOAT, data, counts.data(), offsets.data(),
                          MPI_FLOAT, 0, MPI_COMM_WORLD),
              "MPI_Gatherv");
  }
  bool any(bool mine) override {
    int in = mine ? 1 : 0, out = 0;
    ++stats_.messages;
    check_mpi(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    return out != 0;
  }

  std::string broadcast_from_root(const std::string& root_value) override {
    int64_t length = static_cast<int64_t>(root_value.size());
    check_mpi(MPI_Bcast(&length, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    std::string out = is_root() ? root_value : std::string(static_cast<std::size_t>(length), '\0');
    if (length > 0)
      check_mpi(MPI_Bcast(out.data(), static_cast<int>(length), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
    stats_.messages += 2;
    return out;
  }

  std::vector<std::string> gather_to_root(const std::string& mine) override {
    const int length = static_cast<int>(mine.size());
    std::vector<int> lengths(is_root() ? static_cast<std::size_t>(world_) : 0);
    check_mpi(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Gather");
    std::vector<int> offsets(lengths.size());
    int total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      offsets[r] = total;
      total += lengths[r];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    check_mpi(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                          MPI_COMM_WORLD),
              "MPI_Gatherv");
    stats_.messages += 2;
    std::vector<std::string> out;
    for (std::size_t r = 0; r < lengths.size(); ++r)
      out.push_back(all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
    return out;
  }

  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  void abort(int exit_code) override { MPI_Abort(MPI_COMM_WORLD, exit_code); }

 private:
  // The shards' counts as MPI's ints, after checking that they are one per rank and tile the array.
  std::vector<int> shard_ints(const std::vector<Shard>& shards, const char* what) const {
    CUMULUS_CHECK(static_cast<int>(shards.size()) == world_, InvalidArgument, what, ": ", shards.size(),
                  " shards for ", world_, " ranks");
    std::vector<int> counts;
    int64_t next = 0;
    for (const Shard& s : shards) {
      CUMULUS_CHECK(s.offset == next && s.count >= 0 && s.offset + s.count <= INT32_MAX, InvalidArgument, what,
                    ": shards must tile the array in rank order, at most 2^31 - 1 elements");
      counts.push_back(static_cast<int>(s.count));
      next += s.count;
    }
    return counts;
  }
  static std::vector<int> shard_offsets(const std::vector<Shard>& shards) {
    std::vector<int> offsets;
    for (const Shard& s : shards) offsets.push_back(static_cast<int>(s.offset));
    return offsets;
  }

  // Each rank's shard broadcast from it, grouped into one NCCL launch (counts may differ).
  void nccl_all_gather([[maybe_unused]] float* data, [[maybe_unused]] const std::vector<Shard>& shards,
                       Device device) {
#if CUMULUS_WITH_NCCL
    on_nccl_stream(device, [&] {
      for (int r = 0; r < world_; ++r) {
        const Shard& s = shards[static_cast<std::size_t>(r)];
        check_nccl(ncclBroadcast(data + s.offset, data + s.offset, static_cast<size_t>(s.count), ncclFloat32, r,
                                 nccl_, comm_stream_),
                   "ncclBroadcast");
      }
    });
    wait_all();
#else
    needs_nccl("all_gather", device);
#endif
  }
  // Each shard reduced to its rank, in place, grouped into one NCCL launch.
  void nccl_reduce_scatter([[maybe_unused]] float* data, [[maybe_unused]] const std::vector<Shard>& shards,
                           Device device) {
#if CUMULUS_WITH_NCCL
    on_nccl_stream(device, [&] {
      for (int r = 0; r < world_; ++r) {
        const Shard& s = shards[static_cast<std::size_t>(r)];
        check_nccl(ncclReduce(data + s.offset, data + s.offset, static_cast<size_t>(s.count), ncclFloat32, ncclSum, r,
                              nccl_, comm_stream_),
                   "ncclReduce");
      }
    });
    wait_all();
#else
    needs_nccl("reduce_scatter_sum", device);
#endif
  }
  // The root receives each rank's shard (point-to-point, grouped into one NCCL launch).
  void nccl_gather_to_root([[maybe_unused]] float* data, [[maybe_unused]] const std::vector<Shard>& shards,
                           Device device) {
#if CUMULUS_WITH_NCCL
    on_nccl_stream(device, [&] {
      const Shard& own = shards[static_cast<std::size_t>(rank_)];
      if (!is_root()) {
        check_nccl(ncclSend(data, static_cast<size_t>(own.count), ncclFloat32, 0, nccl_, comm_stream_), "ncclSend");
        return;
      }
      for (int r = 1; r < world_; ++r) {
        const Shard& s = shards[static_cast<std::size_t>(r)];
        check_nccl(ncclRecv(data + s.offset, static_cast<size_t>(s.count), ncclFloat32, r, nccl_, comm_stream_),
                   "ncclRecv");
      }
    });
    wait_all();
#else
    needs_nccl("gather_to_root", device);
#endif
  }
  [[noreturn]] static void needs_nccl(const char* what, Device device) {
    throw DeviceError(std::string(what) + " on " + device.str() +
                      " memory needs NCCL, and cumulus was built without it (install NCCL with the CUDA toolkit, "
                      "CUMULUS_DIST=ON)");
  }

  void start_nccl([[maybe_unused]] void* data, [[maybe_unused]] int64_t count, [[maybe_unused]] Element type,
                  [[maybe_unused]] Device device) {
#if CUMULUS_WITH_NCCL
    on_nccl_stream(device, [&] {
      check_nccl(ncclAllReduce(data, data, static_cast<size_t>(count), type == Element::f32 ? ncclFloat32 : ncclFloat64,
                               ncclSum, nccl_, comm_stream_),
                 "ncclAllReduce");
    });
#else
    needs_nccl("all_reduce_sum", device);
#endif
  }

#if CUMULUS_WITH_NCCL
  // Queues `launch`'s NCCL calls (one group) on the communication stream after the kernels queued
  // so far on the compute stream (the backward that wrote the data), concurrent with later ones; the
  // compute stream waits for them at wait_all().
  template <typename Launch>
  void on_nccl_stream(Device device, const Launch& launch) {
    init_nccl(device.index());
    CUMULUS_CHECK(device.index() == nccl_device_, DeviceError, "NCCL: this rank's communicator is on cuda:",
                  nccl_device_, ", asked to communicate memory on ", device.str(), " (one GPU per rank)");
    cuda::Context& ctx = cuda::context(device.index());
    cuda::DeviceGuard guard(device.index());
    CUMULUS_CUDA_CHECK(cudaEventRecord(compute_ready_, ctx.stream()));
    CUMULUS_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, compute_ready_, 0));
    // Note [Communication time]: the collective's device time, read later.
    const TimePoint start = TimePoint::now_on(device, comm_stream_);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    launch();
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    add_span(start, TimePoint::now_on(device, comm_stream_));
    nccl_pending_ = true;
  }
  // The communicator of this rank's GPU, created at the first CUDA reduction (every rank makes its
  // first CUDA reduction at the same step, so the id broadcast matches).
  void init_nccl(int device_index) {
    if (nccl_ != nullptr) return;
    ncclUniqueId id;
    if (is_root()) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast of the NCCL id");
    cuda::DeviceGuard guard(device_index);
    check_nccl(ncclCommInitRank(&nccl_, world_, id, rank_), "ncclCommInitRank");
    CUMULUS_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    CUMULUS_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    CUMULUS_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    nccl_device_ = device_index;
  }
  ncclComm_t nccl_ = nullptr;
  int nccl_device_ = -1;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr, comm_done_ = nullptr;
  bool nccl_pending_ = false;
#endif
  std::vector<MPI_Request> requests_;
};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string s(text, static_cast<std::size_t>(length));
  const std::size_t comma = s.find_first_of(",\n");  // "Open MPI v4.1.4, package: ..."
  return s.substr(0, comma);
}

std::shared_ptr<Communicator> make_mpi_communicator() {
  // One communicator per process: MPI can be initialized once.
  static std::once_flag once;
  static std::shared_ptr<Communicator> world;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Only the main thread calls MPI (OpenBLAS's threads never do).
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit(finalize_mpi);
    }
    // Errors come back as codes and become exceptions (check_mpi) instead of ending the job mid-write.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, size = 1;
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
    // The ranks that share this host's memory.
    MPI_Comm host;
    check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host),
              "MPI_Comm_split_type");
    int local_rank = 0, local_size = 1;
    check_mpi(MPI_Comm_rank(host, &local_rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(host, &local_size), "MPI_Comm_size");
    MPI_Comm_free(&host);
    world = std::make_shared<MpiCommunicator>(rank, size, local_rank, local_size);
  });
  return world;
}

}  // namespace cumulus::dist
#endif  // CUMULUS_WITH_MPI
