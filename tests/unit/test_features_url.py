"""URL parsing, canonicalisation and brand lookalikes (modpipe.features.url, modpipe.features.brands)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modpipe.features.brands import brand_match, levenshtein, skeleton
from modpipe.features.url import MAX_KEY_CHARS, MAX_URL_CHARS, parse_url, url_key

CASES = [
    # raw, canonical, domain, tld, subdomain_count
    ("HTTP://WWW.Example.CO.UK:80/a/b/../c/?utm_source=x&b=2&a=1#frag", "http://www.example.co.uk/a/c?a=1&b=2",
     "example.co.uk", "co.uk", 1),
    ("example.com", "http://example.com/", "example.com", "com", 0),
    ("https://example.com:443/", "https://example.com/", "example.com", "com", 0),
    ("https://example.com:8443/x/", "https://example.com:8443/x", "example.com", "com", 0),
    ("//cdn.example.org/a.js", "http://cdn.example.org/a.js", "example.org", "org", 1),
    ("http://paypal.com@evil.net/login", "http://evil.net/login", "evil.net", "net", 0),
    ("http://[2001:DB8::1]:8080/x", "http://[2001:db8::1]:8080/x", "2001:db8::1", None, 0),
    ("http://2130706433/", "http://127.0.0.1/", "127.0.0.1", None, 0),
    ("http://0x7f.0.0.1/", "http://127.0.0.1/", "127.0.0.1", None, 0),
    ("http://example.com./", "http://example.com/", "example.com", "com", 0),
    ("http://bücher.de/x y", "http://xn--bcher-kva.de/x%20y", "xn--bcher-kva.de", "de", 0),
    ("http:\\\\evil.com\\a\\b", "http://evil.com/a/b", "evil.com", "com", 0),
    ("localhost:8080/x", "http://localhost:8080/x", "localhost", "localhost", 0),
    ("http://foo.blogspot.com/%7efoo/%2e%2e/bar", "http://foo.blogspot.com/bar", "foo.blogspot.com",
     "blogspot.com", 0),
    ("  https://a.b.c.example.com/?fbclid=1&gclid=2  ", "https://a.b.c.example.com/", "example.com", "com", 3),
    ("http://example.com/%zz", "http://example.com/%25zz", "example.com", "com", 0),
    ("http://ex\u200bample.com/", None, None, None, None),  # zero-width space is dropped by nameprep
]


@pytest.mark.parametrize("raw,canonical,domain,tld,subs", [c for c in CASES if c[1]])
def test_examples(raw, canonical, domain, tld, subs):
    info = parse_url(raw)
    assert info.valid, info.error
    assert (info.canonical, info.domain, info.tld, info.subdomain_count) == (canonical, domain, tld, subs)


@pytest.mark.parametrize("raw", ["", "   ", "http://", "http://[::1", "http://a..b/", "http://exa mple.com",
                                 "javascript:alert(1)", "mailto:a@b.c", "http://a.com:99999/", "http://a.com:x/",
                                 "http://" + "a" * 64 + ".com", "http://1.2.3.4.5/", "http://256.1.1.1/",
                                 "ws://example.com", "x" * (MAX_URL_CHARS + 1), None, 42])
def test_invalid_never_raises(raw):
    info = parse_url(raw)
    assert not info.valid and info.error
    assert info.canonical is None and info.key is None and info.domain is None


def test_signals():
    assert parse_url("http://2130706433/").ip_obfuscated
    assert not parse_url("http://127.0.0.1/").ip_obfuscated
    assert parse_url("http://127.0.0.1/").is_ip
    assert parse_url("https://xn--pypal-4ve.com/").punycode
    assert parse_url("https://pаypal.com/").unicode_host  # Cyrillic а
    assert parse_url("https://pаypal.com/").host == "xn--pypal-4ve.com"
    assert parse_url("http://paypal.com@evil.net/").has_userinfo
    assert parse_url("https://bit.ly/abc").shortener and not parse_url("https://example.com/").shortener
    info = parse_url("http://x.com/a?utm_source=1&utm_medium=2&q=3")
    assert (info.query_params, info.tracking_params, info.query) == (3, 2, "q=3")


def test_tokens_and_keys():
    info = parse_url("https://www.Shop.example.com/Free-iPhone/win_now.html?id=7")
    assert info.token == "free iphone win now html"
    assert info.key == "shop.example.com/Free-iPhone/win_now.html?id=7" or info.key.startswith("www.")
    # http/https and www/no-www variants of a link are one link for counting
    assert url_key("http://www.example.com/a/") == url_key("https://example.com/a#x") == "example.com/a"
    assert url_key("https://example.com/a?utm_campaign=z") == "example.com/a"
    assert url_key("") is None and url_key("javascript:x") is None
    long = parse_url("https://example.com/" + "a" * 2000)
    assert long.valid and long.key.startswith("sha256:") and len(long.key) <= MAX_KEY_CHARS


def test_public_suffix_edge_cases():
    # host that is itself a public suffix: counted as its own domain rather than None
    info = parse_url("http://co.uk/")
    assert info.valid and info.domain == "co.uk" and info.subdomain_count == 0
    # unknown TLD: last label is the suffix (the PSL default rule)
    assert parse_url("http://a.b.notarealtld/").domain == "b.notarealtld"


# ---------------------------------------------------------------- properties

url_pieces = st.sampled_from(list("abcxyz019-._~:/?#[]@!$&'()*+,;=% \\") + ["é", "а", "。", "\u200b", "utm_a=",
                                                                            "%2e", "..", "%41", "&fbclid="])
url_like = st.builds(
    lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
    st.sampled_from(["", "http://", "HTTPS://", "//", "ftp://", "http:", "weird:"]),
    st.lists(st.sampled_from(["www", "EXAMPLE", "xn--pypal-4ve", "bücher", "co", "uk", "com", "1", "0x7f",
                              "paypa1", "a-b", "blogspot", ""]), min_size=1, max_size=5).map(".".join),
    st.sampled_from(["", ":80", ":443", ":8080", ":", ":99999", ":x"]),
    st.lists(url_pieces, max_size=30).map("".join),
)
any_url = st.one_of(st.text(max_size=200), url_like)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_url)
def test_never_raises_and_invariants(raw):
    info = parse_url(raw)
    if not info.valid:
        assert info.canonical is None and info.key is None
        return
    host, domain = info.host, info.domain
    assert host == host.lower() and host.isascii() and not host.endswith(".")
    assert host == domain or host.endswith("." + domain)  # the domain is a suffix of the host
    if info.tld:
        assert domain == info.tld or domain.endswith("." + info.tld)
    assert info.subdomain_count >= 0
    assert "#" not in info.canonical
    assert all(not p.lower().startswith("utm_") for p in info.query.split("&"))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_url)
def test_canonicalisation_idempotent(raw):
    info = parse_url(raw)
    if info.valid:
        again = parse_url(info.canonical)
        assert again.valid, (info.canonical, again.error)
        assert again.canonical == info.canonical
        assert again.key == info.key and again.domain == info.domain and again.tld == info.tld


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(max_size=30), st.text(max_size=30))
def test_levenshtein_limit_consistent(a, b):
    d = levenshtein(a, b)
    assert d == levenshtein(b, a)
    assert abs(len(a) - len(b)) <= d <= max(len(a), len(b))
    for limit in range(4):
        assert min(levenshtein(a, b, limit=limit), limit + 1) == min(d, limit + 1)


# ---------------------------------------------------------------- brands

@pytest.mark.parametrize("url,brand", [
    ("paypa1.com", "paypal.com"), ("g00gle.com", "google.com"), ("micr.osoftr.com", "microsoft.com"),
    ("https://xn--pypal-4ve.com/", "paypal.com"), ("rnicrosoft.com", "microsoft.com"),
    ("faceb00k-login.ru", "facebook.com"), ("arnazon.com", "amazon.com"), ("up5.com", "ups.com"),
])
def test_lookalikes(url, brand):
    m = brand_match(parse_url(url))
    assert m.lookalike and m.brand == brand and not m.owned


@pytest.mark.parametrize("url", ["paypal.com", "https://www.google.com/search", "accounts.google.com",
                                 "example.com", "wikipedia.org", "news.bbc.co.uk", "1.2.3.4", "github.io"])
def test_not_lookalikes(url):
    assert not brand_match(parse_url(url)).lookalike


def test_brand_other_signals():
    assert brand_match(parse_url("paypal.com")).owned
    assert brand_match(parse_url("paypal.xyz")).other_tld
    assert brand_match(parse_url("paypal.com.evil.net")).in_host
    assert brand_match(parse_url("secure-paypal-login.com")).in_host
    assert brand_match(parse_url("example.com")).brand is None
    assert skeleton("PаYPA1") == skeleton("paypal")


# UTS #46, non-transitional (the `idna` package), as browsers read hosts; IDNA 2003 read `faß` as `fass`.
@pytest.mark.parametrize("raw,host,host_unicode,domain", [
    ("https://faß.de/", "xn--fa-hia.de", "faß.de", "xn--fa-hia.de"),
    ("https://FAß.DE/", "xn--fa-hia.de", "faß.de", "xn--fa-hia.de"),  # upper case folded; ß kept
    ("https://XN--FA-HIA.de/", "xn--fa-hia.de", "faß.de", "xn--fa-hia.de"),
    ("https://FASS.de/", "fass.de", "fass.de", "fass.de"),  # a different host from faß.de
    ("https://www.Bücher.de/", "www.xn--bcher-kva.de", "www.bücher.de", "xn--bcher-kva.de"),
    ("https://pаypal.com/", "xn--pypal-4ve.com", "pаypal.com", "xn--pypal-4ve.com"),  # Latin with a Cyrillic а: one label, allowed
    ("https://ｅｘａｍｐｌｅ．ｃｏｍ/", "example.com", "example.com", "example.com"),  # fullwidth letters and dot
    ("https://bücher。de/", "xn--bcher-kva.de", "bücher.de", "xn--bcher-kva.de"),  # ideographic full stop
    ("https://straße.example.com/", "xn--strae-oqa.example.com", "straße.example.com", "example.com"),
    ("https://_dmarc.example.com/", "_dmarc.example.com", "_dmarc.example.com", "example.com"),  # ASCII labels as before
])
def test_hosts_are_read_with_uts46_as_browsers_do(raw, host, host_unicode, domain):
    info = parse_url(raw)
    assert info.valid and info.host == host and info.host_unicode == host_unicode and info.domain == domain


@pytest.mark.parametrize("raw,why", [
    ("https://" + "ü" * 60 + ".com/", "Label too long"),  # 60 characters, over 63 once punycoded
    ("https://☃.net/", "not allowed"),  # symbols and emoji are not IDNA 2008 letters
    ("https://😀😀.com/", "not allowed"),
    ("https://xn--zz.com/", "Invalid A-label"),  # broken punycode
    ("https://aא.com/", "direction"),  # Latin and Hebrew in one label breaks the bidi rule
    ("https://a\u200db.com/", ""),  # a zero-width joiner outside the contexts that allow it
])
def test_hosts_uts46_refuses_are_invalid_links_with_the_reason(raw, why):
    info = parse_url(raw)
    assert not info.valid and info.host is None and info.domain is None
    assert info.error.startswith("bad IDN label (UTS #46)") and why in info.error
    assert info.unicode_host == (not raw.isascii())
