"""``nnx-ppo check``: the contract test kit from the command line, for CI without a test file.

::

    nnx-ppo check my_project.cells:make_cell --input-shape 4
    nnx-ppo check my_project.cells:MyCell --example-input sample.npz --max-examples 50

``MODULE:FACTORY`` names a ``StatefulModule``, or a function of no arguments that
builds one (a class whose constructor needs no arguments included), importable
from the current directory as with ``python -m``. The example input is one
sample, without the batch axis: ``--input-shape`` (and ``--input-dtype``) give
its shape, or ``--example-input`` a ``.npy`` file (one array) or ``.npz`` file (a
dict of arrays, by name). The command runs :func:`nnx_ppo.testing.check_module`
and exits 0 when every property holds, 1 with the kit's message when one fails,
and 2 when the arguments are wrong.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

__all__ = ["add_parser", "load_named", "run"]


def add_parser(commands: Any) -> None:
    """Add the ``check`` subcommand to the ``nnx-ppo`` parser's subcommands."""
    check = commands.add_parser(
        "check", help="check a module against the contract (the test kit's check_module)"
    )
    check.add_argument(
        "target",
        metavar="MODULE:FACTORY",
        help="the module, or a function of no arguments that builds it, e.g. my_pkg.cells:make",
    )
    example = check.add_mutually_exclusive_group(required=True)
    example.add_argument(
        "--input-shape",
        type=_dimension,
        nargs="*",
        metavar="N",
        help="the shape of one sample's input, without the batch axis, e.g. --input-shape 4 "
        "(no numbers: a scalar)",
    )
    example.add_argument(
        "--example-input",
        type=Path,
        metavar="FILE",
        help="one sample's input: a .npy array or a .npz dict of arrays, without the batch axis",
    )
    check.add_argument(
        "--input-dtype",
        metavar="DTYPE",
        help="the dtype of --input-shape (default float32)",
    )
    check.add_argument(
        "--max-examples",
        type=int,
        metavar="N",
        help="Hypothesis examples (default: NNX_PPO_MAX_EXAMPLES, else 10)",
    )
    check.add_argument("--batch-sizes", type=int, nargs="+", metavar="B", help="batch sizes")
    check.add_argument("--time-lengths", type=int, nargs="+", metavar="T", help="rollout lengths")
    drawing = check.add_mutually_exclusive_group()
    drawing.add_argument(
        "--stochastic", action="store_true", help="the module draws random numbers every step"
    )
    drawing.add_argument(
        "--stochastic-per-episode",
        action="store_true",
        help="the module draws random numbers once per episode, at reset",
    )
    check.add_argument(
        "--not-episodic",
        action="store_true",
        help="the module remembers across episodes on purpose (skips 'episodes are independent')",
    )


def _dimension(text: str) -> int:
    """An argparse type: an axis length, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        # --input-shape takes every word up to the next flag, so a target written after it
        # lands here rather than in MODULE:FACTORY.
        target_hint = (
            f"; MODULE:FACTORY goes before --input-shape, e.g. nnx-ppo check {text} --input-shape 4"
            if ":" in text
            else ""
        )
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer{target_hint}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not an axis length (0 or more)")
    return value


def load_named(target: str) -> Any:
    """The object ``MODULE:FACTORY`` names (attributes may be dotted: ``pkg.mod:Class.make``),
    importable from the current directory as with ``python -m``."""
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"expected MODULE:FACTORY, e.g. my_pkg.cells:make_cell, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:  # importing runs the user's code: whatever it raises means it cannot be imported
        found: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as error:  # a script's sys.exit() too: not a pass
        raise ValueError(f"cannot import {module_name}: {type(error).__name__}: {error}") from error
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    return found


def _example_input(args: argparse.Namespace) -> Any:
    import jax

    if args.input_shape is not None:
        try:
            dtype = np.dtype(args.input_dtype or "float32")
        except TypeError:
            raise ValueError(f"--input-dtype {args.input_dtype!r} is not a dtype") from None
        return jax.ShapeDtypeStruct(tuple(args.input_shape), dtype)
    path: Path = args.example_input
    if args.input_dtype is not None:
        raise ValueError("--input-dtype goes with --input-shape; --example-input keeps its dtypes")
    if path.suffix not in (".npy", ".npz"):
        raise ValueError(f"--example-input must be a .npy or .npz file, got {path}")
    if not path.exists():
        raise FileNotFoundError(f"--example-input {path} does not exist")
    try:  # allow_pickle stays off: an input is numeric arrays
        loaded = np.load(path)
        if isinstance(loaded, np.ndarray):
            return loaded
        with loaded:  # a .npz reads each array lazily, here
            return {name: loaded[name] for name in loaded.files}
    except (ValueError, OSError) as error:
        raise ValueError(
            f"--example-input {path} is not a .npy or .npz file of numeric arrays ({error})"
        ) from error


def run(args: argparse.Namespace, console: Console) -> int:
    """Run ``nnx-ppo check``; returns the exit status."""
    try:
        from nnx_ppo.testing import ContractPropertyError, check_module
    except ModuleNotFoundError as error:
        if error.name != "hypothesis":
            raise
        raise ValueError(
            "nnx-ppo check needs Hypothesis: pip install 'nnx-ppo[testing]'"
        ) from error
    from flax import nnx

    from nnx_ppo.networks.types import StatefulModule, stateless_hint

    found = load_named(args.target)
    example_input = _example_input(args)
    module = found
    # A Flax module is callable too, but not a factory: it is named below, not called.
    if not isinstance(module, StatefulModule | nnx.Module) and callable(module):
        try:
            module = module()
        except (Exception, SystemExit) as error:
            raise ValueError(f"{args.target}() raised {type(error).__name__}: {error}") from error
    if not isinstance(module, StatefulModule):
        env_hint = (
            "; it looks like an environment, which nnx-ppo check does not take: check it "
            "with nnx_ppo.testing.check_env in your tests"
            if callable(getattr(module, "reset", None)) and callable(getattr(module, "step", None))
            else stateless_hint(module)
        )
        raise ValueError(
            f"{args.target} gives a value of type {type(module).__name__}: expected a "
            f"StatefulModule or a function of no arguments that builds one{env_hint}"
        )
    stochastic = "per_episode" if args.stochastic_per_episode else args.stochastic
    options: dict[str, Any] = {"stochastic": stochastic, "episodic": not args.not_episodic}
    for option in ("max_examples", "batch_sizes", "time_lengths"):
        if getattr(args, option) is not None:
            options[option] = getattr(args, option)
    try:
        check_module(module, example_input, **options)
    except ContractPropertyError as failure:
        # The message, and Hypothesis's note of the failing example (its episode ends,
        # permutation and subset).
        report = "\n".join([str(failure), *getattr(failure, "__notes__", [])])
        console.print(report, markup=False, highlight=False, soft_wrap=True)
        return 1
    skipped = " (but 'episodes are independent', skipped by --not-episodic)"
    console.print(
        f"{args.target}: {type(module).__name__} has every property of the contract "
        f"that check_module checks{skipped if args.not_episodic else ''}.",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 0
