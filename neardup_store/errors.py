"""The package's error types.

Every error raised on purpose derives from :class:`NeardupError`, so a service can catch one
class. Each also derives from the matching builtin (``ValueError``, ``TypeError``) so code
written against the builtins keeps working. Facts live in attributes, never only in the
message, so callers never parse text.
"""

from __future__ import annotations


class NeardupError(Exception):
    """Root of every error this package raises deliberately."""


class InvalidParameterError(NeardupError, ValueError):
    """A configuration value is outside its valid range or of the wrong kind."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        super().__init__(f"{name}={value!r} is not valid: expected {expected}")
        self.name, self.value, self.expected = name, value, expected


class InputTypeError(NeardupError, TypeError):
    """A document is not text (for example ``bytes`` without an encoding, or ``None``)."""

    def __init__(self, value: object, index: int | None = None) -> None:
        where = "" if index is None else f" (document #{index})"
        hint = (
            "decode it first or pass encoding='utf-8' (or the right codec)"
            if isinstance(value, (bytes, bytearray, memoryview))
            else "pass a str"
        )
        super().__init__(f"expected a str document{where}, got {type(value).__name__}; {hint}")
        self.value_type, self.index = type(value), index


class BatchTypeError(NeardupError, TypeError):
    """A batch call got something other than an iterable of documents (often one str)."""

    def __init__(self, value: object) -> None:
        hint = (
            "for one document call signature() / hash_document(), or wrap it in a list"
            if isinstance(value, (str, bytes, bytearray, memoryview))
            else "pass a list (or any iterable) of documents"
        )
        super().__init__(f"expected an iterable of documents, got {type(value).__name__}; {hint}")
        self.value_type = type(value)


class TextDecodeError(NeardupError, ValueError):
    """Bytes given with an explicit encoding are not valid in that encoding."""

    def __init__(self, encoding: str, reason: str, index: int | None = None) -> None:
        where = "" if index is None else f"document #{index}: "
        super().__init__(
            f"{where}bytes are not valid {encoding}: {reason}; "
            "pass the encoding the data was written in"
        )
        self.encoding, self.reason, self.index = encoding, reason, index


class EmptyDocumentError(NeardupError, ValueError):
    """A document has no shingles: empty after normalisation, or (word kinds) no words."""

    def __init__(self, index: int | None = None) -> None:
        where = "the document" if index is None else f"document #{index}"
        super().__init__(
            f"{where} is empty after normalisation and has no shingles; drop it, or "
            "create the configuration with allow_empty=True to give it the empty signature"
        )
        self.index = index
