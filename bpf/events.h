/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The one contract between the BPF programs and userspace.
 *
 * Fixed-width fields, explicit padding, sizes checked on both sides.  Every
 * record in the ring buffer starts with struct cd_header; `size` covers the
 * header, the fixed body and the variable-length tail, so a reader can skip
 * kinds it does not know and a newer kernel side can append tails (a Python
 * stack, a communicator id) without breaking an older reader.
 */
#ifndef COMMDBG_EVENTS_H
#define COMMDBG_EVENTS_H

#ifdef __bpf__
/* vmlinux.h provides __u8.. __u64 */
#else
/* The kernel's own definitions: own typedefs (__u64 as uint64_t) would clash
 * with <linux/types.h>, which libbpf.h and <sys/stat.h> pull in. */
#include <linux/types.h>
#include <stdint.h>
#endif

#define CD_ABI_VERSION 1

/* ---- probe cookies ------------------------------------------------------
 * A probe spec is data; the cookie carries what the BPF program needs of it:
 * which symbol fired (an index into userspace's symbol table) and which
 * argument slot holds what.  Arg slots: 0..5 are the integer registers,
 * 6 and 7 the first two stack words (sp+8, sp+16).  A slot value of 0xf
 * means "not present".
 *
 *  bits  0..19  symbol id      (index into the session's symbol table)
 *  bits 20..23  role           (enum cd_role)
 *  bits 24..27  count slot
 *  bits 28..31  datatype slot
 *  bits 32..35  comm slot
 *  bits 36..39  reduction-op slot (a c10d method's: its options argument,
 *               whose first member is a c10d::ReduceOp; see cd_torch_cfg)
 *  bits 40..43  root/peer slot (a c10d method's: its options argument, which
 *               holds rootRank; see cd_torch_cfg)
 *  bits 44..47  out-pointer slot (communicator written by an init/split)
 *  bits 48..51  tail source    (enum cd_tail_kind captured at entry)
 *  bits 52..55  collective kind (enum cd_coll, for kernel counters)
 *  bit  56      return probe wanted (only for symbols that cannot throw)
 *  bit  57      a counted slot (count..out above) is a stack word
 *  bit  58      a slot of a record (any role, stream and buffers too) is a
 *               stack word: records read the stack only then
 *  bit  59      records of this symbol carry the calling thread's Python
 *               stack (CD_TAIL_CONTEXT), where its process has a cd_py_cfg
 *  bits 60..63  tensor parameters of a c10d process-group method (enum
 *               cd_tensor_param, 2 bits each: its first and second
 *               parameter); 0: none.  Such a method returns
 *               c10::intrusive_ptr<Work> in memory, so `this` is slot 1 and
 *               its parameters slots 2 and 3 (see cd_torch_cfg)
 *  For tail source CD_TAIL_LABEL the out-pointer slot (bits 44..47) names
 *  the argument holding a `std::string const*` (libstdc++: data pointer at
 *  +0, length at +8): the label a record_function scope is opened with.
 */
#define CD_SLOT_NONE 0xfu
#define CD_COOKIE_SYM(c) ((__u32)((c)&0xfffffu))
#define CD_COOKIE_ROLE(c) ((__u32)(((c) >> 20) & 0xfu))
#define CD_COOKIE_COUNT(c) ((__u32)(((c) >> 24) & 0xfu))
#define CD_COOKIE_DTYPE(c) ((__u32)(((c) >> 28) & 0xfu))
#define CD_COOKIE_COMM(c) ((__u32)(((c) >> 32) & 0xfu))
#define CD_COOKIE_REDOP(c) ((__u32)(((c) >> 36) & 0xfu))
#define CD_COOKIE_PEER(c) ((__u32)(((c) >> 40) & 0xfu))
#define CD_COOKIE_OUT(c) ((__u32)(((c) >> 44) & 0xfu))
#define CD_COOKIE_TAIL(c) ((__u32)(((c) >> 48) & 0xfu))
#define CD_COOKIE_COLL(c) ((__u32)(((c) >> 52) & 0xfu))
#define CD_COOKIE_RET(c) ((__u32)(((c) >> 56) & 0x1u))
#define CD_COOKIE_STACK_COUNT(c) ((__u32)(((c) >> 57) & 0x1u))
#define CD_COOKIE_STACK_RECORD(c) ((__u32)(((c) >> 58) & 0x1u))
#define CD_COOKIE_PY_STACK(c) ((__u32)(((c) >> 59) & 0x1u))
#define CD_COOKIE_TENSORS(c) ((__u32)(((c) >> 60) & 0xfu))
#define CD_TENSOR_PARAM(kinds, i) (((kinds) >> (2 * (i))) & 0x3u) /* i: 0, 1 */
#define CD_TENSOR_THIS_SLOT 1
#define CD_TENSOR_FIRST_SLOT 2

/* A framework collective (c10d: a process group's method, probed at entry
 * only) may issue others before it returns: the calls made while it is open
 * are nested (cd_count_val.nested).  A library collective (NCCL) takes its
 * communicator as an argument and issues none, also where its return probe
 * is left out (commdbgd --no-count-errors). */
#define CD_COOKIE_FRAMEWORK_COLL(c)                                                                           \
	(CD_COOKIE_ROLE(c) == CD_ROLE_COLLECTIVE && !CD_COOKIE_RET(c) && CD_COOKIE_COMM(c) == CD_SLOT_NONE)

