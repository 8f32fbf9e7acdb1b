"""The persistent compile cache: compiled graphs survive a restart, so warmup is paid once.

Points inductor's caches (CPU/CUDA) and torch-tpu's tier-3 cache at ``<cache-dir>/compile`` through
environment variables only: it never imports torch, never overrides a variable the operator set, and
leaves torch-tpu's tier-2 cache at its default. ``use_compile_cache`` must run before torch is imported.
``compile_source`` tells from inductor's counters whether a compile came from the cache.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Mapping

log = logging.getLogger("tpu_demo.compile_cache")

#: torch-tpu 0.2.0 (read from its libpywrap_*_common.so): root of the persistent tier-3 cache.
TORCH_TPU_TIER3_ROOT_VAR = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"

#: What this process set, so a later call with another directory may replace our own value
#: but never the operator's.
_set_by_us: dict[str, str] = {}


def compile_cache_env(cache_dir: Path) -> dict[str, str]:
    """The environment variables that point every compiler's persistent cache into ``cache_dir``."""
    root = Path(cache_dir).expanduser().resolve() / "compile"
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        TORCH_TPU_TIER3_ROOT_VAR: str(root / "torch-tpu"),
    }


def use_compile_cache(cache_dir: Path) -> dict[str, str]:
    """Point the compile caches at ``<cache_dir>/compile``; returns the values in effect.

    Call before ``import torch`` (torch-tpu reads its variable once at initialisation) and in
    any case before the first compile (inductor reads its variables when it compiles).
    """
    in_effect = {}
    for name, value in compile_cache_env(cache_dir).items():
        current = os.environ.get(name)
        if current is None or _set_by_us.get(name) == current:
            if name.endswith(("_DIR", "_ROOT")):
                Path(value).mkdir(parents=True, exist_ok=True)
            os.environ[name] = value
            _set_by_us[name] = value
        in_effect[name] = os.environ[name]
    if "torch_tpu" in sys.modules and _set_by_us.get(TORCH_TPU_TIER3_ROOT_VAR) == in_effect[TORCH_TPU_TIER3_ROOT_VAR]:
        log.debug("torch-tpu was imported before the compile cache was set; on TPU set %s before starting "
                  "(app.py does) or it may not be used", TORCH_TPU_TIER3_ROOT_VAR)
    return in_effect


def cache_counters() -> dict[str, int]:
    """Inductor's FX-graph and AOT-autograd cache hit/miss counters so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
        "autograd_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "autograd_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }


def compile_source(before: Mapping[str, int], after: Mapping[str, int]) -> bool | None:
    """Did the compiles between two ``cache_counters`` snapshots come from the persistent cache?

    True: every lookup hit; False: something was compiled afresh; None: no cache was consulted
    (eager modes, the aot_eager backend, or torch-tpu, whose cache keeps no such counters).
    """
    hits = sum(after[k] - before[k] for k in after if k.endswith("_hit"))
    misses = sum(after[k] - before[k] for k in after if k.endswith("_miss"))
    if misses:
        return False
    return True if hits else None
