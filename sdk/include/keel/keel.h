/*
 * keel.h — the Keel plugin ABI (C11, also valid C++).
 *
 * A Keel plugin is a shared library that exports exactly one symbol, keel_plugin_entry(),
 * returning a static descriptor. The descriptor lists components: models and gradient
 * clippers. The host (keel-train) calls components through their vtables; components call
 * the host back through the function table in keel_host_api.
 *
 * Version policy (PJRT style):
 *   - KEEL_ABI_MAJOR changes when anything is removed or changes meaning. A host refuses a
 *     plugin of another major.
 *   - KEEL_ABI_MINOR changes when something is appended. Every struct that crosses the
 *     boundary starts with `size_t struct_size`; fields are only ever appended. A sender sets
 *     struct_size to sizeof() of its own struct; a receiver checks it against the named
 *     minimum size of the version it needs (KEEL_*_SIZE_1_x below, from KEEL_STRUCT_SIZE) and
 *     never reads beyond it, so a plugin of a newer minor loads in an older host as long as
 *     what the host needs is there.
 *   - From 1.2 optional features are extensions (keel_extension, a chain hung on the
 *     component), never new fields in the core vtables.
 *   - History: 1.0: the first release. 1.1: model export (keel_export_sink and
 *     keel_model_vtable.export_state). 1.2: extensions (keel_component.extensions; export
 *     moves to KEEL_EXTENSION_MODEL_EXPORT), the thread contract, host-owned parameter records
 *     for clippers, keel_host_api.last_error. 1.3: KEEL_EXTENSION_CONFIG_KEYS (a component
 *     declares the keys of its config table). 1.4: KEEL_EXTENSION_MODEL_IMPORT (a model reads
 *     a checkpoint of another format, e.g. Hugging Face's, through keel_import_source). 1.5:
 *     keel_host_api.report_metric_ratio (a metric that is a ratio of sums, e.g. a loss weighted
 *     by its tokens over microbatches and ranks). 1.6: KEEL_EXTENSION_MODEL_RECOMPUTE (a
 *     model recomputes activations in backward instead of keeping them; keel/recompute.hpp)
 *     and KEEL_EXTENSION_MODEL_MEMORY (a model estimates the activations a forward keeps).
 *     1.7: KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY (a model's pre_clip reads only REPLICA copies and
 *     their owners) and KEEL_EXTENSION_CLIPPER_SHARDS (a clipper clips reduce-scattered
 *     gradients: each rank holds the reduced rows it steps). 1.8: nothing new crosses the
 *     boundary; the helper keel::StageReplicas keeps a REPLICA that sits beside its owner
 *     on one rank (the V of parallelism.schedule = "zbv"), and the host runs zbv only with
 *     model plugins of 1.8 or newer. 1.9: KEEL_EXTENSION_MODEL_ATTENTION (document masking:
 *     keel_forward_inputs.documents and .positions).
 *
 * Ownership and lifetime:
 *   - Every pointer handed across the boundary is borrowed for the duration of the call unless
 *     its comment says otherwise.
 *   - Plugins are never unloaded while the process lives.
 *   - keel_tensor is a borrowed pointer to a LibTorch at::Tensor of the same LibTorch the host
 *     runs (the descriptor records the version; the host refuses a mismatch). Autograd is
 *     intact across the boundary.
 *
 * Errors: every call returns keel_status (KEEL_OK = 0). A component that fails reports its
 * message with host->api->set_error(host, code, message) and returns the same code.
 *
 * Call sequence (one rank; "the train thread" is the thread that created the component):
 *
 *   keel_plugin_entry()                                   once per plugin and process
 *   model.create -> model.info; clipper.create            config only; no groups yet
 *   -- the host joins the other ranks: groups exist from here on --
 *   model.build_part (each part of this rank) -> parameters, buffers (each part)
 *   model.init_weights (each part), or the host copies a checkpoint into the tensors
 *   model.post_init                                       [collective: world]
 *   clipper.bind_model_parts (host-owned records, in clip() order)
 *   clipper.state                                         the host may copy a checkpoint in
 *   every step:
 *     model.forward x microbatches (each part, in the pipeline schedule's order); the host runs
 *       backward (autograd; on CUDA on autograd's device threads, see [any-thread])
 *     the host's data-parallel gradient reduction
 *     model.pre_clip -> clipper.clip -> the host's non-finite check and AdamW
 *       (replayed as one CUDA graph when every hook there is capture-safe)
 *     model.post_step
 *   extensions (e.g. export) when a tool asks; the model may have built no parts; import_config
 *     (before model.create) then import_state when keel-ckpt import asks
 *   clipper.destroy, model.destroy
 *
 * Contract tags, at the end of each function's comment:
 *   [once]                 called once per object
 *   [every step]           called once per optimizer step
 *   [every microbatch]     called once per microbatch of a step
 *   [collective: G]        every rank of group G calls it, in the same order
 *   [capture-safe]         may run inside CUDA graph capture when the component declares it
 *                          (see KEEL_HOOK_*_CAPTURE_SAFE): no host synchronisation, no
 *                          allocation that changes between steps, no host branch on device data
 *   [setup]                only during setup (before the first step)
 *   [export]               only while the host's export_state() call is in progress
 *   [train-thread]         component functions: arrives on the train thread. Host functions:
 *                          call it from the train thread only
 *   [any-thread]           host functions: safe from any thread, concurrently too; autograd's
 *                          backward threads (a custom autograd function's backward calling a
 *                          collective) included. An error is recorded for the calling thread
 *
 * A complete clipper on the raw ABI (C++ for the tensor maths; keel.hpp makes it shorter). It
 * clamps every gradient to [-0.01, 0.01] and reports the local L2 norm of the logical
 * gradients (a real clipper also sums over the PP group, as norm_clipper does). The build
 * compiles this very text as a plugin and trains with it (tests/CMakeLists.txt):
 *
 *   #include <ATen/ATen.h>
 *   #include <torch/headeronly/version.h>
 *   #include <keel/keel.h>
 *   static keel_host* g_host;
 *   static keel_status create(keel_host* host, const keel_config*, keel_clipper** out) {
 *     g_host = host;
 *     *out = reinterpret_cast<keel_clipper*>(&g_host);
 *     return KEEL_OK;
 *   }
 *   static void destroy(keel_clipper*) {}
 *   static keel_status clip(keel_clipper*, const keel_param_info* const* params, size_t n,
 *                           keel_tensor* total_norm) {
 *     try {
 *       at::Tensor sq = at::zeros({}, at::kFloat);
 *       for (size_t i = 0; i < n; ++i) {
 *         at::Tensor grad = reinterpret_cast<at::Tensor*>(params[i]->tensor)->grad();
 *         if (!grad.defined()) continue;
 *         sq = sq.to(grad.device());
 *         if (!(params[i]->flags & KEEL_PARAM_REPLICA)) sq = sq + grad.to(at::kFloat).square().sum();
 *         grad.clamp_(-0.01, 0.01);
 *       }
 *       *reinterpret_cast<at::Tensor*>(total_norm) = sq.sqrt();
 *       return KEEL_OK;
 *     } catch (const std::exception& e) {
 *       g_host->api->set_error(g_host, KEEL_ERROR_RUNTIME, e.what());
 *       return KEEL_ERROR_RUNTIME;
 *     }
 *   }
 *   static const keel_clipper_vtable vtable = {sizeof(keel_clipper_vtable), create, destroy,
 *                                              NULL, clip, NULL, 0};
 *   static const keel_component clipper = {sizeof(keel_component), KEEL_COMPONENT_CLIPPER,
 *                                          "clamp", "clamps gradients", &vtable, NULL};
 *   static const keel_component* const components[] = {&clipper};
 *   extern "C" KEEL_EXPORT const keel_plugin_descriptor* keel_plugin_entry(void) {
 *     static const keel_plugin_descriptor d = {sizeof(d), KEEL_ABI_MAJOR, KEEL_ABI_MINOR, "clamp",
 *                                              "1.0.0", TORCH_VERSION, _GLIBCXX_USE_CXX11_ABI,
 *                                              components, 1};
 *     return &d;
 *   }
 */
