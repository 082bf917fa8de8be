"""Resuming a LangGraph thread that a crash stopped, whatever its last node was.

The usual test, ``if graph.get_state(config).next: graph.invoke(None, config)``, loses
work silently. ``get_state`` reports the thread *live*: a task whose writes were saved
(``put_writes``) counts as done and leaves ``next``. A process killed after the last
task of a step saved its writes and before the step's checkpoint was written leaves a
thread whose ``next`` is empty though the step was never applied and the nodes after
it never ran: the tools' answers sit in pending writes, the model is never asked about
them, and the thread looks finished. The tasks of the latest checkpoint are still
listed (``state.tasks``, done ones with their results): a thread is unfinished while it
has any task that is not waiting on an ``interrupt()``.

``resume`` and ``aresume`` finish such a run (``invoke(None, config)``, which applies
the saved writes and goes on); ``resume_stream`` and ``aresume_stream`` do it as a
stream. ``start_or_resume`` starts a thread that has no checkpoint with its input, and
otherwise resumes it: a thread id per task run (one input per thread).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

__all__ = ["aresume", "aresume_stream", "resume", "resume_stream", "start_or_resume", "unfinished"]


def unfinished(state: Any) -> bool:
    """Whether a thread's ``StateSnapshot`` (``graph.get_state(config)``) stopped inside
    a run: its latest checkpoint has a task, finished or not, and none waits on an
    ``interrupt()`` (a person's answer, ``Command(resume=...)``, goes on from there)."""
    if getattr(state, "interrupts", ()):
        return False
    return bool(getattr(state, "tasks", ()))


def resume(graph: Any, config: Any, **kwargs: Any) -> Any:
    """Finish the run a crash stopped in thread ``config``: ``graph.invoke(None, config,
    **kwargs)`` if it is ``unfinished``, and its result; None if there was nothing to
    finish (the thread ended, waits on an interrupt, or has no checkpoint)."""
    if not unfinished(graph.get_state(config)):
        return None
    return graph.invoke(None, config, **kwargs)


async def aresume(graph: Any, config: Any, **kwargs: Any) -> Any:
    """``resume``, awaited (``aget_state``, ``ainvoke``)."""
    if not unfinished(await graph.aget_state(config)):
        return None
    return await graph.ainvoke(None, config, **kwargs)


def resume_stream(graph: Any, config: Any, **kwargs: Any) -> Iterator[Any]:
    """``resume`` as ``graph.stream(None, config, **kwargs)``: nothing if there is
    nothing to finish."""
    if unfinished(graph.get_state(config)):
        yield from graph.stream(None, config, **kwargs)


async def aresume_stream(graph: Any, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
    """``resume_stream``, as ``graph.astream``."""
    if unfinished(await graph.aget_state(config)):
        async for event in graph.astream(None, config, **kwargs):
            yield event


def start_or_resume(graph: Any, input: Any, config: Any, **kwargs: Any) -> Any:
    """Start thread ``config`` with ``input`` if it has no checkpoint yet, else finish
    the run a crash stopped (``resume``); the thread's state values at the end. For a
    thread that runs one input (its id names the task); a chat's next turn is a new
    ``invoke`` after ``resume``, and whether a turn was already taken is the caller's to
    tell (the thread's messages show it)."""
    state = graph.get_state(config)
    if state.created_at is None:  # no checkpoint: the input never reached the thread
        graph.invoke(input, config, **kwargs)
    elif unfinished(state):
        graph.invoke(None, config, **kwargs)
    return graph.get_state(config).values
