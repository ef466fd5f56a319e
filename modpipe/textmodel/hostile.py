"""Normalisation of hostile text, written into tokenizer.json's normalizer.

tokenizer.json is the one tokenizer that training, the client `BatchTokenizer` and Triton's `spam_tokenizer`
model all load, so a rule placed here is applied identically in the three places by construction. In order,
before the punctuation-run rule (tokenize.py) and BERT's own normalizer (lowercase, accents stripped):

1. invisible characters removed (`modpipe.features.obfuscation.INVISIBLE_RANGES`): "f\u200br\u200bee" -> "free";
2. NFKC: fullwidth and mathematical letters become ASCII ("ｆｒｅｅ", "𝐟𝐫𝐞𝐞");
3. look-alikes folded to the ASCII character of the same UTS #39 skeleton (Cyrillic "frее" -> "free"),
   one regex character class per target;
4. marks inside words dropped: one or two punctuation or symbol characters between letters ("fr.ee",
   "c*a,ll", "f.r.e.e", and also "don't", "e-mail", "cnet.com"), except leetspeak's @ $ ! (`IN_WORD_MARKS`);
   first, so that the pieces of "p*ri'ze" are not taken for one-letter words by rule 5;
5. letter-spaced words rejoined: the separator between one-letter words in a run of three or more
   ("F R E E", "F • R • E • E" after rule 4 kept the spaces) is dropped; "u r" (SMS-speak) stays.
6. optionally (`fold_leet`, on in every profile), leetspeak digits folded where they sit between letters
   ("h4d" -> "had"), and at a word's start where the word cannot be a number ("7h3" -> "the"); see
   `LEET_FOLD`.
"""

from __future__ import annotations

import re

from tokenizers import Regex, Tokenizer, normalizers

from modpipe.features.obfuscation import INVISIBLE_RANGES, LEET, SPACED_SEPARATORS, confusable_to_ascii

# The separator in a run of >= 3 one-letter words joined by that same separator: either a one-letter word
# and the separator come before the letter to its left, or the separator and a one-letter word follow the
# letter to its right. Lookarounds see the original text, so every separator of a run matches in one pass;
# words spaced with different separators ("f.r.e.e f-r-e-e") stay apart.
SPACED_RUN = "|".join(
    rf"(?<=\b\p{{L}}{sep}\p{{L}}){sep}(?=\p{{L}}\b)|(?<=\b\p{{L}}){sep}(?=\p{{L}}{sep}\p{{L}}\b)"
    for sep in (re.escape(c) for c in SPACED_SEPARATORS))


# Inserted marks split a word into pieces the model never saw together and, one token each, push a long
# text's end out of the window: on the demo build they cost 13 points of SpamAssassin accuracy, the worst
# attack by far, even with training on them. Dropping them also joins "don't" and "cnet.com"; training sees
# the same, so only the distinction between such forms is lost.
IN_WORD_MARKS = r"(?<=\p{L})[[\p{P}\p{S}]&&[^@$!]]{1,2}(?=\p{L})"


def invisible_rule() -> normalizers.Normalizer:
    ranges = "".join(f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" if lo != hi else f"\\x{{{lo:X}}}" for lo, hi in INVISIBLE_RANGES)
    return normalizers.Replace(Regex(f"[{ranges}]"), "")


def lookalike_rule() -> normalizers.Normalizer:
    """One pass over the text mapping every confusable that NFKC (rule 2) leaves non-ASCII to its ASCII.

    A Replace per target (116 regex character classes) made tokenization 7x slower (2.4 s vs 0.35 s for the
    1,546 held-out texts); a `Precompiled` normalizer is a trie lookup per character (0.06 s). Its charsmap
    (sentencepiece's format, saved inside tokenizer.json) is compiled by sentencepiece's trainer from a rule
    table, so building needs sentencepiece and serving does not."""
    import io
    import tempfile
    import unicodedata

    import sentencepiece

    rules = {ch: t for ch, t in confusable_to_ascii().items() if unicodedata.normalize("NFKC", ch) == ch}
    tsv = "".join(f"{ord(src):X}\t{' '.join(f'{ord(c):X}' for c in dst)}\n" for src, dst in sorted(rules.items()))
    model = io.BytesIO()
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", encoding="ascii") as f:
        f.write(tsv)
        f.flush()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(["ab"] * 8), model_writer=model, vocab_size=8, hard_vocab_limit=False,
            normalization_rule_tsv=f.name, add_dummy_prefix=False, remove_extra_whitespaces=False, minloglevel=2)
    spec = _field(model.getvalue(), 3)  # ModelProto.normalizer_spec
    return normalizers.Precompiled(_field(spec, 2))  # NormalizerSpec.precompiled_charsmap


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return n, i