/* What a probed symbol is.  New roles (python frame, fsdp hook) append. */
enum cd_role {
	CD_ROLE_COLLECTIVE = 1, /* a collective or p2p call: counted */
	CD_ROLE_OP = 2,		/* framework dispatch (aten op) */
	CD_ROLE_ANNOTATION = 3, /* module / phase boundary */
	CD_ROLE_COMM_INIT = 4,	/* creates a communicator from a unique id */
	CD_ROLE_COMM_SPLIT = 5, /* creates a communicator from a parent */
	CD_ROLE_COMM_END = 6,	/* destroys / aborts / finalizes */
	CD_ROLE_GROUP_START = 7,
	CD_ROLE_GROUP_END = 8,
	CD_ROLE_OTHER = 9, /* traced, not counted */
	/* record_function scopes (specs/torch-scopes.json):
	 * SCOPE_LABEL  torch >= 2: record_function_enter_new(name, args), the
	 *              label in a CD_TAIL_LABEL: opens a scope; the SCOPE_BEGIN
	 *              it makes follows where the constructor is probed
	 * SCOPE_BEGIN  at::RecordFunction::RecordFunction(RecordScope): `this`
	 *              in slot 0 (count slot), the scope in slot 1 (peer slot);
	 *              scope 7 (USER_SCOPE) opens a scope record
	 * SCOPE_END    at::RecordFunction::end(): `this` in slot 0 closes it;
	 *              with no count slot, torch >= 2's record_function exit
	 *              (record_function_exit_new, a static function found in
	 *              torch's code: torch/record_function.hpp): closes the
	 *              thread's innermost scope a SCOPE_LABEL opened.  Where the
	 *              library's Python package calls that exit, the constructor
	 *              and end() are not probed (specs/torch-scopes.json) */
	CD_ROLE_SCOPE_LABEL = 10,
	CD_ROLE_SCOPE_BEGIN = 11,
	CD_ROLE_SCOPE_END = 12,
	/* MODULE_ENTER  torch::jit::tracer::getTracingState(), which
	 *               nn.Module._call_impl calls first (torch 1.13 and 2.x):
	 *               with its Python stack, a module call begins; no record */
	CD_ROLE_MODULE_ENTER = 13,
	/* Autograd nodes (specs/torch-autograd.json), records carrying a Node*
	 * in the count slot, read in the kernel where the call's arguments
	 * still hold it:
	 * GRAD_FN        torch::autograd::impl::set_gradient_edge / rebase_history
	 *                (tensor, Edge): forward made a node (a tensor's grad_fn).
	 *                The count slot holds the Edge*: an Edge is
	 *                non-trivially copyable (its shared_ptr<Node>), so the
	 *                Itanium ABI passes it by invisible reference; its first
	 *                word is the shared_ptr's Node* (torch's edge.h,
	 *                libstdc++), which replaces it in the record
	 * AUTOGRAD_NODE  torch::autograd::Engine::evaluate_function(graph_task,
	 *                Node*, ...): the engine runs a node; its first word,
	 *                the node's class's vtable, goes in CD_NODE_VTABLE_SLOT
	 * Both are points in time, not frames: no native frame, no counter. */
	CD_ROLE_GRAD_FN = 14,
	CD_ROLE_AUTOGRAD_NODE = 15,
};
#define CD_NODE_VTABLE_SLOT 7 /* args[] of an AUTOGRAD_NODE record: the node's vtable (0: unreadable) */

/* Collective kinds, shared by layers (nccl, c10d).  Index of comm_counts. */
enum cd_coll {
	CD_COLL_NONE = 0,
	CD_COLL_ALL_REDUCE = 1,
	CD_COLL_ALL_GATHER = 2,
	CD_COLL_REDUCE_SCATTER = 3,
	CD_COLL_BROADCAST = 4,
	CD_COLL_REDUCE = 5,
	CD_COLL_ALL_TO_ALL = 6,
	CD_COLL_GATHER = 7,
	CD_COLL_SCATTER = 8,
	CD_COLL_SEND = 9,
	CD_COLL_RECV = 10,
	CD_COLL_BARRIER = 11,
	CD_COLL_MAX = 12,
};

/* Variable-length tails an event may carry. */
enum cd_tail_kind {
	CD_TAIL_NONE = 0,
	CD_TAIL_UNIQUE_ID = 1, /* 128-byte ncclUniqueId read from sp+8 */
	CD_TAIL_COMM_LIST = 2, /* up to CD_MAX_COMM_LIST comm pointers (InitAll) */
	CD_TAIL_PY_STACK = 3,  /* unused: stacks travel in CD_TAIL_CONTEXT */
	CD_TAIL_LABEL = 4,     /* cookie: read a std::string label (see bit 59 above) */
	CD_TAIL_CONTEXT = 5,   /* record: struct cd_context (label and/or Python frames) */
	CD_TAIL_TENSORS = 6,   /* record: struct cd_tensors, then a CD_TAIL_CONTEXT's bytes */
	/* c10d process groups (role CD_ROLE_COMM_INIT, entry only, noted in the
	 * `comms` map, no record, no count; lib/comms.h, note_c10d): the object
	 * (`this`) in the reduction-op slot, a `std::string const*` (libstdc++:
	 * data pointer at +0, length at +8) in the out slot, a pointer to a
	 * c10::intrusive_ptr<Store> (one pointer, its target) in the datatype
	 * slot, rank in the peer slot and size in the count slot.  By-value
	 * std::string and intrusive_ptr parameters are non-trivially copyable,
	 * so the Itanium ABI passes them by invisible reference: a pointer
	 * either way. */
	CD_TAIL_C10D_STORE = 7, /* PrefixStore(prefix, store): a new store named by its prefix */
	CD_TAIL_C10D_GROUP = 8, /* a process group's constructor (store, rank, size) */
};

/* ---- tensors of a framework call ---------------------------------------
 * A c10d method's tensor parameters (cookie bits 60..63), read in the kernel
 * at entry where the process has a cd_torch_cfg (torch_procs map, key:
 * tgid), written by userspace from its libc10 and libtorch files' own code
 * and symbols (userspace/torch/, docs/design/tensor-layout.md).  Nothing is
 * read unless `this` is an object of a process-group class userspace named
 * (its first word is that class's vtable): the parameters are then where the
 * cookie says.  A TensorImpl is read only when its first word is
 * c10::TensorImpl's own vtable (a subclass may keep its shape elsewhere). */
