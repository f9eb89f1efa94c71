"""The ranks' heartbeat: a rank that stops answering ends the job in seconds, naming it.

A collective waits for a stopped rank (SIGSTOP, a debugger, a frozen node) until its timeout
(120 s), then fails on every rank with gloo's own line naming whoever noticed first. Instead
each rank runs a small daemon thread that beats over a plain TCP socket: rank 0 listens (its
address reaches the others by one MPI broadcast at start-up, in the main thread; nothing of
gloo or MPI is used from the thread), every other rank connects to it, and both ends send one
byte every ``silence / 10`` s (0.05-2 s). A peer whose bytes stop for ``health.rank_silence``
seconds has stopped answering: the rank that sees it prints one line naming the silent rank,
its host and pid, and ends with :data:`EXIT_RANK_LOST`; MPI's launcher then ends every other
rank (a stopped one included: it is killed, not signalled to stop; under srun through MPI_Abort,
since srun ends a step's tasks on an abort, not on one task's exit). A connection to rank 0's
port that does not introduce itself as one of the job's ranks is dropped, never judged. Rank 0 watches every rank;
the others watch rank 0 (rank 1 first; ranks above wait one more silence, so one line is said).

What counts as answering: the beat comes from a thread of the rank's own process, so a rank
that is merely slow (a long first compile, a garbage collection, a machine busy with other
jobs, a step that waits on a collective) keeps beating (its main thread holds the interpreter
lock for milliseconds at a time, never seconds), and only a process that does not run at all
falls silent. A rank that ended closes its socket: it is not watched after that (a rank that
died is MPI's launcher's to report), unless this rank is blocked in MPI for the step loop
(host traffic over MPI, domain/comm.mpi_wait) for :data:`GONE_WAIT_S` after that end: a
gloo call sees a partner die (its connection breaks), an MPI wait does not, and srun leaves
the other tasks running when one is killed. When the watching thread itself did not run for a while
(its own process was stopped and continued, or the machine stalled) it gives every peer a
fresh ``silence`` before judging, so the watcher never blames another rank for its own pause.

Known limit: a C call that holds the interpreter lock for longer than ``health.rank_silence``
(h5py holds it through an HDF5 write; a write stalled on a hung file system) silences that
rank's beat too.
"""
from __future__ import annotations

import os
import selectors
import socket
import sys
import threading
import time

from shardmd.engine.errors import EXIT_RANK_LOST

BEAT, HELLO_TIMEOUT_S = b".", 60.0
#: s a rank may wait in MPI for a peer whose process has ended before the job is ended here:
#: the launcher (or the peer's own abort) normally ends every rank well within it
GONE_WAIT_S = 5.0


def interval(silence_s: float) -> float:
    """Seconds between beats for a silence limit of ``silence_s`` s."""
    return min(max(silence_s / 10.0, 0.05), 2.0)


class Peer:
    def __init__(self, sock: socket.socket, rank: int, host: str, pid: int, now: float):
        self.sock, self.rank, self.host, self.pid, self.seen = sock, rank, host, pid, now
        self.buffer: bytes | None = None   # the hello line being read (rank 0's side)

    def describe(self) -> str:
        return f"rank {self.rank} (pid {self.pid} on host {self.host})"


