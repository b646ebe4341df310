// The rendezvous read from the launcher's environment: keel-launch's and torchrun's variables,
// a store served by torchrun's agent, and values that are not what they claim refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "mesh/c10d_group.hpp"

namespace keel {
namespace {

// Sets the launcher variables a test names for its lifetime; every other one is unset.
class LauncherEnvironment : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
                             "KEEL_MASTER_LISTEN_FD"})
      unsetenv(name);
  }
  static Rendezvous read(int rank = 0) { return Rendezvous::from_environment(rank, 2, std::chrono::seconds(1)); }
};

TEST_F(LauncherEnvironment, WithoutTorchrunRankZeroServesTheStoreUnderKeelsPrefix) {
  setenv("MASTER_PORT", "29611", 1);
  const Rendezvous r = read();
  EXPECT_FALSE(r.agent_store);
  EXPECT_EQ(r.master_port, 29611);
  EXPECT_EQ(r.key_prefix, "keel/");
}

TEST_F(LauncherEnvironment, UnderTorchrunsAgentStoreEveryRankIsAClientOfItsAttempt) {
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
  for (int rank : {0, 1}) {
    const Rendezvous r = read(rank);
    EXPECT_TRUE(r.agent_store);
    EXPECT_EQ(r.key_prefix, "keel/attempt-3/");
  }
  setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);  // torchrun's own spelling of "no"
  EXPECT_FALSE(read().agent_store);
}

TEST_F(LauncherEnvironment, ARestartCountThatIsNotACountIsRefusedByName) {
  for (const char* bad : {"-1", "2x", "99999999999999999999"}) {
    setenv("TORCHELASTIC_RESTART_COUNT", bad, 1);
    try {
      read();
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("TORCHELASTIC_RESTART_COUNT='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace keel
