// The names of the training state's checkpoint entries, shared by what saves them and what
// loads them.
#pragma once

#include <string>

namespace keel::state_keys {

inline const std::string model = "model.";                  ///< + FQN: parameters, persistent buffers
inline const std::string exp_avg = "optim.exp_avg.";        ///< + FQN: AdamW's first moment
inline const std::string exp_avg_sq = "optim.exp_avg_sq.";  ///< + FQN: AdamW's second moment
inline const std::string step = "optim.step.";              ///< + FQN: AdamW's step count
inline const std::string clipper = "clipper.";              ///< + component "." tensor name
/// Rank `rank`'s CPU generator.
inline std::string rng(int rank) { return "rng.cpu.rank" + std::to_string(rank); }

}  // namespace keel::state_keys
