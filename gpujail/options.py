"""The suite's options and the one validator of their values, for the command and the plugin alike.

How this works
--------------
`OPTIONS` is the table both front doors read: `gpujail run` makes its flags from it, the pytest
plugin its option group (each option also an ini key and an environment variable). A value comes
from the command line, else the environment, else the ini file, else the table's default
(`value`), and carries where it came from, so that a bad one is named the way the user gave it:
`--impl 'sh /no/such.sh'`, `GPUJAIL_IMPL='...' (environment)`, `impl = '...' (ini file tox.ini)`.

The checks (`check_impl`, `check_backend`, `check_count`, `load_expectations`) raise `BadInput`
with one line, what was given and what is wrong with it; the command turns it into exit code 2,
the plugin into `pytest.UsageError`. Nothing here imports pytest: `value` reads any object with
pytest's `getoption`/`getini`.
"""
from __future__ import annotations

import os
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from gpujail.launchers import kubernetes
from gpujail.spec import CLI_COMMANDS, DEFAULT_WORKERS, START_TIMEOUT, Settings


@dataclass(frozen=True)
class Option:
    name: str       # the command-line flag without its dashes; the ini key is this with '_' for '-'
    env: str
    default: str
    help: str
    metavar: str | None = None   # the command line's: `gpujail run`'s and `reproduce`'s flags come from this table
    choices: tuple[str, ...] | None = None

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")

    def __iter__(self):   # (name, env, default, help), as callers unpack it
        return iter((self.name, self.env, self.default, self.help))


# --cli -> the fake CLI's GPUJAIL_CLI_VARIANT; 'real' is the host's own CLI, through the wrapper
CLI_VARIANTS = {"fake": "", "fake-own-cleanup": "own-cleanup", "real": ""}

OPTIONS = [
    Option("impl", "GPUJAIL_IMPL", "reference",
           "implementation under test: reference, legacy, direct, cdi, cdi-naive, example-shell, mutant:NAME, or a command "
           "string with {jail} {node} {role}"),
    Option("backend", "GPUJAIL_BACKEND", "kernel", "kernel | model | docker"),
    Option("workers", "GPUJAIL_WORKERS", str(DEFAULT_WORKERS),
           "GPU workers of every multi-worker test and scenario that does not pin its count"),
    Option("seed", "GPUJAIL_TEST_SEED", "0", "seed for randomised schedules"),
    Option("start-timeout", "GPUJAIL_START_TIMEOUT", f"{START_TIMEOUT:g}",
           "seconds one worker start may take; then it is killed with everything it started"),
    Option("expectations", "GPUJAIL_EXPECTATIONS", "", "TOML file of expected failures (strict xfail)"),
    Option("gpujail-report", "GPUJAIL_REPORT", "", "write a JSON summary per requirement to this file"),
    Option("cli", "GPUJAIL_CLI", "fake",
           "the nvidia-container-cli workers get: 'fake' (libnvidia-container 1.18's behaviour) or "
           "'fake-own-cleanup' (upstream issue #377's proposal: its cleanup removes only what it created), or "
           "'real' (the host's own, first on the host's PATH: on a GPU node)", choices=tuple(CLI_VARIANTS)),
    Option("jail-fs", "GPUJAIL_JAIL_FS", "local",
           "the jail's file system: 'local' (one directory), 'gluster' (GlusterFS, one FUSE client per node) "
           "or 'nodelocal-locks' (a bindfs view per node: flock serialises only within a node); kernel backend"),
    Option("cdi-spec", "GPUJAIL_CDI_SPEC", "",
           "a CDI spec your `nvidia-ctk cdi generate` wrote (YAML or JSON): the worker nodes get the files it names as "
           "their driver, the fake nvidia-ctk prints it, the probes check its mounts, and the implementation is "
           "taken as CDI-mode; kernel backend", metavar="FILE"),
    Option("schedule", "GPUJAIL_SCHEDULE", "free",
           "the chaos runs' interleaving: 'free' (as the kernel schedules the workers), 'random-walk', "
           "'pct[:d=DEPTH,k=STEPS]' or 'mixed' (pct on even seeds, random-walk on odd ones) (every failpoint a "
           "scheduling point of the harness's scheduler, seeded by --seed, recorded for exact replay; "
           "docs/scheduler.md), with ',syscalls' (':syscalls' for random-walk and mixed) "
           "for a start's system calls on the jail as points too; kernel backend", metavar="S"),
    Option("self-checks", "GPUJAIL_SELF_CHECKS", "once",
           "harness self-checks (fake CLI, kernel facts): 'once' per host and code version, or 'always'"),
    Option("launcher", "GPUJAIL_LAUNCHER", "",
           "start each worker's node through node agents (`gpujail node`) launched by: local | slurm | kubernetes "
           "(default: none, the backend's own nodes)"),
    Option("nodes", "GPUJAIL_NODES", "",
           "--launcher: how many cluster nodes to ask for (default: one per agent; fewer puts several agents on a node)"),
    Option("partition", "GPUJAIL_PARTITION", "", "--launcher slurm: the partition of the agents' job"),
    Option("account", "GPUJAIL_ACCOUNT", "", "--launcher slurm: the account charged for the agents' job"),
]
# --launcher kubernetes: the --k8s-* settings (gpujail/launchers/kubernetes.py's table).
OPTIONS += [Option(*setting) for setting in kubernetes.SETTINGS]
BY_NAME = {o.name: o for o in OPTIONS}
PATHS = ("expectations", "gpujail-report", "cdi-spec")   # values shown as they are in messages; the others quoted
SELF_CHECK_MODES = ("once", "always")
EXPECTATION_SECTIONS = ("implementation", "cli", "requirements", "tests", "intermittent", "inconclusive",
                        "intermittent-inconclusive")
