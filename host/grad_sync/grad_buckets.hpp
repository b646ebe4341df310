// Data-parallel gradient synchronisation. Every parameter's gradient is a view into a flat
// buffer of its reduction group — dense parameters (REPLICA copies included) over dp, expert
// shards over edp — so zeroing is one kernel per buffer and the reduction is one all-reduce
// per bucket of about `bucket_bytes`, all in flight at once. The views are set once and never
// freed: autograd accumulates into them in place, and clippers and the optimizer see them as
// ordinary .grad() tensors.
//
// With overlap, arm() before the step's last backward pass through the parameters armed: a
// hook after each armed gradient's accumulation counts it final, and each bucket's all-reduce
// starts as soon as every gradient in it is (grad_sync/launch_order.hpp), while backward goes
// on; reduce() starts the rest and waits. A rank holding several pipeline stages arms each
// stage's parameters before that stage's last backward. Each bucket is summed alone either
// way, so the result is bitwise the same.
//
// Under a sharded optimizer, scatter() turns a bucket's all-reduce into a reduce-scatter cut
// where the optimizer cuts it (optim/optimizer_shards.hpp): each member then holds reduced
// only the rows it steps, and the rest of the bucket its own partial sums.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "grad_sync/bucket_layout.hpp"
#include "grad_sync/launch_order.hpp"

#include "mesh/mesh.hpp"
#include "plugins/components.hpp"

namespace keel {

class GradientBuckets {
 public:
  /// Gives every parameter in `params` a zeroed gradient view into its group's flat buffer;
  /// with `overlap`, hooks each gradient's accumulation for arm().
  GradientBuckets(const std::vector<ParamRef>& params, Mesh& mesh, int64_t bucket_bytes, bool overlap = false);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  /// Zeroes every gradient in place.
  void zero();
  /// The next backward pass is the step's last for the gradients of the parameters [first,
  /// end) of those given to the constructor: each bucket starts its reduction once every
  /// gradient in it is accumulated, those of other parameters counting once a later call of
  /// the step arms them. No-op without overlap.
  void arm(size_t first, size_t end);
  /// From the next reduce() on, reduce-scatters every bucket of several members that holds
  /// none of the parameters (indices into those given to the constructor) in `keep_whole`,
  /// each member receiving the range shard_cuts() gives it; returns how many buckets that is.
  size_t scatter(const std::vector<ParamRef>& params, const std::vector<size_t>& keep_whole);
  /// Number of buckets reduce() reduce-scatters (scatter()).
  size_t scattered() const { return scattered_; }
  /// SUM-reduces every gradient over its group (dense: dp, expert: edp): starts what arm() did
  /// not, then waits for all. [collective: dp, edp]
  void reduce();
  /// Buckets the last reduce() found already started during backward.
  size_t started_during_backward() const { return started_during_backward_; }
  /// Number of all-reduces one reduce() issues on this rank (0 when dp = 1).
  size_t collectives_per_step() const;
  /// Bytes of the flat buffers (every gradient of this rank).
  int64_t bytes() const;
  /// The buffers and buckets, by index into the parameters given to the constructor.
  const BucketLayout& layout() const { return layout_; }

 private:
  struct Bucket {
    at::Tensor flat;  ///< a contiguous slice of a buffer
    Group* group = nullptr;
    int64_t gradients = 0;      ///< parameters whose gradient lies in it
    std::vector<int64_t> cuts;  ///< reduce-scattered at these cuts when not empty
  };
  class FinalGradientHook;
  void gradient_final(size_t bucket, size_t param);
  void start(const std::vector<size_t>& reduced);

  BucketLayout layout_;
  std::vector<at::Tensor> buffers_;
  std::vector<Bucket> buckets_;         ///< by layout_.buckets' index
  std::vector<size_t> reduced_;         ///< buckets whose group has several members
  std::unique_ptr<LaunchOrder> order_;  ///< over reduced_'s positions
  std::vector<at::Tensor> hooked_;      ///< parameters holding a FinalGradientHook
  std::mutex mutex_;                    ///< hooks may run on autograd's device threads
  bool overlap_ = false;
  bool armed_ = false;             ///< some parameters are armed this step
  std::vector<bool> param_armed_;  ///< by the constructor's parameter index
  std::vector<std::unique_ptr<Work>> pending_;
  size_t started_during_backward_ = 0;
  size_t scattered_ = 0;
};

}  // namespace keel
