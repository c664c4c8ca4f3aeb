"""Every error the connector raises, under one root: :class:`ConnectorError`.

Spark shows a data source's exception text inside its own error (an
``AnalysisException`` at ``load()``, a ``StreamingQueryException`` in a running query), so
each message names what was wrong and what to do, in one sentence a user can act on.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from proto.shown import shown


class ConnectorError(Exception):
    """Root of every error raised by ``spark_connector``."""


class OptionError(ConnectorError, ValueError):
    """Raised when a ``.option()`` is unknown, missing or malformed."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"headrace option {shown(option)}: {problem}")


class BrokerUnreachableError(ConnectorError):
    """Raised when the broker named by the ``broker`` option does not answer."""


class DataLossError(ConnectorError):
    """Raised under ``failOnDataLoss=true`` when records the query has not read are gone:
    deleted by retention, or the topic was deleted and created again."""


class RowError(ConnectorError, ValueError):
    """Raised by the sink for a row it cannot publish: a null or missing ``value``, a
    column of the wrong type, or a record over the broker's size limit."""


class AccessDeniedError(ConnectorError):
    """Raised when the broker refuses the ``token`` option: none, unknown or revoked
    (UNAUTHENTICATED), or without the role the work needs (PERMISSION_DENIED)."""


def unreachable(broker: str, doing: str, cause: object, *, tls: bool) -> BrokerUnreachableError:
    """The error for a broker that did not answer: what to check, including TLS, whose
    mismatch looks like an outage to a plaintext client ("Socket closed")."""
    tls_hint = "" if tls else "; if the broker serves TLS, set the option 'tlsCa'"
    return BrokerUnreachableError(
        f"cannot reach the headrace broker at {broker} (option 'broker'){doing}: {cause}. "
        f"Start it (headrace serve), or fix the option{tls_hint}"
    )


def access_denied(doing: str, cause: object) -> AccessDeniedError:
    """The error for credentials the broker refused: the broker's words name the
    command line's flags, so this names the Spark option."""
    return AccessDeniedError(
        f"{doing}: the broker refused the credentials: {cause}. For Spark, the token is the "
        "option 'token' (`headrace tokens create` makes one; reads need the consume role, "
        "writes the produce role)"
    )
