"""The traffic simulation: deterministic, schema-valid, truth kept out of payloads, actors behave as designed."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import pytest
from modpipe.features.brands import brand_match
from modpipe.features.events import parse_ts
from modpipe.features.journey import journey_features
from modpipe.features.lists import SHORTENER_DOMAINS
from modpipe.features.url import parse_url
from modpipe.simulation.simulator import KIND_TOPICS, SCENARIOS, Simulation, simulate, split_texts

from modpipe import schema

# Labelled texts shaped like heldout.jsonl (label 1/0, as the build writes; "spam"/"ham" also accepted).
SPAM = [f"WINNER!! You have won a {i}000 prize. Call 0906{i:04d} now to claim, T&C apply" for i in range(12)]
HAM = [f"hey, are we still on for lunch on day {i}? I can bring the {w}" for i, w in
       enumerate(["salad", "bread", "cake", "drinks", "chips", "fruit", "cheese", "wine"] * 3)]
TEXTS = ([{"text": t, "label": 1, "dataset": "sms"} for t in SPAM]
         + [{"text": t, "label": "ham", "dataset": "spamassassin"} for t in HAM])

DECODERS = {"post": schema.decode_post, "report": schema.decode_report, "engagement": schema.decode_engagement,
            "label": schema.decode_label, "ban": schema.decode_ban}


@pytest.fixture(scope="module")
def mixed():
    return simulate(TEXTS, 3000, "mixed", seed=11)


def posts_of(events):
    return [e for e in events if e.kind == "post"]


def test_same_seed_same_events_other_seed_differs():
    a = simulate(TEXTS, 400, "mixed", seed=5)
    b = simulate(TEXTS, 400, "mixed", seed=5)
    c = simulate(TEXTS, 400, "mixed", seed=6)
    assert [(e.kind, e.payload, e.truth, e.at_ms, e.key) for e in a] == \
        [(e.kind, e.payload, e.truth, e.at_ms, e.key) for e in b]
    assert [e.payload for e in a] != [e.payload for e in c]


def test_every_payload_decodes_and_events_are_time_ordered(mixed):
    kinds = Counter(e.kind for e in mixed)
    assert set(kinds) == set(KIND_TOPICS), kinds  # every side stream shows up in a 3000-post run
    for e in mixed:
        decoded = DECODERS[e.kind](schema.dumps(e.payload))
        assert parse_ts(decoded["created_at"]) == e.at_ms
    offsets = [e.offset_s for e in mixed]
    assert offsets == sorted(offsets)


def test_ground_truth_never_in_payload(mixed):
    truth_keys = {"is_spam", "actor", "campaign", "scenario", "stealth", "text_label", "label_correct"}
    for e in mixed:
        assert not truth_keys & set(e.payload), e.payload
        blob = schema.dumps(e.payload).decode()
        assert "spammer" not in blob and "is_spam" not in blob
        if e.truth.get("campaign"):
            assert e.truth["campaign"] not in blob  # not even inside an id
    assert all(e.truth["scenario"] == "mixed" for e in mixed)


def test_keys_follow_the_pipeline_partitioning(mixed):
    for e in mixed:
        expected = {"post": e.payload.get("user_id"), "report": e.payload.get("post_id"),
                    "engagement": e.payload.get("post_id"), "label": e.payload.get("post_id"),
                    "ban": e.payload.get("value")}[e.kind]
        assert e.key == expected


def test_side_events_follow_their_post(mixed):
    posted = {}
    for e in mixed:
        if e.kind == "post":
            posted[e.payload["post_id"]] = e.at_ms
        elif e.kind in ("report", "engagement", "label"):
            assert e.payload["post_id"] in posted and e.at_ms >= posted[e.payload["post_id"]]


def test_spammers_are_young_fast_and_friendless(mixed):
    by_actor = defaultdict(list)
    for e in posts_of(mixed):
        by_actor[e.truth["actor"]].append(e)
    legit, spam = by_actor["legit"], by_actor["spammer"]
    assert 0.08 < len(spam) / (len(spam) + len(legit)) < 0.25

    def age_days(e):
        return (e.at_ms - parse_ts(e.payload["user"]["created_at"])) / 86_400_000

    def journey_ms(e):
        return sum(s["ms"] for s in e.payload["journey"])

    assert statistics.median(map(age_days, spam)) < 3 < 100 < statistics.median(map(age_days, legit))
    assert statistics.median(map(journey_ms, spam)) < 200 < 2000 < statistics.median(map(journey_ms, legit))
    assert statistics.median(e.payload["user"]["friends"] for e in spam) <= 3
    assert statistics.median(e.payload["user"]["friends"] for e in legit) > 10
    assert not any(e.payload["user"]["verified"] for e in spam)

    def no_typing(e):
        f = journey_features(e.payload["journey"], len(e.payload["text"]))
        return f["journey_submit_without_typing"] or f["journey_total_ms"] < 300
    assert sum(map(no_typing, spam)) / len(spam) > 0.8
    assert sum(map(no_typing, legit)) / len(legit) < 0.05
    # humans type at human speed (a pasted text touched up afterwards has no meaningful typing speed)
    typed = [journey_features(e.payload["journey"], len(e.payload["text"])) for e in legit]
    assert max(f["journey_typing_cps"] for f in typed if not f["journey_paste"]) <= 20


def test_zipf_activity_and_heavy_tailed_followers(mixed):
    legit = [e for e in posts_of(mixed) if e.truth["actor"] == "legit"]
    per_user = Counter(e.payload["user_id"] for e in legit)
    top = sum(n for _, n in per_user.most_common(len(per_user) // 10))
    assert top / len(legit) > 0.3  # the most active 10% of posters write far more than 10%
    followers = sorted({e.payload["user_id"]: e.payload["user"]["followers"] for e in legit}.values())
    assert followers[-1] > 20 * statistics.median(followers)


def test_campaigns_share_domains_subnets_and_use_lookalikes_and_shorteners(mixed):
    spam = [e for e in posts_of(mixed) if e.truth["actor"] == "spammer"]
    by_campaign = defaultdict(list)
    for e in spam:
        by_campaign[e.truth["campaign"]].append(e)
    assert len(by_campaign) == 3
    lookalike = shortener = 0
    for posts in by_campaign.values():
        subnets = {e.payload["ip"].rsplit(".", 1)[0] for e in posts}
        assert len(subnets) == 1  # one /24 per campaign
        accounts_by_domain = defaultdict(set)
        for e in posts:
            if e.payload["url"]:
                info = parse_url(e.payload["url"])
                accounts_by_domain[info.host].add(e.payload["user_id"])
                shortener += info.domain in SHORTENER_DOMAINS
                lookalike += brand_match(info).lookalike
        assert max(len(a) for a in accounts_by_domain.values()) >= 5  # one domain, many accounts
        assert len(accounts_by_domain) <= 8
        # burst posting: consecutive campaign posts often come from the same account
        same = sum(a.payload["user_id"] == b.payload["user_id"] for a, b in zip(posts, posts[1:], strict=False))
        assert same / len(posts) > 0.4
    assert lookalike > 0 and shortener > 0


def test_stealth_campaign_posts_ham_texts_and_mixed_has_one():
    events = simulate(TEXTS, 800, "stealth_campaign", seed=2)
    spam = [e for e in posts_of(events) if e.truth["is_spam"]]
    assert spam and all(e.payload["text"].split(" !!")[0] in set(HAM) or e.truth["text_label"] == "ham"
                        for e in spam)
    assert all(e.truth["text_label"] == "ham" and e.truth["stealth"] for e in spam)
    sim = Simulation(TEXTS, "mixed", seed=1)
    assert sum(c.stealth for c in sim.campaigns) == 1


def test_legit_links_are_realistic(mixed):
    legit = [e for e in posts_of(mixed) if e.truth["actor"] == "legit"]
    urls = [e.payload["url"] for e in legit if e.payload["url"]]
    assert 0.15 < len(urls) / len(legit) < 0.35
    infos = [parse_url(u) for u in urls]
    assert all(i.valid for i in infos)
    assert not any(brand_match(i).lookalike for i in infos)
    assert 0 < sum(i.domain in SHORTENER_DOMAINS for i in infos) / len(infos) < 0.2


def test_ham_only_has_no_spam_and_side_streams_target_spam():
    events = simulate(TEXTS, 1000, "ham_only", seed=3)
    assert not any(e.truth["is_spam"] for e in events)
    assert not any(e.kind == "ban" for e in events)
    mixed = simulate(TEXTS, 2000, "mixed", seed=3)
    reports = [e for e in mixed if e.kind == "report"]
    spam_posts = sum(e.truth["is_spam"] for e in posts_of(mixed))
    assert sum(e.truth["is_spam"] for e in reports) / max(1, spam_posts) > 0.2
    assert sum(not e.truth["is_spam"] for e in reports) < 0.05 * (2000 - spam_posts)
    for ban in (e for e in mixed if e.kind == "ban"):
        assert ban.payload["kind"] == "domain" and ban.payload["value"] not in SHORTENER_DOMAINS


def test_campaign_burst_concentrates_spam_in_windows():
    sc = SCENARIOS["campaign_burst"]
    events = simulate(TEXTS, 4000, "campaign_burst", seed=4, rate=50)  # 80 s: four bursts
    inside = [e for e in posts_of(events) if sc.spam_share_at(e.offset_s) == sc.burst_spam_share]
    outside = [e for e in posts_of(events) if sc.spam_share_at(e.offset_s) != sc.burst_spam_share]
    share_in = sum(e.truth["is_spam"] for e in inside) / len(inside)
    share_out = sum(e.truth["is_spam"] for e in outside) / len(outside)
    assert share_in > 0.45 and share_out < 0.08


def test_unknown_scenario_and_label_forms():
    with pytest.raises(ValueError):
        Simulation(TEXTS, "nope")
    spam, ham = split_texts([{"text": "a", "label": "spam"}, {"text": "b", "label": 0}, {"text": "", "label": 1}])
    assert [r["text"] for r in spam] == ["a"] and [r["text"] for r in ham] == ["b"]


def spam_and_legit_posts(scenario: str, seed: int) -> tuple[list, list]:
    """The scenario's posts split by truth; spam is 8-25% of them in every campaign scenario."""
    posts = posts_of(simulate(TEXTS, 3000, scenario, seed=seed))
    spam = [e for e in posts if e.truth["is_spam"]]
    assert 0.08 < len(spam) / len(posts) < 0.25
    return spam, [e for e in posts if not e.truth["is_spam"]]


