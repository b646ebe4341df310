// The pipeline's link groups: which group carries each transfer, and that on them every
// schedule runs to its end under NCCL's rules (transfers of a communicator paired and run in
// issue order, a send finishing only once its receiver takes it), where one group for all
// transfers would not.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "pipeline/links.hpp"
#include "pipeline/schedule.hpp"

namespace keel {
namespace {

enum class Outcome { completes, deadlocks, pairs_wrong_transfers };

// Runs every rank of `schedule` as the pipeline runner issues its transfers, under NCCL's
// rules: each rank's transfers on one communicator (a pair of ranks in one group) run in issue
// order, and NCCL ignores tags, so a send is paired with whatever receive its peer runs next on
// that communicator from it (another transfer's would take its data silently); a send never
// blocks the host, a receive blocks it until it finishes. Messages larger than NCCL's buffers
// (`small_messages` false) finish a send only together with its receive; small ones leave as
// soon as they reach the front. `one_group`: every transfer on the pp group, as before the
// links; else on pipeline_link()'s group. `evaluation`: the forward passes of an evaluation.
Outcome run_under_nccl_rules(const std::string& schedule, int ranks, int microbatches, int chunks, bool one_group,
                             bool small_messages = false, bool evaluation = false) {
  using Communicator = std::tuple<int, int, int>;                               // group, lower rank, higher rank
  std::map<std::pair<int, Communicator>, std::deque<PassTransfer>> queues;      // by (rank, communicator)
  std::map<std::pair<Communicator, int>, std::deque<PassTransfer>> in_transit;  // by (communicator, sender)
  auto communicator = [&](const PassTransfer& t, int from, int to) {
    return Communicator{one_group ? 0 : pipeline_link(t.kind, from, to), std::min(from, to), std::max(from, to)};
  };
  std::vector<std::vector<PipelineAction>> actions;
  for (int r = 0; r < ranks; ++r)
    actions.push_back(evaluation ? evaluation_actions(microbatches, chunks)
                                 : stage_actions(schedule, r, ranks, microbatches, chunks));
  std::vector<size_t> next(static_cast<size_t>(ranks), 0);
  std::vector<int> receive_state(static_cast<size_t>(ranks), 0);  // 0 not posted, 1 posted, 2 done
  auto issue = [&](int r, const PassTransfer& t) {
    const int from = t.sending ? r : t.peer, to = t.sending ? t.peer : r;
    queues[{r, communicator(t, from, to)}].push_back(t);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      auto& pc = next[static_cast<size_t>(r)];
      auto& state = receive_state[static_cast<size_t>(r)];
      while (pc < actions[static_cast<size_t>(r)].size()) {
        const std::vector<PassTransfer> transfers =
            pass_transfers(schedule, r, ranks, chunks, actions[static_cast<size_t>(r)][pc]);
        bool blocked = false;
        for (const PassTransfer& t : transfers)
          if (!t.sending && t.peer != r && state != 2) {
            if (state == 0) issue(r, t);
            state = 1;
            blocked = true;
          }
        if (blocked) break;
        for (const PassTransfer& t : transfers)
          if (t.sending && t.peer != r) issue(r, t);
        ++pc;
        state = 0;
        progress = true;
      }
    }
    for (auto& [key, queue] : queues) {
      const auto& [rank, comm] = key;
      const int peer = std::get<1>(comm) == rank ? std::get<2>(comm) : std::get<1>(comm);
      if (small_messages)  // sent at once into the peer's buffer, in order
        while (!queue.empty() && queue.front().sending) {
          in_transit[{comm, rank}].push_back(queue.front());
          queue.pop_front();
          progress = true;
        }
      if (queue.empty() || queue.front().sending) continue;  // seen from the receiver
      // The send it pairs with: the oldest one buffered, else the peer's next one.
      std::deque<PassTransfer>* sender = &in_transit[{comm, peer}];
      if (sender->empty()) sender = &queues[{peer, comm}];
      if (sender->empty() || !sender->front().sending) continue;
      const PassTransfer &mine = queue.front(), &theirs = sender->front();
      if (mine.kind != theirs.kind || mine.boundary != theirs.boundary || mine.microbatch != theirs.microbatch)
        return Outcome::pairs_wrong_transfers;
      sender->pop_front();
      receive_state[static_cast<size_t>(rank)] = 2;
      queue.pop_front();
      progress = true;
    }
  }
  for (int r = 0; r < ranks; ++r)
    if (next[static_cast<size_t>(r)] != actions[static_cast<size_t>(r)].size()) return Outcome::deadlocks;
  for (const auto& [key, queue] : queues)
    if (!queue.empty()) return Outcome::deadlocks;
  for (const auto& [key, queue] : in_transit)
    if (!queue.empty()) return Outcome::deadlocks;
  return Outcome::completes;
}

// A link group that logs this rank's transfers, or fails them as one to a peer that stopped
// does: after Gloo's or NCCL's timeout, with LibTorch's error.
class LoggingLink final : public Group {
 public:
  LoggingLink(int link, std::vector<std::string>& log, bool fail) : link_(link), log_(log), fail_(fail) {}
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& world_ranks() const override { return members_; }
  void send(const at::Tensor&, int peer, int) override { transfer("send", peer); }
  void recv(at::Tensor&, int peer, int) override { transfer("recv", peer); }
  void all_reduce(at::Tensor&, keel_reduce_op) override { unused(); }
  void broadcast(at::Tensor&, int) override { unused(); }
  void all_gather(at::Tensor&, const at::Tensor&) override { unused(); }
  void reduce_scatter(at::Tensor&, const at::Tensor&, keel_reduce_op) override { unused(); }
  void all_to_all(at::Tensor&, const at::Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    unused();
  }
  std::unique_ptr<Work> isend(const at::Tensor&, int, int) override { return unused(); }
  std::unique_ptr<Work> irecv(at::Tensor&, int, int) override { return unused(); }
  std::unique_ptr<Work> all_reduce_async(at::Tensor&, keel_reduce_op) override { return unused(); }
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor&, const std::vector<int64_t>&, keel_reduce_op) override {
    return unused();
  }

