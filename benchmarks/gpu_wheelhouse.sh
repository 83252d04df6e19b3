#!/usr/bin/env bash
# Wheels for gpu_compare.sh on a GPU machine that cannot reach the package registry:
# everything the benchmark's libraries need that a CUDA image with JAX, Flax, Optax,
# Orbax, jaxtyping and equinox lacks. Run where the registry is reachable:
#
#   bash benchmarks/gpu_wheelhouse.sh [FOLDER] [PYTHON_VERSION]   # default .whl 3.12
#
# then carry FOLDER to the GPU machine and run `bash benchmarks/gpu_compare.sh FOLDER`.
# Pins as in peers.py; the wheels are for x86-64 Linux (about 45 MB).
set -euo pipefail
folder=${1:-.whl}
version=${2:-3.12}
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  platforms+=(--platform "$tag")
done
python3 -m pip download --no-deps --only-binary=:all: --implementation cp \
  --python-version "$version" "${platforms[@]}" -d "$folder" \
  beartype==0.23.1 tensorboardX==2.6.5 mujoco==3.17.0 mujoco-mjx==3.17.0 playground==0.2.0 \
  brax==0.14.2 ml_collections==1.1.0 mediapy==1.2.7 trimesh==5.2.0 jaxopt==0.8.5 nnx-ppo==0.3.0
