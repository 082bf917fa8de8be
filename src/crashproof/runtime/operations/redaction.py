"""What a person is shown of a run's values: everything the journal holds, except what
the run's policy marks secret (``cp.Policy(secret_fields=..., secret_steps=...)``) and a
fixed set of field names that hold credentials by convention (``Authorization``,
``api_key``, ``password``...).

Redaction is for display only (the console, ``crashproof show``, ``review show``, their
``--json``): the journal keeps every value, and the workflow's replay, its digests and a
review case's fingerprint are all over the real values. The rules come from the journal
itself (the policy record in ``run_started`` and in every ``policy_rebound``), so a
console that never imported the agent's code redacts the same way; rules from every
binding the run had are applied together (a field secret under one policy stays hidden
after a rebind to another).

- ``secret_fields``: globs (``fnmatch``, case-insensitive) over JSON object keys,
  matched at any depth of a run's input, result, error, evidence, an act's params and
  receipt, a step's value, and a model call's tool-call arguments. The value under a
  matching key is replaced by ``"[redacted]"``.
- ``secret_steps``: globs over step keys. The step's value, params, receipt and reply are
  hidden whole; its kind, status, timing and cost stay visible.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from crashproof.journal import payloads
from crashproof.journal.records import Event, EventType, RunInfo
from crashproof.runtime.guards.review import ReviewCase

__all__ = ["DEFAULT_SECRET_FIELDS", "REDACTED", "Redaction"]

REDACTED = "[redacted]"

# Field names that carry credentials in HTTP headers, SDK configs and OAuth replies,
# hidden whatever the policy says (exact names: ``*token*`` would hide ``max_tokens``).
DEFAULT_SECRET_FIELDS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "api_key",
    "apikey",
    "password",
    "passwd",
    "secret",
    "client_secret",
    "access_token",
    "refresh_token",
    "id_token",
    "private_key",
)

T = TypeVar("T")

# What a record about a step holds of its values (the rest is status, time and digests).
_HOLDS = frozenset({"params", "pending_intent", "receipt", "value", "result", "prepared"})


@dataclass(frozen=True, slots=True)
class Redaction:
    """The secret field and step globs of one run (see the module docstring)."""

    fields: tuple[str, ...] = DEFAULT_SECRET_FIELDS
    steps: tuple[str, ...] = ()

    @classmethod
    def of(cls, events: Sequence[Event]) -> Redaction:
        """The rules of the run whose verified journal is ``events``: the defaults plus
        every policy binding it had (``run_started``, then each ``policy_rebound``)."""
        fields, steps = list(DEFAULT_SECRET_FIELDS), list[str]()
        records: list[Any] = []
        for event in events:
            if event.type is EventType.RUN_STARTED:
                records.append(payloads.run_started(event).get("policy"))
            elif event.type is EventType.POLICY_REBOUND:
                records.append(payloads.policy_rebound(event).get("new"))
        for record in records:
            secrets = record.get("secrets") if isinstance(record, dict) else None
            if isinstance(secrets, dict):
                fields.extend(g.lower() for g in secrets.get("fields") or () if isinstance(g, str))
                steps.extend(g for g in secrets.get("steps") or () if isinstance(g, str))
        return cls(tuple(dict.fromkeys(fields)), tuple(dict.fromkeys(steps)))

    def secret_field(self, name: str) -> bool:
        lowered = name.lower()
        return any(fnmatch.fnmatchcase(lowered, glob) for glob in self.fields)

    def secret_step(self, key: str | None) -> bool:
        return key is not None and any(fnmatch.fnmatchcase(key, glob) for glob in self.steps)

    def value(self, value: T, key: str | None = None) -> T:
        """``value`` with every secret field's value replaced (a copy; the whole value
        when it is the value of the secret step ``key``)."""
        if self.secret_step(key):
            return REDACTED  # type: ignore[return-value]
        return self._walk(value)  # type: ignore[no-any-return]

    def held(self, record: T, key: str | None) -> T:
        """A record about step ``key`` (a receipt, an intent) with its secret fields
        redacted and, for a secret step, what it holds of the step's values."""
        if isinstance(record, dict) and self.secret_step(key):
            return {k: REDACTED if k in _HOLDS else self._walk(v) for k, v in record.items()}  # type: ignore[return-value]
        return self._walk(record)  # type: ignore[no-any-return]

    def _walk(self, value: Any) -> Any:
        if isinstance(value, dict):
            # Evidence about a secret step (a pending act, a frozen act's receipt) names
            # the step by "key": what it holds is hidden as the step's own value is.
            step = value.get("key", value.get("step"))
            hidden = _HOLDS if isinstance(step, str) and self.secret_step(step) else ()
            return {
                k: REDACTED
                if isinstance(k, str) and (k in hidden or self.secret_field(k))
                else self._walk(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self._walk(v) for v in value)
        return value

    def case(self, case: ReviewCase) -> ReviewCase:
        """A review case with its evidence redacted (its fingerprint, over the real
        evidence, is kept: a decision still binds what the journal holds)."""
        evidence = self.held(case.evidence, case.key)
        return dataclasses.replace(case, evidence=evidence)

    def info(self, info: RunInfo) -> RunInfo:
        """A run's header with its input, result, error and evidence redacted (a failed
        step's error too: an exception's args can carry what the step was given)."""
        steps = tuple(
            s if s.error is None else dataclasses.replace(s, error=self.value(s.error, s.key))
            for s in info.steps
        )
        return dataclasses.replace(
            info,
            input=self.value(info.input),
            result=self.value(info.result),
            error=self.value(info.error),
            evidence=self.value(info.evidence),
            steps=steps,
        )
