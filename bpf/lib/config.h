/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * What userspace sets before load (`const volatile`: the verifier sees
 * constants), the session's on/off switch, and the cgroup that scopes
 * commdbgd's count-all mode.
 */
#ifndef COMMDBG_LIB_CONFIG_H
#define COMMDBG_LIB_CONFIG_H

#include "events.h"
#include "lib/compiler.h"

/* Set before load by commdbgd: count every process that calls a probed
 * symbol (within the scope cgroup when scope_cgroup is set), not only those
 * in `traced`; and stop a process mapping a libnccl file not yet probed. */
const volatile __u32 count_all = 0;
/* The CD_TRACE_* flags count-all mode gives a process it adopts: counting,
 * and the flight recorder unless commdbgd runs with --no-flight-recorder. */
const volatile __u32 count_all_flags = CD_TRACE_COUNT | CD_TRACE_FLIGHT;
const volatile __u32 scope_cgroup = 0;
/* Fine counter keys one process may hold (events.h, cd_proc_counts): set by
 * userspace before load (limits.hpp); this value is only a placeholder. */
const volatile __u32 fine_keys_per_process = 8192;
/* A record wakes the consumer only once the ring buffer holds this many
 * bytes: a wake-up per record cost more than the record (the consumer, just
 * drained, went back to sleep each time).  Userspace polls with a timeout
 * and reads what is there, so the last records of a quiet process come
 * within one poll interval.  Events that userspace must act on at once
 * (loader changes, forks, exits) always wake it. */
const volatile __u64 wakeup_bytes = 0;

/* Set by userspace (mmap'ed .bss) once every link of a session is attached,
 * cleared before the first is detached: the kernel arms the functions of a
 * uprobe_multi link one after another, so without it each symbol's window
 * would open at another instant.  Calls count and record only while set. */
volatile __u32 armed = 0;

/* The cgroup count-all mode is limited to (index 0), when scope_cgroup. */
struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} scope SEC(".maps");

FUNC_INLINE int in_scope(void)
{
	return !scope_cgroup || bpf_current_task_under_cgroup(&scope, 0) == 1;
}

#endif /* COMMDBG_LIB_CONFIG_H */
