// SPDX-License-Identifier: Apache-2.0
// Framework context in the record model (issue 11): record_function scopes
// and nn.Module calls built from synthetic event streams with a fake
// PyContextResolver, and how the outputs show them.
#include <gtest/gtest.h>

#include <set>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "fixtures.hpp"
#include "model.hpp"
#include "render.hpp"
#include "snapshot.hpp"

using namespace commdbg;
using namespace commdbg::model;
using nlohmann::ordered_json;

namespace {

constexpr uint32_t kPid = 5151;
constexpr uint32_t kTid = 5151;

// Code objects of the synthetic program.
enum Code : uint64_t {
    kMain = 0x1000,
    kStep,
    kWrapped,    // Module._wrapped_call_impl
    kCallImpl,   // Module._call_impl
    kModelFwd,
    kEncoderFwd,
    kBlockFwd,
    kRfEnter,    // record_function.__enter__ (torch 1.13 label "phase13")
    kOpsCall,    // OpOverloadPacket.__call__
    kAllReduce,  // torch.distributed.all_reduce
    kEngineRun,  // _engine_run_backward
    kHook,       // Block.grad_hook (a method of the block)
    kApply,      // BackwardCFunction.apply, self an AllReduceGradBackward node
    kFreed,      // never registered: a freed code object
};

// Module objects.
constexpr uint64_t kModel = 0xa000, kEncoder = 0xa100, kBlock = 0xa200;

class FakeResolver : public python::PyContextResolver {
public:
    FakeResolver() {
        code(kMain, "main", "/src/train.py", 10);
        code(kStep, "train_step", "/src/train.py", 20);
        code(kWrapped, "Module._wrapped_call_impl", "/torch/nn/modules/module.py", 1736,
             python::PyFrameKind::ModuleCall, true);
        code(kCallImpl, "Module._call_impl", "/torch/nn/modules/module.py", 1747, python::PyFrameKind::ModuleCall,
             true);
        code(kModelFwd, "Model.forward", "/src/model.py", 5);
        code(kEncoderFwd, "Encoder.forward", "/src/model.py", 15);
        code(kBlockFwd, "Block.forward", "/src/model.py", 30);
        code(kRfEnter, "record_function.__enter__", "/torch/autograd/profiler.py", 750,
             python::PyFrameKind::RecordFunctionEnter, true).label = "phase13";
        code(kOpsCall, "OpOverloadPacket.__call__", "/torch/_ops.py", 1000, python::PyFrameKind::Plain, true);
        code(kAllReduce, "all_reduce", "/torch/distributed/distributed_c10d.py", 2500, python::PyFrameKind::Plain,
             true);
        code(kEngineRun, "_engine_run_backward", "/torch/autograd/graph.py", 825, python::PyFrameKind::BackwardEntry,
             true);
        code(kHook, "Block.grad_hook", "/src/model.py", 50);
        code(kApply, "BackwardCFunction.apply", "/torch/autograd/function.py", 307,
             python::PyFrameKind::FunctionApply, true).label = "AllReduceGradBackward";
        modules_ = {{kModel, "Model"}, {kEncoder, "Encoder"}, {kBlock, "Block"}};
        paths_ = {{{kModel, kEncoder}, "encoder"}, {{kModel, kBlock}, "encoder.blocks.1"}};
    }

    const python::PyFrameInfo& frame(uint32_t, const cd_py_frame& f) override {
        ++frame_calls;
        auto [it, added] = cache_.try_emplace({f.code, f.self});
        if (!added) return it->second;
        python::PyFrameInfo& out = it->second;
        if (auto c = codes_.find(f.code); c != codes_.end()) out = c->second;
        if (auto m = modules_.find(f.self); m != modules_.end() && out.known)
            out.module = f.self, out.module_class = m->second;
        return out;
    }
    std::optional<std::string> module_path(uint32_t, uint64_t root, uint64_t module) override {
        if (root == module) return std::string();
        auto it = paths_.find({root, module});
        if (it == paths_.end()) return std::nullopt;
        return it->second;
    }
    void forget(uint32_t pid) override { forgotten.push_back(pid); }
    // Frame by frame, with the serial the test says (LivePyResolver's is
    // that of a thread's kept last stack).
    uint64_t stack(uint32_t pid, uint32_t tid, std::span<const cd_py_frame> raw,
                   std::vector<const python::PyFrameInfo*>& out) override {
        python::PyContextResolver::stack(pid, tid, raw, out);
        return serial;
    }

    size_t frame_calls = 0;
    uint64_t serial = 0;
    std::vector<uint32_t> forgotten;

private:
    python::PyFrameInfo& code(uint64_t code, const char* qualname, const char* file, uint32_t line,
                      python::PyFrameKind kind = python::PyFrameKind::Plain, bool library = false) {
        python::PyFrameInfo& f = codes_[code];
        f.qualname = qualname, f.file = file, f.line = line, f.known = true, f.kind = kind, f.library = library;
        return f;
    }
    std::map<uint64_t, python::PyFrameInfo> codes_;
    std::map<uint64_t, std::string> modules_;
    std::map<std::pair<uint64_t, uint64_t>, std::string> paths_;
    std::map<std::pair<uint64_t, uint64_t>, python::PyFrameInfo> cache_;
};

// A frame: its code and its first local.
cd_py_frame F(uint64_t code, uint64_t self = 0) { return {code, self, 0, 0}; }

// Python stacks, written outermost first as one reads a traceback.
using Stack = std::vector<cd_py_frame>;
Stack operator+(Stack a, const Stack& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}
Stack module_call(uint64_t m, Code fwd) { return {F(kWrapped, m), F(kCallImpl, m), F(fwd, m)}; }
const Stack kTop = {F(kMain), F(kStep)};
const Stack kInModel = kTop + module_call(kModel, kModelFwd);
const Stack kInEncoder = kInModel + module_call(kEncoder, kEncoderFwd);
const Stack kInBlock = kInEncoder + module_call(kBlock, kBlockFwd);
const Stack kBackwardHook = kTop + Stack{F(kEngineRun), F(kHook, kBlock)};

capture::SymbolInfo sym(const char* name, const char* layer, cd_role role, capture::ArgSlots slots = {},
                        cd_coll coll = CD_COLL_NONE, bool ret = false) {
    return test::symbol(name, layer, role, coll, slots, ret, /*py_stack=*/true);
}

struct Ctx {
    capture::SymbolTable t;
    uint32_t label = t.intern(sym("torch::autograd::profiler::record_function_enter_new", "torch", CD_ROLE_SCOPE_LABEL));
    uint32_t begin = t.intern(sym("at::RecordFunction::RecordFunction", "torch", CD_ROLE_SCOPE_BEGIN,
                                  [] {
                                      capture::ArgSlots s;
                                      s.count = 0, s.peer = 1;
                                      return s;
                                  }()));
    uint32_t end = t.intern(sym("at::RecordFunction::end", "torch", CD_ROLE_SCOPE_END, [] {
        capture::ArgSlots s;
        s.count = 0;
        return s;
    }()));
    // torch >= 2's record_function exit: it names no RecordFunction.
    uint32_t rf_exit = t.intern(sym("record_function exit", "torch", CD_ROLE_SCOPE_END));
    uint32_t c10d = t.intern(sym("c10d::ProcessGroupNCCL::allreduce", "c10d", CD_ROLE_COLLECTIVE, {}, CD_COLL_ALL_REDUCE));
    uint32_t nccl = t.intern(sym("ncclAllReduce", "nccl", CD_ROLE_COLLECTIVE, {2, 3, 5, 4}, CD_COLL_ALL_REDUCE, true));
    uint32_t mm = t.intern(sym("aten::mm", "aten", CD_ROLE_OP));
    uint32_t add = t.intern(sym("aten::add.Tensor", "aten", CD_ROLE_OP));
    uint32_t module_enter = t.intern(sym("torch::jit::tracer::getTracingState", "torch", CD_ROLE_MODULE_ENTER));
    uint32_t grad_fn = t.intern(sym("torch::autograd::impl::set_gradient_edge", "torch", CD_ROLE_GRAD_FN, [] {
        capture::ArgSlots s;
        s.count = 1;
        return s;
    }()));
    uint32_t run_node = t.intern(sym("torch::autograd::Engine::evaluate_function", "torch", CD_ROLE_AUTOGRAD_NODE, [] {
        capture::ArgSlots s;
        s.count = 2;
        return s;
    }()));

