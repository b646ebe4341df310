// keel-launch: ranks with torchrun's environment and prefixed output; a dead rank stops the
// job with a non-zero exit naming it, and no rank is left behind.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <stdexcept>
#include <thread>

#include "test_support.hpp"

namespace keel {
namespace {

const char* kJob = R"([model]
plugin = "llama3"
flavor = "tiny"
[training]
steps = 4
seq_len = 16
global_batch = 4
threads = 1
[parallelism]
dp = 2
[metrics]
log_interval = 1
jsonl = false
[checkpoint]
save_final = false
)";

// Two pipeline stages of the flagship model: a dead stage leaves its peer blocked in a receive.
const char* kPipelineJob = R"([model]
plugin = "deepseek_v3_mtp"
flavor = "tiny"
[training]
steps = 4
seq_len = 16
global_batch = 4
threads = 1
[parallelism]
pp = 2
microbatches = 2
[metrics]
log_interval = 1
jsonl = false
[checkpoint]
save_final = false
)";

std::string launch(const test::TempDir& dir, const std::string& extra) {
  return test::source_dir() + "/tools/keel-launch --nproc 2 -- " + test::bin_dir() + "/keel-train --plugin-path " +
         test::plugin_dir() + " --config " + (dir / "job.toml") + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"" +
         extra;
}

TEST(KeelLaunch, RunsRanksWithPrefixedOutput) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  auto r = test::run_command(launch(dir, ""));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] [keel 0] step 4/4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] [keel 1]"), std::string::npos) << r.output;
}

void expect_killed_rank_stops_the_job(const char* job_text) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", job_text);
  auto start = std::chrono::steady_clock::now();
  // In the background, its own output in files: run_command returns at once.
  std::string job = launch(dir, " --set training.steps=100000");
  test::run_command(std::string("(")
                        .append(job)
                        .append(" > ")
                        .append(dir / "log")
                        .append(" 2>&1; echo $? > ")
                        .append(dir / "status")
                        .append(") > /dev/null 2>&1 &"));
  std::smatch m;
  std::string log;
  // Wait until both ranks train, then kill rank 1.
  for (int i = 0; i < 600; ++i) {
    log = test::read_file(dir / "log");
    if (log.find("[rank 0] [keel 0] step 2/") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::regex_search(log, m, std::regex("rank 1 pid (\\d+)"))) << log;
  int pid1 = std::stoi(m[1]);
  ASSERT_TRUE(std::regex_search(log, m, std::regex("rank 0 pid (\\d+)"))) << log;
  int pid0 = std::stoi(m[1]);
  ASSERT_EQ(::kill(pid1, SIGKILL), 0);
  for (int i = 0; i < 600 && test::read_file(dir / "status").empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(test::read_file(dir / "status"), "1\n");
  EXPECT_LT(seconds, 60.0);
  log = test::read_file(dir / "log");
  EXPECT_NE(log.find("keel-launch: rank 1 was killed by signal 9"), std::string::npos) << log;
  EXPECT_NE(log.find("keel-launch: failed: rank 1"), std::string::npos) << log;
  EXPECT_NE(::kill(pid0, 0), 0) << "rank 0 was left running";
}

TEST(KeelLaunch, AKilledRankStopsTheJobNamingTheRank) { expect_killed_rank_stops_the_job(kJob); }

TEST(KeelLaunch, AKilledPipelineStageStopsTheJobNamingTheRank) { expect_killed_rank_stops_the_job(kPipelineJob); }

// A socket of this process bound to a free port and listening; closed on destruction.
struct HeldPort {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  HeldPort() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      throw std::runtime_error("cannot hold a port");
    port = ntohs(address.sin_port);
  }
  ~HeldPort() { ::close(fd); }
};

// keel-launch binds the rendezvous port itself and hands the listening socket to rank 0's
// store: a port another process holds is refused at once, naming it.
TEST(KeelLaunch, APortAnotherProcessHoldsIsRefusedNamingIt) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  HeldPort held;
  const std::string port = std::to_string(held.port);
  auto r = test::run_command(test::source_dir() + "/tools/keel-launch --nproc 2 --master-port " + port + " -- " +
                             test::bin_dir() + "/keel-train --config " + (dir / "job.toml"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("keel-launch: cannot listen on 127.0.0.1:" + port), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 0 pid"), std::string::npos) << r.output;
}

// The handed-over socket comes from the environment: rank 0 refuses one that is not a socket
// listening on MASTER_PORT, naming the variable, with the exit status of bad input.
TEST(KeelLaunch, RankZeroRefusesAListenDescriptorThatIsNotItsPort) {
  test::TempDir dir;
  test::write_file(dir / "job.toml", kJob);
  HeldPort held;
  const std::string train = test::bin_dir() + "/keel-train --plugin-path " + test::plugin_dir() + " --config " +
                            (dir / "job.toml") + " --set job.run_dir=\\\"" + (dir / "run") + "\\\"";
  auto not_a_socket = test::run_command("RANK=0 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(held.port) +
                                        " KEEL_MASTER_LISTEN_FD=0 " + train + " < /dev/null");
  EXPECT_EQ(not_a_socket.status, 2) << not_a_socket.output;
  EXPECT_NE(not_a_socket.output.find("KEEL_MASTER_LISTEN_FD='0' is not a listening socket"), std::string::npos)
      << not_a_socket.output;
  auto not_a_number = test::run_command("RANK=0 WORLD_SIZE=2 MASTER_PORT=" + std::to_string(held.port) +
                                        " KEEL_MASTER_LISTEN_FD=3x " + train);
  EXPECT_EQ(not_a_number.status, 2) << not_a_number.output;
  EXPECT_NE(not_a_number.output.find("KEEL_MASTER_LISTEN_FD='3x' is not a file descriptor"), std::string::npos)
      << not_a_number.output;
}

}  // namespace
}  // namespace keel
