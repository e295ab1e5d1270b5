"""Named deterministic samples: both implementations give the hand-checked answer, bit for bit."""

from __future__ import annotations

import pytest

from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import assert_same
from property_tests.convert import ref_postprocess, torch_postprocess
from property_tests.samples import PostprocessSample, postprocess_samples

SAMPLES = postprocess_samples()


def _run(impl, s: PostprocessSample):
    return impl(s.output_lst, s.indices, use_dynamic_bsz=s.use_dynamic_bsz, pad_mode=s.pad_mode)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
@pytest.mark.parametrize("impl", [torch_postprocess, ref_postprocess], ids=["torch_impl", "ref"])
def test_sample_gives_expected(impl, sample: PostprocessSample) -> None:
    assert_same(_run(impl, sample), sample.expected)


def _verl_can_run(s: PostprocessSample) -> bool:
    """verl handles jagged outputs in no_padding mode with at least one row per key (it cannot build an
    empty nested tensor, and turns dense outputs into nested ones), without padding micro-batches."""
    from ref import PADDING

    mo = s.expected["model_output"]
    no_padding = not any(p is PADDING for p in s.indices or [])  # padding micro-batches are beyond verl
    return (
        s.pad_mode == "no_padding" and no_padding and all(v.is_nested and v.size(0) > 0 for v in mo.values())
    )


VERL_SAMPLES = [s for s in SAMPLES if _verl_can_run(s)]


@pytest.mark.parametrize("sample", VERL_SAMPLES, ids=[s.name for s in VERL_SAMPLES])
def test_sample_matches_verl(sample: PostprocessSample) -> None:
    data = {"use_dynamic_bsz": sample.use_dynamic_bsz}
    assert_same(
        _run(torch_postprocess, sample), verl_postprocess_batch_func(sample.output_lst, sample.indices, data)
    )


def test_enough_samples_run_against_verl() -> None:
    assert len(VERL_SAMPLES) >= 10