    FakeResolver res;
    TraceModel model;
    uint64_t now = 1'000'000;

    explicit Ctx(ModelLimits limits = {}, bool with_resolver = true) : model(t, limits) {
        if (with_resolver) model.set_resolver(&res);
    }

    // An entry at the next timestamp; `stack` outermost first.
    capture::CallEnter enter(uint32_t s, uint64_t sp, const std::optional<Stack>& stack = std::nullopt,
                    std::array<uint64_t, CD_NUM_ARGS> args = {}, uint32_t tid = kTid) {
        capture::CallEnter e;
        e.tgid = kPid;
        e.tid = tid;
        e.ts_ns = now += 1000;
        e.sp = sp;
        e.cookie = make_cookie(s, *t.find(s));
        e.args = args;
        if (stack) {
            e.py_status = CD_PY_OK;
            e.py_frames.assign(stack->rbegin(), stack->rend());
        }
        model.on_event(e);
        return e;
    }
    void exit(const capture::CallEnter& e) {
        capture::CallExit x;
        x.tgid = e.tgid, x.tid = e.tid, x.ts_ns = now += 1000, x.cookie = e.cookie, x.enter_ts_ns = e.ts_ns;
        model.on_event(x);
    }
    capture::CallEnter scope_label(const std::string& l, const Stack& stack, uint64_t sp = 0x7000) {
        capture::CallEnter e;
        e.tgid = kPid, e.tid = kTid, e.ts_ns = now += 1000, e.sp = sp;
        e.cookie = make_cookie(label, *t.find(label));
        e.label = l;
        e.py_status = CD_PY_OK;
        e.py_frames.assign(stack.rbegin(), stack.rend());
        model.on_event(e);
        return e;
    }
    capture::CallEnter scope_begin(uint64_t self, const std::optional<Stack>& stack, uint64_t scope = kUserScope,
                          uint64_t sp = 0x7000) {
        return enter(begin, sp, stack, {self, scope, 0, 0, 0, 0, 0, 0});
    }
    capture::CallEnter scope_end(uint64_t self, uint64_t sp = 0x7000) { return enter(end, sp, std::nullopt, {self}); }
    capture::CallEnter scope_exit(uint64_t sp = 0x7000) { return enter(rf_exit, sp); }
    // Forward made autograd node `node` under `stack`; the engine runs it (class `vtable`).
    void made(uint64_t node, const Stack& stack) { enter(grad_fn, 0x7000, stack, {0, node}); }
    void runs(uint64_t node, const std::optional<Stack>& stack, uint64_t vtable = 0, uint32_t tid = kTid) {
        enter(run_node, 0x7000, stack, {0, 0, node, 0, 0, 0, 0, vtable}, tid);
    }
    // c10d allreduce -> ncclAllReduce, from `stack`.
    void collective(const Stack& stack, uint64_t sp = 0x7000) {
        enter(c10d, sp, stack);
        exit(enter(nccl, sp - 0x100, stack, {0x10, 0x20, 64, 7, 0, 0xc0, 0, 0}));
    }

