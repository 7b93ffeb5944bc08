/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Bytes per element of an ncclDataType_t, shared by the BPF program (bytes
 * counters) and the unit test that ties it to userspace's table in
 * userspace/capture/nccl.cpp: the two must never disagree on a size.
 */
#ifndef COMMDBG_NCCL_DTYPE_H
#define COMMDBG_NCCL_DTYPE_H

#ifdef __bpf__
/* vmlinux.h provides __u32 / __u64 */
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#define CD_DTYPE_INLINE static __always_inline
#else
#include <linux/types.h>
#define CD_DTYPE_INLINE static inline
#endif

/* ncclDataType_t (nccl.h 2.28) -> bytes per element; 0 for values NCCL does
 * not define.  A switch, not a table: clang 14 leaves a static const table
 * in a .rodata that libbpf cannot size. */
CD_DTYPE_INLINE __u64 dtype_size(__u32 dtype)
{
	switch (dtype) {
	case 0: case 1: case 10: case 11: /* int8 uint8 fp8e4m3 fp8e5m2 */
		return 1;
	case 6: case 9: /* float16 bfloat16 */
		return 2;
	case 2: case 3: case 7: /* int32 uint32 float32 */
		return 4;
	case 4: case 5: case 8: /* int64 uint64 float64 */
		return 8;
	default:
		return 0;
	}
}

#undef CD_DTYPE_INLINE

#endif /* COMMDBG_NCCL_DTYPE_H */
