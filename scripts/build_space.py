"""Assemble the Hugging Face Space folder locally: the tracked files, with space/README.md as README.md.

Spaces reads its metadata (sdk, app_file, title) from the YAML front matter of the README at the
root of the Space. The GitHub README stays free of it: the Space's README is space/README.md,
put in place here. Nothing is uploaded; publishing is a separate command the operator runs
(docs/space.md).

    python scripts/build_space.py            # -> build/space/
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: not needed to serve the page (tests, training and benchmark scripts stay on GitHub)
SKIPPED = ("tests/", "benchmarks/", "scripts/", "space/", "tiny_shapes/", ".ci/")


def tracked_files() -> list[str]:
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [name for name in listing.decode().split("\0") if name and not name.startswith(SKIPPED)]


def build(out: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    for name in tracked_files():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    shutil.copy2(ROOT / "space" / "README.md", out / "README.md")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "space")
    out = build(parser.parse_args().out)
    files = sum(1 for path in out.rglob("*") if path.is_file())
    print(f"wrote {out} ({files} files); publish it as docs/space.md says")


if __name__ == "__main__":
    main()
