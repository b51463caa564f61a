"""Reconcilers and the workers that run them from a :class:`kube.queueing.KeyedQueue`.

A reconciler brings one object's world in line with what the object asks for, given only its
key. :func:`run_workers` calls it for every key the queue hands out and turns the outcome into
what happens next: done, requeued after a delay, retried with backoff, or given up on (logged
with the object's key). A worker never dies of a reconciler's exception.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .errors import Conflict, KubeError, PermanentError, TemporaryError, is_temporary
from .logs import object_logger
from .metrics import counter
from .queueing import KeyedQueue
from .settings import QueueSettings

__all__ = ["Reconciler", "Requeue", "run_workers"]

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)

_OUTCOMES = counter("reconcile", "Reconciliations, by queue and outcome.", ["queue", "outcome"])


@dataclass(frozen=True)
class Requeue:
    """Returned by a reconciler: reconcile this key again after ``after`` seconds (a resync)."""

    after: float


class Reconciler(Protocol[K_contra]):
    """Brings the world in line with one object, identified by its key.

    Contract:

    * ``reconcile`` reads the current state itself (from caches or the API servers); the key is
      all it gets, and it may be called for an object that no longer exists (then it cleans up).
    * It is idempotent: calling it again with nothing changed changes nothing.
    * It is never called concurrently for the same key; different keys run concurrently.
    * Returning ``None`` means done; ``Requeue(after)`` means look again after ``after`` seconds.
    * Raising :class:`kube.errors.TemporaryError` retries after its ``delay``; a 409
      :class:`kube.errors.Conflict` retries soon with backoff; temporary API errors (429, 5xx,
      network) retry with backoff; :class:`kube.errors.PermanentError` and permanent API errors
      (400, 401, 403, 404, 422) are logged and not retried until the key is added again.
    """

    async def reconcile(self, key: K_contra) -> Requeue | None: ...


def _handler(
    queue: KeyedQueue[K], reconciler: Reconciler[K], kind: str, logger: logging.Logger
) -> Callable[[K], Awaitable[float | None]]:
    async def handle(key: K) -> float | None:
        log = object_logger(logger, kind, key)
        outcome = "error"
        try:
            result = await reconciler.reconcile(key)
        except TemporaryError as exc:
            outcome = "temporary"
            log.info("retrying in %.2fs: %s", exc.delay, exc)
            queue.add_after(key, exc.delay)
        except PermanentError as exc:
            outcome = "permanent"
            queue.forget(key)
            log.error("giving up: %s", exc)
        except Conflict as exc:
            outcome = "conflict"
            delay = queue.requeue_rate_limited(key, base=queue.settings.conflict_delay)
            log.info("conflict, retrying in %.2fs: %s", delay, exc)
        except KubeError as exc:
            if is_temporary(exc):
                outcome = "temporary"
                delay = queue.requeue_rate_limited(key)
                log.warning("API error, retrying in %.2fs: %s", delay, exc)
            else:
                outcome = "permanent"
                queue.forget(key)
                log.error("API error, giving up: %s", exc)
        except Exception:
            delay = queue.requeue_rate_limited(key)
            log.exception("unexpected error, retrying in %.2fs", delay)
        else:
            outcome = "requeue" if result is not None else "done"
            queue.forget(key)
            if result is not None:
                return result.after
        finally:
            _OUTCOMES.labels(queue.name, outcome).inc()
        return None

    return handle


async def run_workers(
    queue: KeyedQueue[K],
    reconciler: Reconciler[K],
    *,
    settings: QueueSettings | None = None,
    logger: logging.Logger | None = None,
    kind: str = "object",
) -> None:
    """Reconcile keys from ``queue`` with ``settings.workers`` workers until it shuts down.

    ``kind`` prefixes log lines (``Pod ns/name: …``); ``logger`` defaults to this module's.
    """
    workers = (settings or queue.settings).workers
    handle = _handler(queue, reconciler, kind, logger or logging.getLogger(__name__))
    await queue.run(handle, workers=workers)
