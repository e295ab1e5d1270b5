"""Applies rebatch's ``install()`` in every Python process started with this folder on ``PYTHONPATH``
(the test process and the worker processes its distributed tests spawn): verl's own tests then run
against rebatch's functions. Used only by ``.ci/verl_upstream/run.sh``."""

import warnings

with warnings.catch_warnings():  # verl warns of every optional engine it cannot import
    warnings.simplefilter("ignore")
    from torch_impl.integrations import verl as _rebatch_verl

    _rebatch_verl.install()
