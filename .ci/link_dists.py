"""Hard-link a distribution and everything it requires from this Python's environment into another
environment of the same Python version, so that two CI environments share one copy of torch and its
CUDA libraries (about 6 GB) instead of installing it twice. pip in the target then sees them installed.

Run with the source environment's Python: python .ci/link_dists.py DIST TARGET_VENV
Files are hard links where the file system allows, copies otherwise; a name the target already has is
left alone. Prints what it linked.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement  # pip is in every venv


def closure(name: str) -> list[md.Distribution]:
    """``name``'s distribution and, recursively, the installed ones it requires (extras left out)."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(key)
        except md.PackageNotFoundError:
            continue  # a requirement whose marker excludes this platform, or an optional one
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def top_levels(dist: md.Distribution) -> set[str]:
    """The site-packages entries (packages, modules, the .dist-info folder) a distribution owns."""
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first not in ("..", "__pycache__"):
            names.add(first)
    return names


def link(src: Path, dst: Path) -> None:
    def one(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    if src.is_dir():
        shutil.copytree(src, dst, copy_function=one, symlinks=True)
    else:
        one(str(src), str(dst))


def main() -> None:
    name, venv = sys.argv[1], Path(sys.argv[2])
    src_site = Path(sysconfig.get_paths()["purelib"])
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    dst_site = venv / "lib" / version / "site-packages"
    if not dst_site.is_dir():
        sys.exit(f"link_dists: {dst_site} is not a {version} environment's site-packages")
    linked = []
    for dist in closure(name):
        for entry in sorted(top_levels(dist)):
            src, dst = src_site / entry, dst_site / entry
            if src.exists() and not dst.exists():
                link(src, dst)
                linked.append(entry)
    print(
        f"link_dists: {name} and its requirements from {src_site}: {len(linked)} entries linked into "
        f"{dst_site}"
    )


if __name__ == "__main__":
    main()
