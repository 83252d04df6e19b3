"""A checkpoint gives back the values a network held, as JAX held them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import pytest
from flax import nnx

from nnx_ppo.algorithms.checkpointing import (
    CheckpointError,
    NoCheckpointError,
    find_checkpoint,
    load_checkpoint,
    make_checkpoint_fn,
    step_directory,
)
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import new_training_state, train_ppo
from nnx_ppo.envs import make
from nnx_ppo.networks import Sequential
from nnx_ppo.networks.factories import make_discrete_mlp_actor_critic
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

CONFIG = TrainConfig(
    ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=32, n_minibatches=2, n_epochs=1),
    eval=EvalConfig(enabled=False),
)


class Constants(StatefulModule):
    """Weakly typed scale and offsets (they keep a bfloat16 input bfloat16), a Python-int gain."""

    def __init__(self, dtype: Any = None) -> None:
        self.scale = nnx.Variable(jnp.asarray(0.5))
        self.offsets = nnx.Variable(jnp.full((4,), 0.25))
        self.gain = nnx.Variable(2 if dtype is None else jnp.asarray(2, dtype))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        scaled = (x.astype(jnp.bfloat16) + self.offsets[...]) * self.scale[...] * self.gain[...]
        return StatefulModuleOutput(state, scaled.astype(jnp.float32), jnp.zeros(()), {})


def _policy() -> StatefulModule:
    return make_discrete_mlp_actor_critic(4, 2, [8], [8], nnx.Rngs(0))


def _network(dtype: Any = None) -> Sequential:
    return Sequential([Constants(dtype), _policy()])


def test_weak_types_and_python_numbers_come_back_as_jax_held_them(tmp_path) -> None:
    # The scale came back strongly typed (a bfloat16 input then computed in float32, so
    # a loaded network disagreed with the trained one), and the gain's step-0 checkpoint
    # said int64 where later ones said int32: only the first loaded.
    train_ppo(make("cartpole"), _network(), CONFIG, checkpoint_fn=make_checkpoint_fn(tmp_path))
    loaded = _network()
    load_checkpoint(tmp_path, loaded)
    constants = loaded.layers[0]
    assert constants.scale[...].weak_type and constants.scale[...].dtype == jnp.float32
    # A weakly typed array of several elements came back strongly typed.
    assert constants.offsets[...].weak_type and constants.offsets[...].dtype == jnp.float32
    assert (jnp.ones(4, jnp.bfloat16) + constants.offsets[...]).dtype == jnp.bfloat16
    assert constants.offsets[...].tolist() == [0.25] * 4
    assert int(constants.gain[...]) == 2
    assert (jnp.ones(4, jnp.bfloat16) * constants.scale[...]).dtype == jnp.bfloat16
    template = new_training_state(make("cartpole"), _network(), 4, seed=0)
    load_checkpoint(tmp_path, template)  # a resume's template too


def test_a_dtype_change_alone_is_named_as_the_network_s(tmp_path) -> None:
    # It was blamed on the optimizer's settings: only shape changes were counted.
    state = new_training_state(make("cartpole"), _network(), 4, seed=0)
    make_checkpoint_fn(tmp_path)(state, 0)
    with pytest.raises(CheckpointError, match="does not fit this network") as caught:
        load_checkpoint(tmp_path, _network(jnp.int16))
    assert "['gain'].value is shape () int32 in the checkpoint but shape () int16 here" in str(
        caught.value
    )


class EmptyCarry(StatefulModule):
    """A carry leaf with no elements: a bank of zero slots."""

    def initialize_state(self, batch_size: int) -> dict[str, Any]:
        return {"slots": jnp.zeros((batch_size, 0))}

    def reset_state(self, prev_state: Any) -> Any:
        return prev_state

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x, jnp.zeros(()), {})


def test_a_carry_leaf_without_elements_trains() -> None:
    # The minibatch gather reshaped it with -1: integer modulo by zero.
    network = Sequential([EmptyCarry(), _policy()])
    result = train_ppo(make("cartpole"), network, CONFIG)
    assert result.total_steps == 32


class Statistic(nnx.Variable):
    """A statistic of its own kind: never trained."""


class Centre(StatefulModule):
    def __init__(self, kind: type[nnx.Variable]) -> None:
        self.mean = kind(jnp.zeros(4))

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        return StatefulModuleOutput(state, x - self.mean[...], jnp.zeros(()), {})


def test_a_statistic_loaded_where_the_network_has_a_parameter_is_named(tmp_path) -> None:
    # It loaded silently into the nnx.Param, which the optimizer would then train.
    saved = Sequential([Centre(Statistic), _policy()])
    make_checkpoint_fn(tmp_path)(new_training_state(make("cartpole"), saved, 4, seed=0), 0)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path, Sequential([Centre(nnx.Param), _policy()]))
    assert "['mean'].value is held by an nnx Statistic in the checkpoint but by an nnx Param" in (
        str(caught.value)
    )
    load_checkpoint(tmp_path, Sequential([Centre(Statistic), _policy()]))


def test_one_checkpoint_fn_given_a_second_run_refuses_it(tmp_path) -> None:
    # It skipped every step it had written before: the second run's checkpoints were
    # silently the first run's.
    save = make_checkpoint_fn(tmp_path, CONFIG)
    first = train_ppo(make("cartpole"), _policy(), CONFIG, seed=0, checkpoint_fn=save)
    save(first.training_state, first.total_steps)  # the same state again: nothing to write
    with pytest.raises(CheckpointError, match="this checkpoint_fn wrote step 32 into"):
        train_ppo(make("cartpole"), _policy(), CONFIG, seed=1, checkpoint_fn=save)


def test_a_newest_checkpoint_removed_while_it_is_read_gives_way_to_the_next(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nnx-ppo eval beside a live run: the run's rotation removed the checkpoint being
    # read, and the load called it corrupted.
    import shutil

    from nnx_ppo.algorithms import checkpointing

    config = TrainConfig(ppo=CONFIG.ppo, eval=CONFIG.eval, checkpoint_every_steps=16)
    train_ppo(make("cartpole"), _policy(), config, checkpoint_fn=make_checkpoint_fn(tmp_path))
    restore = checkpointing._restore_arrays
    removed: list[int] = []

    def rotated_away(root, step, abstract):
        if not removed:  # the trainer's keep_last removes it mid-read
            removed.append(step)
            shutil.rmtree(checkpointing.step_directory(root, step))
            raise FileNotFoundError("Checkpoint not found")
        return restore(root, step, abstract)

    monkeypatch.setattr(checkpointing, "_restore_arrays", rotated_away)
    assert load_checkpoint(tmp_path, _policy())["step"] == 16
    assert removed == [32]
    removed.clear()
    with pytest.raises(CheckpointError, match="could not be read"):  # that step, or nothing
        load_checkpoint(tmp_path, _policy(), step=16)


def test_a_step_given_as_a_whole_float_loads_and_other_forms_are_refused(tmp_path) -> None:
    # Metrics log total_steps as a float: step=16.0 reached Orbax and was reported as a
    # corrupted checkpoint to remove; "16" as a missing one; a file as NotADirectoryError.

    config = TrainConfig(ppo=CONFIG.ppo, eval=CONFIG.eval, checkpoint_every_steps=16)
    train_ppo(make("cartpole"), _policy(), config, checkpoint_fn=make_checkpoint_fn(tmp_path))
    assert load_checkpoint(tmp_path, _policy(), step=16.0)["step"] == 16
    assert find_checkpoint(tmp_path, 16.0) == (tmp_path, 16)
    with pytest.raises(TypeError, match=r"^load_checkpoint: step must be an int, got str '16'"):
        load_checkpoint(tmp_path, _policy(), step="16")
    with pytest.raises(TypeError, match=r"^find_checkpoint: step must be an int, got float 1.5"):
        find_checkpoint(tmp_path, 1.5)
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(NoCheckpointError, match=r"notes.txt is a file; pass a run directory"):
        find_checkpoint(tmp_path / "notes.txt")


def test_a_checkpoints_config_and_metadata_are_checked_and_named(tmp_path) -> None:
    # Neither had a checksum: a changed value was taken for the run's own (the CLI told
    # the user to put config.json back), and a field this version does not know was
    # reported as the user's config, naming no checkpoint.
    import json

    from nnx_ppo.algorithms import checkpointing
    from nnx_ppo.algorithms.checkpointing import read_metadata

    config = TrainConfig(ppo=CONFIG.ppo, eval=CONFIG.eval, checkpoint_every_steps=16)
    save = make_checkpoint_fn(tmp_path, config, metadata={"run": {"activation": "tanh"}})
    train_ppo(make("cartpole"), _policy(), config, checkpoint_fn=save)
    step_dir = checkpointing.step_directory(tmp_path, 32)
    assert read_metadata(tmp_path) == {"run": {"activation": "tanh"}}
    assert load_checkpoint(tmp_path, _policy())["config"] == config

    def edit(item: str, change: Any) -> None:
        path = step_dir / item / "metadata"
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))

    edit("metadata", lambda m: m["run"].update(activation="tanj"))
    corrupted = rf"checkpoint {step_dir} is corrupted: its metadata does not match"
    with pytest.raises(CheckpointError, match=corrupted):
        read_metadata(tmp_path)
    with pytest.raises(CheckpointError, match=corrupted + r".*complete: remove"):
        load_checkpoint(tmp_path, _policy())
    edit("metadata", lambda m: m["run"].update(activation="tanh"))
    edit("config", lambda c: c["ppo"].update(old_field=1))
    with pytest.raises(CheckpointError, match=rf"{step_dir} is corrupted: its config does not"):
        load_checkpoint(tmp_path, _policy())
    # Written so, with checksums to match: another version's config, named as such.
    manifest_path = step_dir / "manifest" / "metadata"
    manifest = json.loads(manifest_path.read_text())
    manifest["item_checksums"]["config"] = checkpointing._json_checksum(
        json.loads((step_dir / "config" / "metadata").read_text())
    )
    manifest["manifest_checksum"] = checkpointing._manifest_checksum(manifest)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        CheckpointError,
        match=rf"the config stored in checkpoint {step_dir} is not one this version of "
        r"nnx-ppo reads: unknown config fields ppo.old_field",
    ):
        load_checkpoint(tmp_path, _policy())


def test_a_run_resumed_from_an_earlier_checkpoint_of_its_directory_is_told_what_to_do(
    tmp_path,
) -> None:
    config = TrainConfig(ppo=CONFIG.ppo, eval=CONFIG.eval, checkpoint_every_steps=16)
    longer = TrainConfig(
        ppo=dataclasses.replace(CONFIG.ppo, total_steps=48),
        eval=CONFIG.eval,
        checkpoint_every_steps=16,
    )
    train_ppo(make("cartpole"), _policy(), longer, checkpoint_fn=make_checkpoint_fn(tmp_path))
    template = new_training_state(make("cartpole"), _policy(), 4, seed=0)
    # Its first save after 16, of step 32, comes before the directory's 48.
    state = load_checkpoint(tmp_path, template, step=16)["training_state"]
    with pytest.raises(CheckpointError, match="one resumed from an earlier checkpoint") as error:
        train_ppo(
            make("cartpole"),
            state.networks,
            config,
            initial_state=state,
            checkpoint_fn=make_checkpoint_fn(tmp_path),
        )
    assert "remove the checkpoints after the step resumed from" in str(error.value)


def test_a_directory_of_030_checkpoints_is_refused_before_anything_is_written(
    checkpoints_030: Path,
) -> None:
    # Orbax took 0.3.0's step directories for its own: the first save overwrote the one
    # of its step and keep_last removed the rest, without a word.
    before = {p: p.read_bytes() if p.is_file() else None for p in checkpoints_030.rglob("*")}
    state = new_training_state(make("cartpole"), _policy(), 4, seed=0)
    expected = (
        f"{step_directory(checkpoints_030, 0)} looks like a checkpoint of nnx-ppo 0.3.0 (it "
        "holds metadata.pkl, networks/, optimizer/), which this version cannot read or extend"
    )
    for step in (0, 20, 40):
        with pytest.raises(CheckpointError) as caught:
            make_checkpoint_fn(checkpoints_030, keep_last=1)(state, step)
        assert expected in str(caught.value)
    assert {p: p.read_bytes() if p.is_file() else None for p in checkpoints_030.rglob("*")} == (
        before
    )


def test_a_step_directory_of_something_else_is_refused_and_a_killed_write_is_replaced(
    tmp_path: Path,
) -> None:
    state = new_training_state(make("cartpole"), _policy(), 4, seed=0)
    notes = step_directory(tmp_path, 16) / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("kept")
    with pytest.raises(CheckpointError, match=r"step_0000000016 is not a checkpoint of make_che"):
        make_checkpoint_fn(tmp_path)(state, 16)
    assert notes.read_text() == "kept"
    # What Orbax leaves of a write killed mid-way is this version's own, written anew.
    shutil.rmtree(notes.parent)
    (step_directory(tmp_path, 16) / "arrays.orbax-checkpoint-tmp-1700000000").mkdir(parents=True)
    make_checkpoint_fn(tmp_path)(state, 16)
    assert find_checkpoint(tmp_path) == (tmp_path, 16)


def test_loading_a_030_checkpoint_names_its_version_not_a_missing_one(
    checkpoints_030: Path,
) -> None:
    # It said "no checkpoint ... expected step directories (e.g. .../step_0000100000)",
    # for a step directory too, inside it.
    for path in (checkpoints_030, step_directory(checkpoints_030, 20)):
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint(path, _policy())
        message = str(caught.value)
        assert not isinstance(caught.value, NoCheckpointError)
        assert "is a checkpoint of nnx-ppo 0.3.0 (it holds metadata.pkl, networks/, " in message
        assert "latest/migration.html#checkpoints" in message
        assert "step_0000100000" not in message
    assert (
        "\nCheckpoints\n-----------\n"
        in (Path(__file__).parents[2] / "docs" / "migration.rst").read_text()
    )


def test_a_step_directory_without_a_manifest_names_its_checkpoints_directory(
    tmp_path: Path,
) -> None:
    step_dir = step_directory(tmp_path, 16)
    (step_dir / "arrays").mkdir(parents=True)
    with pytest.raises(NoCheckpointError) as caught:
        find_checkpoint(step_dir)
    assert f"pass its checkpoints directory {tmp_path} to load the latest" in str(caught.value)
    assert "step_0000100000" not in str(caught.value)


def test_a_step_directory_that_lost_its_manifest_passed_itself_is_named_damaged(
    tmp_path: Path,
) -> None:
    # It said a cut write leaves such a directory and to pass the checkpoints directory,
    # which then named it damaged: Orbax's metadata shows the write had finished.
    state = new_training_state(make("cartpole"), _policy(), 4, seed=0)
    save = make_checkpoint_fn(tmp_path)
    save(state, 8)
    save(state, 16)
    damaged = step_directory(tmp_path, 16)
    shutil.rmtree(damaged / "manifest")
    for target in (damaged, tmp_path):
        with pytest.raises(CheckpointError) as caught:
            find_checkpoint(target)
        assert not isinstance(caught.value, NoCheckpointError)
        assert str(caught.value) == (
            f"checkpoint {damaged} is incomplete or corrupted: its manifest/ "
            f"(make_checkpoint_fn's) is missing. The checkpoint of step 8 is complete: "
            f"remove {damaged} to resume from it"
        )


def test_returns_of_episodes_in_progress_saved_narrower_are_widened_as_they_load(tmp_path):
    # Before returns were summed in float32 or wider, an env of bfloat16 rewards saved
    # them as bfloat16: such a checkpoint was refused as of another architecture.
    state = new_training_state(make("cartpole"), _network(), 4, seed=0)
    running = state.running_episodes
    saved_returns = jnp.array([1.5, 2.0, 256.0, 3.0], jnp.bfloat16)
    older = state.replace(running_episodes=running.replace(returns=saved_returns))
    make_checkpoint_fn(tmp_path)(older, 0)
    loaded = load_checkpoint(tmp_path, state)["training_state"].running_episodes.returns
    assert loaded.dtype == jnp.float32
    assert loaded.tolist() == [1.5, 2.0, 256.0, 3.0]
    # Narrower than saved is another matter: a float32 return does not load as bfloat16.
    narrower = state.replace(
        running_episodes=running.replace(returns=running.returns.astype(jnp.bfloat16))
    )
    make_checkpoint_fn(tmp_path / "wide")(state, 0)
    with pytest.raises(CheckpointError, match=r"returns is shape \(4,\) float32 in the check"):
        load_checkpoint(tmp_path / "wide", narrower)
