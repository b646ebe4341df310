// The SDK's plugin glue driven through the C vtables it produces: ParamView over a record,
// a clipper class with a plain constructor that sees ParamViews and lists its state, and a
// model whose export is a KEEL_EXTENSION_MODEL_EXPORT extension, not a vtable field.
#include <gtest/gtest.h>

#include <keel/keel.hpp>

#include <map>
#include <span>
#include <string>
#include <vector>

#include "fake_host.hpp"

namespace keel {
namespace {

using test::FakeHost;

// ------------------------------------------------------------------ ParamView

keel_param_info record(const char* fqn, at::Tensor& t, uint32_t flags) {
  keel_param_info info{};
  info.struct_size = sizeof(info);
  info.fqn = fqn;
  info.tensor = handle(t);
  info.flags = flags;
  info.shard_dim = -1;
  info.active_fraction = 1.0;
  return info;
}

TEST(SdkParamView, ReadsEveryFieldOfTheRecord) {
  at::Tensor t = at::ones({4, 2}).requires_grad_(true);
  t.mutable_grad() = at::full({4, 2}, 3.0);
  keel_param_info info = record("layers.1.moe.experts.w1", t, KEEL_PARAM_EXPERT | KEEL_PARAM_PERSISTENT);
  info.shard_dim = 0;
  info.shard_offset = 4;
  info.global_dim_size = 8;
  info.active_fraction = 0.25;
  info.module_group = "mtp";
  ParamView p(&info);
  EXPECT_STREQ(p.fqn(), "layers.1.moe.experts.w1");
  EXPECT_EQ(&p.tensor(), &t);
  EXPECT_TRUE(at::equal(p.grad(), at::full({4, 2}, 3.0)));
  EXPECT_FALSE(p.replica());
  EXPECT_TRUE(p.expert());
  EXPECT_TRUE(p.persistent());
  EXPECT_EQ(p.shard_dim(), 0);
  EXPECT_EQ(p.shard_offset(), 4);
  EXPECT_EQ(p.global_dim_size(), 8);
  EXPECT_EQ(p.active_fraction(), 0.25);
  EXPECT_STREQ(p.module_group(), "mtp");
  EXPECT_EQ(p.raw(), &info);
}

TEST(SdkParamView, ModuleGroupIsMainWhenTheRecordHasNone) {
  at::Tensor t = at::ones({2});
  keel_param_info info = record("tok_embeddings.weight", t, KEEL_PARAM_REPLICA);
  ParamView p(&info);
  EXPECT_STREQ(p.module_group(), "main");
  EXPECT_TRUE(p.replica());
  EXPECT_FALSE(p.expert());
  EXPECT_FALSE(p.grad().defined());
}

TEST(SdkParamView, RefusesNullAndRecordsOlderThanOneZero) {
  at::Tensor t = at::ones({2});
  keel_param_info info = record("w", t, 0);
  info.struct_size = KEEL_PARAM_INFO_SIZE_1_0 - 1;
  for (const keel_param_info* bad :
       {static_cast<const keel_param_info*>(nullptr), static_cast<const keel_param_info*>(&info)}) {
    try {
      ParamView p(bad);
      FAIL() << "accepted a bad record";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), KEEL_ERROR_INVALID_ARGUMENT);
    }
  }
  info.struct_size = KEEL_PARAM_INFO_SIZE_1_0;
  EXPECT_NO_THROW(ParamView{&info});
}

// ------------------------------------------------------------------ clipper glue

// Scales every non-replica gradient by `scale` from the config, counts its steps in its state
// and reports the count as a metric.
class RecordingClipper {
 public:
  RecordingClipper(Host host, Config& config) : host_(host), scale_(config.real("scale", 1.0)) {}
  at::Tensor clip(std::span<const ParamView> params) {
    for (const ParamView& p : params)
      if (!p.replica()) p.grad().mul_(scale_);
    steps_.add_(1.0);
    host_.metric("clipped", steps_);
    return at::full({}, 2.5);
  }
  StateList state() { return {{"steps", &steps_}, {"scale", &scale_tensor_}}; }

 private:
  Host host_;
  double scale_;
  at::Tensor steps_ = at::zeros({}), scale_tensor_ = at::ones({});
};

// The older shape: a private constructor behind static create, no bind, no state.
class CreatedClipper {
 public:
  static std::unique_ptr<CreatedClipper> create(Host, Config& config) {
    if (config.real("fail", 0) != 0) throw Error(KEEL_ERROR_CONFIG, "created_clipper: told to fail");
    return std::unique_ptr<CreatedClipper>(new CreatedClipper());
  }
  at::Tensor clip(std::span<const ParamView> params) {
    if (params.empty()) throw Error(KEEL_ERROR_RUNTIME, "created_clipper: nothing to clip");
    return at::zeros({});
  }

