"""Policy: which tools a run may use, on what, as whom, and which acts need an approval.

A ``cp.Policy`` is checked for every *new* act, before its intent is committed (a
replayed act returns its recorded outcome; an act found in flight was admitted when its
intent was committed and is reconciled, never re-judged):

1. **allowlist** — the tool's name and contract version (``Tool.version``) must be
   allowed: ``allow={"workspace": "1", "http": ["1", "2"], "outbox": "*"}``; a tool
   missing from it is refused. An empty allowlist refuses every act.
2. **scope** — per tool, either a function ``(tool, params) -> bool`` or a declarative
   mapping of field → fnmatch globs (``{"workspace": {"path": ["src/*", "README.md"]},
   "http": {"host": ["api.github.com"]}}``). A field is the act's param of that name,
   else the tool's attribute of that name; ``host`` is the host name of a ``url`` param
   or of the tool's ``base_url``; ``command`` is a ``cp.Shell`` act's ``argv`` as one
   line (``shlex.join``: ``{"shell": {"command": ["pytest *", "ruff format *"]}}``).
   Globs use ``fnmatch.fnmatchcase``: ``*`` also matches ``/``, so ``src/*`` covers
   the whole ``src`` tree. ``path`` values are normalized first (``a/./b`` is
   ``a/b``) and a path with a ``..`` segment is never in scope. A tool without
   a scope entry is limited by the allowlist alone.
3. **risk** — ``"low"``, ``"medium"`` or ``"high"``: per tool a fixed level or a
   function ``(tool, params) -> level`` (or one function for all tools); else
   ``default_risk``. An act whose level is in ``approval_required`` needs an approval.

4. **secrets** — ``secret_fields`` (globs over JSON keys, at any depth) and
   ``secret_steps`` (globs over step keys): what the console and ``crashproof show``
   redact. Display only: the journal keeps the values (see
   ``crashproof.runtime.operations.redaction``).

Outcomes, and why:

- *Outside the policy* (allowlist or scope): refused, nothing executed. The refusal is
  journaled as the act's outcome (``step_done``, status ``failed``, failure ``policy``,
  the rule and reason beside it) and raised into the workflow as ``cp.PolicyViolation``,
  a ``cp.ActFailed``. Not a freeze: the refusal is certain and final under this policy,
  exactly like a tool's permanent failure, and an agent loop can hand it back to its
  model ("you may not write outside src/") or give up; left uncaught, the run fails with
  the reason. Being recorded, it replays identically whatever policy is in force later.
- *Needs approval*: nothing is journaled for the act; the run stops in
  ``awaiting_approval`` (a ``run_frozen`` record) with the pending act — tool, params,
  operation id, intent digest, risk, policy — as evidence, and ``cp.ApprovalRequired`` is
  raised into the workflow (``Ledger.run``/``resume`` raise ``cp.RunFrozen``). A signed
  approval bound to exactly this pending act (``crashproof.runtime.guards.approvals``, checked
  and consumed in ``_approval_for``) lets the replay reach it and go on; a signed
  rejection (``crashproof.runtime.guards.rejections``) journals it as refused and raises
  ``cp.ApprovalRefused`` into the workflow.

The version, a digest of the declarative part (functions count by qualified name) and
the identity are recorded in ``run_started``; see ``crashproof.runtime.guards.binding``.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import shlex
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, NoReturn
from urllib.parse import urlsplit

from crashproof.errors import ApprovalRequired, CrashproofError, PolicyViolation
from crashproof.journal import payloads
from crashproof.journal.codec import canonical_digest, encode, error_record
from crashproof.journal.records import EventType, StepKind, StepStatus
from crashproof.runtime.guards.completion import Completion
from crashproof.runtime.port import RunSession
from crashproof.runtime.steps.environment import environment_fingerprint
from crashproof.runtime.steps.expiry import await_approval
from crashproof.runtime.steps.handoff import Work
from crashproof.tools.port import Tool

__all__ = ["RISK_LEVELS", "Policy", "Verdict", "admit_act"]

RISK_LEVELS = ("low", "medium", "high")

ScopeCheck = Callable[[Tool, Mapping[str, Any]], bool]
RiskRule = Callable[[Tool, Mapping[str, Any]], str]
Globs = Mapping[str, str | Sequence[str]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a policy says about one proposed act."""

    allowed: bool
    rule: str = ""  # for a refusal: "allow", "version" or "scope"
    reason: str = ""
    risk: str | None = None
    needs_approval: bool = False