#ifndef KEEL_KEEL_H
#define KEEL_KEEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions and basics */

#define KEEL_ABI_MAJOR 1
#define KEEL_ABI_MINOR 9

/* The size of struct T up to and including `last_field`: the minimum struct_size a receiver
 * needs when it reads fields up to that one (sizeof(T) may add trailing padding). */
#define KEEL_STRUCT_SIZE(T, last_field) (offsetof(T, last_field) + sizeof(((T*)0)->last_field))

#if defined(_WIN32)
#define KEEL_EXPORT __declspec(dllexport)
#else
#define KEEL_EXPORT __attribute__((visibility("default")))
#endif

typedef int32_t keel_status;
enum {
  KEEL_OK = 0,
  KEEL_ERROR_INVALID_ARGUMENT = 1, /* a caller passed something impossible */
  KEEL_ERROR_CONFIG = 2,           /* a configuration value is missing, mistyped or impossible */
  KEEL_ERROR_RUNTIME = 3,          /* a failure while running (numerics, I/O, collectives) */
  KEEL_ERROR_UNSUPPORTED = 4,      /* the request is valid but this component cannot do it */
  KEEL_ERROR_INTERNAL = 5          /* a bug: an exception escaped or an invariant broke */
};

/* Opaque handles. */
typedef struct keel_tensor keel_tensor;   /* a borrowed at::Tensor*                      */
typedef struct keel_group keel_group;     /* a process group of the mesh, owned by host  */
typedef struct keel_work keel_work;       /* an in-flight collective, owned by host      */
typedef struct keel_config keel_config;   /* a component's config table, owned by host   */
typedef struct keel_host keel_host;       /* the host context                            */
typedef struct keel_model keel_model;     /* a model instance, owned by the plugin       */
typedef struct keel_part keel_part;       /* one pipeline part of a model, plugin-owned  */
typedef struct keel_clipper keel_clipper; /* a clipper instance, owned by the plugin     */

/* ---------------------------------------------------------------- the mesh */

typedef enum keel_group_kind {
  KEEL_GROUP_WORLD = 0, /* every rank                                                   */
  KEEL_GROUP_PP = 1,    /* the stages of this rank's data-parallel replica              */
  KEEL_GROUP_DP = 2,    /* the data-parallel replicas of this rank's stage              */
  KEEL_GROUP_EP = 3,    /* the expert-parallel ranks that shard this rank's experts     */
  KEEL_GROUP_EDP = 4    /* the ranks holding the same expert shard (dp / ep of them)    */
} keel_group_kind;

/* This rank's place in the mesh. world = pp * dp; rank = pp_index * dp + dp_index;
 * ep divides dp; ep_index = dp_index % ep; edp = dp / ep; edp_index = dp_index / ep. */
typedef struct keel_mesh_info {
  size_t struct_size;
  int32_t rank, world_size;
  int32_t pp, dp, ep, edp;
  int32_t pp_index, dp_index, ep_index, edp_index;
} keel_mesh_info;

typedef enum keel_reduce_op {
  KEEL_REDUCE_SUM = 0,
  KEEL_REDUCE_AVG = 1,
  KEEL_REDUCE_MAX = 2,
  KEEL_REDUCE_MIN = 3
} keel_reduce_op;

/* ---------------------------------------------------------------- devices and dtypes */

typedef enum keel_device_type { KEEL_DEVICE_CPU = 0, KEEL_DEVICE_CUDA = 1, KEEL_DEVICE_META = 2 } keel_device_type;

typedef enum keel_dtype { KEEL_DTYPE_FP32 = 0, KEEL_DTYPE_BF16 = 1, KEEL_DTYPE_FP16 = 2 } keel_dtype;

/* ---------------------------------------------------------------- metrics and logging */

typedef enum keel_log_level {
  KEEL_LOG_DEBUG = 0,
  KEEL_LOG_INFO = 1,
  KEEL_LOG_WARN = 2,
  KEEL_LOG_ERROR = 3
} keel_log_level;

