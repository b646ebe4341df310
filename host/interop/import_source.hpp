// The host's side of keel_import_source: a model reads an HfCheckpoint through it. What it
// hands out (tensor handles, strings) lives as long as the adapter; a failure is reported to the
// calling component's context with a message naming the file and the value.
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <string>

#include <keel/keel.h>

#include "interop/hf_checkpoint.hpp"

namespace keel {

class HostContext;

class ImportSourceAdapter {
 public:
  /// A source over `checkpoint`; errors go to the component behind `context`.
  ImportSourceAdapter(HfCheckpoint& checkpoint, HostContext& context);
  ImportSourceAdapter(const ImportSourceAdapter&) = delete;
  ImportSourceAdapter& operator=(const ImportSourceAdapter&) = delete;

  /// The C struct handed to the model (its context is this adapter).
  const keel_import_source* raw() const { return &raw_; }

 private:
  static keel_status config_get(void* self, const char* path, int32_t type, void* out, int32_t* found);
  static int32_t has_tensor(void* self, const char* name);
  static keel_status read_tensor(void* self, const char* name, const keel_tensor** out);
  static const char* origin(void* self, const char* name);
  keel_status get_config(const char* path, int32_t type, void* out, int32_t* found);
  keel_status refuse(const std::string& why);

  HfCheckpoint& checkpoint_;
  HostContext* context_;
  std::deque<at::Tensor> handed_;  // node-based: a handle stays valid while later ones are added
  std::deque<std::string> strings_;
  keel_import_source raw_{};
};

}  // namespace keel
