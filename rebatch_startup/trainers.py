"""The trainers rebatch serves, each declared once: every list of trainers is derived from `TRAINERS`.

Torch-free and cheap (the startup hook reads it at interpreter start). A trainer named ``NAME`` is:

- its declaration here (`Trainer`);
- its integration, ``torch_impl/integrations/NAME.py``: its table of replacements and their adapters, its
  dump replay (``INTEGRATION``, `torch_impl.integrations._integration.Integration`);
- its kit module, ``property_tests/trainers/NAME.py`` (where ``kit`` is true): how the testing kit calls
  the trainer's own function (its `property_tests.peers.Peer`, side-by-side and device calls, its steps);
- its environment script (``env_script``, building ``venv``), and its docs page ``docs/trainers/NAME.md``.

What is derived from `TRAINERS`: the startup hook's watched packages (`rebatch_startup.TRAINERS`),
``torch_impl.integrations.TRAINERS`` and its ``stats()``, the report file names ``rebatch report`` reads
(`rebatch_startup._names.REPORT_NAME`), ``rebatch check``'s dump replay, the command lines' trainer
choices, the testing kit's peers, side-by-side pairs, device calls and steps, the conformance reports
and docs/peers.md's rows, the wheel's required modules, and CI's environments and trainer lanes
(``python -m rebatch_startup``).
"""

from __future__ import annotations

__all__ = ["TRAINERS", "Trainer", "by_name", "names"]


class Trainer:
    """One trainer's declaration.

    ``name``: the trainer's name (its modules, reports, dumps, environment and docs page are named by
    it) and the top package whose import activates rebatch (``REBATCH``); ``label``: its name in prose
    and log lines; ``release``: the release the kit compares against (``"AReaL 1.0.4"``); ``venv`` and
    ``env_script``: its environment and the script that builds it (CI); ``tests``: its own test files,
    run in its environment beside every trainer's (`LANE_TESTS`); ``kit``: whether it has a kit module;
    ``lane``: whether CI's trainers lane runs it in its environment (verl's tests run in the pins lane).
    """

    __slots__ = ("env_script", "kit", "label", "lane", "name", "release", "tests", "venv")

    def __init__(
        self,
        name: str,
        *,
        label: str,
        release: str,
        venv: str = "",
        env_script: str = "",
        tests: tuple[str, ...] = (),
        kit: bool = True,
        lane: bool = True,
    ) -> None:
        self.name = name
        self.label = label
        self.release = release
        self.venv = venv or f".venv-{name}"
        self.env_script = env_script or f".ci/{name}_env.sh"
        self.tests = tests
        self.kit = kit
        self.lane = lane

    @property
    def package(self) -> str:
        """The top package the startup hook watches: the trainer's name."""
        return self.name

    @property
    def integration(self) -> str:
        """Its integration module."""
        return f"torch_impl.integrations.{self.name}"

    @property
    def kit_module(self) -> str | None:
        """Its kit module (None where it has none)."""
        return f"property_tests.trainers.{self.name}" if self.kit else None

    @property
    def docs_page(self) -> str:
        return f"docs/trainers/{self.name}.md"

    def __repr__(self) -> str:
        return f"Trainer({self.name!r})"


#: Every trainer's tests, run in each trainer's environment (its own ``tests`` after them).
LANE_TESTS = (
    "tests/test_peers.py",
    "tests/test_integrations.py",
    "tests/test_trainer_activation.py",
    "tests/test_trainer_steps.py",
)

#: The trainers, in the order of every list derived from them.
TRAINERS = (
    Trainer(
        "verl",
        label="verl",
        release="verl 0.9.1",
        venv=".venv-pins",
        env_script=".ci/pins_env.sh",
        lane=False,
    ),
    Trainer("areal", label="AReaL", release="AReaL 1.0.4"),
    Trainer("skyrl", label="SkyRL", release="SkyRL 0.4.0", tests=("tests/test_skyrl_items.py",)),
    Trainer("miles", label="miles", release="miles 0.0.2", tests=("tests/test_miles.py",)),
)


def names() -> tuple[str, ...]:
    """The trainers' names, in order."""
    return tuple(t.name for t in TRAINERS)


def by_name(name: str) -> Trainer:
    """The declaration of trainer ``name`` (KeyError naming the known ones otherwise)."""
    for trainer in TRAINERS:
        if trainer.name == name:
            return trainer
    raise KeyError(f"unknown trainer {name!r} (known: {', '.join(names())})")