enum cd_tensor_param {
	CD_TPARAM_NONE = 0,
	CD_TPARAM_TENSOR = 1,	     /* at::Tensor&: a pointer to the tensor's one TensorImpl* */
	CD_TPARAM_VECTOR = 2,	     /* std::vector<at::Tensor>&: begin at +0, end at +8 (libstdc++) */
	CD_TPARAM_VECTOR_VECTOR = 3, /* std::vector<std::vector<at::Tensor>>&: its first inner vector's */
};

#define CD_TENSOR_DIMS 6    /* sizes kept per tensor; cd_tensor.ndim may say more */
#define CD_MAX_TENSORS 4    /* per record; cd_tensors.total says how many each parameter had */
#define CD_TORCH_GROUPS 4   /* process-group classes per process */
#define CD_TORCH_REDUCE_OPS 4 /* copies of c10d::ReduceOp's vtable per process */
#define CD_TENSOR_WINDOW 256 /* bytes of a TensorImpl read at once: every field below inside */
#define CD_TORCH_NO_OFFSET 0xffffu

struct cd_torch_group {
	__u64 vtable; /* the class's vtable address point in the process; 0: unused */
	__u16 rank;   /* byte offsets of its int rank_ and size_; CD_TORCH_NO_OFFSET: unknown */
	__u16 size;
	__u32 pad;
};

struct cd_torch_cfg {
	__u64 impl_vtable; /* c10::TensorImpl's vtable address point */
	__u64 undefined;   /* &c10::UndefinedTensorImpl::_singleton */
	__u16 dim;	   /* TensorImpl field offsets (torch::TensorLayout) */
	__u16 sizes;
	__u16 numel;
	__u16 data_type;
	__u16 symbolic_at;
	__u8 symbolic_mask;
	__u8 inline_dims;
	__u16 span; /* bytes read from a TensorImpl: every field's end, <= CD_TENSOR_WINDOW */
	__u16 reduce_op_at; /* byte offset of c10d::ReduceOp's op_ (a RedOpType, one byte) */
	/* byte offsets of rootRank in a BroadcastOptions and a ReduceOptions
	 * (the latter read only once its ReduceOp is known, see reduce_ops);
	 * CD_TORCH_NO_OFFSET: unknown */
	__u16 broadcast_root_at;
	__u16 reduce_root_at;
	__u32 pad;
	/* c10d::ReduceOp's vtable address points, one per torch file that has
	 * its own copy (libtorch_cpu's, libtorch_python's: an options struct
	 * made by Python holds the latter); 0: unused.  A c10d method's options
	 * (AllreduceOptions, ReduceScatterOptions, ...) hold a ReduceOp first:
	 * read only when their first word is one of these. */
	__u64 reduce_ops[CD_TORCH_REDUCE_OPS];
	struct cd_torch_group groups[CD_TORCH_GROUPS];
};

enum cd_tensor_status {
	CD_TENSOR_OK = 1,
	CD_TENSOR_UNDEFINED = 2, /* an undefined at::Tensor */
	CD_TENSOR_NOT_PLAIN = 3, /* not a c10::TensorImpl itself: not read */
	CD_TENSOR_FAULT = 4,	 /* a read failed */
	CD_TENSOR_SYMBOLIC = 5,	 /* symbolic sizes: the stored ones are not its shape */
};

struct cd_tensor {
	__s64 sizes[CD_TENSOR_DIMS];
	__s64 numel;
	__u16 dtype;  /* data_type_: a caffe2::TypeMeta index */
	__u8 ndim;    /* its dim count (sizes holds the first CD_TENSOR_DIMS) */
	__u8 status;  /* enum cd_tensor_status */
	__u8 param;   /* 0: the method's first tensor parameter, 1: its second */
	__u8 pad[3];
};

enum cd_tensors_status {
	CD_TENSORS_OK = 1,
	CD_TENSORS_NOT_A_GROUP = 2, /* `this` is no known process group: nothing read */
	CD_TENSORS_FAULT = 3,	    /* `this` or a parameter could not be read */
};

#define CD_TENSORS_MORE_LISTS (1u << 0) /* a vector<vector> parameter had more than one inner list */

struct cd_tensors {
	__s32 group_rank; /* -1: unknown */
	__s32 group_size;
	__u8 kinds;	/* the cookie's bits 60..63 */
	__u8 status;	/* enum cd_tensors_status */
	__u8 ntensors;	/* entries of t[] filled */
	__u8 flags;	/* CD_TENSORS_* */
	__u16 total[2]; /* tensors each parameter held */
	__u8 pad[8];
	struct cd_tensor t[CD_MAX_TENSORS];
};

/* ---- framework context: labels and Python stacks ------------------------
 * A record whose cookie asks for a label or a Python stack carries one
 * struct cd_context after its body (header tail_kind CD_TAIL_CONTEXT):
 * the fixed part, then `nframes` struct cd_py_frame, innermost first.
 * tail_len = sizeof(struct cd_context) + nframes * sizeof(struct cd_py_frame).
 */
#define CD_LABEL_MAX 128
#define CD_MAX_PY_FRAMES 128   /* compile-time bound; cd_py_cfg.max_frames the run-time one */
#define CD_DEFAULT_PY_FRAMES 64
/* A record with a Python stack wakes the reader unless one did less than this
 * long ago; the reader reads again this long after a wake-up by itself. */
#define CD_CONTEXT_WAKE_NS 5000000ull

enum cd_py_status {
	CD_PY_NONE = 0,	     /* not walked: the record wants no stack, or no cd_py_cfg */
	CD_PY_OK = 1,	     /* frames are the thread's stack (see CD_CTX_TRUNCATED) */
	CD_PY_NO_TSTATE = 2, /* a thread without Python (gloo worker, NCCL proxy): no frames */
	CD_PY_FAULT = 3,     /* a read failed mid-walk: the frames read so far, innermost first */
};

