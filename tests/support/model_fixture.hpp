// A fixture for tests of a model plugin's component: the built plugin's model made from a
// [model] table on a single-rank mesh, and part specs to build its stages with.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "config/config_tree.hpp"
#include "mesh/mesh.hpp"
#include "metrics/step_metrics.hpp"
#include "plugins/components.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"

namespace keel::test {

class ModelFixture : public ::testing::Test {
 protected:
  /// Tests of the model component named like its plugin `plugin`.
  explicit ModelFixture(std::string plugin) : plugin_(std::move(plugin)) {}

  /// The model of `table` (the body of [model]); every key must be read.
  std::unique_ptr<Model> make(const std::string& table) {
    tree_ = std::make_unique<ConfigTree>(ConfigTree::from_string("[model]\n" + table, "job.toml"));
    section_ = std::make_unique<ConfigSection>(tree_->section("model"));
    PluginRegistry registry({plugin_dir()});
    const keel_component& c = registry.component(plugin_, plugin_, KEEL_COMPONENT_MODEL);
    auto model = std::make_unique<Model>(c, plugin_, *section_, HostServices{&mesh_, &metrics_});
    tree_->check_all_read();
    return model;
  }
  /// The CPU part of stage `stage` of `stages`, holding layers [first, first + count).
  static keel_part_spec spec(int stage, int stages, int first, int count) {
    keel_part_spec s{};
    s.struct_size = sizeof(s);
    s.stage_index = stage;
    s.num_stages = stages;
    s.first_layer = first;
    s.num_layers = count;
    s.device_type = KEEL_DEVICE_CPU;
    return s;
  }

  Mesh mesh_{MeshLayout::compute(1, 1, 1, 0)};
  StepMetrics metrics_;
  std::unique_ptr<ConfigTree> tree_;
  std::unique_ptr<ConfigSection> section_;

 private:
  std::string plugin_;
};

}  // namespace keel::test
