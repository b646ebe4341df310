// Files and renames that survive a crash: the data reach the disk (fsync) before a rename
// publishes them, and the folder holding a rename is synced too.
#pragma once

#include <filesystem>
#include <string>

namespace keel {

/// Makes a rename or a new file in `dir` durable; throws std::runtime_error naming it.
void sync_dir(const std::filesystem::path& dir);

/// Writes `text` to `path` through `path`.partial, synced before the rename into place.
void write_durably(const std::filesystem::path& path, const std::string& text);

}  // namespace keel
