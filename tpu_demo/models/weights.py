"""Whether a hub model's weights are complete in the local Hugging Face cache, file by file.

Complete means: the snapshot's ``model_index.json``, and for each component it names, every shard
its ``*.safetensors.index.json`` lists (or, without an index, at least one ``*.safetensors``) is a
readable file. File I/O only: nothing is loaded, nothing is fetched. A half-finished download is
reported with the missing files and an estimate of the bytes still to come.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tpu_demo.core.catalog import ModelSpec


@dataclass
class WeightsReport:
    """What the cache holds of one model: ``present`` (path in the snapshot, bytes), ``missing`` paths."""

    model: str
    snapshot: Path | None
    present: list[tuple[str, int]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    #: bytes still to download (from each index's ``total_size``, else the catalog's component sizes)
    missing_bytes: float = 0.0

    @property
    def complete(self) -> bool:
        return self.snapshot is not None and not self.missing

    @property
    def present_bytes(self) -> int:
        return sum(size for _, size in self.present)


def hub_snapshot(repo: str) -> Path | None:
    """The cached snapshot folder of ``repo`` holding its ``model_index.json``, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo, "model_index.json")
    except Exception:  # noqa: BLE001 - a broken cache counts as absent
        return None
    return Path(found).parent if isinstance(found, str) else None


def weights_report(spec: ModelSpec) -> WeightsReport:
    """Every file the snapshot's indexes name, present (with its size) or missing; see the module docstring."""
    snapshot = hub_snapshot(spec.hub_repo) if spec.hub_repo else None
    report = WeightsReport(spec.id, snapshot)
    if snapshot is None:
        report.missing.append("model_index.json")
        report.missing_bytes = spec.total_gb * 1e9
        return report
    index = snapshot / "model_index.json"
    report.present.append(("model_index.json", index.stat().st_size))
    components = [name for name, value in json.loads(index.read_text()).items()
                  if not name.startswith("_") and isinstance(value, list) and value and value[0] is not None]
    for name in components:
        _check_component(report, snapshot / name, name, spec.component_gb.get(name, 0.0) * 1e9)
    return report


def _check_component(report: WeightsReport, folder: Path, name: str, expected_bytes: float) -> None:
    if not folder.is_dir():
        report.missing.append(f"{name}/")
        report.missing_bytes += expected_bytes
        return
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    for index in indexes:
        report.present.append((f"{name}/{index.name}", index.stat().st_size))
        data = json.loads(index.read_text())
        found = 0
        for shard in sorted(set(data.get("weight_map", {}).values())):
            path = folder / shard
            if path.is_file():  # a cache symlink whose blob is gone is not a file
                report.present.append((f"{name}/{shard}", path.stat().st_size))
                found += path.stat().st_size
            else:
                report.missing.append(f"{name}/{shard}")
        total = data.get("metadata", {}).get("total_size") or expected_bytes
        if any(m.startswith(f"{name}/") for m in report.missing):
            report.missing_bytes += max(0.0, float(total) - found)
    if indexes:
        return
    weights = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    for path in weights:
        report.present.append((f"{name}/{path.name}", path.stat().st_size))
    if not weights and (folder / "config.json").is_file():  # a model component (not a tokenizer or scheduler)
        report.missing.append(f"{name}/*.safetensors")
        report.missing_bytes += expected_bytes