#define CD_CTX_TRUNCATED (1u << 0) /* the walk stopped at max_frames: more frames above */
#define CD_CTX_LABEL_CUT (1u << 1) /* the label was longer than CD_LABEL_MAX - 1 bytes */

struct cd_py_frame {
	__u64 code;	 /* PyCodeObject* of the frame */
	__u64 self;	 /* localsplus[0] (a cell's contents when it holds a cell and was read); may be garbage */
	__u64 self_type; /* ob_type of `self`, read in the kernel (instances may die before userspace looks);
			  * 0: unreadable, or not read: the frame's code needs none (cd_py_codes) */
	__u64 instr;	 /* 3.11+: the frame's instruction pointer; 3.10: f_lasti */
};

struct cd_context {
	__u16 label_len; /* bytes in label (no NUL); 0: none */
	__u16 nframes;
	__u16 py_status; /* enum cd_py_status */
	__u16 flags;	 /* CD_CTX_* */
	char label[CD_LABEL_MAX];
	/* struct cd_py_frame frames[nframes] follow */
};

/* record_function scopes open in the kernel's view (`open_scopes`, an LRU
 * map): a USER_SCOPE RecordFunction from its begin to its first end.  While
 * its key is there the Python record_function object lives, so a label read
 * from it in userspace is its own (torch 1.13 keeps the label in Python). */
struct cd_scope_key {
	__u32 tgid;
	__u32 pad;
	__u64 self; /* the RecordFunction's `this` */
};

#define CD_SCOPE_LABEL_FRAMES 8
#define CD_PY311_VALUES_BEFORE 32 /* CPython 3.11: an instance's values pointer, 4 words before it */

/* Per traced Python process (`py_procs` map, key: tgid): how to walk its
 * frames, from userspace's discovery (python_runtime.hpp, PyLayout). */
#define CD_PYCFG_SKIP_NONE_CODE (1u << 0) /* 3.13: skip frames whose code is &_Py_NoneStruct */
#define CD_PYCFG_LASTI_INT (1u << 1)	  /* 3.10: frame_instr is an int f_lasti */

struct cd_py_cfg {
	__u64 cell_type;  /* &PyCell_Type: `self` captured by a closure */
	__u64 none_addr;  /* &_Py_NoneStruct */
	__u32 key;	  /* autoTSSkey's value */
	__u32 tls_base;	  /* tstate = *(fsbase + tls_base + tls_stride * key + tls_data) */
	__u32 tls_stride;
	__u32 tls_data;
	__u32 ts_frame;	      /* f = *(ts + ts_frame) */
	__u32 ts_frame_inner; /* then f = *(f + ts_frame_inner) unless 0xffffffff */
	__u32 ts_thread_id;   /* == fsbase, or the slot is not this thread's */
	__u32 frame_code;
	__u32 frame_previous;
	__u32 frame_localsplus;
	__u32 frame_owner;	  /* 0xffffffff: none (3.10, 3.11) */
	__u32 frame_owner_cstack; /* owner value of C-stack frames: skipped */
	__u32 frame_instr;
	__u32 ob_type;
	__u32 cell_contents;
	__u32 max_frames; /* <= CD_MAX_PY_FRAMES */
	__u32 flags;	  /* CD_PYCFG_* */
	__u32 pad;
	/* torch 1.13 keeps a scope's label in Python only: at a SCOPE_BEGIN the
	 * kernel reads it from the `name` of the record_function whose
	 * __enter__ is among the innermost CD_SCOPE_LABEL_FRAMES frames (3.11:
	 * values array at self - CD_PY311_VALUES_BEFORE, slot rf_name_index; a
	 * compact ASCII str).  rf_type 0: not known yet. */
	__u64 rf_type;
	__u32 rf_name_index;
	__u32 str_length;     /* PyASCIIObject: length, state, data of a compact ASCII str */
	__u32 str_state;
	__u32 str_ascii_data;
	/* The thread state is read in one piece: ts_span bytes from ts + ts_lo
	 * (<= CD_PY_TS_WINDOW), every ts_* offset above inside it. */
	__u32 ts_lo;
	__u32 ts_span;
	/* 3.11+: datastack_chunk; datastack_top and datastack_limit follow it
	 * (cpython/pystate.h of 3.11-3.13).  The frames in the chunk are read in
	 * bulk from that copy, the others one by one.  0xffffffff: no data stack
	 * (3.10). */
	__u32 ts_stack;
	__u32 frame_span; /* bytes of a frame the walker reads (its fields' end), <= CD_PY_FRAME_WINDOW */
};

#define CD_PY_TS_WINDOW 272
/* Bytes of a frame the walker reads at once: cd_py_cfg.frame_span at most. */
#define CD_PY_FRAME_WINDOW 128

/* What userspace learnt of a process's code objects (`py_codes`, key:
 * tgid), so that `self`'s type -- a user-memory read per frame, the most
 * expensive part of a walk -- is read only where a record can use it: in an
 * nn.Module call frame, a record_function's __enter__, and frames inside the
 * autograd engine's entry (a module's backward hooks).  A code object not
 * in the table, or freed and its address reused by one that needs more,
 * costs a read it might not have needed, never a wrong type: the kind only
 * ever skips a read.  2-way buckets of slots `code | kind`, 0: empty. */
#define CD_PY_CODE_SLOTS 1024
enum cd_py_code_kind {
	CD_CODE_UNKNOWN = 0,  /* not in the table: read; may be an autograd entry */
	CD_CODE_NO_ARGS = 1,  /* no arguments: localsplus[0] is no `self` */
	CD_CODE_PLAIN = 2,    /* `self` is used only inside the autograd engine */
	CD_CODE_SELF = 3,     /* nn.Module._call_impl & co, record_function.__enter__, BackwardCFunction.apply */
	CD_CODE_BACKWARD = 4, /* the autograd engine's entry from Python */
};
#define CD_CODE_KIND_MASK 7ull

struct cd_py_codes {
	__u64 slot[CD_PY_CODE_SLOTS];
};

