"""The history's event schema: every kind of event a run records, with its fields and meaning.

How this works
--------------
A history (gpujail/world/history.py) is JSON lines; each line is one event: the envelope the
writer adds (`t` CLOCK_MONOTONIC seconds, `node` the node id or "host", `pid`, `kind`) and the
fields its emitter passes. `KINDS` below is the one table of every kind: who emits it, its fields
(`name:type`, a trailing `?` for optional, `a|b` for either type) and one line of meaning. The
checker (chaos/checker.py) and the timeline read only what is listed here. An event is written
after what it reports; where that can hurt another node (a removal), `began` is the time just
before the system call, so the act falls in [`began`, `t`].

Validation is a self-test tool, off in production runs (a worker start writes dozens of events,
and the fake CLI starts once per worker start): with `GPUJAIL_VALIDATE_HISTORY=1` in the
environment, the writer checks every event and raises `EventError`, which names the kind, the
field, what was expected and found, and the emitting source line. It still writes the bad event
first: where the raising process's failure is swallowed (a worker restarted after its CLI died),
the history keeps the evidence for `validate_history`. The self-tests
turn it on for their whole session (tests/conftest.py), and the kernel backend passes it on to the
implementations and fake CLIs it starts. `validate_history` checks a saved history after the fact
(envelope included) and returns every problem instead of raising.

Adding a kind: one `_kind(...)` line here, in the emitter's section; tests/test_events.py then
checks that every `history.record`/`log` call in the code names a listed kind.
"""
from __future__ import annotations

VALIDATE_ENV = "GPUJAIL_VALIDATE_HISTORY"
ENVELOPE = "t:num node:str pid:int kind:str"


class EventError(ValueError):
    """An event that does not match the schema: which kind, which field, where it was emitted."""

    def __init__(self, kind: str, field: str | None, problem: str, where: str = ""):
        self.kind, self.field, self.problem, self.where = kind, field, problem, where
        what = f"event {kind!r}" + (f", field {field!r}" if field else "")
        super().__init__(f"{what}: {problem}" + (f" (emitted at {where})" if where else ""))


# name -> Python types accepted (bool is never an int here: `True` is not a count)
TYPES = {"str": (str,), "int": (int,), "num": (int, float), "bool": (bool,), "list": (list, tuple),
         "dict": (dict,), "null": (type(None),)}


class Field:
    __slots__ = ("name", "types", "type_text", "required")

    def __init__(self, spec: str):
        name, _, type_text = spec.partition(":")
        self.required = not type_text.endswith("?")
        self.type_text = type_text.rstrip("?")
        self.name = name
        self.types = tuple(t for part in self.type_text.split("|") for t in TYPES[part])

    def __str__(self) -> str:
        return f"{self.name}:{self.type_text}{'' if self.required else '?'}"

    def accepts(self, value) -> bool:
        if isinstance(value, bool) and bool not in self.types:
            return False
        return isinstance(value, self.types)


class Kind:
    __slots__ = ("name", "emitter", "fields", "meaning", "items")

    def __init__(self, name: str, emitter: str, fields: str, meaning: str, items: dict | None = None):
        self.name, self.emitter, self.meaning = name, emitter, meaning
        self.fields = {f.name: f for f in map(Field, fields.split())}
        self.items = items or {}       # field name -> schema of each item of that list

    def __repr__(self) -> str:
        return f"Kind({self.name!r}: {' '.join(map(str, self.fields.values()))})"


KINDS: dict[str, Kind] = {}


def _kind(name: str, emitter: str, fields: str, meaning: str, **items: str) -> None:
    assert name not in KINDS, name
    KINDS[name] = Kind(name, emitter, fields, meaning, {k: Kind(f"{name}.{k}[]", emitter, v, "") for k, v in items.items()})


# -- the harness: workers and their restarts (node = the worker) ----------------------------------
_kind("worker.start", "gpujail/contract.py", "impl:str attempt:int",
      "the harness starts attempt N (0 = first) of a worker's implementation on a fresh node")
