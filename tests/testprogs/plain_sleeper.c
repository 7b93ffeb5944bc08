// SPDX-License-Identifier: Apache-2.0
// Probe target that never maps libnccl: it calls no NCCL function, so with
// --as-needed linking libnccl.so.2 is not in its DT_NEEDED list.
// Usage: plain_sleeper MS  (sleeps MS milliseconds, default 1000).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  char *end = NULL;
  long ms = argc > 1 ? strtol(argv[1], &end, 10) : 1000;
  if (argc > 2 || (end && (*end || end == argv[1])) || ms < 0) {
    fprintf(stderr, "usage: plain_sleeper MS\n");
    return 2;
  }
  printf("ready pid=%d\n", (int)getpid());
  fflush(stdout);
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
  return 0;
}
