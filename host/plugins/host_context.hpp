// The keel_host a component receives: the host API function table bound to one component
// instance, so that its log lines and errors carry its name.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <keel/keel.h>

namespace keel {

class ComponentConfig;
class Mesh;
class StepMetrics;

/// What the host API reaches: the mesh and the step's metrics.
struct HostServices {
  Mesh* mesh = nullptr;
  StepMetrics* metrics = nullptr;
};

/// One component's host context. Lives as long as the component. Errors are recorded per
/// thread: autograd may run a plugin's backward, and the host calls in it, on its own threads
/// (keel.h's [any-thread]), so one thread's error never lands in another's call.
class HostContext {
 public:
  /// `label` names the component in logs and errors ("model llama3").
  HostContext(std::string label, HostServices services);
  HostContext(const HostContext&) = delete;
  HostContext& operator=(const HostContext&) = delete;

  /// The pointer handed to the component.
  keel_host* raw() { return &handle_.base; }
  /// The component's label.
  const std::string& label() const { return label_; }
  /// Throws when `status` is not OK: an InputError for config/argument errors, otherwise a
  /// std::runtime_error, with the message the component reported on this thread and `call`
  /// named. Clears this thread's error either way.
  void check(keel_status status, const char* call);

  /// The context behind a keel_host pointer.
  static HostContext& from(keel_host* host);
  /// The opaque handle of a component's config.
  static const keel_config* config_handle(const ComponentConfig& config);

 private:
  friend struct HostApi;
  struct Handle {
    keel_host base;
    HostContext* self;
  };
  struct ErrorSlot {
    keel_status code = KEEL_OK;
    std::string message;
  };
  void record_error(keel_status code, const char* message);
  ErrorSlot take_error();
  const char* last_error();

  Handle handle_;
  std::string label_;
  HostServices services_;
  std::mutex errors_mutex_;
  std::map<std::thread::id, ErrorSlot> errors_;  ///< node-based: a message's c_str() stays put
};

/// The function table every HostContext points to.
const keel_host_api& host_api();

}  // namespace keel
