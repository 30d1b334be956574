#!/bin/sh
# example.sh: the fixed procedure of SPEC section 4 (REF-1..REF-12) in POSIX sh, as a template for
# runtime vendors. Contract (CONTRACT.md): run once per worker start, inside the worker's mount
# namespace, cwd = the jail, with GPUJAIL_JAIL, GPUJAIL_NODE, GPUJAIL_ROLE and
# NVIDIA_DRIVER_CAPABILITIES set. Exit 0 = this worker's GPU files are ready; non-zero = restart me.
#
# How this works: `nvidia-container-cli list` gives the file set; each file maps to where the CLI
# will mount it in the jail; missing targets get a small non-empty marker with the host file's mode,
# created under an flock on the shared jail (re-checked under the lock). The CLI then creates
# nothing, and its failure cleanup (which deletes only 0-byte files) cannot hurt other workers. We
# verify the CLI's mounts by size instead of trusting its exit code.
#
# REF-11 in shell: every write happens after `cd -P` into the target directory and a check that its
# physical path ($PWD after `cd -P`) is inside the jail; the file is then created by a relative name
# with noclobber (O_EXCL), so a symlink out of the jail is refused. (A C or Python implementation
# should use openat2 with RESOLVE_IN_ROOT instead; see reference_impl/core.py.)
set -eu
umask 022   # a marker is created 0644, the mode of most host libraries: only other modes need a chmod

JAIL=$(cd -P -- "${GPUJAIL_JAIL:-$PWD}" && pwd -P)
CLI=nvidia-container-cli
TIMEOUT=${GPUJAIL_LOCK_TIMEOUT:-120}
# The CLI's library directories (SPEC CLI-3): Debian layout only if the jail says it is Debian.
if [ -e "$JAIL/etc/debian_version" ]; then
    LIBDIR=usr/lib/x86_64-linux-gnu LIB32DIR=usr/lib/i386-linux-gnu
else
    LIBDIR=usr/lib64 LIB32DIR=usr/lib
fi
FLAG=etc/gpu_libs_installed.flag
ME=example-shell
NL='
'   # a newline: `case "$NL$lines$NL" in *"$NL$line$NL"*)` finds a line without running grep

die() { # die CODE MESSAGE: one line on stderr, exit codes as reference_impl/core.py EXIT
    printf '%s: %s\n' "$ME" "$2" >&2
    exit "$1"
}

# mountinfo octal-escapes spaces in mount points (\040): compare against the escaped jail path.
case $JAIL in   # (sed only for a jail path with a space: a program less in every start)
    *' '*) JAIL_ESCAPED=$(printf '%s/' "$JAIL" | sed 's/ /\\040/g') ;;
    *) JAIL_ESCAPED=$JAIL/ ;;
esac
# (Passed through the environment: awk -v would turn \040 back into a space.)
mounts_under_jail() { J=$JAIL_ESCAPED awk 'index($5, ENVIRON["J"]) == 1 { print $1 " " $5 }' /proc/self/mountinfo; }

# Before the first mount: the jail's mounts private in this namespace. On a host whose jail mount is
# shared (systemd makes / shared; a Kubernetes Bidirectional volume is rshared) this namespace is a
# peer of the host's and of every other node's: each bind mount of this start would land in all of
# them, each cleanup unmount detach their copies, and the mounts outlive this node in the host's.
# The jail is usually a mount point: one recursive call covers everything under it. Else the mount
# holding it, alone (the mounts beside the jail keep their propagation), then each mount under it.
make_private() {
    mount --make-rprivate -- "$JAIL" 2>/dev/null && return 0
    holder=$(findmnt -n -f -o TARGET -T "$JAIL") || die 7 "cannot find the mount holding the jail $JAIL"
    mount --make-private -- "$holder" || die 7 "cannot make the mount holding the jail $JAIL ($holder) private"
    old_ifs=$IFS; IFS=$NL
    for point in $(mounts_under_jail); do
        point=$(printf '%b' "${point#* }")    # mountinfo's \040 back to a space
        mount --make-rprivate -- "$point" 2>/dev/null || ! mountpoint -q -- "$point" ||   # hidden under a later mount: unreachable
            die 7 "cannot make the mount $point under the jail private in this namespace"
    done
    IFS=$old_ifs
}

