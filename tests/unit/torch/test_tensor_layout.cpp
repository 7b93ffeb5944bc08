// SPDX-License-Identifier: Apache-2.0
// What torch/ does when a libc10 file or a tensor is not what it expects:
// an error that says so, never a layout or a shape.  (That the layout it
// derives reads live tensors as torch says: tests/e2e/test_tensor_layout.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "elf_symbols.hpp"
#include "patch_code.hpp"
#include "tensor_layout.hpp"
#include "test_proc.hpp"

namespace commdbg::torch {
namespace {

namespace fs = std::filesystem;

// Debian's python3-torch libc10 (make deps installs it), or "".
std::string host_libc10() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/usr/lib/x86_64-linux-gnu", ec))
        if (e.path().filename().string().rfind("libc10.so.", 0) == 0 && e.is_regular_file()) return e.path();
    return {};
}

#define REQUIRE_LIBC10(lib)                                                                       \
    const std::string lib = host_libc10();                                                        \
    REQUIRE_OR_SKIP(!lib.empty(), "no libc10.so in /usr/lib/x86_64-linux-gnu (apt install python3-torch)")

// A copy of `lib` in a temporary folder, with `patch` applied to the code of `symbol`.
class PatchedCopy {
public:
    PatchedCopy(const std::string& lib, const char* symbol, const std::function<void(std::vector<uint8_t>&)>& patch)
        : dir_(fs::temp_directory_path() / ("commdbg-libc10-" + std::to_string(getpid()))) {
        fs::create_directories(dir_);
        path_ = (dir_ / "libc10.so").string();
        fs::copy_file(lib, path_, fs::copy_options::overwrite_existing);
        patched_ = test::patch_function_code(path_, symbol, patch);
    }
    ~PatchedCopy() { fs::remove_all(dir_); }
    const std::string& path() const { return path_; }
    bool patched() const { return patched_; }

private:
    fs::path dir_;
    std::string path_;
    bool patched_ = false;
};

TEST(TensorLayout, ALibc10WhoseSizesReaderHasAnotherShapeGivesAnErrorAndNoLayout) {
    REQUIRE_LIBC10(lib);
    ASSERT_TRUE(derive_tensor_layout(lib)) << "the unpatched file must derive, so the failure below is the patch's";
    PatchedCopy copy(lib, "_ZNK3c1010TensorImpl12sizes_customEv",
                     [](std::vector<uint8_t>& code) { std::fill(code.begin(), code.end(), 0xcc); });
    ASSERT_TRUE(copy.patched());
    auto l = derive_tensor_layout(copy.path());
    ASSERT_FALSE(l);
    EXPECT_NE(l.error().find("layout cannot be derived"), std::string::npos) << l.error();
    EXPECT_NE(l.error().find("sizes_custom"), std::string::npos) << l.error();
}

// strides_custom says 6 dims sit inline where sizes_custom says 5: the
// readers disagree, so neither is believed.
TEST(TensorLayout, ALibc10WhoseReadersDisagreeOnTheInlineDimsGivesAnError) {
    REQUIRE_LIBC10(lib);
    bool changed = false;
    PatchedCopy copy(lib, "_ZNK3c1010TensorImpl14strides_customEv", [&](std::vector<uint8_t>& code) {
        for (size_t i = 0; i + 3 < code.size() && !changed; ++i)
            if ((code[i] & 0xf8) == 0x48 && code[i + 1] == 0x83 && (code[i + 2] & 0xf8) == 0xf8 && code[i + 3] == 5) {
                code[i + 3] = 6;  // cmp $5,%reg -> cmp $6,%reg
                changed = true;
            }
    });
    ASSERT_TRUE(copy.patched() && changed) << "no `cmp $5,%reg` in strides_custom";
    auto l = derive_tensor_layout(copy.path());
    ASSERT_FALSE(l);
    EXPECT_NE(l.error().find("disagree"), std::string::npos) << l.error();
}

TEST(TensorLayout, AFileThatIsNotLibc10GivesAnErrorThatSaysSo) {
    auto l = derive_tensor_layout("/usr/lib/x86_64-linux-gnu/libc.so.6");
    ASSERT_FALSE(l);
    EXPECT_NE(l.error().find("no TensorImpl::sizes_custom exported"), std::string::npos) << l.error();
    auto missing = derive_tensor_layout("/nonexistent/libc10.so");
    ASSERT_FALSE(missing);
    EXPECT_NE(missing.error().find("/nonexistent/libc10.so"), std::string::npos) << missing.error();
}

// ---- read_tensor on a memory image ------------------------------------------

class ImageMemory : public host::RemoteMemory {
public:
    void put(uint64_t addr, const void* p, size_t n) {
        auto b = static_cast<const uint8_t*>(p);
        for (size_t i = 0; i < n; ++i) bytes_[addr + i] = b[i];
    }
    template <typename T>
    void put_value(uint64_t addr, T v) { put(addr, &v, sizeof v); }

protected:
    int fetch(uint64_t addr, void* out, size_t n) override {
        auto o = static_cast<uint8_t*>(out);
        for (size_t i = 0; i < n; ++i) {
            auto it = bytes_.find(addr + i);
            if (it == bytes_.end()) return EFAULT;
            o[i] = it->second;
        }
        return 0;
    }

private:
    std::map<uint64_t, uint8_t> bytes_;
};

// A layout as a file would give it (the 2.6 build's offsets; any would do).
TensorLayout layout() {
    TensorLayout l{0x40, 0x48, 5, 0xa0, 0xa8, 0xae, 0x10, 44, {}, 0};
    l.itemsizes = {1, 1, 2, 4, 8, 2, 4, 8};
    l.named = named_scalar_types(l.itemsizes);
    return l;
}

constexpr uint64_t kImpl = 0x10000, kHeap = 0x20000;

ImageMemory tensor(const std::vector<int64_t>& sizes, int64_t numel, uint16_t dtype, uint8_t flags = 0) {
    const TensorLayout l = layout();
    ImageMemory m;
    m.put_value<uint64_t>(kImpl + l.dim, sizes.size());
    if (sizes.size() <= l.inline_dims) {
        m.put(kImpl + l.sizes, sizes.data(), sizes.size() * 8);
    } else {
        m.put_value<uint64_t>(kImpl + l.sizes, kHeap);
        m.put(kHeap, sizes.data(), sizes.size() * 8);
    }
    m.put_value<int64_t>(kImpl + l.numel, numel);
    m.put_value<uint16_t>(kImpl + l.data_type, dtype);
    m.put_value<uint8_t>(kImpl + l.symbolic_at, flags);
    return m;
}

TEST(ReadTensor, InlineAndHeapSizesAreReadWithDtypeAndBytes) {
    auto small = tensor({3, 4}, 12, 6);
    auto t = read_tensor(small, layout(), kImpl);
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->sizes, (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(t->dtype, "float32");
    EXPECT_EQ(t->bytes, 48u);
    auto big = tensor({2, 1, 3, 1, 2, 2}, 24, 5);
    auto h = read_tensor(big, layout(), kImpl);
    ASSERT_TRUE(h) << h.error();
    EXPECT_EQ(h->sizes, (std::vector<int64_t>{2, 1, 3, 1, 2, 2}));
    EXPECT_EQ(h->dtype, "float16");
    EXPECT_EQ(h->bytes, 48u);
}

TEST(ReadTensor, FieldsThatDisagreeGiveAnErrorNeverAShape) {
    auto wrong_numel = tensor({3, 4}, 13, 6);
    auto t = read_tensor(wrong_numel, layout(), kImpl);
    ASSERT_FALSE(t);
    EXPECT_NE(t.error().find("not the product"), std::string::npos) << t.error();
    auto negative = tensor({3, -4}, -12, 6);
    EXPECT_FALSE(read_tensor(negative, layout(), kImpl));
    auto no_dtype = tensor({2}, 2, 44);  // Undefined, or past the table
    auto d = read_tensor(no_dtype, layout(), kImpl);
    ASSERT_FALSE(d);
    EXPECT_NE(d.error().find("not a ScalarType"), std::string::npos) << d.error();
}

TEST(ReadTensor, ASymbolicShapeOrAnImplausibleDimCountIsNotRead) {
    auto symbolic = tensor({3, 4}, 12, 6, 0x10);
    auto s = read_tensor(symbolic, layout(), kImpl);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().find("symbolic"), std::string::npos) << s.error();
    auto garbage = tensor({}, 1, 6);
    garbage.put_value<uint64_t>(kImpl + layout().dim, 1u << 20);
    EXPECT_FALSE(read_tensor(garbage, layout(), kImpl));
    ImageMemory unmapped;
    auto u = read_tensor(unmapped, layout(), kImpl);
    ASSERT_FALSE(u);
    EXPECT_NE(u.error().find("cannot read"), std::string::npos) << u.error();
}

TEST(ReadTensor, DtypeNamesHoldOnlyWhereTheFilesElementSizesAgree) {
    TensorLayout l = layout();
    EXPECT_EQ(dtype_name(l, 4), "int64");
    l.itemsizes = {1, 1, 2, 8};  // int32 with 8-byte elements: another enum than torch's
    l.named = named_scalar_types(l.itemsizes);
    EXPECT_EQ(l.named, 3u);
    EXPECT_EQ(dtype_name(l, 2), "int16");
    EXPECT_EQ(dtype_name(l, 3), "scalar_type_3");
}

}  // namespace
}  // namespace commdbg::torch
