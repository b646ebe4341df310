// The host's reading of a component's extension chain (ABI 1.2): a malformed chain is refused
// at load naming the plugin, the component and the entry; unknown types are skipped.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "plugins/extensions.hpp"

namespace keel {
namespace {

keel_status exporter(keel_model*, const char*, const keel_named_tensor* const*, size_t, const keel_export_sink*) {
  return KEEL_OK;
}

keel_status config_importer(keel_host*, const char*, const keel_import_source*, const keel_config_sink*) {
  return KEEL_OK;
}

keel_status state_importer(keel_model*, const char*, const keel_import_source*, const keel_export_sink*) {
  return KEEL_OK;
}

keel_status recomputer(keel_model*, int32_t) { return KEEL_OK; }
keel_status estimator(keel_model*, const keel_part_spec*, int64_t, int64_t, int32_t, int64_t*) { return KEEL_OK; }

keel_component model_with(const keel_extension* chain, size_t size = sizeof(keel_component)) {
  static const keel_model_vtable vtable{};
  return keel_component{size, KEEL_COMPONENT_MODEL, "m", "", &vtable, chain};
}

std::string refusal(const keel_component& c) {
  try {
    read_extensions("p.so", c);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ExtensionChain, FindsExportAndSkipsUnknownTypes) {
  keel_model_export_extension exp{
      {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, nullptr}, "hf", exporter};
  keel_extension future{sizeof(keel_extension) + 64, 4242, &exp.base};
  ComponentExtensions found = read_extensions("p.so", model_with(&future));
  EXPECT_EQ(found.model_export.export_state, &exporter);
  EXPECT_STREQ(found.model_export.formats, "hf");
  ASSERT_EQ(found.unknown.size(), 1u);
  EXPECT_EQ(found.unknown[0], 4242);
}

TEST(ExtensionChain, AComponentOlderThanOneTwoHasNoneAndItsChainFieldIsNotRead) {
  // The field beyond a 1.0 component's struct_size points at garbage: it must not be followed.
  const keel_extension* garbage = reinterpret_cast<const keel_extension*>(uintptr_t{0x10});
  ComponentExtensions found = read_extensions("p.so", model_with(garbage, KEEL_COMPONENT_SIZE_1_0));
  EXPECT_EQ(found.model_export.export_state, nullptr);
  EXPECT_TRUE(found.unknown.empty());
}

TEST(ExtensionChain, ALoopIsRefusedNotFollowedForever) {
  // Every loop comes back to a type already seen.
  keel_extension a{sizeof(keel_extension), 100, nullptr};
  keel_extension b{sizeof(keel_extension), 101, &a};
  a.next = &b;
  EXPECT_NE(refusal(model_with(&a)).find("type 100 is listed twice"), std::string::npos);
}

TEST(ExtensionChain, AChainLongerThanTheLimitIsRefused) {
  std::vector<keel_extension> chain(KEEL_MAX_EXTENSIONS + 1);
  for (size_t i = 0; i < chain.size(); ++i)
    chain[i] = {sizeof(keel_extension), static_cast<int32_t>(1000 + i), i + 1 < chain.size() ? &chain[i + 1] : nullptr};
  EXPECT_NE(refusal(model_with(chain.data())).find("more than 64 extensions"), std::string::npos);
}

TEST(ExtensionChain, ATypeListedTwiceIsRefused) {
  keel_extension second{sizeof(keel_extension), 77, nullptr};
  keel_extension first{sizeof(keel_extension), 77, &second};
  std::string why = refusal(model_with(&first));
  EXPECT_NE(why.find("component 'm' extension #1: type 77 is listed twice"), std::string::npos) << why;
}

TEST(ExtensionChain, AnEntrySmallerThanTheHeaderIsRefused) {
  keel_extension tiny{sizeof(size_t), 9, nullptr};
  EXPECT_NE(refusal(model_with(&tiny)).find("smaller than keel_extension"), std::string::npos);
}

TEST(ExtensionChain, AnIncompleteOrMisplacedExportIsRefused) {
  keel_model_export_extension short_one{
      {KEEL_EXTENSION_SIZE_1_2, KEEL_EXTENSION_MODEL_EXPORT, nullptr}, "hf", exporter};
  EXPECT_NE(refusal(model_with(&short_one.base)).find("this host needs at least"), std::string::npos);
  keel_model_export_extension no_function{
      {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, nullptr}, "hf", nullptr};
  EXPECT_NE(refusal(model_with(&no_function.base)).find("no export_state function"), std::string::npos);
  keel_model_export_extension on_clipper{
      {sizeof(keel_model_export_extension), KEEL_EXTENSION_MODEL_EXPORT, nullptr}, "hf", exporter};
  keel_component clipper = model_with(&on_clipper.base);
  clipper.kind = KEEL_COMPONENT_CLIPPER;
  EXPECT_NE(refusal(clipper).find("on a clipper"), std::string::npos);
}

// ABI 1.4: the import extension is kept when complete, refused naming what is missing.
TEST(ExtensionChain, ImportIsFoundWhenCompleteAndRefusedWhenIncompleteOrMisplaced) {
  keel_model_import_extension whole{{sizeof(keel_model_import_extension), KEEL_EXTENSION_MODEL_IMPORT, nullptr},
                                    "hf",
                                    config_importer,
                                    state_importer};
  ComponentExtensions found = read_extensions("p.so", model_with(&whole.base));
  EXPECT_EQ(found.model_import.import_config, &config_importer);
  EXPECT_EQ(found.model_import.import_state, &state_importer);
  EXPECT_STREQ(found.model_import.formats, "hf");

  keel_model_import_extension short_one = whole;
  short_one.base.struct_size = KEEL_STRUCT_SIZE(keel_model_import_extension, import_config);
  EXPECT_NE(refusal(model_with(&short_one.base)).find("this host needs at least"), std::string::npos);
  keel_model_import_extension no_state = whole;
  no_state.import_state = nullptr;
  EXPECT_NE(refusal(model_with(&no_state.base)).find("lacks import_config or import_state"), std::string::npos);
  keel_component clipper = model_with(&whole.base);
  clipper.kind = KEEL_COMPONENT_CLIPPER;
  EXPECT_NE(refusal(clipper).find("the model import extension on a clipper"), std::string::npos);
}

// ABI 1.6: the recompute extension is kept when complete, refused naming what is missing.
TEST(ExtensionChain, RecomputeIsFoundWhenCompleteAndRefusedWhenIncompleteOrMisplaced) {
  keel_model_recompute_extension whole{
      {sizeof(keel_model_recompute_extension), KEEL_EXTENSION_MODEL_RECOMPUTE, nullptr},
      1u << KEEL_RECOMPUTE_FULL,
      recomputer};
  ComponentExtensions found = read_extensions("p.so", model_with(&whole.base));
  EXPECT_EQ(found.model_recompute.set_recompute, &recomputer);
  EXPECT_EQ(found.model_recompute.modes, 1u << KEEL_RECOMPUTE_FULL);

  keel_model_recompute_extension short_one = whole;
  short_one.base.struct_size = KEEL_STRUCT_SIZE(keel_model_recompute_extension, modes);
  EXPECT_NE(refusal(model_with(&short_one.base)).find("this host needs at least"), std::string::npos);
  keel_model_recompute_extension no_function = whole;
  no_function.set_recompute = nullptr;
  EXPECT_NE(refusal(model_with(&no_function.base)).find("has no set_recompute function"), std::string::npos);
  keel_component clipper = model_with(&whole.base);
  clipper.kind = KEEL_COMPONENT_CLIPPER;
  EXPECT_NE(refusal(clipper).find("the model recompute extension on a clipper"), std::string::npos);
}

// ABI 1.6: the memory extension is kept when complete, refused naming what is missing.
TEST(ExtensionChain, MemoryIsFoundWhenCompleteAndRefusedWhenIncompleteOrMisplaced) {
  keel_model_memory_extension whole{{sizeof(keel_model_memory_extension), KEEL_EXTENSION_MODEL_MEMORY, nullptr},
                                    estimator};
  ComponentExtensions found = read_extensions("p.so", model_with(&whole.base));
  EXPECT_EQ(found.model_memory.activation_bytes, &estimator);

  keel_model_memory_extension short_one = whole;
  short_one.base.struct_size = sizeof(keel_extension);
  EXPECT_NE(refusal(model_with(&short_one.base)).find("this host needs at least"), std::string::npos);
  keel_model_memory_extension no_function = whole;
  no_function.activation_bytes = nullptr;
  EXPECT_NE(refusal(model_with(&no_function.base)).find("has no activation_bytes function"), std::string::npos);
  keel_component clipper = model_with(&whole.base);
  clipper.kind = KEEL_COMPONENT_CLIPPER;
  EXPECT_NE(refusal(clipper).find("the model memory extension on a clipper"), std::string::npos);
}

// ABI 1.7: the clipper shards extension is kept when complete, refused naming what is missing,
// and only on a clipper.
keel_status bind_shards(keel_clipper*, const keel_param_info* const*, keel_tensor* const*, size_t) { return KEEL_OK; }

TEST(ExtensionChain, ClipperShardsAreFoundWhenCompleteAndRefusedWhenIncompleteOrMisplaced) {
  keel_clipper_shards_extension whole{{sizeof(keel_clipper_shards_extension), KEEL_EXTENSION_CLIPPER_SHARDS, nullptr},
                                      bind_shards};
  keel_component clipper = model_with(&whole.base);
  clipper.kind = KEEL_COMPONENT_CLIPPER;
  ComponentExtensions found = read_extensions("p.so", clipper);
  EXPECT_EQ(found.clipper_shards.bind_gradient_shards, &bind_shards);

  keel_clipper_shards_extension short_one = whole;
  short_one.base.struct_size = sizeof(keel_extension);
  clipper.extensions = &short_one.base;
  EXPECT_NE(refusal(clipper).find("the clipper shards extension is " + std::to_string(sizeof(keel_extension)) +
                                  " bytes, this host needs at least " +
                                  std::to_string(KEEL_CLIPPER_SHARDS_EXTENSION_SIZE_1_7) + " (ABI 1.7)"),
            std::string::npos);
  keel_clipper_shards_extension no_function = whole;
  no_function.bind_gradient_shards = nullptr;
  clipper.extensions = &no_function.base;
  EXPECT_NE(refusal(clipper).find("has no bind_gradient_shards function"), std::string::npos);
  EXPECT_NE(refusal(model_with(&whole.base)).find("the clipper shards extension on a model"), std::string::npos);
}

}  // namespace
}  // namespace keel
