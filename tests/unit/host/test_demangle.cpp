// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "demangle.hpp"

using commdbg::host::demangle;

namespace {

constexpr const char* kAddTensor = "_ZN2at4_ops10add_Tensor4callERKNS_6TensorES4_RKN3c106ScalarE";
constexpr const char* kAddTensorPlain =
    "at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)";

TEST(Demangle, AtenOperatorCallDemangles) {
    EXPECT_EQ(demangle(kAddTensor), kAddTensorPlain);
}

TEST(Demangle, CNamesComeBackUnchanged) {
    EXPECT_EQ(demangle("ncclAllReduce"), "ncclAllReduce");
    EXPECT_EQ(demangle(""), "");
    // Bare type codes would demangle as types ("f" -> "float") without the _Z check.
    EXPECT_EQ(demangle("f"), "f");
    EXPECT_EQ(demangle("i"), "i");
}

TEST(Demangle, InvalidManglingComesBackUnchanged) {
    EXPECT_EQ(demangle("_Z"), "_Z");
    EXPECT_EQ(demangle("_Zfoo!!"), "_Zfoo!!");
}

TEST(Demangle, ViewIsNotReadPastItsEnd) {
    std::string s = std::string(kAddTensor) + "garbage";
    EXPECT_EQ(demangle(std::string_view(s).substr(0, std::strlen(kAddTensor))), kAddTensorPlain);
}

TEST(Demangle, BufferReuseKeepsResultsCorrectAcrossLengthsAndThreads) {
    // Short after long and long after short exercise the reused buffer's growth.
    auto work = [] {
        for (int i = 0; i < 2000; ++i) {
            if (demangle("_Z1fv") != "f()") return false;
            if (demangle(kAddTensor) != kAddTensorPlain) return false;
            if (demangle("_ZN3c104impl3fooEi") != "c10::impl::foo(int)") return false;
        }
        return true;
    };
    std::vector<std::thread> ts;
    std::vector<int> ok(4, 0);
    for (int t = 0; t < 4; ++t) ts.emplace_back([&, t] { ok[t] = work(); });
    for (auto& t : ts) t.join();
    for (int v : ok) EXPECT_TRUE(v);
}

}  // namespace
