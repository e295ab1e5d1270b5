"""rebatch switched on by one environment variable, ``REBATCH``, in every process of verl, AReaL or SkyRL.

==========================  ======================================================================
``REBATCH``                 effect, in each process that imports a trainer
==========================  ======================================================================
unset, empty, ``off``       nothing: no trainer, no torch, not even this package is imported
``on``                      the trainer's ``install()`` (`torch_impl.integrations.verl`, ``.areal``,
``.skyrl``)
``shadow``                  ``install(mode="shadow")``: the trainer's functions stay in charge
``shadow:0.05``             ``install(mode="shadow", sample=0.05)``
==========================  ======================================================================

``REBATCH_VERL`` (the same values) is verl's own variable, and the more specific one: when it is set it
decides for verl whatever ``REBATCH`` says (``REBATCH=on REBATCH_VERL=off`` leaves verl alone).
Shadow mode's options come from the environment too: ``REBATCH_ON_DEFECT`` (``log``, the default, or
``raise``), ``REBATCH_REPORT_DIR`` (a directory: each process writes its own report there,
``rebatch-TRAINER-HOST-RUN-PID.json``, read by ``rebatch report DIR``; under ``on`` too, its counters)
and ``REBATCH_DUMP_DIR`` (each process saves its first differing or misaligned step there,
``rebatch-dump-TRAINER-HOST-RUN-PID.pt``). ``RUN`` is the process's run id (start time and a random part;
a forked child makes its own: `_names`). Both directories are made absolute once, at activation
(`install_kwargs`), and carried absolute (`carried`).

How it gets into a process: rebatch's wheel (and an editable install) puts two files in site-packages,
``rebatch.pth``, whose one line Python's ``site`` runs at every interpreter start::

    import os; os.environ.get("REBATCH", "off").strip().lower() in ("", "off") or
    __import__("rebatch_startup").startup()

and ``rebatch.start`` (``rebatch_startup:startup``), the same hook as a PEP 829 entry point (Python
3.15+, where a ``.start`` file disables the import lines of the ``.pth`` file of the same name; this
package's import costs one module, nothing else, when the variable is unset). With the variable unset
or ``off`` the ``.pth`` line imports nothing at all. Set, `startup` puts a small finder first on
``sys.meta_path`` (nothing else imported: no torch, no trainer, no `torch_impl`): when a trainer's top
package (``verl``, ``areal``, ``skyrl``) executes, right before its code runs, `activate` imports
that trainer's integration and calls its ``install(lazy=True, ...)``, which reads the trainer's release
from its metadata and patches each of its modules as it finishes importing
(``torch_impl.integrations._patch.Patcher.install(lazy=True)``). What runs the code decides, not what
finds it: a probe first (``importlib.util.find_spec("areal")``, common for an optional dependency) leaves
the trainer waiting, and a probe's spec executed later (``module_from_spec``, ``spec.loader.exec_module``)
activates as an import does. Its lock (`ForkSafeLock`) is renewed in a forked child, so a fork while
another thread activates leaves the child free to import and activate. verl also loads rebatch through its own
plugin mechanisms: the ``verl.plugins`` entry point ``rebatch_startup.verl:activate`` (verl 0.9.x) and
``VERL_USE_EXTERNAL_MODULES=rebatch_startup.verl`` (every release); importing `rebatch_startup.verl` is
``activate("verl")``, torch-free while the variables are unset.

A ``.pth`` line cannot raise (``site`` prints the error and goes on), so nothing here raises at start:
under ``on`` a bad value or a failed activation raises (`ref.errors.UnsupportedSettingError`, naming the
variable and its value) from the import of the trainer's module; under ``shadow`` it is one ERROR line
on the ``"rebatch"`` logger, and the trainer runs as its own. An activated process passes the variables
on (`carried`) to the processes it starts: SkyRL's ``prepare_runtime_environment`` (its Ray actors) and
AReaL's ``get_env_vars`` (the RPC workers of its local and Ray schedulers) are wrapped to add them. They
are every ``REBATCH*`` setting (`CARRIED`), the alignment witness's too: ``REBATCH_WITNESS`` (``off``
switches it off) and ``REBATCH_WITNESS_UNBOUND`` (keys left unbound), which `torch_impl` reads itself
from each process's environment at its first call (`torch_impl.witness_config`), so `install_kwargs`
does not pass them to ``install`` (whose ``witness=`` and ``unbound=`` are for a call in code).
"""

