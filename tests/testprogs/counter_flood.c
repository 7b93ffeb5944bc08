// SPDX-License-Identifier: Apache-2.0
// Probe target that floods the kernel's counter map: N forked children each
// call ncclAllReduce K times, every call with a (communicator, datatype) pair
// no other call uses, so each call asks for a new counter key.  Then every
// child waits for --wait-file, so its counts stay in the daemon until the test
// has read them.
//
// Call i of a child: comm = (ncclComm_t)(0x100000 + 16 * (i / 1000)),
// datatype = i % 1000 (the stub looks at neither); from call --null-comm-from
// on, comm = NULL, which the stub rejects (ncclInvalidArgument).  Prints
// "flooded pid=P calls=K" per child, then "ready children=N" once all are done.
#define _GNU_SOURCE
#include "nccl_stub.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long parse(const char *s, const char *what) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 1) {
    fprintf(stderr, "counter_flood: bad %s '%s'\n", what, s);
    exit(2);
  }
  return v;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int main(int argc, char **argv) {
  long procs = 1, keys = 70000, null_from = -1;
  const char *wait_file = NULL;
  static char buf[64];

  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--procs") && i + 1 < argc) procs = parse(argv[++i], "--procs");
    else if (!strcmp(argv[i], "--keys") && i + 1 < argc) keys = parse(argv[++i], "--keys");
    else if (!strcmp(argv[i], "--wait-file") && i + 1 < argc) wait_file = argv[++i];
    else if (!strcmp(argv[i], "--null-comm-from") && i + 1 < argc) null_from = parse(argv[++i], "--null-comm-from");
    else {
      fprintf(stderr, "usage: counter_flood [--procs N] [--keys K] [--wait-file PATH] [--null-comm-from I]\n");
      return 2;
    }
  }
  int done[2];
  if (pipe(done) != 0) return 1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (long p = 0; p < procs; p++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) continue;
    close(done[0]);
    for (long i = 0; i < keys; i++) {
      ncclComm_t comm = null_from >= 0 && i >= null_from ? NULL : (ncclComm_t)(uintptr_t)(0x100000 + 16 * (i / 1000));
      ncclAllReduce(buf, buf, 1, (ncclDataType_t)(i % 1000), ncclSum, comm, NULL);
    }
    printf("flooded pid=%d calls=%ld\n", getpid(), keys);
    (void)!write(done[1], "x", 1);
    close(done[1]);
    // Bounded: at most 5 minutes.
    for (int t = 0; wait_file && t < 30000; t++) {
      struct stat st;
      if (stat(wait_file, &st) == 0) break;
      sleep_ms(10);
    }
    _exit(0);
  }
  close(done[1]);
  char c;
  long n = 0;
  while (n < procs && read(done[0], &c, 1) == 1) n++;
  printf("ready children=%ld\n", n);
  int failed = 0, ws;
  while (wait(&ws) > 0)
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) failed++;
  return failed ? 1 : 0;
}
