"""One rank of the tensor-parallel app (``app.py --tensor-parallel`` under torchrun).

Every rank builds the same Engine; rank 0 also serves the page and the others follow its calls. On
Ctrl-C, SIGTERM or any rank's death, rank 0 marks the group failed, lets the page deliver the error of a
request in flight, then exits; followers exit too. Every rank ends with ``os._exit``, so no thread blocked
in a dead collective keeps a process alive.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import NoReturn

import torch

from tpu_demo.launch.config import AppConfig
from tpu_demo.launch.serve import build_app, build_engine, launch
from tpu_demo.device import detect_device
from tpu_demo.distributed.lockstep import Lockstep
from tpu_demo.distributed.group import init_tensor_parallel

log = logging.getLogger("tpu_demo.tp_rank")

#: After SIGTERM, how long rank 0 keeps serving so a request in flight receives its error.
_ERROR_DELIVERY_SECONDS = 1.5


def serve_tensor_parallel(config: AppConfig) -> NoReturn:
    """Run this rank until the app stops; never returns."""
    device = detect_device(config.device)
    lockstep = Lockstep(init_tensor_parallel(device, config.tp_timeout))
    code = 1
    try:
        code = _serve_rank_zero(config, lockstep) if lockstep.world.is_leader else _follow(config, lockstep)
    except BaseException:  # noqa: BLE001 - log, then leave; torchrun stops the other ranks
        log.exception("rank %d failed", lockstep.world.rank)
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve_rank_zero(config: AppConfig, lockstep: Lockstep) -> int:
    app = build_app(config, lockstep)

    def on_sigterm(signum: int, frame: object) -> None:
        lockstep.fail("the launcher is stopping every rank (a rank exited, or Ctrl-C / SIGTERM)")
        if app.engine.status().busy:
            time.sleep(_ERROR_DELIVERY_SECONDS)  # the waiting request polls the failure and answers
        raise KeyboardInterrupt  # Gradio's launch() closes the server on it

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        launch(app)
    except KeyboardInterrupt:
        pass
    clean = lockstep.failure is None
    lockstep.shutdown_followers()
    app.demo.close()
    return 0 if clean else 1


def _follow(config: AppConfig, lockstep: Lockstep) -> int:
    if config.threads:
        torch.set_num_threads(config.threads)
    return lockstep.follow(build_engine(config, lockstep.world.device, lockstep))
