// The SDK's Host wrapper against a recording host: every host API call is reachable, a failed
// call throws HostReported carrying the host's own message (also out of an autograd backward),
// and WorkHandle waits exactly once.
#include <gtest/gtest.h>

#include <keel/autograd.hpp>
#include <keel/keel.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "fake_host.hpp"

namespace keel {
namespace {

using test::FakeHost;

TEST(SdkHost, EveryLogLevelReachesTheHostAtItsLevel) {
  FakeHost fake;
  Host host(fake.raw());
  host.debug("d");
  host.info("i");
  host.warn("w");
  host.error("e");
  ASSERT_EQ(fake.logs.size(), 4u);
  EXPECT_EQ(fake.logs[0], std::make_pair(KEEL_LOG_DEBUG, std::string("d")));
  EXPECT_EQ(fake.logs[1], std::make_pair(KEEL_LOG_INFO, std::string("i")));
  EXPECT_EQ(fake.logs[2], std::make_pair(KEEL_LOG_WARN, std::string("w")));
  EXPECT_EQ(fake.logs[3], std::make_pair(KEEL_LOG_ERROR, std::string("e")));
}

TEST(SdkHost, EveryCollectiveReachesItsHostFunction) {
  FakeHost fake;
  Host host(fake.raw());
  keel_group* g = host.group(KEEL_GROUP_WORLD);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(host.size(g), 1);
  EXPECT_EQ(host.rank(g), 0);
  EXPECT_EQ(host.mesh().world_size, 1);
  EXPECT_EQ(host.new_group({0}), g);
  at::Tensor t = at::ones({4}), out = at::zeros({4});
  host.all_reduce(g, t);
  host.broadcast(g, t, 0);
  host.all_gather(g, out, t);
  host.reduce_scatter(g, out, t);
  host.all_to_all(g, out, t, {4}, {4});
  host.send(g, t, 0);
  host.recv(g, t, 0);
  host.metric("loss", t.sum());
  EXPECT_EQ(fake.calls, (std::vector<std::string>{"new_group", "all_reduce", "broadcast", "all_gather",
                                                  "reduce_scatter", "all_to_all", "send", "recv", "metric loss"}));
}

TEST(SdkHost, AsyncCollectivesWaitOnceThroughWork) {
  FakeHost fake;
  Host host(fake.raw());
  keel_group* g = host.group(KEEL_GROUP_WORLD);
  at::Tensor t = at::ones({4}), out = at::zeros({4});
  {
    WorkHandle a = host.all_reduce_async(g, t);
    WorkHandle b = host.broadcast_async(g, t, 0);
    WorkHandle c = host.all_gather_async(g, out, t);
    WorkHandle d = host.reduce_scatter_async(g, out, t);
    WorkHandle e = host.all_to_all_async(g, out, t, {4}, {4});
    WorkHandle f = host.send_async(g, t, 0);
    WorkHandle r = host.recv_async(g, t, 0);
    EXPECT_TRUE(a.pending());
    a.wait();
    a.wait();  // a second wait is a no-op
    EXPECT_FALSE(a.pending());
    EXPECT_EQ(std::count(fake.calls.begin(), fake.calls.end(), "wait"), 1);
  }  // the six others wait in their destructors
  EXPECT_EQ(std::count(fake.calls.begin(), fake.calls.end(), "wait"), 7);
  EXPECT_TRUE(fake.logs.empty());
}

TEST(SdkHost, AFailedWaitThrowsAndAnUnwaitedOneIsLogged) {
  FakeHost fake;
  Host host(fake.raw());
  at::Tensor t = at::ones({2});
  WorkHandle w = host.all_reduce_async(host.group(KEEL_GROUP_DP), t);
  fake.fail_next("gloo: connection reset by peer 3");
  try {
    w.wait();
    FAIL() << "wait succeeded";
  } catch (const HostReported& e) {
    EXPECT_STREQ(e.what(), "gloo: connection reset by peer 3");
  }
  {
    WorkHandle unwaited = host.all_reduce_async(host.group(KEEL_GROUP_DP), t);
    fake.fail_next("nccl: watchdog timeout");
  }
  ASSERT_EQ(fake.logs.size(), 1u);
  EXPECT_EQ(fake.logs[0].first, KEEL_LOG_ERROR);
  EXPECT_NE(fake.logs[0].second.find("nccl: watchdog timeout"), std::string::npos) << fake.logs[0].second;
}

TEST(SdkHost, HostReportedCarriesTheHostsMessageAndCode) {
  FakeHost fake;
  Host host(fake.raw());
  at::Tensor t = at::ones({2});
  fake.fail_next("all_reduce: tensor on cpu, group expects cuda");
  try {
    host.all_reduce(host.group(KEEL_GROUP_PP), t);
    FAIL() << "all_reduce succeeded";
  } catch (const HostReported& e) {
    EXPECT_EQ(e.code(), KEEL_ERROR_RUNTIME);
    EXPECT_STREQ(e.what(), "all_reduce: tensor on cpu, group expects cuda");
  }
  EXPECT_EQ(host.last_error(), "all_reduce: tensor on cpu, group expects cuda");
}

TEST(SdkHost, AnOlderHostsErrorsAreReportedWithoutReadingPastItsApi) {
  FakeHost fake(KEEL_HOST_API_SIZE_1_0);
  Host host(fake.raw());
  at::Tensor t = at::ones({2});
  fake.fail_next("not visible to a 1.0 host's plugins");
  try {
    host.broadcast(host.group(KEEL_GROUP_PP), t, 0);
    FAIL() << "broadcast succeeded";
  } catch (const HostReported& e) {
    EXPECT_STREQ(e.what(), "error reported by the host");
  }
  EXPECT_EQ(host.last_error(), "");
  EXPECT_EQ(std::count(fake.calls.begin(), fake.calls.end(), "last_error beyond struct_size"), 0);
}

// A 1.5 plugin's ratio reaches a 1.5 host as a ratio, and an older host (which has no such
// function) as a plain mean of numerator / denominator, without reading past its api.
TEST(SdkHost, ARatioMetricFallsBackToAMeanOnAHostBeforeOneFive) {
  const at::Tensor loss_sum = at::full({}, 6.0), tokens = at::full({}, 4.0);
  FakeHost current(sizeof(keel_host_api)), older(KEEL_HOST_API_SIZE_1_2);
  Host(current.raw()).metric_ratio("lm_loss", loss_sum, tokens);
  Host(older.raw()).metric_ratio("lm_loss", loss_sum, tokens);
  EXPECT_EQ(current.calls, (std::vector<std::string>{"metric_ratio lm_loss"}));
  EXPECT_EQ(older.calls, (std::vector<std::string>{"metric lm_loss"}));
}

TEST(SdkHost, ConfigInvalidThrowsTheHostsMessage) {
  FakeHost fake;
  Config config(fake.raw(), fake.config());
  try {
    config.invalid("max_norm", "must be positive");
    FAIL() << "invalid() returned";
  } catch (const HostReported& e) {
    EXPECT_EQ(e.code(), KEEL_ERROR_CONFIG);
    EXPECT_STREQ(e.what(), "max_norm: must be positive");
  }
}

TEST(SdkHost, AFailedCollectiveInBackwardRethrowsTheHostsMessage) {
  // autograd's backward cannot return a status: the exception itself must name the failure.
  FakeHost fake;
  Host host(fake.raw());
  at::Tensor x = at::randn({4, 3}).requires_grad_(true);
  at::Tensor y = autograd::all_to_all(host, host.group(KEEL_GROUP_EP), x, {4}, {4});
  EXPECT_TRUE(at::equal(y, x));
  fake.fail_next("all_to_all: rank 1 sent 3 rows, 4 expected");
  try {
    y.sum().backward();
    FAIL() << "backward succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_all: rank 1 sent 3 rows, 4 expected"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::count(fake.calls.begin(), fake.calls.end(), "all_to_all"), 2);
}

}  // namespace
}  // namespace keel
