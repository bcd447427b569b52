"""Reads whose SQL is compiled once per process (issue 39).

On the live path a server reads a run's state and its newest events for every doorbell it
takes: over 100 reads a second per process at 200 events/s. Profiled (py-spy, the GIL
holder), building that SQL from the querysets, the ORM's compiler with its joins and
ordering, was a quarter of the process's time, more than the group commit of the events
themselves. The statements never change, only their parameters, so each is compiled once
from its queryset, with marker values where the parameters go, and later calls bind new
values and convert the rows the way the ORM would (JSON, datetimes).

Only ``values_list`` querysets whose arguments are integers compared with ``=``, ``>``, ``<``
(a marker stands for each, see ``_MARKER_BASE``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections
from django.db.models import QuerySet

# One value per argument, told apart from the statement's other parameters by the check in
# ``_statement``. Within the range of a 32-bit integer field: Django drops a lookup whose
# value is out of its field's range (``sequence > -1`` is always true) before it binds it.
_MARKER_BASE = 2_147_473_647


class CompiledRead:
    """``build(*arguments)`` → a ``values_list`` queryset; calling this returns its rows."""

    def __init__(self, build: Callable[..., QuerySet]):
        self._build = build
        self._compiled: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def __call__(self, *arguments: int) -> list[tuple]:
        statement = self._statement(len(arguments))
        sql, alias, slots, fixed, converters = statement
        params = list(fixed)
        for index, argument in zip(slots, arguments, strict=True):
            params[index] = argument
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if not converters:
            return rows
        converted = []
        for row in rows:
            row = list(row)
            for position, (functions, expression) in converters.items():
                value = row[position]
                for function in functions:
                    value = function(value, expression, connection)
                row[position] = value
            converted.append(tuple(row))
        return converted

    def _statement(self, arity: int) -> tuple:
        key = (arity,)
        found = self._compiled.get(key)
        if found is not None:
            return found
        with self._lock:
            markers = [_MARKER_BASE + n for n in range(arity)]
            queryset = self._build(*markers)
            compiler = queryset.query.get_compiler(using=queryset.db)
            sql, params = compiler.as_sql()
            slots = []
            for marker in markers:
                if list(params).count(marker) != 1:
                    raise ValueError(f"parameter {marker} not bound exactly once in {sql}")
                slots.append(list(params).index(marker))
            fields = [column[0] for column in compiler.select[0 : compiler.col_count]]
            # The converters (JSON, datetimes) depend on the columns only: found once too.
            converters = compiler.get_converters(fields)
            found = (sql, queryset.db, slots, tuple(params), converters)
            self._compiled[key] = found
        return found
