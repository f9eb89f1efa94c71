"""The progress line's ETA (engine/run/reporting.py ``Eta``) on a clock the test drives: a run's
first step carries its one-off work (the model's first call, compiles, the first neighbour
build), the rest run at a steady rate, or at a rate that changes when the machine gets busy.
The truth is the clock's own remaining time; no test here reads a real clock."""
import pytest

from shardmd.engine.run.reporting import Eta


def _run(first_s: float, step_s, steps: int, every_s: float = 0.5):
    """(time, step) of each progress update of a run whose first step takes ``first_s`` and
    step k then ``step_s(k)`` s, updates at most every ``every_s`` s (the live line's 0.5 s)."""
    t, last, out = first_s, -1.0, []
    for k in range(1, steps + 1):
        if k > 1:
            t += step_s(k)
        if t - last >= every_s:
            out.append((t, k))
            last = t
    return out, t


def _eta_at(points, steps, fraction):
    eta = Eta()
    for t, k in points:
        eta.update(t, k)
        if k >= fraction * steps:
            return t, k, eta.remaining(k, steps)
    raise AssertionError("the run ended first")


def test_eta_after_a_tenth_of_a_two_minute_run_is_within_a_quarter():
    """1,200 steps: a first step of 15 s, then 0.0875 s a step (a 2-minute run). After 10 %
    the ETA is within 25 % of the true remaining time (the rate since the start, first step
    included, says 2.4x the truth here; with a longer first step, the ~600x seen)."""
    points, end = _run(15.0, lambda k: 0.0875, 1200)
    assert end == pytest.approx(120.0, rel=0.01)
    t, k, eta = _eta_at(points, 1200, 0.1)
    true = end - t
    assert abs(eta - true) <= 0.25 * true, (eta, true)
    cumulative = (1200 - k) / (k / t)       # the old estimate: steps done over time since the start
    assert abs(cumulative - true) > 0.25 * true


def test_eta_follows_a_machine_that_gets_busy():
    """The rate halves at 30 % (another job starts): 30 s later the ETA is within 25 % of the
    truth, where the average since the first step would still be far off."""
    points, end = _run(2.0, lambda k: 0.05 if k < 600 else 0.1, 2000)
    eta, t_busy = Eta(), None
    for t, k in points:
        eta.update(t, k)
        if k >= 600 and t_busy is None:
            t_busy = t
        if t_busy is not None and t >= t_busy + 30.0:
            true = end - t
            assert abs(eta.remaining(k, 2000) - true) <= 0.25 * true, (eta.remaining(k, 2000), true)
            return
    raise AssertionError("the run ended first")


def test_no_eta_before_a_rate_is_known():
    eta = Eta()
    assert eta.remaining(0, 100) is None
    eta.update(10.0, 1)          # the first update: after the first step, no rate yet
    assert eta.remaining(1, 100) is None
    eta.update(11.0, 11)
    assert eta.remaining(11, 100) == pytest.approx(8.9)   # 89 steps at 10 steps/s


@pytest.mark.parametrize("domains", [1, 2])
def test_time_split_adds_up_to_the_loop(tmp_path, capfd, monkeypatch, domains):
    """The log's time split: disjoint parts plus the untimed rest, 100 % of the loop's wall time
    (each part rounded to 0.1 %), on one domain and on two self-launched ranks."""
    import re

    from conftest import run_engine, run_in_process

    args = ["run", "model=lj", "system.repeat=[4,4,4]", "steps=60", "quiet=true", f"domains={domains}", "threads=1"]
    if domains == 1:
        code, err = run_in_process(args, tmp_path, capfd, monkeypatch)
        assert code == 0, err
    else:
        r = run_engine(args, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in (tmp_path / "run.log").read_text().splitlines() if ln.startswith("Time split:"))
    shares = [float(x) for x in re.findall(r"\(([0-9.]+)%\)", line)]
    assert "other" in line and len(shares) >= 5, line
    assert abs(sum(shares) - 100.0) <= 0.05 * len(shares) + 1e-9, line
