"""Turn any failure on the device thread into one line a user can read."""

from __future__ import annotations

import torch

from tpu_demo.core.errors import EngineError
from tpu_demo.distributed.lockstep import TensorParallelFailure
from tpu_demo.models.loading import ModelUnavailable


def user_message(error: BaseException) -> str:
    """One line for users: the error's own message, never a stack trace."""
    if isinstance(error, (EngineError, ModelUnavailable, TensorParallelFailure)):
        return str(error)
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower():
        return "The device ran out of memory for this request; try a smaller resolution or fewer images."
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    return f"Generation failed: {text}"