def made_in_this_process(version: str, digest: str) -> Policy | None:
    """A live ``cp.Policy`` with this version and these rules (digest), made anywhere in
    this process: a resume finds the policy its run recorded the way an ``--app`` module
    makes it, with no ``register_policy`` call. The digest pins the rules, so any such
    object is the recorded policy."""
    return _MADE.get((version, digest))


class Policy:
    """What a run may do: allowed tools and versions, their scopes, the identity the run
    acts as, risk levels, and the levels that need an approval. See the module docstring.

    >>> policy = Policy(
    ...     "2026-08-1",
    ...     allow={"workspace": "1", "http": "1"},
    ...     scopes={"workspace": {"path": ["src/*", "README.md"]},
    ...             "http": {"host": ["api.github.com"]}},
    ...     identity="bot@example.com",
    ...     risk={"http": lambda tool, params: "high" if tool.method == "DELETE" else "low"},
    ...     approval_required={"high"},
    ... )
    """

    def __init__(
        self,
        version: str,
        *,
        allow: Mapping[str, str | Iterable[str]],
        scopes: Mapping[str, Globs | ScopeCheck] | None = None,
        identity: str | None = None,
        risk: Mapping[str, str | RiskRule] | RiskRule | None = None,
        default_risk: str = "low",
        approval_required: Iterable[str] = (),
        completion: Completion | None = None,
        secret_fields: Iterable[str] = (),
        secret_steps: Iterable[str] = (),
    ) -> None:
        if not isinstance(version, str) or not version:
            raise ValueError("a Policy needs a non-empty version string")
        self.version = version
        self.identity = identity
        self.allow: dict[str, frozenset[str]] = {
            name: frozenset([versions] if isinstance(versions, str) else versions)
            for name, versions in allow.items()
        }
        self.scopes: dict[str, dict[str, tuple[str, ...]] | ScopeCheck] = {}
        for name, scope in (scopes or {}).items():
            self._known(name, "scopes")
            if callable(scope):
                self.scopes[name] = scope
            else:
                self.scopes[name] = {
                    field: (globs,) if isinstance(globs, str) else tuple(globs)
                    for field, globs in scope.items()
                }
        if risk is not None and not callable(risk):
            for name, level in risk.items():
                self._known(name, "risk")
                if not callable(level):
                    _check_level(level, f"policy {version!r}: risk of {name!r}")
        self.risk = risk
        self.default_risk = _check_level(default_risk, f"policy {version!r}: default_risk")
        self.approval_required = frozenset(
            _check_level(level, f"policy {version!r}: approval_required")
            for level in approval_required
        )
        if completion is not None and not isinstance(completion, Completion):
            raise TypeError(f"policy {version!r}: completion= takes cp.Completion(require=[...])")
        self.completion = completion  # the checks every run under it must pass at the end
        # What people are not shown (console, `crashproof show`): operations/redaction.py.
        self.secrets = secrets_record(secret_fields, secret_steps)
        self.digest = canonical_digest(self.declaration(), what=f"policy {version!r}")
        _MADE[(version, self.digest)] = self

    def _known(self, name: str, where: str) -> None:
        if name not in self.allow:
            raise ValueError(
                f"policy {self.version!r}: {where} names tool {name!r}, which the "
                f"allowlist does not allow (allowed: {sorted(self.allow) or 'none'})"
            )

    def declaration(self) -> dict[str, Any]:
        """The declarative part, as JSON; its digest is recorded with every run."""
        risk: Any
        if self.risk is None:
            risk = {}
        elif callable(self.risk):
            risk = _callable_name(self.risk)
        else:
            risk = {
                name: _callable_name(level) if callable(level) else level
                for name, level in self.risk.items()
            }
        declared = {
            "version": self.version,
            "identity": self.identity,
            "allow": {name: sorted(versions) for name, versions in self.allow.items()},
            "scopes": {
                name: _callable_name(scope)
                if callable(scope)
                else {field: list(globs) for field, globs in scope.items()}
                for name, scope in self.scopes.items()
            },
            "risk": risk,
            "default_risk": self.default_risk,
            "approval_required": sorted(self.approval_required),
        }
        if self.completion is not None:  # (absent otherwise: earlier digests stay the same)
            declared["completion"] = list(self.completion.require)
        if self.secrets:  # (likewise)
            declared["secrets"] = self.secrets
        return declared

    def record(self) -> dict[str, Any]:
        """What a run records of its policy: version, digest, identity, and what it marks
        secret (read back by every display of the run, whatever code it imported)."""
        record = {"version": self.version, "digest": self.digest, "identity": self.identity}
        return {**record, "secrets": self.secrets} if self.secrets else record

    def evaluate(self, tool: Tool, params: Mapping[str, Any]) -> Verdict:
        """Judge one proposed act. Raises CrashproofError (recording nothing) when a scope
        or risk function fails or answers something other than the documented values."""
        allowed = self.allow.get(tool.name)
        if allowed is None:
            return Verdict(
                False,
                "allow",
                f"tool {tool.name!r} is not in its allowlist "
                f"(allowed: {', '.join(sorted(self.allow)) or 'none'})",
            )
        if "*" not in allowed and tool.version not in allowed:
            return Verdict(
                False,
                "version",
                f"tool {tool.name!r} version {tool.version!r} is not allowed "
                f"(allowed: {', '.join(sorted(allowed))})",
            )
        refusal = self._scope_refusal(tool, params)
        if refusal is not None:
            return Verdict(False, "scope", refusal)
        level = self._risk_of(tool, params)
        return Verdict(True, risk=level, needs_approval=level in self.approval_required)

    def _scope_refusal(self, tool: Tool, params: Mapping[str, Any]) -> str | None:
        scope = self.scopes.get(tool.name)
        if scope is None:
            return None
        if callable(scope):
            ok = self._ask(scope, tool, params, "scope")
            if not isinstance(ok, bool):
                raise CrashproofError(
                    f"policy {self.version!r}: the scope check {_callable_name(scope)} "
                    f"returned {ok!r}, not True/False; nothing was recorded"
                )
            return None if ok else f"the scope check {_callable_name(scope)} refused it"
        for field, globs in scope.items():
            values = _field(tool, params, field)
            if values is None:
                return f"the act has no {field!r} to check against the {tool.name} scope"
            for value in values:
                if field == "path":
                    if ".." in PurePosixPath(value).parts:
                        return f"path {value!r} has a '..' segment"
                    value = posixpath.normpath(value)
                if not any(fnmatch.fnmatchcase(value, glob) for glob in globs):
                    return f"{field} {value!r} is outside the {tool.name} scope {list(globs)}"
        return None

    def _risk_of(self, tool: Tool, params: Mapping[str, Any]) -> str:
        rule: str | RiskRule
        if self.risk is None:
            rule = self.default_risk
        elif callable(self.risk):
            rule = self.risk
        else:
            rule = self.risk.get(tool.name, self.default_risk)
        if not callable(rule):
            return rule
        level = self._ask(rule, tool, params, "risk")
        return _check_level(level, f"policy {self.version!r}: {_callable_name(rule)}", bug=True)

    def _ask(self, fn: Callable[..., Any], tool: Tool, params: Mapping[str, Any], what: str) -> Any:
        try:
            return fn(tool, params)
        except Exception as exc:
            raise CrashproofError(
                f"policy {self.version!r}: the {what} function {_callable_name(fn)} raised "
                f"{type(exc).__name__}: {exc}; nothing was recorded, the run stays resumable"
            ) from exc

    def __repr__(self) -> str:
        return f"Policy({self.version!r}, digest={self.digest[:12]}…)"