def age_days(e) -> float:
    return (parse_ts(e.payload["created_at"]) - parse_ts(e.payload["user"]["created_at"])) / 86_400_000


def test_hijacked_accounts_look_legitimate_but_post_campaign_links():
    spam, legit = spam_and_legit_posts("hijacked_accounts", seed=4)

    # aged accounts with friends: the profile no longer gives the spammer away ...
    assert statistics.median(age_days(e) for e in spam) > 30
    assert statistics.median(e.payload["user"]["friends"] for e in spam) > 5
    # ... and their owners keep posting legitimately under the same ids
    assert {e.payload["user_id"] for e in spam} & {e.payload["user_id"] for e in legit}
    # the campaign's behaviour still shows: scripted journeys and campaign links
    assert statistics.median(len(e.payload["journey"]) for e in spam) <= 2
    assert sum(e.payload["url"] is not None for e in spam) / len(spam) > 0.5


def test_human_spammers_behave_like_people_and_post_spam_texts():
    from modpipe.features.journey import journey_features

    spam, legit = spam_and_legit_posts("human_spammers", seed=5)

    def min_step(e):
        return journey_features(e.payload["journey"], len(e.payload["text"]))["journey_min_step_ms"]

    # the journey no longer separates them: people at the UI, as slow as the legitimate users ...
    assert statistics.median(min_step(e) for e in spam) > 100
    assert statistics.median(min_step(e) for e in spam) > 0.3 * statistics.median(min_step(e) for e in legit)
    # ... on aged accounts with friends, from home addresses outside any campaign subnet
    assert min(age_days(e) for e in spam) >= 29
    assert statistics.median(e.payload["user"]["friends"] for e in spam) >= 10
    # what still gives them away is what they post: spam texts, campaign links
    assert all(e.truth["text_label"] == "spam" for e in spam)
    assert sum(e.payload["url"] is not None for e in spam) / len(spam) > 0.5


