// The replica guard's message on several ranks, run as threads of one process: the groups of
// ranks that hold the same bits are listed by their lowest rank, whatever their hashes are.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <barrier>
#include <stdexcept>
#include <thread>

#include "param_refs.hpp"
#include "train/replica_guard.hpp"

namespace keel {
namespace {

// What the threads of one group share: a slot per rank and a barrier.
struct Rendezvous {
  explicit Rendezvous(int size) : sync(size), slots(static_cast<size_t>(size)) {}
  std::barrier<> sync;
  std::vector<at::Tensor> slots;
};

// A rank of a group whose ranks are threads; only all_gather (all the guard uses) is real.
class ThreadGroup final : public Group {
 public:
  ThreadGroup(int rank, Rendezvous& shared) : rank_(rank), shared_(shared) {
    for (int r = 0; r < static_cast<int>(shared.slots.size()); ++r) ranks_.push_back(r);
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  void all_gather(at::Tensor& output, const at::Tensor& input) override {
    shared_.slots[static_cast<size_t>(rank_)] = input.clone();
    shared_.sync.arrive_and_wait();
    output.copy_(at::cat(shared_.slots).view_as(output));
    shared_.sync.arrive_and_wait();  // every rank has read the slots before any writes again
  }
  void all_reduce(at::Tensor&, keel_reduce_op) override { unused(); }
  void broadcast(at::Tensor&, int) override { unused(); }
  void reduce_scatter(at::Tensor&, const at::Tensor&, keel_reduce_op) override { unused(); }
  void all_to_all(at::Tensor&, const at::Tensor&, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    unused();
  }
  void send(const at::Tensor&, int, int) override { unused(); }
  void recv(at::Tensor&, int, int) override { unused(); }
  std::unique_ptr<Work> isend(const at::Tensor&, int, int) override { unused(); }
  std::unique_ptr<Work> irecv(at::Tensor&, int, int) override { unused(); }
  std::unique_ptr<Work> all_reduce_async(at::Tensor&, keel_reduce_op) override { unused(); }
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor&, const std::vector<int64_t>&, keel_reduce_op) override {
    unused();
  }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("ThreadGroup: only all_gather is implemented"); }
  int rank_;
  Rendezvous& shared_;
  std::vector<int> ranks_;
};

uint64_t hash_of(const at::Tensor& t) { return XXH64(t.data_ptr(), t.numel() * t.element_size(), 0); }

// Runs the guard on `values.size()` ranks, rank r holding one parameter filled with values[r]
// (a REPLICA on every rank but 0); returns each rank's message ("" if it did not throw).
std::vector<std::string> guard_messages(const std::vector<float>& values) {
  const int n = static_cast<int>(values.size());
  Rendezvous shared(n);
  std::vector<std::string> messages(values.size());
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      at::Tensor weight = at::full({4}, values[static_cast<size_t>(r)]);
      std::vector<ParamRef> params{
          test::param_ref("tok_embeddings.weight", weight, r == 0 ? 0u : static_cast<uint32_t>(KEEL_PARAM_REPLICA))};
      ThreadGroup group(r, shared);
      try {
        check_replicas(params, group, 7);
      } catch (const std::runtime_error& e) {
        messages[static_cast<size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  return messages;
}

TEST(ReplicaGuard, GroupsAreListedByTheirLowestRankNotByTheirHashes) {
  // Three contents, given to the groups so that their hashes sort in the reverse order of the
  // groups' lowest ranks (0, 2, 10): a message ordered by hash would list rank 10's group first.
  std::vector<float> contents = {1.0f, 2.0f, 3.0f};
  auto hex_hash = [](float v) { return hash_of(at::full({4}, v)); };
  std::sort(contents.begin(), contents.end(), [&](float a, float b) { return hex_hash(a) > hex_hash(b); });
  const float low = contents[0], mid = contents[1], high = contents[2];
  // Ranks 0, 1, 3-9: `low`; ranks 2 and 11: `mid`; rank 10: `high`.
  std::vector<float> values(12, low);
  values[2] = values[11] = mid;
  values[10] = high;
  std::vector<std::string> messages = guard_messages(values);

  auto hex = [](uint64_t h) {
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(h));
    return std::string(text);
  };
  const std::string expected =
      "replica guard after step 7: the copies of 'tok_embeddings.weight' differ: "
      "rank(s) 0, 1 (REPLICA), 3 (REPLICA), 4 (REPLICA), 5 (REPLICA), 6 (REPLICA), 7 (REPLICA), 8 (REPLICA), "
      "9 (REPLICA) hold xxh64 " +
      hex(hex_hash(low)) + "; rank(s) 2 (REPLICA), 11 (REPLICA) hold xxh64 " + hex(hex_hash(mid)) +
      "; rank(s) 10 (REPLICA) hold xxh64 " + hex(hex_hash(high));
  for (size_t r = 0; r < messages.size(); ++r) EXPECT_EQ(messages[r], expected) << "rank " << r;
}

TEST(ReplicaGuard, EqualCopiesOnSeveralRanksPass) {
  std::vector<std::string> messages = guard_messages(std::vector<float>(5, 0.5f));
  for (const std::string& m : messages) EXPECT_EQ(m, "");
}

}  // namespace
}  // namespace keel