_kind("worker.restart", "gpujail/contract.py", "attempt:int",
      "the worker's last attempt failed; attempt N follows after the restart policy's delay")
_kind("worker.ready", "gpujail/contract.py", "attempt:int",
      "the implementation exited 0: the worker reports ready (a ready span starts, SPEC INV-1)")
_kind("worker.exit", "gpujail/contract.py", "code:int|str error:str|null",
      "the attempt failed: the implementation's exit code (or \"killed\") and its last stderr line")

# -- the chaos runner (node = "host") ------------------------------------------------------------
_kind("chaos.begin", "chaos/runner.py",
      "scenario:str impl:str impls:dict? seed:int schedule:dict versions:dict? windows:list?",
      "a chaos run starts: the scenario, the implementation (`impls`: workers running another), the seed, "
      "each worker's failpoints, "
      "driver version and the fault windows the scenario must open")
_kind("chaos.ldconfig", "chaos/nemesis.py", "view:str code:int|str",
      "the ldconfig nemesis ran `ldconfig -r` on the jail from a node that sees none of the mounts "
      "(view blind) or its own driver's (view gpu)")
_kind("chaos.fault", "chaos/runner.py", "worker:str failpoint:str term:str start:int?",
      "one failpoint armed for a worker's first start (or its `start`-th; the nemesis's plan, not yet its effect)")
_kind("jailfs.fault", "gpujail/backends/jailfs_fleet.py", "fault:str worker:str pids:list began:num? barrier:str? held:list?",
      "a fault only a network jail has began: the brick killed, latency on every brick operation, or a "
      "node's client killed under it (`pids`: the processes killed; `began`: when the harness started "
      "it, on the history's clock, before the event was written once it was done; `barrier`, `held`: "
      "a fault placed at a step, the barrier that opens now and the workers paused there)")
_kind("jailfs.clear", "gpujail/backends/jailfs_fleet.py", "fault:str worker:str",
      "that fault clears: the brick restarted, the latency removed (a lost client stays lost for its node)")
_kind("chaos.kill", "chaos/nemesis.py", "worker:str barrier:str",
      "the runner SIGKILLs a worker's node at a barrier (no cleanup runs)")
_kind("chaos.lock_fault", "chaos/nemesis.py", "fault:str lock:str barrier:str holder:str existed:bool",
      "the runner took a jail lock file from under its holder, who keeps running (`holder`: who arrived at "
      "`barrier`): removed, or replaced by a new file (`fault`); its flock stays on the old inode, so the next "
      "node to open the path locks another (a lost NFS lease, a cleanup job, an image sync)")
_kind("chaos.link", "chaos/nemesis.py", "path:str target:str barrier:str arrived:str moved:str",
      "the runner swapped a symlink in at jail path `path` (to `target`, \"@OUTSIDE\": a directory outside the "
      "jail) during the run, when `arrived` reached `barrier`; `moved`: where what was there went (\"\": nothing)")
_kind("chaos.upgrade", "chaos/nemesis.py", "worker:str version:str old:str barrier:str paths:list",
      "the runner upgraded `worker`'s host driver from `old` to `version` when it reached `barrier`, in that "
      "node's copy-on-write view of the host (old files removed, new ones installed); `paths`: what that "
      "changed outside the jail, as the node resolves them (the harness's writes, not the start's)")
_kind("chaos.release", "chaos/nemesis.py", "barrier:str arrived:list stalled:bool?",
      "a barrier opens; `arrived` are the workers that were waiting at it (`stalled`: opened because "
      "every started worker was paused, the first of the scenario's barriers)")
_kind("sched.begin", "gpujail/world/schedule.py",
      "strategy:str seed:int workers:list as:str depth:int? k:int? changes:list? priorities:dict?",
      "a run under --schedule starts its scheduler: the strategy (random-walk, pct:..., mixed), the seed, the "
      "workers scheduled, the strategy this seed runs (`as`: random-walk or pct; they differ for mixed); for pct "
      "its depth d, k, the change points and each worker's initial priority")