 private:
  CreatedClipper() = default;
};

const keel_clipper_vtable& clipper_vtable(const keel_component* c) {
  EXPECT_EQ(c->kind, KEEL_COMPONENT_CLIPPER);
  EXPECT_EQ(c->extensions, nullptr);
  return *static_cast<const keel_clipper_vtable*>(c->vtable);
}

// A fake host and parameter records (gradients of ones) for driving a clipper's vtable.
struct ClipperRun {
  FakeHost fake;
  std::vector<at::Tensor> tensors;
  std::vector<keel_param_info> infos;
  std::vector<const keel_param_info*> records;

  void seal(const std::vector<std::pair<const char*, uint32_t>>& params) {
    for (size_t i = 0; i < params.size(); ++i) {
      tensors.push_back(at::ones({3}).requires_grad_(true));
      tensors.back().mutable_grad() = at::ones({3});
    }
    for (size_t i = 0; i < params.size(); ++i) infos.push_back(record(params[i].first, tensors[i], params[i].second));
    for (const keel_param_info& info : infos) records.push_back(&info);
  }
};

TEST(SdkClipperGlue, PlainConstructorClipperSeesViewsOfTheBoundRecordsEveryStep) {
  const keel_clipper_vtable& v = clipper_vtable(clipper_component<RecordingClipper>("recording", "test"));
  ASSERT_NE(v.bind_model_parts, nullptr);
  ASSERT_NE(v.state, nullptr);
  ClipperRun run;
  run.fake.numbers["scale"] = 0.5;
  run.seal({{"a", 0}, {"tok_embeddings.weight", KEEL_PARAM_REPLICA}, {"b", KEEL_PARAM_EXPERT}});
  keel_clipper* c = nullptr;
  ASSERT_EQ(v.create(run.fake.raw(), run.fake.config(), &c), KEEL_OK);
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(v.bind_model_parts(c, run.records.data(), run.records.size()), KEEL_OK);
  for (int step = 0; step < 2; ++step) {
    at::Tensor norm;
    ASSERT_EQ(v.clip(c, run.records.data(), run.records.size(), handle(norm)), KEEL_OK);
    EXPECT_EQ(norm.item<double>(), 2.5);
  }
  EXPECT_TRUE(at::equal(run.tensors[0].grad(), at::full({3}, 0.25)));  // scaled twice by 0.5
  EXPECT_TRUE(at::equal(run.tensors[1].grad(), at::ones({3})));        // a replica: left alone
  EXPECT_EQ(std::count(run.fake.calls.begin(), run.fake.calls.end(), "metric clipped"), 2);

  const keel_named_tensor* const* state = nullptr;
  size_t count = 0;
  ASSERT_EQ(v.state(c, &state, &count), KEEL_OK);
  ASSERT_EQ(count, 2u);
  EXPECT_STREQ(state[0]->name, "steps");
  EXPECT_EQ(state[0]->struct_size, sizeof(keel_named_tensor));
  EXPECT_EQ(tensor(state[0]->tensor).item<double>(), 2.0);  // the clipper's own counter
  EXPECT_STREQ(state[1]->name, "scale");
  tensor(state[0]->tensor).fill_(7.0);  // the host loads by copying into the listed tensor
  at::Tensor norm;
  ASSERT_EQ(v.clip(c, run.records.data(), run.records.size(), handle(norm)), KEEL_OK);
  ASSERT_EQ(v.state(c, &state, &count), KEEL_OK);
  EXPECT_EQ(tensor(state[0]->tensor).item<double>(), 8.0);
  v.destroy(c);
}

