"""The oracle kill matrix (issue 30, item 4): mutants of what judges the implementations.

How this works
--------------
The oracle is the chaos checker (chaos/checker.py, chaos/checkers/: INV-1..6, the evidence rules of
SPEC section 6 "What a PASS means", the fault windows), the probes that feed it
(gpujail/backends/probes.py, `op_probe` in gpujail/backends/node_probes.py) and the gate that turns its
verdicts into an exit code. A mutant is one realistic mistake in it, written as a *wrapper of the
real function* (or a changed constant), never as a copy of its code: the mutant follows the code as
it changes, and a target that no longer exists is an error naming the mutant (`MutantError`), not a
mutant that silently stops mutating.

`apply(name, monkeypatch)` puts a mutant in place through a `pytest.MonkeyPatch` (so `undo()` takes
it away). A function is replaced wherever it is bound: in its own module, in every module that
imported it by name (`from .content import ready_spans`) and in the registries holding it
(`checker.CHECKERS`, `checkers.BUILTIN`, `windows.WINDOWS`, `node.OPS`); a constant, or a mutant
marked `here`, only in the target's module.

Run as a pytest plugin (`-p oracle_mutants`, with tests/ on PYTHONPATH), this module applies the
mutant named by GPUJAIL_ORACLE_MUTANT at configure time, before any test module is imported, and
writes the ids of the tests that failed to the file GPUJAIL_ORACLE_MUTANT_REPORT. Without the
variable it does nothing. Run as a program (scripts/oracle-killmatrix), it runs the oracle's
self-tests once without a mutant (the baseline: a test that already fails there kills nothing),
then once per mutant, and prints the matrix: which tests kill which mutant. Exit 0 when every mutant
is killed, 1 when one survives, 2 when one cannot be applied or the arguments are bad.

Only this process is mutated: code that runs in a subprocess (a `gpujail reproduce` a test starts,
a kernel node's probe server) runs unmutated, so the self-tests that kill a mutant of the probes
call `node_probes.op_probe` in-process.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "GPUJAIL_ORACLE_MUTANT"
REPORT_ENV = "GPUJAIL_ORACLE_MUTANT_REPORT"
REPO = Path(__file__).resolve().parents[1]

# The oracle's self-tests: what each mutant is run against (pure, or cheap kernel runs; about 5 s).
# Not tests/test_reproduce_windows.py: it judges in a `gpujail reproduce` subprocess, which no mutant
# reaches, so it can kill none (under load it only added false kills, when its two starts missed).
SELF_TESTS = ["tests/test_checker.py", "tests/test_evidence.py", "tests/test_timeline.py", "tests/test_lookup_probes.py",
              "tests/test_jailfs.py::test_k2_chain_names_the_remote_unlink_and_the_lookup_that_detached",
              "tests/test_oracle_holes.py"]


class MutantError(Exception):
    """A mutant that cannot be applied: unknown, or its target is gone from the code."""


@dataclass(frozen=True)
class Mutant:
    name: str
    target: str                      # "package.module:attribute" or "package.module:Class.attribute"
    mistake: str                     # the mistake, as a reviewer would say it
    cites: str                       # the SPEC IDs whose check it breaks
    make: Callable                   # the original -> the mutated replacement
    here: bool = False               # rebind in the target's module only (constants, one module's view)
    group: str = "oracle"            # which self-tests judge it (GROUPS)


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, target: str, mistake: str, cites: str, here: bool = False, group: str = "oracle"):
    """Register `make(original) -> replacement` as mutant `name`."""
    def add(make: Callable) -> Callable:
        MUTANTS[name] = Mutant(name, target, mistake, cites, make, here, group)
        return make
    return add


def _wrap(original: Callable, mutated: Callable) -> Callable:
    return functools.wraps(original)(mutated)


def _without(run, *kinds: str):
    """The same run with the events of `kinds` left out (a checker that never reads them)."""
    from gpujail.chaos.checkers.queries import Run
    return Run([e for e in run.events if e.get("kind") not in kinds], run.final)


# -- the catalogue: the probes -------------------------------------------------------------------

@mutant("probe-drops-a-file", "gpujail.backends.node_probes:op_probe",
        "a probe round silently leaves out one of the files it was asked about (an off-by-one)", "SPEC 6, INV-1")
def _(op_probe):
    return _wrap(op_probe, lambda req: op_probe({**req, "files": req["files"][:-1]}))


@mutant("unanswered-looks-clean", "gpujail.backends.probes:unanswered",
        "a file the probe could not clear (it crashed or timed out) is recorded as present: 0 bytes read, "
        "attached", "SPEC 6, INV-1, INV-5")
def _(unanswered):
    return _wrap(unanswered, lambda requests, why: [{**r, "attached": True, "size": 0} for r in unanswered(requests, why)])


@mutant("probe-skips-byte-compare", "gpujail.backends.node_probes:probe_one",
        "the probe never compares the file with the host's: a marker or another driver's file passes where "
        "no loader runs (firmware, binaries)", "INV-1, INV-5, REF-7")
def _(probe_one):
    def mutated(*args, **kwargs):
        res = probe_one(*args, **kwargs)
        res.pop("same_bytes", None)
        return res
    return _wrap(probe_one, mutated)


# -- the catalogue: what a probe result means ----------------------------------------------------

@mutant("no-result-is-clean", "gpujail.chaos.checkers.queries:is_bad",
        "a crashed or timed-out probe counts as clean for the files it did not clear", "SPEC 6, INV-1, INV-5")
def _(is_bad):
    from gpujail.backends.probes import NO_RESULT
    return _wrap(is_bad, lambda r: False if str(r.get("error") or "").startswith(NO_RESULT) else is_bad(r))


@mutant("placeholder-content-accepted", "gpujail.chaos.checkers.queries:is_bad",
        "an attached mount with placeholder-sized content that is not the host file passes (bytes never compared)",
        "INV-1, INV-5, REF-7, K-3")
def _(is_bad):
    return _wrap(is_bad, lambda r: is_bad({k: v for k, v in r.items() if k != "same_bytes"}))


@mutant("loader-ignored", "gpujail.chaos.checkers.queries:is_bad",
        "a library the real loader refuses passes when its bytes are the host's", "INV-1, K-3")
def _(is_bad):
    return _wrap(is_bad, lambda r: is_bad({k: v for k, v in r.items() if k != "loader"}))


@mutant("round-trusts-its-count", "gpujail.chaos.checkers.content:round_results",
        "a probe round is judged only on the results it returned: a short or empty round is clean",
        "SPEC 6, INV-1, INV-5")
def _(round_results):
    return _wrap(round_results, lambda probe, asked, run:
                 round_results(probe, asked, run)[:len(probe.get("results") or [])])


# -- the catalogue: ready spans and their evidence -----------------------------------------------

@mutant("other-span-counts-as-probed", "gpujail.chaos.checkers.content:evidence_gap",
        "a ready span no probe reached counts as probed because another span was", "SPEC 6, INV-1, INV-5")
def _(evidence_gap):
    return _wrap(evidence_gap, lambda run, node, ready, end, probes:
                 evidence_gap(run, node, ready, end, probes or run.of("probe")))


@mutant("disturbances-ignored", "gpujail.chaos.checkers.content:disturbances",
        "a span probed once is enough, even when a neighbour failed or was killed after its last probe",
        "SPEC 6, INV-1")
def _(disturbances):
    return _wrap(disturbances, lambda run, node, start, end: [])


@mutant("probe-counts-from-its-end", "gpujail.chaos.checkers.queries:probe_began",
        "a probe round counts from when it was written, not when it began: a round that looked at the files "
        "before a neighbour's cleanup (seconds earlier, under GlusterFS latency) is taken as evidence after it",
        "SPEC 6, INV-1")
def _(probe_began):
    return _wrap(probe_began, lambda probe: probe["t"])


@mutant("kill-keeps-the-span", "gpujail.chaos.checkers.content:SPAN_END",
        "a killed node's ready span does not end at the kill: it counts as ready (and losing files) until "
        "the end of the run", "SPEC 6, INV-1", here=True)
def _(span_end):
    return tuple(k for k in span_end if k != "chaos.kill")


@mutant("inv5-reported-as-inv1", "gpujail.chaos.checkers.content:check_content",
        "a file already bad at the first probe after readiness is reported as lost later (INV-1), so a "
        "dishonest ready passes INV-5", "INV-5")
def _(check_content):
    from gpujail.chaos.checkers.results import InvariantResult

    def mutated(run):
        inv1, inv5 = check_content(run)
        if inv5.valid is not False:
            return inv1, inv5
        moved = [dataclasses.replace(v, invariant="INV-1") for v in inv5.violations]
        return (InvariantResult("INV-1", False, inv1.note, inv1.violations + moved),
                InvariantResult("INV-5", True if inv1.valid is not False else inv1.valid, inv1.note))
    return _wrap(check_content, mutated)


@mutant("any-network-fault-excuses", "gpujail.chaos.checkers.queries:cut_off",
        "an ENOTCONN or EIO on any node is excused once any network fault happened in the run (another node's "
        "client, a brick that came back)", "INV-1, K-2")
def _(cut_off):
    return _wrap(cut_off, lambda run, node, since, probe: cut_off(run, node, since, probe)
                 or next(iter(run.of("jailfs.fault")), None))


@mutant("own-cleanup-is-the-cause", "gpujail.chaos.checkers.queries:removal_before",
        "a worker's own CLI cleanup is named as the cause of its loss (K-1: in its own namespace the unlink "
        "fails with EBUSY)", "INV-1, INV-5, K-1")
def _(removal_before):
    return _wrap(removal_before, lambda run, path, victim, t: removal_before(run, path, "", t))


# -- the catalogue: fault windows ----------------------------------------------------------------

@mutant("window-on-any-span", "gpujail.chaos.checkers.windows:ready_spans",
        "a fault window opens on any worker that was ever ready: a dead or retired node's span never ends",
        "SPEC 6", here=True)
def _(ready_spans):
    return _wrap(ready_spans, lambda run: [(node, ready, float("inf")) for node, ready, _ in ready_spans(run)])


@mutant("retiring-is-a-fault", "gpujail.chaos.checkers.windows:fault_kills",
        "the harness retiring the prewarm node (a kill at no barrier) counts as a fault kill", "SPEC 6")
def _(fault_kills):
    return _wrap(fault_kills, lambda run: list(run.of("chaos.kill")))


@mutant("broken-window-opens", "gpujail.chaos.checkers.windows:opened",
        "a window predicate that raises counts as opened", "SPEC 6")
def _(opened):
    from gpujail.chaos.checkers import windows

    def mutated(name, run):
        try:
            windows.WINDOWS[name][1](run)
        except Exception as e:   # noqa: BLE001 (the mistake: an error taken for the fault having happened)
            return True, f"window {name} raised {type(e).__name__}: {e}"
        return opened(name, run)
    return _wrap(opened, mutated)


# -- the catalogue: verdicts and the gate --------------------------------------------------------

def _passing(check_safe, when: Callable) -> Callable:
    """`check_safe` turning the UNKNOWN results for which `when(result)` holds into PASS."""
    def mutated(invariant, fn, run):
        result = check_safe(invariant, fn, run)
        if result.valid == "unknown" and when(result):
            result.valid = True
        return result
    return _wrap(check_safe, mutated)


@mutant("unknown-is-pass", "gpujail.chaos.checker:check_safe",
        "an invariant the run holds no evidence for (UNKNOWN) is reported as PASS", "SPEC 6")
def _(check_safe):
    return _passing(check_safe, lambda result: True)


@mutant("raising-checker-passes", "gpujail.chaos.checker:check_safe",
        "a checker that raises is taken as PASS for its invariant (Jepsen's check-safe says :unknown)", "SPEC 6")
def _(check_safe):
    return _passing(check_safe, lambda result: result.note.startswith("checker raised"))


@mutant("unknown-outranks-a-violation", "gpujail.chaos.checker:compose",
        "a verdict with an UNKNOWN invariant is UNKNOWN even when another invariant FAILs", "SPEC 6")
def _(compose):
    def mutated(checkers):
        judge = compose(checkers)

        def mutated_judge(run):
            verdict = judge(run)
            if any(r.valid == "unknown" for r in verdict.results.values()):
                verdict.valid = "unknown"
            return verdict
        return mutated_judge
    return _wrap(compose, mutated)


@mutant("runner-excuses-unknown", "gpujail.chaos.runner:ChaosRun.judge",
        "a chaos run with an invariant left UNKNOWN (not excused by its scenario) is judged PASS", "SPEC 6")
def _(judge):
    return _wrap(judge, lambda self: (judge(self)[0], []))


@mutant("inconclusive-is-pass", "gpujail.chaos.runner:ChaosRun.unopened",
        "a chaos run whose declared fault window never opened is judged PASS (INCONCLUSIVE forgotten)", "SPEC 6")
def _(unopened):
    return _wrap(unopened, lambda self: [])


@mutant("gate-passes-inconclusive", "gpujail.commands.run:pytest_outcome",
        "`gpujail run` exits 0 when a chaos test was inconclusive and the expectations do not list it", "SPEC 6")
def _(pytest_outcome):
    def mutated(*args, **kwargs):
        outcome = pytest_outcome(*args, **kwargs)
        return "passed" if outcome == "inconclusive" else outcome
    return _wrap(pytest_outcome, mutated)


# -- the catalogue: INV-3, INV-4, INV-6 ----------------------------------------------------------

@mutant("ignore-impl-outside", "gpujail.chaos.checkers.hygiene:check_hygiene",
        "INV-3 never reads `impl.outside`: a start that wrote outside the jail (seen through its node's "
        "copy-on-write host) passes", "INV-3, REF-11")
def _(check_hygiene):
    return _wrap(check_hygiene, lambda run: check_hygiene(_without(run, "impl.outside")))


@mutant("any-size-is-a-placeholder", "gpujail.chaos.checkers.hygiene:PLACEHOLDER_MAX",
        "INV-3 takes a real-sized file that appeared at a driver path for a placeholder (no size bound)",
        "INV-3, REF-9", here=True)
def _(placeholder_max):
    return 1 << 40


@mutant("warm-lock-ignored", "gpujail.chaos.checkers.locks:check_warm_locks",
        "INV-4 never looks at lock waits: a warm start that takes the placeholder lock passes", "INV-4, REF-4")
def _(check_warm_locks):
    return _wrap(check_warm_locks, lambda run: check_warm_locks(_without(run, "impl.lock.wait")))


@mutant("ignore-host-residue", "gpujail.chaos.checkers.residue:check_residue",
        "INV-6 looks only at temporary directories: mounts left in the host namespace and processes left "
        "running pass", "INV-6")
def _(check_residue):
    from gpujail.chaos.checkers.queries import Run

    def mutated(run):
        final = {**run.final, **{k: [] for k in ("host_mounts", "processes") if k in run.final}}
        return check_residue(Run(run.events, final))
    return _wrap(check_residue, mutated)


# -- the catalogue: simpler CDI fakes (--group cdi-fakes) ---------------------------------------
# What a simpler fake of `nvidia-ctk cdi generate` or `nvidia-cdi-hook` would do where the toolkit's
# source does otherwise (docs/cdi-fidelity.md): each must fail tests/test_cdi_fidelity.py. The fakes
# run as programs, so a run of this group also hands the tests wrappers of them that apply the mutant
# in the fake's own process (FAKES_ENV, `run_fake`).

FAKES = "cdi-fakes"


@mutant("ctk-flattens-paths", "gpujail.fixtures.ctk_render:_mount",
        "containerPath is the file's name in the 64-bit library directory, as the CLI's configure mounts "
        "(CLI-3), not the host path with the driver root stripped", "CDI-1", group=FAKES)
def _(_mount):
    def mutated(root, host_path, options):
        return {**_mount(root, host_path, options), "containerPath": f"/usr/lib/x86_64-linux-gnu/{os.path.basename(host_path)}"}
    return _wrap(_mount, mutated)


@mutant("ctk-bind-options", "gpujail.fixtures.ctk_render:MOUNT_OPTIONS",
        "mount options as older toolkits and the SPEC's text have them (`ro,nosuid,nodev,bind`), not "
        "`rbind,rprivate` (d0103aa6)", "CDI-1", here=True, group=FAKES)
def _(options):
    return ["ro", "nosuid", "nodev", "bind"]


@mutant("ctk-no-soname-links", "gpujail.fixtures.ctk_locators:ldconfig_never_ran",
        "on a driver tree ldconfig never ran on, no SONAME links: the spec lacks the libnvidia-ml.so.1 a "
        "real host's spec has, and CDI-3's REF-12 case never arises", "CDI-1, CDI-3", group=FAKES)
def _(ldconfig_never_ran):
    return _wrap(ldconfig_never_ran, lambda libs: False)


@mutant("ctk-links-where-none", "gpujail.fixtures.ctk_locators:soname_links",
        "a SONAME link for a library whose soname the host lacks (the toolkit's linkExists: only an "
        "existing symlink counts)", "CDI-1, CDI-3", group=FAKES)
def _(soname_links):
    return _wrap(soname_links, lambda host_path, container_path, as_ldconfig_leaves=False:
                 soname_links(host_path, container_path, True))


@mutant("ctk-yaml-as-json", "gpujail.fixtures.ctk_render:render",
        "the YAML format written as JSON (valid YAML, not what yaml.v3 writes)", "CDI-1", group=FAKES)
def _(render):
    return _wrap(render, lambda spec, fmt: render(spec, "json"))


@mutant("ctk-sorted-by-path", "gpujail.fixtures.ctk_render:_depth_sorted",
        "mounts and device nodes sorted by path alone, not by depth then path (transform/sorter.go)",
        "CDI-1", group=FAKES)
def _(_depth_sorted):
    return _wrap(_depth_sorted, lambda items, key: sorted(_depth_sorted(items, key), key=lambda i: i[key]))


@mutant("ctk-index-names-only", "gpujail.fixtures.ctk_render:device_specs",
        "devices named by index only (the toolkit names each GPU by index and by UUID)", "CDI-1", group=FAKES)
def _(device_specs):
    return _wrap(device_specs, lambda opts, dev_root: device_specs({**opts, "device-name-strategy": ["index"]}, dev_root))


@mutant("ctk-device-id-ignored", "gpujail.fixtures.ctk_render:device_specs",
        "--device-id ignored: every GPU gets a device, an unknown index is no error", "CDI-1", group=FAKES)
def _(device_specs):
    return _wrap(device_specs, lambda opts, dev_root: device_specs({**opts, "device-id": ["all"]}, dev_root))


@mutant("ctk-no-ldcache", "gpujail.fixtures.ctk_locators:_ldcache",
        "no ld-cache fallback: libraries are searched in the toolkit's fixed search paths only, so an Arch "
        "host's spec (64-bit libraries in /usr/lib) names none (pkg/lookup/library.go: First(symlinkLocator, "
        "ldcacheLocator))", "CDI-1", group=FAKES)
def _(_ldcache):
    return _wrap(_ldcache, lambda root, pattern: [])


@mutant("hook-keeps-files", "gpujail.fixtures.fake_cdi_hook:create_link",
        "create-symlinks leaves a regular file at the link path alone (the toolkit renames its link over "
        "whatever is there)", "CDI-3", group=FAKES)
def _(create_link):
    def mutated(root, target, link):
        path = os.path.join(root, link.lstrip("/"))
        if os.path.lexists(path) and not os.path.islink(path):
            return None
        return create_link(root, target, link)
    return _wrap(create_link, mutated)


@mutant("hook-always-relinks", "gpujail.fixtures.fake_cdi_hook:link_exists",
        "create-symlinks replaces a link that already points at its target (a new inode every start)",
        "CDI-3", group=FAKES)
def _(link_exists):
    return _wrap(link_exists, lambda target, link_path: False)


@mutant("hook-one-drop-in", "gpujail.fixtures.fake_cdi_hook:create_conf",
        "update-ldcache reuses an existing nvcr drop-in of the same kind (the toolkit's CreateTemp makes a "
        "new one every run)", "CDI-4", group=FAKES)
def _(create_conf):
    def mutated(pattern, dirs):
        prefix = pattern.split("*")[0]
        have = [n for n in (os.listdir("/etc/ld.so.conf.d") if os.path.isdir("/etc/ld.so.conf.d") else [])
                if n.startswith(prefix)]
        return f"/etc/ld.so.conf.d/{have[0]}" if have and dirs else create_conf(pattern, dirs)
    return _wrap(create_conf, mutated)


@mutant("hook-drop-in-every-folder", "gpujail.fixtures.fake_cdi_hook:conf_directories",
        "update-ldcache compares the folders with the system directories only, not with what ld.so.conf "
        "already lists: one more 00-nvcr file per start for the same folders", "CDI-4", group=FAKES)
def _(conf_directories):
    return _wrap(conf_directories, lambda conf, system: set(system))


class _OsWithoutExec:
    """The `os` module as fake_cdi_hook sees it, but execve ends the process instead of running ldconfig."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def execve(path, argv, env):
        os._exit(0)


