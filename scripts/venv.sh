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
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        fi
        python3 -m venv "$venv"
    }
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e "${top}[dev,docker]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$top"