class Heartbeat:
    """One rank's beating and watching thread (module docstring). ``lost(peer, silent_s)``:
    what to do when a peer fell silent (``silent_s`` < 0: its process ended that long ago while
    this rank waits for it); by default one line on stderr and ``os._exit``."""

    def __init__(self, rank: int, size: int, silence_s: float, lost=None):
        self.rank, self.size, self.silence = rank, size, float(silence_s)
        self.every = interval(self.silence)
        self.peers: dict[int, Peer] = {}
        self.gone: list[tuple[Peer, float]] = []   # peers whose process ended, and when
        self.sel = selectors.DefaultSelector()
        self.lost = lost or self._end_job
        self.listener: socket.socket | None = None
        self._stop = threading.Event()
        #: how the job is ended: this process's exit, which MPICH's mpiexec (and a self-launch) answers
        #: by killing every other rank, a stopped one too; MPI_Abort under srun
        self.end = None

    # -- start-up (main thread) ----------------------------------------------------------------
    def listen(self, host: str) -> tuple[str, int, str, int]:
        """Rank 0: open the listening socket; (address, port, host name, pid) for the others."""
        self.listener = socket.create_server((host, 0), backlog=max(self.size, 8))
        return host, self.listener.getsockname()[1], socket.gethostname(), os.getpid()

    def connect(self, root: tuple[str, int, str, int]) -> None:
        """Ranks > 0: connect to rank 0 (``listen``'s answer) and say who this is (rank, host, pid)."""
        address, name, pid = tuple(root[:2]), root[2], root[3]
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while True:
            try:
                sock = socket.create_connection(address, timeout=5.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        sock.sendall(f"{self.rank} {socket.gethostname()} {os.getpid()}\n".encode())
        self._add(Peer(sock, 0, name, pid, time.monotonic()), hello=False)

    def start(self) -> None:
        threading.Thread(target=self._run, name="shardmd-heartbeat", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    # -- the thread -----------------------------------------------------------------------------
    def _add(self, peer: Peer, hello: bool) -> None:
        peer.sock.setblocking(False)
        peer.buffer = b"" if hello else None   # rank 0 reads the hello line first
        self.peers[id(peer.sock)] = peer
        self.sel.register(peer.sock, selectors.EVENT_READ, peer)

    def _accept(self) -> None:
        sock, addr = self.listener.accept()
        self._add(Peer(sock, -1, addr[0], 0, time.monotonic()), hello=True)

    def _read(self, peer: Peer, now: float) -> None:
        try:
            data = peer.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:   # the peer ended: MPI's launcher reports a rank that died, unless this rank
            self._drop(peer)   # waits for it in MPI (_judge_gone)
            if peer.buffer is None:
                self.gone.append((peer, now))
            return
        peer.seen = now
        if peer.buffer is not None:
            peer.buffer += data
            if b"\n" in peer.buffer:
                try:
                    line = peer.buffer.split(b"\n", 1)[0].decode(errors="replace").split()
                    rank, host, pid = int(line[0]), line[1], int(line[2])
                    if not 0 < rank < self.size:
                        raise ValueError(rank)
                except (ValueError, IndexError):   # not one of our ranks: never judged, dropped
                    self._drop(peer)
                    return
                peer.rank, peer.host, peer.pid, peer.buffer = rank, host, pid, None
            elif len(peer.buffer) > 1024:
                self._drop(peer)

    def _drop(self, peer: Peer) -> None:
        self.sel.unregister(peer.sock)
        peer.sock.close()
        self.peers.pop(id(peer.sock), None)

    def _beat(self) -> None:
        for peer in list(self.peers.values()):
            try:
                peer.sock.send(BEAT)
            except (BlockingIOError, InterruptedError):   # a stopped peer's buffer is full: fine
                pass
            except OSError:
                pass   # gone: its read side says so

    def _limit_for(self, peer: Peer) -> float:
        """Silence that counts as lost for ``peer``: ranks above 1 give rank 1 a silence's
        head start to report a silent rank 0 (one line, not one per rank)."""
        return self.silence * (2.0 if self.rank > 1 and peer.rank == 0 else 1.0)

    def _run(self) -> None:
        if self.listener is not None:
            self.listener.setblocking(False)
            self.sel.register(self.listener, selectors.EVENT_READ, None)
        last = time.monotonic()
        while not self._stop.is_set():
            for key, _ in self.sel.select(timeout=self.every):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data, time.monotonic())
            now = time.monotonic()
            if now - last > self.silence / 2:   # this thread did not run: judge no one for it
                for peer in self.peers.values():
                    peer.seen = max(peer.seen, now)
            last = now
            self._beat()
            if self.gone and self._judge_gone(now):
                return
            for peer in list(self.peers.values()):
                if now - peer.seen <= self._limit_for(peer):
                    continue
                if peer.buffer is not None:   # a connection that never said which rank it is
                    self._drop(peer)
                    continue
                self.lost(peer, now - peer.seen)
                return

    def _judge_gone(self, now: float) -> bool:
        """A peer's process ended while this rank is blocked in an MPI call of the step loop
        (domain/comm.mpi_wait) for over :data:`GONE_WAIT_S`: nothing will complete that call
        (gloo's connection breaks instead; MPI's wait can last for ever under srun), so the job
        ends here as for a silent rank. A peer that ended while no one waited (the run's end)
        is never judged."""
        from shardmd.domain.comm import mpi_waiting_since

        since = mpi_waiting_since()
        if since is None:
            return False
        for peer, ended in self.gone:
            if now - max(since, ended) > GONE_WAIT_S:
                self.lost(peer, -(now - ended))
                return True
        return False

    def _end_job(self, peer: Peer, silent_s: float) -> None:
        """One line naming the silent rank, then this process ends; MPI's launcher ends the rest."""
        who = peer.describe() if peer.pid else f"rank {peer.rank} (host {peer.host})"
        if silent_s < 0:   # _judge_gone: its process ended
            sys.stderr.write(
                f"error (rank {self.rank}): {who} ended {-silent_s:.0f} s ago while this rank waits for it "
                f"(killed? out of memory?); every rank ends now (exit {EXIT_RANK_LOST}). Continue from the "
                "newest checkpoint with restart=auto\n")
            _flush_and_exit(EXIT_RANK_LOST, self.end)
        sys.stderr.write(
            f"error (rank {self.rank}): {who} stopped answering: no heartbeat for {silent_s:.0f} s "
            f"(health.rank_silence={self.silence:g}); every rank ends now (exit {EXIT_RANK_LOST}). Is it "
            "stopped (SIGSTOP, a debugger) or its node down? Continue from the newest checkpoint with "
            "restart=auto\n")
        _flush_and_exit(EXIT_RANK_LOST, self.end)


def _flush_and_exit(code: int, end=None) -> None:
    """Flush stderr and any open HDF5 file (the main thread waits in a collective, not in
    h5py), then end the process (``end(code)`` first where given); whatever hangs is cut short
    after 10 s."""
    threading.Timer(10.0, os._exit, (code,)).start()
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    h5py = sys.modules.get("h5py")
    if h5py is not None:
        try:
            for fid in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE):
                h5py.h5f.flush(fid)
        except Exception:  # noqa: BLE001 - ending anyway; the checkpoints are written whole or not at all
            pass
    if end is not None:
        end(code)
    os._exit(code)


