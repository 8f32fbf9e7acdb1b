"""The error every layer may raise to end a request with a message users can read."""


class EngineError(RuntimeError):
    """A request failed; ``str()`` is safe to show to users (no paths, no stack trace)."""
