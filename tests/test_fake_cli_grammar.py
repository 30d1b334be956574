"""The fake nvidia-container-cli's command line: argp grammar, usage errors, input errors (SPEC CLI-1).

Every command line here fails (or prints) before the CLI touches anything, so the fake runs as a
plain subprocess on the host: no node, no namespace, no jail. Expected texts are the real CLI's,
from docs/cli-fidelity.md sections 1-2 (glibc getopt/argp messages, main.c, configure.c).
"""
import os
import subprocess
from pathlib import Path

import pytest

from gpujail.fixtures.cli_args import CONFIGURE_OPTIONS, GLOBAL_OPTIONS, LIST_OPTIONS, PROG, Usage, argp_parse

REPO = Path(__file__).resolve().parents[1]

CLI = REPO / "fixtures" / "bin" / "nvidia-container-cli"
MAIN_TRY = "Try `nvidia-container-cli --help' or `nvidia-container-cli --usage' for more information."
CONFIGURE_TRY = ("Try `nvidia-container-cli configure --help' or `nvidia-container-cli configure --usage' "
                 "for more information.")
MAIN_USAGE = "Usage: nvidia-container-cli [OPTION...] COMMAND [ARG...]"
REAL_COMMAND_LINE = ["--user", "--debug=/dev/stderr", "--no-pivot", "configure", "--no-cgroups",
                     "--cuda-compat-mode=disabled", "--ldconfig=/usr/bin/true", "--device=all", "--compute",
                     "--utility", "/jail"]


def cli(*args, **env):
    """Run the fake on the host with a clean environment (no history, no failpoints armed)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJAIL_", "NVC_"))}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=60, env={**base, **env})


def test_version_prints_cli_and_lib_version():
    """CLI-1: `--version` prints `cli-version: X` and `lib-version: X` (main.c print_version), exit 0."""
    r = cli("--version")
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0].startswith("cli-version: ") and lines[1].startswith("lib-version: ")
    assert len(lines) == 7 and all(": " in ln for ln in lines)


@pytest.mark.parametrize("args, first_line, try_line", [
    # glibc getopt messages; the prefix is argv[0] (ends with the program name), then argp's Try line.
    (["--frobnicate", "list"], "nvidia-container-cli: unrecognized option '--frobnicate'", MAIN_TRY),
    (["--frobnicate=1", "list"], "nvidia-container-cli: unrecognized option '--frobnicate=1'", MAIN_TRY),
    (["-x", "list"], "nvidia-container-cli: invalid option -- 'x'", MAIN_TRY),
    (["--root"], "nvidia-container-cli: option '--root' requires an argument", MAIN_TRY),
    (["-r"], "nvidia-container-cli: option requires an argument -- 'r'", MAIN_TRY),
    (["--load-kmods=1", "list"], "nvidia-container-cli: option '--load-kmods' doesn't allow an argument",
     MAIN_TRY),
    (["--no", "list"], ("nvidia-container-cli: option '--no' is ambiguous; possibilities: '--no-pivot' "
                         "'--no-create-imex-channels'"), MAIN_TRY),
    # Inside a subcommand argv[0] is "nvidia-container-cli configure".
    (["configure", "--frobnicate", "/jail"], "nvidia-container-cli configure: unrecognized option '--frobnicate'",
     CONFIGURE_TRY),
    (["configure", "--comp", "/jail"], ("nvidia-container-cli configure: option '--comp' is ambiguous; "
                                        "possibilities: '--compute' '--compat32'"), CONFIGURE_TRY),
    (["configure", "--compute"], "Usage: nvidia-container-cli configure [OPTION...] ROOTFS", CONFIGURE_TRY),
    (["configure", "/a", "/b"], "Usage: nvidia-container-cli configure [OPTION...] ROOTFS", CONFIGURE_TRY),
    (["list", "extra"], "nvidia-container-cli list: Too many arguments",
     "Try `nvidia-container-cli list --help' or `nvidia-container-cli list --usage' for more information."),
    # No command, unknown command, and an optional-argument option that must not eat the next word:
    ([], MAIN_USAGE, MAIN_TRY),
    (["frobnicate"], MAIN_USAGE, MAIN_TRY),
    (["Configure", "/jail"], MAIN_USAGE, MAIN_TRY),
    (["--user", "1000", "configure", "--compute", "/jail"], MAIN_USAGE, MAIN_TRY),
])
def test_usage_errors_exit_1_with_the_argp_messages(args, first_line, try_line):
    """CLI-1: unknown options, a missing or unknown command: argp usage on stderr and exit 1 (main.c sets
    argp_err_exit_status = EXIT_FAILURE, not 64); nothing on stdout."""
    r = cli(*args)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[1] == try_line, r.stderr
    # getopt prefixes argv[0] as given (a path ending in the program name); argp's usage is exact.
    assert lines[0] == first_line if first_line.startswith("Usage:") else lines[0].endswith(first_line), lines[0]


@pytest.mark.parametrize("rootfs", ["jail", "./jail", "relative/dir", "/"])
def test_relative_or_slash_rootfs_is_an_input_error(rootfs):
    """CLI-1: a ROOTFS that is relative or exactly `/` is refused at parse time, exit 1, one line."""
    r = cli("configure", "--compute", "--utility", rootfs)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "nvidia-container-cli: input error: invalid rootfs directory\n"


def test_bad_pid_is_an_input_error_at_parse_time():
    """CLI-1: `--pid` goes through str_to_pid while parsing (configure.c), so a bad one is an input
    error before the rootfs is looked at (here, one that does not exist)."""
    r = cli("configure", "--compute", "--pid=abc", "/nonexistent-rootfs")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "nvidia-container-cli: input error: parse pid failed: invalid argument\n"


@pytest.mark.parametrize("spec", ["cli.before_mkdir=frob", "cli.before_mkdri=off", "cli.before_mount"])
def test_malformed_failpoint_spec_is_one_line_and_exit_1(spec):
    """CLI-8: a malformed GPUJAIL_FAILPOINTS is bad input: one line on stderr, exit 1, before parsing
    the command line or touching anything."""
    r = cli("configure", "--compute", "/nonexistent-rootfs", GPUJAIL_FAILPOINTS=spec)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("nvidia-container-cli: failpoint error: GPUJAIL_FAILPOINTS: cannot parse"), r.stderr


# -- the parser itself ---------------------------------------------------------------------------

def test_the_real_hook_command_line_parses():
    """CLI-1: what runtimes really pass: `--user` without argument (optional arg, not the next word),
    `--debug=FILE`, `--no-pivot`, then configure's own options and the rootfs."""
    gopts, rest = argp_parse(REAL_COMMAND_LINE, GLOBAL_OPTIONS, PROG, stop_at_command=True)
    assert gopts == {"user": [None], "debug": ["/dev/stderr"], "no-pivot": [None]}
    assert rest[0] == "configure"
    opts, positional = argp_parse(rest[1:], CONFIGURE_OPTIONS, f"{PROG} configure", stop_at_command=False)
    assert opts == {"no-cgroups": [None], "cuda-compat-mode": ["disabled"], "ldconfig": ["/usr/bin/true"],
                    "device": ["all"], "compute": [None], "utility": [None]}
    assert positional == ["/jail"]