case $TIMEOUT in   # flock -w takes a finite number of seconds; anything else is bad input, said once
    ''|.|*[!0-9.]*|*.*.*) die 2 "GPUJAIL_LOCK_TIMEOUT: not a finite number of seconds: '$TIMEOUT'" ;;
esac
case "${GPUJAIL_ROLE:-gpu-worker}" in
    gpu-worker|cpu-worker|login) ;;
    *) die 2 "GPUJAIL_ROLE: unknown role '${GPUJAIL_ROLE}' (expected gpu-worker, cpu-worker or login)" ;;
esac

# enter_dir REL [create]: cd into JAIL/REL (creating missing components 0755 when asked), refusing
# any component that resolves outside the jail.
enter_dir() {
    cd -P -- "$JAIL" || return 1
    old_ifs=$IFS; IFS=/
    for part in $1; do
        IFS=$old_ifs
        [ -n "$part" ] || continue
        if [ ! -e "$part" ] && [ "${2:-}" = create ]; then
            mkdir -m 0755 -- "$part" 2>/dev/null || [ -d "$part" ] ||
                die 8 "cannot create directory $PWD/$part"
        fi
        cd -P -- "$part" 2>/dev/null || return 1
        case "$PWD/" in   # (after `cd -P`, $PWD is what `pwd -P` prints, without a subshell: POSIX)
            "$JAIL"/*) ;;
            *) die 7 "$1: component $part resolves to $PWD, outside the jail $JAIL" ;;
        esac
    done
    IFS=$old_ifs
}

# REF-9: CPU workers and login nodes. Once the GPU flag exists, bind a loadable dummy library over
# each placeholder (a regular file, not a symlink, named lib*.so.*, under 64 bytes) in the jail's
# library directories, in this namespace only, so programs linked against NVIDIA libraries start.
# The dummy is a copy of a small real library of this node, kept on node-local /run.
dummy_mounts() {
    [ -e "$JAIL/$FLAG" ] || exit 0                 # no GPU worker is ready yet: nothing to cover
    dummy=/run/gpujail/libdummy.so
    if [ ! -f "$dummy" ]; then
        src=$(find -L /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 -maxdepth 1 -type f \
                -name 'lib*.so.*' -size +2k -size -200k 2>/dev/null | sort | head -n 1)
        [ -n "$src" ] || die 2 "no small real library on this node to make the dummy library from"
        if ! { mkdir -p /run/gpujail && cp -- "$src" "$dummy.tmp" && mv -- "$dummy.tmp" "$dummy"; }; then
            die 8 "cannot make the dummy library $dummy"
        fi
    fi
    for d in usr/lib/x86_64-linux-gnu usr/lib/i386-linux-gnu usr/lib64 usr/lib; do
        [ -d "$JAIL/$d" ] && [ ! -L "$JAIL/$d" ] || continue
        ( enter_dir "$d" || exit 0
          for f in lib*.so.*; do
              [ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %s -- "$f")" -lt 64 ] || continue
              if ! mount --bind -o ro,nodev,nosuid -- "$dummy" "$PWD/$f"; then
                  [ -e "$f" ] || continue              # removed meanwhile: fine
                  die 8 "cannot mount the dummy library over $JAIL/$d/$f"
              fi
          done )
    done
    exit 0
}

# target HOSTPATH: sets $rel, the jail-relative path the CLI mounts HOSTPATH at (SPEC CLI-3, REF-2).
# Whether a library is 32-bit follows the CLI, from `list`'s sections: `list --libraries` prints the
# 64-bit ones only ($lib64, below), so a listed library not among them is 32-bit. Never the
# directory's name: /usr/lib holds 64-bit libraries on Arch, 32-bit ones on RHEL. (A variable, not
# output: `$(target ...)` would fork a subshell for every listed file, most of a warm start's cost.)
target() {
    base=${1##*/}
    case "$1" in
        */lib*.so*) case "$NL$lib64$NL" in *"$NL$1$NL"*) rel=$LIBDIR/$base ;; *) rel=$LIB32DIR/$base ;; esac ;;
        */bin/*|*/sbin/*) rel=usr/bin/$base ;;
        *) rel=${1#/} ;;
    esac
}

case "${GPUJAIL_ROLE:-gpu-worker}" in cpu-worker|login) make_private; dummy_mounts ;; esac

# REF-1: the file set.
if ! list=$("$CLI" list 2>/dev/null); then    # on failure, run it again for its error line
    die 2 "\`$CLI list\` failed: $("$CLI" list 2>&1 >/dev/null | tail -n 1)"
fi
[ -n "$list" ] || die 2 "\`$CLI list\` printed no files: is the driver installed?"
lib64=$("$CLI" list --libraries 2>/dev/null) || die 2 "\`$CLI list --libraries\` failed"
# Where the CLI mounts each listed file, worked out once: "HOST<TAB>REL" pairs (REL in the jail).
files=$(printf '%s\n' "$list" | while IFS= read -r host; do
    [ -n "$host" ] || continue
    case "$host" in /*) ;; *) die 2 "\`$CLI list\`: not an absolute path: $host" ;; esac
    target "$host"
    printf '%s\t%s\n' "$host" "$rel"
done)

# REF-11: the CLI resolves targets on the host (following symlinks), so refuse a jail where any
# target resolves outside it (an absolute or `..` symlink), before anything runs. One realpath call.
outside=$(printf '%s\n' "$files" | while IFS='	' read -r host rel; do
    printf '%s/%s\n' "$JAIL" "$rel"
done | xargs -d '\n' realpath -m -- | grep -v -m 1 -e "^$JAIL/" -e "^$JAIL\$") || true
[ -z "$outside" ] || die 7 "a target resolves to $outside, outside the jail $JAIL: refusing (the CLI would follow it)"

# REF-3: a target needs a marker when it is missing or an old 0-byte placeholder (a regular file
# of size 0: a jail brought up before the fix, or by another tool).
needs_marker() { [ ! -e "$1" ] || { [ -f "$1" ] && [ ! -s "$1" ]; }; }

# REF-3: which targets are missing (node-local /dev and /run entries exist, so they are skipped).
# Prints "HOST<TAB>REL" pairs.
missing() {
    printf '%s\n' "$pairs" | while IFS='	' read -r host rel; do
        [ -n "$host" ] || continue
        if needs_marker "$JAIL/$rel" || stale_link "$rel"; then
            printf '%s\t%s\n' "$host" "$rel"
        fi
    done
}

# A test hook: the suite's failpoints (`gpujail failpoints`), inert unless GPUJAIL_FAILPOINTS arms
# NAME or a run is scheduled (`--schedule`); then `gpujail-failpoint` (on PATH beside the fake CLI)
# may hold, pause, fail or kill this shell; its exit 3 says that no later hit of NAME can act.
# A vendor script may keep it to let the suite time its races, or drop it.
failpoint() { # failpoint NAME PATH (each NAME's hits counted per process, as in the suite's own code)
    [ -n "${GPUJAIL_SCHEDULER:-}" ] ||   # under --schedule every failpoint is a scheduling point
        case ";${GPUJAIL_FAILPOINTS:-}" in *";$1="*) ;; *) return 0 ;; esac
    case " ${fp_spent:-} " in *" $1 "*) return 0 ;; esac   # (a helper is a Python start per marker)
    fp_count=fp_hits_${1#ref.before_}    # this name's counter: fp_hits_marker, _configure, _verify
    eval "fp_hit=\${$fp_count:-0}"
    fp_hit=$((fp_hit + 1))
    eval "$fp_count=$fp_hit"
    gpujail-failpoint "$1" "$fp_hit" "$2" || case $? in
        3) fp_spent="${fp_spent:-} $1" ;;
        *) die 8 "failpoint $1 at $JAIL/$2: injected error" ;;
    esac
}

# REF-5: the marker for one target, in the current directory (`enter_dir` made it the target's):
# created exclusively (noclobber: O_EXCL), or written into an old 0-byte placeholder in place (dd:
# no O_CREAT, no O_TRUNC, not through a symlink), never unlinked or renamed: other nodes may have
# live mounts on that inode. A lock that did not serialise us with another node (node-local locks,
# a lost lease on a network filesystem) lets that node create the target between our check and our
# create: then the create fails, and the target is checked again as REF-3 does, never removed.
write_marker() { printf 'nvidia-placeholder-marker\n' | dd of="$1" conv=notrunc,nocreat oflag=nofollow status=none 2>/dev/null; }
# Our own marker: created exclusively (noclobber: O_EXCL, never through a symlink) and written
# through that one descriptor, in one subshell (no dd: a cold start writes dozens of markers). Exit
# 0: written; 1: not created (it exists, or a read-only jail); 2: created, but the write failed
# (a full jail). (`command` keeps a failed redirection from ending the subshell with its own code.)
create_marker() {
    ( set -C
      command exec 2>/dev/null 3>"$1" || exit 1
      printf 'nvidia-placeholder-marker\n' >&3 || exit 2 )
}
place_marker() { # place_marker REL MODE
    f=./${1##*/}
    for _ in 1 2 3; do
        if kept_link "$1"; then
            return 0
        elif stale_link "$1"; then
            # REF-12: a soname link to another driver's library becomes a marker. A symlink carries
            # no mount (every implementation of REF-12 replaces it under this lock before mounting).
            rm -f -- "$f" || die 8 "cannot remove the soname link $JAIL/$1"
        elif [ -e "$f" ] || [ -L "$f" ]; then
            needs_marker "$f" || return 0           # another node's marker (or a directory): accepted
            write_marker "$f" && [ -s "$f" ] || die 8 "cannot write the marker into the 0-byte placeholder $JAIL/$1"
            chmod "$2" -- "$f" || die 8 "cannot chmod marker $JAIL/$1"
            return 0
        fi
        failpoint ref.before_marker "$1"
        if create_marker "$f"; then
            [ "$2" = 644 ] || chmod "$2" -- "$f" || die 8 "cannot chmod marker $JAIL/$1"
            return 0
        elif [ $? = 2 ]; then
            # Ours (O_EXCL): never leave it truncated, an empty file is what a failing CLI deletes
            # from under other workers' mounts (unless another node filled it meanwhile).
            [ "$(stat -c %s -- "$f" 2>/dev/null || echo 26)" -ge 26 ] || rm -f -- "$f"
            die 8 "cannot write marker $JAIL/$1: full jail"
        fi
        [ -e "$f" ] || [ -L "$f" ] || die 8 "cannot create marker $JAIL/$1: read-only or full jail"
    done
    die 8 "cannot create marker $JAIL/$1: it appeared and went 3 times under the lock (do other nodes' locks serialise with ours?)"
}

