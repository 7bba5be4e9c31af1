"""The distributed context: client work on a pool of Ray actors, on one machine or many.

The same program runs on a Ray cluster with one changed line,
``async with RayContext(address=...)`` instead of ``LocalContext()``. Ray schedules the
work, moves objects and detects dead workers; this package decides what runs where:

- A pool of ``max_workers`` actors, started when the context is entered and reused by
  every call (no actor per client). Each computes one unit of work at a time: a client,
  or a group of clients when the caller passes ``group_size``, split exactly as
  :class:`~programlogic.contexts.local.LocalContext` splits them.
- The broadcast value of a call is put in the object store once and shared by all its
  units. The client function (a learning process's bound method) is put there once per
  context, and each actor unpickles it once.
- Client data is loaded on the actor by the client handle's loader, which travels
  pickled. The table of an :class:`~programlogic.data.InMemoryDataSource` is put in the
  object store once and the loaders refer to it.
- Results are folded in client order as they arrive: a result that arrives before an
  earlier unit's waits only until that one is in, so driver memory holds at most the
  out-of-order results, not a round's.
- Ray cannot interrupt a task that an actor is running, so an actor whose unit must stop
  (the call was cancelled, another unit of the call failed, or the unit missed the
  round's deadline) is killed and replaced by a new one: later calls never queue
  behind work nobody waits for.
- Errors of Ray itself become ours, through one table (:mod:`._errors`):
  :class:`~programlogic.exceptions.ClusterConnectionError` when the cluster no longer
  answers, :class:`~programlogic.exceptions.ClientError` when client work raised, a
  ``TypeError`` for a value Ray cannot serialize,
  :class:`~programlogic.exceptions.ProgramLogicError` otherwise, with Ray's error as
  ``__cause__``.

The pieces: :mod:`._session` (the connection, and the one seam every call of Ray goes
through), :mod:`._worker` (the actor's body), :mod:`._pool` (starting, replacing and
killing actors), :mod:`._scheduler` (one call's units, retries and deadline),
:mod:`._bridge` (Ray's futures awaited on asyncio or trio).

Ray is imported when a context is entered, so ``programlogic`` works without it
(``pip install 'programlogic[ray]'``).
"""

from programlogic.contexts.ray.context import RayContext

__all__ = ["RayContext"]
