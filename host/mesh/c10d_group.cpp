#include "mesh/c10d_group.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KEEL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include "common/error.hpp"
#include "common/text.hpp"
#include "common/torch_compat.hpp"

namespace keel {

namespace {

c10d::ReduceOp to_c10d(keel_reduce_op op) {
  switch (op) {
    case KEEL_REDUCE_MAX:
      return c10d::ReduceOp::MAX;
    case KEEL_REDUCE_MIN:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;  // AVG is SUM then a division: Gloo has no AVG
  }
}

class C10dWork final : public Work {
 public:
  explicit C10dWork(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  void wait() override { work_->wait(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

// A group with Gloo for CPU tensors and, on CUDA jobs, NCCL for device tensors: each call goes
// to the backend of its tensor's device (torch.distributed's "cpu:gloo,cuda:nccl").
class C10dGroup final : public Group {
 public:
  C10dGroup(c10::intrusive_ptr<c10d::Backend> cpu, c10::intrusive_ptr<c10d::Backend> cuda, std::vector<int> members,
            int rank)
      : cpu_(std::move(cpu)), cuda_(std::move(cuda)), members_(std::move(members)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& world_ranks() const override { return members_; }

  void all_reduce(at::Tensor& tensor, keel_reduce_op op) override {
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    std::vector<at::Tensor> tensors{tensor};
    backend_for(tensor).allreduce(tensors, opts)->wait();
    if (op == KEEL_REDUCE_AVG) tensor.div_(size());
  }
  std::unique_ptr<Work> all_reduce_async(at::Tensor& tensor, keel_reduce_op op) override {
    if (op == KEEL_REDUCE_AVG) throw std::invalid_argument("all_reduce_async: AVG is not asynchronous; use SUM");
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    std::vector<at::Tensor> tensors{tensor};
    return std::make_unique<C10dWork>(backend_for(tensor).allreduce(tensors, opts));
  }
  std::unique_ptr<Work> reduce_scatter_async(at::Tensor& flat, const std::vector<int64_t>& cuts,
                                             keel_reduce_op op) override {
    if (op == KEEL_REDUCE_AVG) throw std::invalid_argument("reduce_scatter_async: AVG is not asynchronous; use SUM");
    check_scatter_cuts(flat, cuts, size());
    // The list form takes one input per member, of any length (uneven ranges), and writes
    // this member's reduced range into its output: here the input's own slice, in place.
    std::vector<at::Tensor> inputs;
    for (int j = 0; j < size(); ++j) inputs.push_back(flat.narrow(0, cuts[j], cuts[j + 1] - cuts[j]));
    std::vector<at::Tensor> outputs{inputs[static_cast<size_t>(rank_)]};
    std::vector<std::vector<at::Tensor>> input_lists{inputs};
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    return std::make_unique<C10dWork>(backend_for(flat).reduce_scatter(outputs, input_lists, opts));
  }
  void broadcast(at::Tensor& tensor, int root) override {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    std::vector<at::Tensor> tensors{tensor};
    backend_for(tensor).broadcast(tensors, opts)->wait();
  }
  void all_gather(at::Tensor& output, const at::Tensor& input) override {
    at::Tensor in = input.contiguous();
    torch_compat::all_gather_single(backend_for(output), output, in)->wait();
  }
  void reduce_scatter(at::Tensor& output, const at::Tensor& input, keel_reduce_op op) override {
    // Gloo has no reduce-scatter of one buffer: reduce the whole input, keep this member's slice.
    at::Tensor reduced = input.clone();
    all_reduce(reduced, op);
    output.copy_(reduced.chunk(size(), 0)[static_cast<size_t>(rank_)]);
  }
  void all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits) override {
    std::vector<int64_t> out_splits = output_splits, in_splits = input_splits;
    at::Tensor in = input.contiguous();
    torch_compat::all_to_all_single(backend_for(output), output, in, out_splits, in_splits)->wait();
  }
  void send(const at::Tensor& tensor, int peer, int tag) override {
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    backend_for(tensor).send(tensors, peer, tag)->wait();
  }
  void recv(at::Tensor& tensor, int peer, int tag) override {
    std::vector<at::Tensor> tensors{tensor};
    backend_for(tensor).recv(tensors, peer, tag)->wait();
  }
  std::unique_ptr<Work> isend(const at::Tensor& tensor, int peer, int tag) override {
    // The c10d work keeps the tensor alive until it completes.
    std::vector<at::Tensor> tensors{tensor.contiguous()};
    return std::make_unique<C10dWork>(backend_for(tensor).send(tensors, peer, tag));
  }
  std::unique_ptr<Work> irecv(at::Tensor& tensor, int peer, int tag) override {
    std::vector<at::Tensor> tensors{tensor};
    return std::make_unique<C10dWork>(backend_for(tensor).recv(tensors, peer, tag));
  }

 private:
  c10d::Backend& backend_for(const at::Tensor& tensor) {
    if (!tensor.is_cuda()) return *cpu_;
    if (!cuda_) throw std::invalid_argument("a CUDA tensor on a group without NCCL (training.device is not \"cuda\")");
    return *cuda_;
  }

  c10::intrusive_ptr<c10d::Backend> cpu_, cuda_;
  std::vector<int> members_;
  int rank_;
};

}  // namespace

namespace {

// The descriptor in `text` when it is a TCP socket listening on `port`; else an InputError
// naming the variable (the environment is outside input).
int listening_socket(const char* text, int port) {
  const std::string where = cat("KEEL_MASTER_LISTEN_FD='", text, "'");
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 0 || fd > std::numeric_limits<int>::max())
    throw InputError(where + " is not a file descriptor");
  int listening = 0;
  socklen_t size = sizeof(listening);
  if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || listening == 0)
    throw InputError(where + " is not a listening socket");
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw InputError(where + ": its address cannot be read");
  int bound = -1;
  if (address.ss_family == AF_INET) bound = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  if (bound != port) throw InputError(cat(where, " listens on port ", bound, ", not on MASTER_PORT ", port));
  return static_cast<int>(fd);
}

}  // namespace

Rendezvous Rendezvous::from_environment(int rank, int world_size, std::chrono::milliseconds timeout) {
  Rendezvous r;
  r.rank = rank;
  r.world_size = world_size;
  r.timeout = timeout;
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && *addr != '\0') r.master_addr = addr;
  if (const char* port = std::getenv("MASTER_PORT"); port != nullptr && *port != '\0') {
    char* end = nullptr;
    long value = std::strtol(port, &end, 10);
    if (*end != '\0' || value <= 0 || value > 65535)
      throw InputError(cat("MASTER_PORT='", port, "' is not a port number"));
    r.master_port = static_cast<int>(value);
  }
  // torchrun's elastic agent hosts the store at its MASTER_ADDR:MASTER_PORT and says so; a
  // rank 0 that tried to bind the port too would log a failed bind before falling back.
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE"); agent != nullptr)
    r.agent_store = std::string(agent) == "True";
  if (const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT"); attempt != nullptr && *attempt != '\0') {
    char* end = nullptr;
    const long value = std::strtol(attempt, &end, 10);
    if (*end != '\0' || value < 0 || value > std::numeric_limits<int>::max())
      throw InputError(cat("TORCHELASTIC_RESTART_COUNT='", attempt, "' is not a restart count"));
    r.key_prefix = cat("keel/attempt-", value, "/");
  }
  if (const char* fd = std::getenv("KEEL_MASTER_LISTEN_FD");
      rank == 0 && !r.agent_store && fd != nullptr && *fd != '\0')
    r.listen_fd = listening_socket(fd, r.master_port);
  return r;
}

struct C10dWorld::Impl {
  Rendezvous rendezvous;
  c10::intrusive_ptr<c10d::Store> store;
};

C10dWorld::C10dWorld(const Rendezvous& r) : impl_(std::make_unique<Impl>()) {
  impl_->rendezvous = r;
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(r.master_port);
  opts.isServer = r.rank == 0 && !r.agent_store;
  opts.numWorkers = r.world_size;
  opts.waitWorkers = true;
  opts.timeout = r.timeout;
  if (r.listen_fd >= 0) opts.masterListenFd = r.listen_fd;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(r.master_addr, opts);
  } catch (const c10::Error& e) {  // LibTorch's message without its C++ stack trace
    throw std::runtime_error(cat("rank ", r.rank, ": rendezvous at ", r.master_addr, ":", r.master_port,
                                 " failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw std::runtime_error(
        cat("rank ", r.rank, ": rendezvous at ", r.master_addr, ":", r.master_port, " failed: ", e.what()));
  }
}

C10dWorld::~C10dWorld() = default;

std::unique_ptr<Group> C10dWorld::make_group(const std::string& name, const std::vector<int>& members) {
  const int me = impl_->rendezvous.rank;
  auto it = std::find(members.begin(), members.end(), me);
  if (it == members.end()) throw std::invalid_argument(cat("rank ", me, " is not a member of group ", name));
  int group_rank = static_cast<int>(it - members.begin());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(impl_->rendezvous.key_prefix + name, impl_->store);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = impl_->rendezvous.timeout;
  // Loopback jobs stay on loopback; otherwise GLOO_SOCKET_IFNAME or the host's own address.
  const std::string& addr = impl_->rendezvous.master_addr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0')
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (addr == "127.0.0.1" || addr == "localhost")
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  const int size = static_cast<int>(members.size());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, group_rank, size, options);
  c10::intrusive_ptr<c10d::Backend> nccl;
  if (impl_->rendezvous.nccl) {
#ifdef KEEL_WITH_NCCL
    // No bound device, no split from another group and no coalescing: ProcessGroupNCCL then
    // gives each pair of ranks its own communicator and stream for point-to-point transfers,
    // which the pipeline's link groups rely on (pipeline/links.hpp). With a bound device it
    // would reuse the group's communicator, one stream for every peer.
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = impl_->rendezvous.timeout;
    auto nccl_store =
        c10::make_intrusive<c10d::PrefixStore>(impl_->rendezvous.key_prefix + name + "/nccl", impl_->store);
    nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, group_rank, size, nccl_options);
#else
    throw std::runtime_error("this Keel was built without NCCL: a CUDA job of several ranks cannot run");
#endif
  }
  return std::make_unique<C10dGroup>(gloo, nccl, members, group_rank);
}

}  // namespace keel
