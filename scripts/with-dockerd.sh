#!/usr/bin/env bash
# Run a command with a Docker Engine available, for the docker backend's tests:
#   scripts/with-dockerd.sh pytest conformance --backend docker
# If an engine already answers (DOCKER_HOST or /var/run/docker.sock), the command just runs.
# Otherwise, as root, installs Debian's docker.io when dockerd is missing, starts
# `dockerd --iptables=false --bridge=none` (no network needed: workers run with --network none),
# waits until it answers, runs the command, and on exit (also on failure or Ctrl-C) stops that
# daemon by its process id and waits for it. Without root or dockerd the command runs without an
# engine, and the docker tests skip with the reason.
set -uo pipefail

engine_up() { python3 -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }

if engine_up; then
    "$@"
    exit $?
fi
if [ "$(id -u)" != 0 ]; then
    echo "with-dockerd: no Docker Engine answers and not root: running without one" >&2
    "$@"
    exit $?
fi
if ! command -v dockerd >/dev/null && command -v apt-get >/dev/null; then
    echo "with-dockerd: installing docker.io" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io; } >/dev/null 2>&1 ||
        echo "with-dockerd: could not install docker.io" >&2
fi
if ! command -v dockerd >/dev/null; then
    echo "with-dockerd: no dockerd on this host: running without an engine" >&2
    "$@"
    exit $?
fi

state=$(mktemp -d /tmp/gpujail-dockerd.XXXXXX)
dockerd --iptables=false --bridge=none --pidfile "$state/dockerd.pid" >"$state/dockerd.log" 2>&1 &
daemon=$!
# shellcheck disable=SC2329  # invoked by the trap
stop() {
    kill -TERM "$daemon" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
    rm -rf "$state"
}
trap stop EXIT
trap 'exit 130' INT TERM

for _ in $(seq 300); do
    engine_up && break
    if ! kill -0 "$daemon" 2>/dev/null; then
        echo "with-dockerd: dockerd exited at start-up; its log:" >&2
        tail -n 20 "$state/dockerd.log" >&2
        break
    fi
    sleep 0.1
done
engine_up || echo "with-dockerd: dockerd did not answer within 30 s: the docker tests will skip" >&2
"$@"