static inline __u32 cd_py_code_bucket(__u64 code)
{
	return (__u32)(((code >> 4) ^ (code >> 15)) & (CD_PY_CODE_SLOTS / 2 - 1));
}

/* The slot holding `code` in t, CD_PY_CODE_SLOTS when none (the walker's
 * lookup, and userspace's view of it). */
static inline __u32 cd_py_code_slot(const struct cd_py_codes *t, __u64 code)
{
	__u32 i = 2 * cd_py_code_bucket(code), k;

	for (k = 0; k < 2; k++) {
		__u64 v = t->slot[(i + k) & (CD_PY_CODE_SLOTS - 1)];

		if (v != 0 && (v & ~CD_CODE_KIND_MASK) == code)
			return (i + k) & (CD_PY_CODE_SLOTS - 1);
	}
	return CD_PY_CODE_SLOTS;
}

/* The kind of `code` in t. */
static inline __u32 cd_py_code_lookup(const struct cd_py_codes *t, __u64 code)
{
	__u32 i = cd_py_code_slot(t, code);

	return i < CD_PY_CODE_SLOTS ? (__u32)(t->slot[i] & CD_CODE_KIND_MASK) : (__u32)CD_CODE_UNKNOWN;
}

#define CD_UNIQUE_ID_BYTES 128
#define CD_MAX_COMM_LIST 16
#define CD_NUM_ARGS 8
#define CD_REG_SLOTS 6 /* slots 0..5: registers; 6, 7: stack words */

/* ---- ring-buffer records ---------------------------------------------- */

enum cd_event_kind {
	CD_EV_CALL_ENTER = 1, /* a probed symbol was entered */
	CD_EV_CALL_EXIT = 2,  /* a return-probed symbol returned */
	CD_EV_DL_CHANGE = 3,  /* the dynamic loader changed the link map */
	CD_EV_PROC_FORK = 4,  /* a traced process forked a traced child */
	CD_EV_PROC_EXIT = 5,  /* a traced process exited */
	CD_EV_PROC_SEEN = 6,  /* count-all mode: first probed call of a process, now traced */
	CD_EV_CALL = 7,	      /* a return-probed call, sent at its return: entry and return */
	CD_EV_EXEC = 8,	      /* a traced process exec'd (maybe into another loader): cd_dl_change */
	CD_EV_THREAD_EXIT = 9, /* a thread that made probed calls exited: cd_thread_exit (its last name) */
	CD_EV_BATCH = 10,      /* a thread's cd_call records, sent together: cd_header, then those (lib/batch.h) */
};

struct cd_header {
	__u16 kind;	 /* enum cd_event_kind */
	__u16 size;	 /* bytes: header + body + tail */
	__u16 tail_kind; /* enum cd_tail_kind */
	__u16 tail_len;	 /* bytes of tail after the body */
	__u32 tgid;
	__u32 tid;
	__u64 ts_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
};

struct cd_call_enter {
	struct cd_header h;
	__u64 cookie;
	__u64 ip;		  /* probed address in the process */
	__u64 sp;		  /* user stack pointer at entry: nesting */
	__u64 args[CD_NUM_ARGS]; /* 6 registers, then sp+8, sp+16 (CD_ENTRY_STACK_ARGS) */
	__u16 group_depth;	  /* ncclGroupStart nesting of this thread */
	__u16 entry_flags;	  /* CD_ENTRY_* */
	__u32 frame_depth;	  /* open entry-only frames of this thread, or CD_DEPTH_UNKNOWN */
	/* tail follows */
};

struct cd_call_exit {
	struct cd_header h;
	__u64 cookie;
	__u64 enter_ts_ns;
	__s64 ret;	/* raw return register */
	__u64 out_value; /* *out pointer after return (new comm), or 0 */
	__u32 depth;	/* inflight depth at entry (pairs enter/exit) */
	__u32 pad;
	/* tail follows (CD_TAIL_COMM_LIST for InitAll) */
};

/*
 * A return-probed call is one record, sent when it returns: the entry's
 * fields (as in cd_call_enter) kept in the thread's in-flight slot, then the
 * return's (as in cd_call_exit).  One ring-buffer reservation per call, not
 * two.  A call still in flight when the window closes is read from the
 * in-flight slots by userspace; one still in flight when its thread exits is
 * sent then as a cd_call_enter.  A thread's first call is the exception: its
 * entry goes out at once as a cd_call_enter (waking userspace, which reads
 * the thread's name while it runs) and its return as a cd_call_exit.
 * h.ts_ns is the return.
 */
struct cd_call {
	struct cd_header h;
	__u64 cookie;
	__u64 ip;
	__u64 sp;
	__u64 args[CD_NUM_ARGS];
	__u16 group_depth;
	__u16 entry_flags; /* CD_ENTRY_* */
	__u32 frame_depth;
	__u64 enter_ts_ns;
	__s64 ret;	 /* raw return register */
	__u64 out_value; /* *out pointer after return (new comm), or 0 */
	__u32 depth;	 /* inflight depth at entry */
	__u32 batch_seq; /* sent in a batch: its number in its thread's, from 1; else 0 */
};

/* commdbgd (count_all): the beginnings of the library file names whose
 * first executable mapping stops a process until they are probed
 * (lib/loader.h, file_prefix). */
#define CD_FILE_PREFIXES 4
#define CD_FILE_PREFIX_MAX 24

/* CD_EV_DL_CHANGE and CD_EV_EXEC */
struct cd_dl_change {
	struct cd_header h;
	__u32 stopped; /* 1: the process was sent SIGSTOP and waits for SIGCONT */
	__u32 uid;     /* the process's real uid: whose share a new library file takes */
};

struct cd_proc {
	struct cd_header h;
	__u32 parent_tgid; /* fork: parent; exit: 0 */
	__s32 exit_code;   /* exit: task->exit_code */
};

/* CD_EV_THREAD_EXIT: the thread's name (task->comm) as it exits, for a
 * thread userspace may only see in records read after it is gone. */