# Interpreters whose first non-option argument is the script they run (`bash vendor.sh -j {jail}`);
# `-c` and `-m` name code or a module instead.
INTERPRETERS = ("sh", "bash", "dash", "ksh", "zsh", "python", "python3", "perl", "ruby", "node")


class BadInput(ValueError):
    """One line: what was given (and where) and what is wrong with it."""


@dataclass(frozen=True)
class Value:
    name: str
    text: str
    source: str          # "command line", "environment", "ini", "default"
    ini_file: str = ""

    def __str__(self) -> str:
        return self.text

    @property
    def given(self) -> bool:
        return self.source != "default"

    @property
    def label(self) -> str:
        """The value as the user wrote it, for an error message."""
        o = BY_NAME[self.name]
        text = self.text if self.name in PATHS else repr(self.text)
        if self.source == "environment":
            return f"{o.env}={text} (environment)"
        if self.source == "ini":
            return f"{o.key} = {text} (ini file {self.ini_file})"
        if self.source == "default":
            return f"--{o.name} {text} (default)"
        return f"--{o.name} {text}"


def value(config, name: str) -> Value:
    """Option `name` of a pytest config: command line, then environment, then ini, then default."""
    o = BY_NAME[name]
    given = config.getoption(o.key)
    if given is not None:
        return Value(name, str(given), "command line")
    if os.environ.get(o.env) is not None:
        return Value(name, os.environ[o.env], "environment")
    ini = config.getini(o.key)
    if ini:
        return Value(name, str(ini), "ini", str(getattr(config, "inipath", "") or ""))
    return Value(name, o.default, "default")


def option(config, name: str) -> str:
    return value(config, name).text


def seed_of(config) -> int:
    """--seed as the number the runs take (validated with the rest at session start: check_all)."""
    return check_count(value(config, "seed"))


def flag(name: str, text: str) -> Value:
    """A value given on the command line (`gpujail run --impl X`)."""
    return Value(name, str(text), "command line")


# -- the checks ---------------------------------------------------------------------------------

def check_impl(impl: Value) -> None:
    """A bundled name, `mutant:NAME`, or a command whose program is on PATH (or an executable file)
    and whose script, if an interpreter runs one, is a readable file named by absolute path (the
    implementation starts with the jail as its working directory: CONTRACT.md)."""
    from gpujail.contract import BUNDLED, UnknownImplementation, command_for
    text = impl.text
    if text in BUNDLED:
        return
    try:
        command_for(text, "/jail", "node", "gpu-worker")   # mutant names, parsing, an empty command
    except UnknownImplementation as e:
        raise BadInput(f"{impl.label}: {e}") from None
    if text.startswith("mutant:"):
        return
    words = shlex.split(text)
    problem = _program_problem(words[0])
    if not problem and os.path.basename(words[0]).rstrip("0123456789.") in INTERPRETERS:
        script = _script_of(words[1:])
        problem = _file_problem(script, "script", os.R_OK) if script else None
    if problem:
        raise BadInput(f"{impl.label}: {problem}")