/* How repeated reports of one metric within one step combine. */
typedef enum keel_metric_reduce {
  KEEL_METRIC_MEAN = 0,
  KEEL_METRIC_SUM = 1,
  KEEL_METRIC_MAX = 2,
  KEEL_METRIC_LAST = 3
} keel_metric_reduce;

/* ---------------------------------------------------------------- the host API */

/* The functions a component may call. Received in keel_host->api; check struct_size against
 * KEEL_HOST_API_SIZE_1_2 before calling last_error and KEEL_HOST_API_SIZE_1_5 before calling
 * report_metric_ratio (the functions appended since 1.0). */
typedef struct keel_host_api {
  size_t struct_size;

  /* Writes one log line prefixed with the rank and component name. [any-thread] */
  void (*log)(keel_host* host, keel_log_level level, const char* message);
  /* Records the error of the call in progress on this thread; return the same code from that
   * call. [any-thread] */
  void (*set_error)(keel_host* host, keel_status code, const char* message);

  /* Fills this rank's mesh coordinates. [any-thread] */
  keel_status (*mesh_info)(keel_host* host, keel_mesh_info* out);
  /* Returns the group of that kind for this rank; owned by the host for the process life.
   * Groups exist from build_part() on: the host joins the other ranks only after every
   * component was created, so create() may read mesh_info() but gets NULL here. [any-thread] */
  keel_group* (*group)(keel_host* host, keel_group_kind kind);
  /* Creates a sub-group of the given world ranks (sorted, distinct). Every rank of the world
   * calls it with the same rank lists in the same order; ranks not in the list receive NULL.
   * [setup][collective: world][train-thread] */
  keel_status (*new_group)(keel_host* host, const int32_t* world_ranks, size_t count, keel_group** out);
  /* This rank's index within the group, or -1 if it is not a member. [any-thread] */
  int32_t (*group_rank)(keel_host* host, const keel_group* group);
  /* Number of ranks in the group. [any-thread] */
  int32_t (*group_size)(keel_host* host, const keel_group* group);

  /* Collectives on tensors. Every collective is [collective: group]. When `work` is NULL the
   * call returns once the result is ready on the tensor's stream; otherwise *work receives a
   * handle to pass to wait() exactly once (NULL when the operation already completed), and the
   * tensors must stay alive and untouched until then. all_reduce (SUM, MAX, MIN), send and recv
   * run asynchronously; the others complete before returning. On CUDA they run on the current
   * stream and are capture-safe. Every collective is [any-thread]: a rank's calls on one group
   * must still reach the group in the same order on every rank. */

  /* In-place reduction of `tensor` over the group. */
  keel_status (*all_reduce)(keel_host* host, keel_group* group, keel_tensor* tensor, keel_reduce_op op,
                            keel_work** work);
  /* In-place broadcast of `tensor` from the member with group rank `root`. */
  keel_status (*broadcast)(keel_host* host, keel_group* group, keel_tensor* tensor, int32_t root, keel_work** work);
  /* Gathers every member's `input` into `output` (group_size × input along dim 0). */
  keel_status (*all_gather)(keel_host* host, keel_group* group, keel_tensor* output, const keel_tensor* input,
                            keel_work** work);
  /* Reduces `input` (group_size × output along dim 0) and scatters the slices to `output`. */
  keel_status (*reduce_scatter)(keel_host* host, keel_group* group, keel_tensor* output, const keel_tensor* input,
                                keel_reduce_op op, keel_work** work);
  /* Exchanges dim-0 slices: `input_splits[i]` rows go to member i, `output_splits[i]` rows
   * arrive from it; both arrays have group_size entries. */
  keel_status (*all_to_all)(keel_host* host, keel_group* group, keel_tensor* output, const keel_tensor* input,
                            const int64_t* output_splits, const int64_t* input_splits, keel_work** work);
  /* Sends `tensor` to the member with group rank `peer`. [collective: peer pair]
   * Tags keep transfers apart on Gloo only: on CUDA, NCCL pairs a pair of ranks' transfers on
   * one group in issue order and runs them in that order, each blocking until its peer's
   * counterpart runs. Issue them in the same order on both ranks, and put transfers that must
   * be in flight both ways at once on two groups. */
  keel_status (*send)(keel_host* host, keel_group* group, const keel_tensor* tensor, int32_t peer, int32_t tag,
                      keel_work** work);
  /* Receives into `tensor` from the member with group rank `peer`. [collective: peer pair] */
  keel_status (*recv)(keel_host* host, keel_group* group, keel_tensor* tensor, int32_t peer, int32_t tag,
                      keel_work** work);
  /* Waits for and releases an in-flight collective; the handle is invalid afterwards, also
   * when the wait fails. NULL is a no-op. */
  keel_status (*wait)(keel_host* host, keel_work* work);

  /* Reports a named scalar for this step: `value` is a 0-dim tensor (a device tensor is fine;
   * the host reads it lazily, never inside a step). [capture-safe: no][any-thread] */
  keel_status (*report_metric)(keel_host* host, const char* name, const keel_tensor* value, keel_metric_reduce reduce);

  /* Typed access to the component's own config table ([clipper.<component>], or the role
   * table [clipper] in the flat form). Each getter marks the key as read; after create() the
   * host reports every unread key as an error, naming file and line. A component declaring
   * KEEL_EXTENSION_CONFIG_KEYS reads only what it declares, as declared.
   * `found` (may be NULL) says whether the key was present; absent keys yield `fallback`.
   * A present key of the wrong type is an error naming the key and its position.
   * [train-thread] for all five config functions. */
  keel_status (*config_int)(keel_host* host, const keel_config* config, const char* key, int64_t fallback, int64_t* out,
                            int32_t* found);
  keel_status (*config_float)(keel_host* host, const keel_config* config, const char* key, double fallback, double* out,
                              int32_t* found);
  keel_status (*config_bool)(keel_host* host, const keel_config* config, const char* key, int32_t fallback,
                             int32_t* out, int32_t* found);
  /* The returned string lives as long as the config. */
  keel_status (*config_string)(keel_host* host, const keel_config* config, const char* key, const char* fallback,
                               const char** out, int32_t* found);
  /* Reports that `key` holds an impossible value; the host formats "file:line: key: why". */
  keel_status (*config_invalid)(keel_host* host, const keel_config* config, const char* key, const char* why);

  /* ---- appended in 1.2 */

  /* The message of the last failed host call made on this thread for this component (what
   * the host recorded with its status), or NULL when there is none. The string lives until
   * the next host call on this thread. Lets code that cannot return a status (a custom
   * autograd backward) rethrow the host's message. [any-thread] */
  const char* (*last_error)(keel_host* host);

  /* ---- appended in 1.5 */

  /* Reports a named ratio for this step: the step's value is the sum of every `numerator`
   * reported under `name` in the step, on every rank, over the sum of every `denominator`
   * (NaN when that is 0) — e.g. a loss sum over its token count, so that the figure is
   * weighted by tokens across microbatches and data-parallel ranks. Both are one-element
   * tensors (device tensors are fine; read lazily). A name is reported either as a ratio or
   * with report_metric within one step, not both. [capture-safe: no][any-thread] */
  keel_status (*report_metric_ratio)(keel_host* host, const char* name, const keel_tensor* numerator,
                                     const keel_tensor* denominator);
} keel_host_api;