def _field(buf: bytes, number: int) -> bytes:
    """The first length-delimited field `number` of a protobuf message (read from the wire format: the
    generated sentencepiece_model_pb2 pins a protobuf runtime other packages here disagree with)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        kind = key & 7
        if kind == 0:
            _, i = _varint(buf, i)
        elif kind == 2:
            n, i = _varint(buf, i)
            if key >> 3 == number:
                return bytes(buf[i:i + n])
            i += n
        else:
            i += 4 if kind == 5 else 8
    raise ValueError(f"protobuf field {number} not found")


# Leet folding, measured against teaching it by augmentation (docs/text-model.md): a digit is folded
# between two letters, or at a word's end after two letters ("gr347" -> "great"). At a word's start only
# where the word cannot be a number with a unit or an ordinal: before three letters ("7ravel", "5ervice"),
# or before a letter in a word of letters and leet digits that holds another one ("7h3", "0n3", "0u7"),
# so "5pm", "4th", "1st", "24hrs" and "4 sale" keep their digits. Without the word-start rule, a text with
# every word disguised kept "7h3", "4lmo$7", "7his": legitimate prose written so was flagged 6 times in 120
# (clean: once), and adding the rule to that build's tokenizer alone took every form within 1.4 points of
# clean accuracy (docs/text-model.md).
LEET_FOLD = tuple((digit, letter) for letter, digit in LEET.items())


def leet_rules() -> list[normalizers.Normalizer]:
    leet = "".join(d for d, _ in LEET_FOLD)
    word = rf"[\p{{L}}{leet}]*"  # the rest of a word of letters and leet digits
    rules = [normalizers.Replace(Regex(
        rf"(?<![\p{{L}}\p{{N}}]){digit}(?:(?=\p{{L}}{{3}})|(?=\p{{L}})(?={word}[{leet}])(?={word}(?![\p{{L}}\p{{N}}])))"),
        letter) for digit, letter in LEET_FOLD]
    for _ in range(2):  # a second pass reaches digits whose neighbour was a digit in the first ("gr347")
        for digit, letter in LEET_FOLD:
            rules.append(normalizers.Replace(
                Regex(rf"(?<=\p{{L}}){digit}(?=[\p{{L}}{leet}])|(?<=[\p{{L}}{leet}]){digit}(?=\p{{L}})"
                      rf"|(?<=\p{{L}}\p{{L}}){digit}(?![\p{{L}}\p{{N}}])"), letter))
    return rules


def hostile_rules(fold_leet: bool = False) -> list[normalizers.Normalizer]:
    rules = [invisible_rule(), normalizers.NFKC(), lookalike_rule(),
             normalizers.Replace(Regex(IN_WORD_MARKS), ""), normalizers.Replace(Regex(SPACED_RUN), "")]
    return rules + (leet_rules() if fold_leet else [])


def harden(tokenizer: Tokenizer, fold_leet: bool = False) -> Tokenizer:
    """Prepend the hostile-text rules to the tokenizer's normalizer (in place; saved with tokenizer.json)."""
    current = tokenizer.normalizer
    tokenizer.normalizer = normalizers.Sequence(hostile_rules(fold_leet) + ([current] if current is not None else []))
    return tokenizer
