// keel-train verify: the user's own job, a few steps in their layout and in a reference layout
// (one rank, the same global batch, one microbatch), compared step by step and parameter by
// parameter under the error model the test suite uses (verify/error_model.hpp).
#pragma once

namespace keel {

/// Runs `keel-train verify` with its arguments (argv[0] = "verify"); `self` is keel-train's
/// own executable, started for every rank. Returns 0 on PASS, 1 on FAIL or a failed run, 2 on
/// bad input.
int verify_main(int argc, char** argv, const char* self);

}  // namespace keel
