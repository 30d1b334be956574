"""A forked child made to be the process a new interpreter would have been (the warm paths' one copy of it).

How this works
--------------
Each warm path (warm.py) forks a process that has imported the code already, instead of starting
a new Python interpreter: a node from the node factory (node_factory.py), a bundled implementation
from its node (warm.py), the fake CLI from the node's CLI server or from an implementation
(cli_server.py). The child must then run exactly what the new interpreter would have run, with the
same argv, environment, standard streams and exit status, or a start forked warm would differ from
one exec'd. `become(argv, env, main)` is that, once for all of them: the environment set to `env`
(only what differs), fresh standard streams on fds 0-2 as an interpreter opens them, `sys.argv`,
the process name, `main()` run with SystemExit and exceptions turned into an exit status as the
interpreter turns them, the streams flushed, and `os._exit`.

`stdio_to_pipes` gives a child just forked the standard streams Popen(stdin=DEVNULL, stdout=PIPE,
stderr=PIPE) gives an exec'd one, and `close_fds` closes descriptors that may be gone already.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME = 15


def become(argv: list[str], env: dict, main) -> None:
    """In a child just forked, with its fds 0-2 and cwd in place: be the process a new interpreter
    running `main` as `argv` with `env` would be (fresh standard streams, SystemExit's code, a
    traceback and 1 on an exception), flush, and _exit with the status. Never returns."""
    code = 1
    try:
        # Only what differs: clearing and refilling os.environ rewrites the C environment, whose
        # pages the child would copy (a third of a child's copy-on-write faults before its main)
        for key in [k for k in os.environ if k not in env]:
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        # An exec'd interpreter writes no bytecode under PYTHONDONTWRITEBYTECODE (a write outside the jail)
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        # Fresh streams, as a new interpreter has on pipes: stdout block-buffered, stderr by line.
        sys.stdin = _stream(0, "r")
        sys.stdout = _stream(1, "w")
        sys.stderr = _stream(2, "w", errors="backslashreplace", buffering=1)
        sys.argv = list(argv)
        # the name ps, pgrep and /proc/PID/comm show, as exec gives it: the program's base name
        _libc.prctl(PR_SET_NAME, os.path.basename(argv[0]).encode()[:15], 0, 0, 0)
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:   # as the interpreter does: the traceback on stderr, exit 1
            import traceback
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    except BaseException:   # the child's own set-up failed: say why where its stderr goes
        import traceback
        traceback.print_exc()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def _stream(fd: int, mode: str, **kw):
    try:
        os.fstat(fd)
    except OSError:
        return None   # a closed standard stream is None, as in a new interpreter
    return open(fd, mode, encoding="utf-8", closefd=False, **kw)


def stdio_to_pipes(out_w: int, err_w: int) -> None:
    """In a child just forked: stdin /dev/null, stdout and stderr the given pipes' write ends, as
    Popen(stdin=DEVNULL, stdout=PIPE, stderr=PIPE) gives them."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out_w, 1), (err_w, 2)):
        os.dup2(fd, target)
    os.close(null)


def close_fds(*fds) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
