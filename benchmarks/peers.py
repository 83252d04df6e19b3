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

On a machine that cannot reach the registry but whose Python already holds JAX
for its accelerator (a GPU image), ``--wheelhouse DIR`` builds each venv over
that Python's packages and installs, without dependencies and without an
index, every wheel in ``DIR``: the packages the image lacks.
``DIR`` holds one ``nnx-ppo`` wheel, 0.3.0's; the other venvs leave it out, and
this repo's venv puts ``src/`` on its path instead (an editable install would
need the build backend from the registry). The image's own JAX,
Flax and Optax versions are the ones timed, for every library::

    python benchmarks/peers.py --platform cuda --wheelhouse .whl ours brax
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import site
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
    wheelhouse: Path | None = None
    """Where an offline venv's wheels come from; ``None`` for a venv from the registry."""

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
        A wheel installed from a file shows as ``name @ file:///.../name-version-...whl``.
        """
        key = package.lower().replace("_", "-")
        for line in self.freeze:
            text = line.strip("# ").split("(")[-1].rstrip(")") if "Editable" in line else line
            from_wheel = re.fullmatch(r"(\S+) @ \S*/[^/-]+-([^-/]+)-[^/]*\.whl(#\S*)?", text)
            if from_wheel:
                text = f"{from_wheel.group(1)}=={from_wheel.group(2)}"
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


def _registry_steps(peer: Peer) -> list[list[str]]:
    """A fresh venv, then the peer's requirements from the package registry."""
    pip_install = [str(peer.python), "-m", "pip", "install"]
    return [
        [sys.executable, "-m", "venv", str(peer.root / "venv")],
        [*pip_install, "--upgrade", "pip"],
        ["nice", "-n", "19", *pip_install, *_pip_args(peer.requirements)],
    ]


def _offline_wheels(peer: Peer) -> list[str]:
    """The wheelhouse's wheels for ``peer``: all, nnx-ppo's only for the peer that pins it."""
    assert peer.wheelhouse is not None
    wheels = sorted(str(path) for path in peer.wheelhouse.glob("*.whl"))
    if any(requirement.startswith("nnx-ppo==") for requirement in peer.requirements):
        return wheels
    return [w for w in wheels if not Path(w).name.startswith("nnx_ppo-")]


def _offline_steps(peer: Peer) -> list[list[str]]:
    """A venv that sees this Python's packages, with the wheelhouse's wheels in front.

    ``--system-site-packages`` would not do: it reaches the base interpreter's
    packages, and a GPU image's Python is often a venv itself. A ``.pth`` file
    puts this Python's site folders (and, for this repo, ``src/``) on the path
    after the venv's own.
    """
    folders = [*site.getsitepackages(), *([str(REPO / "src")] if peer.editable else [])]
    code = (
        "import pathlib, sysconfig; "
        "pathlib.Path(sysconfig.get_path('purelib'), 'nnx_ppo_bench.pth')"
        f".write_text({chr(10).join(folders)!r})"
    )
    pip_install = [str(peer.python), "-m", "pip", "install"]
    return [
        # No pip of its own (an image's Python may lack ensurepip): the path reaches this one's.
        [sys.executable, "-m", "venv", "--without-pip", str(peer.root / "venv")],
        [str(peer.python), "-c", code],
        [*pip_install, "--no-index", "--no-deps", *_offline_wheels(peer)],
    ]


def ensure(peer: Peer, reinstall: bool = False, quiet: bool = False) -> InstallRecord:
    """Install ``peer`` unless a matching venv (or a matching failure) is cached."""
    record = load_record(peer)
    wanted = (
        ["offline", *(Path(w).name for w in _offline_wheels(peer))]
        if peer.wheelhouse
        else list(peer.requirements)
    )
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
        steps = _offline_steps(peer) if peer.wheelhouse else _registry_steps(peer)
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


def peers_for(platform: str, wheelhouse: Path | None = None) -> dict[str, Peer]:
    """The peers as installed for ``platform``: :data:`PEERS` on CPU; CUDA venvs of their own.

    With ``wheelhouse``, offline venvs over this Python's own packages
    (``<name>-<platform>-offline``), for every peer but rejax (no wheels for it).
    """
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; choose from {', '.join(PLATFORMS)}")
    if wheelhouse is not None:
        if not any(wheelhouse.glob("*.whl")):
            raise ValueError(f"the wheelhouse {wheelhouse} holds no wheels")
        return {
            name: dataclasses.replace(
                peer, name=f"{name}-{platform}-offline", wheelhouse=wheelhouse.resolve()
            )
            for name, peer in PEERS.items()
            if name != "rejax"
        }
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
    parser.add_argument("--wheelhouse", type=Path, help="offline: this Python plus these wheels")
    args = parser.parse_args()
    peers = peers_for(args.platform, args.wheelhouse)
    for name in args.names or list(peers):
        record = ensure(peers[name], args.reinstall)
        status = "ok" if record.ok else f"FAILED:\n{record.reason}"
        print(f"{name}: {status}")


if __name__ == "__main__":
    main()
