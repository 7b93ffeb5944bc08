// SPDX-License-Identifier: Apache-2.0
// The kernel's per-process Python maps (python_support.hpp, PyMaps) and
// tensor-reading map (torch_support.hpp, TorchMaps) as the session's BPF
// object holds them.  BpfSession (capture) cannot see either interface (the
// layers above it), so the adapters live here, where both sides are seen.
#pragma once

#include "bpf_session.hpp"
#include "python_support.hpp"
#include "torch_support.hpp"

namespace commdbg::session {

class BpfPyMaps final : public python::PyMaps {
public:
    explicit BpfPyMaps(capture::BpfSession& bpf) : bpf_(bpf) {}
    Result<bool> write_config(uint32_t pid, const cd_py_cfg& cfg) override { return bpf_.set_python(pid, cfg); }
    void write_code_kinds(uint32_t pid, const cd_py_codes* codes) override { bpf_.set_py_codes(pid, codes); }
    void clear(uint32_t pid) override { bpf_.clear_python(pid); }

private:
    capture::BpfSession& bpf_;
};

class BpfTorchMaps final : public torch::TorchMaps {
public:
    explicit BpfTorchMaps(capture::BpfSession& bpf) : bpf_(bpf) {}
    Result<bool> write_config(uint32_t pid, const cd_torch_cfg& cfg) override { return bpf_.set_torch(pid, cfg); }
    void clear(uint32_t pid) override { bpf_.clear_torch(pid); }

private:
    capture::BpfSession& bpf_;
};

}  // namespace commdbg::session
