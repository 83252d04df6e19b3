"""Many runs in one program: equal to the runs one by one, with per-run logs and checkpoints."""

import copy
import functools
from typing import Any, ClassVar

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo, train_ppo_runs
from nnx_ppo.algorithms.types import TrainingState
from nnx_ppo.envs import CartPole, make
from nnx_ppo.envs.state import State
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_default_network
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.wrappers import Wrapper

ENV = make("cartpole")
STEP = 8 * 16


def config() -> TrainConfig:
    ppo = PPOConfig(
        n_envs=8,
        rollout_length=16,
        total_steps=4 * STEP,
        n_epochs=2,
        n_minibatches=2,
        learning_rate=1e-3,
        learning_rate_schedule="linear",
        gradient_clipping=0.5,
    )
    return TrainConfig(
        ppo=ppo,
        eval=EvalConfig(every_steps=2 * STEP, n_envs=4, max_episode_length=30),
        seed=0,
        checkpoint_every_steps=2 * STEP,
    )


def network(seed: int, width: int = 16) -> nnx.Module:
    return make_default_network(ENV, nnx.Rngs(seed), hidden_sizes=[width])


def parameters(module: nnx.Module) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(module, nnx.Param))]


def test_runs_in_one_program_equal_the_runs_one_by_one() -> None:
    logged: list[tuple[int, int, float | None]] = []
    saved: list[tuple[int, int, TrainingState]] = []
    results = train_ppo_runs(
        ENV,
        network,
        config(),
        seeds=[0, 1],
        learning_rates=[1e-3, 3e-3],
        log_fn=lambda run, metrics, step: logged.append(
            (run, step, metrics.get("eval/episode_reward/mean"))
        ),
        checkpoint_fn=lambda run, state, step: saved.append((run, step, state)),
    )
    for run, (seed, rate) in enumerate([(0, 1e-3), (1, 3e-3)]):
        single = copy.deepcopy(config())
        single.seed, single.ppo.learning_rate = seed, rate
        alone = network(seed)
        expected = train_ppo(ENV, alone, single)
        for got, want in zip(
            parameters(results[run].training_state.networks), parameters(alone), strict=True
        ):
            np.testing.assert_allclose(got, want, atol=1e-5)
        assert [h["step"] for h in results[run].eval_history] == [0, 2 * STEP, 4 * STEP]
        np.testing.assert_allclose(
            [h["episode_reward_mean"] for h in results[run].eval_history],
            [h["episode_reward_mean"] for h in expected.eval_history],
            rtol=1e-5,
        )
        assert [step for r, step, _ in logged if r == run] == [
            0,
            STEP,
            2 * STEP,
            3 * STEP,
            4 * STEP,
        ]
        assert [step for r, step, _ in saved if r == run] == [0, 2 * STEP, 4 * STEP]
        assert results[run].training_state.steps_taken == 4 * STEP
        # Not the clipping fraction: a count of ratios past a threshold, which a ratio
        # 1e-6 from it moves by a whole sample on another CPU.
        losses = sorted(
            k
            for k in expected.final_metrics
            if k.startswith("losses/") and "clipping_fraction" not in k
        )
        assert losses
        np.testing.assert_allclose(
            [results[run].final_metrics[k] for k in losses],
            [expected.final_metrics[k] for k in losses],
            rtol=1e-4,
            atol=1e-5,
        )
        # A checkpointed run, and a run's result, hold the optimizer state of a single run
        # at its rate, so they load into new_training_state(..., learning_rate=rate, ...).
        single_run = nnx.state(expected.training_state.optimizer)
        for held in (saved[-2 + run][2], results[run].training_state):
            state = nnx.state(held.optimizer)
            assert jax.tree.structure(state) == jax.tree.structure(single_run)
            for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(single_run), strict=True):
                np.testing.assert_allclose(got, want, atol=1e-5)
    final = [state for r, step, state in saved if step == 4 * STEP]
    assert [s.networks for s in final] == [r.training_state.networks for r in results]