struct keel_host {
  size_t struct_size;
  const keel_host_api* api;
};

#define KEEL_HOST_SIZE_1_0 KEEL_STRUCT_SIZE(keel_host, api)
#define KEEL_HOST_API_SIZE_1_0 KEEL_STRUCT_SIZE(keel_host_api, config_invalid)
#define KEEL_HOST_API_SIZE_1_2 KEEL_STRUCT_SIZE(keel_host_api, last_error)
#define KEEL_HOST_API_SIZE_1_5 KEEL_STRUCT_SIZE(keel_host_api, report_metric_ratio)
#define KEEL_MESH_INFO_SIZE_1_0 KEEL_STRUCT_SIZE(keel_mesh_info, edp_index)

/* ---------------------------------------------------------------- parameters */

enum {
  /* A physical copy of a logical parameter owned by another part (or rank). Excluded from
   * norms and from checkpoints' writers; kept bitwise equal to its owner by the model. */
  KEEL_PARAM_REPLICA = 1u << 0,
  /* Sharded over the ep group: the tensor is this rank's slice of the global tensor. */
  KEEL_PARAM_EXPERT = 1u << 1,
  /* A buffer that is saved in checkpoints (e.g. an expert bias). Only for buffers(). */
  KEEL_PARAM_PERSISTENT = 1u << 2
};

/* One parameter or buffer of a part. A model's records are owned by its part and valid while
 * the part lives. A clipper receives the host's own records instead: built by the host from
 * the models' (struct_size this host's, every 1.0 field filled, module_group never NULL),
 * valid until the clipper is destroyed. */
typedef struct keel_param_info {
  size_t struct_size;
  /* Canonical fully qualified name: the same whatever the layout ("layers.3.attn.wq.weight"). */
  const char* fqn;
  keel_tensor* tensor;
  uint32_t flags;
  /* Placement in the global tensor: shard_dim = -1 when the tensor is the whole parameter;
   * otherwise this tensor is global[offset : offset + size(shard_dim)] along shard_dim, and
   * the global tensor has global_dim_size elements along it. */
  int32_t shard_dim;
  int64_t shard_offset;
  int64_t global_dim_size;
  /* Fraction of this parameter used by one token (top_k / n_experts for routed experts, 1
   * otherwise): the host's "activated parameters" figure. */
  double active_fraction;
  /* Which module group the parameter counts under in reports ("main", "mtp"). NULL = "main". */
  const char* module_group;
} keel_param_info;

/* A named tensor of a component's state (clipper state, model-level buffers). */
typedef struct keel_named_tensor {
  size_t struct_size;
  const char* name;
  keel_tensor* tensor;
} keel_named_tensor;

#define KEEL_PARAM_INFO_SIZE_1_0 KEEL_STRUCT_SIZE(keel_param_info, module_group)
#define KEEL_NAMED_TENSOR_SIZE_1_0 KEEL_STRUCT_SIZE(keel_named_tensor, tensor)

/* ---------------------------------------------------------------- model */

/* What the host needs to know of a model before building parts. */
typedef struct keel_model_info {
  size_t struct_size;
  int64_t vocab_size;
  /* Number of pipeline-splittable layers (transformer blocks); stages take contiguous runs. */
  int32_t num_layers;
  /* Elements per token of the activation passed between stages (the hidden size). */
  int64_t hidden_size;
} keel_model_info;

/* The part to build: which layers, where, and on which device. */
typedef struct keel_part_spec {
  size_t struct_size;
  int32_t stage_index; /* 0 .. num_stages-1                                             */
  int32_t num_stages;
  int32_t first_layer; /* global index of this part's first layer                        */
  int32_t num_layers;  /* number of consecutive layers in this part (may be 0)           */
  keel_device_type device_type;
  int32_t device_index;
  keel_dtype param_dtype;   /* master weights                                              */
  keel_dtype compute_dtype; /* activations                                                 */
} keel_part_spec;

/* Inputs of one forward of one part for one microbatch. */
typedef struct keel_forward_inputs {
  size_t struct_size;
  /* [batch, seq] int64 token ids; given to every stage. */
  const keel_tensor* tokens;
  /* [batch, seq] int64 next-token labels (labels[t] = token t+1; KEEL_IGNORE_INDEX where there
   * is none); given to every stage. */
  const keel_tensor* labels;
  /* [batch, seq, hidden] activation from the previous stage; NULL on the first stage. */
  const keel_tensor* activation;
  int32_t microbatch;
  int32_t num_microbatches;

  /* ---- appended in 1.9 (KEEL_EXTENSION_MODEL_ATTENTION); check struct_size first */

  /* [batch, seq] int64 on the part's device: the document of each position within its sample
   * (0 for the first, +1 after each EOS; an EOS belongs to the document it ends). Set only
   * after set_attention() asked for KEEL_ATTENTION_BLOCK_CAUSAL; NULL otherwise. */
  const keel_tensor* documents;
  /* [batch, seq] int64 on the part's device: the RoPE position of each token, counted from 0
   * at each document start. Set only under KEEL_ATTENTION_RESET_POSITIONS; NULL otherwise
   * (positions are 0 .. seq-1). */
  const keel_tensor* positions;
} keel_forward_inputs;

