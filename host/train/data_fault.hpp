// A batch that one rank cannot read (its token file truncated or rewritten under the job, a bad
// token) must stop every rank at the same step, with a message, never a hang in the next
// collective: each read is followed by the world's agreement on whether every rank succeeded.
#pragma once

#include <functional>
#include <string>

#include "common/error.hpp"
#include "data/batch_stream.hpp"
#include "mesh/group.hpp"

namespace keel {

/// A batch read that failed on some rank, thrown on every rank at the same call.
class DataFault : public InputError {
 public:
  using InputError::InputError;
};

/// Runs `read` on every rank of `world`; when it throws InputError on any rank, every rank
/// throws DataFault: the failing rank with its own message, the others naming that rank and
/// `what` (the data the batch was read from). [collective: world]
Batch agreed_batch(Group& world, int rank, const std::function<Batch()>& read, const std::string& what);

}  // namespace keel
