"""Deadline policies: validated limits per job, from code, JSON files or the environment.

>>> table = PolicyTable.from_dict({"default": {"limit": 30},
...                                 "resize": {"limit": 2, "soft_limit": 1.5}})
>>> with table.scope("resize"): ...
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

from . import _json
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from . import _validate
from .scope import DeadlineScope, thread_deadline

ENV_PREFIX = "TIMEOUTCORE_POLICY__"


class DeadlinePolicy(_validate.LimitNames, BaseModel):
    """Limits for one kind of job: ``limit`` (the hard limit, seconds) is required,
    ``soft_limit`` must be below it.

    ``hard`` and ``soft`` are the older names of the two (accepted as input keys, readable as
    attributes, and the keys ``model_dump()`` writes).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hard: float = Field(alias="limit", validation_alias=AliasChoices("hard", "limit"))
    soft: Optional[float] = Field(
        default=None, alias="soft_limit", validation_alias=AliasChoices("soft", "soft_limit")
    )
    label: Optional[str] = None
    soft_raise: bool = False
    raise_on_timeout: bool = True

    @field_validator("hard", "soft")
    @classmethod
    def _seconds(cls, value: Optional[float], info: ValidationInfo) -> Optional[float]:
        # after pydantic's own coercion (the environment gives strings such as "2.5")
        return _validate.seconds(value, "DeadlinePolicy", str(info.field_name), allow_none=True)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> DeadlinePolicy:
        if self.soft is not None and self.soft >= self.hard:
            raise ValueError(f"soft ({self.soft} s) must be less than hard ({self.hard} s)")
        return self

    def scope(self, **overrides: Any) -> DeadlineScope:
        """A fresh ``thread_deadline`` with these limits (keyword overrides allowed)."""
        kw: dict[str, Any] = {
            "label": self.label,
            "raise_on_timeout": self.raise_on_timeout,
        }
        if self.soft is not None:
            kw["soft_limit"] = self.soft
            kw["soft_raise"] = self.soft_raise
        kw.update(overrides)
        return thread_deadline(self.hard, **kw)


PolicyLike = Union[DeadlinePolicy, Mapping[str, Any]]


def _policy(value: PolicyLike) -> DeadlinePolicy:
    if isinstance(value, DeadlinePolicy):
        return value
    return DeadlinePolicy.model_validate(dict(value))


class PolicyTable:
    """Job name -> :class:`DeadlinePolicy`, with an optional default.

    Names are case-insensitive (environment variables are upper-case by convention).
    """

    def __init__(
        self, policies: Optional[Mapping[str, PolicyLike]] = None, default: Optional[PolicyLike] = None
    ) -> None:
        self._policies = {name.lower(): _policy(p) for name, p in (policies or {}).items()}
        self.default = None if default is None else _policy(default)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyTable:
        """A table from ``{"default": {...}, "resize": {"limit": 2, "soft_limit": 1}, ...}``:
        job name -> the fields of a :class:`DeadlinePolicy`; ``default`` (optional) is the
        policy of jobs without one. Raises ``pydantic.ValidationError`` (a ``ValueError``)
        for an invalid policy."""
        policies = {k: v for k, v in data.items() if k.lower() != "default"}
        default = next((v for k, v in data.items() if k.lower() == "default"), None)
        return cls(policies, default)

    @classmethod
    def from_json(cls, path: Union[str, "os.PathLike[str]"]) -> PolicyTable:
        """Load :meth:`from_dict`'s shape from a JSON file."""
        data = _json.loads(Path(path).read_bytes())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a policy file holds a JSON object of job -> policy")
        return cls.from_dict(data)

    @classmethod
    def from_env(
        cls, environ: Optional[Mapping[str, str]] = None, prefix: str = ENV_PREFIX
    ) -> PolicyTable:
        """``TIMEOUTCORE_POLICY__<JOB>__<FIELD>=value`` (job ``DEFAULT`` is the default).

        Fields: LIMIT, SOFT_LIMIT, LABEL, SOFT_RAISE, RAISE_ON_TIMEOUT (HARD and SOFT are
        the older names of the first two).
        """
        env = os.environ if environ is None else environ
        raw: dict[str, dict[str, Any]] = {}
        for key, value in env.items():
            if not key.startswith(prefix):
                continue
            parts = key[len(prefix):].split("__")
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"{key}: expected {prefix}<JOB>__<FIELD>")
            job, field = parts[0].lower(), parts[1].lower()
            raw.setdefault(job, {})[field] = value
        try:
            return cls.from_dict(raw)
        except ValidationError as exc:
            raise ValueError(f"invalid policy in the environment ({prefix}*): {exc}") from exc

    def get(self, name: str) -> DeadlinePolicy:
        """The policy for ``name``, else the default; KeyError if neither exists."""
        policy = self._policies.get(name.lower(), self.default)
        if policy is None:
            raise KeyError(f"no deadline policy for job {name!r} and no default policy")
        return policy

    def scope(self, name: str, **overrides: Any) -> DeadlineScope:
        """A fresh ``thread_deadline`` for job ``name``; the label defaults to the name."""
        policy = self.get(name)
        if policy.label is None:
            overrides.setdefault("label", name)
        return policy.scope(**overrides)

    def names(self) -> list[str]:
        """The job names that have a policy of their own."""
        return sorted(self._policies)


_table: Optional[PolicyTable] = None


def set_policy_table(table: Optional[PolicyTable]) -> None:
    """Make ``table`` the one ``thread_deadline.from_policy(name)`` uses."""
    global _table
    _table = table


def policy_table() -> PolicyTable:
    """The table set with :func:`set_policy_table`, else one read from the environment."""
    global _table
    if _table is None:
        _table = PolicyTable.from_env()
    return _table
