"""How the model activities' failures reach Temporal: which are retried, and after how long.

The model activity and the audit activity (a judge is a model call) map provider errors here, in one place.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.exceptions import ApplicationError

from turnkit.kernel.errors import ConfigError, Error, ModelError, TransientModelError, error_class_name

__all__ = ["non_retryable", "provider_failure"]


def non_retryable(err: Error) -> ApplicationError:
    """A TurnKit error as a failure Temporal must not retry: the turn fails with it instead."""
    name = error_class_name(err).removeprefix("TurnKit::")
    return ApplicationError(str(err), type=name, non_retryable=True)


def provider_failure(err: ModelError | ConfigError | TransientModelError) -> ApplicationError:
    """A model call's failure as Temporal sees it: the one place that maps provider errors.

    A :class:`TransientModelError` is retried under the model activity's retry policy (the SDKs do not retry on
    their own); when the provider said how long to wait (``retry-after``), that is the next attempt's delay instead
    of the policy's backoff. Its type stays ``TransientModelError``: a turn whose attempts run out fails with a
    ``ModelError`` of the same message. Any other error fails the turn without a retry.
    """
    if isinstance(err, TransientModelError):
        delay = None if err.retry_after is None else timedelta(seconds=err.retry_after)
        return ApplicationError(str(err), type="TransientModelError", next_retry_delay=delay)
    return non_retryable(err)
