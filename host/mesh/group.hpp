// A process group of the mesh and the collectives the host API exposes on it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <keel/keel.h>

namespace keel {

/// An in-flight operation; wait() returns once it completed (its tensors may then be reused).
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the operation completed; throws on failure or timeout.
  virtual void wait() = 0;
};

/// A set of ranks that run collectives together. Calls are synchronous on the tensor's
/// stream; every member calls them in the same order.
class Group {
 public:
  virtual ~Group() = default;
  /// This rank's index in the group.
  virtual int rank() const = 0;
  /// Number of members.
  virtual int size() const = 0;
  /// The members' world ranks, by group rank.
  virtual const std::vector<int>& world_ranks() const = 0;
  /// In-place reduction over the members.
  virtual void all_reduce(at::Tensor& tensor, keel_reduce_op op) = 0;
  /// In-place broadcast from group rank `root`.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  /// `output` = concatenation of every member's `input` along dim 0.
  virtual void all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  /// `output` = this member's dim-0 slice of the reduction of every `input`.
  virtual void reduce_scatter(at::Tensor& output, const at::Tensor& input, keel_reduce_op op) = 0;
  /// Dim-0 slices exchanged with split sizes (one entry per member).
  virtual void all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                          const std::vector<int64_t>& input_splits) = 0;
  /// Sends `tensor` to group rank `peer`.
  virtual void send(const at::Tensor& tensor, int peer, int tag) = 0;
  /// Receives into `tensor` from group rank `peer`.
  virtual void recv(at::Tensor& tensor, int peer, int tag) = 0;
  /// Starts sending `tensor` to group rank `peer`; the tensor must live until wait().
  virtual std::unique_ptr<Work> isend(const at::Tensor& tensor, int peer, int tag) = 0;
  /// Starts receiving into `tensor` from group rank `peer`; read it only after wait().
  virtual std::unique_ptr<Work> irecv(at::Tensor& tensor, int peer, int tag) = 0;
  /// Starts an in-place reduction over the members; read the tensor only after wait().
  virtual std::unique_ptr<Work> all_reduce_async(at::Tensor& tensor, keel_reduce_op op) = 0;
  /// Starts a reduction of the 1-D contiguous `flat` in which member j receives, in place, the
  /// reduced elements [cuts[j], cuts[j + 1]); its other elements keep this rank's own values.
  /// `cuts` holds size() + 1 ascending offsets from 0 to flat.numel() (check_scatter_cuts).
  /// Read the tensor only after wait(); NULL when nothing is in flight.
  virtual std::unique_ptr<Work> reduce_scatter_async(at::Tensor& flat, const std::vector<int64_t>& cuts,
                                                     keel_reduce_op op) = 0;
};

/// Throws std::invalid_argument unless `cuts` splits the 1-D contiguous `flat` among `members`
/// as reduce_scatter_async() needs.
void check_scatter_cuts(const at::Tensor& flat, const std::vector<int64_t>& cuts, int members);

/// Every member's `bytes`, by group rank (sizes may differ). [collective: group]
std::vector<std::string> all_gather_bytes(Group& group, const std::string& bytes);

/// The group of one rank: every collective is the identity (a copy where input and output
/// differ), which is what the same call means at any group size of one.
class SoloGroup final : public Group {
 public:
  explicit SoloGroup(int world_rank) : ranks_{world_rank} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  void all_reduce(at::Tensor&, keel_reduce_op) override {}
  void broadcast(at::Tensor&, int root) override;
  void all_gather(at::Tensor& output, const at::Tensor& input) override;
  void reduce_scatter(at::Tensor& output, const at::Tensor& input, keel_reduce_op op) override;
  void all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits) override;
  void send(const at::Tensor& tensor, int peer, int tag) override;
  void recv(at::Tensor& tensor, int peer, int tag) override;
  std::unique_ptr<Work> isend(const at::Tensor& tensor, int peer, int tag) override;
  std::unique_ptr<Work> irecv(at::Tensor& tensor, int peer, int tag) override;
  std::unique_ptr<Work> all_reduce_async(at::Tensor&, keel_reduce_op) override { return nullptr; }
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& flat, const std::vector<int64_t>& cuts,
                                             keel_reduce_op) override {
    check_scatter_cuts(flat, cuts, 1);
    return nullptr;
  }

 private:
  std::vector<int> ranks_;
};

}  // namespace keel