def _check_level(level: Any, what: str, *, bug: bool = False) -> str:
    if level not in RISK_LEVELS:
        message = f"{what}: risk level must be one of {RISK_LEVELS}, not {level!r}"
        if bug:
            raise CrashproofError(message + "; nothing was recorded")
        raise ValueError(message)
    return str(level)


def _callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"callable:{module}.{name}"


def _field(tool: Tool, params: Mapping[str, Any], name: str) -> list[str] | None:
    """The values of ``name`` for a scope check: the param, else the tool's attribute."""
    value: Any
    if name in params:
        value = params[name]
    elif name == "host":
        url = params.get("url") or getattr(tool, "base_url", None)
        value = urlsplit(url).hostname if isinstance(url, str) else None
    elif name == "command":  # a command's argv as one line (cp.Shell), quoted as a shell would
        argv = params.get("argv")
        ok = isinstance(argv, list) and bool(argv) and all(isinstance(a, str) for a in argv)
        value = shlex.join(argv) if ok and isinstance(argv, list) else None
    else:
        value = getattr(tool, name, None)
    values = value if isinstance(value, list | tuple) else [value]
    out: list[str] = []
    for item in values:
        if isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str):
            return None
        out.append(item.lower() if name == "host" else item)
    return out or None


# -- the gate before an act's intent -----------------------------------------


