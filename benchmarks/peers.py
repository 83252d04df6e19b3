"""The benchmark's libraries, each in its own cached virtual environment.

Every library is installed from the package registry into
``~/.cache/nnx-ppo-bench/<name>/venv`` the first time it is needed and reused
after that. Next to each venv, ``install.json`` records the requirement list it
was built from, the outcome, and ``pip freeze`` (the exact versions); a venv is
rebuilt when its requirement list changes. A failed install is remembered too
(with pip's last lines as the reason) and retried only with ``--reinstall``.

    python benchmarks/peers.py            # install or check every peer
    python benchmarks/peers.py brax       # one peer
    python benchmarks/peers.py --platform cuda ours brax   # with CUDA JAX, for a GPU

With ``--platform cuda`` each library gets a venv of its own beside the CPU one
(``<name>-cuda``), its JAX installed with the ``cuda12`` extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("NNX_PPO_BENCH_CACHE", Path.home() / ".cache" / "nnx-ppo-bench"))

# Left free, pip picks mujoco 4.0.0 beside mujoco-mjx 3.17.0, and with warp-lang
# under 1.13 (nnx-ppo 0.3.0's own extras pin) mujoco-mjx 3.17's import of its warp
# backend fails; one consistent MuJoCo stack (mujoco-mjx 3.17's "warp" extra pins
# warp-lang 1.18.0) for every Playground venv. The runs use impl="jax" (no warp).
_MUJOCO = ("mujoco==3.17.0", "mujoco-mjx==3.17.0", "warp-lang==1.18.0")


@dataclasses.dataclass(frozen=True)
class Peer:
    """One library to benchmark: a name, its pip requirements and its timing script."""

    name: str
    requirements: tuple[str, ...]
    script: str
    label: str
    editable: bool = False

    @property
    def root(self) -> Path:
        """The peer's cache folder."""
        return CACHE / self.name

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.root / "venv" / "bin" / "python"


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer(
            "ours",
            (f"-e {REPO}[playground]", *_MUJOCO),
            "bench_nnx_ppo.py",
            "nnx-ppo (this repo)",
            editable=True,
        ),
        Peer(
            "nnx-ppo-0.3.0",
            ("nnx-ppo==0.3.0", "playground==0.2.0", *_MUJOCO),
            "bench_nnx_ppo.py",
            "nnx-ppo 0.3.0",
        ),
        Peer(
            "brax",
            ("brax==0.14.2", "jax<0.10", "playground==0.2.0", *_MUJOCO),
            "bench_brax.py",
            "Brax PPO 0.14.2",
        ),
        Peer(
            "rejax",
            # gymnax 1.0's step returns one more value than rejax 0.1.3 unpacks.
            ("rejax==0.1.3", "gymnax==0.0.9"),
            "bench_rejax.py",
            "rejax 0.1.3",
        ),
    )
}


@dataclasses.dataclass
class InstallRecord:
    """What ``install.json`` holds: the outcome of building one peer's venv."""

    requirements: list[str]
    ok: bool
    reason: str = ""
    freeze: list[str] = dataclasses.field(default_factory=list)

    def version_of(self, package: str) -> str:
        """The pinned version of ``package`` in the venv, or ``"?"``.

        An editable install shows in ``pip freeze`` as a comment, ``# Editable ...
        (name==version)``, followed by ``-e <path>``; its version is marked editable.
        """
        key = package.lower().replace("_", "-")
        for line in self.freeze:
            text = line.strip("# ").split("(")[-1].rstrip(")") if "Editable" in line else line
            name, _, version = text.partition("==")
            if name.strip().lower().replace("_", "-") == key:
                return f"{version} (editable)" if "Editable" in line else version
        return "?"


def _record_path(peer: Peer) -> Path:
    return peer.root / "install.json"


def load_record(peer: Peer) -> InstallRecord | None:
    """The peer's install record, or ``None`` if it was never installed."""
    path = _record_path(peer)
    if not path.exists():
        return None
    return InstallRecord(**json.loads(path.read_text()))


def _pip_args(requirements: tuple[str, ...]) -> list[str]:
    args: list[str] = []
    for requirement in requirements:
        args.extend(requirement.split(" ", 1) if requirement.startswith("-e ") else [requirement])
    return args


def ensure(peer: Peer, reinstall: bool = False, quiet: bool = False) -> InstallRecord:
    """Install ``peer`` unless a matching venv (or a matching failure) is cached."""
    record = load_record(peer)
    wanted = list(peer.requirements)
    cached = record is not None and record.requirements == wanted and not reinstall
    if cached and record is not None and (not record.ok or peer.python.exists()):
        return record
    if peer.root.exists():
        shutil.rmtree(peer.root)
    peer.root.mkdir(parents=True)
    log = peer.root / "install.log"
    if not quiet:
        print(f"[install] {peer.name}: {' '.join(wanted)} (log: {log})", flush=True)
    with log.open("w") as out:
        steps = [
            [sys.executable, "-m", "venv", str(peer.root / "venv")],
            [str(peer.python), "-m", "pip", "install", "--upgrade", "pip"],
            [
                "nice",
                "-n",
                "19",
                str(peer.python),
                "-m",
                "pip",
                "install",
                *_pip_args(peer.requirements),
            ],
        ]
        for command in steps:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode:
                tail = log.read_text().strip().splitlines()[-12:]
                record = InstallRecord(wanted, ok=False, reason="\n".join(tail))
                break
        else:
            freeze = subprocess.run(
                [str(peer.python), "-m", "pip", "freeze"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            record = InstallRecord(wanted, ok=True, freeze=freeze)
    _record_path(peer).write_text(json.dumps(dataclasses.asdict(record), indent=1))
    if not quiet:
        print(f"[install] {peer.name}: {'ok' if record.ok else 'FAILED'}", flush=True)
    return record


PLATFORMS = ("cpu", "cuda")


def _with_cuda_jax(requirement: str) -> str:
    """``jax<0.10`` as ``jax[cuda12]<0.10``; any other requirement unchanged."""
    match = re.fullmatch(r"jax([<>=!~].*)?", requirement)
    return requirement if match is None else f"jax[cuda12]{match.group(1) or ''}"


def peers_for(platform: str) -> dict[str, Peer]:
    """The peers as installed for ``platform``: :data:`PEERS` on CPU; CUDA venvs of their own."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; choose from {', '.join(PLATFORMS)}")
    if platform == "cpu":
        return PEERS
    cuda = {}
    for name, peer in PEERS.items():
        requirements = tuple(_with_cuda_jax(r) for r in peer.requirements)
        if requirements == peer.requirements:  # no JAX pin of its own: the latest with CUDA
            requirements += ("jax[cuda12]",)
        cuda[name] = dataclasses.replace(peer, name=f"{name}-cuda", requirements=requirements)
    return cuda


def main() -> None:
    parser = argparse.ArgumentParser(description="install or check the benchmark's peer venvs")
    parser.add_argument("names", nargs="*", help=f"peers to install, of {', '.join(PEERS)}")
    parser.add_argument("--platform", choices=PLATFORMS, default="cpu")
    parser.add_argument("--reinstall", action="store_true")
    args = parser.parse_args()
    peers = peers_for(args.platform)
    for name in args.names or list(peers):
        record = ensure(peers[name], args.reinstall)
        status = "ok" if record.ok else f"FAILED:\n{record.reason}"
        print(f"{name}: {status}")


if __name__ == "__main__":
    main()
