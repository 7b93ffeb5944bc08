// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * commdbg kernel side: capture and emit, no policy.
 *
 * call_enter / call_exit are attached as uprobe_multi links, one per (probe
 * spec, library file); the cookie (events.h) says which symbol fired and which
 * argument slot holds what.  Exact counters live in `counters` and never
 * depend on ring-buffer delivery; records go to `events` and may be dropped,
 * each drop counted by cause in `drops`.
 */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"
#include "arch_x86.h"
#include "nccl_dtype.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SIGSTOP 19

/* Set before load by commdbgd: count every process that calls a probed
 * symbol (within the scope cgroup when scope_cgroup is set), not only those
 * in `traced`; and stop a process mapping a libnccl file not yet probed. */
const volatile __u32 count_all = 0;
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

/* Bumped by userspace after each change it makes to `traced`: a thread's
 * state keeps its process's flags with the generation they were read at, so
 * a return-probed call (the thread's state is looked up anyway) skips the
 * `traced` lookup.  The kernel only adds processes that have no thread state
 * yet (count-all, fork) and removes them with their threads.  Starts at 1: a
 * new thread state (generation 0) never matches. */
volatile __u32 traced_gen = 1;

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} scope SEC(".maps");

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

/* tgid -> CD_TRACE_* flags.  Only these processes are counted or recorded. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u32);
} traced SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct cd_count_key);
	__type(value, struct cd_count_val);
} counters SEC(".maps");

/* tgid -> its own counters (events.h).  Created when the tgid enters
 * `traced` and removed by userspace once it has read them, so this map only
 * holds traced processes and exited ones not yet forgotten: twice `traced`. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cd_proc_counts);
} proc_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cd_comm_key);
	__type(value, struct cd_comm_val);
} comms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* userspace resizes before load */
} events SEC(".maps");

/* tgid -> call records lost to a full ring buffer, so each process reports its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} proc_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CD_DROP_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

/* tid -> its open return-probed calls and entry-only frames (events.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cd_thread);
} threads SEC(".maps");

/* Zeroed templates: values too large for the 512-byte BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_thread);
} thread_zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_comm_val);
} comm_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cd_proc_counts);
} proc_counts_zero SEC(".maps");

/* tgid -> how to walk its Python frames (events.h), set by userspace for
 * traced processes that run CPython. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct cd_py_cfg);
} py_procs SEC(".maps");

/* tgid -> its code objects' kinds (events.h, cd_py_codes), from userspace
 * as it names frames; a process without one reads every frame's type. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cd_py_codes);
} py_codes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cd_scope_key);
	__type(value, __u64);
} open_scopes SEC(".maps");

/* A record with context is built here and copied out with
 * bpf_ringbuf_output, at its real size: a reservation has a constant size,
 * and reserving the largest stack for every record would fill the buffer
 * with empty frames.  Per thread (key: tid), not per CPU: uprobe programs can
 * be preempted, the thread is the only writer.  The body goes right-aligned
 * before the context so that body and tail are contiguous whatever its kind. */
#define CTX_BODY sizeof(struct cd_call)
#define CTX_WINDOW CD_PY_FRAME_WINDOW /* every field but 3.10's localsplus */
/* A frame's field is loaded at (offset & (CTX_WINDOW - 1)) past the frame's
 * start in a copy: 8 bytes past the window's end stay in bounds. */
#define CTX_PAD (CTX_WINDOW + 8)
/* Bytes of a 3.11+ data stack copied in one read: the innermost ~40 frames
 * of a torch job, more of smaller ones.  Frames below the copy refill it. */
#define CTX_STACK 8192

struct walk_state {
	__u64 frame;
	__u64 chunk, limit; /* the data stack chunk the copy is from; 0: none */
	__u64 base;	    /* user address of stk[0] */
	__u32 len;	    /* bytes valid in stk */
	__u32 n;
	__u32 status;
	__u32 flags;
	__u32 typed; /* frames [0, typed) may run inside the autograd engine */
	__u32 need;  /* some frame needs its type */
};

struct ctx_buf {
	struct walk_state ws;
	__u8 body[CTX_BODY];
	struct cd_context ctx;
	struct cd_py_frame frames[CD_MAX_PY_FRAMES];
	__u8 kinds[CD_MAX_PY_FRAMES]; /* enum cd_py_code_kind per frame, during the walk */
	__u8 stk[CTX_STACK + CTX_PAD];
	__u8 win[CD_PY_TS_WINDOW + CTX_PAD]; /* the thread state, then a frame outside the copy */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct ctx_buf);
} ctx_bufs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ctx_buf);
} ctx_zero SEC(".maps");

static __always_inline int in_scope(void)
{
	return !scope_cgroup || bpf_current_task_under_cgroup(&scope, 0) == 1;
}

/* Wake-up flags for a call record: none while the buffer fills, forced past
 * the watermark. */
static __always_inline __u64 record_wakeup(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
									   : BPF_RB_NO_WAKEUP;
}

static __always_inline void count_drop(__u32 cause)
{
	__u64 *v = bpf_map_lookup_elem(&drops, &cause);

	if (v)
		*v += 1;
}

static __always_inline void count_ringbuf_drop(__u32 tgid)
{
	__u64 *v = bpf_map_lookup_elem(&proc_drops, &tgid);

	count_drop(CD_DROP_RINGBUF_FULL);
	if (v) {
		__sync_fetch_and_add(v, 1);
	} else {
		__u64 one = 1;

		if (bpf_map_update_elem(&proc_drops, &tgid, &one, BPF_NOEXIST)) {
			v = bpf_map_lookup_elem(&proc_drops, &tgid);
			if (v)
				__sync_fetch_and_add(v, 1);
		}
	}
}

/* The value of `key` in `map`, created from the zeroed template in the
 * one-entry array `zero_map` when missing (values too large for the BPF
 * stack).  BPF_NOEXIST: a racing creator on another CPU wins, and the lookup
 * after it returns that one. */
