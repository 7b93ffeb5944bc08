// SPDX-License-Identifier: Apache-2.0
// Tensors for one session's processes, in one place: when a process maps
// libc10 and a libtorch that holds the probed process-group classes, the
// kernel is told how to read its tensors and groups (events.h,
// cd_torch_cfg), from those files' own code and symbols, derived once per
// file.  A file whose layout cannot be derived gives the process a note and
// no shapes, never wrong ones.  The kernel's map is reached only through
// TorchMaps, so all of it runs without BPF.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "events.h"
#include "module_params.hpp"
#include "procfs.hpp"
#include "process_group.hpp"
#include "py_objects.hpp"
#include "remote_memory.hpp"
#include "result.hpp"
#include "tensor_layout.hpp"

namespace commdbg::torch {

class TorchMaps {
public:
    virtual ~TorchMaps() = default;
    virtual Result<bool> write_config(uint32_t pid, const cd_torch_cfg& cfg) = 0;
    virtual void clear(uint32_t pid) = 0;
};

// What one libc10 or libtorch file says, derived once.
struct TorchFile {
    std::string error;  // non-empty: nothing usable (the reason)
    host::ElfData elf;  // its headers: where it is loaded in a process (host::load_bias)
    // libc10
    std::optional<TensorLayout> layout;
    uint64_t impl_vtable = 0, undefined = 0;  // link-time addresses
    // libtorch
    std::vector<GroupClass> groups;
    RootLayout roots;  // libtorch: where c10d options keep rootRank
    // libtorch and libtorch_python: its own copy of c10d::ReduceOp; unset: why_no_reduce_op
    std::optional<ReduceOpLayout> reduce_op;
    std::string why_no_reduce_op;
    // libtorch_python: the TensorImpl*'s offset in a torch.Tensor object
    std::optional<uint32_t> variable_impl;
};

// Builds the kernel's config from a process's files and their load biases
// (libtorch_python's, when mapped: its ReduceOp); the error when they cannot
// give one.
Result<cd_torch_cfg> torch_config(const TorchFile& c10, uint64_t c10_bias,
                                  const std::vector<std::pair<const TorchFile*, uint64_t>>& libtorch,
                                  std::optional<std::pair<const TorchFile*, uint64_t>> python = std::nullopt);

class TorchSupport final : public ParameterSource {
public:
    static constexpr size_t kMaxFiles = 16;  // derived files kept (a file is 100+ MB to read again)

    explicit TorchSupport(TorchMaps& maps, bool enabled = true) : maps_(maps), enabled_(enabled) {}
    TorchSupport(const TorchSupport&) = delete;
    TorchSupport& operator=(const TorchSupport&) = delete;

    // Tried at attach and at each loader change until the kernel reads the
    // process's tensors; a note (once) when its files cannot be used.
    std::optional<std::string> setup(uint32_t pid, const std::string& proc_root = "/proc");
    // The layout pid's records were read with; null: none.
    const TensorLayout* layout(uint32_t pid) const;
    void clear(uint32_t pid) { maps_.clear(pid); }
    void forget(uint32_t pid) { procs_.erase(pid); }
    // Both: a process retired, or one whose image an exec replaced.
    void drop(uint32_t pid) { clear(pid), forget(pid); }

    // Module parameters are read through `py` (the session's resolver); none without it.
    void set_python(python::LivePyResolver* py) { py_ = py; }
    std::optional<ModuleParams> module_parameters(uint32_t pid, uint64_t module) override;
    // Why pid's module parameters are not read, when its libtorch_python cannot be used.
    std::optional<std::string> parameters_note(uint32_t pid) const;

    // The class whose vtable (address point) is `vtable` in pid, demangled
    // ("torch::autograd::generated::MmBackward0"), from the dynamic symbols
    // of the file mapped there; "" when none names it.  An autograd node's
    // class (TraceModel::set_node_namer).
    std::string class_of_vtable(uint32_t pid, uint64_t vtable);

private:
    enum class Kind { c10, libtorch, python };
    static constexpr int kPythonTries = 3;
    static constexpr size_t kMaxFsdpParams = 65536;  // sharded parameters known per process
    struct Process {
        std::shared_ptr<const TorchFile> c10;
        bool ready = false;
        bool noted = false;
        bool complete = false;  // its config has libtorch_python's ReduceOp too (else: written again)
        int writes = 0;         // of its config (kPythonTries at most)
        std::optional<uint32_t> variable_impl;  // from libtorch_python: parameters can be read
        int python_tries = 0;                   // looks for libtorch_python (kPythonTries at most)
        std::string params_note;                // why its module parameters are not read
        uint64_t impl_vtable = 0;               // c10::TensorImpl's vtable in the process
        // FSDP2: a sharded parameter object -> the FSDPParam holding it (checked again at use).
        std::unordered_map<uint64_t, uint64_t> fsdp_params;
    };
    std::shared_ptr<const TorchFile> file(const std::string& open_path, uint64_t dev, uint64_t inode, Kind kind);
    void setup_parameters(uint32_t pid, Process& p, const std::vector<host::MappedFile>& files);
    std::optional<std::vector<int64_t>> shape_at(const Process& p, host::RemoteMemory& mem,
                                                 uint64_t obj, std::string* dtype = nullptr);
    std::optional<ParamInfo> read_param(uint32_t pid, const Process& p, host::RemoteMemory& mem, uint64_t obj,
                                        const python::PyTypeFacts& type);
    std::optional<std::string> placement(uint32_t pid, uint64_t obj);
    void learn_fsdp_unit(uint32_t pid, Process& p, uint64_t module);
    uint64_t fsdp_forward_view(uint32_t pid, const Process& p, uint64_t param, uint64_t& unmade);
    std::optional<ParamInfo> fsdp_unsharded_info(uint32_t pid, const Process& p, host::RemoteMemory& mem, uint64_t fp,
                                                 uint64_t sharded);

    TorchMaps& maps_;
    bool enabled_;
    python::LivePyResolver* py_ = nullptr;
    std::string proc_root_ = "/proc";
    std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const TorchFile>> files_;
    // Per file (dev, inode): its vtables' address points (link-time) -> mangled names.
    struct Vtables {
        host::ElfData elf;
        std::map<uint64_t, std::string> at;
    };
    std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const Vtables>> vtables_;
    std::map<uint32_t, Process> procs_;
};

}  // namespace commdbg::torch
