/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * New code in a process, caught before it runs: a loader change or an exec
 * of a traced process (a session), or a library file commdbgd probes
 * (libnccl, libtorch_cpu) mapped that is not probed yet.  The process is
 * stopped with SIGSTOP where asked, and resumed by userspace once it has probed what was mapped (a watchdog
 * does it if userspace dies).  The signal goes first: a SIGCONT can then
 * never precede the stop it is meant to end.
 */
#ifndef COMMDBG_LIB_LOADER_H
#define COMMDBG_LIB_LOADER_H

#include "lib/config.h"
#include "lib/drops.h"
#include "lib/process.h"
#include "lib/ringbuf.h"
#include "arch_x86.h"

#define SIGSTOP 19
#define VM_EXEC 0x4

/* Library files already probed, (kernel dev, inode): mapping one needs no stop. */
struct file_key {
	__u64 dev;
	__u64 ino;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct file_key);
	__type(value, __u32);
} known_files SEC(".maps");

/* Real uids (not root) that hold their share of known_files (commdbgd,
 * daemon/node/files.hpp): a new library file of theirs is neither stopped
 * for nor probed, so one user cannot fill the map and leave every other
 * user's processes stopped at each start. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} capped_uids SEC(".maps");

/* Set by commdbgd: the users other than root together hold their share of
 * known_files; and, at shutdown, stop no process at all any more (nothing
 * would attach to its file; the hook's link goes next). */
volatile __u32 others_capped = 0;
volatile __u32 stop_on_new_file = 1;

/* tgids stopped by on_mmap_file and not resumed yet: the daemon's guard
 * process holds this map and resumes them if the daemon dies. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} stopped_pids SEC(".maps");

/* A traced process's loader changed (`kind`: CD_EV_DL_CHANGE) or it exec'ed
 * (CD_EV_EXEC): userspace is told, and with CD_TRACE_DL_STOP the thread
 * waits stopped for it. */
FUNC_INLINE void note_new_code(__u32 kind)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 *flags = bpf_map_lookup_elem(&traced, &tgid);
	struct cd_dl_change *e;
	__u32 stopped = 0;

	if (!flags)
		return;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		/* no event, so nobody would resume it: do not stop */
		count_drop(CD_DROP_DL_EVENT);
		return;
	}
	if ((*flags & CD_TRACE_DL_STOP) && bpf_send_signal_thread(SIGSTOP) == 0)
		stopped = 1;
	fill_header(&e->h, kind, sizeof(*e), CD_TAIL_NONE, 0, tgid, (__u32)pid_tgid, bpf_ktime_get_ns());
	e->stopped = stopped;
	e->uid = (__u32)bpf_get_current_uid_gid();
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP); /* the thread waits for it */
}

/* The file names (their beginnings) commdbgd probes: its specs' libraries,
 * "libnccl.so" and "libtorch_cpu.so" (not NCCL's net/tuner/profiler plugins,
 * libnccl-*).  Set by userspace before the load (BpfOptions); unset: libnccl's. */
const volatile char file_prefix[CD_FILE_PREFIXES][CD_FILE_PREFIX_MAX] = {"libnccl.so"};
const volatile __u32 file_prefix_len[CD_FILE_PREFIXES] = {10};

/* An executable mapping of such a file, and its (dev, inode). */
struct vma_match {
	struct file_key k;
	int hit;
};

FUNC_INLINE bool probed_file_name(const char *name)
{
	for (__u32 i = 0; i < CD_FILE_PREFIXES; i++) {
		__u32 n = file_prefix_len[i], j;

		if (n == 0 || n > CD_FILE_PREFIX_MAX)
			continue;
		for (j = 0; j < CD_FILE_PREFIX_MAX; j++)
			if (j >= n || name[j] != file_prefix[i][j])
				break;
		if (j == n)
			return true;
	}
	return false;
}

FUNC_CALLBACK long check_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_match *m = data;
	char name[CD_FILE_PREFIX_MAX + 1] = {};
	struct file *f;

	if (!(BPF_CORE_READ(vma, vm_flags) & VM_EXEC))
		return 0;
	f = BPF_CORE_READ(vma, vm_file);
	if (!f)
		return 0;
	if (bpf_probe_read_kernel_str(name, sizeof(name), BPF_CORE_READ(f, f_path.dentry, d_name.name)) < 0)
		return 0;
	if (!probed_file_name(name))
		return 0;
	m->k.dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	m->k.ino = BPF_CORE_READ(f, f_inode, i_ino);
	m->hit = 1;
	return 0;
}

