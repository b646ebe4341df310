#include "plugins/host_context.hpp"

#include <keel/keel.hpp>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <stdexcept>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/text.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/component_config.hpp"

namespace keel {

HostContext::HostContext(std::string label, HostServices services)
    : handle_{{sizeof(keel_host), &host_api()}, this}, label_(std::move(label)), services_(services) {}

HostContext& HostContext::from(keel_host* host) { return *reinterpret_cast<Handle*>(host)->self; }

const keel_config* HostContext::config_handle(const ComponentConfig& config) {
  return reinterpret_cast<const keel_config*>(&config);
}

void HostContext::record_error(keel_status code, const char* message) {
  std::lock_guard<std::mutex> lock(errors_mutex_);
  ErrorSlot& slot = errors_[std::this_thread::get_id()];
  slot.code = code;
  slot.message = message != nullptr ? message : "";
}

HostContext::ErrorSlot HostContext::take_error() {
  std::lock_guard<std::mutex> lock(errors_mutex_);
  auto it = errors_.find(std::this_thread::get_id());
  if (it == errors_.end()) return {};
  ErrorSlot slot = std::move(it->second);
  errors_.erase(it);
  return slot;
}

const char* HostContext::last_error() {
  std::lock_guard<std::mutex> lock(errors_mutex_);
  auto it = errors_.find(std::this_thread::get_id());
  return it == errors_.end() || it->second.code == KEEL_OK ? nullptr : it->second.message.c_str();
}

void HostContext::check(keel_status status, const char* call) {
  ErrorSlot error = take_error();
  if (status == KEEL_OK) return;
  std::string message =
      error.message.empty() ? cat("returned status ", status, " without a message") : std::move(error.message);
  std::string text = cat(label_, ": ", call, " failed: ", message);
  if (status == KEEL_ERROR_CONFIG) throw InputError(cat(label_, ": ", message));
  if (status == KEEL_ERROR_INVALID_ARGUMENT) throw InputError(text);
  throw std::runtime_error(text);
}

// The C entry points. Each converts host exceptions into a status and a recorded message, so
// nothing unwinds through plugin frames.
struct HostApi {
  static HostContext& ctx(keel_host* host) { return HostContext::from(host); }

  template <class Body>
  static keel_status run(keel_host* host, keel_status failure, Body&& body) noexcept {
    try {
      body();
      return KEEL_OK;
    } catch (const InputError& e) {
      set_error(host, KEEL_ERROR_CONFIG, e.what());
      return KEEL_ERROR_CONFIG;
    } catch (const PluginContractError& e) {
      set_error(host, KEEL_ERROR_INTERNAL, e.what());
      return KEEL_ERROR_INTERNAL;
    } catch (const std::invalid_argument& e) {
      set_error(host, KEEL_ERROR_INVALID_ARGUMENT, e.what());
      return KEEL_ERROR_INVALID_ARGUMENT;
    } catch (const c10::Error& e) {
      set_error(host, failure, e.what_without_backtrace());
      return failure;
    } catch (const std::exception& e) {
      set_error(host, failure, e.what());
      return failure;
    }
  }

  static Group& group_of(keel_group* group) {
    if (group == nullptr) throw std::invalid_argument("group is NULL (this rank is not a member?)");
    return *reinterpret_cast<Group*>(group);
  }
  // The component's table, once the read of `key` with getter `type` and `fallback` is checked
  // against what the component declares.
  static const ConfigSection& section(const keel_config* config, const char* key, keel_config_type type,
                                      const ConfigValue& fallback) {
    if (config == nullptr) throw std::invalid_argument("config is NULL");
    if (key == nullptr) throw std::invalid_argument("config key is NULL");
    const auto& component = *reinterpret_cast<const ComponentConfig*>(config);
    component.check_read(key, type, fallback);
    return component.section();
  }
  static void no_work(keel_work** work) {
    if (work != nullptr) *work = nullptr;
  }
  // An asynchronous operation: handed out when the caller asked for a handle, else waited for.
  static void finish(std::unique_ptr<Work> pending, keel_work** work) {
    if (work != nullptr) {
      *work = reinterpret_cast<keel_work*>(pending.release());  // NULL when already complete
      return;
    }
    if (pending) pending->wait();
  }