#define KEEL_IGNORE_INDEX (-100)

/* Outputs of one forward; the tensors are host-owned slots the part assigns to. */
typedef struct keel_forward_outputs {
  size_t struct_size;
  /* Non-last stages: the activation for the next stage (autograd attached). */
  keel_tensor* activation;
  /* Last stage: 0-dim fp32 sum of the per-token loss over this microbatch (autograd attached).
   * The host divides by the step's global count of labelled tokens. */
  keel_tensor* loss_sum;
} keel_forward_outputs;

#define KEEL_MODEL_INFO_SIZE_1_0 KEEL_STRUCT_SIZE(keel_model_info, hidden_size)
#define KEEL_PART_SPEC_SIZE_1_0 KEEL_STRUCT_SIZE(keel_part_spec, compute_dtype)
#define KEEL_FORWARD_INPUTS_SIZE_1_0 KEEL_STRUCT_SIZE(keel_forward_inputs, num_microbatches)
#define KEEL_FORWARD_INPUTS_SIZE_1_9 KEEL_STRUCT_SIZE(keel_forward_inputs, positions)
#define KEEL_FORWARD_OUTPUTS_SIZE_1_0 KEEL_STRUCT_SIZE(keel_forward_outputs, loss_sum)

enum {
  KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE = 1u << 0,
  KEEL_HOOK_CLIP_CAPTURE_SAFE = 1u << 1,
  /* (1.7) pre_clip reads and writes only the gradients of REPLICA copies and of their owners;
   * the host may then reduce-scatter every other gradient (only the rows a rank's optimizer
   * steps are reduced there). Without it, a model with pre_clip sees every gradient whole. */
  KEEL_HOOK_PRE_CLIP_REPLICAS_ONLY = 1u << 2
};

/* Where export_state() hands what it produces (since 1.1). Host-owned, borrowed for the call.
 * Each callback takes what it receives before returning (the host keeps its own reference to
 * the tensor or writes it out), so the model may drop its handles afterwards; it must not
 * modify a tensor it handed over. A failing callback has already reported its error: return
 * its status from export_state(). */
typedef struct keel_export_sink {
  size_t struct_size;
  void* context; /* the host's; pass it back unchanged                                   */
  /* Receives one tensor under its name in the target format (e.g.
   * "model.layers.0.self_attn.q_proj.weight"); a name given twice is an error. [export] */
  keel_status (*tensor)(void* context, const char* name, const keel_tensor* value);
  /* Receives one text file of the export (e.g. "config.json"): a plain file name, no
   * folders. [export] */
  keel_status (*file)(void* context, const char* name, const char* text);
} keel_export_sink;

#define KEEL_EXPORT_SINK_SIZE_1_1 KEEL_STRUCT_SIZE(keel_export_sink, file)

/* Every function of the model and clipper vtables is [train-thread]. */
typedef struct keel_model_vtable {
  size_t struct_size;
  /* Creates a model from its config table alone. Required. [once] */
  keel_status (*create)(keel_host* host, const keel_config* config, keel_model** out);
  /* Destroys the model and every part it built. NULL-safe. Required. [once] */
  void (*destroy)(keel_model* model);
  /* Describes the model (vocab, layer count, hidden size). Required. [once] */
  keel_status (*info)(keel_model* model, keel_model_info* out);
  /* Builds the modules of one pipeline part; on KEEL_DEVICE_META nothing is allocated.
   * The part is owned by the model. Required. [once per part] */
  keel_status (*build_part)(keel_model* model, const keel_part_spec* spec, keel_part** out);
  /* Lists the part's trainable parameters; the array and entries live as long as the part.
   * Required. [once per part] */
  keel_status (*parameters)(keel_part* part, const keel_param_info* const** out, size_t* count);
  /* Lists the part's buffers (flag KEEL_PARAM_PERSISTENT for those that are checkpointed).
   * Required. [once per part] */
  keel_status (*buffers)(keel_part* part, const keel_param_info* const** out, size_t* count);
  /* Initialises the part's parameters and buffers deterministically and independently of the
   * layout: each tensor (each expert slice) from a generator seeded by (seed, FQN[, expert]).
   * Required. [once per part] */
  keel_status (*init_weights)(keel_part* part, uint64_t seed);
  /* Runs one microbatch through the part. Required. [every microbatch] */
  keel_status (*forward)(keel_part* part, const keel_forward_inputs* inputs, keel_forward_outputs* outputs);
  /* After weights are initialised or loaded: synchronise replicas from their owners.
   * Optional. [once][collective: world] */
  keel_status (*post_init)(keel_model* model);
  /* After the host's data-parallel gradient reduction, before clipping: finalise shared
   * gradients (sum replica gradients with their owners'). Optional.
   * [every step][collective: world][capture-safe if KEEL_HOOK_PRE_CLIP_CAPTURE_SAFE] */
  keel_status (*pre_clip)(keel_model* model);
  /* After the optimizer step (e.g. an expert-bias update). Optional. [every step][collective: world] */
  keel_status (*post_step)(keel_model* model);
  /* KEEL_HOOK_* flags declaring which step hooks are capture-safe. */
  uint32_t hook_flags;

  /* ---- appended in 1.1; the vtable grows no more: later features are extensions */

  /* Deprecated in 1.2: a 1.2 plugin leaves it NULL and offers keel_model_export_extension
   * (same signature and contract), which a host prefers when both are there.
   * Exports the model's consolidated state (every logical parameter and persistent buffer
   * under its canonical FQN, whole, on the CPU; read-only) in another format; `format` "hf" is
   * Hugging Face transformers: the model hands each exported tensor and file (config.json) to
   * `sink`. May be called on a model that built no parts. Optional (NULL: the model cannot be
   * exported); an unknown format is KEEL_ERROR_UNSUPPORTED. [once] */
  keel_status (*export_state)(keel_model* model, const char* format, const keel_named_tensor* const* state,
                              size_t count, const keel_export_sink* sink);
} keel_model_vtable;

