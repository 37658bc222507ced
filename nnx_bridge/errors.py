"""Exception types raised by nnx_bridge.

Each one names what is wrong and how to fix it; none of them is ever swallowed to fall back
on a fresh random init or a fixed rng key.
"""


class BridgeError(Exception):
  """Base class of every error raised by nnx_bridge."""


class StateMismatchError(BridgeError, ValueError):
  """Given state does not match the expected tree: missing, extra, wrong-shape or wrong-dtype leaves."""


class MissingRngError(BridgeError, KeyError):
  """A wrapped module asked for an rng stream that the caller did not provide; `streams` names them."""

  def __init__(self, message: str, streams: tuple[str, ...] = ()) -> None:
    super().__init__(message)
    self.streams = streams

  def __str__(self) -> str:  # KeyError would print the message with quotes around it
    return str(self.args[0]) if self.args else ''


class ImmutableCollectionError(BridgeError, RuntimeError):
  """A wrapped module wrote to a collection that the caller did not make mutable."""


class LossyConversionError(BridgeError, ValueError):
  """A conversion would drop a non-zero value the target layer has no place for."""


class UnreadableCheckpointError(BridgeError, OSError):
  """A path that is not an orbax checkpoint, or a checkpoint with files that cannot be read (truncated, garbled)."""


class ConversionInProgressError(BridgeError, FileExistsError):
  """A live process is already writing a checkpoint into the same destination."""