class KeyedCartPole(CartPole):
    """CartPole that keeps a key in its state and draws observation noise from it each
    step, as MuJoCo Playground's envs keep ``info["rng"]``."""

    def reset(self, rng: jax.Array) -> State:
        state = super().reset(rng)
        return state.replace(info={**state.info, "rng": jax.random.fold_in(rng, 1)})

    def step(self, state: State, action: jax.Array) -> State:
        key, noise_key = jax.random.split(state.info["rng"])
        stepped = super().step(state, action)
        noise = 0.01 * jax.random.normal(noise_key, stepped.obs.shape)
        return stepped.replace(obs=stepped.obs + noise, info={**stepped.info, "rng": key})


def test_an_env_keeping_a_key_trains_in_one_program_as_alone() -> None:
    """The env's keys stay JAX's own inside the many-runs program, whatever key type the
    library draws with there: the env's state has the type its reset gave it."""
    env = KeyedCartPole()
    short = copy.deepcopy(config())
    short.ppo.total_steps, short.eval.enabled = 2 * STEP, False
    results = train_ppo_runs(
        env,
        lambda seed: make_default_network(env, nnx.Rngs(seed), hidden_sizes=[16]),
        short,
        seeds=[0, 1],
    )
    for seed, result in enumerate(results):
        single = copy.deepcopy(short)
        single.seed = seed
        alone = make_default_network(env, nnx.Rngs(seed), hidden_sizes=[16])
        trained = train_ppo(env, alone, single)
        for got, want in zip(
            parameters(result.training_state.networks), parameters(alone), strict=True
        ):
            np.testing.assert_allclose(got, want, atol=1e-5)
        keys = result.training_state.env_states.info["rng"]
        assert jax.random.key_impl(keys) == jax.random.key_impl(
            trained.training_state.env_states.info["rng"]
        )


def test_python_numbers_in_variables_train_in_one_program_as_alone() -> None:
    """A Variable may hold a Python number, as train_ppo takes it: the program holds it
    as JAX does (float32, int32, bool), and each run trains as alone."""

    def with_numbers(seed: int) -> nnx.Module:
        module = network(seed)
        module.scale, module.count, module.flag = (
            nnx.Variable(1.5),
            nnx.Variable(3),
            nnx.Variable(True),
        )
        return module

    short = copy.deepcopy(config())
    short.ppo.total_steps, short.eval.enabled = STEP, False
    results = train_ppo_runs(ENV, with_numbers, short, seeds=[0, 1])
    for seed, result in enumerate(results):
        single = copy.deepcopy(short)
        single.seed = seed
        alone = with_numbers(seed)
        train_ppo(ENV, alone, single)
        trained = result.training_state.networks
        for got, want in zip(parameters(trained), parameters(alone), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5)
        for name, value in [("scale", 1.5), ("count", 3), ("flag", True)]:
            held = getattr(trained, name)[...]
            assert held == value and held.dtype == jax.numpy.asarray(value).dtype


class HalfPrecisionScale(StatefulModule):
    """Scales its input in bfloat16 by a Variable holding a Python number, and records
    the number's type and the product's dtype each time it is traced."""

    seen: ClassVar[list[tuple[Any, np.dtype]]] = []

    def __init__(self) -> None:
        self.scale = nnx.Variable(0.5)

    def __call__(
        self, state: tuple[()], x: jax.Array, rollout_extras: None = None
    ) -> StatefulModuleOutput:
        scaled = x.astype(jnp.bfloat16) * self.scale[...]
        self.seen.append((jax.typeof(self.scale[...]), scaled.dtype))
        return StatefulModuleOutput((), scaled.astype(jnp.float32), jnp.zeros(()), {}, None)


def test_a_python_number_reaches_the_program_weakly_typed_as_in_train_ppo() -> None:
    """train_ppo passes a Variable's Python number as JAX holds it, weakly typed, so a
    bfloat16 computation with it stays bfloat16; the runs' stack held it as a float32
    array, which promoted the computation to float32."""

    def scaled_network(seed: int) -> nnx.Module:
        return Sequential([HalfPrecisionScale(), *network(seed, width=8).layers])

    tiny = TrainConfig(
        ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=16, n_epochs=1, n_minibatches=1),
        eval=EvalConfig(enabled=False),
    )
    HalfPrecisionScale.seen.clear()
    results = train_ppo_runs(ENV, scaled_network, tiny, seeds=[0, 1])
    assert HalfPrecisionScale.seen
    for held, product in HalfPrecisionScale.seen:
        assert (held.dtype, held.weak_type, product) == (jnp.float32, True, jnp.bfloat16)
    for result in results:  # and written back as train_ppo leaves it
        scale = result.training_state.networks.layers[0].scale[...]
        assert jax.typeof(scale).weak_type and scale == 0.5


