"""The repository holds only what this project wrote: no file but ``LICENSE`` carries a copy-right line or
another project's licence header (Apache, MIT, BSD, GPL boilerplate, SPDX tags). Another project's tests,
code or prose copied in keep such a header; verl's own tests run from its source distribution at CI time
instead (``.ci/verl_upstream/run.sh``).

The files checked are git's tracked ones (``git ls-files``: what a clone holds, untracked work aside), or
every file outside the ignored folders where the tree is not a git checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the project's own licence text: the one file allowed to carry licence boilerplate
ALLOWED = {"LICENSE"}
#: folders a checkout may hold that are not the repository (environments, caches, builds)
IGNORED = re.compile(
    r"^(\.git|\.venv[^/]*|\.cache|build|dist|[^/]*\.egg-info|\.hypothesis|\.[a-z]+_cache)$|__pycache__"
)
#: another project's notice or licence header; written so that this file does not match itself
FOREIGN = re.compile(
    "|".join(
        (
            r"copy" r"right",  # a copy-right line, whoever's: this project states none outside LICENSE
            r"\(c\)\s*(19|20)\d\d",
            "\u00a9",  # the sign
            r"licen[sc]ed\s+under\s+the",
            r"you\s+may\s+not\s+use\s+this\s+file\s+except",
            r"SPDX-" r"License-Identifier",
            r"all\s+rights\s+reserved",
            r"permission\s+is\s+hereby\s+granted",
            r"redistribution\s+and\s+use\s+in\s+source",
            r"GNU\s+(lesser\s+|affero\s+)?general\s+public\s+license",
        )
    ),
    re.IGNORECASE,
)


def repository_files(root: Path) -> list[str]:
    """The repository's files under ``root``, as paths relative to it."""
    git = shutil.which("git")
    if git and (root / ".git").exists():
        out = subprocess.run([git, "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        return [name for name in out.decode().split("\0") if name]
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not any(IGNORED.search(part) for part in p.relative_to(root).parts)
    )


def foreign_headers(root: Path) -> list[str]:
    """``path:line: text`` of every line of a repository file (text files; ``ALLOWED`` aside) that reads
    as another project's notice or licence header."""
    found = []
    for name in repository_files(root):
        path = root / name
        if name in ALLOWED or not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data:  # an image or other binary file
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if FOREIGN.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    return found


def test_no_file_carries_another_projects_header() -> None:
    found = foreign_headers(ROOT)
    assert not found, (
        "another project's notice or licence header (its code or prose copied in?):\n" + "\n".join(found)
    )


def test_the_check_finds_a_copied_file(tmp_path: Path) -> None:
    """It can fail: a file with a copied header is found, by each form of header; LICENSE is not."""
    (tmp_path / "LICENSE").write_text("Apache License\nLicensed under " + "the Apache License, Version 2.0\n")
    headers = [
        "# Copy" + "right 2024 Some Company Ltd. and/or its affiliates",
        "#\n# Licensed under " + "the Apache License, Version 2.0 (the 'License');",
        "# you may not use this file " + "except in compliance with the License.",
        "// SPDX-" + "License-Identifier: MIT",
        "(c)" + " 2023 Someone.",
        "Permission is hereby " + "granted, free of charge, to any person obtaining a copy",
        "Someone. All rights " + "reserved.",
    ]
    for i, header in enumerate(headers):
        (tmp_path / f"copied_{i}.py").write_text(f"{header}\nimport os\n")
    (tmp_path / "ours.py").write_text('"""Ours: licence Apache-2.0, as the README says."""\n')
    (tmp_path / "image.png").write_bytes(b"\x89PNG\0 Copy" + b"right")
    found = foreign_headers(tmp_path)
    assert sorted(f.split(":")[0] for f in found) == sorted({f"copied_{i}.py" for i in range(len(headers))})