TEST(SdkClipperGlue, BindHappensOnceAndViewsPointAtTheHostsRecords) {
  // The clipper object is private to the glue: this one logs what it saw on every clip.
  struct Counting {
    Counting(Host host, Config&) : host(host) {}
    void bind(std::span<const ParamView> params) {
      ++binds;
      first = params.empty() ? nullptr : params.front().raw();
    }
    at::Tensor clip(std::span<const ParamView> params) {
      host.info("binds=" + std::to_string(binds) + " n=" + std::to_string(params.size()) +
                " same=" + std::to_string(!params.empty() && params.front().raw() == first));
      return at::zeros({});
    }
    Host host;
    int binds = 0;
    const keel_param_info* first = nullptr;
  };
  const keel_clipper_vtable& v = clipper_vtable(clipper_component<Counting>("counting", "test"));
  EXPECT_EQ(v.state, nullptr);  // no state(): stateless
  ClipperRun run;
  run.seal({{"a", 0}, {"b", 0}});
  keel_clipper* c = nullptr;
  ASSERT_EQ(v.create(run.fake.raw(), run.fake.config(), &c), KEEL_OK);
  at::Tensor norm;
  ASSERT_EQ(v.clip(c, run.records.data(), run.records.size(), handle(norm)), KEEL_OK);  // never bound: bound first
  ASSERT_EQ(v.bind_model_parts(c, run.records.data(), run.records.size()), KEEL_OK);
  std::vector<const keel_param_info*> same = run.records;  // same records, another array
  ASSERT_EQ(v.clip(c, same.data(), same.size(), handle(norm)), KEEL_OK);
  std::vector<const keel_param_info*> fewer = {run.records[1]};
  ASSERT_EQ(v.clip(c, fewer.data(), fewer.size(), handle(norm)), KEEL_OK);  // other records: rebound
  std::vector<std::string> lines;
  for (const auto& [level, line] : run.fake.logs) lines.push_back(line);
  EXPECT_EQ(lines, (std::vector<std::string>{"binds=1 n=2 same=1", "binds=2 n=2 same=1", "binds=3 n=1 same=1"}));
  v.destroy(c);
}

TEST(SdkClipperGlue, StaticCreateStillWorksAndErrorsReachTheHost) {
  const keel_clipper_vtable& v = clipper_vtable(clipper_component<CreatedClipper>("created", "test"));
  FakeHost fake;
  keel_clipper* c = nullptr;
  ASSERT_EQ(v.create(fake.raw(), fake.config(), &c), KEEL_OK);
  at::Tensor norm;
  EXPECT_EQ(v.clip(c, nullptr, 0, handle(norm)), KEEL_ERROR_RUNTIME);
  ASSERT_EQ(fake.errors.size(), 1u);
  EXPECT_EQ(fake.errors[0].second, "created_clipper: nothing to clip");
  v.destroy(c);

  fake.numbers["fail"] = 1;
  keel_clipper* failed = nullptr;
  EXPECT_EQ(v.create(fake.raw(), fake.config(), &failed), KEEL_ERROR_CONFIG);
  EXPECT_EQ(failed, nullptr);
  EXPECT_EQ(fake.errors.back().second, "created_clipper: told to fail");
}

TEST(SdkClipperGlue, ABadRecordIsRefusedAtBind) {
  const keel_clipper_vtable& v = clipper_vtable(clipper_component<RecordingClipper>("recording", "test"));
  ClipperRun run;
  run.seal({{"a", 0}});
  run.infos[0].struct_size = KEEL_PARAM_INFO_SIZE_1_0 - 1;
  keel_clipper* c = nullptr;
  ASSERT_EQ(v.create(run.fake.raw(), run.fake.config(), &c), KEEL_OK);
  EXPECT_EQ(v.bind_model_parts(c, run.records.data(), run.records.size()), KEEL_ERROR_INVALID_ARGUMENT);
  v.destroy(c);
}

// ------------------------------------------------------------------ model glue

class TinyPart : public Part {
 public:
  explicit TinyPart(keel_host* host) : Part(host) {}
  void init_weights(uint64_t) override {}
  void forward(const keel_forward_inputs&, keel_forward_outputs&) override {}
};

// A model with a plain constructor and an export.
class Exporting {
 public:
  static constexpr const char* export_formats = "hf,toy";
  Exporting(Host host, Config&) : part_(host.raw()) {}
  keel_model_info info() { return {0, 128, 2, 16}; }
  Part& build_part(const keel_part_spec&) { return part_; }
  void export_state(const std::string& format, const std::map<std::string, at::Tensor>& state, ExportSink& sink) {
    if (format != "toy") throw unsupported_format("exporting", format, export_formats);
    for (const auto& [name, value] : state) sink.tensor("model." + name, value);
    sink.file("config.json", "{}");
  }

 private:
  TinyPart part_;
};

// The older shape the model plugins still have: static create, a host() accessor, no export.
class Created {
 public:
  static std::unique_ptr<Created> create(Host host, Config&) { return std::unique_ptr<Created>(new Created(host)); }
  Host host() const { return host_; }
  keel_model_info info() { return {0, 64, 1, 8}; }
  Part& build_part(const keel_part_spec&) { return part_; }
  void post_init() { host_.info("post_init"); }

 private:
  explicit Created(Host host) : host_(host), part_(host.raw()) {}
  Host host_;
  TinyPart part_;
};

struct SinkRecord {
  std::vector<std::string> tensors, files;
};