def _program_problem(word: str) -> str | None:
    from gpujail.contract import BUNDLED
    if "{" in word:
        return None
    if "/" not in word:   # the workers' PATH starts with the fake CLI's directory and the suite's wrappers
        from gpujail.fixtures import BIN
        found = shutil.which(word) or shutil.which(word, path=str(BIN))
        return None if found else (f"{word} is neither a bundled implementation "
                                                f"({', '.join(BUNDLED)}, mutant:NAME) nor a command on PATH")
    problem = _file_problem(word, "program", os.X_OK)
    if problem:
        return problem
    with open(word, "rb") as f:
        first = f.readline(200)
    if first.startswith(b"#!"):   # a script run directly: its interpreter must exist too
        interp = first[2:].split()
        if interp:
            name = interp[1].decode() if os.path.basename(interp[0]) == b"env" and len(interp) > 1 else interp[0].decode()
            if ("/" in name and not os.access(name, os.X_OK)) or ("/" not in name and not shutil.which(name)):
                return f"{word}: its interpreter {name} (#! line) is not found"
    return None


def _script_of(args: list[str]) -> str | None:
    for word in args:
        if word.startswith("-") and not word.startswith("--") and set(word[1:]) & {"c", "m"}:
            return None   # `sh -c CODE`, `bash -ec CODE`, `python3 -m MODULE`
        if not word.startswith("-"):
            return None if "{" in word else word
    return None


def _file_problem(path: str, what: str, mode: int) -> str | None:
    if not os.path.isabs(path):
        return (f"{what} {path}: a relative path, but the implementation starts in the jail (CONTRACT.md); "
                "name it by its absolute path")
    if not os.path.exists(path):
        return f"{what} {path}: no such file"
    if not os.path.isfile(path):
        return f"{what} {path}: not a regular file"
    if not os.access(path, mode):
        return f"{what} {path}: not {'executable' if mode == os.X_OK else 'readable'}"
    return None


def check_backend(backend: Value) -> None:
    from gpujail.backends import NAMES
    if backend.text not in NAMES:
        raise BadInput(f"{backend.label}: expected one of {', '.join(NAMES)}")


def check_count(v: Value) -> int:
    """--workers, --seed: a non-negative integer."""
    if not v.text.isdigit():
        raise BadInput(f"{v.label}: expected a non-negative integer")
    return int(v.text)


WORKER_MEMORY = 16 * 2**20   # a worker node's share of memory, with room (measured: 10.9 MiB PSS, docs/benchmarks.md)


