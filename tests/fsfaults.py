"""What the write-fault tests share: small tmpfs mounts (a full disk, a read-only one), file
digests, and the check of a one-line error."""
from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from pathlib import Path

import pytest


def assert_one_line_error(r, *needles, codes=(4,)):
    """Exit status in ``codes``, no crash, stderr exactly one ``error:`` line naming ``needles``."""
    assert r.returncode not in (-11, 139), f"segfault:\n{r.stderr[-3000:]}"
    assert r.returncode in codes, f"exit {r.returncode}, wanted {codes}:\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr[-3000:]
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): _digest(p) for p in sorted(d.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def tmpfs(path: Path, size: str, ro: bool = False):
    """A fresh tmpfs of ``size`` at ``path`` (skips the test where mounting is not allowed)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (disk-full / read-only cases)")
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if ro else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'EPERM'})")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _remount_ro(path: Path) -> None:
    r = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount read-only ({r.stderr.strip()})")
