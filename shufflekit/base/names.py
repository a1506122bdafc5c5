"""The names that travel in MQTT topics, HPKE info strings and ledger rows (deployments,
rounds): one rule, so a budget the ledger accepts is one a coordinator can run."""

from __future__ import annotations

import re

from shufflekit.base.errors import ConfigError, InvalidInput

_BODY = r"[A-Za-z0-9_.-]{1,64}"
NAME_PATTERN = f"^{_BODY}$"  # for pydantic, whose "$" is the end of the text
_NAME = re.compile(_BODY)  # with fullmatch: re's "$" also matches before a final "\n"


def check_name(kind: str, value: object, error: type[InvalidInput] = ConfigError) -> str:
    """`value` if it is 1-64 characters of A-Z a-z 0-9 _ . -; else `error` naming `kind`."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise error(f"{kind} must be 1-64 characters of A-Z a-z 0-9 _ . -, got {value!r}")
    return value
