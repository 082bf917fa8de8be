"""A request text as a store keeps it (store/request_texts.py): any text comes back
exactly, in a form every database holds (UTF-8, no NUL), and a request the runtime
builds is kept as it is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from crashproof.store.request_texts import kept_form, kept_text

# Any code point, lone surrogates included (Hypothesis leaves them out by default).
TEXTS = st.text(st.characters(codec=None, exclude_categories=()))


@given(TEXTS)
def test_any_text_comes_back_exactly_in_a_form_a_database_holds(text: str) -> None:
    stored = kept_form(text)
    assert kept_text(stored) == text
    assert "\x00" not in stored
    stored.encode()  # UTF-8: no lone surrogate


@given(st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",))))
def test_a_text_a_database_holds_is_kept_as_it_is_unless_it_begins_with_a_quote(
    text: str,
) -> None:
    request = '{"f":1,"args":[{"v":' + repr(text) + "}]}"
    assert kept_form(request) is request
    assert kept_form('"' + text) != '"' + text
