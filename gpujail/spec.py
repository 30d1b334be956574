"""The vocabulary every layer shares: requirement IDs, the jail paths and size bounds the SPEC fixes,
and the exit codes. One place, which CONTRACT.md, the report and the tests quote.

The requirement table is like test262's features.txt: every SPEC ID a test may cite, one line each.
A `req` marker naming an ID not listed here is a collection error; the self-tests check this table
against SPEC.md and list the IDs no test cites.
"""
from dataclasses import dataclass

REQUIREMENTS = {
    "CLI-1": "fake CLI: GNU argp grammar, usage errors exit 1, bad rootfs refused",
    "CLI-2": "fake CLI: `list` sections, order and options",
    "CLI-3": "fake CLI: destinations in the rootfs (flattened libraries, usr/bin, host paths)",
    "CLI-4": "fake CLI: file_create skips on exact st_mode, make_ancestors EEXIST race",
    "CLI-5": "fake CLI: bind mount then read-only remount, in the caller's namespace",
    "CLI-6": "fake CLI: failure cleanup unmounts and deletes only 0-byte files",
    "CLI-7": "fake CLI: --ldconfig=@/path and deferred ldconfig",
    "CLI-8": "fake CLI: gofail-style failpoints, recorded in the history",
    "K-1": "kernel: unlinking a mount point in another namespace detaches it",
    "K-2": "kernel: network file systems detach the same way (d_invalidate)",
    "K-3": "kernel: the loader rejects 0-byte and marker-sized files with `file too short`",
    "K-4": "kernel: flock locks die with their holder and serialise jail users",
    "K-5": "kernel: private mount namespaces as root or in a user namespace",
    "REF-1": "file set from `nvidia-container-cli list`; a failing list is fatal",
    "REF-2": "target mapping resolved inside the jail",
    "REF-3": "existing targets are skipped (node-local /dev and /run included)",
    "REF-4": "warm path: nothing missing, no lock, nothing created",
    "REF-5": "cold path: bounded lock, re-check, 0755 parents, non-empty marker < 64 bytes, host mode",
    "REF-6": "the CLI runs once with the caller's capabilities; failure is fatal, no retries",
    "REF-7": "verify the CLI's mounts: attached and > 1 KiB by path; none at all is an anomaly",
    "REF-8": "libnvidia-ml.so.1 resolves to real content, repaired by ldconfig under a lock",
    "REF-9": "placeholder predicate (lib*.so.* regular file < 64 bytes): cleanup and dummy mounts",
    "REF-10": "a ready GPU worker touches etc/gpu_libs_installed.flag",
    "REF-11": "nothing written outside the jail, whatever its symlinks",
    "REF-12": "per-node sonames: every ready worker's sonames load its own driver, whatever other nodes run",
    "INV-1": "no lost content while a worker is ready",
    "INV-2": "convergence within bounded restarts under transient faults",
    "INV-3": "jail hygiene: only placeholders, locks, flag and ldconfig outputs change",
    "INV-4": "no lock on warm starts",
    "INV-5": "honest readiness",
    "INV-6": "no host residue",
    "CDI-1": "CDI path: `nvidia-ctk cdi generate`'s spec (mounts, device nodes, hooks)",
    "CDI-2": "CDI path: the runtime creates missing mount targets (0-byte files) and never removes them",
    "CDI-3": "CDI path: `nvidia-cdi-hook create-symlinks` replaces whatever is at each link",
    "CDI-4": "CDI path: `nvidia-cdi-hook update-ldcache` rewrites the root's shared cache on every start",
}

# Requirements SPEC.md defines that no test checks yet, with what will build them: reports list
# them as pending (never as passed), and a self-test fails once a test cites one still listed here.
PENDING: dict[str, str] = {}   # CDI-1..4 have theirs since issue 27 (conformance/test_cdi.py)

# The chaos checker's invariants (SPEC section 6), by their short names.
INVARIANTS = {"INV-1": "no lost content", "INV-2": "convergence", "INV-3": "jail hygiene",
              "INV-4": "no lock on warm starts", "INV-5": "honest readiness", "INV-6": "no host residue"}