_kind("sched.step", "gpujail/world/schedule.py",
      "step:int worker:str failpoint:str hit:int path:str waiting:list blocked:list",
      "the scheduler lets `worker` go at its `hit`-th hit of `failpoint` (at `path`, jail-relative), chosen among "
      "the workers `waiting` at a scheduling point; `blocked`: the live workers that were not (blocked in the "
      "kernel: a lock wait, a sleep, a barrier); the history's order of these is the order of the decisions")
_kind("chaos.end", "chaos/runner.py", "",
      "every worker finished; the last probe round is done")

# -- the node agent (gpujail/backends/node.py and its node_*.py): one per node -----------------------
_kind("node.up", "gpujail/backends/node.py", "",
      "a node's namespaces and /dev view are set up; its agent takes requests")
_kind("impl.start", "gpujail/backends/node_starts.py", "argv:list",
      "the node starts a command (an implementation, seen from outside)")
_kind("impl.exit", "gpujail/backends/node_starts.py", "code:int|str duration:num? stderr:str? error:str?",
      "that command ended: exit code (or \"timeout\"), or `error` when it could not be started")
_kind("impl.outside", "gpujail/backends/node_starts.py", "changes:list",
      "what that command did outside the jail, seen through the node's copy-on-write view of the host "
      "(cow.py): never done to the host, and a REF-11 / INV-3 violation",
      changes="path:str change:str mode:int")
_kind("probe", "gpujail/backends/node_probes.py", "results:list asked:list? began:num?",
      "what a GPU job on the node sees at each driver file: attached, size, same bytes, loader; for a "
      "soname looked up through the jail's linker cache, also `lookup` and what it `resolved` to; `asked`: "
      "every file the round was asked about (a round that leaves one out is short); `began`: when the "
      "round began, on the history's clock (the event is written when it ends)",
      results="path:str attached:bool size:int|null same_bytes:bool? error:str? loader:str? driver:str? "
              "lookup:str? resolved:str?")

# -- failpoints (gpujail/world/failpoints.py), in any process that evaluates one --------------------
_kind("failpoint", "gpujail/world/failpoints.py",
      "name:str hit:int action:str arg:str|null path:str? count:int?",
      "failpoint `name` evaluated for the hit-th time; `action` is what it did (\"off\": nothing)")

# -- the fake nvidia-container-cli (fixtures/fake_cli.py, cli_configure.py, cli_mount.py) ---------
_kind("cli.start", "fixtures/cli_configure.py", "argv:list rootfs:str", "a `configure` starts on `rootfs`")
_kind("cli.mkdir", "fixtures/cli_mount.py", "path:str", "it created a missing parent directory")
_kind("cli.create", "fixtures/cli_mount.py", "path:str mode:str",
      "it created a mount target (a 0-byte placeholder, or a directory) with st_mode `mode` (octal)")
_kind("cli.mount", "fixtures/cli_mount.py", "src:str dst:str", "it bind-mounted a host file over a target")
_kind("cli.fail", "fixtures/cli_mount.py", "error:str mounted:int",
      "a mount batch failed after `mounted` mounts; its cleanup follows")
_kind("cli.cleanup.umount", "fixtures/cli_mount.py", "path:str", "cleanup unmounted a target of the failed batch")
_kind("cli.cleanup.unlink", "fixtures/cli_mount.py", "path:str size:int? why:str? began:num?",
      "cleanup unlinked a 0-byte file (`size`) or a symlink to nothing (`why`): another node's mount dies")
_kind("cli.cleanup.keep", "fixtures/cli_mount.py", "path:str size:int? why:str?",
      "cleanup left a target in place (non-empty; or, own-cleanup variant, not created by this run)")
