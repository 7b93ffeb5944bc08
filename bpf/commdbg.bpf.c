// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * commdbg kernel side: capture and emit, no policy.  The programs only; each
 * map lives with its accessors in a header of lib/ or python/, and all of
 * them make this one translation unit.
 *
 * call_enter / call_exit are attached as uprobe_multi links, one per (probe
 * spec, library file); the cookie (events.h) says which symbol fired and which
 * argument slot holds what.  Exact counters (lib/counters.h) never depend on
 * ring-buffer delivery; records (lib/emit.h) may be dropped, each drop counted
 * by cause (lib/drops.h).
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"
#include "lib/compiler.h"
#include "lib/config.h"
#include "lib/batch.h"
#include "lib/comms.h"
#include "lib/counters.h"
#include "lib/emit.h"
#include "lib/entry.h"
#include "lib/flight.h"
#include "lib/loader.h"
#include "lib/process.h"
#include "lib/scopes.h"
#include "lib/thread.h"
#include "torch/autograd.h"
#include "torch/tensors.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* What the flight recorder keeps of a collective's signature: NCCL's count
 * and datatype arguments, a c10d method's first tensor (torch/tensors.h). */
FUNC_INLINE void flight_sig_of(const struct entry *en, const struct cd_count_key *key, struct flight_sig *sig)
{
	sig->count = CD_FLIGHT_NO_COUNT;
	sig->dtype = CD_DTYPE_NONE;
	sig->op = CD_FLIGHT_NONE;
	sig->root = CD_FLIGHT_NONE;
	if (CD_COOKIE_FRAMEWORK_COLL(en->cookie)) {
		if (!en->nested)
			c10d_first(en, sig);
		return;
	}
	if (CD_COOKIE_COUNT(en->cookie) < CD_NUM_ARGS)
		sig->count = slot_arg(en->args, CD_COOKIE_COUNT(en->cookie));
	if (CD_COOKIE_REDOP(en->cookie) < CD_NUM_ARGS)
		sig->op = (__u32)slot_arg(en->args, CD_COOKIE_REDOP(en->cookie));
	if (CD_COOKIE_PEER(en->cookie) < CD_NUM_ARGS)
		sig->root = (__u32)slot_arg(en->args, CD_COOKIE_PEER(en->cookie));
	sig->dtype = key->dtype;
}

SEC("uprobe.multi")
int call_enter(struct pt_regs *ctx)
{
	struct entry en = {};
	struct cd_count_key key;
	struct flight_sig sig;
	struct cd_thread *st = 0;
	__u64 pid_tgid, cookie;
	__u32 counted, tid;
	__u64 seq = 0;
	bool first;

	if (!armed)
		return 0;
	pid_tgid = bpf_get_current_pid_tgid();
	tid = (__u32)pid_tgid;
	cookie = bpf_get_attach_cookie(ctx);
	/* A return-probed call needs its thread's state, which holds the flags. */
	if (CD_COOKIE_RET(cookie))
		st = bpf_map_lookup_elem(&threads, &tid);
	if (!read_entry(ctx, &en, pid_tgid, cookie, st))
		return 0;
	if (en.role == CD_ROLE_COMM_INIT && is_c10d_note(cookie)) {
		note_c10d(&en);
		return 0;
	}
	if (wants_records(&en))
		read_autograd_node(&en);
	if (!st && wants_thread(&en))
		st = thread_get(en.tid);
	if (st) {
		st->flags = en.flags;
		st->flags_gen = en.gen;
	}
	if (st && wants_frames(&en))
		track_frames(st, &en);
	counted = count_entry(&en, &key);
	if (en.role == CD_ROLE_COLLECTIVE && (en.flags & CD_TRACE_FLIGHT) && flight_numbered(&en)) {
		flight_sig_of(&en, &key, &sig);
		seq = flight_record(&en, &key, CD_COOKIE_RET(en.cookie) && st, &sig);
	}
	/* A return-probed call is recorded at its return, in one record; but a
	 * thread's first record goes out now (see events.h, cd_call). */
	first = st && wants_records(&en) && !st->announced;
	if (CD_COOKIE_RET(en.cookie) && st && push_inflight(st, &en, &key, counted, first, seq) && !first)
		return 0;
	if (!wants_records(&en))
		return 0;
	if (!track_scope(&en))
		return 0;
	emit_entry_record(&en, st);
	return 0;
}

