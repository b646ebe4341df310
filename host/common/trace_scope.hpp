// A named range of Keel's own work in a profiler trace ("keel::forward", "keel::dp_reduce", …).
// LibTorch's user-scope record function: while no profiler runs it is one check of a global
// flag, so the ranges stay in production code.
#pragma once

#include <ATen/record_function.h>

/// Marks the rest of the enclosing scope as the range `name` (a string literal).
#define KEEL_TRACE_SCOPE(name) RECORD_USER_SCOPE(name)
