// A component's settings in its own table ([clipper.norm_clipper]) or in the role table
// ([clipper] beside plugin = ...): both resolve alike, the forms do not mix, tables of other
// components are kept unread, and --set reaches a component table by three names.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/component_table.hpp"
#include "config/config_tree.hpp"
#include "test_support.hpp"
#include "train/job.hpp"

namespace keel {
namespace {

const std::string kModel = "[model]\nplugin = \"llama3\"\n[model.llama3]\nflavor = \"tiny\"\n";  // lines 1-4

// Builds the whole job (plugins included, on the meta device) from `text` and `sets`.
struct Built {
  std::string resolved;  // the resolved configuration, or ""
  std::string error;     // the InputError's message (file name as job.toml), or ""
};

Built build(const std::string& text, const std::vector<std::string>& sets = {}) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", text);
  RunOptions options;
  options.config_path = dir / "job.toml";
  options.overrides = sets;
  options.plugin_dirs = {test::plugin_dir()};
  Built out;
  try {
    Job job(options, /*meta=*/true);
    out.resolved = job.tree().resolved_toml();
  } catch (const InputError& e) {
    out.error = e.what();
    for (size_t at; (at = out.error.find(options.config_path)) != std::string::npos;)
      out.error.replace(at, options.config_path.size(), "job.toml");
  }
  return out;
}

TEST(ComponentTables, TheFlatAndThePerComponentFormResolveAlike) {
  Built flat = build(
      "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n[clipper]\nplugin = \"norm_clipper\"\n"
      "max_norm = 0.5\n");
  Built tables = build(kModel + "[clipper]\nplugin = \"norm_clipper\"\n[clipper.norm_clipper]\nmax_norm = 0.5\n");
  ASSERT_EQ(flat.error, "");
  ASSERT_EQ(tables.error, "");
  EXPECT_EQ(flat.resolved, tables.resolved);
  // A defaulted component is not pinned: the run's config.toml swaps with one flag too.
  EXPECT_NE(tables.resolved.find("[clipper]\nplugin = \"norm_clipper\"\n\n"
                                 "[clipper.norm_clipper]\nmax_norm = 0.5\nnorm_type = \"2\"\n"),
            std::string::npos)
      << tables.resolved;
  EXPECT_NE(tables.resolved.find("[model.llama3]\nflavor = \"tiny\"\ndim = 64\n"), std::string::npos);
}

TEST(ComponentTables, TheResolvedConfigurationBuildsTheSameJobAgain) {
  Built first = build(kModel + "[clipper.norm_clipper]\nmax_norm = 0.5\n[clipper.value_clipper]\nclip_value = 0.01\n");
  ASSERT_EQ(first.error, "");
  Built again = build(first.resolved);
  ASSERT_EQ(again.error, "") << first.resolved;
  EXPECT_EQ(again.resolved, first.resolved);
}

TEST(ComponentTables, AFlatKeyBesideAComponentTableIsRefusedNamingBoth) {
  Built mixed = build(kModel +
                      "[clipper]\nplugin = \"norm_clipper\"\nmax_norm = 1.0\n[clipper.norm_clipper]\n"
                      "max_norm = 2.0\n");
  EXPECT_NE(mixed.error.find("job.toml:7: clipper.max_norm sets a component's key in [clipper] itself, but "
                             "job.toml:8 holds [clipper.norm_clipper]: use one form. Put max_norm in "
                             "[clipper.norm_clipper] (on the command line: --set clipper.norm_clipper.max_norm=...)"),
            std::string::npos)
      << mixed.error;
  // A flat --set on a per-component file names itself and the table.
  Built set = build(kModel + "[clipper.norm_clipper]\nmax_norm = 2.0\n", {"clipper.max_norm=3"});
  EXPECT_NE(set.error.find("--set clipper.max_norm=3: clipper.max_norm sets a component's key in [clipper] itself, "
                           "but job.toml:5 holds [clipper.norm_clipper]"),
            std::string::npos)
      << set.error;
  // Another component's table beside flat keys is the same mix: on a swap the flat keys would
  // reach the other component.
  Built other = build(kModel + "[clipper]\nmax_norm = 1.0\n[clipper.value_clipper]\nclip_value = 0.1\n");
  EXPECT_NE(other.error.find("job.toml:6: clipper.max_norm sets a component's key in [clipper] itself, but "
                             "job.toml:7 holds [clipper.value_clipper]"),
            std::string::npos)
      << other.error;
}

TEST(ComponentTables, AnUnknownKeyInAComponentTableNamesLineComponentAndItsKeys) {
  Built typo = build(kModel + "[clipper.norm_clipper]\nmax_nrm = 1.0\n");
  EXPECT_NE(typo.error.find("job.toml:6: unknown key 'clipper.norm_clipper.max_nrm'; the clipper component "
                            "'norm_clipper' (plugin norm_clipper) reads max_norm, norm_type (keel-plugin inspect "
                            "norm_clipper)"),
            std::string::npos)
      << typo.error;
  Built model = build(kModel + "n_heeds = 2\n");
  EXPECT_NE(model.error.find("job.toml:5: unknown key 'model.llama3.n_heeds'; the model component 'llama3' (plugin "
                             "llama3) reads flavor, dim, n_layers, n_heads"),
            std::string::npos)
      << model.error;
  // The flat form names the component too.
  Built flat = build(
      "[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n[clipper]\nplugin = \"norm_clipper\"\n"
      "max_nrm = 1.0\n");
  EXPECT_NE(flat.error.find("job.toml:6: unknown key 'clipper.max_nrm'; the clipper component 'norm_clipper' (plugin "
                            "norm_clipper) reads max_norm, norm_type"),
            std::string::npos)
      << flat.error;
}

TEST(ComponentTables, SetAddressesAComponentTableByThreeNames) {
  Built set = build(kModel + "[clipper.norm_clipper]\nmax_norm = 2.0\n", {"clipper.norm_clipper.max_norm=0.25"});
  ASSERT_EQ(set.error, "");
  EXPECT_NE(set.resolved.find("[clipper.norm_clipper]\nmax_norm = 0.25\n"), std::string::npos) << set.resolved;
  Built bad = build(kModel, {"clipper.norm_clipper.max_norm=-1"});
  EXPECT_NE(bad.error.find("--set clipper.norm_clipper.max_norm=-1: clipper.norm_clipper.max_norm: must be a "
                           "positive number"),
            std::string::npos)
      << bad.error;
  Built unknown = build(kModel, {"clipper.norm_clipper.clip_value=0.05"});
  EXPECT_NE(unknown.error.find("--set clipper.norm_clipper.clip_value=0.05: unknown key "
                               "'clipper.norm_clipper.clip_value'; the clipper component 'norm_clipper'"),
            std::string::npos)
      << unknown.error;
}

TEST(ComponentTables, ASetInsideATableNobodyReadsIsRefused) {
  Built set = build(kModel + "[clipper.value_clipper]\nclip_value = 0.01\n", {"clipper.value_clipper.clip_value=0.05"});
  EXPECT_NE(set.error.find("--set clipper.value_clipper.clip_value=0.05: [clipper.value_clipper] is not read: the "
                           "clipper component is 'norm_clipper'"),
            std::string::npos)
      << set.error;
}

TEST(ComponentTables, AMisspeltTableOfTheSelectedComponentIsRefusedNotIgnored) {
  Built typo = build("[model]\nplugin = \"llama3\"\n[model.lama3]\nflavor = \"tiny\"\n");
  EXPECT_NE(typo.error.find("job.toml:3: [model.lama3] is not read: the model component is 'llama3' and there is no "
                            "[model.llama3]. Did you mean [model.llama3]?"),
            std::string::npos)
      << typo.error;
  // A table of another model component is kept: one job file serves two models.
  Built two = build(kModel + "[model.deepseek_v3_mtp]\nflavor = \"tiny\"\n");
  ASSERT_EQ(two.error, "");
  EXPECT_NE(two.resolved.find("[model.deepseek_v3_mtp]\nflavor = \"tiny\"\n"), std::string::npos) << two.resolved;
  Built swapped = build(kModel + "[model.deepseek_v3_mtp]\nflavor = \"tiny\"\n", {"model.plugin=deepseek_v3_mtp"});
  ASSERT_EQ(swapped.error, "");
  EXPECT_NE(swapped.resolved.find("[model.deepseek_v3_mtp]\nflavor = \"tiny\"\nvocab_size = 256\n"), std::string::npos)
      << swapped.resolved;
}

TEST(ComponentTables, ATableMadeByASetIsPlacedAtTheSet) {
  // A flat file, and a component table given on the command line: both places are named.
  Built flat = build("[model]\nplugin = \"llama3\"\nflavor = \"tiny\"\n", {"model.llama3.dim=32"});
  EXPECT_NE(flat.error.find("job.toml:3: model.flavor sets a component's key in [model] itself, but --set "
                            "model.llama3.dim=32 holds [model.llama3]"),
            std::string::npos)
      << flat.error;
  // A whole inline table set into a table nobody reads is refused like a key.
  Built inline_table = build(kModel, {"clipper.value_clipper={clip_value=0.05}"});
  EXPECT_NE(inline_table.error.find("--set clipper.value_clipper={clip_value=0.05}: [clipper.value_clipper] is not "
                                    "read"),
            std::string::npos)
      << inline_table.error;
}

TEST(ComponentTables, TablesOfOtherComponentsAreKeptVerbatimAndStillParse) {
  // Whatever the unread table holds comes back as valid TOML: odd keys quoted, control
  // characters escaped, nested tables inline, keys sorted.
  Built kept = build(kModel +
                     "[clipper.value_clipper]\nclip_value = 0.01\n\"odd key\" = \"a\\u0001b\"\n"
                     "nested = { b = 2, a = [1, 2] }\n");
  ASSERT_EQ(kept.error, "");
  EXPECT_NE(kept.resolved.find("[clipper.value_clipper]\nclip_value = 0.01\nnested = { a = [1, 2], b = 2 }\n"
                               "\"odd key\" = \"a\\u0001b\"\n"),
            std::string::npos)
      << kept.resolved;
  ConfigTree again = ConfigTree::from_string(kept.resolved, "resolved.toml");
  EXPECT_EQ(again.section("clipper.value_clipper").string("odd key", ""), std::string("a\x01") + "b");
}

TEST(ComponentTables, NoticeNamesTheTablesNotReadAndAMissingOwnTable) {
  ConfigTree tree = ConfigTree::from_string(
      "[clipper]\nplugin = \"norm_clipper\"\n[clipper.value_clipper]\nclip_value = 0.01\n[clipper.other]\nx = 1\n",
      "job.toml");
  ComponentTable table = component_table(tree, "clipper", "norm_clipper");
  EXPECT_EQ(ignored_tables_notice("clipper", "norm_clipper", table),
            "[clipper.other], [clipper.value_clipper] hold settings of components not selected (the clipper is "
            "'norm_clipper'): kept in the resolved configuration, not read; there is no [clipper.norm_clipper], so "
            "it runs on its defaults");
  ConfigTree flat = ConfigTree::from_string("[clipper]\nplugin = \"norm_clipper\"\nmax_norm = 1.0\n", "job.toml");
  EXPECT_EQ(ignored_tables_notice("clipper", "norm_clipper", component_table(flat, "clipper", "norm_clipper")), "");
}

TEST(ComponentTables, SetRefusesReplacingATableAndDeeperKeys) {
  ConfigTree tree = ConfigTree::from_string("[clipper.norm_clipper]\nmax_norm = 1.0\n", "job.toml");
  try {
    tree.set("clipper.norm_clipper=3");
    ADD_FAILURE() << "a table was replaced by a value";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'clipper.norm_clipper' is a table in job.toml; set one of its keys "
                                         "(clipper.norm_clipper.KEY=VALUE)"),
              std::string::npos)
        << e.what();
  }
  for (const char* bad : {"a.b.c.d=1", "clipper..max_norm=1", "clipper.\"x.y\".z=1"}) {
    try {
      tree.set(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("the key must be section.key or section.table.key"), std::string::npos)
          << e.what();
    }
  }
  try {
    tree.set("clipper.norm_clipper.max_norm.x=1");
    ADD_FAILURE() << "four names were accepted";
  } catch (const InputError&) {
  }
}

}  // namespace
}  // namespace keel
