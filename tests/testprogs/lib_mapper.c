// SPDX-License-Identifier: Apache-2.0
// Maps library files executable, one after another, as a process loading
// many libnccl copies does (for commdbgd's hook on new library files).
// Usage: lib_mapper [--hold MS] FILE...   prints "mapped N" after each file,
// "done" after the last, then holds the mappings MS milliseconds.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  long hold_ms = 0;
  int first = 1;
  if (argc > 2 && strcmp(argv[1], "--hold") == 0) {
    hold_ms = strtol(argv[2], NULL, 10);
    first = 3;
  }
  if (first >= argc) {
    fprintf(stderr, "usage: lib_mapper [--hold MS] FILE...\n");
    return 2;
  }
  printf("ready pid=%d\n", (int)getpid());
  fflush(stdout);
  for (int i = first; i < argc; ++i) {
    int fd = open(argv[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      fprintf(stderr, "lib_mapper: %s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    void *p = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      fprintf(stderr, "lib_mapper: mmap %s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    printf("mapped %d\n", i - first + 1);
    fflush(stdout);
  }
  printf("done\n");
  fflush(stdout);
  struct timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
  return 0;
}
