"""trace_and_validate names the root cause for a pure-PyTorch author: a
2-layer SchNet-like model (tests/byo_wrong_models.py) wrapped three wrong ways, each with its
own diagnosis and fix, and the correct wrapping as the control.  One launch of 2 ranks."""
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import byo_wrong_models as W  # noqa: E402

CASES = [W.schnet_ok, W.schnet_local, W.schnet_torch_zeros, W.schnet_sum_over_ghosts]


@pytest.fixture(scope="module")
def reports():
    from shardmd.domain.validate import validate_many

    sample = W.sample()
    reps = validate_many([dict(model_factory=f, sample_system=sample, atol=0.0, rtol=1e-10) for f in CASES], 2)
    return {f.__name__: r for f, r in zip(CASES, reps)}


def _codes(rep):
    return [d["code"] for d in rep.attempts[0].diagnosis]


@pytest.mark.mpi
def test_control_passes_without_a_fix(reports):
    rep = reports["schnet_ok"]
    assert rep.ok and rep.fix_applied is None and _codes(rep) == []
    a = rep.attempts[0]
    assert a.diffs["forces"]["max_abs_err"] <= 1e-10 * a.diffs["forces"]["scale"]


@pytest.mark.mpi
def test_a_local_halo_mode_is_diagnosed_as_no_per_layer_exchange(reports):
    rep = reports["schnet_local"]
    first = rep.attempts[0]
    assert not first.ok and _codes(rep)[0] == "no_per_layer_exchange", _codes(rep)
    d = first.diagnosis[0]
    assert "HaloStorage('scatter')" in d["action"] and "ScatterOutputs" not in d["action"]
    assert "no custom ops" in d["message"]
    # the fix is validated in the same launch: the scatter mode passes
    assert rep.ok and rep.fix_applied == "halo_mode_to_scatter"
    assert [a.rule for a in rep.attempts] == [None, "halo_mode_to_scatter"]
    assert rep.spec.distribution.storage.mode == "scatter"
    assert rep.attempts[-1].handlers_fired.get("halo_correction")


@pytest.mark.mpi
def test_b_torch_zeros_target_is_diagnosed_as_plain_scatter_target(reports):
    rep = reports["schnet_torch_zeros"]
    first = rep.attempts[0]
    assert not rep.ok and _codes(rep)[0] == "plain_scatter_target", _codes(rep)
    assert not first.handlers_fired.get("halo_correction")            # the clue, now explained
    d = first.diagnosis[0]
    assert "never fired" in d["message"] and "torch.zeros" in d["message"]
    assert "new_zeros" in d["action"] and "ScatterOutputs" not in d["action"]
    assert rep.next_action == d["action"] and "\n" not in rep.next_action
    assert rep.fix_applied is None and len(rep.attempts) == 1        # no spec change can fix it


@pytest.mark.mpi
def test_c_sum_over_ghost_rows_is_diagnosed_and_not_auto_fixed_to_local(reports):
    rep = reports["schnet_sum_over_ghosts"]
    first = rep.attempts[0]
    assert not rep.ok and _codes(rep) == ["ghost_rows_in_sum"], _codes(rep)
    d = first.diagnosis[0]
    assert "ghost" in d["message"] and "system_sum" in d["action"] and "new_zeros(n_systems)" in d["action"]
    assert "local" not in d["action"]
    # the halo-correction -> local auto-fix does not apply (its rule needs its own diagnosis)
    assert [a.rule for a in rep.attempts] == [None] and rep.fix_applied is None
    assert rep.next_action == d["action"]


def test_halo_too_thin_wording_names_the_list_radius_not_a_receptive_field():
    import numpy as np

    from shardmd.domain.spec import SPEC_MPNN_HALO
    from shardmd.domain.validate import diagnose

    complete = {"matches": False, "per_rank": [{"rank": 0, "missing_edges": 3, "extra_edges": 0}]}
    out = diagnose({}, [{"ids": np.arange(2), "ghost_ids": np.zeros(0, np.int64)}], SPEC_MPNN_HALO, {}, complete,
                   [], {}, set(), 2, 2.0, 4.5)
    assert out[0]["code"] == "halo_too_thin"
    assert "receptive field" not in out[0]["action"] and "cutoff 4.5 Å plus the skin" in out[0]["action"]
    assert "whatever the number of layers" in out[0]["action"]
