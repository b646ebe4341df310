// A keel_host that records what a component asks of it, for testing the SDK's C++ layer
// without the real host: log lines, errors, collectives (by name), waits and metrics. A
// collective or wait can be made to fail with a message that last_error then returns.
#pragma once

#include <keel/keel.h>

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace keel::test {

class FakeHost {
 public:
  /// A host whose api declares `api_size` (KEEL_HOST_API_SIZE_1_0 plays a 1.0 host).
  explicit FakeHost(size_t api_size = sizeof(keel_host_api)) : api_(make_api(api_size)) {
    handle_.base = {sizeof(keel_host), &api_};
    handle_.self = this;
  }
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  keel_host* raw() { return &handle_.base; }
  /// The config handle to pass to create (its numbers come from `numbers`).
  const keel_config* config() { return reinterpret_cast<const keel_config*>(this); }

  /// The next collective or wait fails with `message`.
  void fail_next(std::string message) { fail_message_ = std::move(message); }

  std::vector<std::pair<keel_log_level, std::string>> logs;
  std::vector<std::pair<keel_status, std::string>> errors;  // set_error calls
  std::vector<std::string> calls;                           // collectives, waits and metrics by name
  std::map<std::string, double> numbers;                    // config_float values

 private:
  struct Handle {
    keel_host base;
    FakeHost* self;
  };
  static FakeHost& self(keel_host* host) { return *reinterpret_cast<Handle*>(host)->self; }

  // Records `name`; fails it when fail_next() asked for that.
  keel_status call(const char* name) {
    calls.emplace_back(name);
    if (fail_message_.empty()) return KEEL_OK;
    last_error_ = std::exchange(fail_message_, {});
    return KEEL_ERROR_RUNTIME;
  }
  static keel_status collective(keel_host* host, const char* name, keel_work** work) {
    keel_status status = self(host).call(name);
    if (status == KEEL_OK && work != nullptr) *work = reinterpret_cast<keel_work*>(&self(host).work_token_);
    return status;
  }

  static keel_host_api make_api(size_t api_size) {
    keel_host_api a{};
    a.struct_size = api_size;
    a.log = [](keel_host* h, keel_log_level level, const char* m) { self(h).logs.emplace_back(level, m); };
    a.set_error = [](keel_host* h, keel_status code, const char* m) {
      self(h).errors.emplace_back(code, m);
      self(h).last_error_ = m;
    };
    a.mesh_info = [](keel_host*, keel_mesh_info* out) {
      *out = {out->struct_size, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0};
      return keel_status{KEEL_OK};
    };
    a.group = [](keel_host* h, keel_group_kind) { return reinterpret_cast<keel_group*>(&self(h).group_token_); };
    a.new_group = [](keel_host* h, const int32_t*, size_t, keel_group** out) {
      *out = reinterpret_cast<keel_group*>(&self(h).group_token_);
      return self(h).call("new_group");
    };
    a.group_rank = [](keel_host*, const keel_group*) { return int32_t{0}; };
    a.group_size = [](keel_host*, const keel_group*) { return int32_t{1}; };
    a.all_reduce = [](keel_host* h, keel_group*, keel_tensor*, keel_reduce_op, keel_work** w) {
      return collective(h, "all_reduce", w);
    };
    a.broadcast = [](keel_host* h, keel_group*, keel_tensor*, int32_t, keel_work** w) {
      return collective(h, "broadcast", w);
    };
    a.all_gather = [](keel_host* h, keel_group*, keel_tensor* out, const keel_tensor* in, keel_work** w) {
      copy(out, in);
      return collective(h, "all_gather", w);
    };
    a.reduce_scatter = [](keel_host* h, keel_group*, keel_tensor* out, const keel_tensor* in, keel_reduce_op,
                          keel_work** w) {
      copy(out, in);
      return collective(h, "reduce_scatter", w);
    };
    a.all_to_all = [](keel_host* h, keel_group*, keel_tensor* out, const keel_tensor* in, const int64_t*,
                      const int64_t*, keel_work** w) {
      copy(out, in);  // one member: everything comes back
      return collective(h, "all_to_all", w);
    };
    a.send = [](keel_host* h, keel_group*, const keel_tensor*, int32_t, int32_t, keel_work** w) {
      return collective(h, "send", w);
    };
    a.recv = [](keel_host* h, keel_group*, keel_tensor*, int32_t, int32_t, keel_work** w) {
      return collective(h, "recv", w);
    };
    a.wait = [](keel_host* h, keel_work* w) { return w == nullptr ? KEEL_OK : self(h).call("wait"); };
    a.report_metric = [](keel_host* h, const char* name, const keel_tensor*, keel_metric_reduce) {
      return self(h).call((std::string("metric ") + name).c_str());
    };
    a.report_metric_ratio = [](keel_host* h, const char* name, const keel_tensor*, const keel_tensor*) {
      return self(h).call((std::string("metric_ratio ") + name).c_str());
    };
    a.config_int = [](keel_host*, const keel_config*, const char*, int64_t fallback, int64_t* out, int32_t*) {
      *out = fallback;
      return keel_status{KEEL_OK};
    };
    a.config_float = [](keel_host* h, const keel_config*, const char* key, double fallback, double* out, int32_t*) {
      auto it = self(h).numbers.find(key);
      *out = it != self(h).numbers.end() ? it->second : fallback;
      return keel_status{KEEL_OK};
    };
    a.config_bool = [](keel_host*, const keel_config*, const char*, int32_t fallback, int32_t* out, int32_t*) {
      *out = fallback;
      return keel_status{KEEL_OK};
    };
    a.config_string = [](keel_host*, const keel_config*, const char*, const char* fallback, const char** out,
                         int32_t*) {
      *out = fallback;
      return keel_status{KEEL_OK};
    };
    a.config_invalid = [](keel_host* h, const keel_config*, const char* key, const char* why) {
      self(h).last_error_ = std::string(key) + ": " + why;
      return keel_status{KEEL_ERROR_CONFIG};
    };
    a.last_error = [](keel_host* h) { return self(h).last_error_.empty() ? nullptr : self(h).last_error_.c_str(); };
    if (api_size < KEEL_HOST_API_SIZE_1_2)  // an SDK that reads past struct_size is caught here
      a.last_error = [](keel_host* h) {
        self(h).calls.emplace_back("last_error beyond struct_size");
        return "read beyond struct_size";
      };
    if (api_size < KEEL_HOST_API_SIZE_1_5)
      a.report_metric_ratio = [](keel_host* h, const char*, const keel_tensor*, const keel_tensor*) {
        return self(h).call("report_metric_ratio beyond struct_size");
      };
    return a;
  }
  static void copy(keel_tensor* out, const keel_tensor* in) {
    reinterpret_cast<at::Tensor*>(out)->copy_(*reinterpret_cast<const at::Tensor*>(in));
  }

  keel_host_api api_;
  Handle handle_{};
  std::string fail_message_, last_error_;
  int group_token_ = 0, work_token_ = 0;
};

}  // namespace keel::test