static __always_inline void *lookup_or_init(void *map, const void *key, void *zero_map)
{
	void *v = bpf_map_lookup_elem(map, key);
	__u32 zero = 0;

	if (v)
		return v;
	v = bpf_map_lookup_elem(zero_map, &zero);
	if (!v)
		return 0;
	bpf_map_update_elem(map, key, v, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* The process's own counters, created if missing (a process traced before
 * it was given them, or whose creation raced with another CPU). */
static __always_inline struct cd_proc_counts *proc_counts_get(__u32 tgid)
{
	return lookup_or_init(&proc_counts, &tgid, &proc_counts_zero);
}

static __always_inline void add_count(struct cd_count_val *v, __u64 elements, __u64 bytes, bool nested)
{
	__sync_fetch_and_add(&v->calls, 1);
	__sync_fetch_and_add(&v->elements, elements);
	__sync_fetch_and_add(&v->bytes, bytes);
	if (nested) {
		__sync_fetch_and_add(&v->nested, 1);
		__sync_fetch_and_add(&v->nested_bytes, bytes);
	}
}

/* A call no counter took. */
static __always_inline __u32 count_uncounted(struct cd_proc_counts *pc)
{
	if (pc)
		__sync_fetch_and_add(&pc->uncounted, 1);
	count_drop(CD_DROP_UNCOUNTED);
	return CD_COUNTED_NONE;
}

/* A collective whose fine key was refused: counted in the process's own slot
 * for its symbol (open addressing, claimed with a compare-and-swap).  Global,
 * verified once on its own, like pop_returned_frames. */
__noinline __u32 count_coarse(struct cd_proc_counts *pc, __u32 sym, __u64 elements, __u64 bytes, bool nested)
{
	__u32 start = (sym * 2654435761u) >> 26; /* top 6 bits: CD_COARSE_SLOTS */

	if (!pc)
		return count_uncounted(pc);
	for (__u32 i = 0; i < CD_COARSE_SLOTS; i++) {
		__u32 idx = (start + i) & (CD_COARSE_SLOTS - 1);
		struct cd_coarse_slot *s = &pc->coarse[idx];
		__u32 cur = s->sym1;

		if (cur == 0) {
			cur = __sync_val_compare_and_swap(&s->sym1, 0, sym + 1);
			if (cur == 0)
				cur = sym + 1;
		}
		if (cur != sym + 1)
			continue;
		add_count(&s->val, elements, bytes, nested);
		__sync_fetch_and_add(&pc->breakdown_lost, 1);
		return CD_COUNTED_COARSE + idx;
	}
	return count_uncounted(pc);
}

/* Counts one call; returns where (CD_COUNTED_*).  A new fine key is taken
 * only within the process's share, so no process can fill the node's map. */
static __always_inline __u32 count_call(struct cd_count_key *key, __u32 role, __u64 elements, __u64 bytes,
					bool nested)
{
	struct cd_count_val *v = bpf_map_lookup_elem(&counters, key);
	struct cd_proc_counts *pc;

	if (v) {
		add_count(v, elements, bytes, nested);
		return CD_COUNTED_FINE;
	}
	pc = proc_counts_get(key->tgid);
	/* Without its own counters (no memory for them) a process still gets
	 * fine keys: losing the call would be worse than an unbounded share. */
	if (!pc || pc->fine_keys < fine_keys_per_process) {
		struct cd_count_val zero = {};

		if (bpf_map_update_elem(&counters, key, &zero, BPF_NOEXIST) == 0 && pc)
			__sync_fetch_and_add(&pc->fine_keys, 1);
		v = bpf_map_lookup_elem(&counters, key);
		if (!v)
			count_drop(CD_DROP_COUNTER_FULL);
	} else {
		count_drop(CD_DROP_COUNTER_SHARE);
	}
	if (!v)
		return role == CD_ROLE_COLLECTIVE ? count_coarse(pc, key->sym, elements, bytes, nested)
						  : count_uncounted(pc);
	add_count(v, elements, bytes, nested);
	return CD_COUNTED_FINE;
}

/* Every record starts with the same header. */
static __always_inline void fill_header(struct cd_header *h, __u32 kind, __u32 size, __u32 tail_kind,
					__u32 tail_len, __u32 tgid, __u32 tid, __u64 ts)
{
	h->kind = kind;
	h->size = size;
	h->tail_kind = tail_kind;
	h->tail_len = tail_len;
	h->tgid = tgid;
	h->tid = tid;
	h->ts_ns = ts;
}

static __always_inline void emit_proc(__u32 kind, __u32 tgid, __u32 parent, __s32 code)
{
	struct cd_proc *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_drop(CD_DROP_PROC_EVENT);
		return;
	}
	fill_header(&e->h, kind, sizeof(*e), CD_TAIL_NONE, 0, tgid, tgid, bpf_ktime_get_ns());
	e->parent_tgid = parent;
	e->exit_code = code;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

/* CD_TRACE_* flags for `tgid`, 0 when it is not traced.  In count-all mode a
 * process's first probed call puts it in `traced` and tells userspace, which
 * reads its labels (RANK, ...) while it surely still runs. */
static __always_inline __u32 trace_flags(__u32 tgid)
{
	__u32 *f = bpf_map_lookup_elem(&traced, &tgid);
	__u32 fl = CD_TRACE_COUNT;

	if (f)
		return *f;
	if (!count_all || !in_scope())
		return 0;
	if (bpf_map_update_elem(&traced, &tgid, &fl, BPF_NOEXIST) == 0) {
		proc_counts_get(tgid);
		emit_proc(CD_EV_PROC_SEEN, tgid, 0, 0);
	}
	return fl;
}

/* ---- call probes: what an entry saw ----------------------------------------- */

/* Read once at an entry, passed to the helpers below. */
struct entry {
	__u64 cookie;
	__u64 ts; /* 0 unless kept: records, communicator creation */
	__u64 ip;
	__u64 sp;
	__u64 args[CD_NUM_ARGS]; /* registers, then the stack words a slot needs */
	__u32 tgid;
	__u32 tid;
	__u32 flags; /* CD_TRACE_* */
	__u32 role;
	__u32 group_depth;
	__u32 frame_depth;
	__u32 nested; /* a collective inside an open collective of its thread (cd_count_val) */
	__u32 entry_flags; /* CD_ENTRY_* */
	__u32 gen;	   /* traced_gen when flags were read */
};

static __always_inline bool wants_records(const struct entry *en)
{
	return en->flags & CD_TRACE_RECORDS;
}

static __always_inline __u64 slot_arg(const __u64 *args, __u32 slot)
{
	return slot < CD_NUM_ARGS ? args[slot & 7] : 0;
}

/* The process's flags: kept in the thread's state while `traced` is
 * unchanged, else read from it (the generation first: a change made after
 * the read bumps it). */
static __always_inline __u32 entry_trace_flags(const struct cd_thread *st, __u32 tgid, __u32 *gen)
{
	*gen = traced_gen;
	if (st && st->flags_gen == *gen)
		return st->flags;
	return trace_flags(tgid);
}

/* Fills `en`; returns false when the call is neither counted nor recorded.
 * `st`: the thread's state where already looked up. */
static __always_inline bool read_entry(struct pt_regs *ctx, struct entry *en, __u64 pid_tgid, __u64 cookie,
				       const struct cd_thread *st)
{
	bool stack;

	en->tgid = pid_tgid >> 32;
	en->tid = (__u32)pid_tgid;
	en->flags = entry_trace_flags(st, en->tgid, &en->gen);
	if (!en->flags)
		return false;
	en->cookie = cookie;
	en->role = CD_COOKIE_ROLE(en->cookie);
	en->frame_depth = CD_DEPTH_UNKNOWN;
	/* A time only where it is kept: records, and communicators' creation. */
	if (wants_records(en) || en->role == CD_ROLE_COMM_INIT || en->role == CD_ROLE_COMM_SPLIT)
		en->ts = bpf_ktime_get_ns();
	en->ip = PT_REGS_IP(ctx);
	en->sp = PT_REGS_SP(ctx);
	cd_read_reg_args(ctx, en->args);
	/* A user-memory read costs more than the rest of a recorded entry: only
	 * for a slot that is a stack word, and one only a record shows (NCCL's
	 * stream) only where the process asked for it. */
	stack = CD_COOKIE_STACK_COUNT(en->cookie) ||
		(wants_records(en) && (en->flags & CD_TRACE_STACK_ARGS) && CD_COOKIE_STACK_RECORD(en->cookie));
	if (stack && bpf_probe_read_user(&en->args[CD_REG_SLOTS], (CD_NUM_ARGS - CD_REG_SLOTS) * sizeof(__u64),
					 (void *)(en->sp + CD_STACK_ARGS_OFFSET)) == 0)
		en->entry_flags |= CD_ENTRY_STACK_ARGS;
	return true;
}

/* ---- call probes: frames -------------------------------------------------- */

static __always_inline struct cd_thread *thread_get(__u32 tid)
{
	return lookup_or_init(&threads, &tid, &thread_zero);
}

/* Pops the frames that returned before an entry at `sp`; returns the depth
 * left, the parent level of the new call.  A global function, verified once
 * on its own: inlined, its loop was verified again on each of call_enter's
 * paths, most of the program's load time. */
__noinline __u32 pop_returned_frames(struct cd_thread *st, __u64 sp)
{
	__u32 n;

	if (!st)
		return 0;
	n = st->nframes;

	for (int i = 0; i < CD_MAX_FRAMES; i++) {
		struct cd_frame *f;
		__u64 cur = 0;

		if (n == 0 || n > CD_MAX_FRAMES)
			break;
		f = &st->frames[(n - 1) & (CD_MAX_FRAMES - 1)];
		if (f->sp > sp && bpf_probe_read_user(&cur, sizeof(cur), (void *)f->sp) == 0 &&
		    cur == f->ret)
			break; /* still open: below us, return address intact */
		n--;
	}
	st->nframes = n;
	st->coll_frames &= n < 32 ? (1u << n) - 1 : 0xffffffffu;
	return n;
}

static __always_inline void push_frame(struct cd_thread *st, struct entry *en)
{
	__u32 n = st->nframes;
	struct cd_frame *f;

	if (n >= CD_MAX_FRAMES) {
		en->frame_depth = CD_DEPTH_UNKNOWN; /* too deep to track: sp rule */
		return;
	}
	f = &st->frames[n & (CD_MAX_FRAMES - 1)];
	f->sp = en->sp;
	if (bpf_probe_read_user(&f->ret, sizeof(f->ret), (void *)en->sp))
		f->ret = 0;
	if (CD_COOKIE_FRAMEWORK_COLL(en->cookie))
		st->coll_frames |= 1u << (n & (CD_MAX_FRAMES - 1));
	st->nframes = n + 1;
}

/* A thread's state: for records, to pair a call with its return, and for a
 * framework collective, whose frame tells the calls made inside it
 * (events.h, cd_count_val.nested).  A counted entry-only NCCL call (commdbgd
 * --no-count-errors) looks up nothing. */
static __always_inline bool wants_thread(const struct entry *en)
{
	return wants_records(en) || CD_COOKIE_RET(en->cookie) || CD_COOKIE_FRAMEWORK_COLL(en->cookie);
}

/* Frames: for records (group and frame depth: where a call nests), and for
 * every collective of a thread whose state is there (is a framework
 * collective open?); a library call of a thread that never entered one
 * finds no frame and reads nothing. */
static __always_inline bool wants_frames(const struct entry *en)
{
	return wants_records(en) || en->role == CD_ROLE_COLLECTIVE;
}

static __always_inline void track_frames(struct cd_thread *st, struct entry *en)
{
	bool group = en->role == CD_ROLE_GROUP_START || en->role == CD_ROLE_GROUP_END;

	if (en->role == CD_ROLE_GROUP_START)
		st->group_depth++;
	else if (en->role == CD_ROLE_GROUP_END && st->group_depth > 0)
		st->group_depth--;
	en->group_depth = st->group_depth;
	en->frame_depth = pop_returned_frames(st, en->sp);
	en->nested = en->role == CD_ROLE_COLLECTIVE && st->coll_frames != 0;
	if (!CD_COOKIE_RET(en->cookie) && !group)
		push_frame(st, en);
}

/* ---- call probes: counting -------------------------------------------------- */

/* Counts an entry; returns where (CD_COUNTED_*) and fills its counter key. */
static __always_inline __u32 count_entry(const struct entry *en, struct cd_count_key *key)
{
	__u64 elements = 0, bytes = 0;
	__u32 ds = CD_COOKIE_DTYPE(en->cookie);

	key->tgid = en->tgid;
	key->sym = CD_COOKIE_SYM(en->cookie);
	key->comm = slot_arg(en->args, CD_COOKIE_COMM(en->cookie));
	key->dtype = CD_DTYPE_NONE;
	key->pad = 0;
	if (en->role == CD_ROLE_COLLECTIVE) {
		elements = slot_arg(en->args, CD_COOKIE_COUNT(en->cookie));
		if (ds < CD_NUM_ARGS) {
			key->dtype = (__u32)en->args[ds & 7];
			bytes = elements * dtype_size(key->dtype);
		}
	}
	if (!(en->flags & CD_TRACE_COUNT))
		return CD_COUNTED_NONE;
	return count_call(key, en->role, elements, bytes, en->nested);
}

/* A call that returned non-zero: an error where its entry counted it. */
static __always_inline void count_error(const struct cd_inflight *s)
{
	if (s->counted == CD_COUNTED_FINE) {
		struct cd_count_val *v = bpf_map_lookup_elem(&counters, &s->ckey);

		if (v)
			__sync_fetch_and_add(&v->errors, 1);
	} else if (s->counted >= CD_COUNTED_COARSE) {
		__u32 tgid = s->ckey.tgid;
		struct cd_proc_counts *pc = bpf_map_lookup_elem(&proc_counts, &tgid);
		__u32 idx = (s->counted - CD_COUNTED_COARSE) & (CD_COARSE_SLOTS - 1);

		if (pc)
			__sync_fetch_and_add(&pc->coarse[idx].val.errors, 1);
	}
}

/* ---- call probes: in-flight slots ------------------------------------------- */

/* Keeps what the return needs; false when the thread is nested too deep. */
static __always_inline bool push_inflight(struct cd_thread *st, const struct entry *en,
					  const struct cd_count_key *key, __u32 counted, bool entry_sent)
{
	__u32 d = st->depth;
	struct cd_inflight *s;

	if (d >= CD_MAX_INFLIGHT) {
		count_drop(CD_DROP_INFLIGHT_DEEP);
		return false;
	}
	s = &st->s[d & (CD_MAX_INFLIGHT - 1)];
	s->cookie = en->cookie;
	s->ts = en->ts;
	s->out_ptr = slot_arg(en->args, CD_COOKIE_OUT(en->cookie));
	s->ip = en->ip;
	s->sp = en->sp;
	__builtin_memcpy(s->args, en->args, sizeof(s->args));
	s->ckey = *key;
	s->group_depth = en->group_depth;
	s->frame_depth = en->frame_depth;
	s->counted = counted;
	s->flags = en->flags;
	s->entry_sent = entry_sent;
	s->entry_flags = en->entry_flags;
	st->depth = d + 1;
	if (CD_COOKIE_TAIL(en->cookie) == CD_TAIL_UNIQUE_ID &&
	    bpf_probe_read_user(st->unique_id, CD_UNIQUE_ID_BYTES, (void *)(en->sp + CD_STACK_ARGS_OFFSET)))
		count_drop(CD_DROP_READ_FAULT);
	return true;
}

/* The innermost open return-probed call of this thread, popped; 0 if none.
 * Only a traced process's entries leave a thread in-flight calls. */
static __always_inline struct cd_inflight *pop_inflight(struct cd_thread *st)
{
	__u32 d;

	if (!st || st->depth == 0 || st->depth > CD_MAX_INFLIGHT)
		return 0;
	d = st->depth - 1;
	st->depth = d;
	return &st->s[d & (CD_MAX_INFLIGHT - 1)];
}

/* ---- call probes: emission --------------------------------------------------- */

/* A thread looks at the watermark once per this many of its records: a
 * helper call costs as much as the rest of a record's emission, and the
 * watermark leaves 7/8 of the buffer free (a few records late is nothing). */
#define CD_WAKE_CHECK_EVERY 16

/* A thread's first record wakes the consumer at once, batching or not:
 * userspace reads the thread's name when it first sees it, and a short-lived
 * worker would be gone by the time the watermark is reached. */
static __always_inline __u64 call_wakeup(struct cd_thread *st)
{
	if (!st)
		return record_wakeup();
	if (!st->announced) {
		st->announced = 1;
		return BPF_RB_FORCE_WAKEUP;
	}
	if (++st->unchecked < CD_WAKE_CHECK_EVERY)
		return BPF_RB_NO_WAKEUP;
	st->unchecked = 0;
	return record_wakeup();
}

/* An entry record, for a call that has no return probe (or whose in-flight
 * state could not be kept, or whose thread exits first).  Records carry no
 * ncclUniqueId: communicators get theirs from the comms map, kept in the
 * kernel (a copy per record would be 128 bytes nobody reads). */
static __always_inline void fill_enter(struct cd_call_enter *e, const struct entry *en, __u32 tail_len)
{
	fill_header(&e->h, CD_EV_CALL_ENTER, sizeof(*e) + tail_len, tail_len ? CD_TAIL_CONTEXT : CD_TAIL_NONE,
		    tail_len, en->tgid, en->tid, en->ts);
	e->cookie = en->cookie;
	e->ip = en->ip;
	e->sp = en->sp;
	__builtin_memcpy(e->args, en->args, sizeof(e->args));
	e->group_depth = en->group_depth;
	e->entry_flags = en->entry_flags;
	e->frame_depth = en->frame_depth;
}

static __always_inline void emit_enter(const struct entry *en, __u64 wakeup)
{
	struct cd_call_enter *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_ringbuf_drop(en->tgid);
		return;
	}
	fill_enter(e, en, 0);
	bpf_ringbuf_submit(e, wakeup);
}

