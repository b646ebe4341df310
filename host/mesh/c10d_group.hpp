// A mesh group on LibTorch's c10d: Gloo for CPU tensors and, on CUDA jobs, NCCL for device
// tensors. Groups meet
// through one TCPStore per job, each under its own prefix, so only members construct a group.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "mesh/group.hpp"

namespace keel {

/// The rendezvous of a job: torchrun's environment (MASTER_ADDR, MASTER_PORT) and a timeout.
struct Rendezvous {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  bool nccl = false;  ///< also NCCL for CUDA tensors (CPU tensors always use Gloo)
  /// Rank 0: a socket already bound to master_port and listening, handed over by the launcher
  /// (KEEL_MASTER_LISTEN_FD), so that no other process can take the port between its choice
  /// and the store's start; -1 when the store binds the port itself.
  int listen_fd = -1;
  /// torchrun's agent already serves the store at master_addr:master_port
  /// (TORCHELASTIC_USE_AGENT_STORE=True): every rank, rank 0 included, connects as a client.
  bool agent_store = false;
  /// Prefix of every key this job puts in the store: "keel/", or "keel/attempt-N/" under
  /// torchrun (TORCHELASTIC_RESTART_COUNT), so a restarted job never meets an earlier
  /// attempt's keys in the agent's store, which outlives its workers.
  std::string key_prefix = "keel/";

  /// Reads MASTER_ADDR / MASTER_PORT (defaults above), torchrun's TORCHELASTIC_USE_AGENT_STORE
  /// and TORCHELASTIC_RESTART_COUNT and, on rank 0, KEEL_MASTER_LISTEN_FD (checked to be a
  /// listening socket on MASTER_PORT) for `rank` of `world_size`.
  static Rendezvous from_environment(int rank, int world_size, std::chrono::milliseconds timeout);
};

/// The job's store and the factory of its groups.
class C10dWorld {
 public:
  /// Connects to (rank 0, unless torchrun's agent serves it: serves) the job's TCPStore; blocks
  /// until every rank has joined.
  explicit C10dWorld(const Rendezvous& rendezvous);
  ~C10dWorld();
  C10dWorld(const C10dWorld&) = delete;
  C10dWorld& operator=(const C10dWorld&) = delete;

  /// A group of the sorted world ranks `members` (this rank must be one), named `name` (the same
  /// on every member): Gloo, plus NCCL when the rendezvous asks for it.
  std::unique_ptr<Group> make_group(const std::string& name, const std::vector<int>& members);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