#define KEEL_MODEL_VTABLE_SIZE_1_0 KEEL_STRUCT_SIZE(keel_model_vtable, hook_flags)
#define KEEL_MODEL_VTABLE_SIZE_1_1 KEEL_STRUCT_SIZE(keel_model_vtable, export_state)

/* ---------------------------------------------------------------- clipper */

typedef struct keel_clipper_vtable {
  size_t struct_size;
  /* Creates a clipper from its config table alone (max_norm, norm type, ...). Required. [once] */
  keel_status (*create)(keel_host* host, const keel_config* config, keel_clipper** out);
  /* Destroys the clipper. NULL-safe. Required. [once] */
  void (*destroy)(keel_clipper* clipper);
  /* Receives every parameter of every part this rank holds, once, before the first step:
   * host-owned records (see keel_param_info), never a model plugin's. clip() later receives
   * this very array (same pointers, same order) every step, so a clipper may sort the
   * parameters here into static lists and ignore clip()'s arguments.
   * Optional (NULL = no-op). [once][setup] */
  keel_status (*bind_model_parts)(keel_clipper* clipper, const keel_param_info* const* params, size_t count);
  /* Clips the gradients of `params` in place and writes the total norm (a 0-dim fp32 tensor
   * on the parameters' device) into the host-owned slot `total_norm`. Never synchronises
   * with the host. Required.
   * [every step][collective: world][capture-safe if KEEL_HOOK_CLIP_CAPTURE_SAFE] */
  keel_status (*clip)(keel_clipper* clipper, const keel_param_info* const* params, size_t count,
                      keel_tensor* total_norm);
  /* Lists the clipper's state tensors (saved in checkpoints under the clipper's name; the
   * host loads by copying into them). Optional (NULL = stateless). [once] */
  keel_status (*state)(keel_clipper* clipper, const keel_named_tensor* const** out, size_t* count);
  /* KEEL_HOOK_CLIP_CAPTURE_SAFE when clip() is capture-safe. */
  uint32_t hook_flags;
} keel_clipper_vtable;

#define KEEL_CLIPPER_VTABLE_SIZE_1_0 KEEL_STRUCT_SIZE(keel_clipper_vtable, hook_flags)

/* ---------------------------------------------------------------- extensions (since 1.2) */

/* Optional features of a component, as a static chain (PJRT's extension chain): each
 * extension struct begins with this header. A host walks a component's chain once, at load,
 * skips types it does not know (a newer plugin's), refuses a chain that repeats a type or
 * runs longer than KEEL_MAX_EXTENSIONS, and reads nothing of an extension beyond its
 * struct_size. New optional features are new types, never new vtable fields. */
typedef struct keel_extension {
  size_t struct_size;                /* of the whole extension struct (header included) */
  int32_t type;                      /* a KEEL_EXTENSION_* value                         */
  const struct keel_extension* next; /* NULL ends the chain                              */
} keel_extension;

#define KEEL_MAX_EXTENSIONS 64

enum {
  KEEL_EXTENSION_MODEL_EXPORT = 1,    /* keel_model_export_extension, on a MODEL component     */
  KEEL_EXTENSION_CONFIG_KEYS = 2,     /* keel_config_keys_extension, on any component (1.3)    */
  KEEL_EXTENSION_MODEL_IMPORT = 3,    /* keel_model_import_extension, on a MODEL component (1.4) */
  KEEL_EXTENSION_MODEL_RECOMPUTE = 4, /* keel_model_recompute_extension, on a MODEL component (1.6) */
  KEEL_EXTENSION_MODEL_MEMORY = 5,    /* keel_model_memory_extension, on a MODEL component (1.6)    */
  KEEL_EXTENSION_CLIPPER_SHARDS = 6,  /* keel_clipper_shards_extension, on a CLIPPER component (1.7) */
  KEEL_EXTENSION_MODEL_ATTENTION = 7  /* keel_model_attention_extension, on a MODEL component (1.9) */
};

/* Model export (the 1.1 vtable field export_state, as an extension). */
typedef struct keel_model_export_extension {
  keel_extension base; /* type = KEEL_EXTENSION_MODEL_EXPORT                                */
  /* The formats understood, comma-separated ("hf"), for listings. */
  const char* formats;
  /* Exports the model's consolidated state (every logical parameter and persistent buffer
   * under its canonical FQN, whole, on the CPU; read-only) in `format`: the model hands each
   * exported tensor and file (e.g. config.json) to `sink`. May be called on a model that built
   * no parts; an unknown format is KEEL_ERROR_UNSUPPORTED. [once][train-thread] */
  keel_status (*export_state)(keel_model* model, const char* format, const keel_named_tensor* const* state,
                              size_t count, const keel_export_sink* sink);
} keel_model_export_extension;

#define KEEL_EXTENSION_SIZE_1_2 KEEL_STRUCT_SIZE(keel_extension, next)
#define KEEL_MODEL_EXPORT_EXTENSION_SIZE_1_2 KEEL_STRUCT_SIZE(keel_model_export_extension, export_state)

/* The getter a config key is read with. */
typedef enum keel_config_type {
  KEEL_CONFIG_INT = 1,   /* config_int    */
  KEEL_CONFIG_FLOAT = 2, /* config_float  */
  KEEL_CONFIG_BOOL = 3,  /* config_bool   */
  KEEL_CONFIG_STRING = 4 /* config_string */
} keel_config_type;

/* One key of a component's config table. */
typedef struct keel_config_key {
  size_t struct_size;
  const char* name; /* [a-z0-9_]+, at most 64 bytes, unique, not "plugin" or "component"     */
  int32_t type;     /* a keel_config_type                                                    */
  /* The default as a TOML value of `type` ("1.0", "\"2\"", "true"; finite, and an integer
   * inside int64's ends): the `fallback` the component passes when it reads the key. NULL
   * when the default is not fixed (a model's size that comes from its flavor). */
  const char* default_value;
  const char* doc; /* one line for listings (at most KEEL_MAX_CONFIG_DOC bytes), or NULL        */
} keel_config_key;