@mutant("hook-never-runs-ldconfig", "gpujail.fixtures.fake_cdi_hook:os",
        "update-ldcache writes its drop-ins and exits without running ldconfig: the shared cache is never "
        "rewritten", "CDI-4", here=True, group=FAKES)
def _(os_module):
    return _OsWithoutExec()


@mutant("hook-failure-exits-zero", "gpujail.fixtures.fake_cdi_hook:run",
        "a failing hook logs its error and exits 0: the runtime never learns", "CDI-3, CDI-4", here=True, group=FAKES)
def _(run):
    return _wrap(run, lambda *args, **kwargs: (run(*args, **kwargs), 0)[1])


GROUPS = {"oracle": SELF_TESTS, FAKES: ["tests/test_cdi_fidelity.py"]}
FAKES_ENV = "GPUJAIL_CDI_FAKES"   # the directory tests/test_cdi_fidelity.py runs the fakes from
FAKE_PROGRAMS = {"nvidia-ctk": "gpujail.fixtures.fake_ctk", "nvidia-cdi-hook": "gpujail.fixtures.fake_cdi_hook"}


def fake_wrappers(name: str, directory: Path) -> None:
    """Write `nvidia-ctk` and `nvidia-cdi-hook` into `directory`: the fakes with mutant `name` applied."""
    for program, module in FAKE_PROGRAMS.items():
        path = directory / program
        path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
                        f"import oracle_mutants\nsys.exit(oracle_mutants.run_fake({module!r}, {name!r}))\n")
        path.chmod(0o755)


