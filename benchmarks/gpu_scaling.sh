#!/usr/bin/env bash
# Data-parallel scaling on a machine with several GPUs: one command, under 5 minutes.
#
#   pip install -e . "jax[cuda12]" && bash benchmarks/gpu_scaling.sh
#
# Trains cart-pole with 4096 envs over 1, 2, 4, ... of the machine's GPUs (up to all of
# them) and prints steady-state env steps/s per device count, with the ratio to one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
count=$(JAX_PLATFORMS=gpu python -c "import jax; print(jax.device_count())")
devices=(1)
next=2
while [ "$next" -le "$count" ]; do
  devices+=("$next")
  next=$((next * 2))
done
timeout 290 python benchmarks/scaling.py --platform gpu --devices "${devices[@]}" \
  --n-envs 4096 --rollout-length 32 --n-minibatches 8 --n-epochs 4 --repeats 5
