# SPDX-License-Identifier: Apache-2.0
"""CommDebugMode's query API over what commdbg saw from outside the process.

A script written against torch's ``CommDebugMode`` asks the same questions of
``commdbg.load(dump)``: ``get_comm_counts()``, ``get_total_counts()``,
``get_comm_module_counts()`` (and torch 2.6's ``comm_module_counts``), ``get_parameter_info()``, ``get_sharding_info()``,
``generate_comm_debug_tracing_table()``, ``log_comm_debug_tracing_table_to_file()``,
``generate_json_dump()``; plus ``get_dropped_record_count()`` and ``fsdp()``.
``Daemon`` talks to commdbgd's control socket. Standard library only.

Counts are keyed by collective kind ("all_reduce"); a lookup takes torch's op
objects as CommDebugMode keys them (``c10d_functional.all_reduce``,
``c10d.allreduce_``), their names, or the kind itself. Module paths are
CommDebugMode's: the root module's class name, then the path below it, and
"Global" for every collective. ``scope=NAME`` keeps what ran inside
``record_function(NAME)`` scopes, where a job would open its CommDebugMode.
"""

import json
import os
import socket

__all__ = ["load", "CommDump", "CommCounts", "ParamInfo", "Daemon", "collective_of", "CommdbgError"]
__version__ = "0.1.0"

# The kinds under the names torch gives them (the last part of an op's name,
# without leading / trailing underscores and the suffixes below).
_KINDS = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all",
          "all_to_all_single": "all_to_all", "reducescatter": "reduce_scatter"}
_SUFFIXES = ("_coalesced", "_into_tensor", "_tensor", "_base", "_single")
_SIDES = ("forward", "backward")


class CommdbgError(Exception):
    """A dump or a daemon reply commdbg cannot use; the message says why."""


def collective_of(op):
    """The collective kind an op (object or name) or a commdbg key names:
    ``c10d_functional.all_gather_into_tensor`` -> ``all_gather``."""
    name = (op if isinstance(op, str) else str(op)).rsplit(".", 1)[-1].strip("_")
    if name in _KINDS:
        return _KINDS[name]
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return _KINDS.get(name, name)


class CommCounts(dict):
    """{kind: count}; looked up by kind, op object or op name alike."""

    def __getitem__(self, key):
        return dict.__getitem__(self, collective_of(key))

    def __contains__(self, key):
        return dict.__contains__(self, collective_of(key))

    def get(self, key, default=None):
        return dict.get(self, collective_of(key), default)

    def add(self, kind, n=1):
        dict.__setitem__(self, kind, dict.get(self, kind, 0) + n)


class ParamInfo(dict):
    """A parameter as commdbg read it: ``shape`` (global), ``local_shape``
    (its shard), ``dtype`` ("float32"), ``is_dtensor``; also a dict."""

    @property
    def shape(self):
        return tuple(self.get("shape") or ())

    @property
    def local_shape(self):
        return tuple(self.get("local_shape") or self.get("shape") or ())

    @property
    def dtype(self):
        return self.get("dtype")

    @property
    def is_dtensor(self):
        return bool(self.get("is_dtensor", False))