/* What a call returned, for its one record. */
struct ret_info {
	__s64 ret;
	__u64 out;
	__u32 depth;
};

static __always_inline void fill_call(struct cd_call *e, const struct cd_inflight *s, __u32 tid,
				      const struct ret_info *r, __u32 tail_len)
{
	fill_header(&e->h, CD_EV_CALL, sizeof(*e) + tail_len, tail_len ? CD_TAIL_CONTEXT : CD_TAIL_NONE, tail_len,
		    s->ckey.tgid, tid, bpf_ktime_get_ns());
	e->cookie = s->cookie;
	e->ip = s->ip;
	e->sp = s->sp;
	__builtin_memcpy(e->args, s->args, sizeof(e->args));
	e->group_depth = s->group_depth;
	e->entry_flags = s->entry_flags;
	e->frame_depth = s->frame_depth;
	e->enter_ts_ns = s->ts;
	e->ret = r->ret;
	e->out_value = r->out;
	e->depth = r->depth;
	e->pad = 0;
}

/* ---- framework context: labels and Python stacks ------------------------------ */

static __always_inline __u64 read_u64(__u64 addr)
{
	__u64 v = 0;

	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

/* 8 bytes at `off` of a frame or thread state copied to `p` (ctx_buf.stk
 * or .win, each followed by CTX_PAD bytes); offsets come from userspace,
 * which keeps them under CTX_WINDOW (py_config.cpp). */
static __always_inline __u64 at_u64(const __u8 *p, __u32 off)
{
	return *(const __u64 *)(p + (off & (CTX_WINDOW - 1)));
}

static __always_inline __u64 ts_u64(const struct ctx_buf *b, __u32 off)
{
	if (off >= CD_PY_TS_WINDOW)
		return 0;
	return *(const __u64 *)(b->win + off);
}

/* The Python stack is walked only where the symbol asks for it and the
 * process runs a CPython userspace found a layout for. */
static __always_inline const struct cd_py_cfg *py_cfg_for(__u64 cookie, __u32 tgid, __u32 flags)
{
	/* the flag first: a process without Python pays no lookup */
	return (flags & CD_TRACE_PYTHON) && CD_COOKIE_PY_STACK(cookie) ? bpf_map_lookup_elem(&py_procs, &tgid) : 0;
}

/* A walk: its pointers on the stack, its progress in the thread's buffer
 * (ctx_buf.ws), where the verifier does not track values: kept on the
 * stack, each frame's known constants made states it could not prune. */
struct walk {
	struct ctx_buf *b;
	struct walk_state *s; /* &b->ws */
	const struct cd_py_cfg *cfg;
	const struct cd_py_codes *codes; /* 0: every code object is unknown */
};

/* stk = the CTX_STACK bytes of the data stack below `hi` (not below the
 * chunk): the frames there in one read, the outer ones at lower addresses. */
static __always_inline void copy_stack(struct walk *w, __u64 hi)
{
	__u64 lo = hi - w->s->chunk > CTX_STACK ? hi - CTX_STACK : w->s->chunk, len = hi - lo;

	w->s->len = 0;
	if (len == 0 || len > CTX_STACK)
		return;
	if (bpf_probe_read_user(w->b->stk, len, (void *)lo))
		return;
	w->s->base = lo;
	w->s->len = len;
}

/* The thread's innermost Python frame, through its thread state in the
 * interpreter's autoTSSkey slot: the GIL is usually released at a native
 * probe, so "the thread holding the GIL" would be another thread.  On
 * 3.11+ the top of the thread's data stack is copied as well. */
static __always_inline __u32 py_top_frame(const struct cd_py_cfg *c, struct walk *w)
{
	struct ctx_buf *b = w->b;
	__u64 fs = cd_thread_pointer(), ts, f, top;
	__u32 span = c->ts_span;

	ts = read_u64(fs + c->tls_base + (__u64)c->tls_stride * c->key + c->tls_data);
	if (!ts || span == 0 || span > CD_PY_TS_WINDOW || bpf_probe_read_user(b->win, span, (void *)(ts + c->ts_lo)))
		return CD_PY_NO_TSTATE;
	if (ts_u64(b, c->ts_thread_id - c->ts_lo) != fs)
		return CD_PY_NO_TSTATE; /* no Python on this thread, or another thread's state */
	f = ts_u64(b, c->ts_frame - c->ts_lo);
	if (c->ts_stack != 0xffffffffu) {
		w->s->chunk = ts_u64(b, c->ts_stack - c->ts_lo);
		top = ts_u64(b, c->ts_stack + 8 - c->ts_lo);
		w->s->limit = ts_u64(b, c->ts_stack + 16 - c->ts_lo);
		/* The copy is the target's memory, whatever these say: a wrong
		 * bound costs reads, never a wrong frame. */
		if (w->s->chunk && w->s->chunk < top && top <= w->s->limit)
			copy_stack(w, top + CTX_WINDOW < w->s->limit ? top + CTX_WINDOW : w->s->limit);
		else
			w->s->chunk = 0;
	}
	if (f && c->ts_frame_inner != 0xffffffffu)
		f = read_u64(f + c->ts_frame_inner);
	w->s->frame = f;
	return CD_PY_OK;
}

/* The kind userspace gave `code`'s slot, with direct loads: no helper. */
static __always_inline __u32 code_kind(const struct cd_py_codes *t, __u64 code)
{
	return t ? cd_py_code_lookup(t, code) : CD_CODE_UNKNOWN;
}

/* Where the frame's fields are: in the data stack's copy (refilled when
 * the frame is below it), else read into win; 0 when unreadable. */
static __always_inline const __u8 *frame_at(struct walk *w, __u64 frame, __u32 span)
{
	struct ctx_buf *b = w->b;
	__u64 rel = frame - w->s->base;

	if (w->s->chunk && frame >= w->s->chunk && frame + span <= w->s->limit && (frame < w->s->base || rel + span > w->s->len))
		copy_stack(w, frame + span);
	rel = frame - w->s->base;
	if (w->s->len && frame >= w->s->base && rel + span <= w->s->len && rel < CTX_STACK)
		return b->stk + rel;
	/* One read per frame; a shorter one where a frame ends a mapping. */
	if (bpf_probe_read_user(b->win, CTX_WINDOW, (void *)frame) &&
	    bpf_probe_read_user(b->win, CTX_WINDOW / 2 + 16, (void *)frame))
		return 0;
	return b->win;
}

/* One frame; C-stack trampolines are skipped.  Per frame: the code object,
 * the instruction, localsplus[0] and the code's kind; `self`'s type waits
 * for the whole stack (read_type).  1: the walk is over. */
static __always_inline long walk_frame(struct walk *w)
{
	struct ctx_buf *b = w->b;
	const struct cd_py_cfg *c = w->cfg;
	__u64 frame = w->s->frame, code, self;
	const __u8 *fp;
	struct cd_py_frame *f;
	__u32 n = w->s->n, owner = c->frame_owner, instr = c->frame_instr, ls = c->frame_localsplus, kind;

	if (!frame)
		return 1;
	if (n >= c->max_frames || n >= CD_MAX_PY_FRAMES) {
		w->s->flags |= CD_CTX_TRUNCATED;
		return 1;
	}
	fp = frame_at(w, frame, c->frame_span > CTX_WINDOW ? CTX_WINDOW : c->frame_span);
	if (!fp) {
		w->s->status = CD_PY_FAULT;
		return 1;
	}
	code = at_u64(fp, c->frame_code);
	w->s->frame = at_u64(fp, c->frame_previous);
	if (owner < CTX_WINDOW && fp[owner & (CTX_WINDOW - 1)] == c->frame_owner_cstack)
		return 0;
	if (!code || ((c->flags & CD_PYCFG_SKIP_NONE_CODE) && code == c->none_addr))
		return 0;
	f = &b->frames[n & (CD_MAX_PY_FRAMES - 1)];
	f->code = code;
	if (c->flags & CD_PYCFG_LASTI_INT)
		f->instr = instr < CTX_WINDOW - 4 ? *(const __s32 *)(fp + (instr & (CTX_WINDOW - 1))) : 0;
	else
		f->instr = at_u64(fp, instr);
	self = ls <= CTX_WINDOW - 8 ? at_u64(fp, ls) : read_u64(frame + ls);
	f->self = self;
	f->self_type = 0;
	kind = code_kind(w->codes, code);
	b->kinds[n & (CD_MAX_PY_FRAMES - 1)] = kind;
	if (kind == CD_CODE_UNKNOWN || kind == CD_CODE_BACKWARD) {
		w->s->typed = n; /* the frames inside it may run on behalf of gradients */
		if (n)
			w->s->need = 1;
	}
	if (kind == CD_CODE_UNKNOWN || kind == CD_CODE_SELF)
		w->s->need = 1;
	w->s->n = n + 1;
	return 0;
}

/* WALK_BATCH frames per bpf_loop iteration: its call of the callback costs
 * as much as the rest of a frame's walk here (a return under the CPU's
 * return-stack mitigation).  The verifier's work grows fast with it, and
 * every attach pays it: at 8 loading took 2 s longer, at 4 0.5 s; at 2 it
 * is as fast as at 1, and the walk as fast as at 8. */
#define WALK_BATCH 2

static long walk_frames(__u64 i, void *data)
{
	struct walk *w = data;

	for (int k = 0; k < WALK_BATCH; k++)
		if (walk_frame(w))
			return 1;
	return 0;
}

/* `self`'s type, read now (the instance may die before userspace looks;
 * types live long), a cell's contents when a closure captured it.
 * Userspace decides from the code object whether the slot is really a
 * first argument. */
static long read_type(__u64 i, void *data)
{
	struct walk *w = data;
	const struct cd_py_cfg *c = w->cfg;
	struct cd_py_frame *f;
	__u64 self, type = 0;
	__u32 kind;

	if (i >= w->s->n || i >= CD_MAX_PY_FRAMES)
		return 1;
	kind = w->b->kinds[i & (CD_MAX_PY_FRAMES - 1)];
	if (kind == CD_CODE_NO_ARGS || kind == CD_CODE_BACKWARD || (kind == CD_CODE_PLAIN && i >= w->s->typed))
		return 0;
	f = &w->b->frames[i & (CD_MAX_PY_FRAMES - 1)];
	self = f->self;
	if (self)
		type = read_u64(self + c->ob_type);
	if (type && type == c->cell_type) {
		self = read_u64(self + c->cell_contents);
		type = self ? read_u64(self + c->ob_type) : 0;
	}
	f->self = self;
	f->self_type = type;
	return 0;
}

/* `size` bytes of user memory at `data` as the record's label, cut at
 * CD_LABEL_MAX (and flagged so). */
static __always_inline void copy_label(struct ctx_buf *b, __u64 data, __u64 size)
{
	__u32 len = size > CD_LABEL_MAX ? CD_LABEL_MAX : (__u32)size;

	if (size > CD_LABEL_MAX)
		b->ctx.flags |= CD_CTX_LABEL_CUT;
	if (len == 0 || len > CD_LABEL_MAX)
		return;
	if (bpf_probe_read_user(b->ctx.label, len, (void *)data) == 0)
		b->ctx.label_len = len;
}

/* std::string const* (libstdc++: data at +0, length at +8) -> the label. */
static __always_inline void read_label(struct ctx_buf *b, __u64 str)
{
	__u64 sv[2] = {};

	if (str && bpf_probe_read_user(sv, sizeof(sv), (void *)str) == 0)
		copy_label(b, sv[0], sv[1]);
}

#define CD_STR_COMPACT_ASCII 0x60 /* PyASCIIObject state: compact (bit 5) and ascii (bit 6) */

/* torch 1.13: a scope's label is the `name` of the record_function whose
 * __enter__ is on the stack (events.h, cd_py_cfg.rf_type).  Userspace
 * reading it later might find the object freed and its address reused. */
static __always_inline void read_py_label(struct ctx_buf *b, const struct cd_py_cfg *c, __u32 n)
{
	__u64 values, str, len = 0;
	__u32 state = 0, i;

	for (i = 0; i < CD_SCOPE_LABEL_FRAMES; i++) {
		if (i >= n)
			return;
		if (b->frames[i].self_type == c->rf_type)
			break;
	}
	if (i >= CD_SCOPE_LABEL_FRAMES)
		return;
	values = read_u64(b->frames[i].self - CD_PY311_VALUES_BEFORE);
	str = values ? read_u64(values + 8 * (__u64)c->rf_name_index) : 0;
	if (!str || bpf_probe_read_user(&len, sizeof(len), (void *)(str + c->str_length)) ||
	    bpf_probe_read_user(&state, sizeof(state), (void *)(str + c->str_state)) ||
	    (state & CD_STR_COMPACT_ASCII) != CD_STR_COMPACT_ASCII)
		return;
	copy_label(b, str + c->str_ascii_data, len);
}

#define CTX_TAIL_MAX (sizeof(struct cd_context) + CD_MAX_PY_FRAMES * sizeof(struct cd_py_frame))

/* The label (the std::string at `label`, for a label tail) and stack of a
 * record into b; returns the tail's length.  A global function: the verifier
 * checks it once, on its own, rather than once per path of each caller that
 * reaches it (call_enter has hundreds), which made loading take 0.5 s. */
__noinline __u32 fill_context(struct ctx_buf *b, __u32 tgid, __u64 cookie, __u64 label,
			      const struct cd_py_cfg *cfg)
{
	struct walk w = {.b = b, .s = 0, .cfg = cfg};
	__u32 n;

	if (!b)
		return 0;
	w.s = &b->ws;
	__builtin_memset(&b->ws, 0, sizeof(b->ws));
	b->ws.status = CD_PY_OK;

	b->ctx.label_len = 0;
	b->ctx.nframes = 0;
	b->ctx.flags = 0;
	b->ctx.py_status = CD_PY_NONE;
	if (CD_COOKIE_TAIL(cookie) == CD_TAIL_LABEL)
		read_label(b, label);
	if (cfg) {
		b->ctx.py_status = py_top_frame(cfg, &w);
		if (b->ctx.py_status == CD_PY_OK) {
			w.codes = bpf_map_lookup_elem(&py_codes, &tgid);
			bpf_loop(2 * CD_MAX_PY_FRAMES / WALK_BATCH, walk_frames, &w, 0);
			if (b->ws.need)
				bpf_loop(CD_MAX_PY_FRAMES, read_type, &w, 0);
			b->ctx.py_status = b->ws.status;
			b->ctx.flags |= b->ws.flags;
		}
	}
	n = b->ws.n > CD_MAX_PY_FRAMES ? CD_MAX_PY_FRAMES : b->ws.n;
	b->ctx.nframes = n;
	if (cfg && cfg->rf_type && !b->ctx.label_len && CD_COOKIE_ROLE(cookie) == CD_ROLE_SCOPE_BEGIN)
		read_py_label(b, cfg, n);
	return sizeof(struct cd_context) + n * sizeof(struct cd_py_frame);
}

/* fill_context for a record with these args; its length, to be checked
 * against CTX_TAIL_MAX: the verifier, unlike clang, cannot see the bound
 * of a global function's result (barrier_var keeps clang's check). */
static __always_inline __u32 context_tail(struct ctx_buf *b, __u32 tgid, __u64 cookie, const __u64 *args,
					  const struct cd_py_cfg *cfg)
{
	__u32 tail = fill_context(b, tgid, cookie, slot_arg(args, CD_COOKIE_OUT(cookie)), cfg);

	barrier_var(tail);
	return tail;
}

/* The per-thread buffer a record with context is built in; 0 when the
 * record needs none. */
static __always_inline struct ctx_buf *context_buf(__u64 cookie, __u32 tgid, __u32 tid, __u32 flags,
						   const struct cd_py_cfg **cfg)
{
	struct ctx_buf *b;

	*cfg = py_cfg_for(cookie, tgid, flags);
	if (!*cfg && CD_COOKIE_TAIL(cookie) != CD_TAIL_LABEL)
		return 0;
	b = lookup_or_init(&ctx_bufs, &tid, &ctx_zero);
	if (!b)
		count_drop(CD_DROP_PY_CONTEXT); /* sent without it */
	return b;
}

/* Names of a record's Python frames are read from the live process when
 * userspace takes the record: a record with context wakes it at least every
 * CTX_WAKE_NS, so a short job's last frames are named before it exits (a
 * record per wake-up at worst, not one per record).  A scope's begin wakes it
 * at once while userspace has yet to learn where torch 1.13 keeps labels. */
#define CTX_WAKE_NS 5000000ull
__u64 ctx_woken_ns = 0;

static __always_inline __u64 ctx_wakeup(__u64 wakeup, __u64 cookie, const struct cd_py_cfg *cfg)
{
	__u64 now;

	if (wakeup == BPF_RB_FORCE_WAKEUP)
		return wakeup;
	if (cfg && !cfg->rf_type && CD_COOKIE_ROLE(cookie) == CD_ROLE_SCOPE_BEGIN)
		return BPF_RB_FORCE_WAKEUP;
	now = bpf_ktime_get_ns();
	if (now - ctx_woken_ns < CTX_WAKE_NS)
		return wakeup;
	ctx_woken_ns = now;
	return BPF_RB_FORCE_WAKEUP;
}

#define CTX_ENTER_OFF (CTX_BODY - sizeof(struct cd_call_enter))

/* An entry record with its context; false when it has none to carry. */
static __always_inline bool emit_enter_ctx(const struct entry *en, __u64 wakeup)
{
	const struct cd_py_cfg *cfg;
	struct ctx_buf *b = context_buf(en->cookie, en->tgid, en->tid, en->flags, &cfg);
	__u32 tail;

	if (!b)
		return false;
	tail = context_tail(b, en->tgid, en->cookie, en->args, cfg);
	if (tail > CTX_TAIL_MAX)
		return false;
	fill_enter((struct cd_call_enter *)(b->body + CTX_ENTER_OFF), en, tail);
	wakeup = ctx_wakeup(wakeup, en->cookie, cfg);
	if (bpf_ringbuf_output(&events, b->body + CTX_ENTER_OFF, sizeof(struct cd_call_enter) + tail, wakeup))
		count_ringbuf_drop(en->tgid);
	return true;
}

/* A call record with its context, built at the return: the Python stack
 * of a thread inside a native call is the one it had at the entry. */
static __always_inline bool emit_call_ctx(const struct cd_inflight *s, __u32 tid, const struct ret_info *r,
					  __u64 wakeup)
{
	const struct cd_py_cfg *cfg;
	struct ctx_buf *b = context_buf(s->cookie, s->ckey.tgid, tid, s->flags, &cfg);
	__u32 tail;

	if (!b)
		return false;
	tail = context_tail(b, s->ckey.tgid, s->cookie, s->args, cfg);
	if (tail > CTX_TAIL_MAX)
		return false;
	fill_call((struct cd_call *)b->body, s, tid, r, tail);
	wakeup = ctx_wakeup(wakeup, s->cookie, cfg);
	if (bpf_ringbuf_output(&events, b->body, sizeof(struct cd_call) + tail, wakeup))
		count_ringbuf_drop(s->ckey.tgid);
	return true;
}

/* Built on the stack and copied out: one helper call, not a reservation
 * and a submission. */
static __always_inline void emit_call(const struct cd_inflight *s, struct cd_thread *st, __u32 tid,
				      const struct ret_info *r)
{
	__u64 wakeup = call_wakeup(st);
	struct cd_call e;

	if (emit_call_ctx(s, tid, r, wakeup))
		return;
	fill_call(&e, s, tid, r, 0);
	if (bpf_ringbuf_output(&events, &e, sizeof(e), wakeup))
		count_ringbuf_drop(s->ckey.tgid);
}


/* The return of a call whose entry went out as its own record. */
static __always_inline void emit_exit(const struct cd_inflight *s, __u32 tid, const struct ret_info *r)
{
	struct cd_call_exit *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		count_drop(CD_DROP_EXIT_LOST);
		return;
	}
	fill_header(&e->h, CD_EV_CALL_EXIT, sizeof(*e), CD_TAIL_NONE, 0, s->ckey.tgid, tid, bpf_ktime_get_ns());
	e->cookie = s->cookie;
	e->enter_ts_ns = s->ts;
	e->ret = r->ret;
	e->out_value = r->out;
	e->depth = r->depth;
	e->pad = 0;
	bpf_ringbuf_submit(e, record_wakeup());
}

