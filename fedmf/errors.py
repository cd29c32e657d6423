"""User-facing error types shared by every layer (no dependencies)."""


class FedmfUserError(ValueError):
  """A problem with the user's input: a file, a value or a flag. Its message is one line that names it."""


class FedmfRuntimeError(RuntimeError):
  """A failure of the run's environment, not of the input (a lost worker): one line, exit 1."""