    const ProcessTree& tree() const { return *model.process(kPid); }
    const std::vector<Record>& recs() const { return tree().records(); }
    std::string_view name(const Record& r) const {
        std::string_view n = tree().context_name(r);
        return n.empty() ? std::string_view(t.find(r.sym)->name) : n;
    }
    // The records of a kind, in entry order.
    std::vector<const Record*> of(RecordKind k) const {
        std::vector<const Record*> out;
        for (const Record& r : recs())
            if (r.kind == k) out.push_back(&r);
        return out;
    }
    const Record* find(std::string_view n) const {
        for (const Record& r : recs())
            if (name(r) == n) return &r;
        return nullptr;
    }
    std::string_view parent_name(const Record& r) const {
        return r.parent == kNoRecord ? std::string_view("<none>") : name(recs()[r.parent]);
    }
    snapshot::ProcessSnapshot report() const {
        snapshot::ProcessSnapshot r;
        r.pid = kPid;
        r.tree = model.process(kPid);
        return r;
    }
};

// ---- scopes ------------------------------------------------------------------

// Where RecordFunction's constructor is probed (a torch 2.x without its
// Python package beside it), the one right after the label is that scope's:
// it keys the scope, and end() on it closes it.
TEST(ContextModel, Torch2ScopeOpensAtItsLabelTakesItsRecordFunctionAndEndsAtItsEnd) {
    Ctx c;
    const Stack at = kTop + Stack{F(kRfEnter), F(kOpsCall)};
    auto l = c.scope_label("my_phase", at);
    c.scope_begin(0x55, at);
    c.enter(c.mm, 0x7000);
    c.scope_exit();  // no labelled scope is left to close: that exit closes nothing
    auto e = c.scope_end(0x55);

    auto scopes = c.of(RecordKind::Scope);
    ASSERT_EQ(scopes.size(), 1u);
    const Record& s = *scopes[0];
    EXPECT_EQ(c.name(s), "my_phase");  // not the __enter__ frame's "phase13"
    EXPECT_EQ(s.start_ns, l.ts_ns);
    EXPECT_EQ(s.end_ns, e.ts_ns);
    EXPECT_FALSE(s.has(kEndInferred));
    EXPECT_EQ(c.parent_name(*c.find("aten::mm")), "my_phase");
    // The markers are counted calls, not records of their own.
    EXPECT_EQ(c.recs().size(), 2u);
    EXPECT_EQ(c.tree().calls(c.label), 1u);
    EXPECT_EQ(c.tree().calls(c.begin), 1u);
    EXPECT_EQ(c.tree().calls(c.end), 1u);

    // The label is taken once.  The next begin has none, and no
    // record_function on its stack: a RecordFunction of torch's own (c10d's
    // Work around each gloo collective), no scope of the user's.
    c.scope_begin(0x56, kTop);
    EXPECT_EQ(c.of(RecordKind::Scope).size(), 1u);
    // With a record_function on the stack it is one, named or not.
    c.scope_begin(0x57, kTop + Stack{F(kRfEnter)});
    ASSERT_EQ(c.of(RecordKind::Scope).size(), 2u);
}

// torch >= 2 with its Python package: no RecordFunction is probed.  The
// label opens a scope, and the record_function exit, which names none, closes
// the thread's innermost one a label opened; another thread's stay open.
TEST(ContextModel, Torch2ExitClosesTheThreadsInnermostLabelledScope) {
    Ctx c;
    auto outer = c.scope_label("outer", kTop + Stack{F(kRfEnter)});
    c.enter(c.mm, 0x7000);
    c.scope_label("inner", kTop + Stack{F(kRfEnter)});
    c.enter(c.add, 0x7000);
    // Another thread's scope, open across this thread's exits.
    capture::CallEnter other;
    other.tgid = kPid, other.tid = kTid + 1, other.ts_ns = c.now += 1000, other.sp = 0x7000;
    other.cookie = make_cookie(c.label, *c.t.find(c.label));
    other.label = "other thread", other.py_status = CD_PY_OK;
    c.model.on_event(other);
    auto inner_exit = c.scope_exit();
    c.enter(c.c10d, 0x7000);
    auto outer_exit = c.scope_exit();
    c.enter(c.mm, 0x7000);

    const Record& o = *c.find("outer");
    const Record& i = *c.find("inner");
    EXPECT_EQ(o.start_ns, outer.ts_ns);
    EXPECT_EQ(i.end_ns, inner_exit.ts_ns);
    EXPECT_EQ(o.end_ns, outer_exit.ts_ns);
    EXPECT_FALSE(i.has(kEndInferred));
    EXPECT_FALSE(o.has(kEndInferred));
    EXPECT_EQ(c.parent_name(i), "outer");
    EXPECT_EQ(c.parent_name(*c.find("aten::add.Tensor")), "inner");
    EXPECT_EQ(c.parent_name(*c.find("c10d::ProcessGroupNCCL::allreduce")), "outer");
    EXPECT_EQ(c.of(RecordKind::Scope).size(), 3u);
    EXPECT_EQ(c.find("other thread")->end_ns, 0u);  // still open
    // The last aten::mm ran after both exits: outside any scope.
    size_t outside = 0;
    for (const Record& r : c.recs())
        if (r.kind == RecordKind::Op && c.parent_name(r) == "<none>") ++outside;
    EXPECT_EQ(outside, 1u);
}

TEST(ContextModel, Torch113ScopeIsNamedByTheRecordFunctionEnterFrameOfItsBegin) {
    Ctx c;
    c.scope_begin(0x55, kTop + Stack{F(kRfEnter), F(kOpsCall)});
    auto scopes = c.of(RecordKind::Scope);
    ASSERT_EQ(scopes.size(), 1u);
    EXPECT_EQ(c.name(*scopes[0]), "phase13");
}

// torch 1.13: the record_function object dies at the scope's end and its
// address goes to the next one; a label read after the end may be that
// one's.  Only a scope the kernel still has open is named from Python.
TEST(ContextModel, Torch113LabelIsTrustedOnlyWhileTheKernelHasTheScopeOpen) {
    Ctx c;
    std::set<uint64_t> open = {0x55};
    c.model.set_scope_check([&](uint32_t, uint64_t self) { return open.count(self) > 0; });
    c.scope_begin(0x55, kTop + Stack{F(kRfEnter), F(kOpsCall)});
    c.scope_end(0x55);
    c.scope_begin(0x66, kTop + Stack{F(kRfEnter), F(kOpsCall)});  // ended before it was read
    auto scopes = c.of(RecordKind::Scope);
    ASSERT_EQ(scopes.size(), 2u);
    EXPECT_EQ(c.name(*scopes[0]), "phase13");
    EXPECT_EQ(c.name(*scopes[1]), "<unnamed>");
}

TEST(ContextModel, NestedScopesNestWhatRanInsideThem) {
    Ctx c;
    c.scope_label("outer", kTop);
    c.scope_begin(0x1, kTop);
    c.scope_label("inner", kTop);
    c.scope_begin(0x2, kTop);
    c.enter(c.mm, 0x7000);
    auto inner_end = c.scope_end(0x2);
    c.enter(c.add, 0x7000);
    auto outer_end = c.scope_end(0x1);

    EXPECT_EQ(c.parent_name(*c.find("inner")), "outer");
    EXPECT_EQ(c.parent_name(*c.find("aten::mm")), "inner");
    EXPECT_EQ(c.parent_name(*c.find("aten::add.Tensor")), "outer");
    EXPECT_EQ(c.find("inner")->end_ns, inner_end.ts_ns);
    EXPECT_EQ(c.find("outer")->end_ns, outer_end.ts_ns);
    EXPECT_FALSE(c.find("inner")->has(kEndInferred));
}

TEST(ContextModel, AnEndClosesTheScopesThatLeakedInsideIt) {
    Ctx c;
    c.scope_label("outer", kTop);
    c.scope_begin(0x1, kTop);
    c.scope_label("leaked", kTop);
    c.scope_begin(0x2, kTop);  // its end never comes (an exception)
    auto e = c.scope_end(0x1);
    c.enter(c.mm, 0x7000);

    const Record& leaked = *c.find("leaked");
    EXPECT_EQ(leaked.end_ns, e.ts_ns);
    EXPECT_TRUE(leaked.has(kEndInferred));
    EXPECT_FALSE(c.find("outer")->has(kEndInferred));
    EXPECT_EQ(c.parent_name(*c.find("aten::mm")), "<none>");  // both closed
}

TEST(ContextModel, UnknownEndsAndScopesOtherThanUserScopeAreIgnored) {
    Ctx c;
    c.scope_begin(0x77, kTop, /*scope=*/0);  // a dispatcher RecordFunction (profiler on)
    c.scope_label("mine", kTop);
    // RecordScope is a uint8_t: garbage above the low byte is no other scope.
    c.scope_begin(0x55, kTop, 0xdeadbeef00000000 | kUserScope);
    c.scope_end(0x77);
    c.scope_end(0x99);
    c.enter(c.mm, 0x7000);

    auto scopes = c.of(RecordKind::Scope);
    ASSERT_EQ(scopes.size(), 1u);
    EXPECT_EQ(c.name(*scopes[0]), "mine");
    EXPECT_EQ(scopes[0]->end_ns, 0u);  // still open
    EXPECT_EQ(c.parent_name(*c.find("aten::mm")), "mine");
}

TEST(ContextModel, ScopeMarkersStayOnTheNativeStackAsPlaceholders) {
    Ctx c;
    // The kernel counts the begin as an open frame: depths after it include it.
    auto at = [&](uint32_t s, uint32_t depth, std::array<uint64_t, CD_NUM_ARGS> args = {}) {
        capture::CallEnter e;
        e.tgid = kPid, e.tid = kTid, e.ts_ns = c.now += 1000, e.sp = 0x7000 - depth * 0x100;
        e.cookie = make_cookie(s, *c.t.find(s));
        e.frame_depth = depth;
        e.args = args;
        c.model.on_event(e);
    };
    at(c.c10d, 0);
    at(c.begin, 1, {0x5, 0});  // scope 0: no scope record
    at(c.mm, 2);
    at(c.add, 2);  // mm returned; c10d and the begin's frame are still open
    EXPECT_EQ(c.parent_name(*c.find("aten::add.Tensor")), "c10d::ProcessGroupNCCL::allreduce");
    EXPECT_NE(c.find("aten::mm")->end_ns, 0u);
    EXPECT_EQ(c.find("c10d::ProcessGroupNCCL::allreduce")->end_ns, 0u);
}

// ---- modules ---------------------------------------------------------------

TEST(ContextModel, ModuleChainOpensWithTheStacksAndClosesWhenTheyLeaveIt) {
    Ctx c;
    c.collective(kInBlock);
    auto second = c.enter(c.c10d, 0x7000, kInEncoder);  // the block returned
    c.enter(c.mm, 0x6f00);                              // no stack, inside it: the chain stays
    auto top = c.enter(c.add, 0x7000, kTop);            // the model returned

    auto mods = c.of(RecordKind::Module);
    ASSERT_EQ(mods.size(), 3u);
    EXPECT_EQ(c.name(*mods[0]), "<root>");
    EXPECT_EQ(c.tree().module_class(*mods[0]), "Model");
    EXPECT_EQ(c.name(*mods[1]), "encoder");
    EXPECT_EQ(c.name(*mods[2]), "encoder.blocks.1");
    EXPECT_EQ(c.tree().module_class(*mods[2]), "Block");
    EXPECT_EQ(c.parent_name(*mods[1]), "<root>");
    EXPECT_EQ(c.parent_name(*mods[2]), "encoder");
    EXPECT_EQ(mods[2]->end_ns, second.ts_ns);
    EXPECT_TRUE(mods[2]->has(kEndInferred));
    EXPECT_EQ(mods[1]->end_ns, top.ts_ns);
    EXPECT_EQ(mods[0]->end_ns, top.ts_ns);

    const auto& recs = c.recs();
    std::vector<std::string_view> under_encoder;
    for (const Record& r : recs)
        if (r.kind != RecordKind::Module && c.parent_name(r) == "encoder") under_encoder.push_back(c.name(r));
    EXPECT_EQ(under_encoder, (std::vector<std::string_view>{"c10d::ProcessGroupNCCL::allreduce"}));
    // mm: under the c10d call it ran in (newer than the encoder's record).
    EXPECT_EQ(c.parent_name(*c.find("aten::mm")), "c10d::ProcessGroupNCCL::allreduce");
    EXPECT_EQ(c.parent_name(*c.find("aten::add.Tensor")), "<none>");
    for (const Record* m : mods) EXPECT_FALSE(m->has(kBackward));
}

// _call_impl's getTracingState() call: the innermost frame is _call_impl.
Stack entering(const Stack& outside, uint64_t m) { return outside + Stack{F(kWrapped, m), F(kCallImpl, m)}; }

// The block called twice in a row, its collectives at the same stack: only
// the module entry between them tells the calls apart.  It is no record,
// and a call with no record inside opens none.
TEST(ContextModel, AModuleEntryMakesTheNextCallOfTheSameModuleANewRecord) {
    Ctx c;
    c.enter(c.module_enter, 0x7000, entering(kInEncoder, kBlock));
    c.collective(kInBlock);
    auto second = c.enter(c.module_enter, 0x7000, entering(kInEncoder, kBlock));
    c.collective(kInBlock);
    c.enter(c.module_enter, 0x7000, entering(kInEncoder, kBlock));  // a call that records nothing

    auto mods = c.of(RecordKind::Module);
    ASSERT_EQ(mods.size(), 4u);  // <root>, encoder, the block twice
    EXPECT_EQ(c.name(*mods[2]), "encoder.blocks.1");
    EXPECT_EQ(c.name(*mods[3]), "encoder.blocks.1");
    EXPECT_EQ(mods[2]->end_ns, second.ts_ns);
    EXPECT_EQ(c.parent_name(*mods[3]), "encoder");
    for (const Record& r : c.recs()) EXPECT_NE(c.name(r), "torch::jit::tracer::getTracingState");
    const auto counts = c.tree().module_comm_counts();
    EXPECT_EQ(counts.at("encoder.blocks.1").forward.at("c10d.all_reduce"), 2u);
    EXPECT_EQ(counts.at("encoder").forward.at("c10d.all_reduce"), 2u);
}

// Without the entry (an older spec, or the probe missing) the same stacks
// stay one call: what the entry event changes, and nothing else.
TEST(ContextModel, WithoutModuleEntriesTheSameStackStaysOneCall) {
    Ctx c;
    c.collective(kInBlock);
    c.collective(kInBlock);
    EXPECT_EQ(c.of(RecordKind::Module).size(), 3u);
}

// An entry whose innermost frame is not _call_impl (getTracingState called
// from other Python code) enters nothing: the chain it is inside stays.
TEST(ContextModel, AnEntryFromOtherCodeLeavesTheChainItIsInside) {
    Ctx c;
    c.collective(kInBlock);
    c.enter(c.module_enter, 0x7000, kInBlock + Stack{F(kHook, kBlock)});
    c.collective(kInBlock);
    EXPECT_EQ(c.of(RecordKind::Module).size(), 3u);
}

TEST(ContextModel, ModulesInsideTheAutogradEntryRunBackwardNamedFromTheLastForwardRoot) {
    Ctx c;
    c.collective(kBackwardHook);  // before any forward: no root to name it from
    c.collective(kInBlock);
    c.collective(kBackwardHook);

    auto mods = c.of(RecordKind::Module);
    ASSERT_EQ(mods.size(), 5u);
    EXPECT_EQ(c.name(*mods[0]), "<unknown>");
    EXPECT_TRUE(mods[0]->has(kBackward));
    const Record& bwd = *mods[4];
    EXPECT_EQ(c.name(bwd), "encoder.blocks.1");
    EXPECT_EQ(c.tree().module_class(bwd), "Block");
    EXPECT_TRUE(bwd.has(kBackward));
    EXPECT_EQ(c.parent_name(bwd), "<none>");  // the forward chain closed
    EXPECT_FALSE(mods[3]->has(kBackward));
}

TEST(ContextModel, ModuleCommCountsCountTheOutermostCollectiveUnderEveryEnclosingModule) {
    Ctx c;
    c.collective(kInBlock);
    c.collective(kInBlock + Stack{F(kAllReduce)});  // the same module call, one frame deeper
    c.collective(kInEncoder);
    c.collective(kBackwardHook);
    c.collective(kTop);  // outside every module

    auto counts = c.tree().module_comm_counts();
    using Side = std::map<std::string, uint64_t>;
    ASSERT_EQ(counts.size(), 3u);
    EXPECT_EQ(counts["<root>"].forward, (Side{{"c10d.all_reduce", 3}}));
    EXPECT_TRUE(counts["<root>"].backward.empty());
    EXPECT_EQ(counts["encoder"].forward, (Side{{"c10d.all_reduce", 3}}));
    EXPECT_EQ(counts["encoder.blocks.1"].forward, (Side{{"c10d.all_reduce", 2}}));
    EXPECT_EQ(counts["encoder.blocks.1"].backward, (Side{{"c10d.all_reduce", 1}}));
    EXPECT_EQ(module_comm_counts(c.report()).size(), 3u);
    // The blocks' one module call holds both of its collectives.
    EXPECT_EQ(c.of(RecordKind::Module).size(), 4u);
}

TEST(ContextModel, TruncatedStacksLeaveTheChainAlone) {
    Ctx c;
    c.enter(c.c10d, 0x7000, kInBlock);
    capture::CallEnter e;
    e.tgid = kPid, e.tid = kTid, e.ts_ns = c.now += 1000, e.sp = 0x7000;
    e.cookie = make_cookie(c.c10d, *c.t.find(c.c10d));
    e.py_status = CD_PY_OK;
    e.ctx_flags = CD_CTX_TRUNCATED;
    e.py_frames = {F(kBlockFwd, kBlock)};  // innermost only: no module call frames
    c.model.on_event(e);
    for (const Record* m : c.of(RecordKind::Module)) EXPECT_EQ(m->end_ns, 0u) << c.name(*m);
    EXPECT_EQ(c.parent_name(c.recs().back()), "encoder.blocks.1");
}

TEST(ContextModel, IdenticalStacksShareOneInternedStack) {
    Ctx c;
    c.enter(c.c10d, 0x7000, kInBlock);
    c.enter(c.c10d, 0x7000, kInBlock);
    c.enter(c.c10d, 0x7000, kInBlock + Stack{F(kAllReduce)});
    std::vector<uint32_t> stacks;
    for (const Record& r : c.recs())
        if (r.kind == RecordKind::Collective) stacks.push_back(r.stack);
    ASSERT_EQ(stacks.size(), 3u);
    EXPECT_EQ(stacks[0], stacks[1]);
    EXPECT_NE(stacks[0], stacks[2]);
    EXPECT_EQ(c.tree().py_stack_count(), 2u);
    // Frames are interned by content: the three module calls share their
    // _wrapped_call_impl and _call_impl rows (7 distinct), plus all_reduce.
    EXPECT_EQ(c.tree().py_frame_count(), 8u);
    EXPECT_EQ(c.res.frame_calls, 11u + 11u + 12u);  // every frame resolved at ingest
}

TEST(ContextModel, ScopeAndModuleRecordsObeyTheBudget) {
    Ctx c(ModelLimits{2, 64});
    c.enter(c.c10d, 0x7000, kInBlock);  // root and encoder fit; the block and the call do not
    c.scope_label("late", kInBlock);
    c.scope_begin(0x9, kInBlock);
    c.scope_end(0x9);
    c.enter(c.mm, 0x7000);

    EXPECT_EQ(c.recs().size(), 2u);
    EXPECT_EQ(c.tree().dropped(DropCause::Budget), 4u);  // block, c10d, scope, mm
    EXPECT_EQ(c.of(RecordKind::Module).size(), 2u);
    EXPECT_EQ(c.of(RecordKind::Scope).size(), 0u);
}

TEST(ContextModel, ScopeAndModuleRecordsObeyTheDepthLimit) {
    Ctx c(ModelLimits{1000, 2});
    c.enter(c.c10d, 0x7000, kInBlock);
    c.scope_begin(0x9, kInEncoder + Stack{F(kRfEnter)});
    EXPECT_EQ(c.of(RecordKind::Module).size(), 2u);  // root (depth 0), encoder (1)
    EXPECT_EQ(c.tree().dropped(DropCause::Depth), 3u);  // block, c10d, the scope
    EXPECT_EQ(c.tree().dropped(DropCause::Budget), 0u);
}

TEST(ContextModel, AFreedCodeObjectResolvesAsUnknownAndNoResolverNamesNothing) {
    Ctx c;
    c.enter(c.c10d, 0x7000, kTop + Stack{F(kFreed, kBlock)});
    const Record& r = c.recs().back();
    auto frames = c.tree().py_stack_frames(c.tree().py_stack(r.stack));
    ASSERT_EQ(frames.size(), 3u);
    const auto& inner = c.tree().py_frame(frames[0]);
    EXPECT_EQ(c.tree().text(inner.qualname), "<unknown>");
    EXPECT_FALSE(inner.known);
    EXPECT_EQ(output::render_parts::py_location(r, c.tree()), "<unknown>");

    Ctx bare({}, /*with_resolver=*/false);
    bare.enter(bare.c10d, 0x7000, kInBlock);
    EXPECT_TRUE(bare.of(RecordKind::Module).empty());
    const Record& b = bare.recs().back();
    ASSERT_NE(b.stack, kNoStack);
    EXPECT_EQ(bare.tree().py_stack(b.stack).len, kInBlock.size());
}

TEST(ContextModel, ProcessExitEndsOpenContextAndForgetsTheProcess) {
    Ctx c;
    c.enter(c.c10d, 0x7000, kInBlock);
    c.scope_begin(0x9, kInBlock, kUserScope, 0x6f00);  // inside the c10d call
    capture::ProcExit x;
    x.tgid = kPid, x.ts_ns = c.now += 1000;
    c.model.on_event(x);
    for (const Record& r : c.recs()) {
        EXPECT_EQ(r.end_ns, x.ts_ns) << c.name(r);
        EXPECT_TRUE(r.has(kEndAtExit)) << c.name(r);
    }
    EXPECT_EQ(c.res.forgotten, std::vector<uint32_t>{kPid});
}

// A serial from the resolver says the thread's frames are those of its last
// stack: the record takes that stack's id, not interned again.  Serial 0, a
// new serial, another status or a new window intern it as ever.  (The fake
// resolver's serial is the test's word, so a record can show which way it went.)
TEST(ContextModel, AStackTheResolverKnowsUnchangedIsNotInternedAgain) {
    Ctx c;
    auto last_stack = [&] { return c.recs().back().stack; };
    c.res.serial = 5;
    c.enter(c.c10d, 0x7000, kInBlock);
    const uint32_t block = last_stack();
    c.enter(c.c10d, 0x7000, kInBlock + Stack{F(kAllReduce)});
    EXPECT_EQ(last_stack(), block) << "the same serial: the thread's last stack, taken as it is";
    EXPECT_EQ(c.tree().py_stack_count(), 1u);
    c.res.serial = 6;
    c.enter(c.c10d, 0x7000, kInBlock + Stack{F(kAllReduce)});
    const uint32_t deeper = last_stack();
    EXPECT_NE(deeper, block);
    EXPECT_EQ(c.tree().py_stack_count(), 2u);
    c.res.serial = 0;
    c.enter(c.c10d, 0x7000, kInBlock);
    EXPECT_EQ(last_stack(), block) << "no serial: interned, and found by content";
    c.res.serial = 6;
    c.enter(c.c10d, 0x7000, kInBlock);
    EXPECT_EQ(last_stack(), block) << "serial 6 was not this thread's last";
    c.model.reset();
    c.enter(c.c10d, 0x7000, kInBlock + Stack{F(kAllReduce)});
    EXPECT_EQ(c.tree().py_stack_count(), 1u) << "a new window interns its first stack";
    EXPECT_EQ(c.tree().py_frame_count(), 8u);
}

TEST(ContextModel, AWindowResetDropsTheInternedStacksWithTheRecords) {
    Ctx c;
    c.enter(c.c10d, 0x7000, kInBlock);
    size_t full = c.tree().memory_bytes();
    c.model.reset();
    EXPECT_EQ(c.tree().py_stack_count(), 0u);
    EXPECT_EQ(c.tree().py_frame_count(), 0u);
    EXPECT_LT(c.tree().memory_bytes(), full);
    // The module calls still open are placeholders: the new window's records are roots.
    c.enter(c.c10d, 0x7000, kInBlock);
    ASSERT_EQ(c.recs().size(), 1u);
    EXPECT_EQ(c.recs()[0].parent, kNoRecord);
    EXPECT_EQ(c.tree().py_stack_count(), 1u);
}

// ---- outputs ------------------------------------------------------------------

// One step: a scope around a forward whose block all-reduces, then a thread
// without Python, a freed frame and a stack the kernel cut.
struct Rendered : Ctx {
    Rendered() {
        scope_label("my_phase", kInModel);
        scope_begin(0x55, kInModel);
        collective(kInBlock);
        scope_end(0x55);
        capture::CallEnter e;
        e.tgid = kPid, e.tid = kTid + 1, e.ts_ns = now += 1000, e.sp = 0x9000;
        e.cookie = make_cookie(nccl, *t.find(nccl));
        e.py_status = CD_PY_NO_TSTATE;
        model.on_event(e);
        e.tid = kTid + 2, e.ts_ns = now += 1000, e.py_status = CD_PY_FAULT;
        e.py_frames = {F(kFreed)};
        model.on_event(e);
        e.tid = kTid + 3, e.ts_ns = now += 1000, e.py_status = CD_PY_OK, e.ctx_flags = CD_CTX_TRUNCATED;
        e.py_frames = {F(kAllReduce), F(kBlockFwd)};
        model.on_event(e);
    }
};

const ordered_json* find_json(const ordered_json& recs, std::string_view name) {
    for (const auto& r : recs) {
        if (r["name"] == name) return &r;
        if (const auto* c = find_json(r["children"], name)) return c;
    }
    return nullptr;
}

TEST(ContextRender, JsonShowsScopesModulesStacksAndModuleCommCounts) {
    Rendered c;
    auto j = output::to_json(c.report(), c.t, 2);
    ASSERT_TRUE(j.contains("module_comm_counts"));
    EXPECT_EQ(j["module_comm_counts"].dump(),
              R"({"<root>":{"forward":{"c10d.all_reduce":1}},"encoder":{"forward":{"c10d.all_reduce":1}},)"
              R"("encoder.blocks.1":{"forward":{"c10d.all_reduce":1}}})");

    const auto& recs = j["records"];
    const auto* scope = find_json(recs, "my_phase");
    ASSERT_NE(scope, nullptr);
    EXPECT_EQ((*scope)["type"], "scope");
    EXPECT_EQ((*scope)["children"].size(), 1u);
    const auto* blk = find_json(recs, "encoder.blocks.1");
    ASSERT_NE(blk, nullptr);
    EXPECT_EQ((*blk)["type"], "module");
    EXPECT_EQ((*blk)["module_fqn"], "encoder.blocks.1");
    EXPECT_EQ((*blk)["module_class"], "Block");
    EXPECT_EQ((*blk)["event_type"], "forward");
    EXPECT_EQ((*blk)["layer"], "python");
    EXPECT_FALSE(blk->contains("py_stack"));
    const auto* root = find_json(recs, "<root>");
    ASSERT_NE(root, nullptr);
    // The scope opened inside the model's forward, the encoder inside the scope.
    EXPECT_EQ((*root)["children"][0]["name"], "my_phase");
    EXPECT_EQ((*scope)["children"][0]["name"], "encoder");

    const auto* c10d = find_json(recs, "c10d::ProcessGroupNCCL::allreduce");
    ASSERT_NE(c10d, nullptr);
    const auto& st = (*c10d)["py_stack"];
    ASSERT_EQ(st.size(), kInBlock.size());
    EXPECT_EQ(st[0].dump(), R"({"qualname":"Block.forward","file":"/src/model.py","line":30})");
    EXPECT_EQ(st.back()["qualname"], "main");
    EXPECT_FALSE(c10d->contains("py_stack_truncated"));

    // The other threads' NCCL calls: no Python, a fault, a cut stack.
    std::map<uint32_t, ordered_json> by_tid;
    for (const auto& r : recs) by_tid[r["tid"].get<uint32_t>()] = r;
    EXPECT_EQ(by_tid[kTid + 1]["py_stack"].dump(), "[]");
    EXPECT_FALSE(by_tid[kTid + 1].contains("py_stack_partial"));
    EXPECT_EQ(by_tid[kTid + 2]["py_stack"].dump(), R"([{"qualname":"<unknown>","file":"","line":0}])");
    EXPECT_EQ(by_tid[kTid + 2]["py_stack_partial"], true);
    EXPECT_EQ(by_tid[kTid + 3]["py_stack_truncated"], true);
    EXPECT_EQ(by_tid[kTid + 3]["py_stack"].size(), 2u);
}

TEST(ContextRender, JsonOmitsContextKeysWithoutContext) {
    Ctx c;
    c.enter(c.c10d, 0x7000);  // no stack
    auto j = output::to_json(c.report(), c.t, 2);
    EXPECT_FALSE(j.contains("module_comm_counts"));
    EXPECT_FALSE(j["records"][0].contains("py_stack"));
    EXPECT_FALSE(j["records"][0].contains("module_fqn"));
}

TEST(ContextRender, JsonHidesScopeAndModuleRecordsBelowNoiseTwoButKeepsTheirCounts) {
    Rendered c;
    auto j = output::to_json(c.report(), c.t, 1);
    EXPECT_EQ(find_json(j["records"], "my_phase"), nullptr);
    EXPECT_EQ(find_json(j["records"], "encoder"), nullptr);
    EXPECT_NE(find_json(j["records"], "c10d::ProcessGroupNCCL::allreduce"), nullptr);
    EXPECT_TRUE(j.contains("module_comm_counts"));
}

TEST(ContextRender, TableShowsScopeAndModuleRowsAndWhereFromNoiseTwo) {
    Rendered c;
    std::string table = output::render_table(c.report(), c.t, 2, false);
    auto has = [&](const std::string& line) { return table.find(line + "\n") != std::string::npos; };
    EXPECT_TRUE(has("Module      module <root> (Model) forward")) << table;
    EXPECT_TRUE(has("Scope         scope my_phase at /src/model.py:5 Model.forward")) << table;
    EXPECT_TRUE(has("Module          module encoder (Encoder) forward")) << table;
    EXPECT_TRUE(has("Module            module encoder.blocks.1 (Block) forward")) << table;
    EXPECT_TRUE(has("Collective          c10d::ProcessGroupNCCL::allreduce at /src/model.py:30 Block.forward"))
        << table;
    EXPECT_TRUE(has("Collective            ncclAllReduce count=64 float32 sum comm=0xc0 ret=0 enqueue=1.0us (host) "
                    "at /src/model.py:30 Block.forward"))
        << table;
    EXPECT_TRUE(has("thread 5153\nCollective  ncclAllReduce count=0 int8 sum comm=0x0 at <unknown>")) << table;
    EXPECT_TRUE(has("thread 5152\nCollective  ncclAllReduce count=0 int8 sum comm=0x0")) << table;  // no Python

    std::string quiet = output::render_table(c.report(), c.t, 1, false);
    EXPECT_EQ(quiet.find("scope my_phase"), std::string::npos);
    EXPECT_EQ(quiet.find("module "), std::string::npos);
    EXPECT_EQ(quiet.find(" at /src"), std::string::npos);
}

TEST(ContextRender, TraceHasScopeAndModuleSlicesWithTheStackInArgs) {
    Rendered c;
    auto trace = output::chrome_trace({c.report()}, c.t);
    std::map<std::string, nlohmann::json> slices;
    for (const auto& ev : trace["traceEvents"])
        if (ev["ph"] == "X" && ev["tid"] == kTid) slices[ev["name"].get<std::string>()] = ev;
    ASSERT_TRUE(slices.count("my_phase"));
    EXPECT_EQ(slices["my_phase"]["cat"], "torch");
    ASSERT_TRUE(slices.count("encoder.blocks.1"));
    const auto& blk = slices["encoder.blocks.1"];
    EXPECT_EQ(blk["cat"], "python");
    EXPECT_EQ(blk["args"]["module_class"], "Block");
    EXPECT_EQ(blk["args"]["event_type"], "forward");
    const auto& c10d = slices["c10d::ProcessGroupNCCL::allreduce"];
    EXPECT_EQ(c10d["args"]["py_stack"][0]["qualname"], "Block.forward");
    // Nested on their thread: the block's slice holds the collective's.
    double b0 = blk["ts"], b1 = b0 + blk["dur"].get<double>();
    double c0 = c10d["ts"], c1 = c0 + c10d["dur"].get<double>();
    EXPECT_LE(b0, c0);
    EXPECT_GE(b1, c1);
    double s0 = slices["my_phase"]["ts"];
    EXPECT_LE(s0, b0);
}

}  // namespace

