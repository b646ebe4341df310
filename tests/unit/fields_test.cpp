// keel/fields.hpp: a plugin's config keys and flavors as rows, read through the host's config.
#include <gtest/gtest.h>
#include <keel/fields.hpp>

#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/component_config.hpp"
#include "plugins/host_context.hpp"

namespace keel {
namespace {

struct Sizes {
  int64_t layers = 0;
  int64_t heads = 0;
  double eps = 1e-6;
  bool tied = false;
  std::string act = "silu";
};

const std::vector<Field<Sizes>> kFields = {
    {"layers", &Sizes::layers, 1}, {"heads", &Sizes::heads, 2}, {"eps", &Sizes::eps},
    {"tied", &Sizes::tied},        {"act", &Sizes::act},
};
const std::vector<Flavor<Sizes>> kFlavors = {
    {"small", {.layers = 2, .heads = 4}},
    {"large", {.layers = 32, .heads = 32, .eps = 1e-5, .tied = true}},
};

class Fields : public ::testing::Test {
 protected:
  // The Sizes of `table`, or the config error's message.
  Sizes read(const std::string& table, std::string* error = nullptr) {
    ConfigTree tree = ConfigTree::from_string("[model]\n" + table, "job.toml");
    const std::optional<std::vector<DeclaredConfigKey>> undeclared;
    ComponentConfig component(tree.section("model"), undeclared);
    Config config(context_.raw(), HostContext::config_handle(component));
    try {
      return read_fields(config, kFlavors, kFields, "small");
    } catch (const HostReported& e) {
      try {
        context_.check(e.code(), "read_fields");
      } catch (const InputError& reported) {
        if (error != nullptr) *error = reported.what();
      }
    }
    return {};
  }

  Mesh mesh_{MeshLayout::compute(1, 1, 1, 0)};
  StepMetrics metrics_;
  HostContext context_{"model fields", {&mesh_, &metrics_}};
};

TEST_F(Fields, TheFlavorRowThenEveryPresentKeyOfEveryType) {
  Sizes fallback = read("");
  EXPECT_EQ(fallback.layers, 2);
  EXPECT_EQ(fallback.heads, 4);
  EXPECT_EQ(fallback.eps, 1e-6);  // left out of the row: the struct's default
  Sizes s = read("flavor = \"large\"\nheads = 8\neps = 0.5\ntied = false\nact = \"gelu\"\n");
  EXPECT_EQ(s.layers, 32);
  EXPECT_EQ(s.heads, 8);
  EXPECT_EQ(s.eps, 0.5);
  EXPECT_FALSE(s.tied);
  EXPECT_EQ(s.act, "gelu");
}

TEST_F(Fields, AnUnknownFlavorListsTheKnownOnes) {
  std::string error;
  read("flavor = \"huge\"\n", &error);
  EXPECT_NE(error.find("job.toml:2: model.flavor: unknown flavor 'huge'; known: small, large"), std::string::npos)
      << error;
}

TEST_F(Fields, AKeyBelowItsMinimumNamesTheKey) {
  std::string error;
  read("heads = 1\n", &error);
  EXPECT_NE(error.find("job.toml:2: model.heads: must be at least 2, got 1"), std::string::npos) << error;
  error.clear();
  read("layers = 0\nheads = 0\n", &error);  // rows are checked in order
  EXPECT_NE(error.find("model.layers: must be at least 1, got 0"), std::string::npos) << error;
}

}  // namespace
}  // namespace keel
