"""The "About this server" panel: what runs here, rendered from the engine's facts (no paths, no secrets)."""

from __future__ import annotations

import html
from typing import Any


def about_markdown(facts: dict[str, Any]) -> str:
    chips = f"{facts['chips']} TPU chip{'s' if facts['chips'] != 1 else ''}" if facts["device_kind"] == "tpu" \
        else f"no TPU chips ({facts['device_kind']})"
    versions = " \u00b7 ".join(f"{name} {html.escape(str(version))}" for name, version in facts["versions"].items())
    cache = facts["compile_cache"]
    cache_text = ", ".join(f"{tier}: {entry['files']} files, {entry['mb']} MB" for tier, entry in cache.items())
    lines = [
        f"**Device:** {html.escape(facts['device'])} \u00b7 {chips}",
        f"**Versions:** {versions}",
        f"**Compile backend:** `{html.escape(facts['compile_backend'])}`",
        f"**Compile cache** (graphs on disk, survive restarts): {cache_text}",
        "",
        "| model | placement |",
        "|---|---|",
    ]
    lines += [f"| {html.escape(model['title'])} | {html.escape(model['placement'])} |"
              for model in facts["models"].values()]
    return "\n".join(lines)