from __future__ import annotations

import os
import sys

from . import trainers as _registry
from .forksafe import ForkSafeLock, renew_at_fork

TYPE_CHECKING = False  # typing itself is not imported at start
if TYPE_CHECKING:
    from collections.abc import Mapping


__all__ = [
    "CARRIED",
    "DUMP_DIR_ENV",
    "ENV",
    "ON_DEFECT_ENV",
    "REPORT_DIR_ENV",
    "TRAINERS",
    "VERL_ENV",
    "WITNESS_ENV",
    "WITNESS_UNBOUND_ENV",
    "ForkSafeLock",
    "Setting",
    "activate",
    "carried",
    "install_kwargs",
    "parse",
    "process_file",
    "renew_at_fork",
    "setting_for",
    "startup",
]

#: The variable of every trainer.
ENV = "REBATCH"
#: verl's own variable: when set, it decides for verl (it is the more specific one).
VERL_ENV = "REBATCH_VERL"
#: Shadow mode's options.
ON_DEFECT_ENV = "REBATCH_ON_DEFECT"
REPORT_DIR_ENV = "REBATCH_REPORT_DIR"
DUMP_DIR_ENV = "REBATCH_DUMP_DIR"
#: The alignment witness's switch (``on``, ``off``) and the keys it leaves unbound (comma-separated):
#: read by `torch_impl._alignment` itself, from the process's own environment, at the first call that asks
#: (so carried, never passed to ``install``).
WITNESS_ENV = "REBATCH_WITNESS"
WITNESS_UNBOUND_ENV = "REBATCH_WITNESS_UNBOUND"
#: What an activated process passes on to the processes it starts (those set): every ``REBATCH*`` setting.
CARRIED = (ENV, VERL_ENV, ON_DEFECT_ENV, REPORT_DIR_ENV, DUMP_DIR_ENV, WITNESS_ENV, WITNESS_UNBOUND_ENV)
#: The trainers' top packages, each with the integration module `activate` installs (from the registry,
#: `rebatch_startup.trainers`).
TRAINERS = {trainer.package: trainer.integration for trainer in _registry.TRAINERS}


_lock = ForkSafeLock()
_done: set[str] = set()  # trainers activated (or whose failed shadow activation was logged) in this process


class Setting:
    """A parsed value: ``mode`` ``"on"`` or ``"shadow"``, ``sample`` (None: the install's default)."""

    __slots__ = ("mode", "sample", "value", "variable")

    def __init__(self, variable: str, value: str, mode: str, sample: float | None) -> None:
        self.variable = variable
        self.value = value
        self.mode = mode
        self.sample = sample

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Setting) and (self.variable, self.value, self.mode, self.sample) == (
            other.variable,
            other.value,
            other.mode,
            other.sample,
        )

    def __hash__(self) -> int:
        return hash((self.variable, self.value, self.mode, self.sample))

    def __repr__(self) -> str:
        return f"Setting({self.variable}={self.value!r}: mode={self.mode!r}, sample={self.sample!r})"


def _refuse(message: str) -> Exception:
    from ref.errors import UnsupportedSettingError  # only on the error path (ref.errors is pure Python)

    return UnsupportedSettingError(message)


def _off(value: str | None) -> bool:
    return (value or "").strip().lower() in ("", "off")