# REF-5: markers for what is still missing, under the lock (re-checked: an earlier holder may have
# created them).
create_markers() {
    # each host file's mode, "MODE HOST" lines, read by one stat (not one per file)
    modes=$NL$(printf '%s\n' "$1" | cut -f1 | xargs -r -d '\n' stat -L -c '%a %n' -- 2>/dev/null)$NL || true
    printf '%s\n' "$1" | while IFS='	' read -r host rel; do
        [ -n "$host" ] || continue
        needs_marker "$JAIL/$rel" || stale_link "$rel" || continue
        case "$modes" in *" $host$NL"*) ;; *) die 2 "listed host file $host does not exist" ;; esac
        mode=${modes%%" $host$NL"*}; mode=${mode##*"$NL"}   # the line before " HOST": its mode
        if [ -d "$host" ]; then                     # REF-3: the MPS pipe directory gets a directory,
            enter_dir "$rel" create || die 7 "cannot enter $JAIL/$rel"
            # holding a marker: a failing CLI's cleanup removes an *empty* directory it mounted over
            # (CLI-6), and with it every other node's mount on it (K-1); rmdir meets ENOTEMPTY.
            needs_marker ./.nvidia-placeholder-marker && place_marker "$rel/.nvidia-placeholder-marker" 644
            continue
        fi
        enter_dir "${rel%/*}" create || die 7 "cannot enter $JAIL/${rel%/*}"
        place_marker "$rel" "$mode"
    done
}

