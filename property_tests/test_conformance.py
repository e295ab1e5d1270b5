"""The conformance suite against the candidate named by ``REBATCH_CANDIDATE`` (``module:function``;
default ``torch_impl:postprocess_batch``), and proof that it fails a wrong candidate."""

from __future__ import annotations

from typing import Any

import pytest

from property_tests.conformance import CONFORMANCE, candidate_from_env, load_candidate, main, run_conformance


@pytest.mark.parametrize("name", CONFORMANCE)
def test_candidate_conforms(name: str) -> None:
    why = run_conformance(candidate_from_env(), max_examples=30, names=(name,))[name]
    assert why is None, f"{candidate_from_env()} fails {name}: {why}"


def _rows_reversed(output_lst: Any, indices: Any, **kwargs: Any) -> Any:
    import torch_impl

    result = torch_impl.postprocess_batch(output_lst, indices, **kwargs)
    result["model_output"] = {
        k: torch_impl.take(v, list(range(v.size(0)))[::-1]) for k, v in result["model_output"].items()
    }
    return result


def _accepts_everything(output_lst: Any, indices: Any, **kwargs: Any) -> Any:
    import torch_impl

    try:
        return torch_impl.postprocess_batch(output_lst, indices, **kwargs)
    except ValueError:
        return {"model_output": {}, "loss": [], "metrics": {}}


def test_a_wrong_candidate_fails() -> None:
    report = run_conformance(_rows_reversed, max_examples=30, names=("postprocess_agrees_with_numpy",))
    assert report["postprocess_agrees_with_numpy"] is not None
    report = run_conformance(_accepts_everything, max_examples=30, names=("malformed_rejected_alike",))
    assert report["malformed_rejected_alike"] is not None


def test_verl_signature_candidate_is_adapted() -> None:
    fn = load_candidate("torch_impl:postprocess_batch_func")
    import torch

    out = fn([{"model_output": {"v": torch.arange(3.0)}}], [[2, 0, 1]], use_dynamic_bsz=True)
    assert out["model_output"]["v"].tolist() == [1.0, 2.0, 0.0]


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--candidate", "torch_impl:postprocess_batch_func", "--max-examples", "5"]) == 0
    assert "3 of 3 conformance properties hold" in capsys.readouterr().out
    with pytest.raises(ValueError, match="module:function"):
        load_candidate("torch_impl")
