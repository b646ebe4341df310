// The replica guard: every physical copy of every logical parameter — a model's REPLICA
// copies on other stages, the data-parallel copies of dense parameters, the edp copies of an
// expert shard — must hold the same bits. A difference means the copies drifted (a missing
// gradient finalisation, a clipper that scaled copies differently, a broken load), and the job
// stops naming the parameter and the ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/group.hpp"
#include "plugins/components.hpp"

namespace keel {

/// Compares the xxh64 of every copy of every parameter across the world; throws
/// std::runtime_error naming the FQN (and shard) and which ranks hold which bits, on every rank.
/// Returns the number of parameters (shards) checked. [collective: world]
size_t check_replicas(const std::vector<ParamRef>& params, Group& world, int64_t step);

/// Fault injection for tests of the guard: adds 1 to the first element of every REPLICA
/// parameter this rank holds; returns how many were changed.
size_t perturb_replicas(const std::vector<ParamRef>& params);

}  // namespace keel