def run_fake(module: str, name: str) -> int:
    """A fake's main with mutant `name` in place (its module imported first, so every binding is found)."""
    fake = importlib.import_module(module)
    apply(name, pytest.MonkeyPatch())
    return fake.main()


# -- applying one --------------------------------------------------------------------------------

def resolve(m: Mutant) -> tuple[object, str, object]:
    """(the object holding the target, the attribute's name, its current value), or MutantError."""
    module_name, _, path = m.target.partition(":")
    try:
        owner = importlib.import_module(module_name)
    except ImportError as e:
        raise MutantError(f"oracle mutant {m.name}: its target {m.target} no longer exists ({e}); "
                          "update its entry in tests/oracle_mutants.py") from None
    *outer, attr = path.split(".")
    try:
        for part in outer:
            owner = getattr(owner, part)
        return owner, attr, getattr(owner, attr)
    except AttributeError as e:
        raise MutantError(f"oracle mutant {m.name}: its target {m.target} no longer exists ({e}); "
                          "update its entry in tests/oracle_mutants.py") from None


def _rebind(mp: pytest.MonkeyPatch, original: object, replacement: object) -> int:
    """Replace `original` wherever the project's modules (and the test modules) hold it: module
    attributes, and values of module-level dicts (or tuples in them: `windows.WINDOWS`). Identity is
    safe for functions; constants never come here (they are `here`). Returns how many places."""
    places = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("gpujail", "test_")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                mp.setattr(module, attr, replacement)
                places += 1
            elif isinstance(value, dict) and name.startswith("gpujail"):
                for key, v in list(value.items()):
                    if v is original:
                        mp.setitem(value, key, replacement)
                        places += 1
                    elif isinstance(v, tuple) and any(x is original for x in v):
                        mp.setitem(value, key, tuple(replacement if x is original else x for x in v))
                        places += 1
    return places


