"""Property tests of the text asyncsoak shows: redaction and the terminal's escaping.

Bounded in time: a few hundred examples each, no example slower than half a second.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncsoak._contract._redact import REDACTED, Masker, argv_secrets, is_secret_name
from asyncsoak._contract._terminal import terminal_text

BOUNDED = settings(max_examples=300, deadline=500)

#: What a terminal acts on (as ``_terminal`` spells it), and a newline.
ACTS_ON = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u202a-\u202e\u2066-\u2069]")

#: Any text, biased towards escapes, controls and the bidi marks.
terminal_input = st.text(
    st.one_of(
        st.characters(),
        st.sampled_from(["\x1b", "\x07", "\r", "\n", "\t", "\x9b", "\u202e", "\u2066", "\\"]),
    ),
    max_size=80,
)


@BOUNDED
@given(terminal_input)
def test_escaped_text_holds_nothing_a_terminal_acts_on(text: str) -> None:
    """Spelled out, no text holds a control character, a bidi mark or (one line) a newline."""
    assert not ACTS_ON.search(terminal_text(text))
    assert "\n" not in terminal_text(text)


@BOUNDED
@given(terminal_input)
def test_escaping_is_idempotent_and_keeps_printable_text(text: str) -> None:
    """Escaping twice is escaping once; text without controls is left as it is; only newlines
    differ between the one-line and the many-line forms."""
    once = terminal_text(text, one_line=False)
    assert terminal_text(once, one_line=False) == once
    assert terminal_text(text) == once.replace("\n", "\\n")
    if not ACTS_ON.search(text):
        assert terminal_text(text) == text


#: Names whose last dotted component names a credential, in the forms trainers use.
secret_component = st.sampled_from(
    [
        "password", "passwd", "db_password", "PGPASSWORD", "secret", "client_secret",
        "api_key", "apiKey", "WANDB_API_KEY", "access_key_id", "hf_token", "HF_TOKEN",
        "authToken", "token", "auth", "pass", "credentials", "session_cookie", "sentry_dsn",
    ]
)  # fmt: skip
#: Components that name no credential (hyper-parameters that merely look close).
plain_component = st.sampled_from(
    [
        "lr", "tokenizer", "max_tokens", "num_tokens", "maxNewTokens", "token_budget",
        "batch_size", "keyboard", "pass_rate", "model", "name", "epochs", "seed",
    ]
)  # fmt: skip
prefix = st.lists(st.sampled_from(["db", "wandb", "model", "trainer", "optim"]), max_size=3)
#: Values without brackets, which the redaction mark is made of (a value inside "[redacted]"
#: is never masked, so that masking stays idempotent).
secret_value = st.text(
    st.characters(codec="ascii", categories=["L", "N"], include_characters="-_+/=.:@"),
    min_size=1,
    max_size=24,
)


@st.composite
def secret_argument(draw: st.DrawFn) -> tuple[str, str, str]:
    """(argument, its name, its value): an override or an option naming a credential."""
    name = ".".join([*draw(prefix), draw(secret_component)])
    form = draw(st.sampled_from(["{n}={v}", "+{n}={v}", "++{n}={v}", "--{n}={v}"]))
    value = draw(secret_value)
    return form.format(n=name, v=value), form.split("=")[0].format(n=name), value


@st.composite
def plain_argument(draw: st.DrawFn) -> str:
    name = ".".join([*draw(prefix), draw(plain_component)])
    return f"{name}={draw(st.sampled_from(['0.1', 'gpt2', '5', '2048', 'true']))}"


@BOUNDED
@given(
    st.lists(secret_argument(), min_size=1, max_size=4),
    st.lists(plain_argument(), max_size=4),
)
def test_redaction_leaves_no_secret_value_and_is_idempotent(
    secrets: list[tuple[str, str, str]], plain: list[str]
) -> None:
    """In any argv of credential overrides and hyper-parameters (also echoed in free text and
    inside a ``sh -c`` line): each credential becomes ``NAME=[redacted]``, no secret value of
    four characters or more is left anywhere, hyper-parameters stay, and redacting again
    changes nothing."""
    arguments = [argument for argument, _, _ in secrets] + plain
    echo = " ".join(value for _, _, value in secrets)
    argv = ["python", "train.py", *arguments, "--echo", echo, "sh -c 'exec " + echo + "'"]
    masker = Masker(argv_secrets(argv))
    shown = masker.argv(argv)
    for (_, name, _), argument in zip(secrets, shown[2:], strict=False):
        assert argument == f"{name}={REDACTED}"
    # A hyper-parameter stays unless it holds a secret's value (which is masked there too).
    if not any(len(v) >= 4 and v in " ".join(plain) for _, _, v in secrets):
        assert shown[2 + len(secrets) : 2 + len(arguments)] == plain
    # What is left once the marks and the credentials' names are taken out.
    remaining = " ".join(shown).replace(REDACTED, "\0")
    for _, name, _ in secrets:
        remaining = remaining.replace(name, "\0")
    for _, _, value in secrets:
        if len(value) >= 4 and value not in REDACTED:
            assert value not in remaining
    assert masker.argv(shown) == shown


@BOUNDED
@given(prefix, secret_component, plain_component)
def test_only_the_last_dotted_component_decides(head: list[str], secret: str, plain: str) -> None:
    """``db.password`` names a credential and ``password.min_length`` does not: whatever comes
    before the last dot, the last component alone decides."""
    assert is_secret_name(".".join([*head, plain, secret]))
    assert not is_secret_name(".".join([*head, secret, plain]))