// ---- backward attribution: autograd nodes (issue 24) --------------------------

namespace {

constexpr uint64_t kNodeA = 0xd000, kNodeB = 0xd100, kNodeC = 0xd200, kNodeCkpt = 0xd300;
const Stack kEngine = kTop + Stack{F(kEngineRun)};               // the engine runs a node from loss.backward()
const Stack kInEngineHook = kEngine + Stack{F(kAllReduce)};     // a hook or autograd function issuing a collective

// The module records enclosing r, outermost first, as "fqn[:node]".
std::vector<std::string> chain_of(const Ctx& c, const Record& r) {
    std::vector<std::string> out;
    for (uint32_t a = r.parent; a != kNoRecord; a = c.recs()[a].parent) {
        const Record& m = c.recs()[a];
        if (m.kind != RecordKind::Module) continue;
        std::string n(c.name(m));
        if (m.has(kRecompute)) n += ":recompute";
        else if (m.has(kBackward)) n += ":bw";
        if (auto node = c.tree().autograd_node(m); !node.empty()) n += "[" + std::string(node) + "]";
        out.insert(out.begin(), n);
    }
    return out;
}

std::vector<std::vector<std::string>> collective_chains(const Ctx& c) {
    std::vector<std::vector<std::string>> out;
    for (const Record& r : c.recs())
        if (c.name(r) == "c10d::ProcessGroupNCCL::allreduce") out.push_back(chain_of(c, r));
    return out;
}

}  // namespace