def test_obfuscated_campaign_disguises_one_campaigns_texts_deterministically():
    from modpipe.features.obfuscation import obfuscation_features

    events = simulate(TEXTS, 3000, "obfuscated_campaign", seed=7)
    again = simulate(TEXTS, 3000, "obfuscated_campaign", seed=7)
    assert [(e.kind, e.payload, e.truth) for e in events] == [(e.kind, e.payload, e.truth) for e in again]
    assert all(e.truth["scenario"] == "obfuscated_campaign" for e in events)
    for e in events:  # disguised texts still decode (length limit included)
        DECODERS[e.kind](schema.dumps(e.payload))
    sim = Simulation(TEXTS, "obfuscated_campaign", seed=7)
    assert [c.obfuscates for c in sim.campaigns] == [True, False, False] and sim.campaigns[-1].stealth

    spam = [e for e in posts_of(events) if e.truth["is_spam"]]
    assert 0.08 < len(spam) / len(posts_of(events)) < 0.25
    by_campaign = defaultdict(list)
    for e in spam:
        by_campaign[e.truth["campaign"]].append(e)
    assert len(by_campaign) == 3
    originals = set(SPAM) | set(HAM)

    def original(text: str) -> bool:  # as posted, or with the template suffix (" !!abcd")
        return text in originals or text.rsplit(" ", 1)[0] in originals

    def looks_obfuscated(text: str) -> bool:
        return any(obfuscation_features(text).values())

    disguised = [e for e in spam if e.truth["obfuscated"]]
    assert {e.truth["campaign"] for e in disguised} == {sim.campaigns[0].campaign_id}
    assert len(disguised) == len(by_campaign[sim.campaigns[0].campaign_id]) > 50
    texts = [e.payload["text"] for e in disguised]
    assert sum(not original(t) for t in texts) / len(texts) > 0.8  # synonym-only may miss a text's words
    assert sum(looks_obfuscated(t) for t in texts) / len(texts) > 0.5  # punctuation/synonyms are not measured
    assert len(set(texts)) > 0.9 * len(texts)  # a fresh disguise per post
    # the other campaigns post their texts unchanged, and look clean (leetspeak aside: "WINNER!!" and the
    # template's random codes such as "aB3x" read as leet)
    for c in sim.campaigns[1:]:
        assert all(original(e.payload["text"]) and not e.truth["obfuscated"] for e in by_campaign[c.campaign_id])
        assert not any(obfuscation_features(e.payload["text"])[n] for e in by_campaign[c.campaign_id]
                       for n in ("text_lookalike_share", "text_invisible_share", "text_spaced_share"))
    # a few legitimate posts look odd too (~2%): odd-looking is a hint, not proof
    legit = [e for e in posts_of(events) if not e.truth["is_spam"]]
    odd = [e for e in legit if e.truth["obfuscated"]]
    assert 0.005 < len(odd) / len(legit) < 0.04
    assert all(original(e.payload["text"]) for e in legit if not e.truth["obfuscated"])