  static void log(keel_host* host, keel_log_level level, const char* message) {
    LogLevel l = level == KEEL_LOG_WARN    ? LogLevel::warn
                 : level == KEEL_LOG_ERROR ? LogLevel::error
                 : level == KEEL_LOG_DEBUG ? LogLevel::debug
                                           : LogLevel::info;
    log_line(l, message != nullptr ? message : "", ctx(host).label_);
  }
  static void set_error(keel_host* host, keel_status code, const char* message) {
    ctx(host).record_error(code, message);
  }
  static const char* last_error(keel_host* host) { return ctx(host).last_error(); }
  static keel_status mesh_info(keel_host* host, keel_mesh_info* out) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      if (out == nullptr || out->struct_size < KEEL_MESH_INFO_SIZE_1_0)
        throw std::invalid_argument("mesh_info: the output struct is NULL or smaller than keel_mesh_info of ABI 1.0");
      keel_mesh_info info = ctx(host).services_.mesh->layout().info();
      // struct_size tells a newer plugin how much of its larger struct this host filled.
      size_t n = std::min(out->struct_size, sizeof(info));
      info.struct_size = n;
      std::memcpy(out, &info, n);
    });
  }
  static keel_group* group(keel_host* host, keel_group_kind kind) {
    try {
      return reinterpret_cast<keel_group*>(&ctx(host).services_.mesh->group(kind));
    } catch (const std::exception& e) {
      set_error(host, KEEL_ERROR_INVALID_ARGUMENT, e.what());
      return nullptr;
    }
  }
  static keel_status new_group(keel_host* host, const int32_t* ranks, size_t count, keel_group** out) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      std::vector<int> list(ranks, ranks + count);
      *out = reinterpret_cast<keel_group*>(ctx(host).services_.mesh->new_group(list));
    });
  }
  static int32_t group_rank(keel_host*, const keel_group* group) {
    return group == nullptr ? -1 : reinterpret_cast<const Group*>(group)->rank();
  }
  static int32_t group_size(keel_host*, const keel_group* group) {
    return group == nullptr ? 0 : reinterpret_cast<const Group*>(group)->size();
  }
  static keel_status all_reduce(keel_host* host, keel_group* g, keel_tensor* t, keel_reduce_op op, keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      if (work == nullptr || op == KEEL_REDUCE_AVG) {
        group_of(g).all_reduce(tensor(t), op);
        no_work(work);
        return;
      }
      finish(group_of(g).all_reduce_async(tensor(t), op), work);
    });
  }
  static keel_status broadcast(keel_host* host, keel_group* g, keel_tensor* t, int32_t root, keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      group_of(g).broadcast(tensor(t), root);
      no_work(work);
    });
  }
  static keel_status all_gather(keel_host* host, keel_group* g, keel_tensor* out, const keel_tensor* in,
                                keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      group_of(g).all_gather(tensor(out), tensor(in));
      no_work(work);
    });
  }
  static keel_status reduce_scatter(keel_host* host, keel_group* g, keel_tensor* out, const keel_tensor* in,
                                    keel_reduce_op op, keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      group_of(g).reduce_scatter(tensor(out), tensor(in), op);
      no_work(work);
    });
  }
  static keel_status all_to_all(keel_host* host, keel_group* g, keel_tensor* out, const keel_tensor* in,
                                const int64_t* out_splits, const int64_t* in_splits, keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      Group& group = group_of(g);
      auto n = static_cast<size_t>(group.size());
      group.all_to_all(tensor(out), tensor(in), std::vector<int64_t>(out_splits, out_splits + n),
                       std::vector<int64_t>(in_splits, in_splits + n));
      no_work(work);
    });
  }
  static keel_status send(keel_host* host, keel_group* g, const keel_tensor* t, int32_t peer, int32_t tag,
                          keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] { finish(group_of(g).isend(tensor(t), peer, tag), work); });
  }
  static keel_status recv(keel_host* host, keel_group* g, keel_tensor* t, int32_t peer, int32_t tag, keel_work** work) {
    return run(host, KEEL_ERROR_RUNTIME, [&] { finish(group_of(g).irecv(tensor(t), peer, tag), work); });
  }
  static keel_status wait(keel_host* host, keel_work* work) {
    std::unique_ptr<Work> owned(reinterpret_cast<Work*>(work));
    return run(host, KEEL_ERROR_RUNTIME, [&] {
      if (owned) owned->wait();
    });
  }
  static keel_status report_metric(keel_host* host, const char* name, const keel_tensor* value,
                                   keel_metric_reduce reduce) {
    return run(host, KEEL_ERROR_INVALID_ARGUMENT, [&] {
      if (name == nullptr || value == nullptr)
        throw std::invalid_argument("report_metric: name and value are required");
      ctx(host).services_.metrics->report(name, tensor(value), reduce);
    });
  }
  static keel_status report_metric_ratio(keel_host* host, const char* name, const keel_tensor* numerator,
                                         const keel_tensor* denominator) {
    return run(host, KEEL_ERROR_INVALID_ARGUMENT, [&] {
      if (name == nullptr || numerator == nullptr || denominator == nullptr)
        throw std::invalid_argument("report_metric_ratio: name, numerator and denominator are required");
      ctx(host).services_.metrics->report_ratio(name, tensor(numerator), tensor(denominator));
    });
  }
  static void set_found(int32_t* found, const ConfigSection& s, const char* key) {
    if (found != nullptr) *found = s.has(key) ? 1 : 0;
  }
  static keel_status config_int(keel_host* host, const keel_config* config, const char* key, int64_t fallback,
                                int64_t* out, int32_t* found) {
    return run(host, KEEL_ERROR_CONFIG, [&] {
      const ConfigSection& s = section(config, key, KEEL_CONFIG_INT, fallback);
      set_found(found, s, key);
      *out = s.integer(key, fallback);
    });
  }
  static keel_status config_float(keel_host* host, const keel_config* config, const char* key, double fallback,
                                  double* out, int32_t* found) {
    return run(host, KEEL_ERROR_CONFIG, [&] {
      const ConfigSection& s = section(config, key, KEEL_CONFIG_FLOAT, fallback);
      set_found(found, s, key);
      *out = s.real(key, fallback);
    });
  }
  static keel_status config_bool(keel_host* host, const keel_config* config, const char* key, int32_t fallback,
                                 int32_t* out, int32_t* found) {
    return run(host, KEEL_ERROR_CONFIG, [&] {
      const ConfigSection& s = section(config, key, KEEL_CONFIG_BOOL, fallback != 0);
      set_found(found, s, key);
      *out = s.boolean(key, fallback != 0) ? 1 : 0;
    });
  }
  static keel_status config_string(keel_host* host, const keel_config* config, const char* key, const char* fallback,
                                   const char** out, int32_t* found) {
    return run(host, KEEL_ERROR_CONFIG, [&] {
      const std::string fallback_text = fallback != nullptr ? fallback : "";
      const ConfigSection& s = section(config, key, KEEL_CONFIG_STRING, fallback_text);
      set_found(found, s, key);
      // The returned pointer must outlive the call: strings are interned for the process.
      static std::map<std::string, std::unique_ptr<std::string>> interned;
      std::string value = s.string(key, fallback_text);
      auto& slot = interned[value];
      if (!slot) slot = std::make_unique<std::string>(value);
      *out = slot->c_str();
    });
  }
  static keel_status config_invalid(keel_host* host, const keel_config* config, const char* key, const char* why) {
    return run(host, KEEL_ERROR_CONFIG, [&] {
      if (config == nullptr || key == nullptr)
        throw std::invalid_argument("config_invalid: config and key are required");
      reinterpret_cast<const ComponentConfig*>(config)->section().invalid(key, why != nullptr ? why : "invalid value");
    });
  }
};