// A collective issued while the engine runs a node sits under the modules
// whose forward made that node, each backward, the innermost naming the
// node; consecutive nodes of one module are told apart by the node.
TEST(ContextModel, BackwardCollectivesSitUnderTheModulesWhoseForwardMadeTheRunningNode) {
    Ctx c;
    std::map<uint64_t, std::string> classes = {{0x5a0, "torch::autograd::generated::MmBackward0"},
                                                {0x5b0, "torch::autograd::PyNode"}};
    c.model.set_node_namer([&](uint32_t pid, uint64_t vt) { return pid == kPid ? classes[vt] : ""; });
    c.collective(kInBlock);  // forward: names the root
    c.made(kNodeA, kInBlock);
    c.made(kNodeB, kInBlock);
    c.made(kNodeC, kInEncoder);
    c.runs(kNodeB, kEngine, 0x5a0);
    c.scope_begin(0x77, kEngine, 1);  // the engine's own RecordFunction (BACKWARD_FUNCTION): opens nothing
    c.scope_end(0x77);
    EXPECT_EQ(c.of(RecordKind::Module).size(), 3u);
    c.enter(c.mm, 0x6000);            // an op of B without a stack: B's modules open as B's event showed them
    c.enter(c.add, 0x5000);
    c.runs(kNodeA, kEngine, 0x5b0);
    c.collective(kInEngineHook);
    c.runs(kNodeC, kEngine, 0x5a0);
    c.collective(kInEngineHook);

    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>", "encoder", "encoder.blocks.1"},
                                            {"<root>:bw", "encoder:bw", "encoder.blocks.1:bw[PyNode]"},
                                            {"<root>:bw", "encoder:bw[MmBackward0]"}}));
    auto counts = c.tree().module_comm_counts();
    using Side = std::map<std::string, uint64_t>;
    // C's collective, under encoder in the tree, is counted for
    // encoder.blocks.1 too: its backward began before (CommDebugMode's name).
    EXPECT_EQ(counts["encoder.blocks.1"].backward, (Side{{"c10d.all_reduce", 2}}));
    EXPECT_EQ(counts["encoder"].backward, (Side{{"c10d.all_reduce", 2}}));
    EXPECT_EQ(counts["<root>"].backward, (Side{{"c10d.all_reduce", 2}}));
    EXPECT_EQ(c.tree().autograd_nodes_run(), 3u);
    EXPECT_EQ(c.tree().autograd_nodes_unmapped(), 0u);
    // B's module record, opened for its op, ended where A began: A's is its sibling.
    std::vector<const Record*> blocks;
    for (const Record* m : c.of(RecordKind::Module))
        if (c.name(*m) == "encoder.blocks.1" && m->has(kBackward)) blocks.push_back(m);
    ASSERT_EQ(blocks.size(), 2u);
    EXPECT_EQ(c.tree().autograd_node(*blocks[0]), "MmBackward0");
    EXPECT_EQ(c.parent_name(*c.find("aten::mm")), "encoder.blocks.1");
    EXPECT_EQ(blocks[0]->parent, blocks[1]->parent);
    // JSON and table name the node.
    ordered_json j = output::to_json(c.report(), c.t, 2);
    EXPECT_NE(j.dump().find("\"autograd_node\":\"PyNode\""), std::string::npos);
}