/* USER_SCOPE RecordFunctions (events.h, cd_scope_key): open from the begin
 * to the first end.  The scope is a uint8_t: the register's low byte. */
#define CD_USER_SCOPE 7

static __always_inline void track_scope(const struct entry *en)
{
	struct cd_scope_key k = {.tgid = en->tgid, .self = slot_arg(en->args, CD_COOKIE_COUNT(en->cookie))};

	if (en->role == CD_ROLE_SCOPE_BEGIN && (slot_arg(en->args, CD_COOKIE_PEER(en->cookie)) & 0xff) == CD_USER_SCOPE)
		bpf_map_update_elem(&open_scopes, &k, &en->ts, BPF_ANY);
	else if (en->role == CD_ROLE_SCOPE_END)
		bpf_map_delete_elem(&open_scopes, &k);
}

SEC("uprobe.multi")
int call_enter(struct pt_regs *ctx)
{
	struct entry en = {};
	struct cd_count_key key;
	struct cd_thread *st = 0;
	__u64 pid_tgid, cookie, wakeup;
	__u32 counted, tid;
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
	if (!st && wants_thread(&en))
		st = thread_get(en.tid);
	if (st) {
		st->flags = en.flags;
		st->flags_gen = en.gen;
	}
	if (st && wants_frames(&en))
		track_frames(st, &en);
	counted = count_entry(&en, &key);
	/* A return-probed call is recorded at its return, in one record; but a
	 * thread's first record goes out now (see events.h, cd_call). */
	first = st && wants_records(&en) && !st->announced;
	if (CD_COOKIE_RET(en.cookie) && st && push_inflight(st, &en, &key, counted, first) && !first)
		return 0;
	if (!wants_records(&en))
		return 0;
	track_scope(&en);
	wakeup = call_wakeup(st);
	if (!emit_enter_ctx(&en, wakeup))
		emit_enter(&en, wakeup);
	return 0;
}