#define CD_THREAD_NAME_LEN 16
struct cd_thread_exit {
	struct cd_header h;
	char name[CD_THREAD_NAME_LEN]; /* NUL-terminated unless 16 bytes long */
};

/* Largest record the kernel side emits (tails are for future kinds: the
 * unique id stays in the kernel's comms map, see lib/comms.h). */
#define CD_MAX_RECORD                                                                                         \
	(sizeof(struct cd_call) + sizeof(struct cd_tensors) + sizeof(struct cd_context) +                        \
	 CD_MAX_PY_FRAMES * sizeof(struct cd_py_frame))

/* ---- maps shared with userspace ---------------------------------------- */

/* traced_tgids value flags */
#define CD_TRACE_COUNT (1u << 0)   /* update exact counters */
#define CD_TRACE_RECORDS (1u << 1) /* emit ring-buffer records */
#define CD_TRACE_FOLLOW (1u << 2)  /* children inherit the flags */
#define CD_TRACE_DL_STOP (1u << 3) /* stop at loader changes until resumed */
#define CD_TRACE_NOTE_FORK (1u << 4) /* report forks without tracing the children */
#define CD_TRACE_PYTHON (1u << 5)    /* has a cd_py_cfg: records walk its Python frames */
/* Records also read the stack words that only a record shows (NCCL's
 * stream): a user-memory read costs more than the rest of a recorded entry
 * (README, "What a record costs").  Stack words a counter needs (ncclReduce's
 * comm) are read regardless. */
#define CD_TRACE_STACK_ARGS (1u << 6)
/* Keep the process's collectives in the flight recorder (cd_flight): on
 * unless commdbgd runs with --no-flight-recorder. */
#define CD_TRACE_FLIGHT (1u << 7)

/* cd_call_enter.entry_flags */
#define CD_ENTRY_STACK_ARGS (1u << 0) /* args[6], args[7] are the caller's stack words */

/* Exact per-process counters: never depend on ring-buffer delivery. */
struct cd_count_key {
	__u32 tgid;
	__u32 sym; /* symbol id (cookie bits 0..19) */
	__u64 comm;
	__u32 dtype; /* CD_DTYPE_NONE: none */
	__u32 pad;
};

/* A collective entered while a framework collective of its thread is open
 * (CD_COOKIE_FRAMEWORK_COLL: gloo's allgather inside _allgather_base,
 * ncclAllReduce inside c10d's allreduce) is counted in calls and also in
 * nested: the kernel sees every frame, records may be dropped, so only it
 * can tell the outermost calls exactly (userspace: comm_counts,
 * total_counts).  Not looked for where it would cost a library call a map
 * lookup: an entry-only library collective that is only counted. */
struct cd_count_val {
	__u64 calls;
	__u64 elements; /* sum of the count argument */
	__u64 bytes;	/* elements * datatype size (0 for unknown types) */
	__u64 errors;	/* calls that returned non-zero (return probes only) */
	__u64 nested;	    /* of calls: inside an open framework collective of the thread */
	__u64 nested_bytes; /* of bytes: those calls' */
};

/*
 * The counter map is one per node, so a fine key (above) may be refused: the
 * process used up its share (a `const volatile` limit) or the map is full.
 * Every counted process also has a cd_proc_counts of its own, created when it
 * enters the trace filter, that no other process can fill: the call is then
 * counted there per symbol (coarse: no communicator or datatype), so per-kind
 * counts stay exact, and counted as having lost its breakdown.
 */
#define CD_COARSE_SLOTS 64 /* distinct collective symbols per process; a power of two */

struct cd_coarse_slot {
	__u32 sym_plus1; /* symbol id + 1; 0: free */
	__u32 pad;
	struct cd_count_val val;
};

struct cd_proc_counts {
	__u64 fine_keys;      /* keys this process holds in the counter map */
	__u64 breakdown_lost; /* calls counted in a coarse slot only */
	__u64 uncounted;      /* calls not counted at all (not a collective, or no coarse slot left) */
	__u64 pad;
	struct cd_coarse_slot coarse[CD_COARSE_SLOTS];
};

/* Communicators, kept in the kernel so that they survive record drops. */
struct cd_comm_key {
	__u32 tgid;
	__u32 pad;
	__u64 comm;
};

enum cd_comm_origin {
	CD_COMM_FROM_ID = 1,	/* CommInitRank / InitRankConfig */
	CD_COMM_FROM_SPLIT = 2, /* CommSplit */
	CD_COMM_FROM_ALL = 3,	/* CommInitAll */
	CD_COMM_C10D_GROUP = 4, /* a c10d process group (or 2.x backend): `parent` is its Store* */
	CD_COMM_C10D_STORE = 5, /* not a communicator: a c10d PrefixStore, its prefix in `name`
				 * and its inner Store* in `parent` */
};

struct cd_comm_val {
	__u32 origin; /* enum cd_comm_origin */
	__s32 nranks; /* InitRank: argument; split: unknown (-1) */
	__s32 rank;   /* InitRank: argument; InitAll: index */
	__s32 color;  /* split */
	__s32 key;    /* split */
	__u32 destroyed;
	__u32 nsplits;	   /* splits of this comm seen so far */
	__s32 split_index; /* split: n-th split of the parent (-1: parent unknown) */
	__u64 parent; /* split: parent comm pointer; c10d: the Store* */
	__u64 created_ns;
	union {
		__u8 unique_id[CD_UNIQUE_ID_BYTES]; /* NCCL: the unique id it was made from */
		char name[CD_UNIQUE_ID_BYTES];	    /* c10d: NUL-terminated, "" unknown */
	};
};

/* Stops a new library file's mapping is tried with (bpf/lib/loader.h):
 * past them CD_DROP_STOP_REFUSED. */
#define CD_STOP_TRIES 8