// A Python autograd.Function's node (PyNode by its vtable) is named as torch
// names it, from the type of self in its BackwardCFunction.apply frame; the
// module record it opened with a record that shows no stack (an ATen op) is
// named by its first record that does.
TEST(ContextModel, APythonFunctionsNodeIsNamedAsTorchNamesIt) {
    Ctx c;
    c.model.set_node_namer([&](uint32_t, uint64_t vt) { return vt == 0x5b0 ? "torch::autograd::PyNode" : ""; });
    c.collective(kInBlock);
    c.made(kNodeA, kInBlock);
    c.made(kNodeB, kInBlock);
    c.runs(kNodeA, kEngine, 0x5b0);
    c.enter(c.add, 0x5000);  // no stack: the record opens A's modules, named PyNode for now
    c.collective(kEngine + Stack{F(kApply, 0xf00), F(kHook), F(kAllReduce)});
    c.runs(kNodeB, kEngine, 0x5b0);
    c.collective(kEngine + Stack{F(kAllReduce)});  // no apply frame: stays PyNode
    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>", "encoder", "encoder.blocks.1"},
                                            {"<root>:bw", "encoder:bw", "encoder.blocks.1:bw[AllReduceGradBackward]"},
                                            {"<root>:bw", "encoder:bw", "encoder.blocks.1:bw[PyNode]"}}));
}

