"""A model's example prompts file (``ModelSpec.example_prompts_file`` under assets/): what the page lists
under the prompt box, and scripts draw. One example per line: the prompt, then optionally
``| WIDTHxHEIGHT`` (one of the model's buckets) and ``| N images``; reading never fails on a line.
"""

from __future__ import annotations

import re

from tpu_demo.core.catalog import ASSETS_DIR, ModelSpec


#: Example prompts the page lists under the prompt box, at most (the first lines of the file).
MAX_EXAMPLES = 16


def example_rows(spec: ModelSpec) -> list[tuple[str, str, int]]:
    """(prompt, resolution, images) of each example of the model's prompts file (at most MAX_EXAMPLES).
    A line may end with ``| WIDTHxHEIGHT`` naming one of the model's buckets, then with ``| N images``
    (a prompt that leaves attributes to the seed shows its variety in several images); otherwise the
    example keeps the first bucket and one image."""
    path = ASSETS_DIR / spec.example_prompts_file
    if not path.is_file():
        return []
    buckets = {str(bucket) for bucket in spec.buckets}
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text, images = line.strip(), 1
        head, _, tail = text.rpartition(" | ")
        count = re.fullmatch(r"(\d+) images?", tail.strip())
        if head and count:
            text, images = head, int(count.group(1))
        head, _, resolution = text.rpartition(" | ")
        if head and resolution.strip() in buckets:
            text, resolution = head, resolution.strip()
        else:
            resolution = str(spec.buckets[0])
        if text:
            rows.append((text, resolution, images))
    return rows[:MAX_EXAMPLES]


def example_prompts(spec: ModelSpec) -> list[str]:
    return [text for text, _, _ in example_rows(spec)]
