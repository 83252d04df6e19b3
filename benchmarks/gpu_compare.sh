#!/usr/bin/env bash
# The comparison table on a GPU: this repo, nnx-ppo 0.3.0 and Brax PPO on config A
# at 4,096 envs (compare.py's `large` workload), one run each. One command:
#
#   bash benchmarks/gpu_compare.sh              # venvs from the package registry
#   bash benchmarks/gpu_compare.sh WHEELHOUSE   # no registry: the image's own JAX
#
# Without an argument each library is first installed with CUDA JAX into its own
# cached venv (~/.cache/nnx-ppo-bench/<name>-cuda; downloads once, not timed).
# With a folder of wheels (made by gpu_wheelhouse.sh where a registry is
# reachable), each venv is built over this Python's packages, JAX included, and
# the wheels fill in what it lacks (peers.py says how). The runs then take under
# 5 minutes. Every run is held to the GPU (JAX_PLATFORMS=cuda), so a machine or
# venv without one fails the run instead of timing the CPU. Record the table in
# benchmarks/README.md with the date and the device line it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
offline=()
if [ $# -ge 1 ]; then
  offline=(--wheelhouse "$1")
fi
"$python" benchmarks/peers.py --platform cuda "${offline[@]}" ours nnx-ppo-0.3.0 brax
timeout "${GPU_COMPARE_TIMEOUT_S:-290}" "$python" benchmarks/compare.py --platform cuda \
  "${offline[@]}" --workloads large --repeats 1 --peers nnx-ppo-0.3.0,brax