/* ---- call probes: communicators ---------------------------------------------- */

/* Remember a communicator created by the call that just returned. */
static __always_inline void note_comm(const struct cd_inflight *s, struct cd_thread *st, __u64 comm,
				      __u32 role, __s32 split_index)
{
	struct cd_comm_key k = {.tgid = s->ckey.tgid, .comm = comm};
	__u32 zero = 0;
	struct cd_comm_val *v = bpf_map_lookup_elem(&comm_scratch, &zero);

	if (!v)
		return;
	__builtin_memset(v, 0, sizeof(*v));
	v->created_ns = s->ts;
	if (role == CD_ROLE_COMM_INIT) {
		v->origin = CD_COMM_FROM_ID;
		v->nranks = (__s32)slot_arg(s->args, CD_COOKIE_COUNT(s->cookie));
		v->rank = (__s32)slot_arg(s->args, CD_COOKIE_PEER(s->cookie));
		__builtin_memcpy(v->unique_id, st->unique_id, CD_UNIQUE_ID_BYTES);
	} else {
		v->origin = CD_COMM_FROM_SPLIT;
		v->nranks = -1;
		v->rank = -1;
		v->key = (__s32)slot_arg(s->args, CD_COOKIE_COUNT(s->cookie));
		v->color = (__s32)slot_arg(s->args, CD_COOKIE_PEER(s->cookie));
		v->parent = slot_arg(s->args, CD_COOKIE_COMM(s->cookie));
		v->split_index = split_index;
	}
	if (bpf_map_update_elem(&comms, &k, v, BPF_ANY))
		count_drop(CD_DROP_COMM_FULL);
}