 private:
  void transfer(const char* what, int peer) {
    TORCH_CHECK(!fail_, "Timed out waiting 300000ms for ", what, " operation to complete");
    log_.push_back(std::string(what) + " " + std::to_string(link_) + " " + std::to_string(peer));
  }
  static std::unique_ptr<Work> unused() { throw std::logic_error("not a transfer of the link handshake"); }

  int link_;
  std::vector<std::string>& log_;
  bool fail_;
  std::vector<int> members_{0, 1, 2, 3};
};

std::vector<std::string> open_as(int rank, const std::string& schedule, int ranks, bool fail = false) {
  std::vector<std::string> log;
  std::vector<std::unique_ptr<LoggingLink>> owned;
  std::vector<Group*> links;
  for (int link = 0; link < kMeshPipelineLinks; ++link) {
    owned.push_back(std::make_unique<LoggingLink>(link, log, fail));
    links.push_back(owned.back().get());
  }
  open_pipeline_links(links, rank, links_in_use(schedule, ranks, ranks, 1), at::kCPU);
  return log;
}

TEST(PipelineLinks, OpeningTakesEvenPairsBeforeOddOnesLinkByLink) {
  // 1F1B on 4 ranks: activations up on link 0, gradients down on link 3. Pairs (0, 1) and
  // (2, 3) open together, then (1, 2).
  EXPECT_EQ(open_as(1, "1f1b", 4), (std::vector<std::string>{"recv 0 0", "send 0 2", "send 3 0", "recv 3 2"}));
  EXPECT_EQ(open_as(2, "1f1b", 4), (std::vector<std::string>{"send 0 3", "recv 0 1", "recv 3 3", "send 3 1"}));
  EXPECT_EQ(open_as(0, "1f1b", 4), (std::vector<std::string>{"send 0 1", "recv 3 1"}));
}

