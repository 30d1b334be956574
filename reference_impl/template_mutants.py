"""Template mutants: realistic mistakes a vendor could make in reference_impl/example.sh.

How this works
--------------
Vendors copy the shell template and change it, so the suite must catch the mistakes they are
likely to make in shell, not only those `reference`'s Python mutants (reference_impl/mutants.py)
model. Each entry of `MUTANTS` is (the mistake in one line, its edits); an edit is an (old, new)
pair of exact text. `script(NAME)` reads the *current* example.sh and applies every edit of NAME
to it, each of which must match exactly once: when the template changes under an edit (its old
text gone, or now ambiguous), that is a `TemplateEditError` naming the mutant and the edit, never a
silently unchanged script, which would "survive" for the wrong reason. So the catalogue follows the
template as it changes, and tells when it stops doing so.

`gpujail killmatrix --template` writes each mutant to a scratch directory and runs it through the
suites as `--impl "sh DIR/NAME.sh"`, against the baseline `example-shell` (conformance/killmatrix.py).

The catalogue: the Python mutants' mistakes as they look in shell (no lock, no re-check, 0-byte or
big markers, cleanup on failure, verify by a weaker test, configure's status lost, ...) and
mistakes particular to shell (a variable set in a piped `while` loop is set in a subshell and lost,
`set -e` ignored in a function called on the left of `||` and for a command substitution inside
another command's arguments, an unquoted path split at its spaces, `test -f` following symlinks).
"""
from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "example.sh"

# The CLI call's continuation line (see example.sh REF-6), shared by two edits below.
_CONFIGURE_TAIL = '--device=all $caps "$JAIL" 2>&1 >/dev/null) || die 4'
# big-markers' text: with its newline 74 bytes, over REF-9's 64.
_BIG = "nvidia placeholder: nvidia-container-cli bind-mounts the driver file here"

MUTANTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    # -- the lock (REF-5) ---------------------------------------------------------------------
    "no-lock": ("markers created without the cross-node lock (the flock line left out)", (
        ('    flock -w "$TIMEOUT" 9 || die 3', '    true || die 3'),
    )),
    "unbounded-lock-wait": ("`flock` without `-w`: waits for the lock forever (GPUJAIL_LOCK_TIMEOUT ignored)", (
        ('flock -w "$TIMEOUT" 9 ||', 'flock 9 ||'),
    )),
    "lock-on-warm-start": ("the placeholder lock taken on every start, warm ones too (REF-4)", (
        ('if [ -n "$todo" ]; then', 'if true; then'),
    )),
    "no-recheck": ("under the lock, the list made before it trusted: every target seen missing is written, "
                   "an earlier holder's markers included", (
        ('        needs_marker "$JAIL/$rel" || stale_link "$rel" || continue\n', ''),
        ('            needs_marker "$f" || return 0           # another node\'s marker (or a directory): accepted\n',
         ''),
    )),
    # -- the markers (REF-3, REF-5) -----------------------------------------------------------
    "zero-byte-placeholders": ("placeholders created empty (`: > file`, as `touch`), never written: "
                               "a failing CLI's cleanup eats them", (
        ("      printf 'nvidia-placeholder-marker\\n' >&3 || exit 2 )", "      : )"),
    )),
    "big-markers": ("a chatty marker of 64 bytes or more: no longer a placeholder by REF-9's size bound", (
        ("printf 'nvidia-placeholder-marker\\n' | dd", f"printf '{_BIG}\\n' | dd"),
        ("printf 'nvidia-placeholder-marker\\n' >&3", f"printf '{_BIG}\\n' >&3"),
    )),
    "markers-mode-0644": ("markers left at 0644 instead of the host file's mode: the CLI's exact-mode check "
                          "then creates again (CLI-4)", (
        ('mode=${modes%%" $host$NL"*}; mode=${mode##*"$NL"}', 'mode=644'),
    )),
    "rm-old-placeholder": ("an old 0-byte placeholder removed with `rm -f` and created anew instead of filled "
                           "in place: other nodes' mounts on it are detached (REF-3, K-1)", (
        ('write_marker "$f" && [ -s "$f" ] || die 8 "cannot write the marker into the 0-byte placeholder',
         'rm -f -- "$f"; continue; die 8 "cannot write the marker into the 0-byte placeholder'),
    )),
    # -- the CLI and what it leaves (REF-6, CLI-6) --------------------------------------------
    "cleanup-on-failure": ("after a failed configure, the small lib*.so.* placeholders removed to 'leave the jail "
                           "clean': other workers' mounts on them are detached", (
        ('# shellcheck disable=SC2086  # $caps is a list of flags\n',
         'cleanup() {\n'
         '    for p in "$JAIL/$LIBDIR"/lib*.so.*; do\n'
         '        [ -f "$p" ] && [ ! -L "$p" ] && [ "$(stat -c %s -- "$p")" -lt 64 ] && rm -f -- "$p"\n'
         '    done\n'
         '    return 1\n'
         '}\n'
         '# shellcheck disable=SC2086  # $caps is a list of flags\n'),
        (_CONFIGURE_TAIL, '--device=all $caps "$JAIL" 2>&1 >/dev/null) || cleanup || die 4'),
    )),
    "retry-in-process": ("a failing configure retried in-process (3 tries) instead of failing the start", (
        ('# shellcheck disable=SC2086  # $caps is a list of flags\n',
         'retry() { "$@" || "$@" || "$@"; }\n# shellcheck disable=SC2086  # $caps is a list of flags\n'),
        ('err=$("$CLI" --user', 'err=$(retry "$CLI" --user'),
    )),
    "status-lost-in-substitution": ("configure run inside `echo \"...$(configure)\"`: `set -e` never sees its "
                                    "status, a failing CLI goes on to verification", (
        ('err=$("$CLI" --user', 'echo "$ME: configure says: $("$CLI" --user'),
        (_CONFIGURE_TAIL, '--device=all $caps "$JAIL" 2>&1 >/dev/null)" >&2 || die 4'),
    )),
    # -- verification (REF-7) -----------------------------------------------------------------
    "nonempty-is-enough": ("`[ -s ]` where a size bound is needed: a 26-byte marker passes as a mount", (
        ('[ "$size" -gt 1024 ] || die 5 "$point: $size bytes through the jail',
         '[ -s "$point" ] || die 5 "$point: $size bytes through the jail'),
    )),
    "exit-code-only": ("configure's exit code 0 taken as proof: its mounts never looked at", (
        ('[ -n "$new" ] || die 5', '[ -n "$new" ] || true'),
        ('[ -z "$gone" ] || die 5', '[ -z "$gone" ] || true'),
        ('    [ -e "$point" ] || die 5', '    continue; [ -e "$point" ] || die 5'),
    )),
    "flag-lost-in-piped-while": ("a placeholder-sized mount remembered in a variable set inside `... | while "
                                 "read`: the loop is a subshell, the variable is lost, the check after it passes", (
        ('[ "$size" -gt 1024 ] || die 5 "$point: $size bytes through the jail, expected the driver file '
         '(> 1024 bytes): a placeholder, not a mount"',
         '[ "$size" -gt 1024 ] || bad=$point'),
        ("\n# REF-12: this node's own library over each soname placeholder whose library the CLI mounted,",
         '\n[ -z "${bad:-}" ] || die 5 "$bad: placeholder-sized, not a mount"'
         "\n# REF-12: this node's own library over each soname placeholder whose library the CLI mounted,"),
    )),
    # -- shell itself -------------------------------------------------------------------------
    "set-e-off-in-or-chain": ("`create_markers ... || echo warning`: on the left of `||` a function runs with "
                              "`set -e` off and its failure is only a warning; the CLI then makes 0-byte "
                              "placeholders", (
        ('    create_markers "$todo"\n',
         '    create_markers "$todo" || echo "$ME: some markers were not created, the CLI will create them" >&2\n'),
    )),
    "unquoted-jail": ("the jail path unquoted: a path with spaces is split into words", (
        ('JAIL=$(cd -P -- "${GPUJAIL_JAIL:-$PWD}" && pwd -P)', 'JAIL=$(cd -P -- ${GPUJAIL_JAIL:-$PWD} && pwd -P)'),
    )),
    "dummy-follows-symlinks": ("CPU workers' placeholder test `[ -f ]` without `[ ! -L ]`: `test -f` follows "
                               "symlinks, a short soname link gets the dummy bound over its real library (REF-9)", (
        ('[ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %s -- "$f")" -lt 64 ] || continue',
         '[ -f "$f" ] && [ "$(stat -c %s -- "$f")" -lt 64 ] || continue'),
    )),
    # -- mount propagation --------------------------------------------------------------------
    "private-not-recursive": ("`mount --make-private` on the jail instead of `--make-rprivate`: the mounts under it "
                              "keep the host's propagation, so on a shared host mount every bind mount reaches the "
                              "other nodes", (
        ('    mount --make-rprivate -- "$JAIL" 2>/dev/null && return 0',
         '    mount --make-private -- "$JAIL" 2>/dev/null && return 0'),
    )),
    "holder-only-private": ("a jail that is no mount point: only the mount holding it made private, not the mounts "
                            "under the jail, which keep the host's propagation", (
        ('    for point in $(mounts_under_jail); do\n', '    for point in; do\n'),
    )),
}


class TemplateEditError(ValueError):
    """An edit of a template mutant that no longer applies to example.sh as it is."""


def script(name: str, template: str | None = None) -> str:
    """Mutant `name` of the template text (default: the current example.sh). KeyError for an
    unknown name; TemplateEditError when an edit does not match exactly once."""
    if name not in MUTANTS:
        raise KeyError(f"unknown template mutant {name!r}; known: {', '.join(MUTANTS)}")
    text = TEMPLATE.read_text() if template is None else template
    for i, (old, new) in enumerate(MUTANTS[name][1], 1):
        found = text.count(old)
        if found != 1:
            raise TemplateEditError(
                f"template mutant {name}: edit {i} of {len(MUTANTS[name][1])} expects its text exactly once in "
                f"{TEMPLATE.name}, found it {found} times (did the template change?): {old.strip()[:80]!r}")
        text = text.replace(old, new)
    return text


def write(names: list[str], directory: Path) -> dict[str, Path]:
    """Each named mutant written as DIRECTORY/NAME.sh; every edit is checked before anything is written."""
    texts = {name: script(name) for name in names}
    paths = {}
    for name, text in texts.items():
        paths[name] = directory / f"{name}.sh"
        paths[name].write_text(text)
    return paths
