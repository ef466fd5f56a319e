"""Text fingerprint (modpipe.features.text) and journey features (modpipe.features.journey)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from modpipe.features.journey import JOURNEY_FEATURES, journey_features
from modpipe.features.text import normalise_text, text_fingerprint


def test_same_text_variants_share_a_fingerprint():
    base = text_fingerprint("Win a FREE iPhone now! Call 555-1234 https://bit.ly/abc")
    for variant in ["win a free iphone now!  call 555-9876 http://evil.example/x",
                    "WIN A FREE IPHONE NOW! CALL 1-2 www.other.com",
                    "Win a free\u200b iPhone now!\nCall 000-0000 paypa1.com/login",
                    "Ｗｉｎ a free iPhone now! Call 555-1234 https://t.co/x"]:
        assert text_fingerprint(variant) == base, normalise_text(variant)


def test_different_texts_differ():
    assert text_fingerprint("hello world") != text_fingerprint("hello there")
    assert text_fingerprint(None) == text_fingerprint("") == text_fingerprint("   ")
    assert len(text_fingerprint("x")) == 32


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(max_size=200))
def test_fingerprint_total_and_normalisation_idempotent(text):
    fp = text_fingerprint(text)
    assert isinstance(fp, str) and len(fp) == 32
    assert normalise_text(normalise_text(text)) == normalise_text(text)


def step(name, ms):
    return {"step": name, "ms": ms}


def test_journey_absent_is_all_none():
    assert journey_features(None) == dict.fromkeys(JOURNEY_FEATURES)
    assert journey_features("garbage") == dict.fromkeys(JOURNEY_FEATURES)


def test_human_journey():
    f = journey_features([step("open", 800), step("focus", 300), step("type", 9000), step("submit", 40)],
                         text_length=60)
    assert f["journey_steps"] == 4 and f["journey_total_ms"] == 10140
    assert f["journey_min_step_ms"] == 40 and f["journey_max_step_ms"] == 9000
    assert f["journey_typing_ms"] == 9000 and f["journey_typing_cps"] == round(60 / 9, 3)
    assert f["journey_has_submit"] and not f["journey_paste"]
    assert f["journey_submit_without_typing"] is False


def test_submit_without_typing():
    assert journey_features([step("open", 50), step("submit", 3)])["journey_submit_without_typing"]
    # typing only after the submit does not count
    assert journey_features([step("submit", 3), step("type", 900)])["journey_submit_without_typing"]
    # no journey steps at all: the post was still submitted, nothing typed
    f = journey_features([])
    assert f["journey_submit_without_typing"] and f["journey_steps"] == 0 and f["journey_min_step_ms"] is None
    # no submit step recorded: the end of the journey is the submit
    assert not journey_features([step("type", 5000)], text_length=20)["journey_submit_without_typing"]


def test_typing_too_fast_and_paste():
    fast = [step("type:body", 100), step("submit", 10)]
    assert journey_features(fast, text_length=200)["journey_submit_without_typing"]  # 2000 chars/s
    assert journey_features(fast)["journey_submit_without_typing"]  # unknown length, < MIN_TYPING_MS
    assert not journey_features([step("type", 100), step("paste", 50), step("submit", 5)],
                                text_length=200)["journey_submit_without_typing"]
    zero = journey_features([step("type", 0), step("submit", 1)], text_length=5)
    assert zero["journey_submit_without_typing"] and zero["journey_typing_cps"] is None


def test_bad_steps_are_counted_not_fatal():
    f = journey_features([step("open", -5), "junk", {"step": "type"}, step("type", True), step("submit", 7)])
    assert f["journey_invalid_steps"] == 4 and f["journey_total_ms"] == 7 and f["journey_steps"] == 5


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.one_of(st.fixed_dictionaries({"step": st.sampled_from(["type", "paste", "submit", "open",
                                                                         "x"]),
                                                 "ms": st.one_of(st.integers(-10, 10**6), st.floats())}),
                          st.none(), st.text(max_size=3)), max_size=20),
       st.one_of(st.none(), st.integers(0, 10_000)))
def test_journey_total(journey, text_length):
    f = journey_features(journey, text_length)
    assert set(f) == set(JOURNEY_FEATURES)
    assert f["journey_steps"] == len(journey) and isinstance(f["journey_submit_without_typing"], bool)


def test_long_unbroken_text_is_not_quadratic():
    import time

    start = time.perf_counter()
    for text in ("ab" * 25_000, "a." * 25_000, "a-" * 25_000 + "!"):
        text_fingerprint(text)
    assert time.perf_counter() - start < 2.0  # the searching regex took ~1.5 s for 8k characters


def _journey_by_definition(journey, text_length=None):
    """The journey features as their docstring defines them, step list by step list (the reference the one-pass
    `journey_features` must equal)."""
    from modpipe.features.journey import MAX_HUMAN_CPS, MIN_TYPING_MS, _kind, _ms

    if not isinstance(journey, list):
        return dict.fromkeys(JOURNEY_FEATURES)
    kinds, durations, invalid = [], [], 0
    for item in journey:
        if not isinstance(item, dict):
            invalid += 1
            continue
        ms = _ms(item.get("ms"))
        if ms is None:
            invalid += 1
        else:
            durations.append(ms)
        kinds.append((_kind(item.get("step")), ms))
    first_submit = next((i for i, (k, _) in enumerate(kinds) if k == "submit"), len(kinds))
    before = kinds[:first_submit]
    pasted = any(k == "paste" for k, _ in before)
    typing_ms = sum(ms for k, ms in before if k == "type" and ms is not None)
    has_typing = any(k == "type" for k, _ in before)
    cps = None
    if has_typing and text_length is not None:
        cps = float("inf") if typing_ms == 0 else text_length * 1000.0 / typing_ms
    too_fast = False
    if has_typing and not pasted:
        too_fast = cps > MAX_HUMAN_CPS if cps is not None else typing_ms < MIN_TYPING_MS
    return {"journey_steps": len(journey), "journey_total_ms": sum(durations),
            "journey_min_step_ms": min(durations) if durations else None,
            "journey_max_step_ms": max(durations) if durations else None, "journey_typing_ms": typing_ms,
            "journey_typing_cps": None if cps is None or cps == float("inf") else round(cps, 3),
            "journey_paste": pasted, "journey_has_submit": first_submit < len(kinds),
            "journey_invalid_steps": invalid,
            "journey_submit_without_typing": (not any(k in ("type", "paste") for k, _ in before)) or too_fast}


_STEP = st.one_of(
    st.fixed_dictionaries({"step": st.sampled_from(["type", "Type-Body", "paste", "submit", "post", "open", "keyup:x",
                                                    "", None, 3]),
                           "ms": st.one_of(st.integers(-5, 10 ** 13), st.floats(allow_nan=True), st.none(),
                                           st.booleans(), st.text(max_size=3))}),
    st.dictionaries(st.sampled_from(["step", "ms", "x"]), st.integers(0, 500), max_size=2),
    st.integers(), st.none(), st.text(max_size=4))


@settings(max_examples=500, deadline=None, database=None)
@given(st.one_of(st.lists(_STEP, max_size=12), st.none(), st.text(max_size=3)),
       st.one_of(st.none(), st.integers(0, 5000)))
def test_the_one_pass_journey_features_equal_their_definition(journey, text_length):
    got, want = journey_features(journey, text_length), _journey_by_definition(journey, text_length)
    assert list(got) == list(want) == list(JOURNEY_FEATURES)
    assert {k: (type(v), v) for k, v in got.items()} == {k: (type(v), v) for k, v in want.items()}


def _reference_normalise(text):
    """normalise_text as first written (a lookup per character, a regex per token): the fingerprints stored in
    the tables were made with it, so a faster one must give the same text for every input."""
    import unicodedata

    from modpipe.features.text import _DIGITS_RE, _PUNCT, _URL_TOKEN_RE

    if not text:
        return ""
    t = text
    if not t.isascii():
        t = unicodedata.normalize("NFKC", t)
        t = "".join(ch for ch in t if unicodedata.category(ch) != "Cf")
    tokens = ["<url>" if _URL_TOKEN_RE.match(tok.strip(_PUNCT)) else tok for tok in t.casefold().split()]
    return _DIGITS_RE.sub("0", " ".join(tokens))


HOSTILE = ["", " ", "a\u200bb\u200c\u200dc\u2060\ufeff", "\u202eevil\u202c.com/x", "ＷＩＮ ｗｗｗ．ｅｖｉｌ．ｃｏｍ",
           "visit www.x.io, now!", "(http://a.b/c?d=1)", "mailto:me", "x:y", "end.", "e.g. i.e.", "a..b", ".com",
           "\u00ad\u061c soft\u00adhyphen", "ﬁne ß ΣΑΣ", "9.99 $ 1:30pm", "\U000e0001tag\U000e007f", "😀.ws/😀"]


# pieces of links, punctuation and spacing: random text alone seldom makes a token that looks like a URL
PIECES = ["www.", "http://", "s3+x.y-z://", "a", "bc", "x-1", ".", "..", ":", "/", "?", "#", "(", ")", ",", "!",
          '"', "*", "-", "7", " ", "  ", "\n", "\u200b", "\u00a0", "Ｗ", "é", ".com", ".io", "ǅ", "\u2028"]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80) | st.sampled_from(HOSTILE)
       | st.lists(st.sampled_from(PIECES), max_size=24).map("".join))
def test_the_normalised_text_is_the_reference_one_for_any_text(text):
    assert normalise_text(text) == _reference_normalise(text)


def test_the_normalised_text_is_the_reference_one_on_the_held_out_corpus(model_build):
    texts = [row["text"] for row in model_build.heldout()] + HOSTILE
    assert len(texts) > 1000
    assert [normalise_text(t) for t in texts] == [_reference_normalise(t) for t in texts]


def test_every_format_character_and_only_those_is_dropped():
    # the class is written as ranges of code points: each end of each range, and the characters beside it
    import sys
    import unicodedata

    from modpipe.features.text import _format_chars

    pattern = _format_chars()
    for c in range(sys.maxunicode + 1):
        ch = chr(c)
        assert bool(pattern.fullmatch(ch)) == (unicodedata.category(ch) == "Cf"), hex(c)
