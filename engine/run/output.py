"""The run's trajectory: opening its writer, and which rows a step writes.

Frames every ``trajectory.every`` steps; rows of the observables every ``observables.every``
steps (null or 0: with the frames) and with every frame, so that a reader pairing observable
rows with frames by index (MDAnalysis's ``ts.data``) never runs out of rows; the frame
interval ``dt`` (MDAnalysis's time step) is written with the frames only.
"""
from __future__ import annotations

import warnings

from shardmd.engine.errors import UserError
from shardmd.engine.io.output_lock import OutputLock


def observables_every(cfg) -> int:
    """Steps between observable rows (0: none besides the frames')."""
    node = cfg.get("observables") if hasattr(cfg, "get") else None
    every = node.get("every") if node is not None else None
    return int(every or 0)


def open_writer(sim) -> None:
    """Take the output lock (rank 0), then open the trajectory (rank 0; a stand-in elsewhere);
    nothing to open with ``trajectory.every=0``.  Collective (the species and masses are gathered)."""
    from shardmd.engine import __version__
    from shardmd.engine.io.h5md import H5MDWriter, TrajectoryRebuilt

    with sim._output_step():   # the lock before any output is touched (engine/io/output_lock.py)
        if sim.comm.is_root and sim._lock is None:
            sim._lock = OutputLock(sim.output_path)
    cfg = sim.cfg
    if cfg.trajectory.every <= 0:
        return
    static = sim.domain.gather(sim.state, ("numbers", "masses"))
    if not sim.comm.is_root:
        sim.writer = NotRoot()
        return
    sim.output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():   # a rebuilt file is said in the run's log instead (below)
            warnings.simplefilter("ignore", TrajectoryRebuilt)
            sim.writer = H5MDWriter(
                sim.output_path, species=static["numbers"], masses=static["masses"].astype("float64"),
                ids=static["ids"], pbc=sim.state.pbc.cpu().numpy(),
                dtype=cfg.trajectory.precision or cfg.precision, config=sim.record(),
                fields=tuple(cfg.trajectory.fields), compression=cfg.trajectory.compression,
                creator="ShardMD", creator_version=__version__, mode="a" if sim.checkpoint_in else "w")
    except ValueError as exc:   # a restart onto an output of another system
        raise UserError(f"output {str(sim.output_path)!r} does not belong to this run ({exc}); give the "
                        "run's own output= or start fresh with another output=") from None
    keep = cfg.trajectory.get("keep_bits")
    sim.writer.keep_bits = None if keep is None else int(keep)   # lossy: engine/io/bitround.py
    if sim.writer.rebuilt:
        sim.reporter.line(sim.writer.rebuilt)
    if sim.checkpoint_in is not None:  # frames a dead run wrote after its checkpoint go
        sim.writer.truncate_after(sim.state.step)


class NotRoot:
    """Stand-in writer on ranks other than 0 (they take part in gathers, write nothing)."""

    def close(self) -> None:
        pass
