// SPDX-License-Identifier: Apache-2.0
// ElfSymbols against a library built here (offsets checked against nm and the
// code bytes the dynamic loader maps), the real libnccl, and broken files.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "elf_symbols.hpp"

namespace fs = std::filesystem;
using commdbg::host::ElfSymbol;
using commdbg::host::ElfSymbols;

namespace {

// Each function has distinct code so comparing bytes identifies it; the
// text segment is moved to 0x10000 so file offsets differ from vaddrs.
constexpr const char* kLibSource = R"(
int cd_first(int x) { return x * 12345 + 678; }
int cd_second(int x) { return x * 54321 - 876; }
int cd_alias(int x) __attribute__((alias("cd_first")));
__attribute__((weak)) int cd_weak(int x) { return x * 777 + 3; }
int cd_v1(int x) { return x * 999 + 11; }
__asm__(".symver cd_v1, cd_versioned@@CD_1");
__attribute__((noinline, used)) static int cd_static(int x) { return x * 31 + 5; }
int cd_calls_static(int x) { return cd_static(x) + 1; }
int cd_data = 42;
)";

std::string run_capture(const std::string& cmd) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
    return out;
}

// name -> address from `nm` output, version suffixes removed.
std::map<std::string, uint64_t> nm_functions(const std::string& args) {
    std::map<std::string, uint64_t> out;
    std::string text = run_capture("nm " + args + " 2>/dev/null");
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        std::string line = text.substr(pos, nl - pos);
        pos = nl == std::string::npos ? text.size() : nl + 1;
        char addr[64], type, name[4096];
        if (std::sscanf(line.c_str(), "%63s %c %4095s", addr, &type, name) != 3) continue;
        if (std::strchr("TtWi", type) == nullptr) continue;
        std::string n = name;
        n = n.substr(0, n.find('@'));
        out.emplace(n, std::strtoull(addr, nullptr, 16));
    }
    return out;
}

std::string read_bytes(const std::string& path, uint64_t off, size_t n) {
    std::ifstream f(path, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(off));
    std::string s(n, '\0');
    f.read(s.data(), static_cast<std::streamsize>(n));
    return f ? s : std::string();
}

void write_file(const std::string& path, const std::string& data) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

class ElfSymbolsTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        char tmpl[] = "/tmp/commdbg_elf_XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        lib_ = dir_ + "/libcdtest.so";
        write_file(dir_ + "/lib.c", kLibSource);
        write_file(dir_ + "/v.map", "CD_1 { global: *; };\n");
        std::string cc = "cc -shared -fPIC -O1 -Wl,--version-script=" + dir_ + "/v.map -Wl,-Ttext-segment=0x10000 -o " +
                         lib_ + " " + dir_ + "/lib.c";
        ASSERT_EQ(std::system(cc.c_str()), 0) << cc;
    }
    static void TearDownTestSuite() {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    static std::string dir_, lib_;
};
std::string ElfSymbolsTest::dir_;
std::string ElfSymbolsTest::lib_;

TEST_F(ElfSymbolsTest, VaddrsAgreeWithNmForDynamicAndStaticTables) {
    auto syms = ElfSymbols::open(lib_);
    ASSERT_TRUE(syms.ok()) << syms.error();
    auto dyn = nm_functions("-D --defined-only " + lib_);
    auto all = nm_functions("--defined-only " + lib_);
    ASSERT_FALSE(dyn.empty()) << "nm produced nothing";
    for (const char* name : {"cd_first", "cd_second", "cd_alias", "cd_weak", "cd_versioned", "cd_v1",
                             "cd_calls_static"}) {
        const ElfSymbol* s = syms->find(name);
        ASSERT_NE(s, nullptr) << name;
        ASSERT_TRUE(dyn.count(name)) << name;
        EXPECT_EQ(s->vaddr, dyn[name]) << name;
        EXPECT_TRUE(s->dynamic) << name;
        EXPECT_FALSE(s->local) << name;
    }
    const ElfSymbol* st = syms->find("cd_static");
    ASSERT_NE(st, nullptr) << "static function from .symtab missing";
    EXPECT_EQ(st->vaddr, all["cd_static"]);
    EXPECT_TRUE(st->local);
    EXPECT_FALSE(st->dynamic);
    EXPECT_TRUE(syms->find("cd_weak")->weak);
    EXPECT_FALSE(syms->find("cd_first")->weak);
    EXPECT_EQ(syms->find("cd_data"), nullptr) << "data objects are not functions";
    EXPECT_EQ(syms->find("cd_firs"), nullptr) << "lookup is exact";
}

