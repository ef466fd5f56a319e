"""The review console in a real browser (Debian's Chromium, headless, through its WebDriver), following a
live pipeline on the real broker and Triton: a moderator labels a post from the page with the keyboard,
the label arrives on the `labels` topic and in the user's features, and hostile post text stays text."""

from __future__ import annotations

import os
import random
import shutil
import time

import orjson
import pytest
from confluent_kafka import Producer

from console.follower import Follower, LabelPublisher
from console.index import DecisionIndex
from console.server import serve
from loadgen.posts import make_post
from loadgen.smoke import end_consumer
from modpipe import schema

pytestmark = pytest.mark.integration

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
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
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


def test_moderator_labels_a_post_in_the_browser_and_the_label_reaches_the_topic_and_the_features(
        local_stack, pipeline_settings, model_build):
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
    server = serve(index, LabelPublisher(pipeline_settings, stack.bootstrap), host="127.0.0.1", port=0,
                   default_moderator="mod-7")
    labels = end_consumer(pipeline_settings, stack.bootstrap, [stack.topics.labels])
    browser = chrome()
    try:
        wait_for(lambda: index.queue()["size"] == len(posts) and all(p["text"] for p in index.queue()["posts"]),
                 what="every post decided into the review queue")
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
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
        if os.environ.get("MODPIPE_CONSOLE_SCREENSHOT"):  # how the README's picture is made
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

        # The pipeline counted the label: the next post of that user sees one spam post in its features.
        later = make_post(rng, "console-later", "see you at lunch tomorrow", user_id="console-user")
        producer.produce(stack.topics.posts, key=later["user_id"].encode(), value=schema.dumps(later))
        assert producer.flush(30) == 0
        decided = wait_for(lambda: index.post("console-later") and index.post("console-later").get("verdict"),
                           what="the later post's decision")
        assert decided and index.post("console-later")["features"]["user_spam_posts"] == 1
        # and the page's search finds the user with all six posts
        assert index.user("console-user")["known_posts"] == len(posts) + 1
    finally:
        browser.quit()
        labels.close()
        server.shutdown()
        follower.stop()