_NUMBERS = st.one_of(
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)


@given(
    numbers=st.lists(st.tuples(_NUMBERS, st.booleans()), min_size=1, max_size=4),
    runs=st.integers(1, 3),
    as_array=st.booleans(),
)
def test_stacked_runs_keep_each_leafs_jax_type(
    numbers: list[tuple[bool | int | float, bool]], runs: int, as_array: bool
) -> None:
    """A run's leaf comes back from the stack as JAX held it: a Python number (or a
    weakly typed array) weakly typed, an array strongly, each with its dtype and value."""
    from nnx_ppo.algorithms._runs import _stack, _to_device, _to_host, _unstack

    def leaf(number: bool | int | float, weak: bool) -> Any:
        if not weak:
            return jnp.asarray(np.asarray(number, jax.typeof(number).dtype))
        return jnp.asarray(number) if as_array else number

    trees = [[leaf(number, weak) for number, weak in numbers] for _ in range(runs)]
    stacked = _stack(trees, None)
    for run, tree in enumerate(trees):
        back = _to_device(_unstack(_to_host(stacked), run), None)
        for got, want in zip(back, tree, strict=True):
            assert jax.typeof(got) == jax.typeof(want)
            assert got == want


def test_a_python_number_in_one_run_and_an_array_in_another_are_refused() -> None:
    # The program computes with run 0's weakly typed number in the dtype it meets, with
    # run 1's float32 array in float32: one program cannot do both.
    from nnx_ppo.algorithms._runs import _require_like_run_0

    def number_or_array(seed: int) -> tuple[nnx.Module, nnx.State]:
        module = network(seed, width=8)
        module.scale = nnx.Variable(0.5 if seed == 0 else jnp.float32(0.5))
        return module, nnx.split((module,))[1]

    with pytest.raises(
        ValueError,
        match=r"run 1's network differs .*scale is float32\[\] where run 0's is "
        r"float32\[\] \(weakly typed: a Python number\)",
    ):
        _require_like_run_0(1, number_or_array(1), number_or_array(0))


def test_a_video_config_is_warned_of_since_several_runs_record_none() -> None:
    short = copy.deepcopy(config())
    short.ppo.total_steps, short.eval.enabled, short.video.enabled = STEP, False, True
    with pytest.warns(UserWarning, match="train_ppo_runs records no videos"):
        train_ppo_runs(ENV, network, short, seeds=[0, 1])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "give seeds, learning_rates or both"),
        ({"seeds": []}, ValueError, "seeds is empty"),
        ({"learning_rates": []}, ValueError, "learning_rates is empty"),
        ({"seeds": 3}, TypeError, "seeds must be a sequence with one entry per run, got int"),
        ({"seeds": np.array(3)}, TypeError, r"seeds must be a sequence .*got a 0-d ndarray"),
        (
            {"learning_rates": np.array(1e-3)},
            TypeError,
            r"learning_rates must be a sequence .*got a 0-d ndarray of shape \(\); give a 1-d",
        ),
        (
            {"learning_rates": np.array([[1e-3, 2e-3]])},
            TypeError,
            r"learning_rates must be a sequence .*got a 2-d ndarray of shape \(1, 2\)",
        ),
        ({"seeds": [0, 1], "learning_rates": [1e-3]}, ValueError, "2 seeds but 1 learning_rates"),
        ({"learning_rates": [1e-3, 0.0]}, ValueError, r"learning_rates\[1\] must be > 0"),
        ({"learning_rates": [float("inf")]}, TypeError, r"learning_rates\[0\] must be a finite"),
        ({"learning_rates": ["1e-3"]}, TypeError, r"learning_rates\[0\] must be a finite"),
        ({"learning_rates": [True]}, TypeError, r"learning_rates\[0\] must be a finite"),
        ({"learning_rates": [[1e-3, 1e-4]]}, TypeError, r"learning_rates\[0\] must be a finite"),
        ({"seeds": [0, 0.5]}, TypeError, r"seeds\[1\] must be an int, got float"),
        ({"seeds": ["a"]}, TypeError, r"seeds\[0\] must be an int, got str"),
        (
            {"seeds": list(jax.random.split(jax.random.key(0), 2))},
            TypeError,
            r"seeds\[0\] must be an int, got PRNGKeyArray",
        ),
    ],
)
def test_bad_run_lists_are_named(kwargs: dict, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"train_ppo_runs: .*{message}"):
        train_ppo_runs(ENV, network, config(), **kwargs)


