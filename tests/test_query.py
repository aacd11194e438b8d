import pytest

from dicosa.search.query import Query, QueryError, parse_query


@pytest.mark.parametrize(("text", "expected"), [
    ("a red circle moves left", Query("a red circle moves left")),
    ("a red circle does not move", Query("a red circle does not move")),  # "not" is no marker
    ("a red circle is not still", Query("a red circle is not still")),
    ("a dog on a beach without people", Query("a dog on a beach", ("people",))),
    ("A red circle BUT NOT a blue  square", Query("A red circle", ("a blue square",))),
    ("a cat without a dog without a bird", Query("a cat", ("a dog", "a bird"))),
    ("a cat excluding dogs except birds", Query("a cat", ("dogs", "birds"))),
    ("a withoutput of notes", Query("a withoutput of notes")),  # markers are whole words
])
def test_grammar(text, expected):
    assert parse_query(text) == expected


def test_explicit_exclusions_join_those_in_the_text():
    q = parse_query("a cat without a dog", exclude=["a bird", " a  dog "])
    assert q == Query("a cat", ("a dog", "a bird")) and q.is_exclusion
    assert not parse_query("a cat").is_exclusion


@pytest.mark.parametrize("text", ["", "   ", "\t\n", "without a dog", "a cat without",
                                  "a cat without  "])
def test_empty_parts_are_one_sentence_errors(text):
    with pytest.raises(QueryError) as exc:
        parse_query(text)
    assert "\n" not in str(exc.value)
