#include "device/device.hpp"

#include <sys/resource.h>

#include <string>

#include "common/error.hpp"
#include "common/text.hpp"

#ifdef KEEL_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace keel {

bool cuda_available() {
#ifdef KEEL_WITH_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

at::Device resolve_device(const std::string& kind, int local_rank) {
  if (kind != "cuda") return at::Device(at::kCPU);
#ifdef KEEL_WITH_CUDA
  const int count = c10::cuda::device_count();
  if (local_rank >= count)
    throw InputError(cat("LOCAL_RANK=", local_rank, " but this node has ", count,
                         " CUDA device(s): start at most one rank per GPU"));
  // The current device too: streams, graphs and NCCL communicators follow it.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
#endif
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

double peak_memory_bytes(const at::Device& device) {
#ifdef KEEL_WITH_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }
#endif
  (void)device;
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

void reset_peak_memory(const at::Device& device) {
#ifdef KEEL_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
  (void)device;
}

double allocated_memory_bytes(const at::Device& device) {
#ifdef KEEL_WITH_CUDA
  if (device.is_cuda())
    return static_cast<double>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current);
#endif
  (void)device;
  return 0;
}

std::optional<double> cuda_device_memory_bytes() {
#ifdef KEEL_WITH_CUDA
  if (c10::cuda::device_count() > 0) return static_cast<double>(at::cuda::getDeviceProperties(0)->totalGlobalMem);
#endif
  return std::nullopt;
}

void synchronize(const at::Device& device) {
#ifdef KEEL_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

}  // namespace keel