def test_obfuscation_leaves_the_other_scenarios_alone():
    for name in ("mixed", "stealth_campaign", "human_spammers"):
        posts = posts_of(simulate(TEXTS, 800, name, seed=1))
        assert not any(e.truth["obfuscated"] for e in posts)
        assert all(e.payload["text"].rsplit(" ", 1)[0] in set(SPAM) | set(HAM) or e.payload["text"] in set(SPAM)
                   | set(HAM) for e in posts)


def _age_days(event) -> float:
    return (event.at_ms - parse_ts(event.payload["user"]["created_at"])) / 86_400_000


def test_human_lures_are_link_less_one_post_per_ordinary_account():
    events = simulate(TEXTS, 3000, "human_lures", seed=3)
    posts = posts_of(events)
    lures = [e for e in posts if e.truth["lure"]]
    legit = [e for e in posts if not e.truth["is_spam"]]
    assert {e.truth["lure"] for e in lures} == {"aged", "new"}
    assert 0.08 < len(lures) / len(posts) < 0.16
    assert all(e.truth["is_spam"] and e.truth["text_label"] == "spam" for e in lures)
    assert all(e.payload["url"] is None for e in lures)
    # once per account, each from its own address
    assert len({e.payload["user_id"] for e in lures}) == len(lures) == len({e.payload["ip"] for e in lures})
    for e in lures:
        j = journey_features(e.payload["journey"], len(e.payload["text"]))
        assert j["journey_submit_without_typing"] is False and j["journey_min_step_ms"] >= 120
        age, user = _age_days(e), e.payload["user"]
        if e.truth["lure"] == "aged":
            assert 30 <= age <= 400 and 10 <= user["friends"] <= 300
        else:
            assert 0.04 <= age <= 2 and user["friends"] <= 15
    # every held-out spam text is used before any is used again
    texts = [e.payload["text"] for e in lures]
    assert len(set(texts[:len(SPAM)])) == len(SPAM)
    # legitimate users of the same kinds post beside them
    ordinary = [e for e in legit if _age_days(e) <= 400 and e.payload["user"]["friends"] <= 300]
    assert len(ordinary) / len(legit) > 0.25


