"""Keep secrets out of everything asyncsoak writes or prints: the values of credential names
(:func:`is_secret_name`), URL and connection-string passwords, Azure keys and credential-shaped
tokens (``hf_...``, ``Bearer ...``) are redacted where they stand and masked in free text.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

REDACTED = "[redacted]"

#: A word that names a credential wherever it stands, even inside one word ("PGPASSWORD",
#: "client_secret", "dbPassword", "SECRET_KEY_BASE"): rare in anything else.
_SECRET_STEM = re.compile(r"passw|passphrase|secret|credential|cookie|webhook|dsn")
#: Words that name a credential wherever they stand, whole.
_SECRET_WORDS = frozenset({"session", "apikey", "accesskey", "privatekey", "signingkey"})
#: Words that name a credential as the last word of a name ("HF_TOKEN", "db.pass",
#: "use_auth_token", "authToken"), and count or describe something else before another word
#: ("token_budget", "key_path", "pass_rate").  "token" ends a word ("hftoken"); the others
#: are whole words.  "tokens", "tokenizer" and "max_tokens" are no credentials.
_LAST_WORDS = frozenset({"key", "pass", "auth", "pat"})
#: ``(api|access|private|signing|auth)`` then ``key``: "AWS_ACCESS_KEY_ID", "api_key".
_KEY_QUALIFIERS = frozenset({"api", "access", "private", "signing", "auth"})
# Lower then upper case is a word boundary ("apiKey"); so are _ - and spaces.
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SEPARATORS = re.compile(r"[_\-\s]+")
# Hydra's and OmegaConf's keys: "db.password", "+db.password", "~db.password",
# "servers[0].token", "db/password"; never a URL or a path with ":" in it.
_OVERRIDE_NAME = re.compile(r"[+~]{0,2}[A-Za-z_][\w.\-/\[\]]*")
_INDEX = re.compile(r"\[[^\]]*\]")
_WHITESPACE = re.compile(r"(\s+)")

# scheme://user:password@host -> scheme://user:[redacted]@host; a password may hold a raw "/"
# (it should be percent-encoded, but people paste what they have).
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]+)(?=@)")
# libpq's password parameter: ``?password=V&...`` in a URL, ``password=V`` or
# ``password = 'a b'`` in a keyword string (single quotes, backslash escapes).
_CONNINFO_PASSWORD = re.compile(
    r"(?P<head>(?<![\w])password\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|[^\s&'\"#]+)", re.IGNORECASE
)
# A URL's query parameter (``?token=V``, ``&X-Amz-Signature=V``): masked when its name is a
# credential's (:func:`_query_secret`).
_QUERY_PARAMETER = re.compile(r"(?P<head>[?&](?P<name>[A-Za-z][\w.\-]*)=)(?P<pw>[^&;\s#'\"<>]+)")
#: Query parameters that carry a signature: Azure's SAS ``sig``, ``X-Amz-Signature``,
#: ``X-Goog-Signature`` and S3's older ``Signature``.
_SIGNATURE_WORDS = frozenset({"sig", "signature"})
# The keys of an Azure connection string (storage, Service Bus, Event Hubs); a shared access
# signature holds ``&`` and ``=``, so its value runs to the next ``;``.
_AZURE_KEY = re.compile(
    r"(?P<head>(?<![\w])(?:AccountKey|SharedAccessKey|SharedAccessSignature)\s*=\s*)"
    r"(?P<pw>[^;\s'\"]+)",
    re.IGNORECASE,
)
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
    """Whether an environment variable, metadata key, option or override names a credential,
    by the words of its last dotted component (``db.password`` is one, ``password.min_length``
    is not)."""
    component = re.split(r"[./]", _INDEX.sub("", name).strip("+~-"))[-1]
    words = [w.lower() for w in _WORD_SEPARATORS.split(_CAMEL.sub("_", component)) if w]
    if not words:
        return False
    if any(_SECRET_STEM.search(w) or w in _SECRET_WORDS for w in words):
        return True
    if any(a in _KEY_QUALIFIERS and b == "key" for a, b in itertools.pairwise(words)):
        return True
    # "MYSQL_PWD" is a password, "PWD" alone the working directory.
    if words[-1] == "pwd" and len(words) > 1:
        return True
    return words[-1] in _LAST_WORDS or words[-1].endswith("token")


def _query_secret(name: str) -> bool:
    """Whether a URL query parameter's name is a credential's (``token``, ``sig``...)."""
    return _WORD_SEPARATORS.split(name.lower())[-1] in _SIGNATURE_WORDS or is_secret_name(name)


def _query_sub(match: re.Match[str]) -> str:
    return match.group("head") + REDACTED if _query_secret(match.group("name")) else match.group()


def redact_url_passwords(text: str) -> str:
    """``text`` with the passwords of URLs and connection strings, the credentials of URL
    queries and the keys of Azure connection strings replaced by the mark."""
    for pattern in (_URL_PASSWORD, _CONNINFO_PASSWORD, _AZURE_KEY):
        text = pattern.sub(lambda m: m.group("head") + REDACTED, text)
    return _QUERY_PARAMETER.sub(_query_sub, text)


def _conninfo_passwords(text: str) -> list[str]:
    """The passwords and keys a URL or a connection string in ``text`` carries, unquoted."""
    found = [m.group("pw") for m in _URL_PASSWORD.finditer(text)]
    found += [m.group("pw") for m in _AZURE_KEY.finditer(text)]
    found += [m.group("pw") for m in _QUERY_PARAMETER.finditer(text) if _query_secret(m["name"])]
    for match in _CONNINFO_PASSWORD.finditer(text):
        value = match.group("pw")
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found.append(value)
    return found


def public_conninfo(db: str) -> str:
    """A database's URL or keyword connection string without its password, in any of its
    forms (``user:PW@``, ``?password=PW``, ``password=PW``), still naming the same database:
    what child processes, messages and records get (the password goes as ``PGPASSWORD``)."""
    if "://" in db:
        url = _URL_PASSWORD.sub(lambda m: m.group("head")[:-1], db)
        base, question, query = url.partition("?")
        if not question:
            return url
        kept = [p for p in query.split("&") if p.partition("=")[0].strip().lower() != "password"]
        return base + ("?" + "&".join(kept) if kept else "")
    without = _CONNINFO_PASSWORD.sub("", db)
    return " ".join(without.split()) if without != db else db


def mask_credential_shapes(text: str) -> str:
    """Mask tokens recognisable by their shape (``hf_...``, ``AKIA...``, ``Bearer ...``)."""
    return _CREDENTIAL_SHAPED.sub(lambda m: (m.group("bearer") or "") + REDACTED, text)


def _secret_argument(arg: str) -> tuple[str, str | None] | None:
    """How ``arg`` carries a credential: ``("--token", "V")`` for ``--token=V``, ``("--token",
    None)`` for ``--token`` (the next argument is its value), ``("db.password", "V")`` for the
    override ``db.password=V``; None when it carries none."""
    if arg in ("-", "--"):
        return None
    name, eq, value = arg.partition("=")
    if arg.startswith("-"):
        return (name, value if eq else None) if is_secret_name(name) else None
    if eq and _OVERRIDE_NAME.fullmatch(name) and is_secret_name(name):
        return name, value
    return None


def argv_secrets(argv: Iterable[str]) -> frozenset[str]:
    """The values of credentials in ``argv``: options (``--token=V``, ``--password V``) and
    overrides (``db.password=V``), also inside an argument that is itself a command line
    (``sh -c "train.py --token V"``)."""
    values: set[str] = set()
    for arg, hidden, secret in _arguments(argv):
        if hidden:
            values.add(arg)
        if secret is not None:
            if secret[1] is not None:
                values.add(secret[1])
        elif _WHITESPACE.search(arg):
            values.update(argv_secrets(arg.split()))
    return frozenset(v for v in values if len(v) >= _MIN_MASKED_LEN)


def _arguments(argv: Iterable[str]) -> Iterator[tuple[str, bool, tuple[str, str | None] | None]]:
    """Each argument, whether it is the value of a credential option before it (``--token
    V``), and how it carries a credential itself (:func:`_secret_argument`)."""
    hide_next = False
    for arg in argv:
        hidden = hide_next and not arg.startswith("-")
        secret = _secret_argument(arg)
        hide_next = secret is not None and secret[1] is None
        yield arg, hidden, secret


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` safe to record."""
    return {
        name: REDACTED if is_secret_name(name) else redact_url_passwords(value)
        for name, value in env.items()
    }