/*
 * A stop that could not be sent is tried again at the thread's next system
 * call exit, before it can run far (the loader makes many more before any
 * library code runs).  bpf_send_signal_thread fails with -EBUSY when this
 * CPU's signal work is still pending: two processes stopped on one CPU at
 * once, as when the ranks of a job start together.  Without the retry such
 * a rank ran free while its file was attached and its first calls were not
 * counted.  By thread: (file, tries); CD_STOP_TRIES tries in all.
 */

struct stop_retry {
	struct file_key k;
	__u32 tries;
	__u32 uid;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct stop_retry);
} stop_retries SEC(".maps");

/* How many stop_retries entries there may be: every system call exit looks
 * in the map only while it is not 0. */
volatile __u32 stop_retries_pending = 0;

/* Fault injection for the tests (commdbgd's COMMDBG_TEST_FAILED_STOPS): the
 * first so many stops are taken as refused by the kernel. */
const volatile __u32 test_failed_stops = 0;
volatile __u32 test_stops_failed = 0;

FUNC_INLINE long send_stop(void)
{
	if (test_failed_stops && test_stops_failed < test_failed_stops) {
		__sync_fetch_and_add(&test_stops_failed, 1);
		return -16; /* -EBUSY */
	}
	return bpf_send_signal_thread(SIGSTOP);
}

/* Stops the thread for file `k` and tells userspace; `r`: the tries so far.
 * A refused stop is kept for a retry while tries are left, else userspace
 * is told the process runs on (its calls until the file is probed are not
 * counted: CD_DROP_STOP_REFUSED). */
FUNC_INLINE void stop_and_tell(struct stop_retry *r)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct cd_dl_change *e;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(CD_DROP_DL_EVENT);
		return;
	}
	e->stopped = send_stop() == 0;
	if (!e->stopped && ++r->tries < CD_STOP_TRIES &&
	    bpf_map_update_elem(&stop_retries, &tid, r, BPF_ANY) == 0) {
		__sync_fetch_and_add(&stop_retries_pending, 1);
		bpf_ringbuf_discard(e, 0);
		return;
	}
	if (e->stopped) {
		__u32 one = 1;

		bpf_map_update_elem(&stopped_pids, &tgid, &one, BPF_ANY);
	} else {
		count_drop(CD_DROP_STOP_REFUSED);
	}
	fill_header(&e->h, CD_EV_DL_CHANGE, sizeof(*e), CD_TAIL_NONE, 0, tgid, tid, bpf_ktime_get_ns());
	e->uid = r->uid;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP); /* the process waits for it */
}

/* A stop kept for this thread: tried again unless its file was probed
 * meanwhile.  True when it was (stopped, kept again, or given up and told):
 * the scan that follows sees every file the process maps. */
FUNC_INLINE bool retry_stop(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct stop_retry *p = bpf_map_lookup_elem(&stop_retries, &tid), r;

	if (!p)
		return false;
	r = *p;
	if (bpf_map_delete_elem(&stop_retries, &tid) == 0)
		__sync_fetch_and_add(&stop_retries_pending, -1);
	if (bpf_map_lookup_elem(&known_files, &r.k))
		return false; /* probed meanwhile: this call's own mapping is looked at */
	stop_and_tell(&r);
	return true;
}

/* At an mmap's return (`ret`: the address mapped): such a file not yet
 * in known_files stops the process until commdbgd has probed it, unless
 * its user holds their share of probed files. */
FUNC_INLINE void stop_for_new_file(struct pt_regs *regs, long ret)
{
	struct vma_match m = {};
	struct stop_retry r = {};

	if (!count_all || !stop_on_new_file)
		return;
	if (stop_retries_pending && retry_stop())
		return;
	if (CD_SYSCALL_NR(regs) != CD_NR_MMAP || (unsigned long)ret >= (unsigned long)-4095L)
		return;
	bpf_find_vma(bpf_get_current_task_btf(), (__u64)ret, check_vma, &m, 0);
	if (!m.hit || bpf_map_lookup_elem(&known_files, &m.k) || !in_scope())
		return;
	r.uid = (__u32)bpf_get_current_uid_gid();
	if (r.uid != 0 && (others_capped || bpf_map_lookup_elem(&capped_uids, &r.uid))) {
		count_drop(CD_DROP_FILE_SHARE);
		return;
	}
	r.k = m.k;
	stop_and_tell(&r);
}

/* A thread that exits keeps no stop for its tid's next owner. */
FUNC_INLINE void forget_stop_retry(__u32 tid)
{
	if (stop_retries_pending && bpf_map_delete_elem(&stop_retries, &tid) == 0)
		__sync_fetch_and_add(&stop_retries_pending, -1);
}

#endif /* COMMDBG_LIB_LOADER_H */