SEC("uretprobe.multi")
int call_exit(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct cd_thread *st;
	struct cd_inflight *call;
	struct ret_info r = {};

	if (!armed)
		return 0;
	st = bpf_map_lookup_elem(&threads, &tid);
	call = pop_inflight(st);
	if (!call)
		return 0;
	r.depth = st->depth;
	/* ncclResult_t is a 32-bit enum: the upper half of rax is garbage */
	r.ret = (__s32)PT_REGS_RC(ctx);
	if (r.ret != 0)
		count_error(call);
	flight_returned(call, r.ret);
	if (call->out_ptr && CD_COOKIE_ROLE(call->cookie) != CD_ROLE_COMM_END &&
	    bpf_probe_read_user(&r.out, sizeof(r.out), (void *)call->out_ptr))
		r.out = 0;
	track_comm(call, st, &r);
	if (!(call->flags & CD_TRACE_RECORDS))
		return 0;
	if (call->entry_sent) {
		batch_before(st);
		emit_exit(call, tid, &r);
	} else
		emit_call(call, st, tid, &r);
	return 0;
}

/*
 * The dynamic loader calls _dl_debug_state() after every change to its link
 * map, once the new objects are mapped and before their constructors run.
 * For processes traced with CD_TRACE_DL_STOP the thread is stopped here so
 * that userspace can attach to a freshly mapped libnccl before its first
 * call (lib/loader.h).
 */
SEC("uprobe")
int dl_debug_state(struct pt_regs *ctx)
{
	note_new_code(CD_EV_DL_CHANGE);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	note_fork(BPF_CORE_READ(parent, tgid), BPF_CORE_READ(child, tgid));
	return 0;
}

/* A thread's state goes with it; a thread that exits inside return-probed
 * calls sends them first, after what it batched. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	struct cd_thread *st = bpf_map_lookup_elem(&threads, &tid);

	batch_before(st);
	if (st && st->depth)
		emit_open_calls(st, tid);
	if (st)
		emit_thread_exit(tgid, tid);
	bpf_map_delete_elem(&threads, &tid);
	bpf_map_delete_elem(&record_bufs, &tid);
	forget_stop_retry(tid);
	note_exit(&tgid, p);
	return 0;
}

/* A thread leaving its CPU sends its batch (lib/batch.h): a thread that
 * sleeps after its last call does not hold its records.  Attached for
 * sessions with records only: it runs at every context switch of the host,
 * and returns after one per-CPU load where no batch waits. */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 zero = 0, tid, *waiting = bpf_map_lookup_elem(&batch_cpu, &zero);
	struct cd_thread *st;

	if (!waiting || !*waiting)
		return 0;
	tid = *waiting;
	if (tid != (__u32)bpf_get_current_pid_tgid())
		return 0;
	st = bpf_map_lookup_elem(&threads, &tid);
	if (st && st->batch.busy)
		return 0; /* preempted while adding to it: its next switch-out sends it */
	if (st)
		batch_flush(st, BPF_RB_NO_WAKEUP);
	*waiting = 0;
	return 0;
}

/*
 * commdbgd only: a process mapping a libnccl file executable that is not
 * probed yet is stopped until the daemon has attached to the file, so even
 * its first call (a communicator init) is counted.  Once per file: the
 * daemon records probed files in known_files.  (Here fentry on the mmap LSM
 * hook is refused and there is no kprobe PMU, so the hook is the exit of an
 * mmap syscall, with bpf_find_vma to look at what was mapped.)
 */
SEC("tp_btf/sys_exit")
int BPF_PROG(on_mmap_file, struct pt_regs *regs, long ret)
{
	stop_for_new_file(regs, ret);
	return 0;
}

/*
 * An exec may bring another loader: `chroot ROOT prog` (a container's
 * runtime) runs ROOT's own ld.so file, whose _dl_debug_state nobody probed
 * yet, so the new image's dlopens would go unseen.  A traced process says
 * so here, before its first instruction; with CD_TRACE_DL_STOP it is also
 * stopped until userspace has probed its new loader (resumed as after a
 * loader change).  Loaded for sessions only: commdbgd follows mmap instead.
 */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	note_new_code(CD_EV_EXEC);
	return 0;
}
