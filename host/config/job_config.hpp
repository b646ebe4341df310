// The host's view of a job file: every host-owned section, typed and validated. The model and
// clipper tables are read by their plugins through the host API; only `plugin` and
// `component` are the host's. docs/config.md documents every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config_tree.hpp"

namespace keel {

/// Which plugin component fills a role ([model] or [clipper]).
struct ComponentChoice {
  std::string plugin;     ///< plugin name ([a-z0-9_]+) or a path to a .so
  std::string component;  ///< component name; defaults to the plugin's name
};

struct JobSection {
  std::string name;
  std::string run_dir;
};

struct ParallelismSection {
  int pp = 1, dp = 1, ep = 1;
  std::string schedule = "1f1b";
  int microbatches = 1;
  int stages_per_rank = 1;                ///< model chunks per pipeline rank (interleaved_1f1b: 2 or more)
  int timeout_s = 300;                    ///< collectives and the rendezvous give up after this
  std::vector<int64_t> layers_per_stage;  ///< explicit stage split; empty = balanced by layer count
  int64_t grad_bucket_mb = 25;            ///< data-parallel gradient all-reduce bucket size (0: per parameter)
  bool overlap_grad_reduce = true;        ///< reduce each bucket during the last backward, once it is final
  bool shard_optimizer = false;           ///< ZeRO-1: AdamW's state sharded over dp (dense) and edp (experts)
  bool reduce_scatter_grads = true;       ///< sharded: reduce only the rows each rank steps, where hooks allow
};

struct TrainingSection {
  int64_t steps = 0;
  int64_t seq_len = 0;
  int64_t global_batch = 0;
  uint64_t seed = 0;
  std::string dtype = "fp32";       ///< "fp32" | "bf16" (bf16 compute, fp32 master weights and optimizer)
  std::string device = "cpu";       ///< resolved: "cpu" or "cuda"
  int threads = 0;                  ///< 0 = LibTorch's default
  std::string cpu_gemm = "onednn";  ///< "onednn" | "blas": which library runs fp32 CPU matrix products
  bool flush_denormal = true;       ///< CPU: treat subnormal floats as zero (Adam's second moments
                                    ///< of tiny gradients otherwise slow every step down several-fold)
  std::string recompute = "none";   ///< "none" | "selective" | "lean" | "full": activations recomputed in backward
  double device_memory_gb = 0;      ///< per rank, for the dry run's memory plan; 0 = the GPU's, if any
};

struct OptimizerSection {
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  std::vector<std::string> no_decay;   ///< FQN globs excluded from weight decay
  std::string graph_capture = "auto";  ///< "auto" | "on" | "off": the step program as a CUDA graph
  int64_t graph_warmup = 3;            ///< eager steps before the capture
  int64_t graph_validate = 0;          ///< replays also checked against an eager run, bitwise
};

struct LrSchedulerSection {
  int64_t warmup_steps = 0;
  std::string decay = "cosine";
  double min_lr_ratio = 0.1;
};

/// One token file of a mixture ([[data.sources]]).
struct DataSourceSpec {
  std::string name;  ///< names its figures (metrics.jsonl's tokens.<name>) and validation.source
  std::string path;
  double weight = 1;
};

struct DataSection {
  std::string source = "synthetic";
  std::string path;                     ///< one token file (source = "tokens" without sources)
  std::vector<DataSourceSpec> sources;  ///< a weighted mixture of token files ([[data.sources]])
  int64_t branching = 4;
  uint64_t seed = 0;
  /// "eos" | "none" as set; "" when unset: "eos" if the source records an EOS id, else "none".
  std::string documents;
  /// "causal" | "block_causal" (a position attends only to its own document's earlier ones).
  std::string attention = "causal";
  bool reset_positions = false;  ///< RoPE positions restart at each document (block_causal only)
};

struct CheckpointSection {
  bool save_final = true;
  std::string dir;          ///< default <run_dir>/checkpoints
  int64_t interval = 0;     ///< save every N steps (and at the end, and on SIGINT/SIGTERM); 0 = off
  int64_t keep_latest = 0;  ///< keep the newest N checkpoints; 0 = all
  int64_t keep_best = 0;    ///< also keep the N evaluated checkpoints of lowest val_loss
  bool async = false;       ///< write in the background from a host-memory snapshot
  std::string load;         ///< "" (start fresh) | "latest" | a step number | a path
  bool load_model_only = false;
  std::string on_save_failure = "stop";  ///< "stop" (after the final weights, exit 1) | "continue"
};

/// Held-out evaluation during training.
struct ValidationSection {
  int64_t interval = 0;        ///< evaluate every N steps and after the last step; 0 = off
  int64_t steps = 1;           ///< batches per evaluation
  std::string data;            ///< a token file to evaluate on; "" = held out from the training source
  std::string source;          ///< with [[data.sources]]: evaluate on this source's held-out share only
  double split = 0;            ///< share of the training token file's blocks held out (0 = none)
  int64_t split_block = 8192;  ///< tokens per block of the split
  int64_t global_batch = 0;    ///< samples per evaluation batch (default: training's)
  int64_t seq_len = 0;         ///< tokens per sample (default: training's)
};

struct MetricsSection {
  int64_t log_interval = 10;
  bool jsonl = true;
  bool tensorboard = false;  ///< also TensorBoard event files in <run_dir>/tensorboard/
};

/// LibTorch's profiler over a window of steps, one Chrome trace per rank per window.
struct ProfilingSection {
  bool enable = false;
  int64_t first = 2, last = 3;  ///< the window's first and last step (steps = [FIRST, LAST])
  int64_t interval = 0;         ///< > 0: the window repeats every `interval` steps
  std::string folder;           ///< where the traces go: <run_dir>/<profiling.folder>
};

struct DebugSection {
  int64_t replica_check_interval = 0;
  std::string perturb_replicas = "none";  ///< fault injection: "none" | "before_post_init" | "after_post_init"
  bool dump_state = false;                ///< write final/state.safetensors (parameters, buffers, optimizer)
  int64_t crash_in_checkpoint = 0;        ///< fault injection: a rank dies while saving this step
  std::string crash_in_checkpoint_phase = "written";  ///< ... at this phase (SavePhase's names)
  int64_t fail_checkpoint_write = 0;                  ///< fault injection: a rank's file of this step fails to write
  int64_t fail_checkpoint_write_rank = -1;            ///< ... on this rank (-1: the last)
  int64_t fail_checkpoint_commit = 0;                 ///< fault injection: rank 0's commit of this step fails
  int64_t nan_grad_step = 0;                          ///< fault injection: a NaN gradient at this step (0 = never) ...
  int64_t nan_grad_rank = 0;                          ///< ... on this rank ...
  std::string nan_grad_param = "*";                   ///< ... in the first parameter whose FQN matches this glob
};

/// Every host-owned setting of a job.
struct JobConfig {
  JobSection job;
  ComponentChoice model;
  ComponentChoice clipper;
  ParallelismSection parallelism;
  TrainingSection training;
  OptimizerSection optimizer;
  LrSchedulerSection lr_scheduler;
  DataSection data;
  CheckpointSection checkpoint;
  ValidationSection validation;
  MetricsSection metrics;
  ProfilingSection profiling;
  DebugSection debug;
};

/// Reads and validates the host sections for a world of `world_size` ranks (0: any world, as a
/// dry run of the configured layout); training.device
/// "auto" resolves to "cuda" when `cuda_available`. Impossible values and combinations are
/// InputErrors naming the key and its position.
JobConfig read_job_config(ConfigTree& tree, int world_size, bool cuda_available);

}  // namespace keel