def apply(name: str, mp: pytest.MonkeyPatch) -> int:
    """Put mutant `name` in place (`mp.undo()` takes it away). Returns how many places now hold it."""
    if name not in MUTANTS:
        raise MutantError(f"no oracle mutant {name!r} (known: {', '.join(MUTANTS)})")
    m = MUTANTS[name]
    owner, attr, original = resolve(m)
    replacement = m.make(original)
    if m.here or isinstance(owner, type):
        mp.setattr(owner, attr, replacement)
        return 1
    return _rebind(mp, original, replacement)


# -- the pytest plugin (-p oracle_mutants) -------------------------------------------------------

_patch = pytest.MonkeyPatch()
_failed: list[str] = []


def pytest_configure(config) -> None:
    name = os.environ.get(ENV)
    if name:
        try:
            apply(name, _patch)
        except MutantError as e:
            raise pytest.UsageError(str(e)) from None
        if MUTANTS[name].group == FAKES:
            import tempfile
            directory = Path(tempfile.mkdtemp(prefix="cdi-fakes-"))
            fake_wrappers(name, directory)
            _patch.setenv(FAKES_ENV, str(directory))


def pytest_report_header(config) -> str | None:
    name = os.environ.get(ENV)
    return f"oracle mutant: {name} ({MUTANTS[name].mistake})" if name in MUTANTS else None