// Once backward returned (no engine entry below), or under another entry
// than the node's (a stale run), nothing is attributed to the node.
TEST(ContextModel, ANodesAttributionEndsWithItsEngineEntry) {
    Ctx c;
    c.collective(kInBlock);
    c.made(kNodeA, kInBlock);
    c.runs(kNodeA, kEngine);
    c.collective(kTop + Stack{F(kAllReduce)});                       // backward returned
    c.collective(kTop + Stack{F(kStep), F(kEngineRun), F(kAllReduce)});  // another entry, deeper
    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>", "encoder", "encoder.blocks.1"}, {}, {}}));
}

// Inside a backward scope whose label names the module it runs for (FSDP's
// pre-backward and gradient reduction of a unit), that module's backward
// holds what the scope issues: in place of the running node's modules (a
// unit's hook in its last op's node), and where no node is known (the root's
// final callback, after an AccumulateGrad).  Past the scope, the node says again.
TEST(ContextModel, ABackwardScopeNamingAUnitPutsItsCollectivesUnderThatUnit) {
    Ctx c;
    c.model.set_unit_namer([](std::string_view l) -> std::optional<std::string> {
        constexpr std::string_view kReduce = "FSDP::post_backward_reduce";
        if (l == kReduce) return "<root>";
        if (l.rfind(kReduce, 0) == 0) return std::string(l.substr(kReduce.size() + 2, l.size() - kReduce.size() - 3));
        return std::nullopt;
    });
    const Stack in_scope = kInEngineHook + Stack{F(kRfEnter), F(kOpsCall)};
    auto reduce = [&](const std::string& label, uint64_t self) {
        c.scope_label(label, in_scope);
        c.scope_begin(self, in_scope);
        c.collective(kInEngineHook);
        c.scope_end(self);
    };
    c.collective(kInBlock);
    c.made(kNodeA, kInBlock);
    c.runs(kNodeA, kEngine);
    reduce("FSDP::post_backward_reduce (encoder)", 0x81);
    c.collective(kInEngineHook);
    c.runs(kNodeC, kEngine);  // unknown
    reduce("FSDP::post_backward_reduce", 0x82);
    c.scope_label("FSDP::something_else (encoder)", in_scope);  // names no unit
    c.scope_begin(0x83, in_scope);
    c.collective(kInEngineHook);
    c.scope_end(0x83);

    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>", "encoder", "encoder.blocks.1"},
                                            {"<root>:bw", "encoder:bw"},
                                            {"<root>:bw", "encoder:bw", "encoder.blocks.1:bw"},
                                            {"<root>:bw"},
                                            {}}));
    std::vector<std::string> parents;
    for (const Record& r : c.recs())
        if (c.name(r) == "c10d::ProcessGroupNCCL::allreduce") parents.emplace_back(c.parent_name(r));
    EXPECT_EQ(parents, (std::vector<std::string>{"encoder.blocks.1", "FSDP::post_backward_reduce (encoder)",
                                                 "encoder.blocks.1", "FSDP::post_backward_reduce",
                                                 "FSDP::something_else (encoder)"}));
    // Counted as CommDebugMode counts them: the root's reduction, after
    // blocks.1's backward began, for encoder and encoder.blocks.1 too; the
    // encoder's, in a hook of the node that began blocks.1, for encoder alone.
    auto counts = c.tree().module_comm_counts();
    using Side = std::map<std::string, uint64_t>;
    EXPECT_EQ(counts["encoder"].backward, (Side{{"c10d.all_reduce", 3}}));
    EXPECT_EQ(counts["encoder.blocks.1"].backward, (Side{{"c10d.all_reduce", 2}}));
    EXPECT_EQ(counts["<root>"].backward, (Side{{"c10d.all_reduce", 3}}));
}

// module_comm_counts counts a backward collective as CommDebugMode does: also
// for the module whose backward began last (its full-backward pre-hook, as
// the first node of that module's call runs), where the collective's module
// holds it.  FSDP2's reduce-scatter of a unit, issued from a node the unit's
// pre-forward made, runs after the unit's first submodule began: counted for
// that submodule too.  A hook of the node that begins a module runs before
// that pre-hook; a forward names the module afresh.  The tree is unchanged.
TEST(ContextModel, BackwardCountsAlsoCreditTheModuleWhoseBackwardBeganLastAsCommDebugModeDoes) {
    Ctx c;
    c.model.set_unit_namer([](std::string_view l) -> std::optional<std::string> {
        if (l.rfind("unit (", 0) == 0) return std::string(l.substr(6, l.size() - 7));
        return std::nullopt;
    });
    const Stack in_scope = kInEngineHook + Stack{F(kRfEnter), F(kOpsCall)};
    c.collective(kInBlock);      // #1 forward: names the root
    c.made(kNodeA, kInEncoder);  // the encoder's last op
    c.made(kNodeB, kInBlock);    // blocks.1's
    c.made(kNodeC, kInEncoder);  // made in the encoder before blocks.1 ran
    c.runs(kNodeA, kEngine);     // the encoder's backward begins
    c.collective(kInEngineHook);  // #2
    c.runs(kNodeB, kEngine);     // blocks.1's begins, after the node's hooks:
    c.scope_label("unit (encoder)", in_scope);
    c.scope_begin(0x91, in_scope);
    c.collective(kInEngineHook);  // #3 a hook of B, for the encoder
    c.scope_end(0x91);
    c.collective(kInEngineHook);  // #4 B itself
    c.runs(kNodeC, kEngine);      // the encoder's own node: blocks.1 stays the last begun
    c.collective(kInEngineHook);  // #5
    c.collective(kInBlock);       // #6 a forward
    c.runs(kNodeC, kEngine);      // the encoder's backward begins again
    c.collective(kInEngineHook);  // #7

    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>", "encoder", "encoder.blocks.1"},
                                            {"<root>:bw", "encoder:bw"},
                                            {"<root>:bw", "encoder:bw"},
                                            {"<root>:bw", "encoder:bw", "encoder.blocks.1:bw"},
                                            {"<root>:bw", "encoder:bw"},
                                            {"<root>", "encoder", "encoder.blocks.1"},
                                            {"<root>:bw", "encoder:bw"}}));
    auto counts = c.tree().module_comm_counts();
    using Side = std::map<std::string, uint64_t>;
    EXPECT_EQ(counts["encoder.blocks.1"].backward, (Side{{"c10d.all_reduce", 2}}));  // #4, #5
    EXPECT_EQ(counts["encoder.blocks.1"].forward, (Side{{"c10d.all_reduce", 2}}));   // #1, #6
    EXPECT_EQ(counts["encoder"].backward, (Side{{"c10d.all_reduce", 5}}));
    EXPECT_EQ(counts["<root>"].backward, (Side{{"c10d.all_reduce", 5}}));
    // The record says so (JSON "also_counted_for").
    std::vector<std::string> also;
    for (const Record& r : c.recs())
        if (c.name(r) == "c10d::ProcessGroupNCCL::allreduce") also.emplace_back(c.tree().also_counted_for(r));
    EXPECT_EQ(also, (std::vector<std::string>{"", "", "", "", "encoder.blocks.1", "", ""}));
    EXPECT_NE(output::to_json(c.report(), c.t, 2).dump().find("\"also_counted_for\":\"encoder.blocks.1\""),
              std::string::npos);
}

