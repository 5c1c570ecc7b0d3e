// Note [Collective time model]
// The planner predicts a step from probes that run in one process (Note [Plan levers]: its ZeRO
// probes reduce over a world whose collectives move nothing), so what the ranks' collectives cost
// is measured once, on the communicator that will train, before rank 0 plans. Each of the three
// collectives a step makes (all_reduce_sum, reduce_scatter_sum, all_gather) is timed at a handful
// of array sizes from 1 KiB to the whole gradient (collective_probe_sizes: the bucket, which every
// gradient reduction is cut into, lies inside), each call behind a barrier so that a rank's clock
// measures the collective rather than a wait for a late rank, and waited for on the device (NCCL
// is stream-ordered). The median of a few calls per size, as for the micro-batch probes (Note
// [Predicting time]): one call slowed by another process moves nothing. Every rank measures and
// the medians are averaged over the ranks, so every rank holds the same lines.
//
// A line, latency + bytes x seconds per byte, because that is what a collective of one algorithm
// costs (Hockney's model): a fixed part for the synchronization and each message's start, and a
// part that moves and sums the bytes. Transports switch algorithms at size thresholds, so the line
// is an average over the measured range; it is fitted on relative residuals (as the micro-batch
// line is) so the 1 KiB size pins the latency that the small sums of a step (16 bytes) and small
// buckets pay, and the large sizes the bandwidth. Neither is ever negative. The measurement costs
// sizes x 3 kinds x (repeats + 1) collectives, 90 by default, of which 18 move the whole gradient,
// once per run, before planning (a stage-2 step of 4 micro-batches moves it 5 times).
#include "cumulus/dist/collective_times.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cumulus/core/error.h"
#include "cumulus/memory/allocator.h"
#include "cumulus/memory/category.h"
#include "cumulus/tensor/tensor.h"
#include "engine/tensor/host_reads.h"