def test_networks_that_differ_between_runs_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"run 1's network differs from run 0's: .*out_features is 17 where"
    ):
        train_ppo_runs(ENV, lambda seed: network(seed, width=16 + seed), config(), seeds=[0, 1])
    one = network(0)
    with pytest.raises(ValueError, match="one network object for runs 0 and 1; each run trains"):
        train_ppo_runs(ENV, lambda seed: one, config(), seeds=[0, 1])


def test_callbacks_of_train_ppos_form_and_a_network_for_make_networks_are_named() -> None:
    # Refused before anything compiles: a two-argument log_fn failed only after step 0.
    with pytest.raises(
        TypeError,
        match=r"log_fn is called as log_fn\(run, metrics, step\), but <lambda>\(m, s\) cannot",
    ):
        train_ppo_runs(ENV, network, config(), seeds=[0, 1], log_fn=lambda m, s: None)
    with pytest.raises(TypeError, match=r"checkpoint_fn is called as checkpoint_fn\(run, "):
        train_ppo_runs(ENV, network, config(), seeds=[0, 1], checkpoint_fn=lambda s, t: None)
    with pytest.raises(TypeError, match=r"make_networks is called as make_networks\(seed\)"):
        train_ppo_runs(ENV, lambda: network(0), config(), seeds=[0, 1])
    with pytest.raises(TypeError, match=r"make_networks must build .* it is a network \(Seq"):
        train_ppo_runs(ENV, network(0), config(), seeds=[0, 1])  # type: ignore[arg-type]
    # Named where it happened, not as new_training_state's, which the caller never called.
    with pytest.raises(
        TypeError,
        match=r"train_ppo_runs: make_networks\(3\) \(run 0\) returned a NoneType, not a "
        r"StatefulModule .*forget to return it",
    ):
        train_ppo_runs(ENV, lambda seed: None, config(), seeds=[3, 4])  # type: ignore[arg-type]


def test_a_static_hyperparameter_that_differs_between_runs_is_refused() -> None:
    # The program is traced from run 0's network: run 1 would train with run 0's weight.
    def entropy_swept(seed: int) -> nnx.Module:
        weight = [0.0, 0.5][seed]
        return make_default_network(ENV, nnx.Rngs(seed), hidden_sizes=[16], entropy_weight=weight)

    with pytest.raises(
        ValueError, match=r"run 1's network differs .*entropy_weight is 0.5 where run 0's is 0.0"
    ):
        train_ppo_runs(ENV, entropy_swept, config(), seeds=[0, 1])


def test_parameters_of_another_dtype_are_refused_not_cast() -> None:
    def half_precision_run_1(seed: int) -> nnx.Module:
        module = network(seed)
        if seed == 1:
            params = nnx.state(module, nnx.Param)
            nnx.update(module, jax.tree.map(lambda x: x.astype(jax.numpy.bfloat16), params))
        return module

    with pytest.raises(ValueError, match=r"run 1's network differs .* is bfloat16\[16"):
        train_ppo_runs(ENV, half_precision_run_1, config(), seeds=[0, 1])


def test_a_layer_shared_by_two_runs_is_refused() -> None:
    # Written back run by run, a shared layer would hold the last run's values in both.
    shared = network(99).layers[1].components["value"].layers[0]

    def with_shared_layer(seed: int) -> nnx.Module:
        module = network(seed)
        module.layers[1].components["value"].layers[0] = shared
        return module

    with pytest.raises(
        ValueError,
        match=r"networks of runs 0 and 1 share one variable object \(layers/1/components/value/",
    ):
        train_ppo_runs(ENV, with_shared_layer, config(), seeds=[0, 1])
    rngs = nnx.Rngs(0)  # one stream for every run: the seed make_networks gets is unused
    with pytest.raises(ValueError, match=r"make_networks reuses one nnx.Rngs, so the seed"):
        train_ppo_runs(
            ENV,
            lambda seed: make_default_network(ENV, rngs, hidden_sizes=[16]),
            config(),
            seeds=[0, 1],
        )


