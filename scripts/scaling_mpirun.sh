#!/bin/bash
# Strong and weak scaling with mpirun/mpiexec, one rank per GPU (or per core on CPU).
#   scripts/scaling_mpirun.sh                       # LJ on CPU, 1 and 2 ranks (this machine)
#   DEVICE=cuda RANKS="1 2 4 8" MODEL=lj STRONG=8000000 WEAK=1000000 scripts/scaling_mpirun.sh
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
LAUNCHER=${LAUNCHER:-mpiexec}
python scripts/scaling.py --launcher "$LAUNCHER" --ranks ${RANKS:-1 2} --model "${MODEL:-lj}" \
  --strong-atoms "${STRONG:-32000}" --weak-atoms "${WEAK:-16000}" --steps "${STEPS:-100}" \
  --device "${DEVICE:-cpu}" --precision "${PRECISION:-float64}" --json "${JSON:-scaling.json}" "$@"
# plot: python scripts/plot_scaling.py scaling.json --out scaling.png
