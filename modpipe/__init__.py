"""modpipe: a real-time content-moderation pipeline (posts -> features -> text model -> decisions)."""

__version__ = "0.1.0"
