// keel/host.hpp — the host as a plugin sees it: tensor handles, errors and the guard that turns
// exceptions into statuses, typed config access and the Host wrapper of keel_host_api.
#pragma once

#include <ATen/ATen.h>

#include <keel/keel.h>

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

/// Thrown when a host call already reported its error: the guard must not overwrite it.
class HostReported : public std::exception {
 public:
  explicit HostReported(keel_status code) : code_(code) {}
  /// The status the host returned.
  keel_status code() const noexcept { return code_; }
  const char* what() const noexcept override { return "error reported by the host"; }

 private:
  keel_status code_;
};

/// Throws HostReported when a host call failed.
inline void check(keel_status status) {
  if (status != KEEL_OK) throw HostReported(status);
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

// ------------------------------------------------------------------ the host

/// Typed access to one component's config table; every getter marks its key as read.
class Config {
 public:
  Config(keel_host* host, const keel_config* config) : host_(host), config_(config) {}

  /// The integer at `key`, or `fallback` when absent.
  int64_t integer(const char* key, int64_t fallback) const {
    int64_t out = 0;
    check(host_->api->config_int(host_, config_, key, fallback, &out, nullptr));
    return out;
  }
  /// The number at `key` (integers are accepted), or `fallback` when absent.
  double real(const char* key, double fallback) const {
    double out = 0;
    check(host_->api->config_float(host_, config_, key, fallback, &out, nullptr));
    return out;
  }
  /// The boolean at `key`, or `fallback` when absent.
  bool boolean(const char* key, bool fallback) const {
    int32_t out = 0;
    check(host_->api->config_bool(host_, config_, key, fallback ? 1 : 0, &out, nullptr));
    return out != 0;
  }
  /// The string at `key`, or `fallback` when absent.
  std::string string(const char* key, const char* fallback) const {
    const char* out = nullptr;
    check(host_->api->config_string(host_, config_, key, fallback, &out, nullptr));
    return out != nullptr ? std::string(out) : std::string();
  }
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
    throw HostReported(status == KEEL_OK ? KEEL_ERROR_CONFIG : status);
  }

 private:
  keel_host* host_;
  const keel_config* config_;
};

/// The host as seen from a component: logging, mesh, groups, collectives, metrics.
class Host {
 public:
  explicit Host(keel_host* host) : host_(host) {}

  /// The raw host pointer, for guard() and direct ABI calls.
  keel_host* raw() const { return host_; }
  /// Writes an info line to the host's log.
  void info(const std::string& message) const { host_->api->log(host_, KEEL_LOG_INFO, message.c_str()); }
  /// Writes a warning line to the host's log.
  void warn(const std::string& message) const { host_->api->log(host_, KEEL_LOG_WARN, message.c_str()); }

  /// This rank's mesh coordinates.
  keel_mesh_info mesh() const {
    keel_mesh_info info{};
    info.struct_size = sizeof(info);
    check(host_->api->mesh_info(host_, &info));
    return info;
  }
  /// The mesh group of that kind.
  keel_group* group(keel_group_kind kind) const { return host_->api->group(host_, kind); }
  /// Creates a sub-group; every rank calls it with the same lists. [setup][collective: world]
  keel_group* new_group(const std::vector<int32_t>& world_ranks) const {
    keel_group* out = nullptr;
    check(host_->api->new_group(host_, world_ranks.data(), world_ranks.size(), &out));
    return out;
  }
  /// Number of ranks in `group`.
  int32_t size(const keel_group* group) const { return host_->api->group_size(host_, group); }
  /// This rank's index in `group` (-1 when not a member).
  int32_t rank(const keel_group* group) const { return host_->api->group_rank(host_, group); }

  /// In-place all-reduce, returning once done. [collective: group]
  void all_reduce(keel_group* group, at::Tensor& t, keel_reduce_op op = KEEL_REDUCE_SUM) const {
    check(host_->api->all_reduce(host_, group, handle(t), op, nullptr));
  }
  /// In-place broadcast from group rank `root`. [collective: group]
  void broadcast(keel_group* group, at::Tensor& t, int32_t root) const {
    check(host_->api->broadcast(host_, group, handle(t), root, nullptr));
  }
  /// All-to-all of dim-0 slices with split sizes. [collective: group]
  void all_to_all(keel_group* group, at::Tensor& output, const at::Tensor& input,
                  const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) const {
    check(host_->api->all_to_all(host_, group, handle(output), handle(input), output_splits.data(), input_splits.data(),
                                 nullptr));
  }
  /// Reports a named scalar for this step (read lazily by the host).
  void metric(const char* name, const at::Tensor& value, keel_metric_reduce reduce = KEEL_METRIC_MEAN) const {
    check(host_->api->report_metric(host_, name, handle(value), reduce));
  }

 private:
  keel_host* host_;
};

}  // namespace keel
