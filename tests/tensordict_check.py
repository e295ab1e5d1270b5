"""Run as a script under a given tensordict version: the verl call with TensorDict settings and
TensorDict take/split must work and match the baseline. Prints the tensordict version on success."""

from __future__ import annotations

import tensordict
import torch
from tensordict import NonTensorData, TensorDict

import torch_impl
from property_tests.baseline import verl_postprocess_batch_func
from property_tests.compare import assert_same
from property_tests.data import jagged


def main() -> None:
    outs = [
        {"model_output": {"lp": jagged(torch.arange(5.0), [2, 3])}, "loss": 1.0},
        {"model_output": {"lp": jagged(torch.arange(5.0, 6.0), [1])}, "metrics": {"a": 1}},
    ]
    indices = [[2, 0], [1]]
    for settings in ({}, {"use_dynamic_bsz": True, "pad_mode": "no_padding"}):
        data = TensorDict({}, batch_size=[])
        for k, v in settings.items():
            data[k] = NonTensorData(v)
        assert_same(
            torch_impl.postprocess_batch_func(outs, indices, data), verl_postprocess_batch_func(outs, indices, data)
        )
    data = TensorDict({"use_dynamic_bsz": NonTensorData(False)}, batch_size=[])
    assert_same(torch_impl.postprocess_batch_func(outs, None, data), verl_postprocess_batch_func(outs, None, data))
    td = TensorDict({"lp": jagged(torch.arange(6.0), [2, 0, 4]), "adv": torch.arange(3.0)}, batch_size=[3])
    td["tag"] = NonTensorData("x")
    pieces = torch_impl.split(td, [[2], [0, 1]])
    assert pieces[0]["adv"].tolist() == [2.0]
    assert pieces[1]["lp"].offsets().tolist() == [0, 2, 2]
    taken = torch_impl.take(td, [1, 2])
    assert taken["adv"].tolist() == [1.0, 2.0]
    print(f"tensordict {tensordict.__version__} ok")


if __name__ == "__main__":
    main()
