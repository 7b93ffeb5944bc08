/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * How the BPF side's helpers are compiled, named once.  Every header under
 * bpf/lib and bpf/python assumes vmlinux.h and libbpf's headers are included
 * first (commdbg.bpf.c does), and all of them make one translation unit.
 */
#ifndef COMMDBG_LIB_COMPILER_H
#define COMMDBG_LIB_COMPILER_H

/* The default: inlined into its caller, where the verifier knows the
 * caller's constants and bounds. */
#define FUNC_INLINE static __always_inline

/* A global function: the verifier checks it once, on its own, knowing its
 * arguments by type only, instead of once per path of every caller that
 * reaches it.  For a loop that inlined would be verified again on each of
 * call_enter's paths; the caller cannot see the bound of its result. */
#define FUNC_GLOBAL __noinline

/* A callback of bpf_loop or bpf_find_vma: its address is taken, so it is
 * never inlined; the verifier checks it at each helper call. */
#define FUNC_CALLBACK static

#endif /* COMMDBG_LIB_COMPILER_H */