def start(comm, silence_s: float) -> Heartbeat | None:
    """Collective, at start-up (main thread): every rank of ``comm`` starts its heartbeat; None
    for one rank or ``silence_s`` <= 0 (off)."""
    if comm is None or comm.size < 2 or silence_s <= 0:
        return None
    from shardmd.domain.comm import _host_address

    hb = Heartbeat(comm.rank, comm.size, silence_s)
    address = hb.listen(_host_address()) if comm.rank == 0 else None
    if comm.mpi is not None:
        address = comm.mpi.COMM_WORLD.bcast(address, root=0)
    else:
        address = comm.broadcast_object(address)
    if comm.rank != 0:
        try:
            hb.connect(address)
        except OSError as exc:   # rank 0's port unreachable from here: run on, unwatched
            import warnings

            from shardmd.engine.errors import OneLineWarning

            warnings.warn(f"rank {comm.rank}: no heartbeat to rank 0 at {address[0]}:{address[1]} ({exc}); a "
                          "stopped rank is found by the collective timeout only", OneLineWarning, stacklevel=2)
            return None
    if comm.mpi is not None and os.environ.get("SLURM_STEP_ID") is not None:
        hb.end = comm.mpi.COMM_WORLD.Abort   # srun ends a step's other tasks on an MPI abort, not on an exit
    hb.start()
    return hb
