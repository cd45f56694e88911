"""User-facing errors: each carries one line that the CLI prints before exiting with code 2."""


class WorkbenchError(Exception):
    """A user mistake or a bad file: printed as one line, never as a traceback."""


class UnknownBlockError(WorkbenchError):
    pass


class UnknownModelError(WorkbenchError):
    pass


class TemplateError(WorkbenchError):
    pass


class NotACandidateError(WorkbenchError):
    pass


def one_line(exc: BaseException) -> str:
    """An exception's message folded onto one line (YAML errors span several)."""
    return " ".join(str(exc).split())
