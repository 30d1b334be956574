# shellcheck shell=bash
# Sourced by ./run-tests and ./run-suites: a virtual environment in .venv with the project installed.
# Re-installs only when pyproject.toml (or this file) changed. Needs only python3 (and its venv module) on the host.
set -eu
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$top/.venv"
stamp="$venv/.installed-$(cat "$top/pyproject.toml" "$top/scripts/venv.sh" | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    python3 -m venv "$venv" 2>/dev/null || {
        # Debian's python3 may lack ensurepip: install python3-venv once.
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
        fi
        python3 -m venv "$venv"
    }
    # uv (from PyPI, installed by the venv's pip) installs the project and its ~75 dependencies:
    # 8 s of CPU with uv's cache, 17 s with none, where pip took 22 s (./run-tests runs this beside
    # apt's install, and both are CPU-bound).
    # The venv keeps its own pip: tests/test_install.py installs the package as a vendor would.
    # --compile-bytecode, as pip does: a process that may not write __pycache__ (an implementation's
    # start, under PYTHONDONTWRITEBYTECODE; uid 65534's venv in ./run-tests) would compile every
    # module it imports at each start (CI 106, without it: 1,292 s of machine CPU; CI 105, 107: 1,175, 1,196 s).
    # The installers' chatter goes to a log: the caller's output stays the short summary.
    echo "setting up $venv (first run, or pyproject.toml changed): about 10 s" >&2
    log="$venv/install.log"
    # (TMPDIR in the venv: uv leaves a uv-setuptools-HASH.lock in the temporary directory for every
    # build, which would outlive the run in the host's /tmp)
    mkdir -p "$venv/tmp"
    if ! { "$venv/bin/python" -m pip install -q uv && TMPDIR="$venv/tmp" "$venv/bin/uv" pip install -q --compile-bytecode \
        --python "$venv/bin/python" -e "${top}[dev,docker,kubernetes]"; } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        echo "setting up $venv failed (full log: $log)" >&2
        exit 1
    fi
    rm -rf "$venv"/.installed-* "$venv/tmp"
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
# The harness's bytecode, pytest's assertion-rewritten modules among it, cached in __pycache__ as
# Python does by default. An environment that says PYTHONDONTWRITEBYTECODE (container images often
# do, this CI's machines too) would have every pytest process compile the ~190 modules it imports
# again: pytest rewrites all of gpujail, its plugin's package (an empty `pytest -n 2` run: 7.2 s of
# CPU, against 2.6 s with the cache). An implementation never writes one: the contract's environment
# sets PYTHONDONTWRITEBYTECODE for every start (gpujail/backends/base.py).
unset PYTHONDONTWRITEBYTECODE
cd "$top"
