// A checkpoint is untrusted input: crafted or damaged safetensors headers, manifests and
// `latest` pointers are refused with an InputError naming the file and the key, before any
// byte outside a mapping is read, any tensor allocated from a claimed shape, or any plugin
// loaded from a path the checkpoint names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_reader.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint_forge.hpp"
#include "common/error.hpp"
#include "plugins/plugin_registry.hpp"
#include "test_support.hpp"

namespace keel {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// The InputError `call` throws (fails the test when it throws nothing or something else).
template <typename Call>
std::string input_error(Call&& call) {
  try {
    call();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an InputError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

class CheckpointInput : public test::ForgedCheckpointTest {
 protected:
  // Sets "model.w"'s data_offsets in rank-00001 (its only tensor) to [begin, end] computed from
  // where the data start.
  template <typename Offsets>
  void set_offsets(Offsets&& offsets) {
    test::edit_safetensors_header(shard(1), [&](nlohmann::ordered_json& h, uint64_t data_start) {
      h["model.w"]["data_offsets"] = offsets(data_start);
    });
  }
};

TEST_F(CheckpointInput, TheForgedCheckpointIsSoundAndReadsBack) {
  CheckpointReader reader(step());
  EXPECT_EQ(reader.verify_all(), 3u);
  EXPECT_TRUE(at::equal(reader.read_whole("model.w"), test::forged_w()));
  EXPECT_TRUE(at::equal(reader.read_whole("model.b"), test::forged_b()));
  EXPECT_EQ(resolve_checkpoint(root(), "latest"), step());
}

// --- safetensors headers -------------------------------------------------------------------

// The issue's crash: data_offsets whose end wraps 2^64 once the data start is added, so that
// end <= file size held while begin pointed before the mapping.
TEST_F(CheckpointInput, DataOffsetsThatWrapAreRefusedByBothReaders) {
  set_offsets([](uint64_t data_start) {
    const uint64_t end = std::numeric_limits<uint64_t>::max() - data_start + 1 + 16;  // data_start + end wraps to 16
    return std::vector<uint64_t>{end - 24, end};                                      // 24 bytes: [2, 3] F32
  });
  for (const std::string& message :
       {input_error([&] { SafetensorsReader f(shard(1)); }), input_error([&] { read_safetensors(shard(1)); })}) {
    EXPECT_HAS(message, "rank-00001.safetensors");
    EXPECT_HAS(message, "model.w");
  }
  EXPECT_HAS(input_error([&] { CheckpointReader(step()).verify_all(); }), "model.w");
}

// [-2, -3] has the byte count of [2, 3] when multiplied in unsigned arithmetic.
TEST_F(CheckpointInput, NegativeDimensionsAreRefusedBeforeLibTorchSeesThem) {
  test::edit_safetensors_header(shard(1), [](nlohmann::ordered_json& h, uint64_t) {
    h["model.w"]["shape"] = {-2, -3};
  });
  for (const std::string& message :
       {input_error([&] { SafetensorsReader f(shard(1)); }), input_error([&] { read_safetensors(shard(1)); })}) {
    EXPECT_HAS(message, "rank-00001.safetensors: model.w: shape: dimension 0 is negative");
    EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;  // no c10 stack trace
  }
  CheckpointReader reader(step());
  EXPECT_HAS(reader.verify_share(0, 1), "negative");  // a message, never a throw
}

// 1099511627781 x 8116567128549412046 = 6 (mod 2^64): the element count wraps to that of [2, 3].
TEST_F(CheckpointInput, AnElementCountThatOverflowsIsRefused) {
  test::edit_safetensors_header(shard(1), [](nlohmann::ordered_json& h, uint64_t) {
    h["model.w"]["shape"] = {uint64_t{1099511627781}, uint64_t{8116567128549412046}};
  });
  for (const std::string& message :
       {input_error([&] { SafetensorsReader f(shard(1)); }), input_error([&] { read_safetensors(shard(1)); })}) {
    EXPECT_HAS(message, "rank-00001.safetensors: model.w");
    EXPECT_HAS(message, "overflows the element count");
  }
}

TEST_F(CheckpointInput, OffsetsOutsideTheDataOrOverlappingAnotherTensorAreRefused) {
  test::edit_safetensors_header(shard(0), [](nlohmann::ordered_json& h, uint64_t) {
    h["model.w"]["data_offsets"] = h["model.b"]["data_offsets"];  // [2, 3] F32 and [3] F32 differ in size
    h["model.w"]["shape"] = {3};
  });
  EXPECT_HAS(input_error([&] { SafetensorsReader f(shard(0)); }), "inside the tensor before it");
  set_offsets([](uint64_t) { return std::vector<uint64_t>{8, 32}; });  // 24 bytes, past the 24-byte data section
  EXPECT_HAS(input_error([&] { read_safetensors(shard(1)); }), "are not inside the data (24 bytes)");
}

TEST_F(CheckpointInput, AKeyRepeatedInAHeaderIsRefused) {
  // Written by hand: nlohmann-json would keep the last of two equal keys without a word.
  const std::string header = R"({"model.w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                             R"("model.w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  test::write_file(shard(1), bytes + header + std::string(24, '\0'));
  EXPECT_HAS(input_error([&] { SafetensorsReader f(shard(1)); }), "key 'model.w' appears twice");
}

// --- the manifest --------------------------------------------------------------------------

TEST_F(CheckpointInput, AShardWithoutOffsetsIsRefused) {
  craft([](Manifest& m) { m.entries["model.w"].shards[1].offsets.clear(); });
  const std::string message = input_error([&] { CheckpointReader r(step()); });
  EXPECT_HAS(message, "manifest.json: entry 'model.w', shard 1");
  EXPECT_HAS(message, "the entry's rank 2");
}

TEST_F(CheckpointInput, AnEntryWithoutShardsIsRefused) {
  craft([](Manifest& m) { m.entries["model.b"].shards.clear(); });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "entry 'model.b': 'shards' must be a non-empty array");
}

TEST_F(CheckpointInput, AnEntryShapeTheShardsDoNotTileIsRefused) {
  craft([](Manifest& m) { m.entries["model.w"].shape = {5, 3}; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "entry 'model.w': its shards hold 12 of the 15");
}

TEST_F(CheckpointInput, AnUnknownDtypeIsRefused) {
  craft([](Manifest& m) { m.entries["model.b"].dtype = "F99"; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "entry 'model.b': unsupported dtype 'F99'");
}

TEST_F(CheckpointInput, ADuplicatedShardIsRefused) {
  craft([](Manifest& m) { m.entries["model.b"].shards.push_back(m.entries["model.b"].shards[0]); });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "entry 'model.b', shard 1: a second shard in file");
}

// Rows 0-1 and 1-2 of a [3, 3] slice hold 12 elements as [4, 3] needs; row 3 has no shard.
TEST_F(CheckpointInput, OverlappingShardsAreRefusedEvenWhenTheirVolumesAddUp) {
  craft([](Manifest& m) {
    m.entries["model.w"].shards[0].shape = {3, 3};
    m.entries["model.w"].shards[1].offsets = {1, 0};
    m.entries["model.w"].shards[1].shape = {1, 3};
  });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "entry 'model.w': shards rank-00000.safetensors");
}

TEST_F(CheckpointInput, ShardsOutsideTheEntryOrWithNegativeDimensionsAreRefused) {
  craft([](Manifest& m) { m.entries["model.w"].shards[1].offsets = {3, 0}; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "lie outside the entry's shape [4, 3]");
  craft([](Manifest& m) { m.entries["model.w"].shape = {-4, -3}; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "entry 'model.w': shape: dimension 0 is negative");
  craft([](Manifest& m) { m.entries["model.w"].shards[1].offsets = {std::numeric_limits<int64_t>::max(), 0}; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "lie outside the entry's shape");
}

TEST_F(CheckpointInput, AShardFileThatIsAPathIsRefused) {
  craft([](Manifest& m) { m.entries["model.b"].shards[0].file = "../../elsewhere/rank-00000.safetensors"; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "is not a shard file name");
}

TEST_F(CheckpointInput, ScalarsOutOfRangeAreRefused) {
  craft([](Manifest& m) { m.step = -1; });  // would give a NaN learning rate
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "manifest.json: step: -1 is out of range");
  craft([](Manifest& m) { m.lr = -1; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "manifest.json: lr must be a finite number >= 0");
  craft([](Manifest& m) { m.pp = 0; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "manifest.json: mesh.pp: 0 is out of range");
  craft([](Manifest& m) { m.tokens_seen = -5; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "tokens_seen: -5 is out of range");
  craft([](Manifest& m) { m.entries["model.b"].shards[0].xxh64 = "not-a-hash"; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "xxh64 'not-a-hash' is not 16 hex digits");
}

TEST_F(CheckpointInput, ValidationFiguresRoundTripWithTheirNonFiniteValues) {
  craft([](Manifest& m) {
    m.validation = ValidationRecord{1, {{"val_loss", 2.5}, {"val_mtp_loss.1", std::nan("")}, {"val_x", -INFINITY}}};
  });
  CheckpointReader reader(step());
  ASSERT_TRUE(reader.manifest().validation);
  const ValidationRecord& v = *reader.manifest().validation;
  EXPECT_EQ(v.step, 1);
  EXPECT_EQ(v.metrics.at("val_loss"), 2.5);
  EXPECT_TRUE(std::isnan(v.metrics.at("val_mtp_loss.1")));
  EXPECT_EQ(v.metrics.at("val_x"), -INFINITY);
  craft([](Manifest& m) { m.validation.reset(); });  // a run that had not evaluated
  EXPECT_FALSE(CheckpointReader(step()).manifest().validation);
}

TEST_F(CheckpointInput, ValidationFiguresOfAnotherStepOrShapeAreRefused) {
  craft([](Manifest& m) { m.validation = ValidationRecord{2, {{"val_loss", 1.0}}}; });  // after the checkpoint
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "manifest.json: validation.step: 2 is out of range");
  craft([](Manifest& m) { m.validation = ValidationRecord{1, {{"val_lm_loss", 1.0}}}; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "validation.metrics: no val_loss");
  craft([](Manifest& m) { m.validation = ValidationRecord{1, {{"val_loss", 1.0}, {"val loss", 1.0}}}; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "name 'val loss' is not printable text");
  // Written by hand as a version-1 manifest (no checksum to forge): a string that is no number.
  auto j = nlohmann::ordered_json::parse(test::read_file(step() + "/manifest.json"));
  j.erase("checksum");
  j["version"] = 1;
  j["validation"] = {{"step", 1}, {"metrics", {{"val_loss", "low"}}}};
  test::write_file(step() + "/manifest.json", j.dump(1));
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "validation.metrics.val_loss: expected a number");
  j["validation"] = {{"step", 1}, {"metrics", {{"val_loss", 1.0}}}, {"best", true}};
  test::write_file(step() + "/manifest.json", j.dump(1));
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "unknown key 'best'");
  j["validation"] = 3;
  test::write_file(step() + "/manifest.json", j.dump(1));
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "validation: must be an object");
}

TEST_F(CheckpointInput, APluginPathInTheManifestIsRefused) {
  craft([](Manifest& m) { m.model_plugin = "/tmp/evil.so"; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "model.plugin: '/tmp/evil.so' is not a name");
  craft([](Manifest& m) { m.clipper_component = "../x"; });
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "clipper.component: '../x' is not a name");
}

TEST_F(CheckpointInput, AFlippedByteInTheManifestIsCaughtByItsChecksum) {
  test::replace_in_file(step() + "/manifest.json", "llama3\\\"", "llamb3\\\"");  // inside the config text
  const std::string message = input_error([&] { CheckpointReader r(step()); });
  EXPECT_HAS(message, step() + "/manifest.json: damaged manifest");
}

TEST_F(CheckpointInput, AKeyRepeatedInTheManifestIsRefused) {
  test::replace_in_file(step() + "/manifest.json", "\"run_id\"", "\"step\": 7, \"run_id\"");
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "key 'step' appears twice");
}

// Checkpoints of the release before manifest version 2 have no checksum: they still load.
TEST_F(CheckpointInput, AVersionOneManifestWithoutAChecksumLoads) {
  auto j = nlohmann::json::parse(test::read_file(step() + "/manifest.json"));
  j.erase("checksum");
  j.erase("run_id");
  j["version"] = 1;
  test::write_file(step() + "/manifest.json", j.dump(1));
  CheckpointReader reader(step());
  EXPECT_EQ(reader.verify_all(), 3u);
  EXPECT_TRUE(at::equal(reader.read_whole("model.w"), test::forged_w()));
  // Its structure is still checked.
  j["step"] = -1;
  test::write_file(step() + "/manifest.json", j.dump(1));
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "step: -1 is out of range");
}

TEST_F(CheckpointInput, AVersionTwoManifestWithoutItsChecksumIsRefused) {
  auto j = nlohmann::json::parse(test::read_file(step() + "/manifest.json"));
  ASSERT_EQ(j.at("version"), 2);
  j.erase("checksum");
  test::write_file(step() + "/manifest.json", j.dump(1));
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "manifest version 2 without its checksum");
  // A flipped byte in the key itself makes an unknown key, not a manifest of an older writer.
  j["chdcksum"] = "0000000000000000";
  j["version"] = 1;
  test::write_file(step() + "/manifest.json", j.dump(1));
  EXPECT_HAS(input_error([&] { CheckpointReader r(step()); }), "unknown key 'chdcksum'");
}

// --- the reader ----------------------------------------------------------------------------

TEST_F(CheckpointInput, AFileTensorOfAnotherDtypeThanTheManifestIsRefused) {
  craft([](Manifest& m) { m.entries["model.b"].dtype = "I32"; });  // the file holds F32
  const std::string message = input_error([&] { CheckpointReader(step()).verify_all(); });
  EXPECT_HAS(message, "file rank-00000.safetensors, key 'model.b': dtype F32 in the file, I32 in the manifest");
}

TEST_F(CheckpointInput, ATensorInAShardFileThatTheManifestDoesNotNameIsRefused) {
  write_safetensors(shard(1),
                    {{"model.w", test::forged_w().narrow(0, 2, 2).contiguous()}, {"model.extra", at::zeros({2})}});
  const std::string message = input_error([&] { CheckpointReader(step()).verify_all(); });
  EXPECT_HAS(message, "file rank-00001.safetensors: tensor 'model.extra' is not in the manifest");
}

TEST_F(CheckpointInput, VerificationReportsEveryProblemAndVerifyShareNeverThrows) {
  test::edit_safetensors_header(shard(1), [](nlohmann::ordered_json& h, uint64_t) {
    h["model.w"]["shape"] = {-2, -3};
  });
  craft([](Manifest& m) { m.entries["model.b"].shards[0].xxh64 = "0123456789abcdef"; });
  CheckpointReader reader(step());
  const VerifyReport report = reader.verify();
  ASSERT_EQ(report.malformed.size(), 1u);
  EXPECT_HAS(report.malformed[0], "rank-00001.safetensors");
  ASSERT_EQ(report.damaged.size(), 1u);
  EXPECT_HAS(report.damaged[0], "file rank-00000.safetensors, key 'model.b': damaged");
  std::string shared;
  EXPECT_NO_THROW(shared = reader.verify_share(0, 1));
  EXPECT_HAS(shared, "rank-00001.safetensors");
  EXPECT_HAS(shared, "key 'model.b': damaged");
  EXPECT_THROW(reader.verify_all(), InputError);
}

// Reading an entry whole checks every shard's header before it allocates, then reads each shard
// once and verifies its checksum on the way; a damaged shard is still refused.
TEST_F(CheckpointInput, AnEntryReadWholeReadsEachShardOnceAndStillVerifiesIt) {
  {
    CheckpointReader reader(step());
    EXPECT_TRUE(at::equal(reader.read_whole("model.w"), test::forged_w()));
    EXPECT_EQ(reader.bytes_loaded(), test::forged_w().nbytes());
    EXPECT_EQ(reader.bytes_verified(), test::forged_w().nbytes());
  }
  craft([](Manifest& m) { m.entries["model.w"].shards[1].xxh64 = "0123456789abcdef"; });
  CheckpointReader reader(step());
  EXPECT_THROW(reader.read_whole("model.w"), ChecksumMismatch);
}

// A claimed shape is not allocated before the files show they hold its bytes.
TEST_F(CheckpointInput, AHugeClaimedShapeIsNotAllocatedBeforeItsShardsAreChecked) {
  craft([](Manifest& m) {
    m.entries["model.huge"] = {
        "F32",
        {int64_t{1} << 31, int64_t{1} << 31},
        {{"rank-00000.safetensors", {0, 0}, {int64_t{1} << 31, int64_t{1} << 31}, "0000000000000000"}}};
  });
  CheckpointReader reader(step());
  EXPECT_HAS(input_error([&] { reader.read_whole("model.huge"); }),
             "file rank-00000.safetensors, key 'model.huge': the file lacks it");
}

// --- the latest pointer --------------------------------------------------------------------

TEST_F(CheckpointInput, ALatestPointerThatIsNotAStepNameIsRefusedNotFollowed) {
  test::forge_checkpoint(dir_.path() + "/other");  // a sound checkpoint the pointer tries to reach
  test::write_file(root() + "/latest", "../other/step-1\n");
  EXPECT_HAS(input_error([&] { resolve_checkpoint(root(), "latest"); }), root() + "/latest: not a checkpoint pointer");
  test::write_file(root() + "/latest", "step-1\n\n");
  EXPECT_HAS(input_error([&] { resolve_checkpoint(root(), "latest"); }), "not a checkpoint pointer");
  test::write_file(root() + "/latest", "step-1" + std::string(100, ' '));
  EXPECT_HAS(input_error([&] { resolve_checkpoint(root(), "latest"); }), "not a checkpoint pointer");
  test::write_file(root() + "/latest", "step-1");  // no newline: still the pointer
  EXPECT_EQ(resolve_checkpoint(root(), "latest"), step());
}

TEST_F(CheckpointInput, ALatestPointerNamingNoCheckpointIsRefusedNotReplacedByAnotherStep) {
  test::write_file(root() + "/latest", "step-7\n");
  EXPECT_HAS(input_error([&] { resolve_checkpoint(root(), "latest"); }),
             root() + "/latest names step-7, which is not a complete checkpoint");
  fs::remove(root() + "/latest");  // no pointer: the newest complete step
  EXPECT_EQ(resolve_checkpoint(root(), "latest"), step());
}

// --- plugins named by a checkpoint ----------------------------------------------------------

TEST(PluginByName, APathIsNeverLoadedByName) {
  PluginRegistry registry({test::plugin_dir()});
  for (const std::string& name :
       std::vector<std::string>{"/tmp/evil.so", "../llama3", "llama3.so", std::string("llama3\0/x", 9), ""})
    EXPECT_HAS(input_error([&] { registry.load_by_name(name); }), "invalid plugin name");
  EXPECT_EQ(std::string(registry.load_by_name("llama3").descriptor->plugin_name), "llama3");
}

}  // namespace
}  // namespace keel
