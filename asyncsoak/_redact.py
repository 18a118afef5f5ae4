"""Keep secrets out of everything asyncsoak writes or prints.

An environment variable whose name looks like a credential is redacted wherever the
environment is recorded, a password inside a URL is redacted whatever the variable's name,
and the values of those variables are masked wherever they appear in free text (argv, the
log tail, a failed job's error, hang forensics).  In argv, the value of an option named like a
credential (``--token=VALUE``, ``--password VALUE``) is redacted too, and masked wherever else
it appears.  Values shaped like well-known credentials (``hf_...``, ``AKIA...``, ``ghp_...``,
``sk-...``, ``Bearer ...``) are masked in free text whatever printed them.
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
# scheme://user:password@host -> scheme://user:[redacted]@host; a password may hold a raw "/"
# (it should be percent-encoded, but people paste what they have).
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]+)(?=@)")
# Tokens recognisable by their shape alone: Hugging Face, AWS access key ids, GitHub, OpenAI-style
# and Slack keys; and whatever follows "Bearer" in an Authorization header.
_CREDENTIAL_SHAPED = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,})"
    r"|(?P<bearer>\b[Bb]earer\s+)[A-Za-z0-9._~+/=-]{8,}"
)
# Values this short would mask unrelated text everywhere ("1", "true").
_MIN_MASKED_LEN = 4


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or metadata key looks like a credential."""
    return bool(_SECRET_NAME.search(name))


def redact_url_passwords(text: str) -> str:
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)


def mask_credential_shapes(text: str) -> str:
    """Mask tokens recognisable by their shape (``hf_...``, ``AKIA...``, ``Bearer ...``)."""
    return _CREDENTIAL_SHAPED.sub(lambda m: (m.group("bearer") or "") + REDACTED, text)


def _secret_option(arg: str) -> tuple[str, str | None] | None:
    """``("--token", "VALUE")`` for ``--token=VALUE``, ``("--token", None)`` for ``--token``;
    None when ``arg`` is not an option named like a credential."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name, eq, value = arg.partition("=")
    if not is_secret_name(name.lstrip("-").replace("-", "_")):
        return None
    return name, (value if eq else None)


def argv_secrets(argv: Iterable[str]) -> frozenset[str]:
    """The values of credential-named options in ``argv`` (``--token=V``, ``--password V``)."""
    values: set[str] = set()
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            values.add(arg)
        hide_next = False
        option = _secret_option(arg)
        if option is not None:
            if option[1] is None:
                hide_next = True
            else:
                values.add(option[1])
    return frozenset(v for v in values if len(v) >= _MIN_MASKED_LEN)


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
        return mask_credential_shapes(redact_url_passwords(text))

    def argv(self, argv: Iterable[str]) -> list[str]:
        """``argv`` with secrets masked, and the values of credential-named options redacted."""
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next and not arg.startswith("-"):
                out.append(REDACTED)
                hide_next = False
                continue
            hide_next = False
            option = _secret_option(arg)
            if option is not None and option[1] is not None:
                out.append(f"{option[0]}={REDACTED}")
                continue
            hide_next = option is not None
            out.append(self(arg))
        return out

    def data(self, value: Any) -> Any:
        """A JSON-like value with every string masked (``cmdline`` lists as argv)."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {
                key: self.argv(item)
                if key == "cmdline" and isinstance(item, list)
                else self.data(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.data(item) for item in value]
        return value