def admit_act(
    session: RunSession,
    policy: Policy | None,
    key: str,
    tool: Tool,
    params: dict[str, Any],
    digest: str,
) -> Work[dict[str, Any] | None]:
    """Let a new act through, or refuse it (journaled, PolicyViolation), or stop the run
    in awaiting_approval (ApprovalRequired). Called before anything of the act commits.
    Returns the binding of the approval it consumed (``Call.approval``), if one was due."""
    if policy is None:
        return None
    verdict = policy.evaluate(tool, params)
    if not verdict.allowed:
        _refuse(session, policy, key, tool, params, digest, verdict)
    if not verdict.needs_approval:
        return None
    from crashproof.runtime.guards.approvals import binding
    from crashproof.runtime.guards.rejections import refuse_rejected, rejection_for

    rejected = rejection_for(session, key, digest)  # a signed "no": never executed
    if rejected is not None:
        refuse_rejected(session, key, digest, rejected)

    # What the tool observes of its target now: an approval binds it (None: no observe).
    seen = yield from environment_fingerprint(tool)
    approval, refused = _approval_for(session, policy, key, digest, seen)
    if approval is None:
        _await_approval(session, policy, key, tool, params, digest, verdict, seen, refused)
    return binding(approval)


def admit_in_flight(
    session: RunSession, policy: Policy, key: str, tool: Tool, digest: str
) -> Work[dict[str, Any] | None]:
    """The binding of the approval an act in flight runs under: the one it consumed
    before its intent; once that act froze for a fresh approval (the consumed one lapsed
    before the effect, steps/expiry.py), a fresh one consumed now if
    one checks out, else still the lapsed one (the act is looked up, never executed)."""
    from crashproof.runtime.guards.approvals import approval_in_flight, binding, renewable

    if renewable(session, key, digest):
        seen = yield from environment_fingerprint(tool)
        approval, _ = _approval_for(session, policy, key, digest, seen)
        if approval is not None:
            return binding(approval)
    return approval_in_flight(session, key, digest)


