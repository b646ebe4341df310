#include "train/data_fault.hpp"

#include "common/text.hpp"

namespace keel {

Batch agreed_batch(Group& world, int rank, const std::function<Batch()>& read, const std::string& what) {
  Batch batch;
  std::string failure;
  try {
    batch = read();
  } catch (const InputError& e) {
    failure = e.what();
  }
  if (world.size() == 1) {
    if (!failure.empty()) throw DataFault(failure);
    return batch;
  }
  // The highest failing rank + 1, or 0: one small reduction per read, beside a step's work.
  at::Tensor failed = at::full({}, failure.empty() ? 0.0 : static_cast<double>(rank) + 1, at::kDouble);
  world.all_reduce(failed, KEEL_REDUCE_MAX);
  const auto failing = static_cast<int>(failed.item<double>()) - 1;
  if (failing < 0) return batch;
  if (!failure.empty()) throw DataFault(failure);
  throw DataFault(cat("rank ", failing, " could not read its batch from ", what, " (its message says why)"));
}

}  // namespace keel
