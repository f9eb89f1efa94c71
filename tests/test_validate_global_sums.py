"""trace_and_validate on a model with global values inside its energy (the charge-equilibration
model of tests/qeq_model.py): a collective whose backward is wrong, a replicated energy seeded on
every rank, a reused helper sum, an OpAdapter no ShardTensor reaches, a missing ScatterOutputs,
and a sample so small that the halo covers it; each named by its own diagnosis (none of them
``halo_correction_mismatch``, none auto-fixed to ``HaloStorage('local')``).  One launch of 2 ranks."""
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import qeq_model as Q  # noqa: E402
import qeq_wrong_models as W  # noqa: E402

CASES = {"qeq": Q.qeq_model, "identity_backward": W.identity_backward, "seeded_per_rank": W.seeded_per_rank,
         "helper_sum": W.helper_sum, "op_plain": W.op_plain, "op_no_scatter": W.op_no_scatter, "op_ok": W.op_ok}


@pytest.fixture(scope="module")
def reports():
    from shardmd.domain.validate import validate_many

    jobs = [dict(model_factory=f, sample_system=Q.sample()) for f in CASES.values()]
    jobs.append(dict(model_factory=Q.qeq_model, sample_system=W.small_sample()))
    with pytest.warns(RuntimeWarning, match="halo covers the whole sample"):
        reps = validate_many(jobs, 2)
    return dict(zip([*CASES, "small"], reps))


def _codes(rep):
    return [d["code"] for d in rep.attempts[0].diagnosis]


def _wrong_and_unfixed(rep, code):
    assert not rep.ok and _codes(rep)[0] == code, _codes(rep)
    assert "halo_correction_mismatch" not in _codes(rep)
    assert rep.fix_applied is None and [a.rule for a in rep.attempts] == [None]
    assert rep.next_action == rep.attempts[0].diagnosis[0]["action"] and "\n" not in rep.next_action


@pytest.mark.mpi
def test_a_collective_with_an_identity_backward_is_named(reports):
    ok = reports["qeq"]   # the model written as the docs say passes, forces to 1e-10
    assert ok.ok and _codes(ok) == [] and ok.warnings == []
    assert ok.attempts[0].diffs["forces"]["max_abs_err"] <= 1e-10 * ok.attempts[0].diffs["forces"]["scale"]
    rep = reports["identity_backward"]
    _wrong_and_unfixed(rep, "collective_backward")
    a = rep.attempts[0]
    assert a.diffs["energy"]["ok"] and a.diffs["energies"]["ok"] and not a.diffs["forces"]["ok"]
    d = a.diagnosis[0]
    assert "backward" in d["message"] and "reused" in d["message"] and "system_sum" in d["action"]


@pytest.mark.mpi
def test_a_replicated_energy_seeded_on_every_rank_is_named(reports):
    rep = reports["seeded_per_rank"]
    _wrong_and_unfixed(rep, "replicated_objective_seeded_per_rank")
    assert "2x" in rep.attempts[0].diagnosis[0]["message"] and "seed_once" in rep.next_action


@pytest.mark.mpi
def test_a_reused_helper_sum_is_named_with_the_helper(reports):
    rep = reports["helper_sum"]
    _wrong_and_unfixed(rep, "helper_sum_reused")
    d = rep.attempts[0].diagnosis[0]
    assert "mol_sum()" in d["message"] and "ghost copies" in d["message"] and "system_sum" in d["action"]


@pytest.mark.mpi
def test_an_op_adapter_that_never_fires_is_an_error(reports):
    rep = reports["op_plain"]
    assert _codes(rep) == ["adapter_never_fired"]
    _wrong_and_unfixed(rep, "adapter_never_fired")
    d = rep.attempts[0].diagnosis[0]
    assert d["severity"] == "error" and "shardmd_qeq::sender_sum" in d["message"] and "shard_like" in d["action"]


@pytest.mark.mpi
def test_a_missing_scatter_outputs_is_named_when_a_global_value_spreads_the_error(reports):
    rep = reports["op_no_scatter"]
    _wrong_and_unfixed(rep, "missing_scatter_outputs")
    assert "output 0 of shardmd_qeq::sender_sum" in rep.attempts[0].diagnosis[0]["message"]
    assert "ScatterOutputs()" in rep.next_action
    ok = reports["op_ok"]          # the same op with ScatterOutputs declared
    assert ok.ok and _codes(ok) == [] and ok.reference_trace.get("system_reduce")


@pytest.mark.mpi
def test_a_sample_the_halo_covers_is_warned_about(reports):
    rep = reports["small"]
    assert [w["code"] for w in rep.warnings] == ["halo_covers_system"]
    assert "32 points" in rep.warnings[0]["message"] and "larger sample" in rep.warnings[0]["action"]