/* The keys a component reads from its config table (static, like the descriptor). A user sees
 * them with `keel-plugin inspect` before writing the table, and the host names them when a
 * table holds a key the component does not read. The host holds the component to the list: a
 * read of an undeclared key, with another getter, or with a fallback other than a fixed
 * default_value fails (KEEL_ERROR_INTERNAL), so the listing cannot drift from the code. */
typedef struct keel_config_keys_extension {
  keel_extension base; /* type = KEEL_EXTENSION_CONFIG_KEYS                                   */
  const keel_config_key* const* keys;
  size_t count; /* at most KEEL_MAX_CONFIG_KEYS                                               */
} keel_config_keys_extension;

#define KEEL_MAX_CONFIG_KEYS 1024
#define KEEL_MAX_CONFIG_DOC 400
#define KEEL_CONFIG_KEY_SIZE_1_3 KEEL_STRUCT_SIZE(keel_config_key, doc)
#define KEEL_CONFIG_KEYS_EXTENSION_SIZE_1_3 KEEL_STRUCT_SIZE(keel_config_keys_extension, count)

/* A checkpoint of another format as the host reads it (1.4): its config (e.g. Hugging Face's
 * config.json) and its tensors. Host-owned, borrowed for the call it is passed to; every
 * callback reports a failure with a message naming the file and the value (host last_error). */
typedef struct keel_import_source {
  size_t struct_size;
  void* context; /* the host's; pass it back unchanged                                   */
  /* Reads the config value at `path` (object keys joined by '.', array items by index:
   * "hidden_size", "rope_scaling.factor", "architectures.0") as `type` into `out`: an int64_t,
   * a double (an integer is accepted), an int32_t 0/1, or a const char* (valid until the
   * import call returns). *found is 0 (and `out` untouched) when the value is absent or null;
   * another type is KEEL_ERROR_INVALID_ARGUMENT. */
  keel_status (*config_get)(void* context, const char* path, int32_t type, void* out, int32_t* found);
  /* 1 when the source holds tensor `name`, else 0. */
  int32_t (*has_tensor)(void* context, const char* name);
  /* The tensor `name` as stored (CPU, its own dtype and shape, read-only; valid until the
   * import call returns), or KEEL_ERROR_INVALID_ARGUMENT naming it when absent. A tensor the
   * source holds that is never read fails the import (an unknown tensor name). */
  keel_status (*read_tensor)(void* context, const char* name, const keel_tensor** out);
  /* Where tensor `name` is stored (a file name, for messages; valid until the import call
   * returns), or NULL when absent. */
  const char* (*origin)(void* context, const char* name);
} keel_import_source;

#define KEEL_IMPORT_SOURCE_SIZE_1_4 KEEL_STRUCT_SIZE(keel_import_source, origin)

/* Where import_config writes the component's config table: one call per key. */
typedef struct keel_config_sink {
  size_t struct_size;
  void* context; /* the host's; pass it back unchanged                                   */
  /* Sets `key` (a declared config key of the component) to `value`, a TOML value ("64",
   * "1e-06", "true", "\"sigmoid\""); a key set twice is an error. */
  keel_status (*set)(void* context, const char* key, const char* value);
} keel_config_sink;

#define KEEL_CONFIG_SINK_SIZE_1_4 KEEL_STRUCT_SIZE(keel_config_sink, set)

/* Model import (1.4): the inverse of export. */
typedef struct keel_model_import_extension {
  keel_extension base; /* type = KEEL_EXTENSION_MODEL_IMPORT                                */
  /* The formats understood, comma-separated ("hf"), for listings. */
  const char* formats;
  /* Translates the source's config into the keys of this component's config table (the
   * shapes), before any model exists; refuses a config it cannot represent with
   * KEEL_ERROR_UNSUPPORTED naming the field. An unknown format is KEEL_ERROR_UNSUPPORTED.
   * [once][train-thread] */
  keel_status (*import_config)(keel_host* host, const char* format, const keel_import_source* source,
                               const keel_config_sink* sink);
  /* On a model created from that table (it may have built no parts): hands `sink` every
   * parameter and persistent buffer under its canonical FQN, whole, on the CPU, one at a time
   * (the host writes each out before the next, so the import never holds the whole model).
   * Refuses a tensor whose shape disagrees with the config, naming it. [once][train-thread] */
  keel_status (*import_state)(keel_model* model, const char* format, const keel_import_source* source,
                              const keel_export_sink* sink);
} keel_model_import_extension;

#define KEEL_MODEL_IMPORT_EXTENSION_SIZE_1_4 KEEL_STRUCT_SIZE(keel_model_import_extension, import_state)

/* What a model recomputes in backward instead of keeping from forward (1.6). */
typedef enum keel_recompute_mode {
  KEEL_RECOMPUTE_NONE = 0,      /* keep every activation autograd saves                          */
  KEEL_RECOMPUTE_FULL = 1,      /* keep each transformer block's inputs; rerun the block         */
  KEEL_RECOMPUTE_SELECTIVE = 2, /* keep matrix-product outputs; rerun attention's scores, softmax
                                 * and value product and the element-wise parts                  */
  KEEL_RECOMPUTE_LEAN = 3       /* keep block inputs and the residual stream between sub-layers;
                                 * rerun each sub-layer, norm and residual included (an MoE keeps
                                 * its normed input and routed rows). Declared by its bit like
                                 * any mode: no struct changes with it                           */
} keel_recompute_mode;

/* Activation recomputation (1.6). The host asks for a mode only when the job sets
 * training.recompute, and refuses the job, naming the model, when the mode is not in `modes`.
 * A recomputed run must be bitwise the run that keeps everything: the same forward computed
 * again (keel/recompute.hpp does it for C++ plugins: random state, autocast, and side effects
 * such as statistics kept to the first run). */
