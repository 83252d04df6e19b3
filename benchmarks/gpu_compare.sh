#!/usr/bin/env bash
# The comparison table on a GPU: this repo, nnx-ppo 0.3.0 and Brax PPO on config A
# at 4,096 envs (compare.py's `large` workload), one run each. One command:
#
#   bash benchmarks/gpu_compare.sh
#
# Each library is first installed with CUDA JAX into its own cached venv
# (~/.cache/nnx-ppo-bench/<name>-cuda; downloads once, not timed); the runs then
# take under 5 minutes. Every run is held to the GPU (JAX_PLATFORMS=cuda), so a
# machine or venv without one fails the run instead of timing the CPU. Record the
# table in benchmarks/README.md with the date and the device line it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/peers.py --platform cuda ours nnx-ppo-0.3.0 brax
timeout 290 python benchmarks/compare.py --platform cuda --workloads large --repeats 1 \
  --peers nnx-ppo-0.3.0,brax
