"""Many FIRE relaxations stepped together, with one model call per step for all of them
(``python -m engine minimize system.frames=all``, a model with ``compute_batch``: MACE).

Each system is still its own :class:`~shardmd.engine.relax.minimize.FIRE` on a one-rank
``Simulation``, run in the pieces of ``Relaxation.run`` (engine/relax/base.py): its set-up up to
the first forces, then per step its move (FIRE's update, the skin check, the list), the joined
model call, its forces (handed to it as engine/batch/lockstep.py does for MD: ``_Handed``), the
convergence test, its line, frame and checkpoint. A system that converges (or reaches
``minimize.steps``) leaves: its checkpoint, relaxed structure and summary row are written, and
the next input takes its place, so a large input streams through a full device.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from shardmd.engine.batch.joined import item_of
from shardmd.engine.batch.lockstep import _Handed, admit
from shardmd.engine.errors import UserError


class _Relaxing:
    """One relaxation in flight: its minimiser, its relaxed structure's path, its cost (bytes)."""

    def __init__(self, index: int, relax, structure: str, fmax: float, steps: int):
        self.index, self.relax, self.structure, self.cost = index, relax, structure, 1.0
        sim = relax.sim
        sim.dmodel = self.handed = _Handed(sim.dmodel)
        relax.begin_lists(fmax, steps)

    def item(self):
        return item_of(self.relax.sim)


def relax_together(todo: Iterator, start: Callable, room, model, on_end: Callable, on_error: Callable) -> int:
    """Relax the systems of ``todo`` ((index, atoms) pairs) with as many in flight as ``room``
    (engine/batch/room.py) admits. ``start(index, atoms)`` -> (a FIRE minimiser on a set-up
    ``Simulation``, its relaxed structure's path, fmax, steps); ``on_end(index, sim, result)``
    for a finished relaxation (``Relaxation.run``'s result); ``on_error(index, sim, exc)`` for a
    system that failed (it leaves, the others go on). Returns 0."""
    source = iter(todo)
    flying: list[_Relaxing] = []
    waiting: list = []

    def leave(m: _Relaxing) -> None:
        sim = m.relax.sim
        try:
            on_end(m.index, sim, m.relax.finish(m.structure))
        except UserError as exc:
            on_error(m.index, sim, exc)
        finally:
            sim.close()

    def joined(members: list[_Relaxing], then: Callable) -> list[_Relaxing]:
        """One model call for ``members``, then ``then(m)`` with each one's outputs; the ones
        still relaxing."""
        kept = []
        for m, out in zip(members, model.compute_batch([m.item() for m in members]) if members else []):
            m.handed.ready = out
            try:
                then(m)
            except UserError as exc:
                m.relax.sim.close()
                on_error(m.index, m.relax.sim, exc)
                continue
            if m.relax.done:
                leave(m)
            else:
                kept.append(m)
        return kept

    def refill() -> None:
        new = admit(source, waiting, room, [m.cost for m in flying],
                    lambda index, atoms: _Relaxing(index, *start(index, atoms)), on_error)
        flying.extend(joined(new, lambda m: m.relax.begin_forces()))

    def moved(m: _Relaxing) -> None:
        m.relax.moved_forces()
        m.relax.after_step()

    refill()
    while flying:
        alive = []
        for m in flying:
            try:
                m.relax.move()
                m.relax.moved_lists()
                alive.append(m)
            except UserError as exc:
                m.relax.sim.close()
                on_error(m.index, m.relax.sim, exc)
        flying[:] = joined(alive, moved)
        refill()
    return 0
