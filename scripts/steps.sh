# shellcheck shell=bash
# run-tests' steps, sourced by it: `step CMD...` runs one step and prints its wall and CPU time;
# `stop_step` stops the step that is running (for the traps of the shell that runs steps);
# `shared_steps CLAIMS NAME...` runs the calling script's `shared_step NAME` for each NAME that no
# other shell has claimed in the directory CLAIMS, in order.
#
# Each step runs as a process group of its own, in the background, and the shell waits for it:
# bash defers a trap until a foreground command ends, but a `wait` returns at once to run it. So a
# TERM to run-tests itself (a CI system stopping the job) stops it at once: its trap's cleanup
# sends TERM to the step's whole group (pytest tears its tests down on TERM) and to the daemon
# lane's, whose own trap does the same for its step, and waits for them: run-tests ends once its
# steps have torn down (pytest's teardown of its mounts and daemons: about 10 s). With the step in
# the foreground, run-tests waited for the step to end first (a self-test step: minutes), and a CI
# system that sends KILL after a short grace killed it before its cleanup could stop the daemons.
#
# CPU is user+sys of the step's reaped processes: the cutime+cstime, from /proc, of a subshell that
# runs only the step (a daemon that left the process tree is not counted). Not the calling shell's
# own: it also reaps the daemon lane, whose CPU then landed in whichever step was running when the
# lane ended (reference's read 247 s in 91 s of wall).
ticks=$(getconf CLK_TCK)
children_cpu() { local f; read -ra f <"/proc/$1/stat"; echo $(( (f[15] + f[16]) / ticks )); }
step_group=
step() {
    local t0=$SECONDS
    echo "== $*"
    set -m   # job control: the subshell below gets a process group of its own
    (   me=$BASHPID rc=0   # ($BASHPID inside the $(...) below would be that substitution's own)
        trap : TERM   # stop_step's TERM reaches the step too: this shell waits for its teardown
        "$@" || rc=$?
        echo "== $((SECONDS - t0)) s, CPU $(children_cpu "$me") s: $*"
        exit $rc
    ) &
    step_group=$!
    set +m
    # shellcheck disable=SC2034  # the calling script's status
    wait "$step_group" || status=1
    step_group=
}
stop_step() {
    if [ -n "$step_group" ]; then kill -TERM -- "-$step_group" 2>/dev/null || true; wait "$step_group" || true; fi
}

# Two lanes that call shared_steps with the same directory and list share the steps: each runs
# once, in the lane that comes to it first (mkdir is atomic: of two lanes, one creates the claim).
shared_steps() {
    local claims=$1 name
    shift
    for name in "$@"; do
        if mkdir "$claims/$name" 2>/dev/null; then shared_step "$name"; fi
    done
}
