# SPDX-License-Identifier: Apache-2.0
"""The commdbg Python package without torch: lookups by any name of a
collective, the scope window, module paths as CommDebugMode names them, a
dump of several processes, the outputs it writes, errors that say what to
do, and `pip install` of the package.  (Side by side with torch's own
CommDebugMode: tests/e2e/test_commdebug_mode.cpp.)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
sys.path.insert(0, SOURCE)
import commdbg  # noqa: E402


def module(fqn, cls, side, *children):
    return {"type": "module", "module_fqn": fqn, "module_class": cls, "event_type": side, "children": list(children)}


def coll(kind, layer="c10d", *children):
    return {"type": "collective", "layer": layer, "collective_type": kind, "children": list(children)}


def scope(name, *children):
    return {"type": "scope", "name": name, "children": list(children)}


# Setup's broadcast outside the step scope; in it, the root's forward with
# blocks.0's all-reduce (an NCCL call inside it), a backward all-reduce
# under blocks.0, and the optimizer's all-gather outside any module.
PROC = {
    "process": {"pid": 7},
    "comm_counts": {"c10d.broadcast": 1, "c10d.all_reduce": 2, "c10d.all_gather": 1, "nccl.all_reduce": 2},
    "dropped_records": 3,
    "records": [
        coll("broadcast"),
        scope("step",
              module("<root>", "Net", "forward", module("blocks.0", "Block", "forward",
                                                        coll("all_reduce", "c10d", coll("all_reduce", "nccl")))),
              module("<root>", "Net", "backward", module("blocks.0", "Block", "backward", coll("all_reduce"))),
              coll("all_gather")),
    ],
    "parameter_info": {"blocks.0": {"weight": {"shape": [4, 2], "dtype": "float32", "local_shape": [2, 2],
                                                "is_dtensor": True}}},
    "sharding_info": {"blocks.0.weight": "(Shard(dim=0),)"},
    "fsdp": {"violations": []},
}


class Op:
    """Stands for a torch op object: str() is its qualified name."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name


class Package(unittest.TestCase):
    def test_counts_answer_every_name_of_a_collective(self):
        whole = commdbg.load(PROC)
        counts = whole.get_comm_counts()
        self.assertEqual(dict(counts), {"broadcast": 1, "all_reduce": 2, "all_gather": 1})
        for key in ("all_reduce", "c10d.all_reduce", "c10d_functional.all_reduce", "_c10d_functional.all_reduce",
                    "c10d.allreduce_", Op("c10d_functional.all_reduce")):
            self.assertEqual(counts[key], 2, key)
        self.assertEqual(counts.get(Op("c10d_functional.all_gather_into_tensor")), 1)
        self.assertEqual(counts.get("c10d._allgather_base_"), 1)
        self.assertEqual(counts.get("c10d_functional.reduce_scatter_tensor", 0), 0)
        self.assertEqual(whole.get_total_counts(), 4)
        self.assertEqual(whole.get_dropped_record_count(), 3)
        self.assertEqual(whole.fsdp(), {"violations": []})

    def test_a_scope_keeps_its_window_and_modules_are_named_as_commdebugmode_names_them(self):
        step = commdbg.load(PROC, scope="step")
        self.assertEqual(dict(step.get_comm_counts()), {"all_reduce": 2, "all_gather": 1})
        m = step.comm_module_counts
        self.assertEqual(set(m), {"Global", "Net", "Net.blocks.0"})
        self.assertEqual(dict(m["Global"]["forward"]), {"all_reduce": 1, "all_gather": 1})
        self.assertEqual(dict(m["Global"]["backward"]), {"all_reduce": 1})
        self.assertEqual(dict(m["Net.blocks.0"]["forward"]), {"all_reduce": 1}, "the NCCL call inside counts once")
        self.assertEqual(m["Net.blocks.0"]["backward"][Op("c10d_functional.all_reduce")], 1)
        self.assertEqual(m["Net"]["module_type"], "Net")
        info = step.get_parameter_info()["Net.blocks.0"]["weight"]
        self.assertEqual((info.shape, info.local_shape, info.dtype, info.is_dtensor), ((4, 2), (2, 2), "float32", True))
        self.assertEqual(step.get_sharding_info(), {"Net.blocks.0.weight": "(Shard(dim=0),)"})

    def test_outputs_are_written_where_asked(self):
        step = commdbg.load(PROC, scope="step")
        table = step.generate_comm_debug_tracing_table(noise_level=1)
        self.assertIn("  Net.blocks.0\n", table)
        self.assertIn("*module type: Block", table)
        self.assertIn("BACKWARD PASS\n", table)
        with tempfile.TemporaryDirectory() as d:
            step.log_comm_debug_tracing_table_to_file(os.path.join(d, "t.txt"), noise_level=1)
            with open(os.path.join(d, "t.txt")) as f:
                self.assertEqual(f.read(), table)
            step.generate_json_dump(os.path.join(d, "d.json"))
            with open(os.path.join(d, "d.json")) as f:
                j = json.load(f)
            self.assertEqual(j["Net.blocks.0"]["backward"], {"c10d.all_reduce": 1})
            self.assertEqual(j["Global"]["sharding_info"], {"Net.blocks.0.weight": "(Shard(dim=0),)"})

    def test_a_dump_of_several_processes_needs_a_pid_and_bad_input_says_what_to_do(self):
        other = dict(PROC, process={"pid": 8}, comm_counts={"c10d.all_reduce": 5})
        both = {"processes": [PROC, other]}
        with self.assertRaisesRegex(commdbg.CommdbgError, r"holds processes \[7, 8\]: pass pid="):
            commdbg.load(both)
        self.assertEqual(commdbg.load(both, pid=8).get_comm_counts()["all_reduce"], 5)
        with self.assertRaisesRegex(commdbg.CommdbgError, "cannot read the dump .*commdbg run/attach --json"):
            commdbg.load("/nonexistent/out.json")
        with self.assertRaisesRegex(commdbg.CommdbgError, "not a commdbg dump"):
            commdbg.load({"hello": 1})
        with self.assertRaisesRegex(commdbg.CommdbgError, "is it running"):
            commdbg.Daemon("/nonexistent/commdbgd.sock").status()

    def test_pip_installs_it(self):
        with tempfile.TemporaryDirectory() as d:
            src = shutil.copytree(SOURCE, os.path.join(d, "src"))
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                                "--target", os.path.join(d, "site"), src], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = subprocess.run([sys.executable, "-c", "import commdbg; print(commdbg.__file__, commdbg.__version__)"],
                               capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.path.join(d, "site")),
                               cwd=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(os.path.join(d, "site", "commdbg")), r.stdout)


if __name__ == "__main__":
    unittest.main()
