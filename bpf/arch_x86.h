/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Everything the BPF side assumes about x86-64, in one place: how a probe
 * reads a function's integer arguments, where stack arguments start, and the
 * mmap syscall's number and register.  Another architecture needs its own
 * header with these definitions (and the userspace half, userspace/arch/arch.hpp).
 */
#ifndef COMMDBG_ARCH_X86_H
#define COMMDBG_ARCH_X86_H

#include "lib/compiler.h"

#if !defined(__TARGET_ARCH_x86)
#error "commdbg's BPF programs support x86-64 only: build on x86-64 (bpf/arch_x86.h holds what another architecture must define)"
#endif

/* System V AMD64: six integer registers, then the stack.  At a function's
 * first instruction sp points at the return address, so the first stack
 * argument is at sp + 8. */
#define CD_STACK_ARGS_OFFSET 8
CD_STATIC_ASSERT(CD_REG_SLOTS == 6, "x86-64 passes six integer arguments in registers (events.h slots)");

FUNC_INLINE void cd_read_reg_args(struct pt_regs *ctx, __u64 *args)
{
	args[0] = PT_REGS_PARM1(ctx);
	args[1] = PT_REGS_PARM2(ctx);
	args[2] = PT_REGS_PARM3(ctx);
	args[3] = PT_REGS_PARM4(ctx);
	args[4] = PT_REGS_PARM5(ctx);
	args[5] = PT_REGS_PARM6(ctx);
}

/* The calling thread's thread pointer (glibc's struct pthread, pthread_self()):
 * x86-64 keeps it in fs. */
FUNC_INLINE __u64 cd_thread_pointer(void)
{
	struct task_struct *t = bpf_get_current_task_btf();

	return t->thread.fsbase;
}

/* sys_exit: which syscall returned, and the number of mmap.  `regs` is the
 * tracepoint's BTF-typed argument: a direct load (CO-RE relocated), not a
 * bpf_probe_read_kernel call, since the program runs at every syscall exit
 * on the host. */
#define CD_NR_MMAP 9
#define CD_SYSCALL_NR(regs) ((regs)->orig_ax)

#endif /* COMMDBG_ARCH_X86_H */
