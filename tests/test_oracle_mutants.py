"""The oracle kill matrix's own tests (tests/oracle_mutants.py, scripts/oracle-killmatrix).

How this works
--------------
The full matrix (every mutant against every oracle self-test, about 3 minutes on 2 cores) is run on
demand: `scripts/oracle-killmatrix`, its last table in docs/oracle-kill-matrix.md. Here, in the normal
suite: every mutant of the catalogue still applies (its target exists, it changes what the code
sees, and it comes off again), a missing target is an error that names the mutant, a function mutant
reaches every place that holds the function, and one real kill run (a fresh pytest with the plugin,
a few seconds) kills its mutant with the test written for it.
"""
from __future__ import annotations

import oracle_mutants
import pytest
from oracle_mutants import MUTANTS, Mutant, MutantError, apply, kill_run, resolve


@pytest.mark.parametrize("name", list(MUTANTS))
def test_every_mutant_applies_and_comes_off(name):
    m = MUTANTS[name]
    _, _, original = resolve(m)
    mp = pytest.MonkeyPatch()
    try:
        assert apply(name, mp) >= 1, f"mutant {name} found no place holding {m.target}"
        assert resolve(m)[2] is not original and resolve(m)[2] != original, f"mutant {name} changed nothing"
    finally:
        mp.undo()
    assert resolve(m)[2] is original


def test_a_mutant_whose_target_is_gone_is_an_error_naming_it(monkeypatch):
    for target in ("gpujail.chaos.checkers.content:no_such_function", "gpujail.chaos.no_such_module:check"):
        monkeypatch.setitem(MUTANTS, "stale", Mutant("stale", target, "a renamed function", "SPEC 6", lambda f: f))
        with pytest.raises(MutantError, match=f"oracle mutant stale: its target {target} no longer exists"):
            apply("stale", pytest.MonkeyPatch())
    with pytest.raises(MutantError, match="no oracle mutant 'nosuch'"):
        apply("nosuch", pytest.MonkeyPatch())


def test_a_function_mutant_reaches_every_binding():
    """`from .queries import is_bad` in content.py and checker.py, and the registries holding a
    checker (checker.CHECKERS, checkers.BUILTIN), all see the mutant; the undo restores them all."""
    from gpujail.chaos import checker, checkers
    from gpujail.chaos.checkers import content, hygiene, queries
    is_bad, check_hygiene = queries.is_bad, hygiene.check_hygiene
    mp = pytest.MonkeyPatch()
    try:
        apply("no-result-is-clean", mp)
        apply("ignore-impl-outside", mp)
        assert content.is_bad is checker.is_bad is queries.is_bad is not is_bad
        assert checker.CHECKERS["INV-3"] is checkers.BUILTIN["INV-3"] is hygiene.check_hygiene is not check_hygiene
    finally:
        mp.undo()
    assert content.is_bad is checker.is_bad is is_bad and checker.CHECKERS["INV-3"] is check_hygiene


def test_one_kill_run():
    """The runner's real path: a fresh pytest with `-p oracle_mutants` and the mutant in the
    environment. `ignore-impl-outside` is killed by the test written for it and not by INV-3's other
    self-test; an unknown mutant is an error before any test runs."""
    holes = "tests/test_oracle_holes.py::test_a_start_that_wrote_outside_the_jail_breaks_inv3"
    inv3 = "tests/test_checker.py::test_inv3_fails_on_changed_removed_and_unexpected_entries"
    result = kill_run("ignore-impl-outside", [holes, inv3], timeout=120)
    assert result["error"] is None and result["failed"] == [holes], result
    assert "no oracle mutant 'nosuch'" in kill_run("nosuch", [inv3], timeout=120)["error"]


@pytest.mark.kernel
def test_one_kill_run_of_a_simpler_fake():
    """A CDI fake's mutant reaches the fake's own process (a wrapper on GPUJAIL_CDI_FAKES applies it
    there) and the fidelity test written for it fails; the wrappers are gone afterwards."""
    import glob
    import os
    if os.getuid() != 0:
        pytest.skip("the CDI fidelity tests' kernel nodes need root")
    before = set(glob.glob("/tmp/cdi-fakes-*"))
    exits = "tests/test_cdi_fidelity.py::test_create_symlinks_bad_spec_and_failpoint"
    result = kill_run("hook-failure-exits-zero", [exits], timeout=120)
    assert result["error"] is None and result["failed"] == [exits], result
    assert set(glob.glob("/tmp/cdi-fakes-*")) == before


def test_the_matrix_table_reads_as_the_doc_shows_it():
    table = oracle_mutants.table({"unknown-is-pass": {"killers": ["tests/test_checker.py::a", "tests/test_checker.py::b",
                                                                   "tests/test_checker.py::c", "tests/test_checker.py::d"],
                                                      "error": None, "seconds": 6.04},
                                  "inconclusive-is-pass": {"killers": [], "error": None, "seconds": 5.0}})
    rows = table.splitlines()
    assert rows[0] == "| mutant | the mistake | SPEC | kills | tests that kill it | command | time |"
    assert "| 4 | `test_checker.py::a`, `test_checker.py::b`, `test_checker.py::c` (+1 more) |" in rows[2]
    assert "`scripts/oracle-killmatrix --mutants unknown-is-pass` | 6.0 s |" in rows[2]
    assert "| 0 | **SURVIVED** |" in rows[3]
