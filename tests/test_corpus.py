from turboinfer.corpus import stdlib_docstrings


def test_stdlib_docstrings_are_stripped_and_long_enough() -> None:
    docs = stdlib_docstrings(min_chars=100)
    assert len(docs) > 1000
    assert all(len(d) >= 100 and d == d.strip() for d in docs)
    assert any(d.startswith("JSON (JavaScript Object Notation)") for d in docs)  # json's
