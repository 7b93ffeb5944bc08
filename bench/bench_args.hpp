// SPDX-License-Identifier: Apache-2.0
// The positional arguments of a benchmark: `bench_x [calls] [rounds]`.  A
// word that is not a whole number at or above its minimum, or -h/--help,
// prints the usage instead of running with a count of 0 (what atol made of
// `--help`).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

namespace commdbg::bench {

struct BenchArg {
    const char* name;  // as the usage line names it
    long fallback;     // when absent
    long min;
};

// The value of each of `args` from argv[1...]; exits 0 after the usage for
// -h/--help and 2 after an error for a bad word or too many words.  With
// `word` (a name), one free word may follow the numbers, into *word.
inline std::vector<long> bench_args(int argc, char** argv, std::initializer_list<BenchArg> args,
                                    const char* word_name = nullptr, std::string* word = nullptr) {
    std::string usage = std::string("usage: ") + argv[0];
    for (const auto& a : args) usage += std::string(" [") + a.name + "]";
    if (word_name) usage += std::string(" [") + word_name + "]";
    const size_t most = args.size() + (word_name ? 1 : 0);
    for (int i = 1; i < argc; ++i) {
        std::string w = argv[i];
        if (w == "-h" || w == "--help") {
            std::printf("%s\n", usage.c_str());
            std::exit(0);
        }
    }
    if (argc - 1 > static_cast<int>(most)) {
        std::fprintf(stderr, "%s: %d arguments, at most %zu — %s\n", argv[0], argc - 1, most, usage.c_str());
        std::exit(2);
    }
    std::vector<long> out;
    int i = 1;
    for (const auto& a : args) {
        if (i >= argc) {
            out.push_back(a.fallback);
            continue;
        }
        char* end = nullptr;
        errno = 0;
        long v = std::strtol(argv[i], &end, 10);
        if (errno != 0 || end == argv[i] || *end != '\0' || v < a.min) {
            std::fprintf(stderr, "%s: %s '%s' is not a whole number >= %ld — %s\n", argv[0], a.name, argv[i], a.min,
                         usage.c_str());
            std::exit(2);
        }
        out.push_back(v);
        ++i;
    }
    if (word && i < argc) *word = argv[i];
    return out;
}

// The median of a benchmark's rounds (the machine's speed drifts between them).
inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace commdbg::bench
