// The device a rank trains on, reached only through LibTorch's own APIs.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace keel {

/// Whether this LibTorch sees a CUDA device.
bool cuda_available();
/// "cpu" -> CPU; "cuda" -> cuda:local_rank.
at::Device resolve_device(const std::string& kind, int local_rank);
/// Peak memory of this process on `device` so far: the CUDA caching allocator's peak, or the
/// process's peak resident set on CPU.
double peak_memory_bytes(const at::Device& device);
/// Starts peak_memory_bytes() afresh from what `device` holds now (CUDA only; a no-op on CPU).
void reset_peak_memory(const at::Device& device);
/// Bytes the CUDA caching allocator has handed out on `device` now; 0 on CPU.
double allocated_memory_bytes(const at::Device& device);
/// Total memory of the first CUDA device this process sees, or nothing without one.
std::optional<double> cuda_device_memory_bytes();
/// Waits for queued work on `device` (timing only; never inside a step).
void synchronize(const at::Device& device);

}  // namespace keel