_kind("cli.setns", "fixtures/cli_configure.py", "path:str",
      "configure entered the container process's mount namespace (`ROOTFS/proc/<ppid>/ns/mnt` standalone)")
_kind("cli.ldconfig", "fixtures/cli_configure.py", "argv:list", "configure runs ldconfig on the rootfs (SPEC CLI-7)")
_kind("cli.exit", "fixtures/fake_cli.py fixtures/cli_configure.py", "code:int error:str?",
      "the CLI exits (with its error line on failure)")

# -- the fake NVIDIA Container Toolkit (fixtures/fake_ctk.py, fixtures/fake_cdi_hook.py) --------------
_kind("cdi.generate", "fixtures/fake_ctk.py", "devices:int mounts:int hooks:int format:str",
      "`nvidia-ctk cdi generate` wrote a spec: its devices, common mounts and hooks (SPEC CDI-1)")
_kind("cdi.hook", "fixtures/fake_cdi_hook.py", "hook:str root:str argv:list",
      "an `nvidia-cdi-hook` hook starts on the container root `root`")
_kind("cdi.symlink", "fixtures/fake_cdi_hook.py", "path:str target:str replaced:str began:num?",
      "create-symlinks renamed a link to `target` over `path` (root-relative), replacing `replaced` (CDI-3)")
_kind("cdi.symlink.kept", "fixtures/fake_cdi_hook.py", "path:str target:str",
      "create-symlinks found `path` already a link to `target` and left it")
_kind("cdi.ldconfig", "fixtures/fake_cdi_hook.py", "argv:list conf:list folders:list",
      "update-ldcache, pivoted into the root, created the drop-ins `conf` and execs ldconfig (CDI-4)")
_kind("cdi.hook.exit", "fixtures/fake_cdi_hook.py", "hook:str code:int error:str?", "the hook exits")
_kind("impl.cdi.target", "reference_impl/cdi.py", "path:str what:str",
      "cdi-naive, as a runtime, created a missing mount target (`file`: 0-byte, `dir`: MkdirAll; CDI-2)")
_kind("impl.cdi.hook", "reference_impl/cdi.py", "argv:list code:int",
      "cdi-naive ran one createContainer hook of the spec")

# -- the syscall-fault wrapper (fixtures/syscall_faults.py): strace --inject on the CLI ----------
_kind("cli.syscall_fault", "fixtures/syscall_faults.py", "syscall:str hit:int action:str arg:str|null cli_pid:int",
      "strace injected a fault into the CLI (as strace's own output marks it): the hit-th `syscall` of "
      "process `cli_pid` failed with errno `arg` (return), was delayed `arg` ms (sleep), was killed "
      "(kill), or stopped after the call until barrier `arg` opened (pause)")

# -- the bundled implementations (reference_impl/), instrumented ----------------------------------
_kind("impl.begin", "reference_impl/__main__.py", "impl:str role:str action:str",
      "an instrumented implementation starts its step (start or populate-cleanup) for a role")
_kind("impl.ready", "reference_impl/__main__.py", "impl:str role:str action:str", "that step succeeded")
_kind("impl.fatal", "reference_impl/__main__.py", "impl:str failure:str code:int error:str",
      "that step failed: the kind of failure, its exit code (CONTRACT.md) and its one-line error")
_kind("impl.placeholders", "reference_impl/core.py", "total:int missing:int",
      "the warm-path check: of `total` targets, `missing` do not exist yet (0: warm start, INV-4)")
_kind("impl.lock.wait", "reference_impl/host.py", "lock:str", "it waits for a jail lock (jail-relative path)")
_kind("impl.lock.acquired", "reference_impl/host.py reference_impl/mutants.py", "lock:str waited:num",
      "it holds the lock, after `waited` seconds")