def test_taken_over_lures_post_from_an_address_the_account_never_used():
    events = simulate(TEXTS, 3000, "taken_over_lures", seed=4)
    posts = posts_of(events)
    lures = [e for e in posts if e.truth["lure"]]
    assert lures and {e.truth["lure"] for e in lures} == {"taken_over"}
    owner_ips = defaultdict(set)
    for e in posts:
        if not e.truth["is_spam"]:
            owner_ips[e.payload["user_id"]].add(e.payload["ip"])
    victims = [e for e in lures if e.payload["user_id"] in owner_ips]
    assert len(victims) > len(lures) // 4  # the owners of many of them post too
    assert all(e.payload["ip"] not in owner_ips[e.payload["user_id"]] for e in victims)
    assert all(e.payload["url"] is None for e in lures)
    assert statistics.median(_age_days(e) for e in lures) > 100  # aged accounts


def test_lure_scenarios_need_spam_texts_and_existing_scenarios_have_no_lures():
    with pytest.raises(ValueError, match="no spam texts"):
        simulate([t for t in TEXTS if t["label"] == "ham"], 10, "human_lures")
    assert not any(e.truth.get("lure") for e in posts_of(simulate(TEXTS, 1500, "mixed", seed=2)))


def test_platform_lures_post_only_texts_of_todays_platforms_half_with_a_link():
    from modpipe.simulation.simulator import can_run

    from modpipe.textmodel.platforms import BY_REGISTER

    assert set(SCENARIOS["platform_lures"].datasets) == set(BY_REGISTER)
    platform = ([{"text": f"{t} (via a reel)", "label": 1, "dataset": "instagram"} for t in SPAM]
                + [{"text": f"{t} lol", "label": 0, "dataset": "tweeteval"} for t in HAM])
    events = simulate(TEXTS + platform, 3000, "platform_lures", seed=5)
    posts = posts_of(events)
    assert {e.truth["dataset"] for e in posts} == {"instagram", "tweeteval"}  # the older corpora's texts never
    lures = [e for e in posts if e.truth["lure"]]
    assert {e.truth["lure"] for e in lures} == {"aged", "new"} and 0.08 < len(lures) / len(posts) < 0.16
    assert 0.35 < sum(e.payload["url"] is not None for e in lures) / len(lures) < 0.65
    legit = [e for e in posts if not e.truth["is_spam"]]
    assert sum(_age_days(e) <= 2 for e in legit) / len(legit) > 0.1  # ordinary posts from new accounts too
    # a text build without the platforms (`model build --no-platforms`) cannot feed it: said, not half-run
    assert can_run("platform_lures", TEXTS + platform) and not can_run("platform_lures", TEXTS)
    assert can_run("human_lures", TEXTS)
    with pytest.raises(ValueError, match="no ham texts of the data sets"):
        simulate(TEXTS, 10, "platform_lures")