def parse(value: str | None, variable: str = ENV) -> Setting | None:
    """The `Setting` of a value of ``variable`` (None: unset or ``off``); another value raises
    `ref.errors.UnsupportedSettingError` naming the variable and the value."""
    if value is None or _off(value):
        return None
    text = value.strip().lower()
    if text == "on":
        return Setting(variable, value, "on", None)
    mode, colon, fraction = text.partition(":")
    if mode == "shadow":
        if not colon:
            return Setting(variable, value, "shadow", None)
        try:
            sample = float(fraction)
        except ValueError:
            sample = -1.0
        if sample == 0.0 or 2.0**-62 <= sample <= 1.0:  # a period 1 / sample that rounds to an int
            return Setting(variable, value, "shadow", sample)
    raise _refuse(
        f"{variable}={value!r}: expected off, on, shadow or shadow:FRACTION (0 or a fraction in [2**-62, 1])"
    )


def setting_for(trainer: str, environ: dict[str, str] | None = None) -> Setting | None:
    """What the environment says for ``trainer``: ``REBATCH_VERL`` when set (verl only), else ``REBATCH``."""
    env = os.environ if environ is None else environ
    if trainer == "verl" and env.get(VERL_ENV, "").strip():
        return parse(env.get(VERL_ENV), VERL_ENV)
    return parse(env.get(ENV), ENV)


def process_file(directory: str, prefix: str, trainer: str, suffix: str) -> str:
    """``DIRECTORY/PREFIX-TRAINER-HOST-RUN-PID.SUFFIX``: one file per process, never one shared by many
    (``RUN``: the process's run id, its start time and a random part; `_names.process_file`)."""
    from ._names import process_file as named

    return named(directory, prefix, trainer, suffix)


#: The directories of `REPORT_DIR_ENV` and `DUMP_DIR_ENV` as absolute paths, resolved once (at activation,
#: `install_kwargs`): what this process writes to and carries to the processes it starts.
_resolved: dict[str, tuple[str, str]] = {}  # variable -> (its value, that value's absolute path)


def _directory(name: str, env: Mapping[str, str]) -> str:
    """The absolute directory of variable ``name`` (made if missing): resolved once in this process when
    ``env`` is the process's environment, so a later ``chdir`` changes nothing."""
    value = env.get(name, "").strip()
    if env is not os.environ:
        return os.path.abspath(value)
    with _lock:
        if name not in _resolved or _resolved[name][0] != value:
            _resolved[name] = (value, os.path.abspath(value))
        return _resolved[name][1]


def install_kwargs(
    trainer: str, setting: Setting, environ: dict[str, str] | None = None
) -> dict[str, object]:
    """The keyword arguments of the trainer's ``install`` for ``setting`` and the options of the
    environment (`ref.errors.UnsupportedSettingError` naming a bad ``REBATCH_ON_DEFECT``): ``report``
    (under ``on`` too: its counters) and, in shadow mode, ``sample``, ``on_defect`` and ``dump``; the
    directories absolute (resolved once: `carried` passes them on as such)."""
    env = os.environ if environ is None else environ
    kwargs: dict[str, object] = {"mode": setting.mode, "lazy": True}
    report_dir = env.get(REPORT_DIR_ENV, "").strip()
    if report_dir:
        where = _directory(REPORT_DIR_ENV, env)
        os.makedirs(where, exist_ok=True)
        kwargs["report"] = process_file(where, "rebatch", trainer, "json")
    if setting.mode != "shadow":
        return kwargs
    if setting.sample is not None:
        kwargs["sample"] = setting.sample
    on_defect = env.get(ON_DEFECT_ENV, "").strip().lower()
    if on_defect:
        if on_defect not in ("log", "raise"):
            raise _refuse(f"{ON_DEFECT_ENV}={env[ON_DEFECT_ENV]!r}: expected log or raise")
        kwargs["on_defect"] = on_defect
    dump_dir = env.get(DUMP_DIR_ENV, "").strip()
    if dump_dir:
        where = _directory(DUMP_DIR_ENV, env)
        os.makedirs(where, exist_ok=True)
        kwargs["dump"] = process_file(where, "rebatch-dump", trainer, "pt")
    return kwargs