CONTRACT_VERSION = "1.1"   # CONTRACT.md; changes whenever that page changes meaning

# Paths in the jail the SPEC names (REF-5, REF-8, REF-10).
LOCK = "etc/complement_jail_gpu_placeholders.lock"
LDCONFIG_LOCK = "etc/complement_jail_ldconfig.lock"
FLAG = "etc/gpu_libs_installed.flag"
LDCACHE = "etc/ld.so.cache"

# Size bounds (REF-5, REF-7, REF-9).
PLACEHOLDER_MAX = 64          # a placeholder (0-byte or marker) is smaller than this
PLACEHOLDER_NAME = "lib*.so.*"  # ... and named like a versioned library
REAL_CONTENT_MIN = 1024       # a mounted regular file shows more than this by path

# IPC entries `list` prints that are directories (the MPS pipe directory): their targets are
# directories (REF-3), each holding a marker so that no CLI cleanup can remove it as empty (CLI-6).
IPC_DIRS = ("tmp/nvidia-mps",)
DIR_MARKER = ".nvidia-placeholder-marker"

# The driver capabilities (NVIDIA_DRIVER_CAPABILITIES, the CLI's `configure --compute ...` flags; "all"
# is every one but compat32): what the fake CLI acts on and what an implementation accepts.
CAPABILITIES = ("compute", "compat32", "display", "graphics", "utility", "video", "ngx")

# The `nvidia-container-cli` commands an implementation may run (contract.cli_commands): a test that
# fails or stubs one (marker `needs_cli`) does not apply to an implementation that never runs it.
CLI_COMMANDS = ("list", "configure")

# GPU workers of a multi-worker test or scenario that does not pin its count (--workers).
DEFAULT_WORKERS = 8

# How long one start (one run of the implementation) may take before it is killed with everything it
# started, unless the run says otherwise (--start-timeout, GPUJAIL_START_TIMEOUT, ini start-timeout).
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Settings:
    """What a run asked for that the harness below the plugin acts on: built once from flags,
    environment and ini by one validator (gpujail/options.py `settings`) and made this process's by
    `use` (the plugin for its session, `gpujail reproduce` for its run). It is not passed through
    os.environ: a node or an implementation gets what it needs in the environment its starter
    builds (kernel.Node.contract_env)."""
    start_timeout: float = START_TIMEOUT   # every start's deadline
    cli_variant: str = ""   # --cli: what the fake CLI reads in GPUJAIL_CLI_VARIANT ('' its default)
    cli_target: str = ""    # --cli real: the host's CLI, which workers run through the syscall-fault wrapper
    cdi_spec: str = ""      # --cdi-spec: the vendor's spec, an absolute path ('' none)


_settings = Settings()


def settings() -> Settings:
    return _settings


def use(new: Settings) -> Settings:
    """Make `new` this process's settings; returns the ones it replaces, for a nested session
    (pytester's) to give back when it ends."""
    global _settings
    old, _settings = _settings, new
    return old


def start_timeout() -> float:
    return _settings.start_timeout


# Exit codes of the bundled implementations: one per kind of failure (CONTRACT.md).
IMPL_EXIT = {"ready": 0, "bad-input": 2, "lock-timeout": 3, "cli-failed": 4, "verify-failed": 5,
             "soname-failed": 6, "unsafe-jail": 7, "jail-write-failed": 8, "io-error": 9}
# Exit codes of the `gpujail` command and its subcommands (README.md).
EXIT = {"passed": 0, "failed": 1, "bad-input": 2, "backend": 3, "inconclusive": 4, "error": 5, "interrupted": 130}
assert len(set(IMPL_EXIT.values())) == len(IMPL_EXIT) and len(set(EXIT.values())) == len(EXIT)


def last_error(stderr: str, code: int) -> str:
    """A failed command's last stderr line, at most 200 characters: the error a one-line message
    names (the lines before it are context, and one long line must not flood an orchestrator's
    log). The implementations name a failed CLI, ldconfig or nvidia-ctk by it, the harness a failed
    helper of its own."""
    return (stderr.strip().splitlines() or [f"exit code {code}"])[-1][-200:]