def test_link_lures_carry_a_link_whose_domain_alone_says_little():
    posts = posts_of(simulate(TEXTS, 3000, "link_lures", seed=5))
    lures = [e for e in posts if e.truth["lure"]]
    legit = [e for e in posts if not e.truth["is_spam"]]
    assert 0.08 < len(lures) / len(posts) < 0.16 and {e.truth["lure"] for e in lures} == {"aged", "new"}
    assert all(e.truth["lure_link"] and e.payload["url"] for e in lures)
    assert not any(e.truth["lure_link"] for e in legit)
    assert len({e.payload["user_id"] for e in lures}) == len(lures)  # once per account, as human_lures
    hosts = Counter(parse_url(e.payload["url"]).domain for e in lures)
    messaging = {"wa.me", "t.me", "m.me", "instagram.com"}
    shortened = sum(n for h, n in hosts.items() if h in SHORTENER_DOMAINS)
    throwaway = {h: n for h, n in hosts.items() if h not in messaging and h not in SHORTENER_DOMAINS}
    assert sum(hosts[h] for h in messaging) > len(lures) / 4 and shortened > len(lures) / 10
    assert max(throwaway.values()) <= 3  # a throwaway domain is (nearly) never seen twice
    # a messaging link's domain is old and clean: its reputation does not give the lure away
    clean = [e["url_reputation"] for e in (x.payload for x in lures)
             if "url_reputation" in e and parse_url(e["url"]).domain in messaging]
    assert clean and all(r["wot_score"] >= 70 for r in clean)
    # people share contact links too
    assert any(parse_url(e.payload["url"]).domain in messaging for e in legit if e.payload["url"])


def test_businesses_post_commerce_through_a_scheduling_tool():
    sim = Simulation(TEXTS, "business_commerce", seed=6)
    posts = posts_of(list(sim.events(i / 50 for i in range(3000))))
    business = [e for e in posts if e.truth["business"]]
    assert 0.18 < len(business) / len(posts) < 0.32
    assert all(not e.truth["is_spam"] and e.truth["actor"] == "legit" and not e.truth["lure"] for e in business)
    shops = {a.user_id: a.shop for a in sim.businesses}
    assert len(set(shops.values())) > 20 and {e.payload["user_id"] for e in business} <= set(shops)
    for e in business:  # each links to its own shop only, with tracking parameters; its e-mail is at the shop
        assert e.payload["user"]["email_domain"] == shops[e.payload["user_id"]]
        if e.payload["url"]:
            assert parse_url(e.payload["url"]).domain.endswith(shops[e.payload["user_id"]])
            assert "utm_source=" in e.payload["url"]
    api = [e for e in business if not e.payload["journey"]]
    assert 0.45 < len(api) / len(business) < 0.75
    # the tool's few addresses post for many businesses, as a campaign's subnet posts for many accounts
    assert len({e.payload["ip"] for e in api}) <= 4
    assert len({e.payload["user_id"] for e in api}) > 20
    assert statistics.median(_age_days(e) for e in business) > 365
    lures = [e for e in posts if e.truth["lure"]]
    assert 0.02 < len(lures) / len(posts) < 0.08 and 0.3 < sum(e.truth["lure_link"] for e in lures) / len(lures) < 0.7


def test_new_scenarios_leave_the_others_alone():
    """The businesses and link lures draw from the rng only in their own scenarios: the other scenarios' traffic,
    and so every number measured on it before, stays what it was (no new truth keys either)."""
    for scenario in ("mixed", "human_lures", "ham_only"):
        posts = posts_of(simulate(TEXTS, 600, scenario, seed=8))
        assert not any("business" in e.truth or "lure_link" in e.truth for e in posts)
        assert Simulation(TEXTS, scenario, seed=8).businesses == []