/* Kernel-side losses, by cause (per-CPU array index). */
enum cd_drop_cause {
	CD_DROP_RINGBUF_FULL = 0,   /* call record not emitted: ring buffer full */
	CD_DROP_COUNTER_FULL = 1,   /* fine key refused: counter map full (counted coarsely) */
	CD_DROP_INFLIGHT_DEEP = 2,  /* return state not saved: nesting too deep */
	CD_DROP_COMM_FULL = 3,	    /* communicator map full */
	CD_DROP_DL_EVENT = 4,	    /* loader or exec event lost: not stopped */
	CD_DROP_READ_FAULT = 5,	    /* user memory unreadable */
	CD_DROP_EXIT_LOST = 6,	    /* return record not emitted: its call shows no return */
	CD_DROP_PROC_EVENT = 7,	    /* fork/exit event not emitted */
	CD_DROP_COUNTER_SHARE = 8,  /* fine key refused: the process holds its share (counted coarsely) */
	CD_DROP_UNCOUNTED = 9,	    /* call not counted: no fine key and no coarse slot */
	CD_DROP_PY_CONTEXT = 10,    /* record sent without its label / Python stack: no scratch buffer */
	CD_DROP_FILE_SHARE = 11,    /* new library file not stopped for: its user holds its share of probed files */
	CD_DROP_FLIGHT_FULL = 12,   /* collective not in the flight recorder: its map is full */
	CD_DROP_STOP_REFUSED = 13,  /* new library file: the kernel refused every stop, the process ran on */
	CD_DROP_MAX = 14,
};

/* The flight recorder: per traced process and communicator (NCCL's comm
 * argument; a c10d collective's process group, lib/flight.h), the last
 * CD_FLIGHT_SLOTS collectives entered, kept in the kernel whatever happens
 * to records, so that a job that hangs can be asked afterwards (commdbg
 * hang through commdbgd).  Slot (seq - 1) % CD_FLIGHT_SLOTS holds collective
 * number seq, counted from the communicator's first collective seen.  Point-
 * to-point calls (send, recv) take no number: every rank of a communicator
 * issues its collectives in one order, not its sends and receives. */
#define CD_FLIGHT_SLOTS 256
#define CD_FLIGHT_COMMS 4096
#define CD_FLIGHT_NONE 0xffffffffu
#define CD_FLIGHT_NO_COUNT 0xffffffffffffffffull
#define CD_FLIGHT_TORCH_DTYPE 0x10000u /* cd_flight_entry.dtype: | a torch TypeMeta index (c10d), not an NCCL type */
/* Where a recorded call is (cd_flight_entry.state).  Only NCCL's C API is
 * return-probed (design.md: no return probes on C++ that may throw); NCCL
 * returns once the collective is enqueued, so "returned" means enqueued, with
 * its status, and "in the call" that the thread is still inside NCCL (or
 * died there). */
enum cd_flight_state {
	CD_FLIGHT_UNPROBED = 0, /* its return is not probed */
	CD_FLIGHT_IN_CALL = 1,	/* entered, not returned */
	CD_FLIGHT_RETURNED = 2, /* returned: status holds its value */
};

struct cd_flight_key {
	__u32 tgid;
	__u32 pad;
	__u64 comm;
};

struct cd_flight_entry {
	__u64 seq;	 /* 0: not written yet; else written last */
	__u64 enter_ns;	 /* bpf_ktime_get_ns at entry */
	__u64 return_ns; /* bpf_ktime_get_ns at return; 0: not returned */
	__u64 count;	 /* the count argument (elements); CD_FLIGHT_NO_COUNT: the call has none (c10d) */
	__u32 tid;
	__u32 sym;	/* symbol id: the kind, as for counters */
	__u32 dtype;	/* NCCL's; CD_FLIGHT_TORCH_DTYPE | torch's (c10d); CD_DTYPE_NONE: none */
	__u32 op;	/* the reduce op argument (NCCL's ncclRedOp_t; c10d's ReduceOp::RedOpType); CD_FLIGHT_NONE: none */
	__u32 root;	/* the root argument (broadcast, reduce); CD_FLIGHT_NONE: none */
	__u32 state;	/* CD_FLIGHT_UNPROBED, CD_FLIGHT_IN_CALL, CD_FLIGHT_RETURNED */
	__s32 status;	/* CD_FLIGHT_RETURNED: what it returned (ncclResult_t) */
	__u32 pad;
};

struct cd_flight {
	__u64 seq; /* collectives entered on the communicator so far */
	struct cd_flight_entry e[CD_FLIGHT_SLOTS];
};

#define CD_MAX_INFLIGHT 8

/* What a return probe needs of its entry, kept per thread until it returns
 * (the `threads` map; userspace reads the calls still open at the end of a
 * window from it). */
struct cd_inflight {
	__u64 cookie;
	__u64 ts;      /* entry time (records and communicator creation only) */
	__u64 out_ptr; /* user address the call writes a new comm to */
	__u64 ip;
	__u64 sp;
	__u64 flight_seq; /* its number in the flight recorder; 0: not recorded */
	__u64 args[CD_NUM_ARGS];
	struct cd_count_key ckey; /* ckey.tgid: the process */
	__u32 group_depth;
	__u32 frame_depth;
	__u32 counted;	  /* where the entry counted it: CD_COUNTED_* */
	__u32 flags;	  /* CD_TRACE_* of the process at entry */
	__u32 entry_sent; /* its entry went out as a cd_call_enter: the return sends a cd_call_exit */
	__u32 entry_flags; /* CD_ENTRY_* */
};

/* Where the entry counted a call, so that its return adds an error there. */
#define CD_COUNTED_NONE 0
#define CD_COUNTED_FINE 1
#define CD_COUNTED_COARSE 2 /* + slot index */

/*
 * Entry-only frames (C++ symbols: no return probes) are tracked per thread in
 * the kernel as (sp, return address) pairs.  A frame has returned when a new
 * entry's sp is at or above its sp, or when the stack slot that held its
 * return address no longer does: Python calls sibling ops from different
 * native depths, so the sp rule alone would nest a later, deeper sibling
 * under an earlier one.  The depth left after popping goes with each entry.
 * A process that is only counted tracks its framework collectives' frames
 * alone: all its counters need is whether one of the thread's is open.
 */
