"""`gpujail reproduce` and the fault windows (chaos/checkers/windows.py): a run whose invariants all
hold but whose declared window never opened proved nothing, so the command exits 4 (INCONCLUSIVE),
never 0, with one line naming the window and why it stayed closed. Real runs on the kernel backend.
"""
from __future__ import annotations

import pytest
from test_cli import gpujail, needs_kernel

from gpujail import cli

NEVER_KILLED = ("inconclusive: fault window kill never opened (nobody was killed): "
                "the run proved nothing about its fault")


@pytest.mark.kernel
@needs_kernel
@pytest.mark.parametrize("window,exit_code,said", [
    ("kill", "inconclusive", [NEVER_KILLED]),   # two workers start and nobody is killed
    ("overlap", "passed", []),                  # the two starts do run at once
])
def test_reproduce_is_inconclusive_unless_the_window_opens(tmp_path, window, exit_code, said):
    sc = tmp_path / "two-starts.toml"
    sc.write_text(f'name = "two-starts"\ndescription = "two cold starts"\ngpu_workers = 2\nwindows = ["{window}"]\n')
    r = gpujail(tmp_path, "reproduce", str(sc), "--impl", "reference", "--out", str(tmp_path / "out"))
    assert r.returncode == cli.EXIT[exit_code], r.stdout + r.stderr
    assert "verdict: VALID" in r.stdout   # the invariants held either way: only the window decides
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("inconclusive")] == said, r.stdout
    assert f"window {window}: {'NEVER OPENED' if said else 'opened'}" in r.stdout
