"""Database functions the tree reads use: timestamps converted by the database, not in Python
(converting 300,000 datetimes in Python was most of the cost of reading a 100k-run tree)."""

from __future__ import annotations

from django.db.models import BigIntegerField, CharField, Func


class EpochMillis(Func):
    """A timestamp as integer epoch milliseconds, computed by the database: converting
    300,000 datetimes in Python was most of the cost of reading a 100k-run tree."""

    output_field = BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(
            compiler,
            connection,
            template="CAST(ROUND((julianday(%(expressions)s) - 2440587.5) * 86400000.0) AS INTEGER)",
            **extra,
        )

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(
            compiler,
            connection,
            template="(FLOOR(EXTRACT(EPOCH FROM %(expressions)s) * 1000))::bigint",
            **extra,
        )


class IsoMillis(Func):
    """A timestamp as the ISO 8601 text the API writes (UTC, milliseconds, ``Z``), made by
    the database: parsing and re-formatting 300,000 datetimes in Python was most of the time
    of a 100k-run subtree."""

    output_field = CharField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(
            compiler,
            connection,
            template="strftime('%%%%Y-%%%%m-%%%%dT%%%%H:%%%%M:%%%%fZ', %(expressions)s)",
        )

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(
            compiler,
            connection,
            template="""to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')""",
        )