const keel_host_api& host_api() {
  static const keel_host_api api = [] {
    keel_host_api a{};
    a.struct_size = sizeof(a);
    a.log = &HostApi::log;
    a.set_error = &HostApi::set_error;
    a.mesh_info = &HostApi::mesh_info;
    a.group = &HostApi::group;
    a.new_group = &HostApi::new_group;
    a.group_rank = &HostApi::group_rank;
    a.group_size = &HostApi::group_size;
    a.all_reduce = &HostApi::all_reduce;
    a.broadcast = &HostApi::broadcast;
    a.all_gather = &HostApi::all_gather;
    a.reduce_scatter = &HostApi::reduce_scatter;
    a.all_to_all = &HostApi::all_to_all;
    a.send = &HostApi::send;
    a.recv = &HostApi::recv;
    a.wait = &HostApi::wait;
    a.report_metric = &HostApi::report_metric;
    a.report_metric_ratio = &HostApi::report_metric_ratio;
    a.config_int = &HostApi::config_int;
    a.config_float = &HostApi::config_float;
    a.config_bool = &HostApi::config_bool;
    a.config_string = &HostApi::config_string;
    a.config_invalid = &HostApi::config_invalid;
    a.last_error = &HostApi::last_error;
    return a;
  }();
  return api;
}

}  // namespace keel