keel_export_sink recording_sink(SinkRecord& record) {
  return {sizeof(keel_export_sink), &record,
          [](void* context, const char* name, const keel_tensor*) {
            static_cast<SinkRecord*>(context)->tensors.emplace_back(name);
            return keel_status{KEEL_OK};
          },
          [](void* context, const char* name, const char*) {
            static_cast<SinkRecord*>(context)->files.emplace_back(name);
            return keel_status{KEEL_OK};
          }};
}

TEST(SdkModelGlue, ExportIsAnExtensionAndTheVtableFieldStaysNull) {
  const keel_component* c = model_component<Exporting>("exporting", "test");
  const auto& v = *static_cast<const keel_model_vtable*>(c->vtable);
  EXPECT_EQ(v.struct_size, sizeof(keel_model_vtable));
  EXPECT_EQ(v.export_state, nullptr);
  ASSERT_GE(c->struct_size, KEEL_COMPONENT_SIZE_1_2);
  ASSERT_NE(c->extensions, nullptr);
  EXPECT_EQ(c->extensions->type, KEEL_EXTENSION_MODEL_EXPORT);
  EXPECT_EQ(c->extensions->next, nullptr);
  ASSERT_GE(c->extensions->struct_size, KEEL_MODEL_EXPORT_EXTENSION_SIZE_1_2);
  const auto& ext = *reinterpret_cast<const keel_model_export_extension*>(c->extensions);
  EXPECT_STREQ(ext.formats, "hf,toy");
  ASSERT_NE(ext.export_state, nullptr);

  FakeHost fake;
  keel_model* m = nullptr;
  ASSERT_EQ(v.create(fake.raw(), fake.config(), &m), KEEL_OK);
  at::Tensor w = at::ones({2});
  keel_named_tensor entry{sizeof(keel_named_tensor), "w", handle(w)};
  const keel_named_tensor* state[] = {&entry};
  SinkRecord record;
  keel_export_sink sink = recording_sink(record);
  ASSERT_EQ(ext.export_state(m, "toy", state, 1, &sink), KEEL_OK);
  EXPECT_EQ(record.tensors, std::vector<std::string>{"model.w"});
  EXPECT_EQ(record.files, std::vector<std::string>{"config.json"});
  EXPECT_EQ(ext.export_state(m, "gguf", state, 1, &sink), KEEL_ERROR_UNSUPPORTED);
  EXPECT_NE(fake.errors.back().second.find("cannot export format 'gguf'"), std::string::npos);
  keel_export_sink old = sink;
  old.struct_size = KEEL_EXPORT_SINK_SIZE_1_1 - 1;
  EXPECT_EQ(ext.export_state(m, "toy", state, 1, &old), KEEL_ERROR_INVALID_ARGUMENT);
  v.destroy(m);
}

TEST(SdkModelGlue, AModelWithoutExportHasNoExtensionsAndStaticCreateStillWorks) {
  const keel_component* c = model_component<Created>("created", "test");
  const auto& v = *static_cast<const keel_model_vtable*>(c->vtable);
  EXPECT_EQ(c->extensions, nullptr);
  EXPECT_EQ(v.export_state, nullptr);
  EXPECT_EQ(v.pre_clip, nullptr);
  ASSERT_NE(v.post_init, nullptr);

  FakeHost fake;
  keel_model* m = nullptr;
  ASSERT_EQ(v.create(fake.raw(), fake.config(), &m), KEEL_OK);
  ASSERT_EQ(v.post_init(m), KEEL_OK);
  ASSERT_EQ(fake.logs.size(), 1u);
  EXPECT_EQ(fake.logs[0].second, "post_init");
  v.destroy(m);
}

TEST(SdkModelGlue, InfoFillsTheCallersStructAndKeepsItsSize) {
  const auto& v = *static_cast<const keel_model_vtable*>(model_component<Exporting>("exporting", "test")->vtable);
  FakeHost fake;
  keel_model* m = nullptr;
  ASSERT_EQ(v.create(fake.raw(), fake.config(), &m), KEEL_OK);
  keel_model_info info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(v.info(m, &info), KEEL_OK);
  EXPECT_EQ(info.struct_size, sizeof(info));
  EXPECT_EQ(info.vocab_size, 128);
  EXPECT_EQ(info.num_layers, 2);
  EXPECT_EQ(info.hidden_size, 16);
  keel_model_info small{};
  small.struct_size = KEEL_MODEL_INFO_SIZE_1_0 - 1;
  EXPECT_EQ(v.info(m, &small), KEEL_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(small.vocab_size, 0);
  v.destroy(m);
}

}  // namespace
}  // namespace keel