_kind("impl.lock.timeout", "reference_impl/host.py", "lock:str timeout:num", "it gave up waiting after `timeout` seconds")
_kind("impl.lock.released", "reference_impl/host.py", "lock:str", "it released the lock")
_kind("impl.marker", "reference_impl/core.py", "path:str mode:str in_place:bool?",
      "it created a marker placeholder (non-empty, < 64 bytes, REF-5) with the host file's mode "
      "(in_place: written into an old 0-byte placeholder, REF-3)")
_kind("impl.marker.exists", "reference_impl/core.py", "path:str",
      "its exclusive create of a marker met an existing target (a lock that did not serialise it with "
      "the creator, REF-5): it re-checks that target instead of failing")
_kind("impl.mount", "reference_impl/reference.py reference_impl/direct.py", "src:str dst:str",
      "the implementation bind-mounted a host file itself (`direct`: every file; `reference`: its sonames, REF-12)")
_kind("impl.verified", "reference_impl/core.py", "mounts:int", "the CLI's mounts are verified (REF-7)")
_kind("impl.ldconfig", "reference_impl/core.py", "code:int", "it ran `ldconfig -r` on the jail (REF-8)")
_kind("impl.populate_cleanup", "reference_impl/core.py", "removed:list began:num?",
      "the populate-jail job removed these placeholders (jail-relative) and the flag")
_kind("impl.dummy_mounts", "reference_impl/core.py", "mounted:list reason:str?",
      "a CPU worker mounted the dummy library over these placeholders (none: `reason`)")
_kind("impl.mutant.unlink", "reference_impl/mutants.py reference_impl/mutant_sys.py", "path:str began:num?",
      "a mutant unlinked a placeholder it should not have")


def _check(kind: Kind, fields: dict, where: str, label: str) -> None:
    for name, value in fields.items():
        f = kind.fields.get(name)
        if f is None:
            known = " ".join(kind.fields) or "none"
            raise EventError(label, name, f"unexpected field (fields of {kind.name}: {known})", where)
        if not f.accepts(value):
            raise EventError(label, name, f"expected {f.type_text}, found {type(value).__name__} {value!r:.80}", where)
        if name in kind.items:
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise EventError(label, f"{name}[{i}]", f"expected an object, found {item!r:.80}", where)
                _check(kind.items[name], item, where, label)
    for name, f in kind.fields.items():
        if f.required and name not in fields:
            raise EventError(label, name, f"missing (required: {f.type_text})", where)


def validate(kind: str, fields: dict, where: str = "") -> None:
    """Raise EventError unless `fields` (without the envelope) make a valid `kind` event."""
    spec = KINDS.get(kind)
    if spec is None:
        raise EventError(kind, None, "unknown kind (gpujail/world/events.py lists every kind)", where)
    _check(spec, fields, where, kind)


_ENVELOPE = {f.name: f for f in map(Field, ENVELOPE.split())}


def validate_event(event: dict, where: str = "") -> None:
    """Raise EventError unless `event` (as written: envelope and fields) is valid."""
    kind = event.get("kind")
    for name, f in _ENVELOPE.items():
        if name not in event or not f.accepts(event[name]):
            raise EventError(str(kind), name, f"envelope field missing or not {f.type_text}: {event.get(name)!r:.80}", where)
    validate(kind, {k: v for k, v in event.items() if k not in _ENVELOPE}, where)


def validate_history(events: list[dict]) -> list[str]:
    """Every problem of a loaded history, one line each (`event 12: ...`); [] when it is valid."""
    problems = []
    for i, event in enumerate(events):
        try:
            validate_event(event)
        except EventError as e:
            problems.append(f"event {i} (t={event.get('t')}): {e}")
    return problems


def table() -> str:
    """The schema as a Markdown table (docs, `gpujail` help)."""
    rows = ["| kind | fields | emitted by | meaning |", "|---|---|---|---|"]
    for k in KINDS.values():
        fields = " ".join(f"`{f}`" for f in k.fields.values())
        rows.append(f"| `{k.name}` | {fields} | {k.emitter} | {k.meaning} |")
    return "\n".join(rows)
