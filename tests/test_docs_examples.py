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
        "at B=1, T=1: __call__ wrote the NNX variable mean (at step 0).",
        "leaf:     EagerTrace.mean",
        "check_module(Residual): property 'update_statistics routing' fails at B=1, T=1: "
        "update_statistics never reaches Residual.inner (DecayingTrace)",
        "found:    Residual inherits the no-op default",
    ],
    "testing_kit_env.py": [
        "Drift passes every property.",
        "check_env(ForgetfulDrift): property 'truncation signal' fails at n_envs=4, steps=5",
        "leaf:     state.info['truncated'] at step 2, env 0",
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