TEST(PipelineLinks, AFailedOpeningNamesTheLinkAndThePeerWithoutAStackTrace) {
  try {
    open_as(1, "1f1b", 2, /*fail=*/true);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("pipeline: opening link 0 from pp rank 0 to pp rank 1 failed (did pp rank 0 stop during "
                           "setup?): Timed out waiting 300000ms for recv operation to complete"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
  }
}

struct Case {
  const char* schedule;
  int chunks;
};

// Every schedule at the sizes it takes: interleaving needs microbatches a multiple of the ranks.
template <typename Check>
void each_schedule(Check check) {
  for (const Case c : {Case{"1f1b", 1}, Case{"gpipe", 1}, Case{"zb_h1", 1}, Case{"zbv", 2}, Case{"interleaved_1f1b", 2},
                       Case{"interleaved_1f1b", 3}})
    for (int ranks = 2; ranks <= 4; ++ranks)
      for (int m = 1; m <= 12; ++m) {
        if (std::string(c.schedule) == "interleaved_1f1b" && m % ranks != 0) continue;
        check(c.schedule, ranks, m, c.chunks);
      }
}

TEST(PipelineLinks, EachKindAndDirectionHasItsOwnGroup) {
  std::set<int> links;
  for (TransferKind kind : {TransferKind::activation, TransferKind::gradient})
    for (auto [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) links.insert(pipeline_link(kind, from, to));
  EXPECT_EQ(links, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(pipeline_link(TransferKind::activation, 0, 3), pipeline_link(TransferKind::activation, 2, 3));
  EXPECT_THROW(pipeline_link(TransferKind::gradient, 1, 1), std::invalid_argument);
}

TEST(PipelineLinks, OneFOneBSendsActivationsUpAndGradientsDown) {
  const std::vector<LinkUse> uses = links_in_use("1f1b", 3, 4, 1);
  EXPECT_EQ(uses, (std::vector<LinkUse>{{0, 0, 1}, {0, 1, 2}, {3, 1, 0}, {3, 2, 1}}));
  // Interleaving's loop sends activations from the last rank back to the first, and gradients
  // the other way round.
  const std::vector<LinkUse> loop = links_in_use("interleaved_1f1b", 3, 3, 2);
  EXPECT_EQ(loop, (std::vector<LinkUse>{{0, 0, 1}, {0, 1, 2}, {1, 2, 0}, {2, 0, 2}, {3, 1, 0}, {3, 2, 1}}));
}

TEST(PipelineLinks, EveryScheduleSendsInTheReceiversOrderOnEveryLink) {
  each_schedule([](const char* schedule, int ranks, int m, int chunks) {
    EXPECT_TRUE(transfers_pair_in_order(schedule, ranks, m, chunks)) << schedule << " " << ranks << " x " << m;
  });
}

TEST(PipelineLinks, EveryScheduleRunsToItsEndUnderNcclsRules) {
  each_schedule([](const char* schedule, int ranks, int m, int chunks) {
    for (bool small : {false, true})
      for (bool evaluation : {false, true})
        EXPECT_EQ(run_under_nccl_rules(schedule, ranks, m, chunks, false, small, evaluation), Outcome::completes)
            << schedule << " " << ranks << " x " << m << " x " << chunks << (small ? ", small messages" : "")
            << (evaluation ? ", evaluation" : "");
  });
}

TEST(PipelineLinks, OneGroupForAllTransfersWouldHangOrSwapThem) {
  // 1F1B's steady state: rank 0 sends activation 1 while rank 1 sends gradient 0, each ahead of
  // the receive that would take the other's.
  EXPECT_EQ(run_under_nccl_rules("1f1b", 2, 2, 1, true), Outcome::deadlocks);
  // One microbatch never sends both ways at once.
  EXPECT_EQ(run_under_nccl_rules("1f1b", 2, 1, 1, true), Outcome::completes);
  // zbv at pp 2, m 4 on one group: rank 0 sends activations 0-2 of its first chunk before the
  // gradient of microbatch 0 of its second, and rank 1 takes that gradient before activation 2.
  // Larger than NCCL's buffers, the two ranks' sends wait on each other; smaller, NCCL pairs
  // activation 2 with the gradient.
  EXPECT_EQ(run_under_nccl_rules("zbv", 2, 4, 2, true), Outcome::deadlocks);
  EXPECT_EQ(run_under_nccl_rules("zbv", 2, 4, 2, true, /*small_messages=*/true), Outcome::pairs_wrong_transfers);
  EXPECT_EQ(run_under_nccl_rules("1f1b", 2, 2, 1, true, /*small_messages=*/true), Outcome::completes);
}

}  // namespace
}  // namespace keel
