/* A preloaded library (LD_PRELOAD) that makes a tool's writes fail or be interrupted at a
 * chosen byte, for tests of disk-full and signal handling where no small file system can be
 * mounted. KEEL_WRITE_FAULT = "ACTION:BYTES:PATH_PART": once BYTES bytes have been written
 * to files whose path contains PATH_PART, ACTION happens on the next such write:
 *   enospc   that write and every later one to such files fails with ENOSPC (a full disk);
 *   sigint   the process raises SIGINT once, then the write goes on;
 *   sigterm  the same with SIGTERM.
 * write, writev, pwrite and pwrite64 are covered: the tools' streams (libstdc++ writes large
 * blocks with writev) and checkpoint writers use them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int parsed;
static long long budget = -1; /* bytes left before the fault; -1: no fault configured */
static int fault_signal;      /* 0 for enospc */
static int fired;
static char path_part[1024];

static void parse(void) {
  parsed = 1;
  const char* spec = getenv("KEEL_WRITE_FAULT");
  if (spec == NULL) return;
  char action[16];
  long long bytes = 0;
  if (sscanf(spec, "%15[a-z]:%lld:%1023[^\n]", action, &bytes, path_part) != 3 || bytes < 0) return;
  if (strcmp(action, "sigint") == 0)
    fault_signal = SIGINT;
  else if (strcmp(action, "sigterm") == 0)
    fault_signal = SIGTERM;
  else if (strcmp(action, "enospc") != 0)
    return;
  budget = bytes;
}

/* Whether the write of `n` bytes to `fd` must fail (errno set). */
static int faulted(int fd, size_t n) {
  if (!parsed) parse();
  if (budget < 0) return 0;
  char link[64], target[4096];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t length = readlink(link, target, sizeof(target) - 1);
  if (length < 0) return 0;
  target[length] = '\0';
  if (strstr(target, path_part) == NULL) return 0;
  if ((long long)n <= budget) {
    budget -= (long long)n;
    return 0;
  }
  if (fault_signal == 0) {
    errno = ENOSPC;
    return 1;
  }
  if (!fired) {
    fired = 1;
    raise(fault_signal);
  }
  return 0;
}

ssize_t write(int fd, const void* data, size_t n) {
  static ssize_t (*real)(int, const void*, size_t);
  if (real == NULL) real = (ssize_t(*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  if (faulted(fd, n)) return -1;
  return real(fd, data, n);
}

ssize_t pwrite(int fd, const void* data, size_t n, off_t offset) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (real == NULL) real = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  if (faulted(fd, n)) return -1;
  return real(fd, data, n, offset);
}

ssize_t pwrite64(int fd, const void* data, size_t n, off_t offset) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (real == NULL) real = (ssize_t(*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
  if (faulted(fd, n)) return -1;
  return real(fd, data, n, offset);
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
  static ssize_t (*real)(int, const struct iovec*, int);
  if (real == NULL) real = (ssize_t(*)(int, const struct iovec*, int))dlsym(RTLD_NEXT, "writev");
  size_t n = 0;
  for (int i = 0; i < count; ++i) n += iov[i].iov_len;
  if (faulted(fd, n)) return -1;
  return real(fd, iov, count);
}
