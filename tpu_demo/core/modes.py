"""The execution modes of the source document, as names; what each means per device is in device.py."""

from __future__ import annotations

import enum


class ExecutionMode(str, enum.Enum):
    EAGER = "eager"  # torch.tpu.EagerMode.DEFER_NEVER: ops dispatched one at a time (default)
    EAGER_FUSED = "eager-fused"  # torch.tpu.EagerMode.DEFER_AND_FUSE: ops deferred and fused
    COMPILED = "compiled"  # torch.compile(backend="tpu", fullgraph=True, dynamic=False)

    @property
    def title(self) -> str:
        return {"eager": "strict eager", "eager-fused": "optimized eager", "compiled": "compiled"}[self.value]