/* ncclCommInitAll(comms, ndev, devlist): one comm per device. */
static __always_inline void note_comm_list(const struct cd_inflight *s)
{
	__u64 ndev = slot_arg(s->args, CD_COOKIE_COUNT(s->cookie));
	__u64 n = ndev < CD_MAX_COMM_LIST ? ndev : CD_MAX_COMM_LIST;
	__u32 zero = 0;
	struct cd_comm_val *v = bpf_map_lookup_elem(&comm_scratch, &zero);

	if (!v)
		return;
	__builtin_memset(v, 0, sizeof(*v));
	for (__u32 i = 0; i < CD_MAX_COMM_LIST; i++) {
		struct cd_comm_key k = {.tgid = s->ckey.tgid};
		__u64 c = 0;

		if (i >= n)
			break;
		if (bpf_probe_read_user(&c, sizeof(c), (void *)(s->out_ptr + 8 * i)) || !c)
			continue;
		k.comm = c;
		v->origin = CD_COMM_FROM_ALL;
		v->nranks = (__s32)n;
		v->rank = (__s32)i;
		v->created_ns = s->ts;
		bpf_map_update_elem(&comms, &k, v, BPF_ANY);
	}
}

/* Communicators created, split or ended by the call that returned. */
static __always_inline void track_comm(const struct cd_inflight *s, struct cd_thread *st, const struct ret_info *r)
{
	__u32 role = CD_COOKIE_ROLE(s->cookie), tail = CD_COOKIE_TAIL(s->cookie);
	__u64 comm_arg = slot_arg(s->args, CD_COOKIE_COMM(s->cookie));
	__s32 split_index = -1;

	if (role == CD_ROLE_COMM_SPLIT) {
		/* Every rank splits a parent in the same order, also ranks that get
		 * no child (NCCL_SPLIT_NOCOLOR): the n-th split is the same on all. */
		struct cd_comm_key pk = {.tgid = s->ckey.tgid, .comm = comm_arg};
		struct cd_comm_val *pv = bpf_map_lookup_elem(&comms, &pk);

		split_index = pv ? (__s32)__sync_fetch_and_add(&pv->nsplits, 1) : -1;
	}
	if (r->ret == 0 && r->out &&
	    (role == CD_ROLE_COMM_SPLIT || (role == CD_ROLE_COMM_INIT && tail == CD_TAIL_UNIQUE_ID)))
		note_comm(s, st, r->out, role, split_index);
	if (r->ret == 0 && role == CD_ROLE_COMM_INIT && tail == CD_TAIL_COMM_LIST && s->out_ptr)
		note_comm_list(s);
	if (role == CD_ROLE_COMM_END && comm_arg) {
		struct cd_comm_key k = {.tgid = s->ckey.tgid, .comm = comm_arg};
		struct cd_comm_val *v = bpf_map_lookup_elem(&comms, &k);

		if (v)
			v->destroyed = 1;
	}
}