# REF-12: per-node sonames. The jail's soname links and ld.so.cache are shared by every node, so a
# link can name one driver version only and whoever runs ldconfig last picks it. Instead each
# soname (libnvidia-ml.so.1, libcuda.so.1, ...) is a placeholder too, and every node bind-mounts
# its own library over it in its own namespace; ldconfig never turns a regular file into a link.
# The sonames come from ldconfig itself: `ldconfig -n` on a node-local scratch directory of
# symlinks to the host libraries makes one soname link per library there.
SODIR=$(mktemp -d /run/gpujail-sonames.XXXXXX) || die 8 "cannot make a scratch directory in /run"
trap 'rm -rf -- "$SODIR"' EXIT
mkdir -p -- "$SODIR/$LIBDIR" "$SODIR/$LIB32DIR"
for dir in "$LIBDIR" "$LIB32DIR"; do               # where target() puts every library
    printf '%s\n' "$files" | while IFS='	' read -r host rel; do
        case "$rel" in "$dir"/lib*.so.*) printf '%s\n' "$host" ;; esac
    done | xargs -r -d '\n' ln -s -t "$SODIR/$dir" --
done
# Then every link there, "DIR<TAB>NAME<TAB>TARGET": a library's link leads to its host path (absolute),
# a soname link ldconfig made to a library's name (relative). Printed: "HOST<TAB>REL" per soname.
sonames=$(cd "$SODIR" && { ldconfig -n "$SODIR/$LIBDIR" "$SODIR/$LIB32DIR" 2>/dev/null || true; } &&
    find . -type l -printf '%h\t%f\t%l\n' | sort | awk -F'\t' '
        $3 ~ /^\// { host[$1 "/" $2] = $3; next }
        { soname[++n] = $1 "/" $2; library[n] = $1 "/" $3 }
        END { for (i = 1; i <= n; i++) if (library[i] in host) print host[library[i]] "\t" substr(soname[i], 3) }')
is_soname() { case "$sonames$NL" in *"	$1$NL"*) return 0 ;; esac; return 1; }   # a line's REL, after its tab
# A soname link that resolves to this node's own library (as ldconfig made it) is kept: once the CLI
# mounts that library it leads to our content, and workers that still run an older procedure keep
# their links. One that leads elsewhere (another driver's library) becomes a marker.
own_library() { printf '%s\n' "$sonames" | awk -F'\t' -v r="$1" '$2 == r { n = split($1, p, "/"); print p[n]; exit }'; }
kept_link() {
    [ -L "$JAIL/$1" ] && is_soname "$1" &&
        [ "$(realpath -m -- "$JAIL/$1")" = "$(realpath -m -- "$JAIL/${1%/*}/$(own_library "$1")")" ]
}
stale_link() { [ -L "$JAIL/$1" ] && is_soname "$1" && ! kept_link "$1"; }
pairs=$(printf '%s\n%s\n' "$files" "$sonames")

todo=$(missing)
if [ -n "$todo" ]; then                            # REF-4: warm path takes no lock
    enter_dir etc || die 7 "cannot enter $JAIL/etc"
    # A failed redirection on `exec` would end the shell with its own message: probe it first.
    ( : >>complement_jail_gpu_placeholders.lock ) 2>/dev/null ||
        die 8 "cannot open lock $JAIL/etc/complement_jail_gpu_placeholders.lock: read-only or full jail"
    exec 9>>complement_jail_gpu_placeholders.lock
    flock -w "$TIMEOUT" 9 || die 3 "lock $JAIL/etc/complement_jail_gpu_placeholders.lock not acquired within ${TIMEOUT}s"
    create_markers "$todo"
    exec 9>&-
fi
cd -P -- "$JAIL"

# REF-6: the CLI, once, with the caller's capabilities and ldconfig deferred.
make_private
before=$(mounts_under_jail)
caps=$(printf '%s\n' "${NVIDIA_DRIVER_CAPABILITIES:-compute,utility}" | tr ',' '\n' | while read -r c; do
    case "$c" in
        all) printf -- '--compute --utility --video --graphics --display --ngx ' ;;
        compute|compat32|display|graphics|utility|video|ngx) printf -- '--%s ' "$c" ;;
        '') ;;
        *) echo "BAD:$c" ;;
    esac
done)
case "$caps" in *BAD:*) die 2 "NVIDIA_DRIVER_CAPABILITIES: unknown capability in '$NVIDIA_DRIVER_CAPABILITIES'" ;; esac
# has CAP: configure acts on CAP (video brings compute, display brings graphics: options.h).
has() {
    case " $caps " in *" --$1 "*) return 0 ;; esac
    case $1 in compute) has video ;; graphics) has display ;; *) return 1 ;; esac
}
# selected HOSTPATH REL: configure mounts this `list` entry (at REL) for the capabilities asked
# (libnvidia-container's nvc_info.c lists; the suite's copy is fixtures/nvc_info.py).
selected() {
    case "$1" in
        /dev/nvidia[0-9]*|/dev/nvidiactl|*/firmware/*) return 0 ;;
        /dev/*uvm*) has compute; return ;;
        /dev/*) has display; return ;;
        /run/nvidia-persistenced/*|/run/nvidia-fabricmanager/*) has utility; return ;;
        /tmp/nvidia-mps) has compute; return ;;
    esac
    case "$2" in "$LIB32DIR"/*) has compat32 || return 1 ;; esac    # a 32-bit library (REF-2: target)
    case ${1##*/} in
        libnvidia-ml.so*|libnvidia-cfg.so*|libnvidia-nscq.so*|nvidia-smi|nvidia-debugdump|nvidia-persistenced|nv-fabricmanager)
            has utility ;;
        libcuda.so*|libcudadebugger.so*|libnvidia-opencl.so*|libnvidia-gpucomp.so*|libnvidia-ptxjitcompiler.so*|\
        libnvidia-fatbinaryloader.so*|libnvidia-allocator.so*|libnvidia-compiler.so*|libnvidia-pkcs11.so*|\
        libnvidia-pkcs11-openssl3.so*|libnvidia-nvvm.so*|nvidia-cuda-mps-control|nvidia-cuda-mps-server)
            has compute ;;
        libnvidia-ngx.so*) has ngx ;;
        libvdpau_nvidia.so*|libnvidia-encode.so*|libnvidia-opticalflow.so*|libnvcuvid.so*) has video ;;
        libnvidia-eglcore.so*|libnvidia-glcore.so*|libnvidia-tls.so*|libnvidia-glsi.so*|libnvidia-fbc.so*|\
        libnvidia-ifr.so*|libnvidia-rtcore.so*|libnvoptix.so*|libGLX_nvidia.so*|libEGL_nvidia.so*|\
        libGLESv2_nvidia.so*|libGLESv1_CM_nvidia.so*|libnvidia-glvkspirv.so*|libnvidia-cbl.so*)
            has graphics ;;
        *) return 1 ;;
    esac
}
failpoint ref.before_configure ""
# shellcheck disable=SC2086  # $caps is a list of flags
err=$("$CLI" --user --no-pivot configure --no-cgroups --cuda-compat-mode=disabled --ldconfig=/usr/bin/true \
    --device=all $caps "$JAIL" 2>&1 >/dev/null) || die 4 "\`$CLI configure\` failed: $(printf '%s\n' "$err" | tail -n 1)"