def test_options_only_before_the_command_word():
    """CLI-1: ARGP_IN_ORDER for the main parser: the first non-option is the command, everything after it
    belongs to the subcommand (even words that look like global options)."""
    gopts, rest = argp_parse(["-k", "list", "--no-pivot", "-l"], GLOBAL_OPTIONS, PROG, stop_at_command=True)
    assert gopts == {"load-kmods": [None]} and rest == ["list", "--no-pivot", "-l"]
    gopts, rest = argp_parse(["-u", "1000", "configure"], GLOBAL_OPTIONS, PROG, stop_at_command=True)
    assert gopts == {"user": [None]} and rest == ["1000", "configure"]


def test_long_option_abbreviations():
    """CLI-1: getopt_long accepts any unique prefix; an exact name wins over longer ones; a non-unique
    prefix is ambiguous."""
    opts, rest = argp_parse(["--no-p", "--load", "--use=1000:1000", "--deb", "/tmp/log", "info"],
                            GLOBAL_OPTIONS, PROG, stop_at_command=True)
    assert opts == {"no-pivot": [None], "load-kmods": [None], "user": ["1000:1000"], "debug": ["/tmp/log"]}
    assert rest == ["info"]
    opts, rest = argp_parse(["--compu", "--util", "--ldc=/usr/bin/true", "--dev", "0", "--no-cg", "/jail"],
                            CONFIGURE_OPTIONS, PROG, stop_at_command=False)
    assert opts == {"compute": [None], "utility": [None], "ldconfig": ["/usr/bin/true"], "device": ["0"],
                    "no-cgroups": [None]}
    assert rest == ["/jail"]
    opts, _ = argp_parse(["--device=1", "--compat32"], CONFIGURE_OPTIONS, PROG, stop_at_command=False)
    assert opts == {"device": ["1"], "compat32": [None]}
    with pytest.raises(Usage, match="ambiguous"):
        argp_parse(["--co", "/jail"], CONFIGURE_OPTIONS, PROG, stop_at_command=False)
    with pytest.raises(Usage, match="'--us' is ambiguous; possibilities: '--user' '--usage'"):
        argp_parse(["--us", "list"], GLOBAL_OPTIONS, PROG, stop_at_command=True)


def test_clustered_short_options():
    """CLI-1: `-cu` is `-c -u`; an option with an argument takes the rest of the cluster (`-l/usr/bin/true`)
    or the next word; an optional argument (`-u`) only the rest of the cluster."""
    opts, rest = argp_parse(["-cul/usr/bin/true", "-d", "0", "-d1", "/jail"], CONFIGURE_OPTIONS, PROG,
                            stop_at_command=False)
    assert opts == {"compute": [None], "utility": [None], "ldconfig": ["/usr/bin/true"], "device": ["0", "1"]}
    assert rest == ["/jail"]
    opts, rest = argp_parse(["-nku1000:1000", "-dFILE", "list"], GLOBAL_OPTIONS, PROG, stop_at_command=True)
    assert opts == {"no-pivot": [None], "load-kmods": [None], "user": ["1000:1000"], "debug": ["FILE"]}
    assert rest == ["list"]
    opts, _ = argp_parse(["-bli"], LIST_OPTIONS, PROG, stop_at_command=False)
    assert opts == {"binaries": [None], "libraries": [None], "ipcs": [None]}


def test_subcommand_options_are_permuted_and_double_dash_ends_them():
    """CLI-1: the subcommand parse permutes (options after ROOTFS still count); `--` ends options."""
    opts, rest = argp_parse(["/jail", "--compute"], CONFIGURE_OPTIONS, PROG, stop_at_command=False)
    assert opts == {"compute": [None]} and rest == ["/jail"]
    opts, rest = argp_parse(["--utility", "--", "--compute"], CONFIGURE_OPTIONS, PROG, stop_at_command=False)
    assert opts == {"utility": [None]} and rest == ["--compute"]