def host_capacity() -> tuple[int, str]:
    """How many workers this host can hold at once, and why: memory available, and processes
    (a worker is a few: its node, the implementation, the CLI)."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
    available = int(meminfo.get("MemAvailable", "0 kB").split()[0]) * 1024
    pids = int(Path("/proc/sys/kernel/pid_max").read_text())
    by_memory, by_pids = available // WORKER_MEMORY, pids // 8
    if by_memory <= by_pids:
        return max(1, by_memory), f"{available // 2**20} MiB of memory available, about {WORKER_MEMORY // 2**20} MiB each"
    return by_pids, f"a pid limit of {pids}, about 8 processes each"


def check_workers(v: Value) -> int:
    """--workers: at least 1, and no more than this host can hold."""
    n = check_count(v)
    if n < 1:
        raise BadInput(f"{v.label}: expected at least 1 worker")
    most, why = host_capacity()
    if n > most:
        raise BadInput(f"{v.label}: this host can hold about {most} workers at once ({why})")
    return n


def check_seconds(v: Value) -> float:
    """--start-timeout: a positive number of seconds."""
    try:
        seconds = float(v.text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise BadInput(f"{v.label}: expected a positive number of seconds")
    return seconds


def check_cli(v: Value) -> str:
    """--cli: one of CLI_VARIANTS; returns what the fake CLI reads in GPUJAIL_CLI_VARIANT."""
    if v.text not in CLI_VARIANTS:
        raise BadInput(f"{v.label}: expected one of {', '.join(CLI_VARIANTS)}")
    return CLI_VARIANTS[v.text]


class CliUnavailable(BadInput):
    """--cli real on a host without nvidia-container-cli: the backend cannot run (exit 3, not 2)."""


def real_cli(v: Value) -> str:
    """--cli real: the host's nvidia-container-cli (absolute path), found on the host's PATH
    without the suite's own fake; '' for the fake variants. Put another CLI's directory first on
    PATH to choose it."""
    if v.text != "real":
        return ""
    from gpujail.fixtures import BIN, syscall_faults
    ours = {str(BIN), syscall_faults.WRAP}
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and os.path.realpath(d) not in ours)
    found = shutil.which("nvidia-container-cli", path=path)
    if not found:
        raise CliUnavailable(f"{v.label}: no nvidia-container-cli on this host's PATH (the suite's own fake does "
                             "not count); install libnvidia-container-tools, or put its directory first on PATH")
    return os.path.abspath(found)


def check_jail_fs(v: Value, backend: Value) -> None:
    """--jail-fs: one of jailfs.KINDS; other than `local` only on the kernel backend (whose nodes
    mount their own client). Whether this host can provide it is asked later (exit 3, a skip)."""
    from gpujail.backends.jailfs import KINDS
    if v.text not in KINDS:
        raise BadInput(f"{v.label}: expected one of {', '.join(KINDS)}")
    if v.text != "local" and backend.text != "kernel":
        raise BadInput(f"{v.label}: needs --backend kernel (given {backend.text!r}): only its nodes mount their "
                       "own client of the jail")
def check_cdi_spec(v: Value, backend: Value, launcher: Value | None = None) -> str:
    """--cdi-spec: '' (none) or a vendor's CDI spec that reads and that the suite can inject
    (fixtures/cdi_spec.py says what it checks), on the kernel backend's own nodes (the docker
    backend's image and a launcher's agents lay the fixture driver, not a spec's). Returns the
    spec's absolute path, '' for none."""
    if not v.text:
        return ""
    from gpujail.fixtures import cdi_spec
    if backend.text != "kernel":
        raise BadInput(f"{v.label}: needs --backend kernel (given {backend.text!r}): only its nodes lay a spec's files")
    if launcher is not None and launcher.text:
        raise BadInput(f"{v.label}: not with --launcher ({launcher.text!r}): the agents' nodes lay the fixture driver")
    try:
        return cdi_spec.load(v.text).path
    except cdi_spec.SpecError as e:
        raise BadInput(f"{v.label}: {e}") from None


def check_schedule(v: Value, backend: Value | None = None, launcher: Value | None = None) -> str:
    """--schedule: free, random-walk or pct[:d=D,k=K,changes=A+B]; other than free only on the
    kernel backend's own nodes (the scheduler's socket is in the run directory every node of this
    machine sees). Returns the value as the runner reads it."""
    from gpujail.world import schedule
    try:
        plan = schedule.parse(v.text)
    except schedule.ScheduleError as e:
        raise BadInput(f"{v.label}: {e}") from None
    if not plan.free and backend is not None and backend.text != "kernel":
        raise BadInput(f"{v.label}: needs --backend kernel (given {backend.text!r})")
    if not plan.free and launcher is not None and launcher.text:
        raise BadInput(f"{v.label}: not with --launcher ({launcher.text!r}): the scheduler reaches only this "
                       "machine's nodes")
    return str(plan)


def check_launcher(v: Value) -> str:
    """--launcher: '' (none) or one of gpujail.launchers.NAMES; --nodes with it a count."""
    from gpujail.launchers import NAMES
    if v.text and v.text not in NAMES:
        raise BadInput(f"{v.label}: expected one of {', '.join(NAMES)}")
    return v.text


