"""Request and response shapes of the REST API, as the OpenAPI document publishes them.

Request bodies subclass the engine's ``Strict`` base (unknown fields, ``null`` and wrong types
are refused, never coerced). Query parameters are parsed just as exactly: an integer is
decimal digits, a boolean is ``true`` or ``false``, a time is RFC 3339 with an offset; what
the document says is accepted is exactly what the server accepts, so schemathesis can hold
the two to each other. Response models name their fields in the wire's camelCase.
"""
