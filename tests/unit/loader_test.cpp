// The plugin loader's refusals, in its validation order, each with its own message.
#include <gtest/gtest.h>

#include <torch/headeronly/version.h>

#include <fstream>
#include <string>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

PluginRegistry registry() { return PluginRegistry({test::test_plugin_dir(), test::plugin_dir()}); }

std::string load_error(const std::string& name) {
  PluginRegistry r = registry();
  try {
    r.load(name);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(message, part) EXPECT_NE((message).find(part), std::string::npos) << (message)

TEST(PluginLoader, UnopenableFileReportsTheLoadersText) {
  test::TempDir dir;
  test::write_file(dir / "garbage.so", std::string(4096, 'x'));
  std::string m = load_error(dir / "garbage.so");
  EXPECT_HAS(m, "cannot open plugin " + (dir / "garbage.so"));
  EXPECT_HAS(m, "invalid ELF header");
}

TEST(PluginLoader, LibraryWithoutEntrySymbolIsNotAPlugin) {
  std::string m = load_error("not_a_plugin");
  EXPECT_HAS(m, "has no 'keel_plugin_entry' symbol: not a Keel plugin?");
}

TEST(PluginLoader, TooSmallDescriptorIsRefused) {
  std::string m = load_error("small_descriptor");
  EXPECT_HAS(m, "its descriptor is 8 bytes, this host needs at least");
}

TEST(PluginLoader, AbiMajorMismatchNamesBothVersions) {
  std::string m = load_error("abi_major");
  EXPECT_HAS(m, "was built for Keel ABI 99.0, this host speaks ABI 1.9: rebuild it against SDK 1");
}

TEST(PluginLoader, LibTorchMismatchNamesBothVersions) {
  std::string m = load_error("torch_mismatch");
  EXPECT_HAS(m, "built against LibTorch 1.13.1");
  EXPECT_HAS(m, "this host runs LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                    std::to_string(TORCH_VERSION_MINOR));  // the LibTorch this build links
}

TEST(PluginLoader, MissingRequiredFunctionIsNamed) {
  std::string m = load_error("missing_function");
  EXPECT_HAS(m, "model component 'missing_function' lacks required function(s): forward");
}

TEST(PluginLoader, UnknownComponentListsTheAvailableOnes) {
  PluginRegistry r = registry();
  try {
    r.component("llama3", "llama4", KEEL_COMPONENT_MODEL);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_HAS(std::string(e.what()), "has no component 'llama4'; it has: llama3 (model)");
  }
}

TEST(PluginLoader, WrongKindIsRefused) {
  PluginRegistry r = registry();
  try {
    r.component("llama3", "llama3", KEEL_COMPONENT_CLIPPER);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_HAS(std::string(e.what()), "component 'llama3' of plugin");
    EXPECT_HAS(std::string(e.what()), "is a model, but a clipper is needed here");
  }
}

TEST(PluginLoader, MissingPluginListsWhereItLookedAndWhatItFound) {
  std::string m = load_error("nosuch");
  EXPECT_HAS(m, "plugin 'nosuch' not found; looked for nosuch.so in: " + test::test_plugin_dir());
  EXPECT_HAS(m, "llama3");
  EXPECT_HAS(m, "--plugin-path");
}

TEST(PluginLoader, InvalidNameIsRefused) { EXPECT_HAS(load_error("Llama-3"), "invalid plugin name 'Llama-3'"); }

TEST(PluginLoader, LoadingTwiceReturnsTheSameLoadedPlugin) {
  PluginRegistry r = registry();
  const LoadedPlugin& a = r.load("llama3");
  const LoadedPlugin& b = r.load(test::plugin_dir() + "/llama3.so");
  EXPECT_EQ(a.descriptor, b.descriptor);
}

class FaultyClipper : public ::testing::Test {
 protected:
  std::unique_ptr<Clipper> make(const std::string& component) {
    PluginRegistry r = registry();
    const keel_component& c = r.component("faulty", component, KEEL_COMPONENT_CLIPPER);
    return std::make_unique<Clipper>(c, "faulty", section_, HostServices{&mesh_, &metrics_});
  }
  ConfigTree tree_ = ConfigTree::from_string("", "job.toml");
  ConfigSection section_ = tree_.section("clipper");
  Mesh mesh_{MeshLayout::compute(1, 1, 1, 0)};
  StepMetrics metrics_;
};

TEST_F(FaultyClipper, ReportedErrorReachesTheUserWithTheComponentNamed) {
  try {
    make("returns_error");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()),
               "clipper returns_error (faulty): create failed: returns_error: refusing to start");
  }
}

TEST_F(FaultyClipper, ThrownExceptionBecomesAStatusAndAMessage) {
  try {
    make("throws");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()), "clipper throws (faulty): create failed: vector index 7 >= 3 (test)");
  }
}

TEST_F(FaultyClipper, AReadOfAnUndeclaredKeyIsThePluginsBugNotTheUsers) {
  try {
    make("reads_undeclared");
    FAIL();
  } catch (const InputError& e) {
    FAIL() << "reported as bad input: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()),
               "clipper reads_undeclared (faulty): create failed: reads config key 'limt', "
               "which its config keys extension does not declare");
  }
}

TEST_F(FaultyClipper, AnUndeclaredReadFailsEvenWhenThePluginSwallowsTheStatus) {
  try {
    make("swallows_undeclared");
    FAIL();
  } catch (const InputError& e) {
    FAIL() << "reported as bad input: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()),
               "clipper swallows_undeclared (faulty): create reads config key 'limt', which "
               "its config keys extension does not declare");
    EXPECT_HAS(std::string(e.what()), "(and reported success)");
  }
}

TEST_F(FaultyClipper, LibTorchErrorInAStepHookIsReportedNotFatal) {
  auto clipper = make("throws_in_clip");
  try {
    clipper->clip({});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_HAS(std::string(e.what()), "clipper throws_in_clip (faulty): clip failed:");
    EXPECT_HAS(std::string(e.what()), "cannot be multiplied");
  }
}

}  // namespace
}  // namespace keel
