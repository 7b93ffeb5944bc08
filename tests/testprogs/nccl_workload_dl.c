// SPDX-License-Identifier: Apache-2.0
// nccl_workload built with no link-time reference to NCCL: libnccl appears
// only when --dlopen loads it, as with frameworks that load NCCL lazily.
#define NCCL_WORKLOAD_DLOPEN_ONLY
#include "nccl_workload.c"
