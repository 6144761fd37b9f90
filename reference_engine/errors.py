"""Errors a caller can cause: bad config, bad request parameters, unknown model."""


class EngineError(ValueError):
    """Raised for invalid engine or request configuration; the message says what and where."""


class QueueFullError(EngineError):
    """The waiting queue is at its limit (dynamic max_queue_size or max_waiting): reject."""
