/* Preloaded into mps-server for a benchmark: on SIGRTMIN+7 a thread writes its own return
 * addresses to $STACKDUMP_DIR/<tid> (glibc's backtrace, which unwinds through libcuda's
 * .eh_frame). `stackdump <pid>` signals every thread of a process. The addresses are resolved
 * afterwards against the saved /proc/<pid>/maps and the binaries' symbols (resolve.py). */
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char dir[256];

static void put(int fd, const char *s) { (void)!write(fd, s, strlen(s)); }

static void hex(int fd, unsigned long v) {
  char b[20];
  int i = 19;
  b[i--] = '\n';
  do { b[i--] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
  b[i--] = 'x';
  b[i] = '0';
  (void)!write(fd, b + i, 20 - i);
}

/* open, write and the unwinder (preloaded below) only: no allocation. */
static void on_dump(int sig) {
  (void)sig;
  void *frames[96];
  int n = backtrace(frames, 96);
  char path[300];
  long tid = syscall(SYS_gettid);
  char num[24];
  int i = 23;
  num[i] = 0;
  do { num[--i] = '0' + tid % 10; tid /= 10; } while (tid);
  strcpy(path, dir);
  strcat(path, "/");
  strcat(path, num + i);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  put(fd, "--\n");
  for (int k = 0; k < n; k++) hex(fd, (unsigned long)frames[k]);
  close(fd);
}

__attribute__((constructor)) static void init(void) {
  const char *d = getenv("STACKDUMP_DIR");
  if (!d || strlen(d) >= sizeof dir - 30) return;
  strcpy(dir, d);
  void *warm[4];
  backtrace(warm, 4); /* loads libgcc_s now, not in a handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_dump;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGRTMIN + 7, &sa, NULL);
}

#ifdef STACKDUMP_MAIN
/* stackdump <pid>: every thread of <pid> writes its stack once. */
int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: stackdump <pid>\n"); return 2; }
  int pid = atoi(argv[1]);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (!d) { perror(path); return 1; }
  struct dirent *e;
  int sent = 0;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' && syscall(SYS_tgkill, pid, atoi(e->d_name), SIGRTMIN + 7) == 0) sent++;
  closedir(d);
  printf("signalled %d threads\n", sent);
  return 0;
}
#endif
