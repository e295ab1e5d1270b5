"""The startup hook's two files at the top of site-packages, for a wheel and for an editable install.

Everything else is declared in pyproject.toml. ``rebatch_startup/rebatch.pth`` (an import line Python's
``site`` runs at interpreter start) and ``rebatch_startup/rebatch.start`` (the same hook as a PEP 829
entry point, Python 3.15+) must sit in site-packages itself, not in a package: `BuildPy` copies them to
the top of the build directory (so the wheel's root, installed into site-packages), and `EditableWheel`
to the top of the editable wheel (setuptools' editable installs ship no build outputs besides the
packages' path hook). What the hook does: ``rebatch_startup``'s docstring.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = Path(__file__).resolve().parent
#: The files put at the top of site-packages, from the package that holds their source.
SITE_FILES = [HERE / "rebatch_startup" / "rebatch.pth", HERE / "rebatch_startup" / "rebatch.start"]


def _copy_to(directory: str) -> list[str]:
    out = []
    for source in SITE_FILES:
        target = Path(directory, source.name)
        shutil.copyfile(source, target)
        out.append(str(target))
    return out


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            _copy_to(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs += [str(Path(self.build_lib, source.name)) for source in SITE_FILES]
        return outputs


class EditableWheel(editable_wheel):
    def _run_build_commands(  # type: ignore[no-untyped-def]
        self, dist_name, unpacked_wheel, build_lib, tmp_dir
    ):
        files, mapping = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        _copy_to(str(unpacked_wheel))  # the unpacked wheel's root: written into the editable wheel
        return files, mapping


setup(cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