# REF-7: verify, do not trust: every file configure mounts for these capabilities attached (against
# what should be there: a mount detached meanwhile is simply gone from the table), and every new
# mount, for files, real content by size.
failpoint ref.before_verify ""
new=$(mounts_under_jail | while read -r id point; do
    case "$NL$before" in *"$NL$id "*) ;; *) printf '%b\n' "$point" ;; esac
done)
[ -n "$new" ] || die 5 "the CLI reported success but created no mounts under the jail"
gone=$(printf '%s\n' "$files" | while IFS='	' read -r host rel; do
           selected "$host" "$rel" && printf '%s/%s\n' "$JAIL" "$rel"
       done | xargs -r -d '\n' realpath -m -- |
       N=$new awk 'BEGIN { n = split(ENVIRON["N"], p, "\n"); for (i = 1; i <= n; i++) have[p[i]] = 1 }
                   !($0 in have) { print; exit }')
[ -z "$gone" ] || die 5 "$gone: not mounted after configure: detached meanwhile, or never mounted"
# sizes_of PATHS: each of the newline-separated PATHS' size (following links), read by one stat, not
# one per path; size_of PATH then sets $size from them (the line before " PATH"; empty if it was missing,
# which `[ "$size" -gt 1024 ]` refuses).
sizes_of() { sizes=$NL$(printf '%s\n' "$1" | xargs -r -d '\n' stat -L -c '%s %n' -- 2>/dev/null)$NL || true; }
size_of() { size=${sizes%%" $1$NL"*}; size=${size##*"$NL"}; }
sizes_of "$new"
printf '%s\n' "$new" | while IFS= read -r point; do
    [ -e "$point" ] || die 5 "$point: mount detached right after configure"
    if [ -f "$point" ]; then
        size_of "$point"
        [ "$size" -gt 1024 ] || die 5 "$point: $size bytes through the jail, expected the driver file (> 1024 bytes): a placeholder, not a mount"
    fi
done

# REF-12: this node's own library over each soname placeholder whose library the CLI mounted,
# read-only like the CLI's mounts (a kept link leads to the library the CLI just mounted), then real
# content by path (REF-7), all of them by one stat. Printed: the path of each soname checked.
# (`mount --bind -o ro,...` binds and then remounts read-only, one program for both: util-linux 2.27
# and later. An older mount(8) binds read-write, which the conformance suite's flag check reports.)
sonames_here=$(printf '%s\n' "$sonames" | while IFS='	' read -r host rel; do
    [ -n "$host" ] || continue
    dir=${rel%/*}
    case "$NL$new$NL" in *"$NL$JAIL/$dir/${host##*/}$NL"*) ;; *) continue ;; esac   # capability not asked for
    enter_dir "$dir" || die 7 "cannot enter $JAIL/$dir"
    f=${rel##*/}
    if ! kept_link "$rel"; then
        [ -f "$f" ] && [ ! -L "$f" ] || die 5 "$JAIL/$rel: the soname placeholder is not a regular file"
        if ! mount --bind -o ro,nodev,nosuid -- "$host" "$PWD/$f"; then
            die 5 "cannot mount $host over the soname $JAIL/$rel"
        fi
    fi
    printf '%s\n' "$PWD/$f"
done)
cd -P -- "$JAIL"
sizes_of "$sonames_here"
printf '%s\n' "$sonames_here" | while IFS= read -r point; do
    [ -n "$point" ] || continue
    size_of "$point"
    [ "$size" -gt 1024 ] || die 5 "$point: the soname shows $size bytes, expected its driver library (> 1024 bytes)"
done

# REF-8: libnvidia-ml.so.1 must resolve to real content when NVML was mounted.
soname_ok() { [ -f "$JAIL/$LIBDIR/libnvidia-ml.so.1" ] && [ "$(stat -L -c %s -- "$JAIL/$LIBDIR/libnvidia-ml.so.1")" -gt 1024 ]; }
if printf '%s\n' "$new" | grep -q '/libnvidia-ml\.so\.[0-9]*\.'; then
    if ! soname_ok; then
        enter_dir etc || die 7 "cannot enter $JAIL/etc"
        ( : >>complement_jail_ldconfig.lock ) 2>/dev/null || die 8 "cannot open $JAIL/etc/complement_jail_ldconfig.lock"
        exec 8>>complement_jail_ldconfig.lock
        flock -w "$TIMEOUT" 8 || die 3 "lock $JAIL/etc/complement_jail_ldconfig.lock not acquired within ${TIMEOUT}s"
        soname_ok || ldconfig -r "$JAIL" || die 6 "ldconfig -r $JAIL failed"
        exec 8>&-
        soname_ok || die 6 "$JAIL/$LIBDIR/libnvidia-ml.so.1 does not resolve to real content even after ldconfig"
    fi
fi

# REF-10: the done flag.
enter_dir etc || die 7 "cannot enter $JAIL/etc"
[ -e gpu_libs_installed.flag ] || ( : >> gpu_libs_installed.flag ) 2>/dev/null || die 8 "cannot touch $JAIL/$FLAG"
exit 0