def pytest_runtest_logreport(report) -> None:
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)


def pytest_collectreport(report) -> None:
    if report.failed:
        _failed.append(f"{report.nodeid or '(collection)'} (collection error)")


def pytest_sessionfinish(session, exitstatus) -> None:
    if os.environ.get(REPORT_ENV):
        Path(os.environ[REPORT_ENV]).write_text(json.dumps({"mutant": os.environ.get(ENV), "failed": _failed,
                                                            "exitstatus": int(exitstatus)}))


def pytest_unconfigure(config) -> None:
    wrappers = os.environ.get(FAKES_ENV) if os.environ.get(ENV) else None
    _patch.undo()
    if wrappers:
        import shutil
        shutil.rmtree(wrappers, ignore_errors=True)


# -- the runner ----------------------------------------------------------------------------------

def kill_run(name: str | None, tests: list[str], timeout: float = 900.0) -> dict:
    """Run `tests` in a fresh pytest with mutant `name` (None: the baseline). Returns {failed: [test
    ids], error: why the mutant could not be run or None, seconds}."""
    import subprocess
    import tempfile
    import time
    with tempfile.TemporaryDirectory(prefix="oracle-mutant-") as tmp:
        report = Path(tmp) / "report.json"
        env = {**os.environ, ENV: name or "", REPORT_ENV: str(report),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "oracle_mutants", "-p", "no:cacheprovider", *tests]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"failed": [f"(the self-tests hung for {timeout:g} s)"], "error": None, "seconds": timeout}
        seconds = time.monotonic() - start
        if not report.exists():   # pytest stopped before the session: the mutant could not be applied
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            return {"failed": [], "error": lines[-1] if lines else f"pytest exited {proc.returncode}", "seconds": seconds}
        return {"failed": json.loads(report.read_text())["failed"], "error": None, "seconds": seconds}


