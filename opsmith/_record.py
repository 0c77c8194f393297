"""A cheap immutable value-object base.

``collections.namedtuple`` and dataclasses generate and ``eval`` code when a class is
defined: 0.1–0.5 ms each, which a warm load (budget 5 ms, imports included) cannot spend
on a dozen classes. :class:`Record` defines the same behaviour once: subclasses list their
fields in ``__slots__`` and optional ``_defaults``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Record"]


class Record:
    """Immutable record: positional or keyword construction, repr, equality, hash.

    Examples
    --------
    >>> class Point(Record):
    ...     __slots__ = ("x", "y")
    ...     _defaults = {"y": 0}
    >>> Point(1)
    Point(x=1, y=0)
    >>> Point(1, 2)._replace(y=3) == Point(x=1, y=3)
    True
    """

    __slots__ = ()
    _defaults: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} arguments, got {len(args)}")
        setter = object.__setattr__
        for n, v in zip(names, args):
            setter(self, n, v)
        for n in names[len(args):]:
            if n in kwargs:
                setter(self, n, kwargs.pop(n))
            elif n in self._defaults:
                setter(self, n, self._defaults[n])
            else:
                raise TypeError(f"{type(self).__name__}() is missing {n!r}")
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unexpected {sorted(kwargs)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use _replace()")

    def _asdict(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.__slots__}

    def _replace(self, **changes: Any) -> Record:
        return type(self)(**{**self._asdict(), **changes})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash((type(self).__name__, *(getattr(self, n) for n in self.__slots__)))

    def __reduce__(self):
        return (type(self), tuple(getattr(self, n) for n in self.__slots__))