def redact_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """Redact credential-looking keys (recursively) in user metadata."""
    return {key: _redacted(key, value) for key, value in data.items()}


def _redacted(key: object, value: Any) -> Any:
    if is_secret_name(str(key)):
        return REDACTED
    if isinstance(value, Mapping):
        return redact_mapping(value)
    return redact_url_passwords(value) if isinstance(value, str) else value


def secret_values(*sources: Mapping[str, Any]) -> frozenset[str]:
    """The values that must be masked in free text, from environments or metadata."""
    values: set[str] = set()
    for source in sources:
        for name, value in source.items():
            if not isinstance(value, str):
                continue
            if is_secret_name(str(name)):
                values.add(value)
            values.update(_conninfo_passwords(value))
    return frozenset(v for v in values if len(v) >= _MIN_MASKED_LEN)


class Masker:
    """Replaces known secret values (and URL passwords) in free text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # A value inside the mark itself ("dact") would mask the mark on a second pass.
        ordered = sorted({s for s in secrets if s and s not in REDACTED}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(REDACTED, text)
        return mask_credential_shapes(redact_url_passwords(text))

    def argv(self, argv: Iterable[str]) -> list[str]:
        """``argv`` with secrets masked, and the values of credential-named options and
        overrides redacted (``--token=[redacted]``, ``db.password=[redacted]``)."""
        out: list[str] = []
        for arg, hidden, secret in _arguments(argv):
            if hidden:
                out.append(REDACTED)
            elif secret is not None and secret[1] is not None:
                out.append(f"{secret[0]}={REDACTED}")
            else:
                out.append(self._command_line(arg) if _WHITESPACE.search(arg) else self(arg))
        return out

    def _command_line(self, arg: str) -> str:
        """An argument that is itself a command line (``sh -c "train.py --token V"``): its
        words redacted as an argv, the spaces between them kept."""
        pieces = _WHITESPACE.split(arg)
        pieces[0::2] = self.argv(pieces[0::2])
        return self("".join(pieces))

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
