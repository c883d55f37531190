"""The tokens file as the router watches it: a change is read within ``every_s``, a file
made invalid keeps the last good tokens (said once), and a file deleted revokes them all."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from qstate.core.errors import InvalidRequest, Unauthenticated
from qstate.core.transport.tokens import WatchedTokens, add_token


def test_the_watched_file_revokes_keeps_and_fails_closed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    file = tmp_path / "tokens.json"
    a = add_token(file, "a", ["shop"])
    watched = WatchedTokens(file, every_s=0)
    assert watched.authenticate(a).name == "a"

    b = add_token(file, "b", ["*"])  # a new token is taken without a restart
    assert watched.authenticate(b).name == "b"

    good = file.read_text()
    file.write_text("{not json")  # a bad edit: the last good tokens stay, said once
    with caplog.at_level(logging.ERROR, logger="qstate.core.transport.tokens"):
        for _ in range(5):
            assert watched.authenticate(a).name == "a"
    assert len([r for r in caplog.records if "keeping the tokens" in r.message]) == 1
    assert a not in caplog.text and b not in caplog.text

    file.unlink()  # deleting the file revokes every token
    with pytest.raises(Unauthenticated):
        watched.authenticate(a)
    with pytest.raises(Unauthenticated):
        watched.authenticate(b)

    file.write_text(good)  # and putting it back restores them
    assert watched.authenticate(b).name == "b"


def test_a_token_from_a_file_is_trimmed_and_one_no_header_can_carry_is_refused_unquoted(
) -> None:
    from qstate.client import Client
    from qstate.core.transport.security import clean_token

    assert clean_token("qs_abc\n", "t") == "qs_abc"  # a secret mounted from a file
    assert clean_token("", "t") == ""
    for bad in ("qs_a bc", "qs_é", "qs_a\nbc", "qs_\x00"):
        with pytest.raises(InvalidRequest) as info:
            clean_token(bad, "QSTATE_TOKEN")
        assert bad.strip() not in info.value.message and "QSTATE_TOKEN" in info.value.message
        with pytest.raises(InvalidRequest):
            Client("http://127.0.0.1:9", token=bad)
    with Client("http://127.0.0.1:9", token="qs_ok\n") as c:
        assert c._http.headers["authorization"] == "Bearer qs_ok"


def test_a_token_in_plain_text_off_loopback_is_refused_unless_told_and_then_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    from qstate.client import Client

    with caplog.at_level(logging.WARNING, logger="qstate.client"):
        Client("http://127.0.0.1:9", token="qs_ok").close()
        assert not caplog.records
        with pytest.raises(InvalidRequest, match="in plain text") as refused:
            Client("http://192.0.2.1:9", token="qs_ok")  # TEST-NET-1: never dialled
        assert "qs_ok" not in str(refused.value)
        assert not caplog.records
        Client("http://192.0.2.1:9", token="qs_ok", insecure_token=True).close()
    assert "plain text" in caplog.text and "qs_ok" not in caplog.text
