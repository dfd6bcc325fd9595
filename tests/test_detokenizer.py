"""Incremental detokenization: whole characters only, stop strings across tokens."""

from __future__ import annotations

import pytest

from actors.text.detokenizer import IncrementalDetokenizer
from server_helpers import default_tokenizer


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer().backend_tokenizer


def feed(det, ids, step=1):
    out = []
    for i in range(0, len(ids), step):
        r = det.add(ids[i : i + step])
        out.append(r.text)
        if r.stop_reason is not None:
            return out, r.stop_reason
    out.append(det.flush())
    return out, None


def test_never_splits_utf8(tok):
    text = "héllo 😀 wörld, 日本語のテキスト"
    ids = tok.encode(text, add_special_tokens=False).ids
    pieces, _ = feed(IncrementalDetokenizer(tok), ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("step", [1, 2, 3])
def test_stop_string_spanning_tokens(tok, step):
    text = "The quick brown fox jumps over the lazy dog"
    ids = tok.encode(text, add_special_tokens=False).ids
    det = IncrementalDetokenizer(tok, stop=["fox jum"])
    pieces, reason = feed(det, ids, step)
    assert reason == "fox jum"
    assert "".join(pieces) == "The quick brown "
    assert not any("fox" in p for p in pieces)  # never emitted, not even partly


def test_include_stop_and_no_false_holdback(tok):
    ids = tok.encode("one two three four", add_special_tokens=False).ids
    pieces, reason = feed(IncrementalDetokenizer(tok, stop=["three"],
                                                 include_stop_str_in_output=True), ids)
    assert "".join(pieces) == "one two three" and reason == "three"
    # A held-back prefix that never completes is released at the end.
    pieces, reason = feed(IncrementalDetokenizer(tok, stop=["fourteen"]), ids)
    assert reason is None and "".join(pieces) == "one two three four"
