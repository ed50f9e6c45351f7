"""Domain errors shared by both apps; the doors (views, API, commands) translate them."""

from __future__ import annotations

from collections.abc import Iterable


class DomainError(Exception):
    """A business rule refused an action; ``message`` is fit to show a person."""

    status_code = 400

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class TransitionNotAllowed(DomainError):
    """The object is not in a state the action can start from (HTTP 409)."""

    status_code = 409

    def __init__(self, *, action: str, current: str, allowed: Iterable[str]) -> None:
        self.action = action
        self.current = current
        self.allowed = sorted(allowed)
        super().__init__(
            f"Cannot {action} from state '{current}'; allowed from: {', '.join(self.allowed)}."
        )


class Conflict(DomainError):
    """The object's situation refuses the action, for a reason said in words (HTTP 409)."""

    status_code = 409


class ActionForbidden(DomainError):
    """The actor lacks the permission the action needs (HTTP 403)."""

    status_code = 403