typedef struct keel_model_recompute_extension {
  keel_extension base; /* type = KEEL_EXTENSION_MODEL_RECOMPUTE                             */
  /* The modes implemented, as bits: (1u << KEEL_RECOMPUTE_FULL) | (1u << KEEL_RECOMPUTE_SELECTIVE)
   * | ...; a mode added later is asked for only of a model that declares its bit. */
  uint32_t modes;
  /* Sets the mode of the parts built after it: called before build_part, with a mode listed
   * in `modes`. [once][setup][train-thread] */
  keel_status (*set_recompute)(keel_model* model, int32_t mode);
} keel_model_recompute_extension;

#define KEEL_MODEL_RECOMPUTE_EXTENSION_SIZE_1_6 KEEL_STRUCT_SIZE(keel_model_recompute_extension, set_recompute)

/* The activation memory of a model's parts (1.6), for the host's memory plan (--dry-run): the
 * host multiplies by the microbatches its schedule holds in flight on each stage. */
typedef struct keel_model_memory_extension {
  keel_extension base; /* type = KEEL_EXTENSION_MODEL_MEMORY                                */
  /* Stores in *bytes an estimate of what one forward of the part `spec` describes keeps until
   * its backward, for a [batch, seq] microbatch under recompute `mode` (NONE or a mode of the
   * recompute extension): the tensors autograd saves and the part's output. Needs no part built;
   * reads the model's config and mesh only; spec's device is the training one, never META. [setup][train-thread] */
  keel_status (*activation_bytes)(keel_model* model, const keel_part_spec* spec, int64_t batch, int64_t seq,
                                  int32_t mode, int64_t* bytes);
} keel_model_memory_extension;

#define KEEL_MODEL_MEMORY_EXTENSION_SIZE_1_6 KEEL_STRUCT_SIZE(keel_model_memory_extension, activation_bytes)

/* Clipping reduce-scattered gradients (1.7). With the optimizer state sharded over dp/edp, the
 * host may reduce each gradient bucket only into the rows the rank steps: the rest of a
 * gradient then holds this rank's unreduced partial sums, which a clipper must neither count
 * nor scale. A clipper offering this extension is told which rows are its own; one without it
 * keeps every gradient whole (all-reduced). */
typedef struct keel_clipper_shards_extension {
  keel_extension base; /* type = KEEL_EXTENSION_CLIPPER_SHARDS                               */
  /* Called after bind_model_parts, before the first step: from then on clip() counts and
   * scales only the `count` views `owned`, owned[i] a flat view into the gradient of the host
   * record owners[i]: the reduced rows this rank's optimizer steps (REPLICA copies included).
   * No gradient element is in two ranks' views, so a norm is a sum (or max) over the whole
   * world, REPLICA rows still left out by their record's flag. Both arrays live as long as
   * the clipper. [once][setup] */
  keel_status (*bind_gradient_shards)(keel_clipper* clipper, const keel_param_info* const* owners,
                                      keel_tensor* const* owned, size_t count);
} keel_clipper_shards_extension;

#define KEEL_CLIPPER_SHARDS_EXTENSION_SIZE_1_7 KEEL_STRUCT_SIZE(keel_clipper_shards_extension, bind_gradient_shards)

/* Document masking (1.9), for data.attention = "block_causal": a position attends only to the
 * earlier positions of its own document in a packed sample, and (data.reset_positions) RoPE
 * counts positions from each document start. */
enum {
  KEEL_ATTENTION_BLOCK_CAUSAL = 1u << 0,   /* forward inputs carry `documents`                */
  KEEL_ATTENTION_RESET_POSITIONS = 1u << 1 /* forward inputs carry `positions` (with the above) */
};

typedef struct keel_model_attention_extension {
  keel_extension base; /* type = KEEL_EXTENSION_MODEL_ATTENTION                             */
  /* The KEEL_ATTENTION_* flags the model honours. */
  uint32_t supported;
  /* Sets the flags (a subset of `supported`, never 0) of the parts built after it: called
   * before build_part. From then on every forward's inputs carry the tensors they name.
   * [once][setup][train-thread] */
  keel_status (*set_attention)(keel_model* model, uint32_t flags);
} keel_model_attention_extension;

#define KEEL_MODEL_ATTENTION_EXTENSION_SIZE_1_9 KEEL_STRUCT_SIZE(keel_model_attention_extension, set_attention)

/* ---------------------------------------------------------------- the descriptor */

typedef enum keel_component_kind { KEEL_COMPONENT_MODEL = 1, KEEL_COMPONENT_CLIPPER = 2 } keel_component_kind;

typedef struct keel_component {
  size_t struct_size;
  keel_component_kind kind;
  const char* name; /* [a-z0-9_]+, unique within the plugin */
  const char* description;
  /* keel_model_vtable* for MODEL, keel_clipper_vtable* for CLIPPER. */
  const void* vtable;

  /* ---- appended in 1.2 */

  /* The component's extensions, or NULL. Static, like the descriptor. */
  const keel_extension* extensions;
} keel_component;

#define KEEL_COMPONENT_SIZE_1_0 KEEL_STRUCT_SIZE(keel_component, vtable)
#define KEEL_COMPONENT_SIZE_1_2 KEEL_STRUCT_SIZE(keel_component, extensions)

typedef struct keel_plugin_descriptor {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* plugin_name;
  const char* plugin_version;
  /* The LibTorch the plugin was built against ("2.15.0") and its _GLIBCXX_USE_CXX11_ABI. */
  const char* torch_version;
  int32_t cxx11_abi;
  const keel_component* const* components;
  size_t num_components;
} keel_plugin_descriptor;

#define KEEL_PLUGIN_DESCRIPTOR_SIZE_1_0 KEEL_STRUCT_SIZE(keel_plugin_descriptor, num_components)

/* The plugin's one exported symbol; returns a descriptor with static storage. [once] */
typedef const keel_plugin_descriptor* (*keel_plugin_entry_fn)(void);
#define KEEL_PLUGIN_ENTRY_SYMBOL "keel_plugin_entry"

#ifdef __cplusplus
}
#endif

#endif /* KEEL_KEEL_H */
