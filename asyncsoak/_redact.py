"""Keep secrets out of everything asyncsoak writes or prints.

An environment variable whose name looks like a credential is redacted wherever the
environment is recorded, a password inside a URL is redacted whatever the variable's name,
and the values of those variables are masked wherever they appear in free text (argv, the
log tail, a failed job's error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"

_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|(^|_)PASS($|_)|(API|ACCESS|PRIVATE|SIGNING|AUTH)_?KEY|"
    r"(^|_)KEY($|_)|CREDENTIAL|(^|_)AUTH($|_)|COOKIE|SESSION|(^|_)PAT($|_)|DSN|WEBHOOK",
    re.IGNORECASE,
)
# scheme://user:password@host -> scheme://user:[redacted]@host
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s/]+)(?=@)")
# Values this short would mask unrelated text everywhere ("1", "true").
_MIN_MASKED_LEN = 4


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or metadata key looks like a credential."""
    return bool(_SECRET_NAME.search(name))


def redact_url_passwords(text: str) -> str:
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` safe to record."""
    return {
        name: REDACTED if is_secret_name(name) else redact_url_passwords(value)
        for name, value in env.items()
    }


def redact_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """Redact credential-looking keys (recursively) in user metadata."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if is_secret_name(str(key)):
            out[key] = REDACTED
        elif isinstance(value, Mapping):
            out[key] = redact_mapping(value)
        elif isinstance(value, str):
            out[key] = redact_url_passwords(value)
        else:
            out[key] = value
    return out


def secret_values(*sources: Mapping[str, Any]) -> frozenset[str]:
    """The values that must be masked in free text, from environments or metadata."""
    values: set[str] = set()
    for source in sources:
        for name, value in source.items():
            if not isinstance(value, str):
                continue
            if is_secret_name(str(name)) and len(value) >= _MIN_MASKED_LEN:
                values.add(value)
            for match in _URL_PASSWORD.finditer(value):
                if len(match.group("pw")) >= _MIN_MASKED_LEN:
                    values.add(match.group("pw"))
    return frozenset(values)


class Masker:
    """Replaces known secret values (and URL passwords) in free text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        ordered = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return redact_url_passwords(text)

    def argv(self, argv: Iterable[str]) -> list[str]:
        return [self(arg) for arg in argv]
