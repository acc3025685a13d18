"""The README's main job: `ratchet demo` tells the whole story and checks it, offline."""

from __future__ import annotations

import subprocess

from tests.processes import RATCHET, clean_env


def test_the_demo_survives_sigkill_and_approval_with_every_invariant_intact(tmp_path):
    done = subprocess.run(
        [*RATCHET, "demo"],
        capture_output=True,
        text=True,
        env=clean_env(COLUMNS="200"),
        cwd=tmp_path,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Worker A died (exit -9). Last checkpoint: step 22" in out
    assert "worker B resumed at step 23 from checkpoint 22" in out
    assert "rows copied: 40,000 of 40,000" in out
    assert "duplicate rows: 0" in out
    assert "emails sent: 1" in out
    assert "model calls paid twice: 0 (45 calls for 45 decisions)" in out
    assert "`ratchet serve` shows the request (HTTP 200)" in out
    assert "the run is still waiting" in out
    assert "The same link now answers HTTP 409" in out
    assert "approval requests: 1, decided on the page by" in out
    assert "All invariants hold." in out
    assert not (tmp_path / ".ratchet").exists(), "the demo works in a temporary store"
