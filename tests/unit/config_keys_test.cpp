// Declared config keys (ABI 1.3): what the SDK builds from a component's config_keys() is what
// the host reads back; a malformed declaration is refused at load; and a component is held to
// its declaration when it reads its table.
#include <gtest/gtest.h>
#include <keel/keel.hpp>

#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <toml.hpp>

#include "common/error.hpp"
#include "config/config_tree.hpp"
#include "plugins/component_config.hpp"
#include "plugins/extensions.hpp"

namespace keel {
namespace {

// ------------------------------------------------------------------ the SDK's side

const Key<double> kLimit{"limit", 0.25, "the largest value"};
const Key<int64_t> kEvery{"every", 3, "how often"};
const Key<bool> kLoud{"loud", false, ""};
const Key<std::string> kMode{"mode", "say \"hi\"\\", "a string with quotes"};

struct DeclaringClipper {
  static std::vector<ConfigKey> config_keys() {
    return {kLimit, kEvery, kLoud, kMode, ConfigKey("size", KEEL_CONFIG_INT, std::nullopt, "set by the flavor")};
  }
  DeclaringClipper(Host, Config&) {}
  at::Tensor clip(std::span<const ParamView>) { return {}; }
};

struct SilentClipper {
  SilentClipper(Host, Config&) {}
  at::Tensor clip(std::span<const ParamView>) { return {}; }
};

TEST(ConfigKeys, TheHostReadsBackWhatTheSdkDeclares) {
  const keel_component* c = clipper_component<DeclaringClipper>("declaring", "test");
  ComponentExtensions found = read_extensions("p.so", *c);
  ASSERT_TRUE(found.config_keys.has_value());
  const std::vector<DeclaredConfigKey>& keys = *found.config_keys;
  ASSERT_EQ(keys.size(), 5u);
  EXPECT_EQ(keys[0].name, "limit");
  EXPECT_EQ(keys[0].type, KEEL_CONFIG_FLOAT);
  EXPECT_EQ(keys[0].default_text, "0.25");
  EXPECT_EQ(std::get<double>(*keys[0].default_value), 0.25);
  EXPECT_EQ(keys[0].doc, "the largest value");
  EXPECT_EQ(std::get<int64_t>(*keys[1].default_value), 3);
  EXPECT_EQ(std::get<bool>(*keys[2].default_value), false);
  EXPECT_EQ(std::get<std::string>(*keys[3].default_value), "say \"hi\"\\");
  EXPECT_FALSE(keys[4].default_value.has_value());
  EXPECT_EQ(keys[4].default_text, "");
  EXPECT_FALSE(read_extensions("p.so", *clipper_component<SilentClipper>("silent", "test")).config_keys);
}

struct LongDocClipper {
  static std::vector<ConfigKey> config_keys() {
    std::string doc;
    for (int i = 0; i < 300; ++i) doc += "\u00e9";  // two bytes each: 600 bytes
    return {ConfigKey("a", KEEL_CONFIG_INT, std::nullopt, doc)};
  }
  LongDocClipper(Host, Config&) {}
  at::Tensor clip(std::span<const ParamView>) { return {}; }
};

TEST(ConfigKeys, TheSdkCutsALongDocAtACharacterSoThePluginStillLoads) {
  ComponentExtensions found = read_extensions("p.so", *clipper_component<LongDocClipper>("long_doc", "test"));
  ASSERT_TRUE(found.config_keys.has_value());
  const std::string& doc = found.config_keys->front().doc;
  EXPECT_LE(doc.size(), size_t{KEEL_MAX_CONFIG_DOC});
  EXPECT_EQ(doc.substr(doc.size() - 3), "...");
  EXPECT_EQ(doc.size() % 2, 1u) << "cut inside a two-byte character";  // 2n bytes of text + "..."
}

TEST(ConfigKeys, FloatDefaultsAreWrittenShortAndReadBackExactly) {
  for (double value : {1.0, 0.1, 3e-4, 1e-5, 1e-6, 500000.0, 1e20, -2.5, 0.0, 1.0 / 3.0}) {
    const std::string text = toml_text(value);
    std::istringstream stream("v = " + text);
    const toml::value parsed = toml::find(toml::parse(stream, "default"), "v");
    ASSERT_TRUE(parsed.is_floating()) << text;
    EXPECT_EQ(parsed.as_floating(), value) << text;
  }
  EXPECT_EQ(toml_text(1.0), "1.0");
  EXPECT_EQ(toml_text(500000.0), "500000.0");
  EXPECT_EQ(toml_text(3e-4), "0.0003");
  EXPECT_EQ(toml_text(1e-6), "1e-06");
}

TEST(ConfigKeys, FieldKeysListTheFlavorAndEveryFieldWithEachFlavorsValue) {
  struct Sizes {
    int64_t layers = 1;
    double eps = 1e-6;
  };
  const std::vector<Field<Sizes>> fields = {{"layers", &Sizes::layers, 1}, {"eps", &Sizes::eps}};
  const std::vector<Flavor<Sizes>> flavors = {{"small", {.layers = 2}}, {"large", {.layers = 32, .eps = 1e-5}}};
  std::vector<ConfigKey> keys = field_keys(flavors, fields, "small");
  ASSERT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys[0].name, "flavor");
  EXPECT_EQ(keys[0].default_value, "\"small\"");
  EXPECT_EQ(keys[0].doc, "the named size: small, large");
  EXPECT_EQ(keys[1].type, KEEL_CONFIG_INT);
  EXPECT_FALSE(keys[1].default_value.has_value());
  EXPECT_EQ(keys[1].doc, "from the flavor: small 2, large 32; at least 1");
  EXPECT_EQ(keys[2].doc, "from the flavor: small 1e-06, large 1e-05");
}

// ------------------------------------------------------------------ validation at load

keel_component clipper_with(const keel_extension* chain) {
  static const keel_clipper_vtable vtable{};
  return keel_component{sizeof(keel_component), KEEL_COMPONENT_CLIPPER, "c", "", &vtable, chain};
}

std::string refusal(const std::vector<keel_config_key>& keys, size_t count_override = SIZE_MAX) {
  std::vector<const keel_config_key*> pointers;
  for (const keel_config_key& k : keys) pointers.push_back(&k);
  keel_config_keys_extension e{{sizeof(keel_config_keys_extension), KEEL_EXTENSION_CONFIG_KEYS, nullptr},
                               pointers.empty() ? nullptr : pointers.data(),
                               count_override == SIZE_MAX ? pointers.size() : count_override};
  try {
    read_extensions("p.so", clipper_with(&e.base));
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

keel_config_key key(const char* name, int32_t type, const char* fallback, const char* doc = "") {
  return keel_config_key{sizeof(keel_config_key), name, type, fallback, doc};
}

TEST(ConfigKeys, AMalformedDeclarationIsRefusedNamingTheKey) {
  EXPECT_EQ(refusal({key("limit", KEEL_CONFIG_FLOAT, "1"), key("name", KEEL_CONFIG_STRING, nullptr)}), "");
  struct Case {
    std::vector<keel_config_key> keys;
    const char* why;
  };
  const Case cases[] = {
      {{key("Limit", KEEL_CONFIG_FLOAT, "1.0")}, "config key #0 has an invalid name"},
      {{key(nullptr, KEEL_CONFIG_FLOAT, "1.0")}, "config key #0 has an invalid name"},
      {{key("a", KEEL_CONFIG_FLOAT, "1.0"), key("a", KEEL_CONFIG_INT, "1")}, "config key 'a' is declared twice"},
      {{key("a", 9, "1")}, "config key 'a' has unknown type 9"},
      {{key("a", KEEL_CONFIG_INT, "1.5")}, "config key 'a''s default: '1.5' is not a TOML integer"},
      {{key("a", KEEL_CONFIG_BOOL, "yes")}, "config key 'a''s default: 'yes' is not a TOML value"},
      {{key("a", KEEL_CONFIG_STRING, "\"x\"\nb = 1")}, "config key 'a''s default holds a control character"},
      {{key("a", KEEL_CONFIG_INT, "1", "bell\a")}, "config key 'a''s doc holds a control character"},
      {{key("a", KEEL_CONFIG_INT, "1", "\xff")}, "config key 'a''s doc"},
  };
  for (const Case& c : cases) EXPECT_NE(refusal(c.keys).find(c.why), std::string::npos) << refusal(c.keys);
  // The role table's own keys, and defaults a job file could not hold (the resolved
  // configuration records every default, and must run again).
  EXPECT_NE(refusal({key("plugin", KEEL_CONFIG_STRING, "\"x\"")}).find("config key #0 has an invalid name"),
            std::string::npos);
  EXPECT_NE(refusal({key("component", KEEL_CONFIG_STRING, nullptr)}).find("invalid name"), std::string::npos);
  for (const char* text : {"nan", "inf", "-inf", "1e309"})
    EXPECT_NE(refusal({key("a", KEEL_CONFIG_FLOAT, text)}).find("is not a finite number"), std::string::npos) << text;
  EXPECT_NE(refusal({key("a", KEEL_CONFIG_INT, "9223372036854775807")}).find("end of int64's range"),
            std::string::npos);
  EXPECT_NE(refusal({}, 3).find("declares 3 config keys but no array"), std::string::npos);
  EXPECT_NE(refusal({}, KEEL_MAX_CONFIG_KEYS + 1).find("more than 1024"), std::string::npos);
  keel_config_key short_key = key("a", KEEL_CONFIG_INT, "1");
  short_key.struct_size = sizeof(size_t);
  EXPECT_NE(refusal({short_key}).find("smaller than keel_config_key of ABI 1.3"), std::string::npos);
  const std::string long_name(65, 'a');
  EXPECT_NE(refusal({key(long_name.c_str(), KEEL_CONFIG_INT, "1")}).find("longer than 64 bytes"), std::string::npos);
  keel_extension tiny{sizeof(keel_extension), KEEL_EXTENSION_CONFIG_KEYS, nullptr};
  try {
    read_extensions("p.so", clipper_with(&tiny));
    ADD_FAILURE() << "a config keys extension without its fields was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ reads held to the declaration

class HeldReads : public ::testing::Test {
 protected:
  // The PluginContractError's message for reading `key` as `type` with `fallback`, or "".
  std::string read(const char* key, keel_config_type type, const ConfigValue& fallback) {
    try {
      config_.check_read(key, type, fallback);
    } catch (const PluginContractError& e) {
      return e.what();
    }
    return "";
  }

  ConfigTree tree_ = ConfigTree::from_string("[clipper]\n", "job.toml");
  std::optional<std::vector<DeclaredConfigKey>> declared_ = std::vector<DeclaredConfigKey>{
      {"limit", KEEL_CONFIG_FLOAT, 0.25, "0.25", ""},
      {"size", KEEL_CONFIG_INT, std::nullopt, "", ""},
  };
  ComponentConfig config_{tree_.section("clipper"), declared_};
};

TEST_F(HeldReads, ADeclaredReadPassesAndEveryOtherIsAPluginError) {
  EXPECT_EQ(read("limit", KEEL_CONFIG_FLOAT, 0.25), "");
  EXPECT_EQ(read("size", KEEL_CONFIG_INT, int64_t{7}), "");  // no fixed default: any fallback
  EXPECT_EQ(read("limt", KEEL_CONFIG_FLOAT, 0.25),
            "reads config key 'limt', which its config keys extension does not declare (declare every key it reads)");
  EXPECT_EQ(read("limit", KEEL_CONFIG_INT, int64_t{0}),
            "reads config key 'limit' with config_int, but declares it of type float");
  EXPECT_EQ(read("limit", KEEL_CONFIG_FLOAT, 0.5),
            "reads config key 'limit' with fallback 0.5, but declares its default as 0.25");
}

TEST_F(HeldReads, AComponentThatDeclaresNothingReadsFreely) {
  std::optional<std::vector<DeclaredConfigKey>> none;
  ComponentConfig free(tree_.section("clipper"), none);
  EXPECT_NO_THROW(free.check_read("anything", KEEL_CONFIG_BOOL, true));
}

}  // namespace
}  // namespace keel