def launcher_options(values: dict[str, Value]) -> dict[str, str | int]:
    """What a launcher is given (gpujail.launchers.fleet_class): the agents (one per GPU worker of
    --workers), --nodes, --partition, --account."""
    if values["nodes"].text:
        check_count(values["nodes"])
    k8s = {name: values[name].text for name, *_ in kubernetes.SETTINGS}
    if values["launcher"].text == "kubernetes":
        try:
            kubernetes.Settings.parse(k8s)
        except kubernetes.BadSetting as e:
            raise BadInput(str(e)) from None
    return {"agents": int(values["workers"].text), "nodes": values["nodes"].text,
            "partition": values["partition"].text, "account": values["account"].text, **k8s}


def check_self_checks(v: Value) -> None:
    if v.text not in SELF_CHECK_MODES:
        raise BadInput(f"{v.label}: expected one of {', '.join(SELF_CHECK_MODES)}")


def load_expectations(v: Value) -> dict:
    """The expectations file named by `v` ('' for none), checked: it exists, parses as TOML, has
    only the known sections and names only known requirement IDs; every test listed under
    [inconclusive] or [intermittent-inconclusive] (a chaos test known to prove nothing here, always or
    by timing) says why."""
    from gpujail.spec import REQUIREMENTS
    empty = {"requirements": {}, "tests": {}, "intermittent": {}, "inconclusive": {}, "intermittent-inconclusive": {}}
    if not v.text:
        return {**empty, "cli": None}
    try:
        data = tomllib.loads(Path(v.text).read_text())
    except FileNotFoundError:
        raise BadInput(f"{v.label}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{v.label}: cannot read it: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{v.label}: not TOML: {e}") from None
    unknown = sorted(set(data) - set(EXPECTATION_SECTIONS))
    if unknown:
        raise BadInput(f"{v.label}: unknown section(s) {', '.join(unknown)} (known: {', '.join(EXPECTATION_SECTIONS)})")
    bad = sorted(set(data.get("requirements", {})) - set(REQUIREMENTS))
    if bad:
        raise BadInput(f"{v.label}: unknown requirement ID(s) {', '.join(bad)} (gpujail/spec.py)")
    for section in ("inconclusive", "intermittent-inconclusive"):
        unexplained = sorted(t for t, why in data.get(section, {}).items() if not str(why).strip())
        if unexplained:
            raise BadInput(f"{v.label}: [{section}] {', '.join(unexplained)}: no reason given "
                           "(say why the run proves nothing)")
    cli = data.get("cli", list(CLI_COMMANDS))
    if not isinstance(cli, list) or not set(map(str, cli)) <= set(CLI_COMMANDS):
        raise BadInput(f"{v.label}: cli = {cli!r}: expected a list of the nvidia-container-cli commands the "
                       f"implementation runs, of {', '.join(CLI_COMMANDS)}")
    return {**{section: data.get(section, {}) for section in empty}, "cli": data.get("cli")}


def check_all(read) -> tuple[dict[str, Value], dict]:
    """Every option read by `read(name) -> Value`, checked. Returns the values by name and the
    expectations table."""
    values = {o.name: read(o.name) for o in OPTIONS}
    check_backend(values["backend"])
    check_workers(values["workers"])
    check_count(values["seed"])
    check_seconds(values["start-timeout"])
    check_cli(values["cli"])
    real_cli(values["cli"])
    check_self_checks(values["self-checks"])
    check_jail_fs(values["jail-fs"], values["backend"])
    check_launcher(values["launcher"])
    launcher_options(values)
    check_cdi_spec(values["cdi-spec"], values["backend"], values["launcher"])
    check_schedule(values["schedule"], values["backend"], values["launcher"])
    check_impl(values["impl"])
    return values, load_expectations(values["expectations"])


def settings(values: dict[str, Value]) -> Settings:
    """The harness's settings (gpujail.spec.Settings) from checked values (check_all's, or a
    command's own: start-timeout, cli, cdi-spec, backend and launcher)."""
    launcher = values.get("launcher")
    return Settings(start_timeout=check_seconds(values["start-timeout"]), cli_variant=check_cli(values["cli"]),
                    cli_target=real_cli(values["cli"]),
                    cdi_spec=check_cdi_spec(values["cdi-spec"], values["backend"], launcher))
