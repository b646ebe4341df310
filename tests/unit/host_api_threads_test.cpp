// The host API's [any-thread] functions: errors are recorded per thread (autograd may run a
// plugin's backward on its own threads), metrics reported concurrently all arrive.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "metrics/step_metrics.hpp"
#include "plugins/host_context.hpp"

namespace keel {
namespace {

TEST(HostApiThreads, EachThreadReadsBackItsOwnError) {
  HostContext context("model test (test)", HostServices{});
  keel_host* host = context.raw();
  ASSERT_GE(host->api->struct_size, KEEL_HOST_API_SIZE_1_2);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      const std::string mine = "failure of thread " + std::to_string(t);
      for (int i = 0; i < 200; ++i) {
        host->api->set_error(host, KEEL_ERROR_RUNTIME, mine.c_str());
        const char* read = host->api->last_error(host);
        if (read == nullptr || mine != read) ++mismatches;
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  // The train thread recorded nothing: its check of a failed call has no message to show.
  EXPECT_EQ(host->api->last_error(host), nullptr);
  try {
    context.check(KEEL_ERROR_RUNTIME, "forward");
    FAIL() << "check did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("without a message"), std::string::npos) << e.what();
  }
}

TEST(HostApiThreads, CheckReportsTheMessageOfItsOwnThreadAndClearsIt) {
  HostContext context("clipper test (test)", HostServices{});
  keel_host* host = context.raw();
  host->api->set_error(host, KEEL_ERROR_RUNTIME, "the train thread's failure");
  std::thread other([&] { host->api->set_error(host, KEEL_ERROR_RUNTIME, "another thread's failure"); });
  other.join();
  try {
    context.check(KEEL_ERROR_RUNTIME, "clip");
    FAIL() << "check did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("clip failed: the train thread's failure"), std::string::npos) << e.what();
  }
  EXPECT_EQ(host->api->last_error(host), nullptr);
}

TEST(HostApiThreads, MetricsReportedFromManyThreadsAllCount) {
  StepMetrics metrics;
  HostContext context("model test (test)", HostServices{nullptr, &metrics});
  keel_host* host = context.raw();
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      at::Tensor one = at::ones({});
      for (int i = 0; i < 100; ++i)
        ASSERT_EQ(host->api->report_metric(host, "events", reinterpret_cast<const keel_tensor*>(&one), KEEL_METRIC_SUM),
                  KEEL_OK);
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(metrics.resolve().at("events"), 800.0);
}

}  // namespace
}  // namespace keel
