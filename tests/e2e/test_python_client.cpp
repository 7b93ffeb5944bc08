// SPDX-License-Identifier: Apache-2.0
// The commdbg Python package's client for commdbgd's socket, against a real
// daemon: counts() gives what `commdbg counts` gives, and attach() a window
// traced inside the daemon, loaded as load() loads a dump.
#include "daemon_util.hpp"

namespace commdbg::e2e {
namespace {

using namespace daemon_util;

TEST(PythonClient, CountsEqualTheCliAndAttachGivesTheProcessesDump) {
    REQUIRE_BPF();
    SharedDir tmp;
    START_DAEMON(d, tmp, {});
    StalledWorkload w({testprog("nccl_workload"), "--calls", "all_reduce=5,broadcast=2"});
    ASSERT_STALLED(w);
    const std::map<std::string, long> want = {{"nccl.all_reduce", 5}, {"nccl.broadcast", 2}};
    ASSERT_EQ(daemon_counts_settled(d, w.pid(), want), want);
    const std::string pid = std::to_string(w.pid());
    auto c = run({"/usr/bin/python3", "-c",
             "import json, sys; import commdbg\nprint(json.dumps(commdbg.Daemon(sys.argv[1]).counts(pid=int(sys.argv[2]))))",
             d.socket(), pid},
            {{"PYTHONPATH", std::string(SOURCE_DIR) + "/python"}}, 60);
    ASSERT_EQ(c.status, 0) << c.err;
    EXPECT_EQ(comm_counts_of(process_entry(json::parse(c.out), w.pid())), want) << c.out;

    auto a = run({"/usr/bin/python3", "-c",
                  "import json, sys; import commdbg\nm = commdbg.Daemon(sys.argv[1]).attach(int(sys.argv[2]), 1)\n"
                  "print(json.dumps({'pid': m.dump['process']['pid'], 'counts': dict(m.get_comm_counts())}))",
                  d.socket(), pid},
                 {{"PYTHONPATH", std::string(SOURCE_DIR) + "/python"}}, 60);
    ASSERT_EQ(a.status, 0) << a.err;
    const json got = json::parse(a.out);
    EXPECT_EQ(got["pid"], w.pid());
    EXPECT_EQ(got["counts"], json::object()) << "the workload made its calls before the window";
    // A process that does not exist: the daemon's own words.
    auto bad = run({"/usr/bin/python3", "-c", "import sys; import commdbg\ncommdbg.Daemon(sys.argv[1]).attach(999999999, 1)",
                    d.socket()},
                   {{"PYTHONPATH", std::string(SOURCE_DIR) + "/python"}}, 60);
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.err.find("commdbg.CommdbgError"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace commdbg::e2e
