"""``python app.py``: parse the flags, then serve one process or one torchrun rank."""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from tpu_demo.device import DeviceUnavailable

from tpu_demo.launch.config import parse_config
from tpu_demo.launch.serve import serve
from tpu_demo.launch.tp_rank import serve_tensor_parallel


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up probes
    config = parse_config(argv)
    try:
        if config.tensor_parallel:
            serve_tensor_parallel(config)
        else:
            serve(config)
    except DeviceUnavailable as error:  # --device tpu / cuda on a host where it does not start: no fallback
        sys.stderr.write(f"app.py: error: {error}\n")
        raise SystemExit(2) from None