def _approval_for(
    session: RunSession, policy: Policy, key: str, digest: str, seen: str | None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The signed approval that lets act ``key`` with intent ``digest`` proceed, already
    consumed (journaled), or None with the journaled approvals that were refused and why
    (``runtime.guards.approvals``: signature, trust root, every binding, expiry, nonce)."""
    from crashproof.runtime.guards.approvals import approval_for

    bound = {"version": policy.version, "digest": policy.digest}
    return approval_for(session, key, digest, bound, seen)


def _refuse(
    session: RunSession,
    policy: Policy,
    key: str,
    tool: Tool,
    params: dict[str, Any],
    digest: str,
    verdict: Verdict,
) -> NoReturn:
    exc = PolicyViolation(
        f"act {key!r} refused by policy {policy.version!r}: {verdict.reason}; nothing was executed"
    )
    now = time.time()
    session.append_event(
        EventType.STEP_DONE,
        key,
        payloads.as_dict(
            payloads.StepDone(
                kind=StepKind.ACT.value,
                digest=digest,
                status=StepStatus.FAILED.value,
                failure="policy",
                attempt=0,  # never attempted
                operation_id=f"{session.run_id}/{key}",
                intent_digest=digest,
                error=error_record(exc),
                policy={
                    **policy.record(),
                    "rule": verdict.rule,
                    "reason": verdict.reason,
                    "tool": tool.name,
                    "tool_version": tool.version,
                },
                started_at=now,
                ended_at=now,
            )
        ),
        # What was refused, as evidence (never replayed: replay raises the error).
        encode({"refused": {"params": params}}, what=f"the params of act {key!r}"),
    )
    raise exc


def _await_approval(
    session: RunSession,
    policy: Policy,
    key: str,
    tool: Tool,
    params: dict[str, Any],
    digest: str,
    verdict: Verdict,
    seen: str | None,
    refused: list[dict[str, Any]] | None = None,
) -> NoReturn:
    pending = {
        "run_id": session.run_id,
        "step": key,
        "operation_id": f"{session.run_id}/{key}",
        "intent_digest": digest,
        "tool": tool.name,
        "tool_version": tool.version,
        "params": params,
        "risk": verdict.risk,
        "policy": policy.record(),
        # What the tool observes of its target now (an approval binds it), if it observes.
        "environment_fingerprint": seen,
    }
    evidence: dict[str, Any] = {
        "pending_act": pending,
        # What an approval must bind (with the approver's signature, expiry and nonce).
        "approval_binds": [
            "run_id",
            "step",
            "operation_id",
            "intent_digest",
            "generation",
            "environment_fingerprint",
            "policy",
        ],
    }
    if refused:  # approvals journaled for this act that do not release it, and why
        evidence["refused_approvals"] = refused
    why = f" (approval refused: {refused[0]['reason']})" if refused else ""
    exc = ApprovalRequired(
        f"act {key!r} ({tool.name}, risk {verdict.risk}) needs an approval under policy "
        f"{policy.version!r}{why}; nothing was executed",
        evidence,
    )
    await_approval(session, key, exc, evidence)


def secrets_record(fields: Iterable[str], steps: Iterable[str]) -> dict[str, list[str]]:
    """The ``secrets`` part of a policy record (empty when the policy marks nothing; shown
    redacted by crashproof.runtime.operations.redaction)."""
    record: dict[str, list[str]] = {}
    for name, globs in (("fields", fields), ("steps", steps)):
        listed = sorted({_glob(g, name) for g in globs})
        if listed:
            record[name] = listed
    return record


def _glob(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"secret_{what} takes non-empty glob strings, not {value!r}")
    return value


# Every Policy made in this process, by (version, digest); weak, so it holds none alive.
_MADE: weakref.WeakValueDictionary[tuple[str, str], Policy] = weakref.WeakValueDictionary()
