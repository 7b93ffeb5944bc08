// SPDX-License-Identifier: Apache-2.0
// The subset of the NCCL 2.28 API that commdbg traces, ABI-identical to
// /usr/local/cuda/include/nccl.h (same enum values, same struct layouts, same
// argument order), so a program built against this header runs unchanged
// against the real libnccl.so.2.  It needs no CUDA headers: the stream is a
// plain pointer, exactly what cudaStream_t (struct CUstream_st*) is in the ABI.
// Include either this header or nccl.h, never both: the typedefs would clash.
#ifndef COMMDBG_NCCL_STUB_H
#define COMMDBG_NCCL_STUB_H

#ifdef NCCL_H_
#error "nccl_stub.h mirrors nccl.h; include only one of them"
#endif

#include <limits.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_STUB_VERSION_CODE 99999 /* ncclGetVersion of the stub: tells it from real NCCL */

typedef void *ncclStubStream_t; /* ABI stand-in for cudaStream_t */

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1

// Layout of ncclConfig_v22800.
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

// Same initializer as nccl.h for 2.28.9 (version 22809), so real NCCL accepts it.
#define NCCL_CONFIG_INITIALIZER                                                \
  {                                                                            \
    sizeof(ncclConfig_t), 0xcafebeef, 22809, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,   \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,   \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,   \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,   \
        NCCL_CONFIG_UNDEF_INT                                                  \
  }

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4,
               ncclNumOps = 5, ncclMaxRedOp = 0x7fffffff } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

// Each entry point X is declared as ncclX and its profiling twin pncclX.
#define NCCL_STUB_DECL(ret, name, args) ret nccl##name args; ret pnccl##name args;

NCCL_STUB_DECL(ncclResult_t, GetVersion, (int *version))
NCCL_STUB_DECL(ncclResult_t, GetUniqueId, (ncclUniqueId *uniqueId))
NCCL_STUB_DECL(const char *, GetErrorString, (ncclResult_t result))
NCCL_STUB_DECL(ncclResult_t, CommInitRank,
               (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank))
NCCL_STUB_DECL(ncclResult_t, CommInitRankConfig,
               (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                ncclConfig_t *config))
NCCL_STUB_DECL(ncclResult_t, CommInitAll, (ncclComm_t *comm, int ndev, const int *devlist))
NCCL_STUB_DECL(ncclResult_t, CommSplit,
               (ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                ncclConfig_t *config))
NCCL_STUB_DECL(ncclResult_t, CommDestroy, (ncclComm_t comm))
NCCL_STUB_DECL(ncclResult_t, CommAbort, (ncclComm_t comm))
NCCL_STUB_DECL(ncclResult_t, CommFinalize, (ncclComm_t comm))
NCCL_STUB_DECL(ncclResult_t, CommCount, (const ncclComm_t comm, int *count))
NCCL_STUB_DECL(ncclResult_t, CommUserRank, (const ncclComm_t comm, int *rank))
NCCL_STUB_DECL(ncclResult_t, AllReduce,
               (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, AllGather,
               (const void *sendbuff, void *recvbuff, size_t sendcount,
                ncclDataType_t datatype, ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, ReduceScatter,
               (const void *sendbuff, void *recvbuff, size_t recvcount,
                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, Broadcast,
               (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, Bcast,
               (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, Reduce,
               (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, int root, ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, Send,
               (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                ncclComm_t comm, ncclStubStream_t stream))
// ncclRecv from this peer blocks for `count` ms (stub only, see stub_nccl.c).
#define NCCL_STUB_PEER_SILENT (-1000)
NCCL_STUB_DECL(ncclResult_t, Recv,
               (void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, AlltoAll,
               (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, Gather,
               (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, Scatter,
               (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, ncclStubStream_t stream))
NCCL_STUB_DECL(ncclResult_t, GroupStart, (void))
NCCL_STUB_DECL(ncclResult_t, GroupEnd, (void))

#undef NCCL_STUB_DECL

#ifdef __cplusplus
}
#endif
#endif // COMMDBG_NCCL_STUB_H
