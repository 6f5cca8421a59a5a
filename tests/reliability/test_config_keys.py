"""Config keys a user mistypes: a path-like key and a near miss each get one line that says
what was wrong (issue: a key ``../../x`` named ``'/'``; ``clients`` gave no suggestion)."""

import pytest

from fedforge import load_config
from fedforge.errors import ConfigError

QUICKSTART = "examples/quickstart.toml"


def _error(override: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [override])
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("override", ["../../x=1", "client/../x=1", "a b=1"])
def test_a_path_like_override_key_is_an_unknown_config_key(override):
    key = override.split("=")[0]
    assert _error(override) == (f"override {override!r}: unknown config key {key!r}; a key is "
                                "dotted names, e.g. client.batch_size")


@pytest.mark.parametrize(("override", "expected"), [
    ("clients.batch_size=3", "clients: unknown key; did you mean 'client'?"),
    ("client.batchsize=3", "client.batchsize: unknown key; did you mean 'batch_size'? (got 3)"),
])
def test_a_near_miss_names_the_key_it_is_close_to(override, expected):
    assert _error(override) == expected


def test_a_key_close_to_nothing_keeps_the_plain_message():
    assert _error("client.zzzzqq=3") == "client.zzzzqq: Extra inputs are not permitted (got 3)"
