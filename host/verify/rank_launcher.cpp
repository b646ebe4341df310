#include "verify/rank_launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "common/text.hpp"

extern char** environ;

namespace keel {

namespace {

// A loopback socket bound to a free port and listening, for rank 0's store to take over: no
// other process can take the port between its choice and the store's start.
int listening_socket(int& port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("verify: cannot open a socket for the ranks' rendezvous");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    throw std::runtime_error("verify: cannot bind a loopback port for the ranks' rendezvous");
  }
  port = ntohs(address.sin_port);
  return fd;
}

int exit_status(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

}  // namespace

LaunchResult launch_ranks(const std::string& program, const std::vector<std::string>& args, int world,
                          const std::string& log_prefix) {
  int port = 0;
  const int listen_fd = listening_socket(port);
  // Everything the children need is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    static const char* const ours[] = {"RANK=",
                                       "LOCAL_RANK=",
                                       "WORLD_SIZE=",
                                       "LOCAL_WORLD_SIZE=",
                                       "MASTER_ADDR=",
                                       "MASTER_PORT=",
                                       "KEEL_MASTER_LISTEN_FD=",
                                       "TORCHELASTIC_"};
    bool replaced = false;
    for (const char* prefix : ours) replaced = replaced || entry.starts_with(prefix);
    if (!replaced) base_env.push_back(entry);
  }
  std::vector<pid_t> pids(static_cast<size_t>(world), -1);
  LaunchResult result;
  result.rank0_log = log_prefix + "0.log";
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> env = base_env;
    for (const std::string& v :
         {cat("RANK=", rank), cat("LOCAL_RANK=", rank), cat("WORLD_SIZE=", world), cat("LOCAL_WORLD_SIZE=", world),
          std::string("MASTER_ADDR=127.0.0.1"), cat("MASTER_PORT=", port)})
      env.push_back(v);
    if (rank == 0) env.push_back(cat("KEEL_MASTER_LISTEN_FD=", listen_fd));
    std::vector<char*> envp, argv;
    for (std::string& v : env) envp.push_back(v.data());
    envp.push_back(nullptr);
    std::vector<std::string> argument_copy = args;
    std::string program_copy = program;
    argv.push_back(program_copy.data());
    for (std::string& a : argument_copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = cat(log_prefix, rank, ".log");
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) throw std::runtime_error(cat("verify: cannot write ", log));
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      if (rank == 0) fcntl(listen_fd, F_SETFD, 0);  // rank 0's store takes the socket over
      execve(program_copy.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(out);
    if (pid < 0) throw std::runtime_error("verify: cannot start a rank (fork failed)");
    pids[static_cast<size_t>(rank)] = pid;
  }
  close(listen_fd);
  size_t running = pids.size();
  std::chrono::steady_clock::time_point stopping{};
  bool killed = false;
  while (running > 0) {
    int wait_status = 0;
    const pid_t pid = waitpid(-1, &wait_status, WNOHANG);
    if (pid > 0) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != pid) continue;
        pids[r] = -1;
        --running;
        const int status = exit_status(wait_status);
        if (status != 0 && result.failed_rank < 0) {
          result.failed_rank = static_cast<int>(r);
          result.status = status;
          stopping = std::chrono::steady_clock::now();
          for (pid_t other : pids)
            if (other > 0) kill(other, SIGTERM);
        }
      }
      continue;
    }
    if (result.failed_rank >= 0 && !killed && std::chrono::steady_clock::now() - stopping > std::chrono::seconds(10)) {
      for (pid_t other : pids)
        if (other > 0) kill(other, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.ok = result.failed_rank < 0;
  return result;
}

}  // namespace keel