SEC("uretprobe.multi")
int call_exit(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct cd_thread *st;
	struct cd_inflight *s;
	struct ret_info r = {};

	if (!armed)
		return 0;
	st = bpf_map_lookup_elem(&threads, &tid);
	s = pop_inflight(st);
	if (!s)
		return 0;
	r.depth = st->depth;
	/* ncclResult_t is a 32-bit enum: the upper half of rax is garbage */
	r.ret = (__s32)PT_REGS_RC(ctx);
	if (r.ret != 0)
		count_error(s);
	if (s->out_ptr && CD_COOKIE_ROLE(s->cookie) != CD_ROLE_COMM_END &&
	    bpf_probe_read_user(&r.out, sizeof(r.out), (void *)s->out_ptr))
		r.out = 0;
	track_comm(s, st, &r);
	if (!(s->flags & CD_TRACE_RECORDS))
		return 0;
	if (s->entry_sent)
		emit_exit(s, tid, &r);
	else
		emit_call(s, st, tid, &r);
	return 0;
}

/* The entry of an in-flight call, as its entry record. */
static __always_inline void emit_open_call(const struct cd_inflight *s, __u32 tid)
{
	struct entry en = {
		.cookie = s->cookie, .ts = s->ts, .ip = s->ip, .sp = s->sp, .tgid = s->ckey.tgid, .tid = tid,
		.flags = s->flags, .role = CD_COOKIE_ROLE(s->cookie), .group_depth = s->group_depth,
		.frame_depth = s->frame_depth, .entry_flags = s->entry_flags,
	};

	__builtin_memcpy(en.args, s->args, sizeof(en.args));
	emit_enter(&en, BPF_RB_FORCE_WAKEUP);
}

