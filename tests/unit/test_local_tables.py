"""Local table stores ahead of their changelog are found and removed (streams/local_tables.py)."""

from __future__ import annotations

from rocksdict import Options, Rdict

from streams.local_tables import OFFSET_KEY, discard_ahead, discard_named, persisted_offset, stores


def make_store(tabledir, name: str, offset: int | None) -> None:
    db = Rdict(str(tabledir / name), options=Options(raw_mode=True))
    db[b'"k"'] = b'{"n": 1}'
    if offset is not None:
        db[OFFSET_KEY] = str(offset).encode()
    db.close()


def test_stores_ahead_of_the_changelog_end_are_removed_the_others_kept(tmp_path):
    make_store(tmp_path, "features-user-0.db", 99)  # last applied 99, changelog ends at 100: fine
    make_store(tmp_path, "features-user-1.db", 100)  # applied an offset the broker no longer has
    make_store(tmp_path, "features-post-2.db", 250)  # far ahead
    make_store(tmp_path, "features-post-3.db", None)  # never applied anything
    (tmp_path / "features-post-backups").mkdir()
    assert persisted_offset(tmp_path / "features-user-0.db") == 99
    assert set(stores(tmp_path)) == {("features-user", 0), ("features-user", 1), ("features-post", 2),
                                     ("features-post", 3)}
    ends = {("app-features-user-changelog", 0): 100, ("app-features-user-changelog", 1): 100,
            ("app-features-post-changelog", 2): 10, ("app-features-post-changelog", 3): 0}
    asked = []

    def end_offset(topic, partition):
        asked.append((topic, partition))
        return ends[(topic, partition)]

    removed = discard_ahead(tmp_path, "app", end_offset)
    assert sorted(removed) == ["features-post-2.db", "features-user-1.db"]
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["features-post-3.db", "features-user-0.db"]
    assert ("app-features-user-changelog", 0) in asked
    assert discard_ahead(tmp_path, "app", end_offset) == []  # idempotent


def test_a_missing_changelog_topic_removes_nothing(tmp_path):
    make_store(tmp_path, "features-ip-0.db", 5)
    assert discard_ahead(tmp_path, "app", lambda topic, partition: None) == []
    assert discard_ahead(tmp_path / "absent", "app", lambda topic, partition: 0) == []


def test_the_store_a_consistency_error_names_is_removed(tmp_path):
    make_store(tmp_path, "features-domain-2.db", 103)
    make_store(tmp_path, "features-domain-1.db", 103)
    message = ("The persisted offset for changelog topic partition TP(topic='app-features-domain-changelog', "
               "partition=2) is higher\nthan the last offset in that topic (highwater) (103 > 101).")
    assert discard_named(tmp_path, "app", message) == ["features-domain-2.db"]
    assert [p.name for p in tmp_path.glob("*.db")] == ["features-domain-1.db"]
    assert discard_named(tmp_path, "other-app", message) == []


def test_stores_are_kept_only_after_a_clean_stop(tmp_path):
    from streams.local_tables import CLEAN_STOP_MARK, discard_after_unclean_stop, mark_clean_stop

    for name in ("features-user-0.db", "features-post-3.db"):
        make_store(tmp_path, name, 7)
    mark_clean_stop(tmp_path)
    assert discard_after_unclean_stop(tmp_path) == []  # a clean stop: the stores hold nothing unsent
    assert sorted(stores(tmp_path)) == [("features-post", 3), ("features-user", 0)]
    assert not (tmp_path / CLEAN_STOP_MARK).exists()  # this run is unclean until it stops cleanly
    # killed without a clean stop: a write may be in a store and not in its changelog
    assert sorted(discard_after_unclean_stop(tmp_path)) == ["features-post-3.db", "features-user-0.db"]
    assert stores(tmp_path) == {}
    assert discard_after_unclean_stop(tmp_path / "missing") == []  # a first start
