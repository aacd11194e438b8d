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


def test_empty_query_and_a_marker_alone_are_said_plainly():
    with pytest.raises(QueryError, match=r"^the query is empty: give the text of what to find$"):
        parse_query("  ")
    with pytest.raises(QueryError) as exc:
        parse_query("Without  a dog")
    assert str(exc.value) == ("the query 'Without a dog' has nothing before 'Without': give "
                              "the text of what to find first")


def _accepted(text: str) -> bool:
    try:
        parse_query(text)
    except QueryError:
        return False
    return True


def test_the_published_pattern_accepts_exactly_the_queries_parse_query_accepts():
    """QUERY_PATTERN (the service's schema for q) against parse_query itself, on the grammar's
    edge cases and on 3,000 random texts of words, markers and whitespace."""
    import random
    import re

    from dicosa.search.query import QUERY_PATTERN

    pattern = re.compile(QUERY_PATTERN)
    cases = ["", " ", "a", "without", "a without", "a without b", "without b", "a withoutb",
             "awithout b", "a BUT\tNOT b", "a but not", "a but  not\n", "a but nota",
             "exceptional", "a except", "a except b except", "é without b", "a\nwithout\nb",
             "a without b without", "a without without b", "\u00a0a", "a\u00a0without\u00a0b"]
    pieces = ["a", "dog", "without", "WithOut", "but", "not", "but not", "excluding",
              "except", "excepting", "é", "-", " ", "  ", "\t", "\n", "\u00a0"]
    rng = random.Random(0)
    cases += ["".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(0, 7)))
              for _ in range(3000)]
    assert sum(_accepted(t) for t in cases) > 1000  # both kinds are well represented
    for text in cases:
        assert bool(pattern.search(text)) == _accepted(text), repr(text)