def test_a_lambda_built_per_run_is_the_same_network() -> None:
    from nnx_ppo.algorithms._runs import _same_static

    def activation(scale: float):
        return lambda x: scale * x

    assert _same_static(activation(1.0), activation(1.0))
    assert not _same_static(activation(1.0), activation(2.0))
    # functools.partial compares by identity: one built per run is alike by its parts.
    leaky = functools.partial(jax.nn.leaky_relu, negative_slope=0.1)
    assert _same_static(leaky, functools.partial(jax.nn.leaky_relu, negative_slope=0.1))
    assert not _same_static(leaky, functools.partial(jax.nn.leaky_relu, negative_slope=0.2))
    assert _same_static(
        (leaky, {"scale": activation(1.0)}), (copy.copy(leaky), {"scale": activation(1.0)})
    )

    # Equal arrays among a partial's arguments are alike; another value is not.
    def sloped(*slope: float) -> functools.partial:
        return functools.partial(jax.nn.leaky_relu, negative_slope=np.array(slope))

    assert _same_static(sloped(0.1, 0.1), sloped(0.1, 0.1))
    assert not _same_static(sloped(0.1, 0.1), sloped(0.1, 0.2))
    assert not _same_static(sloped(0.1, 0.1), sloped(0.1))
    assert _same_static(sloped(0.1, float("nan")), sloped(0.1, float("nan")))


def test_an_object_alike_by_its_text_only_is_named_as_such() -> None:
    class Scaled:
        def __call__(self, x):
            return 2 * x

        def __repr__(self) -> str:
            return "Scaled()"

    def with_own_activation(seed: int) -> nnx.Module:
        return make_default_network(ENV, nnx.Rngs(seed), hidden_sizes=[16], activation=Scaled())

    with pytest.raises(ValueError, match=r"is Scaled\(\) in both, but another object in each"):
        train_ppo_runs(ENV, with_own_activation, config(), seeds=[0, 1])


def test_numpy_seeds_reach_make_networks_as_ints() -> None:
    from nnx_ppo.algorithms._runs import _require_runs

    seeds, _ = _require_runs(np.arange(2), None, config())
    assert seeds == [0, 1] and all(type(seed) is int for seed in seeds)
    # A 1-d JAX array as a NumPy one.
    seeds, rates = _require_runs(jax.numpy.arange(2), jax.numpy.array([0.5, 0.25]), config())
    assert seeds == [0, 1] and all(type(seed) is int for seed in seeds)
    assert rates == [0.5, 0.25] and all(type(rate) is float for rate in rates)
    # A list of a JAX array's entries (0-d arrays): seeds[0] was refused as not an int.
    seeds, _ = _require_runs(list(jax.numpy.arange(2)), None, config())
    assert seeds == [0, 1] and all(type(seed) is int for seed in seeds)