def _read(src):
    if isinstance(src, dict):
        return src
    try:
        if hasattr(src, "read"):
            return json.load(src)
        with open(os.fspath(src), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CommdbgError(f"cannot read the dump {src!r}: {e} — pass the file `commdbg run/attach --json` wrote") from e


def load(src, pid=None, scope=None):
    """The dump of one process (a path, a file or the parsed JSON).  A dump of
    several processes needs ``pid``; ``scope`` keeps what ran inside
    ``record_function(scope)`` scopes only (the window CommDebugMode would see)."""
    dump = _read(src)
    procs = dump.get("processes") if isinstance(dump, dict) else None
    if procs is None:
        return CommDump(dump, scope)
    pids = [p.get("process", {}).get("pid") for p in procs]
    if pid is None and len(procs) == 1:
        return CommDump(procs[0], scope)
    for p, proc_pid in zip(procs, pids):
        if pid is not None and proc_pid == pid:
            return CommDump(p, scope)
    raise CommdbgError(f"the dump holds processes {pids}: pass pid= one of them")


class CommDump:
    """One process's dump, asked as CommDebugMode is asked."""

    def __init__(self, proc, scope=None):
        if not isinstance(proc, dict) or "records" not in proc and "comm_counts" not in proc:
            raise CommdbgError("not a commdbg dump: no 'records' and no 'comm_counts'")
        self.dump = proc
        self.scope = scope
        self.root = self._root_class(proc.get("records", []))
        counts = proc.get("comm_counts", {})
        # CommDebugMode counts what torch dispatches: c10d's collectives; a
        # process that only calls NCCL is counted at NCCL's.
        self.layer = "c10d" if any(k.startswith("c10d.") for k in counts) else "nccl"
        self._comm = CommCounts()
        self._modules = {}
        self._module_class = {}
        self._walk(proc.get("records", []), [], scope is None)

    # ---- what CommDebugMode answers ------------------------------------
    def get_comm_counts(self):
        if self.scope is None and self.dump.get("comm_counts"):
            # Exact kernel counters, whatever records were dropped.
            out = CommCounts()
            for key, n in self.dump["comm_counts"].items():
                layer, _, kind = key.partition(".")
                if layer == self.layer:
                    out.add(kind, n)
            return out
        return CommCounts(self._comm)

    def get_total_counts(self):
        return sum(self.get_comm_counts().values())

    def get_comm_module_counts(self):
        return {fqn: {**({"module_type": self._module_class[fqn]} if fqn in self._module_class else {}),
                      **{side: CommCounts(sides[side]) for side in _SIDES}}
                for fqn, sides in self._modules.items()}

    @property
    def comm_module_counts(self):
        """torch 2.6's CommDebugMode has this attribute and no getter."""
        return self.get_comm_module_counts()

    def get_parameter_info(self):
        return {self._path(fqn): {name: ParamInfo(info) for name, info in params.items()}
                for fqn, params in self.dump.get("parameter_info", {}).items()}

    def get_sharding_info(self):
        out = {}
        for key, placements in self.dump.get("sharding_info", {}).items():
            if key.startswith("<root>."):
                key = key[len("<root>."):]
            out[f"{self.root}.{key}" if self.root else key] = placements
        return out

    def get_dropped_record_count(self):
        return int(self.dump.get("dropped_records", 0))

    def fsdp(self):
        """The FSDP lifecycle verdicts and their trace evidence ("fsdp")."""
        return self.dump.get("fsdp", {})

    def generate_comm_debug_tracing_table(self, noise_level=3):
        lines = []
        for fqn, sides in self.get_comm_module_counts().items():
            depth = 0 if fqn == "Global" else fqn.count(".") + 1
            pad = "  " * depth
            lines.append(pad + fqn)
            if noise_level > 0 and "module_type" in sides:
                lines.append(f"{pad}  *module type: {sides['module_type']}")
            for side in _SIDES:
                if not sides[side]:
                    continue
                lines.append(f"{pad}  {side.upper()} PASS")
                for kind, n in sorted(sides[side].items()):
                    lines.append(f"{pad}    *{self.layer}.{kind}: {n}")
        return "\n".join(lines) + "\n"

    def log_comm_debug_tracing_table_to_file(self, file_name="comm_mode_log.txt", noise_level=3):
        with open(file_name, "w", encoding="utf-8") as f:
            f.write(self.generate_comm_debug_tracing_table(noise_level))

    def generate_json_dump(self, file_name="comm_mode_log.json", noise_level=3):
        out = {fqn: {side: {f"{self.layer}.{k}": n for k, n in v.items()} if side in _SIDES else v
                     for side, v in sides.items()}
               for fqn, sides in self.get_comm_module_counts().items()}
        if noise_level > 0:
            out["Global"]["parameter_info"] = {fqn: {name: dict(p) for name, p in params.items()}
                                               for fqn, params in self.get_parameter_info().items()}
            out["Global"]["sharding_info"] = self.get_sharding_info()
        with open(file_name, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)

    # ---- the record tree ---------------------------------------------------
    @staticmethod
    def _root_class(records):
        stack = list(records)
        while stack:
            r = stack.pop()
            if r.get("type") == "module" and r.get("module_fqn") == "<root>" and r.get("module_class"):
                return r["module_class"]
            stack.extend(r.get("children", []))
        return ""

    def _path(self, fqn):
        if not self.root:
            return fqn
        return self.root if fqn == "<root>" else f"{self.root}.{fqn}"

    def _count(self, fqn, side, kind):
        sides = self._modules.setdefault(fqn, {s: CommCounts() for s in _SIDES})
        sides[side].add(kind)

    def _walk(self, records, modules, inside):
        for r in records:
            kind = r.get("type")
            if kind == "collective":
                # The outermost collective of a nest counts, once.
                if inside and r.get("layer", self.layer) == self.layer:
                    self._count_collective(r, modules)
                continue
            now_inside = inside or (kind == "scope" and r.get("name") == self.scope)
            below = modules
            if kind == "module" and r.get("module_fqn"):
                side = "backward" if r.get("event_type") in ("backward", "checkpointing") else "forward"
                path = self._path(r["module_fqn"])
                self._module_class.setdefault(path, r.get("module_class", ""))
                below = modules + [(path, side)]
            self._walk(r.get("children", []), below, now_inside)

    def _count_collective(self, r, modules):
        kind = r.get("collective_type") or collective_of(r.get("collective", r.get("name", "")))
        self._comm.add(kind)
        global_side = "backward" if any(side == "backward" for _, side in modules) else "forward"
        self._count("Global", global_side, kind)
        for fqn, side in dict.fromkeys(modules):
            self._count(fqn, side, kind)


class Daemon:
    """commdbgd's control socket (``commdbg status/counts/attach`` speak it)."""

    def __init__(self, path=None, timeout=None):
        self.path = path or os.environ.get("COMMDBG_SOCKET", "/run/commdbg/commdbgd.sock")
        self.timeout = timeout

    def _connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError as e:
            s.close()
            raise CommdbgError(f"commdbgd at {self.path}: {e.strerror or e} — is it running "
                               "(systemctl status commdbgd)? Another socket: Daemon(path=...)") from e
        return s

    @staticmethod
    def _line(f):
        line = f.readline()
        if not line:
            raise CommdbgError("commdbgd closed the connection")
        reply = json.loads(line)
        if not reply.get("ok", False):
            raise CommdbgError(reply.get("error", "commdbgd refused the request"))
        return reply

    def call(self, request):
        with self._connect() as s, s.makefile("rb") as f:
            s.sendall((json.dumps(request) + "\n").encode())
            return self._line(f)

    def status(self):
        return self.call({"op": "status"})

    def counts(self, pid=None, by_comm=False, flight=False):
        req = {"op": "counts", "by_comm": bool(by_comm or flight), "flight": bool(flight)}
        if pid is not None:
            req["pid"] = int(pid)
        return self.call(req)

    def attach(self, pid, duration, scope=None, **options):
        """Traces `pid` for `duration` seconds inside commdbgd; its dump, as load() gives it."""
        req = {"op": "attach", "pid": int(pid), "duration_s": float(duration), "outputs": ["json"], **options}
        with self._connect() as s, s.makefile("rb") as f:
            s.sendall((json.dumps(req) + "\n").encode())
            self._line(f)  # the session started
            done = self._line(f)
            parts = {p["name"]: f.read(p["bytes"]) for p in done.get("payload", [])}
        if "json" not in parts:
            raise CommdbgError(f"commdbgd sent no JSON dump for pid {pid}: {done.get('messages', [])}")
        return load(json.loads(parts["json"]), pid=int(pid), scope=scope)
