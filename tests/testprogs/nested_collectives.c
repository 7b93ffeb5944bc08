// SPDX-License-Identifier: Apache-2.0
// Probe target for framework collectives that call one another, as torch's
// ProcessGroupGloo does (_allgather_base -> allgather, _reduce_scatter_base ->
// reduce_scatter_tensor_coalesced -> allreduce), without torch: the pg_*
// functions below stand for c10d methods and are probed entry-only through a
// spec naming this executable (tests/e2e/test_fsdp_counts.cpp).  Every pg_*
// takes (count, NCCL datatype) in its first two arguments.
//
// `nested_collectives ROUNDS`, each round on the main thread:
//   pg_allgather_base(256)        -> pg_allgather(256)
//   pg_reduce_scatter_base(128)   -> pg_reduce_scatter_coalesced(128) -> pg_allreduce(256)
//   pg_allreduce(64)              a sibling called from main
//   deep_sibling -> pg_allreduce(64), at a deeper stack than the calls above
//   pg_allreduce_nccl(32)         -> ncclAllReduce(32) (the stub, comm 0x1000)
//   nccl_on_its_own -> ncclAllReduce(16), inside no pg_* call
// then once pg_broadcast_waiting(8), inside which a second thread issues
// ROUNDS pg_allreduce(8): another thread's calls are not nested in it.
// Prints {"pid":P,"rounds":R} at the end.
#define _GNU_SOURCE
#include "nccl_stub.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define PG __attribute__((noipa, used))

static volatile long sink;
static pthread_barrier_t inside, done;
static long rounds;

PG int pg_allgather(long count, int dtype) {
  sink += count * 3 + dtype;
  return 0;
}

PG int pg_allreduce(long count, int dtype) {
  sink += count * 5 + dtype;
  return 0;
}

// The work after each inner call keeps the compiler from making it a tail
// call (a jump that would end the outer frame before the inner one begins).
PG int pg_allgather_base(long count, int dtype) {
  int r = pg_allgather(count, dtype);
  sink += 1;
  return r;
}

PG int pg_reduce_scatter_coalesced(long count, int dtype) {
  int r = pg_allreduce(count * 2, dtype);
  sink += 2;
  return r;
}

PG int pg_reduce_scatter_base(long count, int dtype) {
  int r = pg_reduce_scatter_coalesced(count, dtype);
  sink += 3;
  return r;
}

PG int pg_allreduce_nccl(long count, int dtype) {
  static float buf[64];
  int r = ncclAllReduce(buf, buf, (size_t)count, (ncclDataType_t)dtype, ncclSum, (ncclComm_t)0x1000, NULL);
  sink += 4;
  return r;
}

// Frames of its own below main's, so the pg_allreduce at the bottom enters
// at a lower stack pointer than the outer calls main made before it.
PG int deep_sibling(int depth, long count, int dtype) {
  volatile char pad[256];
  pad[0] = (char)depth;
  int r = depth > 0 ? deep_sibling(depth - 1, count, dtype) : pg_allreduce(count, dtype);
  sink += pad[0];
  return r;
}

// Through a function of its own, as a framework reaches NCCL: a call with a
// stack argument right after an outer call returned, from the same caller,
// would leave that call's return address in its stack slot, and the kernel
// would take the finished call for still open (events.h, cd_frame).
PG int nccl_on_its_own(long count, int dtype) {
  static float buf[16];
  int r = ncclAllReduce(buf, buf, (size_t)count, (ncclDataType_t)dtype, ncclSum, (ncclComm_t)0x1000, NULL);
  sink += 5;
  return r;
}

static void *other_thread(void *arg) {
  (void)arg;
  pthread_barrier_wait(&inside);
  for (long i = 0; i < rounds; i++) pg_allreduce(8, ncclFloat32);
  pthread_barrier_wait(&done);
  return NULL;
}

PG int pg_broadcast_waiting(long count, int dtype) {
  sink += count + dtype;
  pthread_barrier_wait(&inside);
  pthread_barrier_wait(&done);
  return 0;
}

int main(int argc, char **argv) {
  pthread_t t;

  rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 0;
  if (argc != 2 || rounds < 1) {
    fprintf(stderr, "usage: nested_collectives ROUNDS\n");
    return 2;
  }
  for (long i = 0; i < rounds; i++) {
    pg_allgather_base(256, ncclFloat32);
    pg_reduce_scatter_base(128, ncclFloat32);
    pg_allreduce(64, ncclFloat32);
    deep_sibling(8, 64, ncclFloat32);
    pg_allreduce_nccl(32, ncclFloat32);
    nccl_on_its_own(16, ncclFloat32);
  }
  pthread_barrier_init(&inside, NULL, 2);
  pthread_barrier_init(&done, NULL, 2);
  if (pthread_create(&t, NULL, other_thread, NULL) != 0) return 1;
  pg_broadcast_waiting(8, ncclFloat32);
  pthread_join(t, NULL);
  printf("{\"pid\":%d,\"rounds\":%ld}\n", (int)getpid(), rounds);
  return 0;
}