def test_a_diverged_run_leaves_every_network_at_the_last_good_step(monkeypatch) -> None:
    from nnx_ppo.algorithms import _step

    quiet = config()
    quiet.eval.enabled, quiet.checkpoint_every_steps = False, 0  # nothing writes the networks
    quiet.ppo.learning_rate_schedule = "constant"  # the same rates over a shorter run
    host_metrics = _step._host_metrics

    def diverging(reports, steps_taken, ppo, iterations):
        if steps_taken == 2 * STEP:
            raise FloatingPointError("the loss became NaN")
        return host_metrics(reports, steps_taken, ppo, iterations)

    monkeypatch.setattr(_step, "_host_metrics", diverging)
    networks = [network(0), network(1)]
    with pytest.raises(FloatingPointError, match=r"run 0 \(seed 0\): the loss became NaN"):
        train_ppo_runs(ENV, lambda seed: networks[seed], quiet, seeds=[0, 1])
    monkeypatch.setattr(_step, "_host_metrics", host_metrics)
    quiet.ppo.total_steps = 2 * STEP
    reached = [r.training_state.networks for r in train_ppo_runs(ENV, network, quiet, seeds=[0, 1])]
    for left, good in zip(networks, reached, strict=True):
        for a, b in zip(parameters(left), parameters(good), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_log_fn_that_raises_leaves_every_network_at_the_last_finished_step() -> None:
    # The networks were written only at evaluations, checkpoints and the end: stopped by
    # its log_fn, a run lost everything trained since.
    quiet = config()
    quiet.eval.enabled, quiet.checkpoint_every_steps = False, 0
    quiet.ppo.learning_rate_schedule = "constant"

    def stop_at_the_second_step(run: int, metrics: dict, step: int) -> None:
        if step == 2 * STEP:
            raise RuntimeError("enough")

    networks = [network(0), network(1)]
    with pytest.raises(RuntimeError, match="enough"):
        train_ppo_runs(
            ENV, lambda seed: networks[seed], quiet, seeds=[0, 1], log_fn=stop_at_the_second_step
        )
    quiet.ppo.total_steps = 2 * STEP
    reached = [r.training_state.networks for r in train_ppo_runs(ENV, network, quiet, seeds=[0, 1])]
    for left, good in zip(networks, reached, strict=True):
        for a, b in zip(parameters(left), parameters(good), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_run_that_diverges_is_set_aside_while_the_others_train_on() -> None:
    logged: list[tuple[int, int]] = []
    saved: list[tuple[int, int]] = []
    diverging = network(0)
    start = parameters(diverging)
    with pytest.warns(RuntimeWarning, match=r"run 1 \(seed 0\): PPO step ending at env step 128"):
        kept, diverged = train_ppo_runs(
            ENV,
            lambda seed: network(seed) if seed else diverging,
            config(),
            seeds=[1, 0],
            learning_rates=[3e-3, 1e30],  # Adam's steps of 1e30 overflow the loss at once
            log_fn=lambda run, metrics, step: logged.append((run, step)),
            checkpoint_fn=lambda run, state, step: saved.append((run, step)),
            on_divergence="continue",
        )
    assert diverged.diverged is not None
    assert diverged.diverged.startswith(
        "run 1 (seed 0): PPO step ending at env step 128: the loss is NaN or infinite"
    ), diverged.diverged
    assert (diverged.total_steps, diverged.total_iterations) == (0, 0)
    assert diverged.training_state.steps_taken == 0
    assert [h["step"] for h in diverged.eval_history] == [0]
    for got, want in zip(parameters(diverged.training_state.networks), start, strict=True):
        np.testing.assert_array_equal(got, want)
    assert [step for run, step in logged if run == 1] == [0]
    assert [step for run, step in saved if run == 1] == [0]

    single = config()
    single.seed, single.ppo.learning_rate = 1, 3e-3
    alone = network(1)
    train_ppo(ENV, alone, single)
    assert kept.diverged is None and kept.total_steps == 4 * STEP
    assert [step for run, step in saved if run == 0] == [0, 2 * STEP, 4 * STEP]
    for got, want in zip(parameters(kept.training_state.networks), parameters(alone), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


class _NaNRewards(Wrapper):
    def step(self, state: State, action: jax.Array) -> State:
        stepped = self.env.step(state, action)
        return stepped.replace(reward=stepped.reward * jax.numpy.nan)


def test_every_run_that_diverges_in_a_call_is_named_and_nan_evaluations_by_run() -> None:
    with pytest.raises(FloatingPointError) as stopped:
        train_ppo_runs(ENV, network, config(), seeds=[0, 1], learning_rates=[1e30, 1e30])
    runs = str(stopped.value).splitlines()
    assert [line.split(": PPO step")[0] for line in runs] == ["run 0 (seed 0)", "run 1 (seed 1)"]
    quiet = config()
    quiet.ppo.total_steps, quiet.checkpoint_every_steps = STEP, 0
    with pytest.warns(RuntimeWarning) as caught:
        train_ppo_runs(ENV, network, quiet, seeds=[0, 1], eval_env=_NaNRewards(ENV))
    said = [str(warning.message).split(" has a mean")[0] for warning in caught]
    assert said == [f"run {run} (seed {run}): the evaluation at step 0" for run in (0, 1)]


def test_on_divergence_takes_stop_or_continue() -> None:
    expected = r'on_divergence must be "stop" or "continue", got \'raise\''
    with pytest.raises(ValueError, match=expected):
        train_ppo_runs(ENV, network, config(), seeds=[0], on_divergence="raise")  # type: ignore[arg-type]


def test_several_processes_are_told_each_trains_every_run(monkeypatch) -> None:
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with (
        pytest.warns(RuntimeWarning, match="each of the 2 processes trains all 3 runs"),
        pytest.raises(ValueError, match="on_divergence must be"),  # stops it there
    ):
        train_ppo_runs(ENV, network, config(), seeds=[0, 1, 2], on_divergence="raise")  # type: ignore[arg-type]


@functools.cache
def _many_runs_program() -> str:
    """The jaxpr of two runs' PPO step in one program."""
    return str(_many_runs_jaxpr())


@functools.cache
def _many_runs_jaxpr() -> jex_core.ClosedJaxpr:
    """Two runs' PPO step in one program, traced."""
    from nnx_ppo.algorithms import _step
    from nnx_ppo.algorithms._runs import _stack
    from nnx_ppo.algorithms.ppo import new_training_state

    ppo = PPOConfig(n_envs=4, rollout_length=4, n_epochs=1, n_minibatches=2)
    states = [
        _step._prepared("test", new_training_state(ENV, network(seed, 8), 4, seed), ppo)
        for seed in (0, 1)
    ]
    graphdef, _ = nnx.split((states[0].networks, states[0].optimizer))
    stacked = _stack([nnx.split((s.networks, s.optimizer))[1] for s in states], None)
    carries = _stack([_step._carry_of(s) for s in states], None)
    program = jax.make_jaxpr(
        lambda s, c: _step._compiled_run_steps(
            _step._EnvArgument(ENV),
            _step._ConfigArgument(ppo),
            _step._GraphArgument(graphdef),
            s,
            c,
            1,
        )
    )(stacked, carries)
    return program


def test_the_truncation_pass_stays_a_branch_in_the_many_runs_program() -> None:
    """Under vmap, a cond whose predicate differs between runs computes both branches;
    the runs decide together, so the next-value pass still runs only at truncations."""
    assert " cond[" in _many_runs_program()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="only CPU hashes keys in a loop")
def test_the_many_runs_program_hashes_keys_without_jax_loop() -> None:
    """On CPU, several runs' keys hash as straight-line code (``nnx_ppo._threefry``);
    ``test_runs_in_one_program_equal_the_runs_one_by_one`` shows the numbers are the same."""
    assert "key<fry_sl>" in _many_runs_program()


def _key_types_drawn_from(jaxpr: jex_core.Jaxpr) -> set[str]:
    """The key types of every draw, split and fold-in in ``jaxpr`` and the programs inside it."""
    found = set()
    for equation in jaxpr.eqns:
        if equation.primitive.name in ("random_bits", "random_split", "random_fold_in"):
            found.add(str(equation.invars[0].aval.dtype))
        for param in equation.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(inner, jex_core.ClosedJaxpr):
                    found |= _key_types_drawn_from(inner.jaxpr)
                elif isinstance(inner, jex_core.Jaxpr):
                    found |= _key_types_drawn_from(inner)
    return found


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="only CPU hashes keys in a loop")
def test_the_envs_draws_in_the_many_runs_program_hash_without_jax_loop() -> None:
    """The env's reset and step draw with straight-line keys too (CartPole's reset draws
    its initial state); ``test_an_env_keeping_a_key_trains_in_one_program_as_alone``
    shows an env keeping a key still finds JAX's own in its state, with the same numbers."""
    assert _key_types_drawn_from(_many_runs_jaxpr().jaxpr) == {"key<fry_sl>"}


def test_learning_rates_alone_give_every_run_the_configs_seed() -> None:
    from nnx_ppo.algorithms._runs import _require_runs

    single = config()
    single.seed = 9
    assert _require_runs(None, [1e-3, 3e-3], single) == ([9, 9], [1e-3, 3e-3])