def _short(test_id: str) -> str:
    return test_id.removeprefix("tests/")


def table(results: dict[str, dict]) -> str:
    """The matrix as a Markdown table, one mutant a row."""
    rows = ["| mutant | the mistake | SPEC | kills | tests that kill it | command | time |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        m = MUTANTS[name]
        killers = r["killers"]
        shown = ", ".join(f"`{_short(k)}`" for k in killers[:3]) + (f" (+{len(killers) - 3} more)" if len(killers) > 3 else "")
        verdict = f"ERROR: {r['error']}" if r["error"] else shown or "**SURVIVED**"
        group = f"--group {m.group} " if m.group != "oracle" else ""
        rows.append(f"| `{name}` | {m.mistake} | {m.cites} | {len(killers)} | {verdict} | "
                    f"`scripts/oracle-killmatrix {group}--mutants {name}` | {r['seconds']:.1f} s |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="scripts/oracle-killmatrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", choices=list(GROUPS), default="oracle",
                    help="the checker, probes and gate (oracle), or the CDI fakes against simpler fakes (cdi-fakes)")
    ap.add_argument("--mutants", help="comma-separated mutant names (default: every one of the group)")
    ap.add_argument("--tests", nargs="+", metavar="TEST", help="the self-tests to run (default: the group's)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.list:
        for m in (m for m in MUTANTS.values() if m.group == args.group):
            print(f"{m.name:<30} {m.target}\n{'':<30} {m.mistake} ({m.cites})")
        return 0
    names = args.mutants.split(",") if args.mutants else [n for n, m in MUTANTS.items() if m.group == args.group]
    unknown = [n for n in names if n not in MUTANTS or MUTANTS[n].group != args.group]
    if unknown:
        print(f"oracle-killmatrix: no mutant {', '.join(unknown)} in group {args.group} (see --list)", file=sys.stderr)
        return 2
    tests = args.tests or [t for t in GROUPS[args.group] if (REPO / t.split("::")[0]).exists()]
    base = kill_run(None, tests)
    if base["error"]:
        print(f"oracle-killmatrix: the baseline run failed: {base['error']}", file=sys.stderr)
        return 2
    broken = set(base["failed"])   # failing without a mutant: they kill nothing
    print(f"baseline ({base['seconds']:.1f} s): " + (f"{len(broken)} tests fail without a mutant and kill nothing: "
                                                      + ", ".join(sorted(broken)) if broken else "every self-test passes"),
          file=sys.stderr)
    results = {}
    for i, name in enumerate(names, 1):
        r = kill_run(name, tests)
        r["killers"] = [t for t in r["failed"] if t not in broken]
        results[name] = r
        said = f"ERROR {r['error']}" if r["error"] else (f"killed by {len(r['killers'])}" if r["killers"] else "SURVIVED")
        print(f"[{i}/{len(names)}] {name}: {said} ({r['seconds']:.1f} s)", file=sys.stderr)
    print(table(results))
    survivors = [n for n, r in results.items() if not r["error"] and not r["killers"]]
    errors = [n for n, r in results.items() if r["error"]]
    total = sum(r["seconds"] for r in results.values()) + base["seconds"]
    print(f"\n{len(results) - len(survivors) - len(errors)} of {len(results)} mutants killed"
          + (f"; survived: {', '.join(survivors)}" if survivors else "")
          + (f"; could not be applied: {', '.join(errors)}" if errors else "") + f" ({total:.0f} s with the baseline)")
    if args.json:
        Path(args.json).write_text(json.dumps({"tests": tests, "baseline_failed": sorted(broken), "mutants": results},
                                              indent=1))
    return 2 if errors else 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
