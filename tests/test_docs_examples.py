"""Every example the docs and the README show runs, and prints what they say it prints."""

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))

# What the docs say these examples print.
EXPECTED_OUTPUT = {
    "caught_by_contract.py": [
        "LeakyMemory.__call__: next_state['h']",
        "expected: (B=8, 3) float32",
        "found:    shape (3,) float32",
    ],
    "contract_typeddict.py": [
        "without the goal: (4,)",
        "Reach.__call__: argument x['vel'] is not a key of the TypedDict Observation, "
        "which is closed.",
        "found:    the keys 'pos', 'vel'; Observation declares 'pos', 'goal'",
    ],
    "frozen_statistics.py": ["frozen samples: 0.0", "live samples: 20.0"],
    "custom_stochastic.py": [
        "EpisodeOffset passes every property.",
        "eval() output equals the input: True",
        "train() output differs: True",
    ],
    "nnx_idioms.py": [
        f"{name} passes every property."
        for name in (
            "Sequential",
            "Ensemble",
            "RecurrentEnsemble",
            "PerEnvDropout",
            "FoldedBatchNorm",
            "Rematerialised",
        )
    ],
    "custom_container_entities.py": ["PerEntity passes every property."],
    "custom_container.py": [
        "update_statistics never reached",
        "(Normalizer)",
        "(ForgetfulResidual)",
    ],
    "testing_kit_tutorial.py": [
        "DecayingTrace passes every property.",
        "check_module(BatchCentredTrace): property 'batch-of-one agreement' fails at B=2, T=1",
        "leaf:     output at step 0, env 0",
        "check_module(EagerTrace): property 'no variable written in the forward path' fails "
        "at B=1, T=1: the rollout's __call__ raised ContractError.",
        "leaf:     EagerTrace.mean (BatchStat)",
        "ContractError: EagerTrace.__call__: __call__ wrote the variable "
        "EagerTrace.mean (BatchStat).",
        "found:    EagerTrace.mean (BatchStat) written during the call",
        "check_module(Residual): property 'update_statistics routing' fails at B=1, T=1",
        "update_statistics never reached Residual.inner (DecayingTrace)",
        "found:    Residual inherits the no-op default",
    ],
    "testing_kit_env.py": [
        "Drift passes every property.",
        "check_env(ForgetfulDrift): property 'truncation signal' fails at n_envs=4, steps=5",
        "leaf:     state.info['truncated'] at step 2, env 0",
    ],
    "layers_dense_recurrent.py": [
        "Dense: (5, 8) carry ()",
        "LSTM: (5, 4), carry cell (5, 4) and hidden (5, 4)",
        "LSTM output is the new hidden state: True",
        "GRU reset: batched (5, 4), one env (4,)",
    ],
    "layers_normalizer.py": [
        "before any data, x / 10: [0.1 0.2]",
        "mean: [2. 4.] samples: 6.0",
        "trainable leaves: 0",
    ],
    "training_many_runs.py": [
        "run 2 (seed 0, lr 0.003): 2048 env steps, evaluations at [0, 1024, 2048], diverged: None",
        "one network per run: True",
        "run 3's checkpoints: ['step_0000000000', 'step_0000002048']",
    ],
    "scale_out.py": [
        "trained 512 steps; envs on 1 device(s)",
        "the state stays on the mesh: True",
    ],
    "distillation.py": [
        "1152 env steps; the NLL of the teacher's actions fell: True",
        "teacher unchanged: True",
        "the teacher and the student have different action trees",
        "teacher actions: PyTreeDef(*)",
        "student actions: PyTreeDef({'cue': *})",
    ],
    "layers_delay.py": ["outputs [-1.0, -1.0, 0.0, 1.0]", "after a reset: -1.0"],
    "layers_variational.py": [
        "z: (3, 2) regularization: (3,)",
        "replay reproduces z: True",
        "l2_diff on the first step: [0. 0. 0.]",
        "l2_diff on the second step > 0: True",
    ],
    "layers_samplers.py": [
        "action (4, 2), log-likelihood (4,)",
        "replay scores the same action: True",
        "eval action is tanh(mean): True",
        "most likely class: [1 1 1 1]",
    ],
    "layers_adapter.py": [
        "actions: {'arm': (5, 3), 'gripper': (5,)}",
        "log-likelihoods: {'arm': (5,), 'gripper': (5,)}",
        "values: (5,)",
    ],
    "layers_utils.py": [
        "Flattener(): (2, 18)",
        "Flattener(preserve_levels=1): {'camera': (2, 9), 'proprio': (2, 8), 'task_id': (2, 1)}",
        "Filter: {'image': (2, 3, 3), 'n': (2, 1), 'speed': (2, 4)}",
        "Map: {'image': (2, 8), 'speed': (2, 8)}",
        "Merge: {'extra': (2, 1), 'policy': (2, 4)}",
    ],
    "layers_factories.py": [
        "memory    actions (3,)",
        "two_agent actions {'agent_0': (3, 2), 'agent_1': (3, 2)}",
        "make_lstm_actor_critic holds an LSTM: True",
    ],
    "layers_recurrent_actor_critic.py": [
        "done at step: [3 3 3]",
        "LSTM carry after the reset is zero: True",
    ],
    "envs_registry.py": [
        "built-in: ('cartpole', 'pendulum', 'memory', 'two_agent')",
        "after 3 of 3 steps: done 1.0, truncated True",
        "Unknown environment 'cartpol'.",
    ],
    "envs_wrappers.py": [
        "step 2: reward 0.1, done 0.0, truncated False",
        "step 3: reward 0.1, done 1.0, truncated True",
    ],
    "envs_custom.py": [
        "rewards: (6, 4)",
        "next_obs keeps the final observation of an ended episode: True",
    ],
    "envs_contract_error.py": [
        "SelfBatched.reset: state.reward has shape (8,), not a scalar",
        "IntegerStep.step: state.obs changed shape or dtype from what env.reset returned.",
        "found:    shape (1,) int32",
    ],
    "training_quickstart.py": ["PPO steps: 8 env steps: 2048", "evaluations at: [0, 1024, 2048]"],
    "training_run_files.py": [
        "steps logged: [0, 256, 512, 768, 1024]",
        "files: ['events', 'learning_curve', 'metrics']",
    ],
    "training_truncation.py": ["2.3000", "0.5000", "2.9165"],
    "training_optimizer.py": ["200 env steps, ", "trained to 1000 env steps in 4 more steps"],
    "training_multi_agent.py": [
        "values per agent: {'agent_0': (2,), 'agent_1': (2,)}",
        "losses/actor/agent_0/mean",
        "rollout_batch/episode_reward/agent_1/mean",
    ],
    "training_video.py": [
        "step 0: (21, 8, 8, 3) uint8 frames",
        "step 128: (21, 8, 8, 3) uint8",
        "written: ['step_0000000000.gif', 'step_0000000064.gif', 'step_0000000128.gif']",
    ],
    "training_divergence.py": [
        "PPO step ending at env step 64: the env returned NaN or infinite rewards (reward), "
        "so the loss is too; "
        "the network and optimizer are left as they were before the call.",
    ],
    "network_summary.py": [
        "Sequential: 211 parameters",
        "  .layers[0] (Normalizer)                (B, 4)    (B, 4)",
        "   .layers[1] (LeakyMemory) ✗   (B, 3)   -        ['h'] (B, 3)      -             0",
        "  found:    shape (3,) float32",
        "the failing row: .layers[1] True",
    ],
    "recording.py": [
        "(network): [(100, 4), (100, 4), (100, 4)]",
        ".layers[1].components['action'].layers[0]: [(100, 4, 16)]",
        "hidden layer (T, B, 16): (100, 4, 16)",
        "recorded in one call: 10 modules",
        "frames: 11 return: 10.0",
    ],
    "population_graph.py": [
        "inputs 1, 2, 3, 4 -> late [0.0, 0.0, 1.0, 2.0]",
        "after a reset, buffer: [0. 0.]",
        "zero-delay cycle: a -> b -> a",
        "evaluation order: ('sensory', 'memory', 'policy', 'value')",
        "actions (5,) values (5,)",
    ],
    "checkpoint_resume.py": [
        "stopped early at 192 of 320",
        "steps on disk: ['step_0000000000', 'step_0000000128', 'step_0000000192']",
        "loaded step 192 and its config: True",
        "resumed run ended at 320 after 2 steps",
    ],
}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_docs_example_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(path), run_name="__main__")
    printed = capsys.readouterr().out
    for expected in EXPECTED_OUTPUT.get(path.name, ()):
        assert expected in printed


def test_readme_python_blocks_run() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks, "the README shows at least one Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__main__"})
