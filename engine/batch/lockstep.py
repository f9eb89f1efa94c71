"""Many MD systems stepped together, with one model call per step for all of them.

For a model with ``compute_batch`` (MACE: models/mace_batch.py) as many systems as
``batch.size`` allows are in flight (a count, or on CUDA by default as many as fill the
device's memory: engine/batch/room.py). Each step, every system drifts (its first half and neighbour list:
``Simulation.drift``), the model is called once on all of them, and each system takes its
outputs and finishes its step as a run alone would (second half, thermo, frame, checkpoint).
A system that reaches ``steps`` leaves and the next frame takes its place.

Each system is still a one-rank ``Simulation``: the model's outputs for it are handed to it
through :class:`_Handed`, the model it calls, which gives the batched call's outputs when they
are there and calls the model itself otherwise (a checkpoint's health check).
The skin check reads every step (``neighbor.deferred=false``): a rollback of one system would
replay steps the others have taken.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from shardmd.engine.batch import joined
from shardmd.engine.batch.joined import Joined, item_of
from shardmd.engine.run.rebuild import Outcome


class _Handed:
    """A system's model: the batched call's outputs once (``ready``), else the model's own call."""

    def __init__(self, dmodel):
        self._inner = dmodel
        self.ready = None

    def compute(self, *args, **kwargs):
        out, self.ready = self.ready, None
        return out if out is not None else self._inner.compute(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _SharedStop:
    """Every system's view of the one stop request of the run (a signal stops them all)."""

    def __init__(self, shared):
        self._shared = shared

    @property
    def requested(self) -> bool:
        return self._shared.requested

    @property
    def signal_name(self):
        return self._shared.signal_name

    def install(self) -> None:   # the run installs the handler once
        pass

    def uninstall(self) -> None:
        pass


def admit(source, waiting: list, room, costs: list, make: Callable, on_error: Callable, stopped=lambda: False) -> list:
    """The systems that join the ones in flight (``costs``: theirs): read from ``source`` (one
    kept in ``waiting`` when the room is full), each made by ``make(index, item)``; a
    UserError of one goes to ``on_error(index, None, exc)`` and the next is tried."""
    from shardmd.engine.errors import UserError

    new = []
    while not stopped():
        if not waiting:
            nxt = next(source, None)
            if nxt is None:
                break
            waiting.append((*nxt, room.cost(nxt[1])))
        index, item, cost = waiting[0]
        if not room.admits(costs + [m.cost for m in new], cost):
            break
        waiting.clear()
        try:
            member = make(index, item)
        except UserError as exc:
            on_error(index, None, exc)
            continue
        member.cost = cost
        new.append(member)
    return new


class Member:
    """One system in flight: its ``Simulation`` set up and its loop state (a run's ``run()``,
    taken apart at the model call)."""

    def __init__(self, index: int, sim, stop):
        self.index, self.sim = index, sim
        sim.dmodel = self.handed = _Handed(sim.dmodel)
        sim.stop = _SharedStop(stop)
        sim.setup_lists()   # its first forces come from the joined call of :meth:`begin`
        self.last = int(sim.cfg.steps)
        self.update = None
        self.cost = 1.0   # its estimated bytes (engine/batch/room.py)

    def begin(self, out) -> None:
        """The rest of the set-up with the first forces ``out`` of the joined call: the frame
        and thermo at the start."""
        sim = self.sim
        self.handed.ready = out
        sim.setup_forces()
        sim.started = True
        sim._last_step, sim._step0 = self.last, sim.state.step
        sim.timers.clear()
        sim.reporter.start(sim.state.step)

    @property
    def done(self) -> bool:
        return self.sim.state.step >= self.last

    def drift(self) -> None:
        self.update = self.sim.drift()

    def item(self):
        """(positions, cell, pbc, numbers, nl) of this system for the batched call."""
        return item_of(self.sim)

    def finish(self, out) -> None:
        """The step's forces from ``out``, the second half, and what a run does after a step."""
        self.handed.ready = out
        self.sim._finish_step(self.update.kick)
        self.after_step()

    def after_step(self) -> None:
        """What a run does after a step: thermo and frame when due, a checkpoint when due."""
        sim, s = self.sim, self.sim.state
        sim._report(force_thermo=s.step == self.last)
        every = sim._ckpt_every
        if every and s.step % every == 0 and s.step < self.last:
            sim.checkpoint()

    def end(self) -> dict:
        """The end of the run: checkpoint, the last frame, closed files; its final observables."""
        sim, s = self.sim, self.sim.state
        try:
            sim.checkpoint()
            if sim.writer is not None and s.step % sim._traj_every != 0:
                obs = sim._checked_observables({"trajectory"})
                with sim._output_step():
                    sim._write(obs)
            return sim.last_thermo or sim.observables()
        finally:
            sim.close()


def run_together(todo: Iterator, start: Callable, room, model, on_end: Callable, on_error: Callable,
                 on_stop: Callable, peak: Callable | None = None) -> int:
    """Step the systems of ``todo`` (an iterator of (index, what ``start`` needs)) with as many
    in flight as ``room`` (engine/batch/room.py) admits; ``peak``: a pair (reset, read) of the
    device's peak memory, for the room's correction (None off CUDA). ``start(index, item)`` -> a
    set-up ``Simulation``; ``on_end(index, sim, obs)`` when a system reached its end;
    ``on_error(index, sim, exc)`` for a system that failed (a UserError of its own): it leaves,
    the others go on. A stop signal (SIGTERM, ...) ends
    every system in flight with a checkpoint (``on_stop(index, sim)``) and starts no other;
    returns EXIT_STOPPED then, else 0."""
    from shardmd.engine.errors import UserError
    from shardmd.engine.launch.stop import EXIT_STOPPED, StopRequest

    stop = StopRequest()
    stop.install()
    try:
        return _loop(iter(todo), start, room, model, on_end, on_error, on_stop, stop, UserError, EXIT_STOPPED,
                     peak)
    finally:
        stop.uninstall()


def _loop(source, start, room, model, on_end, on_error, on_stop, stop, UserError, stopped_code,
          peak) -> int:
    flying: list[Member] = []
    waiting: list = []   # the next system, read from ``source`` but not yet admitted

    def refill() -> None:
        new = admit(source, waiting, room, [m.cost for m in flying],
                    lambda index, item: Member(index, start(index, item), stop), on_error, lambda: stop.requested)
        # the first forces of the systems that joined together in one call (not one call each:
        # most of a small system's start-up): a batch stopped by a signal restarts with the
        # same systems in one call, as they were stepped when it stopped, so its next steps are
        # the same bits (a system's own call can differ from the joined one in the last bits)
        for m, out in zip(new, model.compute_batch([m.item() for m in new]) if new else []):
            try:
                m.begin(out)
            except UserError as exc:
                m.sim.close()
                on_error(m.index, m.sim, exc)
                continue
            if m.done:
                _leave(m)
                continue
            flying.append(m)

    def _leave(member: Member) -> None:
        try:
            on_end(member.index, member.sim, member.end())
        except UserError as exc:
            on_error(member.index, member.sim, exc)

    def fail(member: Member, exc) -> None:
        member.sim.close()
        on_error(member.index, member.sim, exc)

    def each_alone() -> list[Member]:
        """One step of ``flying``, each system's own arrays, one joined model call."""
        alive = []
        for m in flying:
            try:
                m.drift()
                alive.append(m)
            except UserError as exc:
                fail(m, exc)
        if peak is not None:
            peak[0]()
        outs = model.compute_batch([m.item() for m in alive]) if alive else []
        if peak is not None and alive:
            room.observe(peak[1](), [m.cost for m in alive])
        rest = []
        for m, out in zip(alive, outs):
            try:
                m.finish(out)
            except UserError as exc:
                fail(m, exc)
                continue
            if m.done:
                _leave(m)
            else:
                rest.append(m)
        return rest

    refill()
    together = None   # a Joined of ``flying`` (engine/batch/joined.py), while they can be stepped as one
    while flying:
        if together is None and joined.usable(flying, model):
            together = Joined(flying, model)
        if together is not None:
            flying, together = _step_joined(together, model, room, peak, fail, _leave, UserError)
        else:
            flying = each_alone()
        if stop.requested:
            if together is not None:
                together.hand_back_all(with_outputs=True)
            for m in flying:
                try:
                    m.sim.checkpoint()
                finally:
                    m.sim.close()
                on_stop(m.index, m.sim)
            return stopped_code
        before = len(flying)
        refill()
        if together is not None and len(flying) != before:   # others joined: a new set with them
            together.hand_back_all()
            together = None
    return 0


def _step_joined(together, model, room, peak, fail, leave, UserError):
    """One step of the systems of ``together`` (engine/batch/joined.py); returns (the systems
    still in flight, ``together`` or None when they changed: their arrays are handed back then)."""
    together.first_half()
    failed = set()
    for j in together.flagged():   # each decides as it would alone: a rebuild, or its health error
        m = together.members[j]
        together.hand_back(j)
        try:
            update = m.sim.neighbors.update(m.sim.state, True, False)
        except UserError as exc:
            failed.add(j)
            fail(m, exc)
            continue
        if update.outcome is Outcome.REBUILT:
            together.rebuilt(j)
    if failed:   # mid-step, after the first half: the others go on as a new set
        keep = [j for j in range(len(together.members)) if j not in failed]
        for j in keep:
            together.hand_back(j)
        if not keep:
            return [], None
        together = Joined([together.members[j] for j in keep], model)
    if peak is not None:
        peak[0]()
    together.forces()
    if peak is not None:
        room.observe(peak[1](), [m.cost for m in together.members])
    gone = set()
    for j in together.due():
        m = together.members[j]
        try:
            together.hand_back(j, with_outputs=True)
            m.after_step()
        except UserError as exc:
            gone.add(j)
            fail(m, exc)
            continue
        if m.done:
            gone.add(j)
            leave(m)
    if not gone:   # a copy: systems admitted later join ``flying``, never the set's own list
        return list(together.members), together
    rest = [j for j in range(len(together.members)) if j not in gone]
    for j in rest:   # with this step's outputs: a stop right after checkpoints them as they are
        together.hand_back(j, with_outputs=True)
    return [together.members[j] for j in rest], None
