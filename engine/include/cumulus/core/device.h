// Device: where a tensor's memory lives and where its ops run.
#pragma once

#include <cstdint>
#include <string>

namespace cumulus {

enum class DeviceType : uint8_t { cpu, cuda };

class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {}
  static constexpr Device cpu() { return Device(DeviceType::cpu, 0); }
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::cuda, index); }
  // Parses "cpu", "cuda" or "cuda:N"; throws InvalidArgument naming the text otherwise.
  static Device parse(const std::string& text);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::cpu; }
  bool is_cuda() const { return type_ == DeviceType::cuda; }
  std::string str() const;
  // For banners and reports: "cpu", "cuda:0 (NVIDIA H200)".
  std::string describe() const;
  // The hardware alone, for reports: the GPU's name ("NVIDIA H100 80GB HBM3"); on the CPU its model
  // name from /proc/cpuinfo, or "cpu" where that is unreadable.
  std::string hardware_name() const;

  bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }
  bool operator!=(const Device& o) const { return !(*this == o); }

 private:
  DeviceType type_ = DeviceType::cpu;
  int index_ = 0;
};

// Whether this build has the CUDA backend compiled in.
bool cuda_compiled();
// Number of usable CUDA devices: 0 when not compiled, no driver, or no GPU.
int cuda_device_count();
inline bool cuda_available() { return cuda_device_count() > 0; }
// Throws DeviceError unless `device` can be used (CUDA compiled and the index exists).
void check_device_available(const Device& device);
// CUDA kernels launched so far by this process through cumulus (a cuBLAS GEMM counts as one, a
// graph replay as one, kernels recorded into a graph as none); 0 without CUDA. Benchmarks read differences of it.
int64_t cuda_kernel_launches();
// The cuBLASLt epilogues cumulus uses (a Linear's bias in its forward GEMM, its bias gradient in its
// weight-gradient GEMM) and how their calls went so far in this process: `fused` ran the GEMM with
// the epilogue, `declined` ran the unfused kernels instead (more launches) because cuBLASLt
// offered no algorithm (Note [No fused algorithm] in kernels/cuda/gemm.cu). A call recorded into a
// graph counts when recorded, replays do not. 0 without CUDA.
// Launch-count tests read differences of them to know which of the two outcomes each GEMM had.
enum class CudaEpilogue { bias, bias_gradient };
struct CudaEpilogueCalls {
  int64_t fused = 0;
  int64_t declined = 0;
};
CudaEpilogueCalls cuda_epilogue_calls(CudaEpilogue epilogue);
// Times the host has waited for a CUDA device (stream or event synchronizations, copies to host
// memory) through cumulus; 0 without CUDA. A training step should add none.
int64_t host_synchronizations();
// Blocks until all work queued on `device` has finished (no-op on CPU).
void synchronize(const Device& device);

}  // namespace cumulus
