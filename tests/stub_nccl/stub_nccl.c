// SPDX-License-Identifier: Apache-2.0
// libnccl.so.2 double: the real soname, the real signatures and the real
// symbol shape (pncclX is the strong definition, ncclX a weak alias at the
// same address, as in NCCL 2.28), so probes attach to it exactly as to real
// NCCL and every test also runs where NCCL is absent.
// Collectives never dereference the communicator (the workload may pass the
// fake pointer 0x1000); only the Comm* management calls read it.
#include "nccl_stub.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ncclComm {
  int nranks;
  int rank;
  uint64_t id;     // commHash of the unique id, or derived for a split
  unsigned splits; // how many splits of this comm so far
};

// Every entry point bumps this, so each one is a real out-of-line function
// with a body the compiler cannot drop or fold into another.
static volatile uint64_t stub_calls;
static __thread int group_depth; // ncclGroupStart nesting, per thread as in NCCL

// The nop comes first on purpose: x86 uprobes refuse lock-prefixed
// instructions, and real NCCL entry points start with a push or endbr64.
static inline __attribute__((always_inline)) void touch(void) {
  __asm__ volatile("nop" ::: "memory");
  __atomic_fetch_add(&stub_calls, 1, __ATOMIC_RELAXED);
}

// Defines pnccl<name>; nccl<name> is a weak alias of it.
#define STUB_API(ret, name, args)                                              \
  __attribute__((visibility("default"), weak, alias("pnccl" #name)))          \
  ret nccl##name args;                                                         \
  __attribute__((visibility("default"))) ret pnccl##name args

// NCCL's commHash: DJB2a over the 128 id bytes, each as a signed char.
static uint64_t comm_hash(const ncclUniqueId *id) {
  uint64_t h = 5381;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    h = (h * 33) ^ (uint64_t)(int64_t)id->internal[i];
  return h;
}

static ncclComm_t comm_new(int nranks, int rank, uint64_t id) {
  ncclComm_t c = calloc(1, sizeof(*c));
  if (c) {
    c->nranks = nranks;
    c->rank = rank;
    c->id = id;
  }
  return c;
}

STUB_API(ncclResult_t, GetVersion, (int *version)) {
  touch();
  if (!version) return ncclInvalidArgument;
  *version = NCCL_STUB_VERSION_CODE;
  return ncclSuccess;
}

STUB_API(ncclResult_t, GetUniqueId, (ncclUniqueId *uniqueId)) {
  touch();
  if (!uniqueId) return ncclInvalidArgument;
  uint64_t seed = ((uint64_t)getpid() << 32) ^ stub_calls;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    uniqueId->internal[i] = (char)(seed >> ((i % 8) * 8)) ^ (char)i;
  return ncclSuccess;
}

STUB_API(const char *, GetErrorString, (ncclResult_t result)) {
  touch();
  switch (result) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

STUB_API(ncclResult_t, CommInitRankConfig,
         (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
          ncclConfig_t *config)) {
  touch();
  (void)config;
  if (!comm) return ncclInvalidArgument;
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *comm = comm_new(nranks, rank, comm_hash(&commId));
  return *comm ? ncclSuccess : ncclSystemError;
}

STUB_API(ncclResult_t, CommInitRank,
         (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)) {
  touch();
  if (!comm) return ncclInvalidArgument;
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  *comm = comm_new(nranks, rank, comm_hash(&commId));
  return *comm ? ncclSuccess : ncclSystemError;
}

STUB_API(ncclResult_t, CommInitAll, (ncclComm_t *comm, int ndev, const int *devlist)) {
  touch();
  (void)devlist;
  if (!comm || ndev < 1) return ncclInvalidArgument;
  uint64_t id = ((uint64_t)getpid() << 32) ^ stub_calls;
  for (int i = 0; i < ndev; i++) {
    comm[i] = comm_new(ndev, i, id);
    if (!comm[i]) return ncclSystemError;
  }
  return ncclSuccess;
}

STUB_API(ncclResult_t, CommSplit,
         (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)) {
  touch();
  (void)config;
  if (!comm || !newcomm) return ncclInvalidArgument;
  unsigned nth = comm->splits++;
  *newcomm = NULL;
  if (color < 0) return ncclSuccess; // NCCL_SPLIT_NOCOLOR: this rank joins no child
  // A stub has no peers: the child holds this rank alone, ordered by key.
  (void)key;
  uint64_t id = (comm->id * 33) ^ ((uint64_t)(unsigned)color << 32) ^ nth;
  *newcomm = comm_new(1, 0, id);
  return *newcomm ? ncclSuccess : ncclSystemError;
}

STUB_API(ncclResult_t, CommDestroy, (ncclComm_t comm)) {
  touch();
  free(comm);
  return ncclSuccess;
}

STUB_API(ncclResult_t, CommAbort, (ncclComm_t comm)) {
  touch();
  free(comm);
  return ncclSuccess;
}

STUB_API(ncclResult_t, CommFinalize, (ncclComm_t comm)) {
  touch();
  return comm ? ncclSuccess : ncclInvalidArgument;
}

STUB_API(ncclResult_t, CommCount, (const ncclComm_t comm, int *count)) {
  touch();
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

STUB_API(ncclResult_t, CommUserRank, (const ncclComm_t comm, int *rank)) {
  touch();
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

// Fault injection for tests: NCCL_STUB_FAIL_CALL=N makes the process's Nth
// collective or point-to-point call (counted from 1 over all threads) return
// ncclRemoteError, as real NCCL does once a peer has failed.
static uint64_t fail_call;
static uint64_t enqueued;

__attribute__((constructor)) static void read_fail_call(void) {
  const char *v = getenv("NCCL_STUB_FAIL_CALL");
  fail_call = v ? strtoull(v, NULL, 10) : 0;
}

// Collectives and p2p: argument check only, like an enqueue that fails fast.
// Inlined even under -fno-inline so each entry point has its own body and
// ret rather than a bare tail jump.
static inline __attribute__((always_inline)) ncclResult_t enqueue(ncclComm_t comm) {
  touch();
  if (!comm) return ncclInvalidArgument;
  if (fail_call && __atomic_add_fetch(&enqueued, 1, __ATOMIC_RELAXED) == fail_call) return ncclRemoteError;
  return ncclSuccess;
}

STUB_API(ncclResult_t, AllReduce,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclRedOp_t op, ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, AllGather,
         (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
          ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)sendcount, (void)datatype, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, ReduceScatter,
         (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
          ncclRedOp_t op, ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)recvcount, (void)datatype, (void)op, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Broadcast,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          int root, ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Bcast,
         (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
          ncclStubStream_t stream)) {
  (void)buff, (void)count, (void)datatype, (void)root, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Reduce,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclRedOp_t op, int root, ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op, (void)root,
      (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Send,
         (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
          ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)count, (void)datatype, (void)peer, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Recv,
         (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
          ncclStubStream_t stream)) {
  (void)recvbuff, (void)datatype, (void)stream;
  // Stub only: a peer that never sends (NCCL_STUB_PEER_SILENT) keeps the
  // caller in the call for `count` milliseconds, as a rank waiting on a
  // missing peer would be (tests of calls still in flight).
  if (peer == NCCL_STUB_PEER_SILENT) usleep((useconds_t)(count * 1000));
  return enqueue(comm);
}

STUB_API(ncclResult_t, AlltoAll,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Gather,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          int root, ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, Scatter,
         (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
          int root, ncclComm_t comm, ncclStubStream_t stream)) {
  (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
  return enqueue(comm);
}

STUB_API(ncclResult_t, GroupStart, (void)) {
  touch();
  group_depth++;
  return ncclSuccess;
}

STUB_API(ncclResult_t, GroupEnd, (void)) {
  touch();
  if (group_depth == 0) return ncclInvalidUsage; // as NCCL: not in a group
  group_depth--;
  return ncclSuccess;
}