#define CD_MAX_FRAMES 32
#define CD_DEPTH_UNKNOWN 0xffffffffu

struct cd_frame {
	__u64 sp;
	__u64 ret; /* return address stored at sp on entry */
};

/* A thread's call records waiting to go out together (lib/batch.h): `h`
 * (kind CD_EV_BATCH) and the `n` first of `calls` are one ring-buffer record.
 * `busy` while the thread writes one (a flush elsewhere then waits); `seq`:
 * the last batch_seq given. */
#define CD_BATCH 8

struct cd_batch {
	__u32 n;
	__u32 busy;
	__u32 seq;
	__u32 pad;
	struct cd_header h;
	struct cd_call calls[CD_BATCH];
};

/* Per thread (`threads` map, key: tid). */
struct cd_thread {
	__u32 depth;	   /* open return-probed calls */
	__u32 group_depth; /* ncclGroupStart nesting */
	__u32 nframes;	   /* open entry-only frames */
	__u32 announced;   /* its first record woke the consumer */
	__u32 coll_frames; /* bit i: frames[i] is a framework collective's (cd_count_val.nested) */
	__u32 unchecked;   /* records since it last looked at the wake-up watermark */
	__u32 flags;	   /* its process's CD_TRACE_* as of traced_gen flags_gen (lib/process.h) */
	__u32 flags_gen;
	struct cd_inflight inflight[CD_MAX_INFLIGHT]; /* [0, depth): innermost last */
	struct cd_frame frames[CD_MAX_FRAMES];
	__u8 unique_id[CD_UNIQUE_ID_BYTES]; /* of the open CommInitRank */
	struct cd_batch batch;
};

/* "no datatype" in a counter key */
#define CD_DTYPE_NONE 0xffffffffu

/* Sizes both sides rely on, checked on both sides (C and C++ spellings). */
#ifdef __cplusplus
#define CD_STATIC_ASSERT static_assert
#else
#define CD_STATIC_ASSERT _Static_assert
#endif
CD_STATIC_ASSERT(sizeof(struct cd_header) == 24, "cd_header");
CD_STATIC_ASSERT(sizeof(struct cd_call_enter) == 24 + 8 * 3 + 8 * CD_NUM_ARGS + 8, "cd_call_enter");
CD_STATIC_ASSERT(sizeof(struct cd_call_exit) == 24 + 8 * 4 + 8, "cd_call_exit");
CD_STATIC_ASSERT(sizeof(struct cd_call) == sizeof(struct cd_call_enter) + 8 * 4, "cd_call");
/* A batch's header and records are one span: sent from &h in one output. */
CD_STATIC_ASSERT(__builtin_offsetof(struct cd_batch, calls) == __builtin_offsetof(struct cd_batch, h) + 24,
		 "cd_batch: its records right behind its header");
CD_STATIC_ASSERT((CD_BATCH & (CD_BATCH - 1)) == 0, "CD_BATCH: a power of two");
CD_STATIC_ASSERT(sizeof(struct cd_dl_change) == 32, "cd_dl_change");
CD_STATIC_ASSERT(sizeof(struct cd_proc) == 32, "cd_proc");
CD_STATIC_ASSERT(sizeof(struct cd_thread_exit) == 24 + CD_THREAD_NAME_LEN, "cd_thread_exit");
CD_STATIC_ASSERT(sizeof(struct cd_count_key) == 24, "cd_count_key");
CD_STATIC_ASSERT(sizeof(struct cd_count_val) == 48, "cd_count_val");
CD_STATIC_ASSERT(sizeof(struct cd_comm_key) == 16, "cd_comm_key");
CD_STATIC_ASSERT(sizeof(struct cd_comm_val) == 48 + CD_UNIQUE_ID_BYTES, "cd_comm_val");
CD_STATIC_ASSERT(sizeof(struct cd_inflight) == 8 * 6 + 8 * CD_NUM_ARGS + 24 + 24, "cd_inflight");
CD_STATIC_ASSERT(sizeof(struct cd_py_frame) == 32, "cd_py_frame");
CD_STATIC_ASSERT(sizeof(struct cd_flight_entry) == 64, "cd_flight_entry");
CD_STATIC_ASSERT(sizeof(struct cd_flight) == 8 + CD_FLIGHT_SLOTS * 64, "cd_flight");
CD_STATIC_ASSERT((CD_FLIGHT_SLOTS & (CD_FLIGHT_SLOTS - 1)) == 0, "CD_FLIGHT_SLOTS: a power of two");
CD_STATIC_ASSERT(sizeof(struct cd_scope_key) == 16, "cd_scope_key");
CD_STATIC_ASSERT(sizeof(struct cd_context) == 8 + CD_LABEL_MAX, "cd_context");
CD_STATIC_ASSERT(sizeof(struct cd_py_cfg) == 16 + 4 * 17 + 4 + 8 + 16 + 16, "cd_py_cfg");
CD_STATIC_ASSERT(sizeof(struct cd_proc_counts) == 32 + CD_COARSE_SLOTS * 56, "cd_proc_counts");
CD_STATIC_ASSERT(sizeof(struct cd_torch_group) == 16, "cd_torch_group");
CD_STATIC_ASSERT(sizeof(struct cd_torch_cfg) == 40 + CD_TORCH_REDUCE_OPS * 8 + CD_TORCH_GROUPS * 16, "cd_torch_cfg");
CD_STATIC_ASSERT(sizeof(struct cd_tensor) == 8 * CD_TENSOR_DIMS + 16, "cd_tensor");
CD_STATIC_ASSERT(sizeof(struct cd_tensors) == 24 + CD_MAX_TENSORS * 64, "cd_tensors");

#endif /* COMMDBG_EVENTS_H */
