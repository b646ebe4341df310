// Reading the versioned structs of keel.h: a plugin built against an older SDK hands shorter
// structs, a newer one longer; the host reads what both know and nothing beyond struct_size.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace keel {

/// The struct_size a versioned struct declares (its first field).
inline size_t declared_size(const void* source) { return *static_cast<const size_t*>(source); }

/// OBS style: `source` copied into a zeroed T of this host's size, so fields the sender's older
/// SDK lacks read as NULL/0 and nothing beyond its struct_size is read. The caller has checked
/// that struct_size covers the fields it requires.
template <class T>
T copy_versioned(const void* source) {
  T out{};
  std::memcpy(&out, source, std::min(declared_size(source), sizeof(T)));
  const size_t size = sizeof(T);  // struct_size leads every versioned struct (an extension's header too)
  std::memcpy(&out, &size, sizeof(size));
  return out;
}

}  // namespace keel
