"""A seeded, deterministic simulation of social-platform traffic (pure: no Kafka, no clock, no I/O).

`Simulation(texts, scenario, seed).events(arrivals)` turns post arrival offsets (seconds, from the rate
control in `modpipe.loadgen.traffic`) into time-ordered `Event`s: posts plus the side streams they cause
(reports, shares/comments, moderator labels, domain bans). Every payload has the shape that the
`modpipe.schema` decoders accept; the ground truth of each event is a separate dict that the producer
puts ONLY in the `modpipe-truth` Kafka header, never in the payload.

Actors:
- legitimate users: Zipf-distributed activity over a fixed population, old accounts (a few are new),
  heavy-tailed friends/followers, ~1% verified, home ISP addresses or a shared mobile-carrier pool,
  human UI journeys (typing time proportional to text length, pastes, previews), ham texts from the
  held-out split, sometimes a link to a realistic site (news, video, shops, blogs; now and then a
  shortener).
- spammer accounts, grouped in campaigns: accounts hours-to-days old with almost no friends, posting in
  bursts from the campaign's /24, scripted journeys (paste+submit in ms, a bare submit, or none: API),
  links to a few campaign domains reused by every account (lookalikes of brands, throwaway domains,
  shortener links). A campaign's texts are held-out SPAM texts, or, for a stealth campaign, held-out
  HAM texts so that only behaviour gives it away.

Side streams (delays are platform delays compressed into seconds so that a load test of a minute sees
them; `delay_scale` stretches them): users report spam (and, rarely, ham); posts are shared and
commented on (campaign posts by sibling accounts, fast); moderators label reported posts and a random
sample, with a small error rate; a campaign domain seen often enough is sometimes banned.

Scenarios (`SCENARIOS`):
- `mixed` (default): ~15% of posts from 3 concurrent campaigns, one of them stealth (ham text).
- `ham_only`: legitimate users only; measures false positives.
- `campaign_burst`: ~3% background spam; every 20 s a campaign bursts to ~60% of traffic for 5 s.
- `stealth_campaign`: ~20% spam, every campaign posts held-out HAM texts: only behaviour, links and
  the side streams give it away.
- `hijacked_accounts`: like `mixed`, but every campaign account is a taken-over aged account with real
  friends and followers (its owner keeps posting too): account age and profile no longer separate spam.
- `human_spammers`: ~15% spam from campaigns run by people (a click farm) on aged accounts with friends,
  home ISP addresses and human UI journeys: behaviour no longer separates spam; the text and the links
  still do. Without it the simulated spammers were all bots, and a decision model trained on them
  learned to read the journey and ignore the text model.
- `human_lures`: ~12% spam posted by people, once per account, from accounts that look ordinary: half
  aged (30-400 days, 10-300 friends), half brand-new (hours to 2 days, 0-15 friends); human journeys, a
  fresh residential address each, no link: lures to phone numbers, handles and messaging apps (held-out
  SPAM texts). A third of the legitimate users have the same two kinds of accounts, so the profile,
  journey and link say nothing: only the text does.
- `taken_over_lures`: ~10% spam posted by people through taken-over aged accounts (the owner keeps
  posting), a post each, human journeys, no link, from an address the account never used.
- `obfuscated_campaign`: like `mixed`, but the first spam-text campaign disguises every text it posts
  (`modpipe.textmodel.attacks.variant` with the simulation's rng: look-alike letters, invisible
  characters, spaced-out letters, leetspeak, synonyms or inserted punctuation, one form or two, at a
  random rate), as spammers do to slip past a text filter. A few legitimate posts (2%) go through the
  same rewriting (fancy fonts, letter-spaced emphasis, gamer leetspeak), so an odd-looking text is a
  hint, not proof. The truth header says which posts were rewritten (`obfuscated`).
- `link_lures`: `human_lures` with a link in every lure, as today's scams post them: a messaging app's
  contact link (wa.me, t.me: an old, clean domain that says nothing), a throwaway domain used once, or a
  shortener. A third of the legitimate users have the same kinds of accounts, and a few of them share
  messaging links too: neither the profile, the journey nor the link's domain separates the lures.
- `platform_lures`: `human_lures` on today's platforms: the texts are only those of the platform registers
  (`modpipe.textmodel.platforms`: YouTube, Instagram and X scams, smishing of 2022 and, evaluated only, phishing
  e-mail; ordinary tweets, review sentences, airline customers' tweets and the platforms' legitimate comments and
  posts), ~12% lures posted once each by people on aged or brand-new ordinary-looking accounts, half with a link;
  a third of the legitimate users have the same kinds of accounts, so ordinary posts come from new accounts too.
- `business_commerce`: ~25% of posts from 30 businesses (aged, followed, some verified, an e-mail at their
  own shop domain) promoting through a scheduling tool (API posts from the tool's few shared addresses,
  every business's links to its own shop domain, reposted many times, with tracking parameters), beside ~5%
  lures from ordinary-looking accounts, half with a link. Repetition, API journeys and shared addresses
  are what campaigns look like too: the engine must not flag legitimate commerce for them.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from modpipe.features.lists import BRAND_DOMAINS, SHORTENER_DOMAINS

from modpipe import schema
from modpipe.textmodel.attacks import variant
from modpipe.textmodel.platforms import BY_REGISTER as PLATFORM_REGISTERS

TRUTH_HEADER = "modpipe-truth"
KIND_TOPICS = {"post": "posts", "report": "reports", "engagement": "engagements", "label": "labels",
               "ban": "bans"}
DAY_MS = 86_400_000
MAX_TEXT_CHARS = 10_000  # the platform's limit (schema.decode_post): a disguised text longer than that is cut


class Event(NamedTuple):
    kind: str  # post | report | engagement | label | ban
    payload: dict  # the message, in the modpipe.schema shape of its kind
    truth: dict  # ground truth; travels only in the TRUTH_HEADER header
    at_ms: int  # event time (epoch ms) = payload created_at
    offset_s: float  # seconds from the start of the simulation (when to produce it)
    key: str  # Kafka key: posts by user_id, reports/engagements/labels by post_id, bans by value

    @property
    def topic(self) -> str:
        """Logical topic name (pass through `settings.topic`)."""
        return KIND_TOPICS[self.kind]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    spam_share: float  # fraction of posts from spammers outside bursts
    campaigns: int  # concurrent campaigns
    stealth_share: float  # fraction of campaigns whose texts are ham
    burst_every_s: float = 0.0  # 0: no bursts
    burst_len_s: float = 0.0
    burst_spam_share: float = 0.0
    hijacked_share: float = 0.0  # fraction of campaign accounts that are taken-over aged legitimate accounts
    human_share: float = 0.0  # fraction of campaign accounts operated by people (human journeys and profiles)
    obfuscating_campaigns: int = 0  # the first N spam-text campaigns rewrite every text (attacks.variant)
    legit_obfuscated_share: float = 0.0  # fraction of legitimate posts whose text is rewritten the same way
    lure_share: float = 0.0  # fraction of posts that are lures posted by people, once per account, no link
    lure_accounts: tuple[str, ...] = ()  # kinds of account they post from: aged | new | taken_over
    ordinary_legit_share: float = 0.0  # fraction of legitimate users with the aged/new lure-account profiles
    lure_link_share: float = 0.0  # fraction of lures that carry a link (messaging app, throwaway domain, shortener)
    business_share: float = 0.0  # fraction of posts by businesses promoting through a scheduling tool
    businesses: int = 0  # how many businesses post
    datasets: tuple[str, ...] = ()  # the texts are only those of these data sets (registers); () = every one

    def spam_share_at(self, t: float) -> float:
        if self.burst_every_s and (t % self.burst_every_s) >= self.burst_every_s - self.burst_len_s:
            return self.burst_spam_share
        return self.spam_share


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("mixed", "legitimate traffic with ~15% spam from 3 campaigns, one posting ham texts", 0.15, 3, 1 / 3),
    Scenario("ham_only", "legitimate users only (false-positive check)", 0.0, 0, 0.0),
    Scenario("campaign_burst", "~3% background spam; a campaign bursts to ~60% of posts for 5 s every 20 s",
             0.03, 2, 0.0, burst_every_s=20.0, burst_len_s=5.0, burst_spam_share=0.6),
    Scenario("stealth_campaign", "~20% spam whose texts are all held-out HAM: only behaviour gives it away",
             0.20, 3, 1.0),
    Scenario("hijacked_accounts", "~15% spam from 3 campaigns posting through taken-over aged accounts with real "
             "friends (one campaign with ham texts): the profile looks legitimate", 0.15, 3, 1 / 3,
             hijacked_share=1.0),
    Scenario("human_spammers", "~15% spam from 3 campaigns run by people on aged accounts with human journeys: "
             "only the text and the links give it away", 0.15, 3, 0.0, human_share=1.0),
    Scenario("obfuscated_campaign", "like mixed, but one spam-text campaign disguises its texts (look-alike "
             "letters, invisible characters, spacing, leetspeak, ...); 2% of legitimate posts look odd too",
             0.15, 3, 1 / 3, obfuscating_campaigns=1, legit_obfuscated_share=0.02),
    Scenario("human_lures", "~12% spam posted once each by people on ordinary-looking aged or brand-new accounts, "
             "human journeys, no link; a third of legitimate users have the same kinds of accounts", 0.0, 0, 0.0,
             lure_share=0.12, lure_accounts=("aged", "new"), ordinary_legit_share=1 / 3),
    Scenario("taken_over_lures", "~10% spam posted by people through taken-over aged accounts (the owner keeps "
             "posting), human journeys, no link, from an address the account never used", 0.0, 0, 0.0,
             lure_share=0.10, lure_accounts=("taken_over",)),
    Scenario("link_lures", "~12% spam posted once each by people on ordinary-looking aged or brand-new accounts, "
             "human journeys, each with a link (messaging app, throwaway domain or shortener); a third of "
             "legitimate users have the same kinds of accounts", 0.0, 0, 0.0,
             lure_share=0.12, lure_accounts=("aged", "new"), ordinary_legit_share=1 / 3, lure_link_share=1.0),
    Scenario("platform_lures", "~12% spam posted once each by people on ordinary-looking aged or brand-new "
             "accounts, half with a link, its texts today's platforms' scams; legitimate posts are today's "
             "ordinary posts, a third of them by the same kinds of accounts", 0.0, 0, 0.0,
             lure_share=0.12, lure_accounts=("aged", "new"), ordinary_legit_share=1 / 3, lure_link_share=0.5,
             datasets=tuple(sorted(PLATFORM_REGISTERS))),
    Scenario("business_commerce", "~25% of posts from 30 businesses promoting their shops through a scheduling "
             "tool (API posts from shared addresses, the same shop domain again and again); ~5% lures from "
             "ordinary-looking accounts, half with a link", 0.0, 0, 0.0,
             lure_share=0.05, lure_accounts=("aged", "new"), ordinary_legit_share=1 / 3, lure_link_share=0.5,
             business_share=0.25, businesses=30),
)}
LURE_ACCOUNTS = ("aged", "new", "taken_over")

# Realistic link targets of legitimate posts: (domain, kind).
LEGIT_SITES = (
    ("nytimes.com", "news"), ("bbc.co.uk", "news"), ("theguardian.com", "news"), ("reuters.com", "news"),
    ("apnews.com", "news"), ("cnn.com", "news"), ("lemonde.fr", "news"), ("spiegel.de", "news"),
    ("youtube.com", "video"), ("vimeo.com", "video"), ("twitch.tv", "video"), ("youtu.be", "video_short"),
    ("amazon.com", "shop"), ("etsy.com", "shop"), ("ebay.com", "shop"), ("ikea.com", "shop"),
    ("medium.com", "blog"), ("wordpress.com", "blog_sub"), ("blogspot.com", "blog_sub"),
    ("substack.com", "blog_sub"), ("github.com", "code"), ("en.wikipedia.org", "wiki"),
    ("stackoverflow.com", "code"), ("reddit.com", "forum"),
)
LEGIT_SHORTENERS = ("bit.ly", "tinyurl.com", "t.co", "amzn.to")
LEGIT_EMAIL = ("gmail.com", "gmail.com", "gmail.com", "yahoo.com", "outlook.com", "hotmail.com", "icloud.com",
               "proton.me", "aol.com", "gmx.de", "web.de", "orange.fr")
SPAM_EMAIL = ("mailinator.com", "yopmail.com", "guerrillamail.com", "10minutemail.com", "tempmail.dev",
              "gmail.com", "outlook.com", "mail.ru")
# /16s of residential ISPs and mobile carriers the legitimate users post from.
ISP_BLOCKS = ("73.{}.{}", "98.{}.{}", "24.{}.{}", "86.{}.{}", "81.{}.{}", "90.{}.{}", "2.{}.{}", "109.{}.{}")
MOBILE_BLOCKS = ("172.58.{}.{}", "100.64.{}.{}", "37.160.{}.{}")
SPAM_TLDS = ("xyz", "top", "click", "shop", "online", "site", "live", "info", "icu", "buzz")
SPAM_WORDS = ("secure", "login", "verify", "account", "bonus", "prize", "win", "deal", "free", "gift", "promo",
              "claim", "support", "update", "wallet", "reward", "offer", "cash", "crypto", "lucky")
# Hand-made lookalikes in the style the brand detector targets, beside generated ones.
LOOKALIKES = ("paypa1-secure.com", "micr.osoftr.com", "app1e-id-verify.com", "amaz0n-orders.net",
              "g00gle-security.com", "netf1ix-billing.com", "faceb00k-login.com", "coinbase-wallet.help",
              "rnetamask.io", "wel1sfargo-alert.com", "dhl-parcel-track.info", "steamcommunlty.com")
# Contact links of messaging apps: what a lure asks people to click, on domains years old and clean.
MESSAGING_LINKS = ("https://wa.me/{digits}", "https://t.me/{handle}", "https://m.me/{handle}",
                   "https://www.instagram.com/{handle}")
SHOP_WORDS = ("urban", "green", "little", "north", "maple", "studio", "craft", "home", "wild", "bright", "coast",
              "oak", "river", "harbor", "atlas", "nova", "pine", "sun", "blue", "golden")
SHOP_KINDS = ("store", "shop", "goods", "supply", "boutique", "market", "co", "design", "wear", "kitchen")
SHOP_TLDS = ("com", "com", "com", "co", "shop", "store", "co.uk", "de")
# Scheduling tools' addresses: many businesses post through the same few (a campaign's subnet looks alike).
SCHEDULER_SUBNETS = ("54.{}.{}", "34.{}.{}", "104.{}.{}")
_HOMOGLYPHS = {"o": "0", "l": "1", "i": "1", "e": "3", "a": "4", "s": "5", "m": "rn"}


def can_run(scenario: str, texts: Iterable[dict]) -> bool:
    """Whether `texts` hold what the scenario draws from: a scenario of named data sets (`platform_lures`) cannot
    run on a text build without them (`model build --no-platforms`) or on traffic of other data sets only."""
    wanted = SCENARIOS[scenario].datasets
    if not wanted:
        return True
    spam, ham = split_texts(row for row in texts if row.get("dataset") in wanted)
    return bool(ham) and (bool(spam) or not SCENARIOS[scenario].lure_share)


def _is_spam_label(label) -> bool:
    return label in (1, True, "spam", "1")


def split_texts(texts: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """Held-out rows ({'text', 'label', 'dataset'}; label spam/ham or 1/0) -> (spam, ham)."""
    spam, ham = [], []
    for row in texts:
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            continue
        (spam if _is_spam_label(row.get("label")) else ham).append(row)
    return spam, ham


@dataclass
class Account:
    user_id: str
    actor: str  # legit | spammer
    created_at_ms: int
    email_domain: str
    friends: int
    followers: int
    verified: bool
    home_ip: str
    campaign: str | None = None
    human: bool = False  # posts through the UI like a person (legitimate users, click-farm spammers)
    shop: str | None = None  # a business's own shop domain (scenario business_commerce)
    texts: list[dict] = field(default_factory=list)  # a business's promotions, reposted

    def public(self) -> dict:
        return {"created_at": schema.rfc3339(self.created_at_ms), "email_domain": self.email_domain,
                "friends": self.friends, "followers": self.followers, "verified": self.verified}


@dataclass
class Campaign:
    campaign_id: str
    stealth: bool  # texts are ham
    texts: list[dict]
    domains: list[str]  # campaign-owned domains (bannable)
    short_links: list[str]  # shortener URLs that point at the campaign
    subnet: str  # "a.b.c" of the campaign's /24
    accounts: list[Account] = field(default_factory=list)
    current: Account | None = None
    burst_left: int = 0
    posts_by_domain: dict[str, int] = field(default_factory=dict)
    banned: set[str] = field(default_factory=set)
    link_rate: float = 0.85
    obfuscates: bool = False  # every text goes through attacks.variant


class Simulation:
    """Deterministic for (texts, scenario, seed, start_ms, run_id, parameters)."""

    def __init__(self, texts: Iterable[dict], scenario: str = "mixed", seed: int = 0, *, start_ms: int = 1_700_000_000_000,
                 run_id: str = "sim", n_users: int = 5000, zipf_s: float = 1.1, delay_scale: float = 1.0,
                 accounts_per_campaign: int = 40):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose from {sorted(SCENARIOS)}")
        self.scenario = SCENARIOS[scenario]
        if self.scenario.datasets:
            texts = [row for row in texts if row.get("dataset") in self.scenario.datasets]
        self.spam_texts, self.ham_texts = split_texts(texts)
        if not self.ham_texts:
            among = f" of the data sets {list(self.scenario.datasets)}" if self.scenario.datasets else ""
            raise ValueError(f"no ham texts{among}: the simulation needs held-out texts with label ham/0")
        needs_spam = (self.scenario.campaigns and self.scenario.stealth_share < 1) or self.scenario.lure_share
        if needs_spam and not self.spam_texts:
            raise ValueError("no spam texts: this scenario needs held-out texts with label spam/1")
        unknown = set(self.scenario.lure_accounts) - set(LURE_ACCOUNTS)
        if unknown or bool(self.scenario.lure_share) != bool(self.scenario.lure_accounts):
            raise ValueError(f"scenario {scenario!r}: lure_accounts must name kinds from {LURE_ACCOUNTS} "
                             f"exactly when lure_share > 0 (unknown: {sorted(unknown)})")
        self.rng = random.Random(f"{seed}:{scenario}")
        self.start_ms = int(start_ms)
        self.run_id = run_id
        self.delay_scale = delay_scale
        self.accounts_per_campaign = accounts_per_campaign
        self._seq = 0
        self._post_seq = 0
        self._heap: list[tuple[float, int, Event]] = []
        self._used_ids: set[int] = set()
        self._lure_texts: list[dict] = []  # each held-out spam text is posted once before any is reused
        self._taken_over: set[str] = set()
        self.users = [self._legit_account() for _ in range(n_users)]
        weights = [1.0 / (rank ** zipf_s) for rank in range(1, n_users + 1)]
        self.rng.shuffle(weights)  # activity is not tied to the user index
        total, self._cum = 0.0, []
        for w in weights:
            total += w
            self._cum.append(total)
        self.campaigns = [self._campaign(i) for i in range(self.scenario.campaigns)]
        self._mobile_pool = [self.rng.choice(MOBILE_BLOCKS).format(self.rng.randrange(256), self.rng.randrange(1, 255))
                             for _ in range(200)]
        # drawn last, and only where a scenario has them: the other scenarios' traffic stays as it was
        self._scheduler_ips = [f"{self.rng.choice(SCHEDULER_SUBNETS).format(self.rng.randrange(256), self.rng.randrange(256))}"
                               f".{self.rng.randrange(2, 254)}" for _ in range(4)] if self.scenario.businesses else []
        self.businesses = [self._business_account() for _ in range(self.scenario.businesses)]

    # ------------------------------------------------------------------ population

    def _id(self, prefix: str, n: int) -> str:
        return f"{self.run_id}-{prefix}{n}"

    def _user_id(self) -> str:
        """Opaque account ids from one space for everyone: an id must not tell a spammer from a person."""
        while True:
            n = self.rng.randrange(10_000_000)
            if n not in self._used_ids:
                self._used_ids.add(n)
                return self._id("u", n)

    def _legit_account(self) -> Account:
        r = self.rng
        if self.scenario.ordinary_legit_share and r.random() < self.scenario.ordinary_legit_share:
            kind = "aged" if r.random() < 0.5 else "new"
            return self._ordinary_account("legit", kind, self.start_ms, None)
        if r.random() < 0.03:  # a few genuinely new users
            age_days = r.uniform(0.05, 7)
            friends, followers = int(r.paretovariate(1.5)) - 1, int(r.paretovariate(1.5)) - 1
        else:
            age_days = max(30.0, r.lognormvariate(math.log(900), 0.8))
            friends = min(5000, int(r.paretovariate(1.1) * 25) - 10)
            followers = min(2_000_000, int(r.paretovariate(0.9) * 30) - 15)
        followers, friends = max(0, followers), max(0, friends)
        verified = r.random() < (0.3 if followers > 50_000 else 0.005)
        home = self._home_ip()
        return Account(self._user_id(), "legit", self.start_ms - int(age_days * DAY_MS), r.choice(LEGIT_EMAIL),
                       friends, followers, verified, home, human=True)

    def _ordinary_account(self, actor: str, kind: str, at_ms: int, campaign: str | None) -> Account:
        """An account that looks like most people's: `aged` (30-400 days, 10-300 friends) or `new` (hours to
        2 days, 0-15 friends); ordinary e-mail, not verified, a person at the UI. Lure spammers and, in the
        lure scenarios, a share of legitimate users are drawn from the same distributions."""
        r = self.rng
        if kind == "aged":
            age_days, friends, followers = r.uniform(30, 400), r.randint(10, 300), r.randint(3, 300)
        else:
            age_days, friends, followers = r.uniform(0.05, 2.0), r.randint(0, 15), r.randint(0, 10)
        return Account(self._user_id(), actor, at_ms - int(age_days * DAY_MS), r.choice(LEGIT_EMAIL), friends,
                       followers, False, self._home_ip(), campaign, human=True)

    def _business_account(self) -> Account:
        """A business promoting its shop: aged (1-10 years), followed, now and then verified, an e-mail at its own
        shop domain, a handful of promotions (held-out HAM texts) it reposts."""
        r = self.rng
        shop = f"{r.choice(SHOP_WORDS)}{r.choice(SHOP_KINDS)}.{r.choice(SHOP_TLDS)}"
        followers = min(500_000, int(r.paretovariate(0.8) * 300))
        acct = Account(self._user_id(), "legit", self.start_ms - int(r.uniform(365, 3650) * DAY_MS), shop,
                       r.randint(20, 2000), followers, r.random() < 0.1, r.choice(self._scheduler_ips),
                       human=False, shop=shop)
        acct.texts = r.sample(self.ham_texts, min(len(self.ham_texts), r.randint(4, 12)))
        return acct

    def _business_url(self, acct: Account) -> str | None:
        r = self.rng
        if r.random() > 0.85:
            return None
        slug = "-".join(r.choice(_SLUG_WORDS) for _ in range(r.randint(2, 4)))
        path = r.choice((f"products/{slug}", f"collections/{slug}", f"sale/{slug}", f"p/{r.randrange(10**4, 10**6)}"))
        return f"https://www.{acct.shop}/{path}?utm_source=social&utm_medium={r.choice(('post', 'organic'))}" \
               f"&utm_campaign={r.choice(_SLUG_WORDS)}"

    def _lure_url(self) -> tuple[str, bool]:
        """(a lure's link, whether its domain is clean): a messaging app's contact link (an old clean domain), a
        throwaway domain used once, or a shortener."""
        r = self.rng
        x = r.random()
        if x < 0.4:
            handle = f"{r.choice(_SLUG_WORDS)}{r.choice(('_', '.', ''))}{r.choice(SPAM_WORDS)}{r.randrange(10, 999)}"
            link = r.choice(MESSAGING_LINKS).format(digits=f"{r.choice((1, 44, 61, 234, 971))}{r.randrange(10**8, 10**10)}",
                                                    handle=handle)
            return link, True
        if x < 0.75:
            domain = f"{r.choice(SPAM_WORDS)}{r.choice(_SLUG_WORDS)}{r.randrange(10, 99)}.{r.choice(SPAM_TLDS)}"
            return f"https://{domain}/{r.choice(('apply', 'join', 'start', 'invest', 'shop', 'verify'))}", False
        shorteners = sorted(SHORTENER_DOMAINS - {"youtu.be", "amzn.to", "lnkd.in", "db.tt", "wp.me", "fb.me"})
        return f"https://{r.choice(shorteners)}/{_code(r, 7)}", False

    def _home_ip(self) -> str:
        r = self.rng
        return f"{r.choice(ISP_BLOCKS).format(r.randrange(256), r.randrange(256))}.{r.randrange(1, 255)}"

    def _campaign(self, i: int) -> Campaign:
        r = self.rng
        # a deterministic mix: the last round(campaigns * stealth_share) campaigns post ham texts
        stealth = i >= self.scenario.campaigns - round(self.scenario.campaigns * self.scenario.stealth_share)
        pool = self.ham_texts if stealth or not self.spam_texts else self.spam_texts
        texts = r.sample(pool, min(len(pool), r.randint(3, 8)))
        domains = []
        lookalike = r.choice(LOOKALIKES) if r.random() < 0.5 else _generated_lookalike(r)
        domains.append(lookalike)
        for _ in range(r.randint(1, 2)):
            domains.append(f"{r.choice(SPAM_WORDS)}-{r.choice(SPAM_WORDS)}{r.randrange(10, 99)}.{r.choice(SPAM_TLDS)}")
        shorteners = sorted(SHORTENER_DOMAINS - {"youtu.be", "amzn.to", "lnkd.in", "db.tt", "wp.me", "fb.me"})
        short_links = [f"https://{r.choice(shorteners)}/{_code(r, 7)}" for _ in range(r.randint(2, 4))]
        subnet = f"{r.choice((45, 91, 103, 146, 176, 185, 193, 194))}.{r.randrange(256)}.{r.randrange(256)}"
        c = Campaign(f"{self.run_id}-c{i}", stealth, texts, domains, short_links, subnet)
        c.link_rate = 0.6 if stealth else 0.85
        c.obfuscates = not stealth and i < self.scenario.obfuscating_campaigns
        return c

    def _spam_account(self, c: Campaign, at_ms: int) -> Account:
        r = self.rng
        if self.scenario.hijacked_share and r.random() < self.scenario.hijacked_share:
            # A taken-over account: its age, friends and e-mail stay; the campaign posts from its own
            # addresses half the time. The owner's own (legitimate) posts carry on under the same id.
            victim = self._pick_legit()
            ip = f"{c.subnet}.{r.randrange(2, 254)}" if r.random() < 0.5 else victim.home_ip
            acct = Account(victim.user_id, "spammer", victim.created_at_ms, victim.email_domain, victim.friends,
                           victim.followers, victim.verified, ip, c.campaign_id)
            c.accounts.append(acct)
            return acct
        if self.scenario.human_share and r.random() < self.scenario.human_share:
            # A click-farm account: months to years old, some friends, a home ISP address, a person at the UI.
            home = self._home_ip()
            acct = Account(self._user_id(), "spammer", at_ms - int(r.uniform(30, 1500) * DAY_MS),
                           r.choice(LEGIT_EMAIL), r.randint(10, 400), r.randint(5, 300), False, home, c.campaign_id,
                           human=True)
            c.accounts.append(acct)
            return acct
        acct = Account(self._user_id(), "spammer", at_ms - int(r.uniform(0.01, 3.0) * DAY_MS),
                       r.choice(SPAM_EMAIL), r.choice((0, 0, 0, 1, 2, 3, 5)), r.choice((0, 0, 0, 1, 2)),
                       False, f"{c.subnet}.{r.randrange(2, 254)}", c.campaign_id)
        c.accounts.append(acct)
        return acct

    def _pick_legit(self) -> Account:
        x = self.rng.random() * self._cum[-1]
        return self.users[min(bisect.bisect_left(self._cum, x), len(self.users) - 1)]

    def _pick_spammer(self, c: Campaign, at_ms: int) -> Account:
        """Burst posting: an account posts a run of ~5 before the campaign moves on to another."""
        if c.current is None or c.burst_left <= 0:
            if len(c.accounts) < self.accounts_per_campaign and (not c.accounts or self.rng.random() < 0.7):
                c.current = self._spam_account(c, at_ms)
            else:
                c.current = self.rng.choice(c.accounts)
            c.burst_left = 1 + int(self.rng.expovariate(1 / 5))
        c.burst_left -= 1
        return c.current

    # ------------------------------------------------------------------ content

    def _legit_url(self) -> str | None:
        r = self.rng
        if r.random() > 0.25:
            return None
        if self.scenario.lure_link_share and r.random() < 0.1:  # people share contact links too
            return r.choice(MESSAGING_LINKS).format(digits=f"44{r.randrange(10**8, 10**10)}",
                                                    handle=f"{r.choice(_SLUG_WORDS)}{r.randrange(10, 999)}")
        if r.random() < 0.05:
            return f"https://{r.choice(LEGIT_SHORTENERS)}/{_code(r, 7)}"
        domain, kind = r.choice(LEGIT_SITES)
        slug = "-".join(r.choice(_SLUG_WORDS) for _ in range(r.randint(3, 7)))
        if kind == "news":
            return f"https://www.{domain}/{r.randint(2019, 2025)}/{r.randint(1, 12):02d}/{r.randint(1, 28):02d}/{slug}"
        if kind == "video":
            return f"https://www.{domain}/watch?v={_code(r, 11)}" if domain == "youtube.com" else \
                f"https://{domain}/{r.randrange(10**6, 10**9)}"
        if kind == "video_short":
            return f"https://{domain}/{_code(r, 11)}"
        if kind == "shop":
            return f"https://www.{domain}/dp/B0{_code(r, 8).upper()}?ref=share"
        if kind == "blog_sub":
            return f"https://{r.choice(_SLUG_WORDS)}{r.randrange(100)}.{domain}/p/{slug}"
        if kind == "blog":
            return f"https://{domain}/@{r.choice(_SLUG_WORDS)}/{slug}-{_code(r, 12)}"
        return f"https://{domain}/{slug}"

    def _spam_url(self, c: Campaign) -> str | None:
        r = self.rng
        if r.random() > c.link_rate:
            return None
        if r.random() < 0.3:
            return r.choice(c.short_links)
        live = [d for d in c.domains if d not in c.banned] or c.domains
        domain = r.choice(live)
        path = r.choice(("login", "verify", "claim", "account/update", "promo", "gift", "track", "signin"))
        return f"https://{domain}/{path}?id={_code(r, 10)}"

    def _human_journey(self, text: str) -> list[dict]:
        r = self.rng
        steps = [{"step": "open_composer", "ms": int(r.uniform(300, 4000))}]
        n = len(text)
        if n > 400 or r.random() < 0.1:  # long texts (and a few short ones) are pasted, then touched up
            steps.append({"step": "paste", "ms": int(r.uniform(200, 1500))})
            if r.random() < 0.5:
                steps.append({"step": "type", "ms": int(r.uniform(1500, 15000))})
        else:
            cps = min(12.0, max(1.5, r.lognormvariate(math.log(4.0), 0.35)))  # chars per second
            steps.append({"step": "type", "ms": int(1000 * n / cps) + int(r.uniform(0, 2000))})
        if r.random() < 0.2:
            steps.append({"step": "preview", "ms": int(r.uniform(500, 6000))})
        steps.append({"step": "submit", "ms": int(r.uniform(120, 900))})
        return steps

    def _bot_journey(self, text: str) -> list[dict]:
        r = self.rng
        x = r.random()
        if x < 0.45:
            return [{"step": "paste", "ms": int(r.uniform(2, 80))}, {"step": "submit", "ms": int(r.uniform(3, 60))}]
        if x < 0.7:
            return [{"step": "submit", "ms": int(r.uniform(1, 30))}]
        if x < 0.85:
            return []  # straight through the API
        if x < 0.95:  # scripted typing, far faster than a person
            return [{"step": "open_composer", "ms": int(r.uniform(10, 120))},
                    {"step": "type", "ms": max(1, int(len(text) / r.uniform(80, 400) * 1000))},
                    {"step": "submit", "ms": int(r.uniform(5, 80))}]
        return self._human_journey(text)  # a few mimic a person well

    def _disguise(self, text: str) -> str:
        """`text` through one or two random obfuscation forms at a random rate (attacks.variant)."""
        return variant(text, self.rng)[0][:MAX_TEXT_CHARS]

    def _campaign_text(self, c: Campaign) -> dict:
        row = self.rng.choice(c.texts)
        text = row["text"]
        if c.obfuscates:  # a fresh disguise per post: no two copies look alike to an exact-match filter
            text = self._disguise(text)
        if self.rng.random() < 0.4:  # template variation to dodge exact-duplicate filters
            text = f"{text} {self.rng.choice(('!!', '>>', '#', '*'))}{_code(self.rng, 4)}"
        return {**row, "text": text, "obfuscated": c.obfuscates}

    # ------------------------------------------------------------------ events

    def _push(self, offset_s: float, kind: str, payload: dict, truth: dict, key: str) -> None:
        at_ms = self.start_ms + int(round(offset_s * 1000))
        payload["created_at"] = schema.rfc3339(at_ms)
        self._seq += 1
        heapq.heappush(self._heap, (offset_s, self._seq, Event(kind, payload, truth, at_ms, offset_s, key)))

    def _delay(self, median_s: float, sigma: float = 0.8) -> float:
        return self.delay_scale * self.rng.lognormvariate(math.log(median_s), sigma)

    def _lure_text(self) -> dict:
        if not self._lure_texts:
            self._lure_texts = list(self.spam_texts)
            self.rng.shuffle(self._lure_texts)
        return self._lure_texts.pop()

    def _lure(self, at_ms: int) -> tuple[Account, str]:
        """(account, lure kind) for a lure post: a fresh ordinary-looking account, or a taken-over one posting
        from an address its owner never used (a residential address of its own)."""
        kind = self.rng.choice(self.scenario.lure_accounts)
        campaign = f"{self.run_id}-lures"
        if kind != "taken_over":
            return self._ordinary_account("spammer", kind, at_ms, campaign), kind
        # Active accounts are the ones taken over (phished while in use), each once.
        victim = next((v for v in (self._pick_legit() for _ in range(5)) if v.user_id not in self._taken_over),
                      None) or self.rng.choice(self.users)
        self._taken_over.add(victim.user_id)
        return Account(victim.user_id, "spammer", victim.created_at_ms, victim.email_domain, victim.friends,
                       victim.followers, victim.verified, self._home_ip(), campaign, human=True), kind

    def _post(self, t: float) -> None:
        r = self.rng
        at_ms = self.start_ms + int(round(t * 1000))
        lure = None
        spam = bool(self.campaigns) and r.random() < self.scenario.spam_share_at(t)
        lure_link = clean_link = business = False
        if not spam and self.scenario.lure_share and r.random() < self.scenario.lure_share:
            c = None
            acct, lure = self._lure(at_ms)
            spam, row, url = True, self._lure_text(), None
            journey, ip = self._human_journey(row["text"]), acct.home_ip
            if self.scenario.lure_link_share and r.random() < self.scenario.lure_link_share:
                url, clean_link = self._lure_url()
                lure_link = True
        elif not spam and self.scenario.business_share and r.random() < self.scenario.business_share:
            c, business = None, True
            acct = r.choice(self.businesses)
            row = r.choice(acct.texts)
            url = self._business_url(acct)
            if r.random() < 0.6:  # the scheduling tool posts through the API
                journey, ip = [], r.choice(self._scheduler_ips)
            else:  # someone at the business posts by hand
                journey, ip = self._human_journey(row["text"]), acct.home_ip if r.random() < 0.3 else self._home_ip()
        elif spam:
            c = self._pick_campaign(t)
            acct = self._pick_spammer(c, at_ms)
            row = self._campaign_text(c)
            url = self._spam_url(c)
            journey = self._human_journey(row["text"]) if acct.human else self._bot_journey(row["text"])
            ip = acct.home_ip if acct.human or r.random() < 0.9 else f"{c.subnet}.{r.randrange(2, 254)}"
        else:
            c = None
            acct = self._pick_legit()
            row = r.choice(self.ham_texts)
            if self.scenario.legit_obfuscated_share and r.random() < self.scenario.legit_obfuscated_share:
                row = {**row, "text": self._disguise(row["text"]), "obfuscated": True}
            url = self._legit_url()
            journey = self._human_journey(row["text"])
            ip = acct.home_ip if r.random() < 0.75 else r.choice(self._mobile_pool)
        self._post_seq += 1
        post_id = self._id("p", self._post_seq)
        post = {"schema_version": schema.SCHEMA_VERSION, "post_id": post_id, "user_id": acct.user_id,
                "created_at": "", "text": row["text"], "url": url, "ip": ip, "user": acct.public(),
                "journey": journey}
        if url and r.random() < 0.4:
            post["url_reputation"] = self._reputation(spam and not clean_link, url)
        truth = {"post_id": post_id, "is_spam": spam, "actor": acct.actor,
                 "campaign": c.campaign_id if c else acct.campaign, "stealth": bool(c and c.stealth), "lure": lure,
                 **({"lure_link": lure_link} if self.scenario.lure_link_share else {}),
                 **({"business": business} if self.scenario.business_share else {}),
                 "text_label": "spam" if _is_spam_label(row.get("label")) else "ham",
                 "obfuscated": bool(row.get("obfuscated")), "dataset": row.get("dataset"),
                 "scenario": self.scenario.name, "run_id": self.run_id}
        self._push(t, "post", post, truth, acct.user_id)
        self._side_events(t, post, truth, acct, c)

    def _pick_campaign(self, t: float) -> Campaign:
        if self.scenario.burst_every_s:  # the bursting campaign changes each burst window
            window = int(t // self.scenario.burst_every_s)
            if self.scenario.spam_share_at(t) == self.scenario.burst_spam_share:
                return self.campaigns[window % len(self.campaigns)]
        return self.rng.choice(self.campaigns)

    def _reputation(self, spam: bool, url: str) -> dict:
        r = self.rng
        if spam:
            return {"age_days": r.randint(0, 40), "wot_score": r.randint(0, 35), "google_risk": round(r.uniform(0.4, 1), 3)}
        return {"age_days": r.randint(800, 9000), "wot_score": r.randint(70, 100), "google_risk": round(r.uniform(0, 0.1), 3)}

    def _side_events(self, t: float, post: dict, truth: dict, author: Account, c: Campaign | None) -> None:
        r = self.rng
        post_id, url, spam = post["post_id"], post["url"], truth["is_spam"]
        ref = {k: truth[k] for k in ("post_id", "is_spam", "actor", "campaign", "scenario", "run_id")}
        # reports: most spam gets a few, ham rarely (spite, mistakes)
        n_reports = _geometric(r, 0.45) if r.random() < (0.35 if spam else 0.006) else 0
        first_report = None
        for _ in range(n_reports):
            dt = self._delay(8.0)
            first_report = dt if first_report is None else min(first_report, dt)
            reporter = self._pick_legit()
            reason = ("phishing" if url and r.random() < 0.4 else "spam") if spam else r.choice(
                ("spam", "harassment", "misinformation", "other"))
            self._seq += 1
            self._push(t + dt, "report", {
                "schema_version": schema.SCHEMA_VERSION, "report_id": self._id("r", self._seq), "post_id": post_id,
                "reporter_id": reporter.user_id, "reported_user_id": author.user_id, "url": url, "reason": reason,
                "created_at": ""}, {**ref, "event": "report"}, post_id)
        # engagements: campaign siblings amplify fast; legit reach grows with followers
        if c is not None:
            n_eng, pool, median = _poisson(r, 1.2), c.accounts, 1.5
        else:
            n_eng, pool, median = _poisson(r, min(4.0, 0.3 + author.followers / 2000)), None, 6.0
        for _ in range(n_eng):
            who = r.choice(pool) if pool else self._pick_legit()
            kind = "share" if r.random() < (0.8 if c else 0.4) else "comment"
            self._seq += 1
            self._push(t + self._delay(median), "engagement", {
                "schema_version": schema.SCHEMA_VERSION, "engagement_id": self._id("e", self._seq), "post_id": post_id,
                "url": url if kind == "share" else None, "kind": kind, "user_id": who.user_id, "created_at": ""},
                {**ref, "event": "engagement"}, post_id)
        # moderator labels: most reported posts, plus a 2% random audit; moderators err 3% of the time
        if (first_report is not None and r.random() < 0.7) or r.random() < 0.02:
            dt = (first_report or 0.0) + self._delay(15.0, 0.6)
            correct = r.random() >= 0.03
            label = "spam" if spam == correct else "ham"
            self._push(t + dt, "label", {
                "schema_version": schema.SCHEMA_VERSION, "post_id": post_id, "user_id": author.user_id,
                "label": label, "moderator_id": f"mod{r.randrange(25)}", "created_at": ""},
                {**ref, "event": "label", "label_correct": correct}, post_id)
        # bans: a campaign domain seen often enough is banned, once, with probability 0.5
        if c is not None and url:
            domain = _host(url)
            if domain in c.domains and domain not in c.banned:
                c.posts_by_domain[domain] = c.posts_by_domain.get(domain, 0) + 1
                if c.posts_by_domain[domain] == 10:
                    c.banned.add(domain)  # decided now (whether or not it happens): later posts move on
                    if r.random() < 0.5:
                        self._seq += 1
                        self._push(t + self._delay(20.0, 0.5), "ban", {
                            "schema_version": schema.SCHEMA_VERSION, "ban_id": self._id("b", self._seq),
                            "kind": "domain", "value": domain, "action": "ban", "created_at": ""},
                            {"event": "ban", "is_spam": True, "actor": "moderator", "campaign": c.campaign_id,
                             "domain": domain, "scenario": self.scenario.name, "run_id": self.run_id}, domain)

    def events(self, arrivals: Iterable[float], horizon_s: float | None = None) -> Iterator[Event]:
        """Time-ordered events for posts arriving at `arrivals` (non-decreasing seconds from the start).

        Side events later than the last arrival (or `horizon_s` when given) are dropped: the run is over."""
        last = 0.0
        for t in arrivals:
            while self._heap and self._heap[0][0] <= t:
                yield heapq.heappop(self._heap)[2]
            self._post(t)
            last = t
        end = last if horizon_s is None else horizon_s
        while self._heap and self._heap[0][0] <= end:
            yield heapq.heappop(self._heap)[2]
        self._heap.clear()


def simulate(texts: Iterable[dict], n_posts: int, scenario: str = "mixed", seed: int = 0, rate: float = 50.0,
             **kwargs) -> list[Event]:
    """Convenience: `n_posts` at a constant `rate`, all their side events up to the last post."""
    sim = Simulation(texts, scenario, seed, **kwargs)
    return list(sim.events(i / rate for i in range(n_posts)))


# ---------------------------------------------------------------------- helpers

_SLUG_WORDS = ("city", "council", "votes", "new", "park", "plan", "review", "best", "budget", "travel", "tips",
               "recipe", "easy", "weekend", "science", "study", "finds", "climate", "music", "festival", "guide",
               "how", "to", "fix", "garden", "update", "release", "notes", "local", "team", "wins", "final")


def _code(r: random.Random, n: int) -> str:
    return "".join(r.choice(string.ascii_letters + string.digits) for _ in range(n))


def _generated_lookalike(r: random.Random) -> str:
    brand = r.choice(BRAND_DOMAINS)
    core, _, suffix = brand.partition(".")
    chars = [c for c in core if c in _HOMOGLYPHS]
    if chars:
        c = r.choice(chars)
        core = core.replace(c, _HOMOGLYPHS[c], 1)
    else:
        core = core + core[-1]
    if r.random() < 0.5:
        core = f"{core}-{r.choice(SPAM_WORDS)}"
    return f"{core}.{r.choice((suffix, 'com', 'net', 'support', 'help'))}"


def _host(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0].lower()


def _geometric(r: random.Random, p_more: float) -> int:
    n = 1
    while r.random() < p_more and n < 50:
        n += 1
    return n


def _poisson(r: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, r.random()
    while p > limit and k < 100:
        k += 1
        p *= r.random()
    return k