def carried(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of `CARRIED` set in this process: what it passes on to the processes it starts; the
    directories as the absolute paths this process resolved (`install_kwargs`), so a worker that starts
    elsewhere writes where this one does."""
    env = os.environ if environ is None else environ
    out = {name: env[name] for name in CARRIED if env.get(name, "").strip()}
    for name in (REPORT_DIR_ENV, DUMP_DIR_ENV):
        if name in out:
            out[name] = _directory(name, env)
    return out


def activate(trainer: str, *, again: bool = False) -> bool:
    """Install rebatch in ``trainer`` (``"verl"``, ``"areal"``, ``"skyrl"``) as the environment says;
    True when it installed. Idempotent per process (``again``: try even after an earlier activation).

    Under ``on`` a bad value, a bad option or a failed install raises `ref.errors.UnsupportedSettingError`
    naming the variable and its value (the cause chained); under ``shadow`` that is an ERROR line on the
    ``"rebatch"`` logger and the trainer stays as it is."""
    with _lock:
        if trainer in _done and not again:
            return False
        variable = VERL_ENV if trainer == "verl" and os.environ.get(VERL_ENV, "").strip() else ENV
        value = os.environ.get(variable)
        refused = True  # the value or an option refused (the error names it), else the install failed
        try:
            setting = setting_for(trainer)
            if setting is None:
                return False
            import importlib

            kwargs = install_kwargs(trainer, setting)
            refused = False
            importlib.import_module(TRAINERS[trainer]).install(**kwargs)
        except Exception as err:
            import logging

            logging.getLogger("rebatch").error(
                "rebatch: %s=%s: could not install rebatch in %s: %s: %s",
                variable,
                value,
                trainer,
                type(err).__name__,
                err,
            )
            if (value or "").strip().lower().startswith("shadow"):
                _done.add(trainer)  # logged once; the trainer's own functions run
                return False
            if refused:
                raise
            raise _refuse(
                f"{variable}={value!r}: could not install rebatch in {trainer}: {type(err).__name__}: {err}"
            ) from err
        _done.add(trainer)
        return True


class _Finder:
    """First on ``sys.meta_path`` while a trainer is still to be imported: finds its top package with
    the other finders and runs `activate` right before its code (`_hooks.spec_around`). A trainer stays
    waiting until its code runs: every ``find_spec`` until then (``importlib.util.find_spec``, which only
    probes, included) gives a wrapped spec, so a probe never makes the finder forget it, and a probe's
    spec later executed (``module_from_spec`` and ``spec.loader.exec_module``) activates too. Gone once
    every trainer has run."""

    def __init__(self, trainers: set[str]) -> None:
        self.waiting = set(trainers)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in self.waiting:
            return None
        from ._hooks import spec_around

        return spec_around(self, fullname, path, target, before=self._running)  # type: ignore[arg-type]

    def _running(self, trainer: str) -> None:
        """Right before ``trainer``'s top package executes: `activate` (under ``on`` a failure raises from
        the trainer's import, and the trainer stays waiting: an import tried again raises again), then
        the trainer leaves the waiting set, and the finder ``sys.meta_path`` with the last one."""
        activate(trainer)
        with _lock:
            self.waiting.discard(trainer)
            if not self.waiting:
                _drop(self)


def _drop(finder: _Finder) -> None:
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]


_finder: _Finder | None = None


def startup() -> None:
    """The interpreter-start hook (``rebatch.pth``, ``rebatch.start``): nothing when ``REBATCH`` is
    unset or ``off``; else the finder that activates each trainer as it is imported (a trainer
    already imported is activated now). Never raises (a ``.pth`` line cannot): see `activate`."""
    global _finder
    if _off(os.environ.get(ENV)):
        return
    with _lock:
        if _finder is not None:
            return
        waiting = {t for t in TRAINERS if t not in sys.modules}
        if waiting:
            _finder = _Finder(waiting)
            sys.meta_path.insert(0, _finder)  # type: ignore[arg-type]
    for trainer in TRAINERS:
        if trainer in sys.modules:
            try:
                activate(trainer)
            except Exception as err:  # already imported: nothing left to raise from; say it on stderr
                print(f"rebatch: {err}", file=sys.stderr)
