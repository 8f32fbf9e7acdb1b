"""The "About this server" panel: what runs here, rendered from the engine's facts (no paths, no secrets)."""

from __future__ import annotations

import html
from typing import Any

from tpu_demo.core.catalog import CATALOG


def about_markdown(facts: dict[str, Any]) -> str:
    chips = f"{facts['chips']} TPU chip{'s' if facts['chips'] != 1 else ''}" if facts["device_kind"] == "tpu" \
        else f"no TPU chips ({facts['device_kind']})"
    versions = " \u00b7 ".join(f"{name} {html.escape(str(version))}" for name, version in facts["versions"].items())
    cache = facts["compile_cache"]
    cache_text = ", ".join(f"{tier}: {entry['files']} files, {entry['mb']} MB" for tier, entry in cache.items())
    lines = [  # one fact a line: a Markdown line break is two spaces at the end
        f"**Device:** {html.escape(facts['device'])} \u00b7 {chips}  ",
        f"**Versions:** {versions}  ",
        f"**Compile backend:** `{html.escape(facts['compile_backend'])}`  ",
        f"**Compile cache** (graphs on disk, survive restarts): {cache_text}",
        "",
        "| model | placement | model card |",
        "|---|---|---|",
    ]
    lines += [f"| {html.escape(model['title'])} | {html.escape(model['placement'])} | {_card(model_id)} |"
              for model_id, model in facts["models"].items()]
    return "\n".join(lines)


def _card(model_id: str) -> str:
    """A hub model's page as a link; the embedded default's card as its path in the repository."""
    card = CATALOG[model_id].card if model_id in CATALOG else None
    if card is None:
        return "-"
    if card.startswith("https://"):
        return f"[{html.escape(card.removeprefix('https://huggingface.co/'))}]({card})"
    return f"`{html.escape(card)}`"