TEST_F(ElfSymbolsTest, FileOffsetPointsAtTheCodeTheLoaderMaps) {
    auto syms = ElfSymbols::open(lib_);
    ASSERT_TRUE(syms.ok()) << syms.error();
    void* h = dlopen(lib_.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    for (const char* name : {"cd_first", "cd_second", "cd_weak", "cd_versioned"}) {
        const ElfSymbol* s = syms->find(name);
        ASSERT_NE(s, nullptr) << name;
        ASSERT_GE(s->size, 8u) << name;
        // The test library is linked so that offsets and vaddrs differ; without
        // the PT_LOAD translation these would point at the wrong bytes.
        EXPECT_NE(s->file_offset, s->vaddr) << name;
        void* mem = dlsym(h, name);
        ASSERT_NE(mem, nullptr) << name;
        std::string file_bytes = read_bytes(lib_, s->file_offset, s->size);
        ASSERT_EQ(file_bytes.size(), s->size) << name;
        EXPECT_EQ(std::memcmp(file_bytes.data(), mem, s->size), 0) << name << ": bytes at file_offset differ";
    }
    dlclose(h);
}

TEST_F(ElfSymbolsTest, AliasesAreSeparateEntriesAtTheSameOffset) {
    auto syms = ElfSymbols::open(lib_);
    ASSERT_TRUE(syms.ok()) << syms.error();
    const ElfSymbol* a = syms->find("cd_first");
    const ElfSymbol* b = syms->find("cd_alias");
    ASSERT_TRUE(a && b);
    EXPECT_NE(a, b);
    EXPECT_EQ(a->file_offset, b->file_offset);
    EXPECT_EQ(a->vaddr, b->vaddr);
    // cd_first is in both .dynsym and .symtab but listed once.
    EXPECT_EQ(syms->find_all("cd_first").size(), 1u);
}

TEST_F(ElfSymbolsTest, VersionSuffixesAreStripped) {
    auto syms = ElfSymbols::open(lib_);
    ASSERT_TRUE(syms.ok()) << syms.error();
    for (const ElfSymbol& s : syms->functions()) {
        EXPECT_EQ(s.name.find('@'), std::string::npos) << s.name;
    }
    // .symtab spells it "cd_versioned@@CD_1"; it must merge with the .dynsym entry.
    EXPECT_EQ(syms->find_all("cd_versioned").size(), 1u);
}

TEST(ElfSymbolsReal, LibncclAllReduceAndItsProfilingAliasShareAnOffset) {
    std::string path = std::string(REAL_NCCL_DIR) + "/libnccl.so.2";
    if (!fs::exists(path)) GTEST_SKIP() << path << " not installed";
    auto syms = ElfSymbols::open(path);
    ASSERT_TRUE(syms.ok()) << syms.error();
    const ElfSymbol* a = syms->find("ncclAllReduce");
    const ElfSymbol* p = syms->find("pncclAllReduce");
    ASSERT_TRUE(a && p);
    EXPECT_EQ(a->file_offset, p->file_offset);
    EXPECT_TRUE(a->dynamic);
    EXPECT_GT(a->size, 0u);
    auto dyn = nm_functions("-D --defined-only " + path);
    ASSERT_TRUE(dyn.count("ncclAllReduce"));
    EXPECT_EQ(a->vaddr, dyn["ncclAllReduce"]);
}

class ElfSymbolsBroken : public ElfSymbolsTest {};

void expect_fails_naming(const std::string& path, const std::string& why) {
    auto r = ElfSymbols::open(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.error().find(path), std::string::npos) << r.error();
    EXPECT_NE(r.error().find(why), std::string::npos) << r.error();
}

TEST_F(ElfSymbolsBroken, MissingFileSaysNoSuchFile) {
    expect_fails_naming(dir_ + "/does-not-exist.so", "no such file");
}

TEST_F(ElfSymbolsBroken, EmptyFileIsNotElf) {
    write_file(dir_ + "/empty.so", "");
    expect_fails_naming(dir_ + "/empty.so", "not an ELF file");
}

TEST_F(ElfSymbolsBroken, RandomBytesAreNotElf) {
    std::mt19937 rng(7);
    std::string junk(8192, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    write_file(dir_ + "/junk.so", junk);
    expect_fails_naming(dir_ + "/junk.so", "not an ELF file");
}

TEST_F(ElfSymbolsBroken, DirectoryIsNotARegularFile) {
    expect_fails_naming(dir_, "not a regular file");
}

TEST_F(ElfSymbolsBroken, TruncatedCopySaysTruncated) {
    std::string whole = read_bytes(lib_, 0, fs::file_size(lib_));
    ASSERT_FALSE(whole.empty());
    std::string half = dir_ + "/half.so";
    write_file(half, whole.substr(0, whole.size() / 2));
    expect_fails_naming(half, "truncated");
}

TEST_F(ElfSymbolsBroken, EveryTruncationLengthFailsCleanly) {
    std::string whole = read_bytes(lib_, 0, fs::file_size(lib_));
    ASSERT_FALSE(whole.empty());
    std::string cut = dir_ + "/cut.so";
    for (size_t len = 1; len < whole.size(); len += (len < 128 ? 1 : 61)) {
        write_file(cut, whole.substr(0, len));
        auto r = ElfSymbols::open(cut);
        EXPECT_FALSE(r.ok()) << "length " << len;
        EXPECT_NE(r.error().find(cut), std::string::npos) << r.error();
    }
}

TEST_F(ElfSymbolsBroken, CorruptSymbolTableOffsetFailsCleanly) {
    auto ok = ElfSymbols::open(lib_);
    ASSERT_TRUE(ok.ok());
    std::string bytes = read_bytes(lib_, 0, fs::file_size(lib_));
    // Point every SHT_DYNSYM/SHT_SYMTAB section header's sh_offset past EOF.
    uint64_t shoff;
    uint16_t shentsize, shnum;
    std::memcpy(&shoff, bytes.data() + 0x28, 8);
    std::memcpy(&shentsize, bytes.data() + 0x3a, 2);
    std::memcpy(&shnum, bytes.data() + 0x3c, 2);
    int patched = 0;
    for (uint16_t i = 0; i < shnum; ++i) {
        char* sh = bytes.data() + shoff + uint64_t(i) * shentsize;
        uint32_t type;
        std::memcpy(&type, sh + 4, 4);
        if (type == 2 || type == 11) {  // SHT_SYMTAB, SHT_DYNSYM
            uint64_t bad = 0x7fffffff0000ull;
            std::memcpy(sh + 0x18, &bad, 8);
            ++patched;
        }
    }
    ASSERT_EQ(patched, 2);
    std::string path = dir_ + "/corrupt.so";
    write_file(path, bytes);
    expect_fails_naming(path, "truncated or corrupt");
}

TEST_F(ElfSymbolsBroken, StrippedStaticExecutableHasNoSymbolTable) {
    std::string src = dir_ + "/start.c", exe = dir_ + "/stripped";
    write_file(src, "void _start(void) { for (;;) {} }\n");
    std::string cmd = "cc -O1 -static -nostdlib -o " + exe + " " + src + " && strip --strip-all " + exe;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    expect_fails_naming(exe, "no symbol table (stripped?)");
}

TEST_F(ElfSymbolsBroken, RelocatableObjectHasNoLoadableSegments) {
    std::string obj = dir_ + "/lib.o";
    std::string cmd = "cc -c -fPIC -o " + obj + " " + dir_ + "/lib.c";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    expect_fails_naming(obj, "no loadable segments");
}

}  // namespace
