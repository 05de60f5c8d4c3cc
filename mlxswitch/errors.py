"""One error hierarchy; every message here reaches the user verbatim as one line."""


def one_line(text: object, limit: int) -> str:
    """`text` on one line (whitespace runs collapsed), cut to `limit` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class MlxSwitchError(Exception):
    """Base of every error the CLI shows as a one-line message with a non-zero exit."""

    exit_code = 1


class UsageError(MlxSwitchError):
    """The command line asks for something inconsistent or malformed."""

    exit_code = 2


class SettingError(UsageError):
    """One setting breaks a rule; `key` names it (up, down, window, …) so a file can point at its line."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class ConfigError(MlxSwitchError):
    """models.toml (bundled or the user's) is broken or names an unknown profile."""

    exit_code = 3


class ModelNotFoundError(MlxSwitchError):
    """A model source is neither a local path, a cached repo, nor reachable."""

    exit_code = 4


class ModelFormatError(MlxSwitchError):
    """A model exists but uses an architecture, tensor type or layout we cannot run."""

    exit_code = 4


class TokenizerMismatchError(MlxSwitchError):
    """Two tiers of one ladder do not share a tokenizer."""

    exit_code = 5


class InsufficientMemoryError(MlxSwitchError):
    """The profile would not fit in this machine's memory."""

    exit_code = 6


class PromptTooLongError(MlxSwitchError):
    """The prompt (with history) does not fit the model's context."""

    exit_code = 7

    def __init__(self, message: str, tokens: int = 0, context: int = 0):
        super().__init__(message)
        self.tokens, self.context = tokens, context


class CloudError(MlxSwitchError):
    """The cloud tier is misconfigured (no key) or failed (network, API, budget)."""

    exit_code = 8


class OutputError(MlxSwitchError):
    """A file or directory we were asked to write cannot be written (nothing half-written is left)."""

    exit_code = 9


class RequestError(MlxSwitchError):
    """An HTTP request to `mlxswitch serve` is refused; the fields of OpenAI's error object."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code


# Exit codes that no error class carries.
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away, as a shell reports SIGPIPE
EXIT_INTERNAL = 70  # an unexpected exception (BSD's EX_SOFTWARE); its traceback goes to a log