// A node no forward record made (AccumulateGrad, made lazily) is counted
// unmapped; frames of a module inside the entry still say what they can.
TEST(ContextModel, AnUnknownNodeFallsBackToTheModuleBoundFrames) {
    Ctx c;
    c.collective(kInBlock);
    c.runs(kNodeA, kEngine);
    c.collective(kBackwardHook);
    EXPECT_EQ(c.tree().autograd_nodes_unmapped(), 1u);
    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>", "encoder", "encoder.blocks.1"}, {"encoder.blocks.1:bw"}}));
}

// Activation checkpointing (reentrant): the checkpoint's node, made in the
// model's forward, runs the block's forward again inside backward: the
// block's record is a recompute under the node's modules, counted backward;
// nodes the recompute made run in a nested backward (a deeper engine entry),
// attributed to the node's modules and the recomputed block.
TEST(ContextModel, ARecomputedForwardInsideBackwardIsMarkedAndCountedBackward) {
    Ctx c;
    c.collective(kInModel);
    c.made(kNodeCkpt, kInModel);
    c.runs(kNodeCkpt, kEngine);
    const Stack recompute = kEngine + module_call(kBlock, kBlockFwd);
    c.collective(recompute);
    c.made(kNodeA, recompute);
    const Stack inner = recompute + Stack{F(kEngineRun)};  // torch.autograd.backward inside the checkpoint's backward
    c.runs(kNodeA, inner);
    c.collective(inner + Stack{F(kAllReduce)});
    c.collective(kEngine + Stack{F(kAllReduce)});  // back in the checkpoint's node
    using Chains = std::vector<std::vector<std::string>>;
    EXPECT_EQ(collective_chains(c), (Chains{{"<root>"},
                                            {"<root>:bw", "encoder.blocks.1:recompute"},
                                            {"<root>:bw", "encoder.blocks.1:recompute", "<root>:bw",
                                             "encoder.blocks.1:bw"},
                                            {"<root>:bw"}}));
    // The last, back in the checkpoint's node after the recomputed block's
    // backward began, counts for the block too (CommDebugMode's name).
    auto counts = c.tree().module_comm_counts();
    using Side = std::map<std::string, uint64_t>;
    EXPECT_EQ(counts["encoder.blocks.1"].backward, (Side{{"c10d.all_reduce", 3}}));
    EXPECT_EQ(counts["<root>"].backward, (Side{{"c10d.all_reduce", 3}}));
    ordered_json j = output::to_json(c.report(), c.t, 2);
    EXPECT_NE(j.dump().find("\"event_type\":\"checkpointing\""), std::string::npos);
}

// An engine worker thread (no Python below the engine): its records belong
// to the node it runs unless a forward module runs; bounded node memory.
TEST(ContextModel, AnEngineWorkersRecordsBelongToItsNodeAndNodesAreBounded) {
    Ctx c;
    c.collective(kInBlock);
    c.made(kNodeA, kInBlock);
    constexpr uint32_t kWorker = kTid + 1;
    c.runs(kNodeA, Stack{}, 0, kWorker);
    c.enter(c.c10d, 0x7000, Stack{F(kAllReduce)}, {}, kWorker);
    EXPECT_EQ(chain_of(c, c.recs().back()),
              (std::vector<std::string>{"<root>:bw", "encoder:bw", "encoder.blocks.1:bw"}));
    for (uint64_t n = 0; n < ProcessTree::kMaxNodes + 10; ++n) c.made(0x100000 + n, kInBlock);
    c.runs(0x100000, kEngine);  // the oldest went
    EXPECT_EQ(c.tree().autograd_nodes_unmapped(), 1u);
}

// ---- parameters ----------------------------------------------------------------

// A module whose parameters become readable after `readable_after` asks
// (FSDP2 makes a unit's unsharded parameters at its first pre-forward, which
// may run after commdbg handled the module's record).
class LateParams : public torch::ParameterSource {
public:
    explicit LateParams(int readable_after) : left_(readable_after) {}
    std::optional<torch::ModuleParams> module_parameters(uint32_t, uint64_t module) override {
        ++asks[module];
        torch::ModuleParams out;
        if (module != kBlock) return out;
        if (left_-- > 0) {
            out.retry = true, out.unread = 1;
            return out;
        }
        torch::ParamInfo p;
        p.name = "weight", p.shape = {4, 4}, p.dtype = "float32", p.local_shape = {4, 4};
        out.params.push_back(p);
        return out;
    }
    std::map<uint64_t, int> asks;

private:
    int left_;
};

std::vector<std::string> param_paths(const ProcessTree& t) {
    std::vector<std::string> out;
    for (const auto& [path, params] : t.parameters())
        if (!params.params.empty()) out.push_back(path);
    return out;
}

// The block's module opens once: its parameters, not readable then, are read
// again at the following batches, without the block opening again.
TEST(ContextModel, ParametersNotReadableYetAreReadAgainAtTheNextBatches) {
    Ctx c;
    LateParams late(3);
    c.model.set_parameter_source(&late);
    c.collective(kInBlock);
    EXPECT_TRUE(param_paths(c.tree()).empty());
    EXPECT_EQ(late.asks[kBlock], 1);
    for (int batch = 0; batch < 3; ++batch) c.model.retry_parameters();
    EXPECT_EQ(param_paths(c.tree()), std::vector<std::string>{"encoder.blocks.1"});
    EXPECT_EQ(late.asks[kBlock], 4);
    c.model.retry_parameters();  // read: not asked again
    EXPECT_EQ(late.asks[kBlock], 4);
    EXPECT_EQ(late.asks[kModel], 1) << "modules read once are not asked again";
}

// A module that never becomes readable is asked a bounded number of times,
// then what could be read (nothing here) stands.
TEST(ContextModel, ParametersThatNeverBecomeReadableAreAskedABoundedNumberOfTimes) {
    Ctx c;
    LateParams never(1'000'000);
    c.model.set_parameter_source(&never);
    c.collective(kInBlock);
    for (int batch = 0; batch < 100; ++batch) c.model.retry_parameters();
    EXPECT_LE(never.asks[kBlock], 17);
    EXPECT_GE(never.asks[kBlock], 2);
    EXPECT_TRUE(param_paths(c.tree()).empty());
    const int asked = never.asks[kBlock];
    c.model.retry_parameters();
    EXPECT_EQ(never.asks[kBlock], asked);
}
