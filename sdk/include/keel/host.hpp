// keel/host.hpp — the host as a plugin sees it: tensor handles, errors and the guard that turns
// exceptions into statuses, typed config access and the Host wrapper of keel_host_api.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>
#include <keel/config_keys.hpp>

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace keel {

// ------------------------------------------------------------------ handles <-> tensors

/// The at::Tensor behind a handle (handles are borrowed at::Tensor pointers).
inline at::Tensor& tensor(keel_tensor* handle) { return *reinterpret_cast<at::Tensor*>(handle); }
/// The at::Tensor behind a const handle.
inline const at::Tensor& tensor(const keel_tensor* handle) { return *reinterpret_cast<const at::Tensor*>(handle); }
/// A borrowed handle on `t`; valid while `t` lives.
inline keel_tensor* handle(at::Tensor& t) { return reinterpret_cast<keel_tensor*>(&t); }
/// A borrowed const handle on `t`; valid while `t` lives.
inline const keel_tensor* handle(const at::Tensor& t) { return reinterpret_cast<const keel_tensor*>(&t); }

// ------------------------------------------------------------------ errors

/// An error with a status code; the message goes to the host's set_error.
class Error : public std::exception {
 public:
  Error(keel_status code, std::string message) : code_(code), message_(std::move(message)) {}
  /// The status the failing entry point returns.
  keel_status code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  keel_status code_;
  std::string message_;
};

/// The message of the last failed host call on this thread (keel_host_api.last_error), or
/// "" when there is none or the host predates SDK 1.2. [any-thread]
inline std::string last_error(keel_host* host) {
  if (host == nullptr || host->api == nullptr || host->api->struct_size < KEEL_HOST_API_SIZE_1_2 ||
      host->api->last_error == nullptr)
    return {};
  const char* message = host->api->last_error(host);
  return message != nullptr ? std::string(message) : std::string();
}

/// Thrown when a host call failed: the host already recorded the error, so the guard returns
/// the code without overwriting it. what() is the host's message when the host can tell it.
class HostReported : public std::exception {
 public:
  explicit HostReported(keel_status code, std::string message = {})
      : code_(code), message_(message.empty() ? "error reported by the host" : std::move(message)) {}
  /// The status the host returned.
  keel_status code() const noexcept { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  keel_status code_;
  std::string message_;
};

/// Throws HostReported, carrying the host's message when `host` is given, if a call failed.
inline void check(keel_status status, keel_host* host = nullptr) {
  if (status != KEEL_OK) throw HostReported(status, last_error(host));
}

/// Runs `body`, turning keel::Error, c10::Error and std::exception into a status and a message.
template <class Body>
keel_status guard(keel_host* host, Body&& body) noexcept {
  auto report = [host](keel_status code, const char* message) {
    if (host != nullptr && host->api != nullptr) host->api->set_error(host, code, message);
    return code;
  };
  try {
    body();
    return KEEL_OK;
  } catch (const HostReported& e) {
    return e.code();
  } catch (const Error& e) {
    return report(e.code(), e.what());
  } catch (const c10::Error& e) {
    return report(KEEL_ERROR_RUNTIME, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report(KEEL_ERROR_INTERNAL, e.what());
  } catch (...) {
    return report(KEEL_ERROR_INTERNAL, "unknown exception");
  }
}

// ------------------------------------------------------------------ config

/// Typed access to one component's config table; every getter marks its key as read. Every
/// function is [train-thread].
class Config {
 public:
  Config(keel_host* host, const keel_config* config) : host_(host), config_(config) {}

  /// The integer at `key`, or `fallback` when absent.
  int64_t integer(const char* key, int64_t fallback) const {
    int64_t out = 0;
    check(host_->api->config_int(host_, config_, key, fallback, &out, nullptr), host_);
    return out;
  }
  /// The number at `key` (integers are accepted), or `fallback` when absent.
  double real(const char* key, double fallback) const {
    double out = 0;
    check(host_->api->config_float(host_, config_, key, fallback, &out, nullptr), host_);
    return out;
  }
  /// The boolean at `key`, or `fallback` when absent.
  bool boolean(const char* key, bool fallback) const {
    int32_t out = 0;
    check(host_->api->config_bool(host_, config_, key, fallback ? 1 : 0, &out, nullptr), host_);
    return out != 0;
  }
  /// The string at `key`, or `fallback` when absent.
  std::string string(const char* key, const char* fallback) const {
    const char* out = nullptr;
    check(host_->api->config_string(host_, config_, key, fallback, &out, nullptr), host_);
    return out != nullptr ? std::string(out) : std::string();
  }
  /// The value of a declared key, or its default when absent.
  int64_t get(const Key<int64_t>& key) const { return integer(key.name, key.fallback); }
  /// The value of a declared key, or its default when absent.
  double get(const Key<double>& key) const { return real(key.name, key.fallback); }
  /// The value of a declared key, or its default when absent.
  bool get(const Key<bool>& key) const { return boolean(key.name, key.fallback); }
  /// The value of a declared key, or its default when absent.
  std::string get(const Key<std::string>& key) const { return string(key.name, key.fallback.c_str()); }
  /// Overwrites `value` with the key's value when present (the current value is the default).
  void update(const char* key, int64_t& value) const { value = integer(key, value); }
  /// Overwrites `value` with the key's number when present.
  void update(const char* key, double& value) const { value = real(key, value); }
  /// Overwrites `value` with the key's boolean when present.
  void update(const char* key, bool& value) const { value = boolean(key, value); }
  /// Overwrites `value` with the key's string when present.
  void update(const char* key, std::string& value) const { value = string(key, value.c_str()); }
  /// Reports that `key` holds an impossible value and throws; the host adds file and line.
  [[noreturn]] void invalid(const char* key, const std::string& why) const {
    keel_status status = host_->api->config_invalid(host_, config_, key, why.c_str());
    throw HostReported(status == KEEL_OK ? KEEL_ERROR_CONFIG : status, last_error(host_));
  }

 private:
  keel_host* host_;
  const keel_config* config_;
};

// ------------------------------------------------------------------ the host

/// An in-flight collective (a keel_work): wait() waits for it and throws on failure; the
/// destructor waits for one not yet waited for (a failure there is logged, since a destructor
/// cannot throw).
class WorkHandle {
 public:
  WorkHandle() = default;
  /// Takes ownership of `work` (NULL: already complete).
  WorkHandle(keel_host* host, keel_work* work) : host_(host), work_(work) {}
  WorkHandle(WorkHandle&& other) noexcept : host_(other.host_), work_(std::exchange(other.work_, nullptr)) {}
  WorkHandle& operator=(WorkHandle&& other) noexcept {
    if (this != &other) {
      finish();
      host_ = other.host_;
      work_ = std::exchange(other.work_, nullptr);
    }
    return *this;
  }
  WorkHandle(const WorkHandle&) = delete;
  WorkHandle& operator=(const WorkHandle&) = delete;
  ~WorkHandle() { finish(); }

  /// Waits for the collective (no-op when done or already waited for). [any-thread]
  void wait() {
    keel_work* work = std::exchange(work_, nullptr);
    if (work != nullptr) check(host_->api->wait(host_, work), host_);
  }
  /// Whether the collective still awaits wait().
  bool pending() const { return work_ != nullptr; }

 private:
  void finish() noexcept {
    keel_work* work = std::exchange(work_, nullptr);
    if (work == nullptr || host_->api->wait(host_, work) == KEEL_OK) return;
    const std::string message = "a collective nobody waited for failed: " + last_error(host_);
    host_->api->log(host_, KEEL_LOG_ERROR, message.c_str());
  }

  keel_host* host_ = nullptr;
  keel_work* work_ = nullptr;
};

/// The host as seen from a component: every keel_host_api call, typed. A failed call throws
/// HostReported with the host's message. Thread tags as in keel.h.
class Host {
 public:
  explicit Host(keel_host* host) : host_(host) {}

  /// The raw host pointer, for guard() and direct ABI calls.
  keel_host* raw() const { return host_; }

  /// Writes a log line at `level`. [any-thread]
  void log(keel_log_level level, const std::string& message) const { host_->api->log(host_, level, message.c_str()); }
  /// Writes a debug line. [any-thread]
  void debug(const std::string& message) const { log(KEEL_LOG_DEBUG, message); }
  /// Writes an info line. [any-thread]
  void info(const std::string& message) const { log(KEEL_LOG_INFO, message); }
  /// Writes a warning line. [any-thread]
  void warn(const std::string& message) const { log(KEEL_LOG_WARN, message); }
  /// Writes an error line (a log line only: failing a call is throwing keel::Error). [any-thread]
  void error(const std::string& message) const { log(KEEL_LOG_ERROR, message); }
  /// The message of the last failed host call on this thread, "" when none. [any-thread]
  std::string last_error() const { return keel::last_error(host_); }

  /// This rank's mesh coordinates. [any-thread]
  keel_mesh_info mesh() const {
    keel_mesh_info info{};
    info.struct_size = sizeof(info);
    check(host_->api->mesh_info(host_, &info), host_);
    return info;
  }
  /// The mesh group of that kind; NULL before build_part (see keel.h). [any-thread]
  keel_group* group(keel_group_kind kind) const { return host_->api->group(host_, kind); }
  /// Creates a sub-group of world ranks; every rank calls it with the same lists, non-members
  /// get NULL. [setup][collective: world][train-thread]
  keel_group* new_group(const std::vector<int32_t>& world_ranks) const {
    keel_group* out = nullptr;
    check(host_->api->new_group(host_, world_ranks.data(), world_ranks.size(), &out), host_);
    return out;
  }
  /// Number of ranks in `group`. [any-thread]
  int32_t size(const keel_group* group) const { return host_->api->group_size(host_, group); }
  /// This rank's index in `group` (-1 when not a member). [any-thread]
  int32_t rank(const keel_group* group) const { return host_->api->group_rank(host_, group); }

  // Collectives: each is [collective: group][any-thread]. The plain form returns once the result
  // is ready on the tensor's stream; the *_async form returns a WorkHandle to wait on, and the tensors
  // must stay alive and untouched until then.

  /// In-place reduction of `t` over the group.
  void all_reduce(keel_group* group, at::Tensor& t, keel_reduce_op op = KEEL_REDUCE_SUM) const {
    check(host_->api->all_reduce(host_, group, handle(t), op, nullptr), host_);
  }
  /// all_reduce, asynchronous.
  [[nodiscard]] WorkHandle all_reduce_async(keel_group* group, at::Tensor& t,
                                            keel_reduce_op op = KEEL_REDUCE_SUM) const {
    return start([&](keel_work** w) { return host_->api->all_reduce(host_, group, handle(t), op, w); });
  }
  /// In-place broadcast of `t` from group rank `root`.
  void broadcast(keel_group* group, at::Tensor& t, int32_t root) const {
    check(host_->api->broadcast(host_, group, handle(t), root, nullptr), host_);
  }
  /// broadcast, asynchronous.
  [[nodiscard]] WorkHandle broadcast_async(keel_group* group, at::Tensor& t, int32_t root) const {
    return start([&](keel_work** w) { return host_->api->broadcast(host_, group, handle(t), root, w); });
  }
  /// Gathers every member's `input` into `output` (group size x input along dim 0).
  void all_gather(keel_group* group, at::Tensor& output, const at::Tensor& input) const {
    check(host_->api->all_gather(host_, group, handle(output), handle(input), nullptr), host_);
  }
  /// all_gather, asynchronous.
  [[nodiscard]] WorkHandle all_gather_async(keel_group* group, at::Tensor& output, const at::Tensor& input) const {
    return start([&](keel_work** w) { return host_->api->all_gather(host_, group, handle(output), handle(input), w); });
  }
  /// Reduces `input` (group size x output along dim 0) and scatters the slices to `output`.
  void reduce_scatter(keel_group* group, at::Tensor& output, const at::Tensor& input,
                      keel_reduce_op op = KEEL_REDUCE_SUM) const {
    check(host_->api->reduce_scatter(host_, group, handle(output), handle(input), op, nullptr), host_);
  }
  /// reduce_scatter, asynchronous.
  [[nodiscard]] WorkHandle reduce_scatter_async(keel_group* group, at::Tensor& output, const at::Tensor& input,
                                                keel_reduce_op op = KEEL_REDUCE_SUM) const {
    return start(
        [&](keel_work** w) { return host_->api->reduce_scatter(host_, group, handle(output), handle(input), op, w); });
  }
  /// All-to-all of dim-0 slices: `input_splits[i]` rows go to member i, `output_splits[i]`
  /// rows arrive from it (one entry per member in each).
  void all_to_all(keel_group* group, at::Tensor& output, const at::Tensor& input,
                  const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) const {
    check(host_->api->all_to_all(host_, group, handle(output), handle(input), output_splits.data(), input_splits.data(),
                                 nullptr),
          host_);
  }
  /// all_to_all, asynchronous.
  [[nodiscard]] WorkHandle all_to_all_async(keel_group* group, at::Tensor& output, const at::Tensor& input,
                                            const std::vector<int64_t>& output_splits,
                                            const std::vector<int64_t>& input_splits) const {
    return start([&](keel_work** w) {
      return host_->api->all_to_all(host_, group, handle(output), handle(input), output_splits.data(),
                                    input_splits.data(), w);
    });
  }
  /// Sends `t` to group rank `peer`. [collective: peer pair]
  void send(keel_group* group, const at::Tensor& t, int32_t peer, int32_t tag = 0) const {
    check(host_->api->send(host_, group, handle(t), peer, tag, nullptr), host_);
  }
  /// send, asynchronous.
  [[nodiscard]] WorkHandle send_async(keel_group* group, const at::Tensor& t, int32_t peer, int32_t tag = 0) const {
    return start([&](keel_work** w) { return host_->api->send(host_, group, handle(t), peer, tag, w); });
  }
  /// Receives into `t` from group rank `peer`. [collective: peer pair]
  void recv(keel_group* group, at::Tensor& t, int32_t peer, int32_t tag = 0) const {
    check(host_->api->recv(host_, group, handle(t), peer, tag, nullptr), host_);
  }
  /// recv, asynchronous.
  [[nodiscard]] WorkHandle recv_async(keel_group* group, at::Tensor& t, int32_t peer, int32_t tag = 0) const {
    return start([&](keel_work** w) { return host_->api->recv(host_, group, handle(t), peer, tag, w); });
  }

  /// Reports a named 0-dim scalar for this step (read lazily by the host). [any-thread]
  void metric(const char* name, const at::Tensor& value, keel_metric_reduce reduce = KEEL_METRIC_MEAN) const {
    check(host_->api->report_metric(host_, name, handle(value), reduce), host_);
  }
  /// Reports a ratio for this step: the host shows the sum of the step's numerators (all
  /// ranks) over the sum of its denominators, e.g. a loss weighted by tokens. A host before
  /// ABI 1.5 gets numerator / denominator as a MEAN metric instead (a mean of the ratios).
  /// [any-thread]
  void metric_ratio(const char* name, const at::Tensor& numerator, const at::Tensor& denominator) const {
    if (host_->api->struct_size >= KEEL_HOST_API_SIZE_1_5) {
      check(host_->api->report_metric_ratio(host_, name, handle(numerator), handle(denominator)), host_);
      return;
    }
    metric(name, numerator.detach() / denominator.detach(), KEEL_METRIC_MEAN);
  }

 private:
  template <class Call>
  WorkHandle start(Call&& call) const {
    keel_work* work = nullptr;
    check(call(&work), host_);
    return WorkHandle(host_, work);
  }

  keel_host* host_;
};

}  // namespace keel