/* A thread exiting inside return-probed calls (killed in a collective): its
 * open calls are sent as entries, so the report shows where it was. */
static __always_inline void emit_open_calls(struct cd_thread *st, __u32 tid)
{
	for (__u32 i = 0; i < CD_MAX_INFLIGHT; i++) {
		struct cd_inflight *s = &st->s[i & (CD_MAX_INFLIGHT - 1)];

		if (i >= st->depth)
			break;
		if ((s->flags & CD_TRACE_RECORDS) && !s->entry_sent)
			emit_open_call(s, tid);
	}
}

/*
 * The dynamic loader calls _dl_debug_state() after every change to its link
 * map, once the new objects are mapped and before their constructors run.
 * For processes traced with CD_TRACE_DL_STOP the thread is stopped here so
 * that userspace can attach to a freshly mapped libnccl before its first
 * call; userspace sends SIGCONT once attached (a watchdog does it if
 * userspace dies).  The signal goes first: a SIGCONT can then never precede
 * the stop it is meant to end.
 */
SEC("uprobe")
int dl_debug_state(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 *flags = bpf_map_lookup_elem(&traced, &tgid);
	struct cd_dl_change *e;
	__u32 stopped = 0;

	if (!flags)
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		/* no event, so nobody would resume it: do not stop */
		count_drop(CD_DROP_DL_EVENT);
		return 0;
	}
	if ((*flags & CD_TRACE_DL_STOP) && bpf_send_signal_thread(SIGSTOP) == 0)
		stopped = 1;
	fill_header(&e->h, CD_EV_DL_CHANGE, sizeof(*e), CD_TAIL_NONE, 0, tgid, (__u32)pid_tgid,
		    bpf_ktime_get_ns());
	e->stopped = stopped;
	e->uid = (__u32)bpf_get_current_uid_gid();
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP); /* the thread waits for it */
	return 0;
}


/* Children of a followed process are traced from their first instruction;
 * those of a CD_TRACE_NOTE_FORK process are only reported. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	__u32 *flags, f;

	if (ptgid == ctgid)
		return 0; /* a new thread */
	flags = bpf_map_lookup_elem(&traced, &ptgid);
	if (!flags || !(*flags & (CD_TRACE_FOLLOW | CD_TRACE_NOTE_FORK)))
		return 0;
	f = *flags;
	if (f & CD_TRACE_FOLLOW)
		bpf_map_update_elem(&traced, &ctgid, &f, BPF_ANY);
	emit_proc(CD_EV_PROC_FORK, ctgid, ptgid, 0);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;

	struct cd_thread *st = bpf_map_lookup_elem(&threads, &tid);

	if (st && st->depth)
		emit_open_calls(st, tid);
	bpf_map_delete_elem(&threads, &tid);
	bpf_map_delete_elem(&ctx_bufs, &tid);
	if (!bpf_map_lookup_elem(&traced, &tgid))
		return 0;
	/* live drops to 0 when the last thread of the group exits */
	if (BPF_CORE_READ(p, signal, live.counter) != 0)
		return 0;
	bpf_map_delete_elem(&traced, &tgid);
	emit_proc(CD_EV_PROC_EXIT, tgid, 0, BPF_CORE_READ(p, exit_code));
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
#define VM_EXEC 0x4

struct vma_match {
	struct file_key k;
	int hit;
};

static long check_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_match *m = data;
	char name[16] = {};
	struct file *f;

	if (!(BPF_CORE_READ(vma, vm_flags) & VM_EXEC))
		return 0;
	f = BPF_CORE_READ(vma, vm_file);
	if (!f)
		return 0;
	if (bpf_probe_read_kernel_str(name, sizeof(name), BPF_CORE_READ(f, f_path.dentry, d_name.name)) < 0)
		return 0;
	/* "libnccl.so*" only: not the net/tuner/profiler plugins (libnccl-*) */
	if (name[0] != 'l' || name[1] != 'i' || name[2] != 'b' || name[3] != 'n' || name[4] != 'c' ||
	    name[5] != 'c' || name[6] != 'l' || name[7] != '.' || name[8] != 's' || name[9] != 'o')
		return 0;
	m->k.dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	m->k.ino = BPF_CORE_READ(f, f_inode, i_ino);
	m->hit = 1;
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(on_mmap_file, struct pt_regs *regs, long ret)
{
	struct vma_match m = {};
	struct cd_dl_change *e;
	__u64 pid_tgid;
	__u32 uid;

	if (!count_all || !stop_on_new_file || CD_SYSCALL_NR(regs) != CD_NR_MMAP ||
	    (unsigned long)ret >= (unsigned long)-4095L)
		return 0;
	bpf_find_vma(bpf_get_current_task_btf(), (__u64)ret, check_vma, &m, 0);
	if (!m.hit || bpf_map_lookup_elem(&known_files, &m.k) || !in_scope())
		return 0;
	uid = (__u32)bpf_get_current_uid_gid();
	if (uid != 0 && (others_capped || bpf_map_lookup_elem(&capped_uids, &uid))) {
		count_drop(CD_DROP_FILE_SHARE);
		return 0;
	}
	pid_tgid = bpf_get_current_pid_tgid();
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(CD_DROP_DL_EVENT);
		return 0;
	}
	e->stopped = bpf_send_signal_thread(SIGSTOP) == 0;
	if (e->stopped) {
		__u32 tgid = pid_tgid >> 32, one = 1;

		bpf_map_update_elem(&stopped_pids, &tgid, &one, BPF_ANY);
	}
	fill_header(&e->h, CD_EV_DL_CHANGE, sizeof(*e), CD_TAIL_NONE, 0, pid_tgid >> 32, (__u32)pid_tgid,
		    bpf_ktime_get_ns());
	e->uid = uid;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP); /* the process waits for it */
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
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 *flags = bpf_map_lookup_elem(&traced, &tgid);
	struct cd_dl_change *e;

	if (!flags)
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		/* no event, so nobody would resume it: do not stop */
		count_drop(CD_DROP_DL_EVENT);
		return 0;
	}
	/* the signal first, as in dl_debug_state */
	e->stopped = (*flags & CD_TRACE_DL_STOP) && bpf_send_signal_thread(SIGSTOP) == 0;
	fill_header(&e->h, CD_EV_EXEC, sizeof(*e), CD_TAIL_NONE, 0, tgid, (__u32)pid_tgid, bpf_ktime_get_ns());
	e->uid = (__u32)bpf_get_current_uid_gid();
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP); /* the process waits for it */
	return 0;
}
