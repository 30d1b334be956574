"""`gpujail reproduce` and the fault windows (chaos/checkers/windows.py): a run whose invariants all
hold but whose declared window never opened proved nothing, so the command exits 4 (INCONCLUSIVE),
never 0, with one line naming the window and why it stayed closed. Real runs on the kernel backend.
"""
from __future__ import annotations

import pytest
from test_cli import gpujail, needs_kernel

from gpujail import cli


@pytest.mark.kernel
@needs_kernel
def test_reproduce_is_inconclusive_when_the_window_never_opens(tmp_path):
    """Two workers start and nobody is killed, yet the scenario exists for the `kill` window."""
    sc = tmp_path / "never-killed.toml"
    sc.write_text('name = "never-killed"\ndescription = "nobody is killed"\ngpu_workers = 2\nwindows = ["kill"]\n')
    r = gpujail(tmp_path, "reproduce", str(sc), "--impl", "reference", "--out", str(tmp_path / "out"))
    assert r.returncode == cli.EXIT["inconclusive"], r.stdout + r.stderr
    assert "verdict: VALID" in r.stdout   # the invariants held: only the window makes it inconclusive
    said = [ln for ln in r.stdout.splitlines() if ln.startswith("inconclusive:")]
    assert said == ["inconclusive: fault window kill never opened (nobody was killed): "
                    "the run proved nothing about its fault"], r.stdout


@pytest.mark.kernel
@needs_kernel
def test_reproduce_passes_when_the_window_opens(tmp_path):
    """The same run with a window it does open (two starts at once): exit 0, no inconclusive line."""
    sc = tmp_path / "overlapping.toml"
    sc.write_text('name = "overlapping"\ndescription = "two cold starts"\ngpu_workers = 2\nwindows = ["overlap"]\n')
    r = gpujail(tmp_path, "reproduce", str(sc), "--impl", "reference", "--out", str(tmp_path / "out"))
    assert r.returncode == cli.EXIT["passed"], r.stdout + r.stderr
    assert "window overlap: opened" in r.stdout and "inconclusive" not in r.stdout
