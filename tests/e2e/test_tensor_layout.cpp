// SPDX-License-Identifier: Apache-2.0
// The TensorImpl layout derived from a libc10 file's code (torch/), checked
// against torch itself: a live process holds tensors of every shape kind
// (0 dims, inline and heap sizes, views, no elements) and prints what torch
// says of each; commdbg reads them from outside with the layout it derived
// from the libc10 that process mapped, and must read the same.  Torch 1.13
// on the host, torch 2.6 in the trixie root.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "e2e_util.hpp"
#include "procfs.hpp"
#include "remote_memory.hpp"
#include "tensor_layout.hpp"

namespace commdbg::e2e {
namespace {

const std::string kShapes = "tensor_shapes.py";

// The libc10 file `pid` maps, as this process can open it.
std::string mapped_libc10(int pid) {
    auto maps = host::read_maps(pid);
    if (!maps) return {};
    auto files = host::mapped_files(*maps, pid, [](std::string_view p) {
        return p.find("/libc10.so") != std::string_view::npos;
    });
    return files.empty() ? std::string() : files.front().open_path;
}

// Reads every tensor the workload listed and compares it with torch's word.
void expect_tensors_read_as_torch_says(Background& job) {
    const std::string line = job.wait_for_line("\"tensors\"", 120);
    ASSERT_FALSE(line.empty()) << "the workload printed no tensors";
    const auto said = nlohmann::json::parse(line);
    const int pid = said["pid"].get<int>();
    const std::string lib = mapped_libc10(pid);
    ASSERT_FALSE(lib.empty()) << "pid " << pid << " maps no libc10";
    auto layout = torch::derive_tensor_layout(lib);
    ASSERT_TRUE(layout) << layout.error();
    host::ProcessMemory mem(pid);
    ASSERT_GE(said["tensors"].size(), 10u);
    for (const auto& t : said["tensors"]) {
        SCOPED_TRACE("torch " + said["torch"].get<std::string>() + ": " + t.dump());
        auto got = torch::read_tensor(mem, *layout, t["cdata"].get<uint64_t>());
        ASSERT_TRUE(got) << got.error();
        EXPECT_EQ(got->sizes, t["shape"].get<std::vector<int64_t>>());
        EXPECT_EQ(got->dtype, t["dtype"].get<std::string>());
        EXPECT_EQ(got->numel, t["numel"].get<int64_t>());
        EXPECT_EQ(got->bytes, t["bytes"].get<uint64_t>());
    }
}

TEST(TensorLayout, Torch113TensorsReadFromOutsideAreWhatTorchSays) {
    const std::string py = "/usr/bin/python3";
    auto has_torch = run({py, "-c", "import torch"}, {}, 60);
    REQUIRE_OR_SKIP(has_torch.status == 0, "Debian's python3 does not import torch (apt install python3-torch)");
    Background job({py, kTestprogs + "/" + kShapes});
    expect_tensors_read_as_torch_says(job);
}

TEST(TensorLayout, Torch26TensorsReadFromOutsideAreWhatTorchSays) {
    const std::string root = trixie_root();
    REQUIRE_TRIXIE_ROOT(root);
    Background job({kRunScript, "--bind", kTestprogs + ":" + kInRoot, root, "python3", kInRoot + "/" + kShapes});
    expect_tensors_read_as_torch_says(job);
}

}  // namespace
}  // namespace commdbg::e2e
