"""The execution modes, described once: each mode's names and what it runs on a TPU, in ``MODES``.

``device.py`` turns a mode into device calls by reading this table only (``compiled``,
``tpu_eager_mode``); every label the page, the chart, the API and the PNG show comes from it too.
Adding a mode is one enum member and one row here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExecutionMode(str, enum.Enum):
    EAGER = "eager"
    EAGER_FUSED = "eager-fused"
    COMPILED = "compiled"

    @property
    def traits(self) -> "ModeTraits":
        return MODES[self]

    @property
    def title(self) -> str:
        return MODES[self].title


@dataclass(frozen=True)
class ModeTraits:
    #: the mode's name for visitors ("strict eager")
    title: str
    #: a bar label that fits a phone ("strict")
    short: str
    #: what it does, for visitors who do not know the names
    plain_words: str
    #: runs the transformer's compiled graph (``torch.compile(backend="tpu", fullgraph=True, dynamic=False)``
    #: on TPU); the other modes run it eagerly
    compiled: bool
    #: the ``torch.tpu.EagerMode`` member selected around an eager call on TPU (None: compiled)
    tpu_eager_mode: str | None


MODES: dict[ExecutionMode, ModeTraits] = {
    ExecutionMode.EAGER: ModeTraits("strict eager", "strict", "one operation at a time", False, "DEFER_NEVER"),
    ExecutionMode.EAGER_FUSED: ModeTraits("optimized eager", "optimized", "operations queued and fused", False,
                                          "DEFER_AND_FUSE"),
    ExecutionMode.COMPILED: ModeTraits("compiled", "compiled", "one compiled graph per shape", True, None),
}
