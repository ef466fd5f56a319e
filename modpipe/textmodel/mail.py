"""E-mail reduced to the text a reader sees: the subject and the body's text, headers and attachments dropped.

The SpamAssassin corpus (data.py) and the out-of-domain e-mail sources (corpora.py) are read through the same
reduction, so an e-mail from either looks alike to the model and to the baseline.
"""

from __future__ import annotations

import email
import email.policy
import html
import re

MAX_TEXT_CHARS = 5000  # reduced e-mails are cut here; the model reads ~128 tokens (~600 chars) anyway

_TAG = re.compile(r"<[^>]*>")
_DROP_BLOCKS = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.I | re.S)
_BREAKS = re.compile(r"<\s*(br|p|div|tr|li|h\d)\b[^>]*>", re.I)
_WS = re.compile(r"[ \t\r\f\v]+")
_NL = re.compile(r"\n\s*\n+")


def html_to_text(markup: str) -> str:
    markup = _DROP_BLOCKS.sub(" ", markup)
    markup = re.sub(r"<!--.*?-->", " ", markup, flags=re.S)
    markup = _BREAKS.sub("\n", markup)
    return html.unescape(_TAG.sub(" ", markup))


def clean_text(text: str) -> str:
    """Whitespace runs cut to one space per line, blank-line runs to one, the ends stripped."""
    lines = [_WS.sub(" ", line).strip() for line in text.replace("\r\n", "\n").split("\n")]
    return _NL.sub("\n", "\n".join(lines)).strip()


def _part_text(part) -> str:
    try:
        content = part.get_content()
    except (LookupError, ValueError, AssertionError, UnicodeError):  # unknown charsets, broken encodings
        payload = part.get_payload(decode=True) or b""
        content = payload.decode("latin-1", errors="replace")
    if isinstance(content, bytes):
        content = content.decode("latin-1", errors="replace")
    return content if isinstance(content, str) else ""


def reduce_email(raw: bytes | str) -> str:
    """Subject + body text of an RFC 822 message: text/plain parts, or the HTML parts' text when a mail
    has no plain part. Headers (other than Subject) and attachments are dropped."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", errors="replace")
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    try:
        subject = str(msg.get("subject", "") or "")
    except (ValueError, IndexError, TypeError):
        subject = ""
    plain, htmls = [], []
    for part in msg.walk():
        if part.is_multipart():
            continue
        disposition = (part.get("content-disposition") or "").lower()
        if disposition.startswith("attachment"):
            continue
        ctype = part.get_content_type()
        if ctype == "text/plain":
            plain.append(_part_text(part))
        elif ctype == "text/html":
            htmls.append(html_to_text(_part_text(part)))
    body = "\n".join(plain) if any(p.strip() for p in plain) else "\n".join(htmls)
    # a text/plain part that is really HTML (common in spam) is reduced as HTML too
    if re.search(r"<\s*(html|body|table|font|a\s+href)\b", body[:2000], re.I):
        body = html_to_text(body)
    subject = clean_text(subject).replace("\n", " ")
    text = clean_text(f"{subject}\n{clean_text(body)}" if subject else clean_text(body))
    return text[:MAX_TEXT_CHARS]
