"""The package as a user meets it: imports, docs, examples, the command line."""

from __future__ import annotations

import doctest
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import specaccept
from specaccept import _api, _logits, _result, _stats, _threads, _tree, lossy, reference
from specaccept.compat import flashinfer, vllm
from specaccept.generation import _drafters, _loop

PUBLIC_FUNCTIONS = [
    "verify",
    "verify_greedy",
    "rejection_probability",
    "acceptance_mask",
    "accepted_prefix_length",
    "acceptance_rate",
    "verify_tree",
    "verify_logits",
    "verify_tree_logits",
]


@pytest.mark.parametrize(
    "module",
    [_api, _logits, _result, _stats, _threads, _tree, vllm, flashinfer, _loop, _drafters, lossy],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_public_functions_are_documented_and_mirrored_by_the_reference(name):
    fn = getattr(specaccept, name)
    assert name in specaccept.__all__
    doc = inspect.getdoc(fn) or ""
    assert "Examples" in doc and ">>>" in doc
    assert inspect.signature(getattr(reference, name)).parameters.keys() == (
        inspect.signature(fn).parameters.keys()
    )


@pytest.mark.parametrize("name", specaccept.__all__)
def test_every_public_name_is_documented(name):
    value = getattr(specaccept, name)
    if callable(value):
        assert inspect.getdoc(value), name


def test_stub_names_match_the_extension():
    package = Path(specaccept.__file__).parent
    stub = (package / "_native.pyi").read_text()
    for name in PUBLIC_FUNCTIONS:
        assert f"def {name}(" in stub
        assert callable(getattr(specaccept._native, name))
    assert (package / "py.typed").exists()


def test_command_line_example_runs_and_agrees_with_the_reference():
    out = subprocess.run(
        [sys.executable, "-m", "specaccept", "example", "--seed", "3", "--batch", "5"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "rejection probability 1 - p/q = 0.25" in out.stdout
    assert "accepted prefix lengths:" in out.stdout
    assert "native == specaccept.reference on the same uniforms: True" in out.stdout
    assert out.stdout.count("  row ") == 5


def test_command_line_default_and_help():
    default = subprocess.run([sys.executable, "-m", "specaccept"], capture_output=True, text=True)
    assert default.returncode == 0 and "accepted prefix lengths" in default.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "specaccept", "example", "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0 and "--seed" in helped.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "specaccept", "example", "--k", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--k" in bad.stderr


README = Path(__file__).parent.parent / "README.md"


def readme_blocks(language: str) -> list[str]:
    import re

    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def test_the_readme_python_blocks_run(capsys):
    """Every Python block of the README runs, in order, in one namespace (the
    Hugging Face block, which needs torch and SmolLM2, runs in
    test_smollm2.py::test_the_readme_example_runs; the MLX-LM block, which needs
    mlx, in test_mlx.py::test_the_readme_mlx_lines_run)."""
    blocks = readme_blocks("python")
    hf = [b for b in blocks if "load_smollm2" in b]
    assert len(hf) == 1, "the Hugging Face block is tested in test_smollm2.py"
    mlx = [b for b in blocks if "compat.mlx_lm" in b]
    assert len(mlx) == 1, "the MLX-LM block is tested in test_mlx.py"
    scope: dict = {}
    for block in blocks:
        if block not in hf + mlx:
            exec(block, scope)
    result = scope["result"]
    assert result.output_token_ids.shape == (2, 4)
    assert "block" in capsys.readouterr().out, "the laboratory's table was printed"


def test_the_readme_opens_with_the_two_commands_ci_runs():
    first = readme_blocks("bash")[0].splitlines()
    assert first[0].split("#")[0].strip() == "pip install . && python -m specaccept demo"
    test_command = first[1].split("#")[0].strip()
    assert test_command == "pip install '.[test]' && python -m pytest"
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert test_command in ci, ".ci/run runs the README's test command"