namespace cumulus::dist {

namespace {

enum class Kind { all_reduce, reduce_scatter, all_gather };
constexpr Kind kKinds[] = {Kind::all_reduce, Kind::reduce_scatter, Kind::all_gather};
constexpr int64_t kAlignBytes = 256;  // 64 f32 elements: shard_layout's alignment

int64_t round_up(int64_t bytes) {
  return std::max<int64_t>(kAlignBytes, (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes);
}

// Zeros to send (sums of zeros stay zeros), outside any budget: on the CPU plain host memory, which
// no allocator counts; on a GPU a block with the allocator's limit lifted, its cache emptied after.
class ProbeArray {
 public:
  ProbeArray(int64_t count, Device device) : device_(device) {
    if (device.is_cpu()) {
      host_.assign(static_cast<std::size_t>(count), 0.0f);
      return;
    }
    const MemoryLimitScope unlimited(allocator_for(device), 0);
    const MemoryCategoryScope scope(MemoryCategory::other);
    tensor_ = Tensor::zeros(Shape{count}, DType::f32, device);
  }
  ~ProbeArray() {
    if (!tensor_.defined()) return;
    tensor_ = Tensor();
    allocator_for(device_).empty_cache();
  }
  ProbeArray(const ProbeArray&) = delete;
  ProbeArray& operator=(const ProbeArray&) = delete;
  float* data() { return tensor_.defined() ? tensor_.data<float>() : host_.data(); }

 private:
  Device device_;
  std::vector<float> host_;
  Tensor tensor_;
};

// One call of `kind` on the first `bytes` of `data`, started together on every rank and finished
// on the device: its seconds on this rank's clock.
double timed_call(Communicator& comm, Kind kind, ProbeArray& data, int64_t bytes, Device device) {
  const int64_t count = bytes / 4;
  float* values = data.data();
  const std::vector<Shard> shards = shard_layout(count, comm.world_size());
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  if (kind == Kind::all_reduce) comm.all_reduce_sum(values, count, Element::f32, device);
  else if (kind == Kind::reduce_scatter) comm.reduce_scatter_sum(values, shards, device);
  else comm.all_gather(values, shards, device);
  comm.wait_all();
  float first = 0;
  read_to_host(device, {{&first, values, sizeof first}});  // waits for the device's queue
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "31.2 us + 0.52 ms/MiB".
std::string line_text(const CollectiveLine& line) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3g us + %.3g ms/MiB", line.latency_seconds * 1e6,
                line.seconds_per_byte * 1e3 * (1 << 20));
  return text;
}

}  // namespace

std::vector<int64_t> collective_probe_sizes(int64_t bucket_bytes, int64_t gradient_bytes) {
  CUMULUS_CHECK(bucket_bytes > 0 && gradient_bytes > 0, InvalidArgument, "collective_probe_sizes: bucket ",
                bucket_bytes, " and gradient ", gradient_bytes, " bytes must be > 0");
  const int64_t bucket = std::min(bucket_bytes, gradient_bytes);
  const double middle = std::sqrt(static_cast<double>(bucket) * static_cast<double>(gradient_bytes));
  std::vector<int64_t> sizes = {1024, bucket / 4, bucket, static_cast<int64_t>(middle), gradient_bytes};
  for (int64_t& s : sizes) s = round_up(s);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

CollectiveLine fit_collective_line(const std::vector<std::pair<int64_t, double>>& points) {
  CollectiveLine line;
  // Weighted by 1/seconds^2 (relative residuals): the sizes span a thousandfold.
  const auto weight = [](double seconds) { return seconds > 0 ? 1.0 / (seconds * seconds) : 1.0; };
  double sw = 0, sx = 0, sy = 0, sxx0 = 0, sxy0 = 0;
  for (const auto& [bytes, seconds] : points) {
    const double x = static_cast<double>(bytes), w = weight(seconds);
    sw += w, sx += w * x, sy += w * seconds, sxx0 += w * x * x, sxy0 += w * x * seconds;
  }
  if (points.empty()) return line;
  const double mx = sx / sw, my = sy / sw;
  double sxx = 0, sxy = 0;
  for (const auto& [bytes, seconds] : points) {
    const double dx = static_cast<double>(bytes) - mx, w = weight(seconds);
    sxx += w * dx * dx, sxy += w * dx * (seconds - my);
  }
  line.seconds_per_byte = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
  line.latency_seconds = my - line.seconds_per_byte * mx;
  if (sxx <= 0 || line.latency_seconds < 0) {  // one size, or a negative latency: through the origin
    line.latency_seconds = 0;
    line.seconds_per_byte = sxx0 > 0 ? std::max(0.0, sxy0 / sxx0) : 0.0;
  }
  return line;
}

std::string CollectiveTimes::text() const {
  if (world_size <= 1) return "not measured (one rank)";
  return "all-reduce " + line_text(all_reduce) + ", reduce-scatter " + line_text(reduce_scatter) + ", all-gather " +
         line_text(all_gather) + " (" + std::to_string(world_size) + " ranks, " + std::to_string(sizes) + " sizes)";
}

CollectiveTimes measure_collective_times(Communicator& comm, const std::vector<int64_t>& sizes_bytes, Device device,
                                         int repeats) {
  CUMULUS_CHECK(repeats >= 1 && !sizes_bytes.empty(), InvalidArgument,
                "measure_collective_times: needs sizes and repeats >= 1, got ", sizes_bytes.size(), " sizes and ",
                repeats, " repeats");
  for (int64_t s : sizes_bytes)
    CUMULUS_CHECK(s > 0 && s % kAlignBytes == 0, InvalidArgument, "measure_collective_times: size ", s,
                  " bytes is not a positive multiple of ", kAlignBytes);
  if (comm.world_size() == 1 || comm.backend() == "alone") return CollectiveTimes{};
  const Communicator::StatsUnchanged unchanged(comm);
  ProbeArray data(*std::max_element(sizes_bytes.begin(), sizes_bytes.end()) / 4, device);
  std::vector<double> medians;  // kind-major, then size: this rank's, then the ranks' mean
  for (Kind kind : kKinds)
    for (int64_t bytes : sizes_bytes) {
      std::vector<double> seconds;
      timed_call(comm, kind, data, bytes, device);  // untimed: first-call setup (NCCL's, MPI's buffers)
      for (int r = 0; r < repeats; ++r) seconds.push_back(timed_call(comm, kind, data, bytes, device));
      medians.push_back(median(seconds));
    }
  comm.all_reduce_sum(medians.data(), static_cast<int64_t>(medians.size()), Element::f64, Device::cpu());
  CollectiveTimes t;
  t.world_size = comm.world_size();
  t.sizes = static_cast<int>(sizes_bytes.size());
  CollectiveLine* lines[] = {&t.all_reduce, &t.reduce_scatter, &t.all_gather};
  for (std::size_t k = 0; k < 3; ++k) {
    std::vector<std::pair<int64_t, double>> points;
    for (std::size_t i = 0; i < sizes_bytes.size(); ++i)
      points.emplace_back(sizes_bytes[i], medians[k * sizes_bytes.size() + i] / comm.world_size());
    *lines[k] = fit_collective_line(points);
  }
  return t;
}

CollectiveTimes measure_collective_times(Communicator& comm, const nn::FlatParameters& flat, int64_t bucket_bytes) {
  const int64_t gradient_bytes = flat.size() * static_cast<int64_t>(sizeof(float));
  return measure_collective_times(comm, collective_probe_sizes(bucket_bytes, gradient_bytes), flat.device());
}

}  // namespace cumulus::dist
