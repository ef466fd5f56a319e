"""Bundled reference lists. Python literals (not data files) so they ship with the package as-is."""

from __future__ import annotations

# ~55 domains most imitated by phishing/spam. The label before the public suffix is the "brand core"
# that lookalikes are measured against.
BRAND_DOMAINS: tuple[str, ...] = (
    "google.com", "youtube.com", "gmail.com", "facebook.com", "instagram.com", "whatsapp.com",
    "messenger.com", "twitter.com", "x.com", "linkedin.com", "microsoft.com", "live.com", "outlook.com",
    "office.com", "apple.com", "icloud.com", "amazon.com", "paypal.com", "netflix.com", "ebay.com",
    "yahoo.com", "wikipedia.org", "reddit.com", "tiktok.com", "dropbox.com", "adobe.com", "github.com",
    "chase.com", "bankofamerica.com", "wellsfargo.com", "citibank.com", "americanexpress.com",
    "visa.com", "mastercard.com", "coinbase.com", "binance.com", "blockchain.com", "steampowered.com",
    "steamcommunity.com", "roblox.com", "spotify.com", "discord.com", "telegram.org", "zoom.us",
    "docusign.com", "dhl.com", "fedex.com", "ups.com", "usps.com", "walmart.com", "alibaba.com",
    "aliexpress.com", "booking.com", "airbnb.com", "irs.gov", "hsbc.com", "metamask.io",
)

# Public URL shorteners: the real destination is hidden, a classic spam trait.
SHORTENER_DOMAINS: frozenset[str] = frozenset({
    "bit.ly", "bitly.com", "tinyurl.com", "t.co", "goo.gl", "ow.ly", "is.gd", "buff.ly", "rebrand.ly",
    "cutt.ly", "shorturl.at", "tiny.cc", "bl.ink", "t.ly", "rb.gy", "s.id", "v.gd", "lnkd.in", "trib.al",
    "shorte.st", "adf.ly", "bc.vc", "soo.gd", "clck.ru", "qr.ae", "x.co", "po.st", "mcaf.ee", "su.pr",
    "tr.im", "db.tt", "youtu.be", "amzn.to", "fb.me", "dlvr.it", "ift.tt", "wp.me", "tiny.one", "cli.gs",
    "u.to", "short.io", "snip.ly", "linktr.ee", "t.me", "rotf.lol", "shorturl.com", "2u.pm", "zpr.io",
})

# Query parameters that only track the click; stripping them makes one link count as one URL.
TRACKING_PARAMS: frozenset[str] = frozenset({
    "fbclid", "gclid", "dclid", "gclsrc", "msclkid", "mc_cid", "mc_eid", "igshid", "yclid", "_ga", "_gl",
    "ref_src", "twclid", "ttclid", "li_fat_id", "wickedid", "oly_anon_id", "oly_enc_id", "vero_id",
    "_hsenc", "_hsmi", "mkt_tok",
})
TRACKING_PREFIXES: tuple[str, ...] = ("utm_",)
