"""The review console in a real browser (Debian's Chromium, headless, through its WebDriver), following a
live pipeline on the real broker and Triton: signed out the page shows no queue; a moderator signs in with
their account, labels a post from the page with the keyboard, the label arrives on the `labels` topic with
their name, in the audit log and in the user's features; hostile post text stays text; signing out ends it."""

from __future__ import annotations

import os
import random
import shutil
import time

import orjson
import pytest
from confluent_kafka import Producer
from modpipe.console.audit import AuditLog
from modpipe.console.auth import Accounts
from modpipe.console.follower import Follower, LabelPublisher
from modpipe.console.index import DecisionIndex
from modpipe.console.server import ConsoleConfig, serve
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer

from modpipe import schema

pytestmark = pytest.mark.integration

PASSWORD = "a moderator's passphrase"
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> WIN a prize'


def chrome():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail("Chromium and its WebDriver are needed (Debian: apt-get install chromium chromium-driver; "
                    "`make setup` installs them)", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def wait_for(check, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def sign_in(browser, name: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    wait_for(lambda: browser.find_elements(By.ID, "login"), what="the sign-in form")
    for field, value in (("name", name), ("password", password)):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    browser.find_element(By.ID, "sign-in").click()


def test_moderator_signs_in_labels_a_post_in_the_browser_and_the_label_reaches_the_topic_and_the_features(
        local_stack, pipeline_settings, model_build, tmp_path):
    from selenium.webdriver.common.by import By

    # Every post to the review band: the text-only decider with review from 0 and block only at 1.
    stack = local_stack(workers=1, modpipe_decider="text-only", modpipe_review_threshold="0",
                        modpipe_block_threshold="1")
    rng = random.Random(5)
    texts = [t["text"] for t in model_build.heldout()[:4]] + [HOSTILE]
    posts = [make_post(rng, f"console-{i}", text, user_id="console-user") for i, text in enumerate(texts)]
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    for post in posts:
        producer.produce(stack.topics.posts, key=post["user_id"].encode(), value=schema.dumps(post))
    assert producer.flush(30) == 0

    index = DecisionIndex()
    follower = Follower(pipeline_settings, stack.bootstrap, index)
    follower.start()
    accounts = Accounts(tmp_path / "accounts.json")
    accounts.add("mod-7", PASSWORD, "moderator")
    audit = tmp_path / "audit.jsonl"
    server = serve(index, LabelPublisher(pipeline_settings, stack.bootstrap), config=ConsoleConfig(),
                   accounts=accounts, audit=AuditLog(audit))
    labels = end_consumer(pipeline_settings, stack.bootstrap, [stack.topics.labels])
    browser = chrome()
    try:
        wait_for(lambda: index.queue()["size"] == len(posts) and all(p["text"] for p in index.queue()["posts"]),
                 what="every post decided into the review queue")
        browser.get(server.url)  # signed out: the sign-in page, no queue
        wait_for(lambda: browser.current_url.endswith("/login"), what="the redirect to the sign-in page")
        assert not browser.find_elements(By.ID, "queue")
        sign_in(browser, "mod-7", "not the passphrase")
        wait_for(lambda: [e for e in browser.find_elements(By.ID, "login-error") if "wrong name or password" in e.text],
                 what="the sign-in error")
        assert not browser.find_elements(By.ID, "queue")
        sign_in(browser, "mod-7", PASSWORD)
        wait_for(lambda: [e for e in browser.find_elements(By.ID, "me") if e.text == "moderator: mod-7"],
                 what="the signed-in moderator's name in the header")
        items = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#queue li"), what="the queue on the page")
        assert len(items) == len(posts)
        assert all("likely spam" in li.text for li in items)  # the reasons, in words
        hostile = [li for li in items if li.get_attribute("data-post-id") == "console-4"][0]
        assert "<script>window.__pwned=2</script>" in hostile.text  # shown as text
        assert not browser.find_elements(By.CSS_SELECTOR, "#queue img, #queue script")
        assert browser.execute_script("return window.__pwned === undefined")

        target = items[1].get_attribute("data-post-id")
        items[1].click()  # select it, then the keyboard shortcut labels it
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#detail-text"), what="the post's details")
        browser.find_element(By.TAG_NAME, "body").send_keys("s")
        wait_for(lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-last-label") == f"{target}:spam",
                 what="the page to confirm the label")
        if os.environ.get("MODPIPE_CONSOLE_SCREENSHOT"):  # a picture of the page at 1400x1000
            time.sleep(2.5)
            browser.save_screenshot(os.environ["MODPIPE_CONSOLE_SCREENSHOT"])

        def label_on_topic():
            msg = labels.poll(0.5)
            return msg is not None and not msg.error() and orjson.loads(msg.value())
        label = wait_for(label_on_topic, what="the label on the labels topic")
        assert (label["post_id"], label["label"], label["moderator_id"], label["user_id"]) == \
            (target, "spam", "mod-7", "console-user")
        wait_for(lambda: target not in [p["post_id"] for p in index.queue()["posts"]], what="the post off the queue")
        assert len(wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#queue li"))) <= len(posts) - 1
        audited = [orjson.loads(line) for line in audit.read_text().splitlines()]
        assert [(a["moderator"], a["post_id"], a["label"], a["verdict_before"]) for a in audited] == \
            [("mod-7", target, "spam", "review")]

        # The pipeline counted the label: the next post of that user sees one spam post in its features.
        later = make_post(rng, "console-later", "see you at lunch tomorrow", user_id="console-user")
        producer.produce(stack.topics.posts, key=later["user_id"].encode(), value=schema.dumps(later))
        assert producer.flush(30) == 0
        decided = wait_for(lambda: index.post("console-later") and index.post("console-later").get("verdict"),
                           what="the later post's decision")
        assert decided and index.post("console-later")["features"]["user_spam_posts"] == 1
        # and the page's search finds the user with all six posts
        assert index.user("console-user")["known_posts"] == len(posts) + 1

        # Signed out, the queue is gone and the API answers nothing.
        browser.find_element(By.ID, "sign-out").click()
        wait_for(lambda: browser.current_url.endswith("/login"), what="the sign-in page after signing out")
        browser.get(server.url)
        wait_for(lambda: browser.current_url.endswith("/login"), what="the sign-in page again")
        assert not browser.find_elements(By.ID, "queue")
        assert browser.execute_script("return fetch('/api/queue').then(r => r.status)") == 401
    finally:
        browser.quit()
        labels.close()
        server.shutdown()
        follower.stop()
