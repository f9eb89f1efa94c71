"""Run under ``srun -n K``: print one JSON line per rank with the engine's view of its place on
the node (tests/test_slurm.py compares it with SLURM's own variables).

The engine takes the local rank from MPI (ranks sharing this node's memory, COMM_TYPE_SHARED),
not from SLURM_LOCALID, so the same code serves mpirun, srun and torchrun; the GPU a rank uses
is cuda:(local rank mod visible GPUs) (shardmd.domain.comm._pick_device)."""
import json
import os

from shardmd.domain.comm import init_comm, shutdown

comm = init_comm("cpu")
print(json.dumps({"rank": comm.rank, "size": comm.size, "local_rank": comm.local_rank,
                  "device": str(comm.device), "backend": comm.backend,
                  "SLURM_PROCID": os.environ.get("SLURM_PROCID"), "SLURM_LOCALID": os.environ.get("SLURM_LOCALID"),
                  "SLURM_NTASKS": os.environ.get("SLURM_NTASKS")}), flush=True)
shutdown(comm)
