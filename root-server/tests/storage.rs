//! One storage suite, run against SQLite and against a real PostgreSQL
//! (`scripts/with-postgres.sh cargo test -p yarl-root`; skipped without `YARL_TEST_PG_URL`,
//! except that with `YARL_TEST_PG_REQUIRED=1` (make test) or `CI` set they fail instead).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use yarl_core::Limits;
use yarl_root::db::{self, NewQuota, QuotaStore, StoreError};

fn nq(name: &str, parent: Option<&str>) -> NewQuota {
    NewQuota {
        name: name.into(),
        limits: Limits::from_milli(1_500, 1_000, 2_000).unwrap(),
        parent: parent.map(Into::into),
    }
}

async fn put(s: &dyn QuotaStore, name: &str, parent: Option<&str>) -> Result<u64, StoreError> {
    let w = s.put_many(vec![nq(name, parent)]).await?;
    Ok(w.quotas[0].epoch)
}

async fn all_changes(s: &dyn QuotaStore, since: u64) -> Vec<yarl_root::db::StoredQuota> {
    s.changes_since(since, 1_000_000).await.unwrap()
}

macro_rules! suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $test() {
                    let (store, _, _dir) = crate::common::sqlite_store().await;
                    super::$test(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $test() {
                    let Some(base) = crate::common::pg_url(concat!("postgres::", stringify!($test))) else { return };
                    let url = crate::common::fresh_pg_db(&base).await;
                    let store = yarl_root::db::open(&url).await.unwrap();
                    super::$test(store).await;
                }
            )*
        }
    };
}

suite!(
    writes_get_increasing_epochs_and_keep_ids,
    tombstones,
    graph_rules,
    batch_is_atomic,
    list_is_bytewise_with_literal_prefix,
    concurrent_writers_never_hide_an_epoch,
    batch_deletes_with_writes,
    key_resets_are_tombstones,
    max_in_flight_round_trips,
);

/// `max_in_flight` is stored with the numbers, through single and batch writes, changed
/// and dropped like them, and carried by a key reset's tombstone.
async fn max_in_flight_round_trips(s: Arc<dyn QuotaStore>) {
    let capped =
        |c| Limits::from_milli(1_500, 1_000, 2_000).unwrap().with_max_in_flight(c).unwrap();
    let alone = Limits::in_flight_only(1_000_000).unwrap();
    let w = s
        .put_many(vec![
            NewQuota { limits: capped(8), ..nq("gen", None) },
            NewQuota { limits: alone, ..nq("db", None) },
            nq("plain", None),
        ])
        .await
        .unwrap();
    let got: Vec<(u32, bool)> =
        w.quotas.iter().map(|q| (q.limits.max_in_flight(), q.limits.has_rate())).collect();
    assert_eq!(got, [(8, true), (1_000_000, false), (0, true)]);
    let db = s.get("db".into()).await.unwrap().unwrap();
    assert_eq!(db.limits, alone, "read back exactly");
    s.put_many(vec![NewQuota { limits: capped(0), ..nq("gen", None) }]).await.unwrap();
    assert_eq!(s.get("gen".into()).await.unwrap().unwrap().limits.max_in_flight(), 0);
    let w = s.reset_key("k_abc".into(), capped(3)).await.unwrap();
    assert_eq!(w.quotas[0].limits.max_in_flight(), 3);
}

async fn writes_get_increasing_epochs_and_keep_ids(s: Arc<dyn QuotaStore>) {
    let w = s.put_many(vec![nq("a", None), nq("b", Some("a"))]).await.unwrap();
    assert_eq!(w.base_epoch, 0);
    assert_eq!(
        w.quotas.iter().map(|q| (q.epoch, q.name.as_str())).collect::<Vec<_>>(),
        [(1, "a"), (2, "b")]
    );
    let id_a = w.quotas[0].id;
    let w = s
        .put_many(vec![NewQuota { limits: Limits::from_milli(7, 0, 0).unwrap(), ..nq("a", None) }])
        .await
        .unwrap();
    assert_eq!((w.base_epoch, w.quotas[0].epoch, w.quotas[0].id), (2, 3, id_a));
    let a = s.get("a".into()).await.unwrap().unwrap();
    assert_eq!((a.id, a.epoch, a.limits.limit().milli(), a.parent), (id_a, 3, 7, None));
    assert_eq!(s.get("b".into()).await.unwrap().unwrap().parent.as_deref(), Some("a"));
    assert!(s.get("zz".into()).await.unwrap().is_none());
    // The change log: one row per quota at its latest epoch, in epoch order.
    let ch = all_changes(&*s, 0).await;
    assert_eq!(
        ch.iter().map(|q| (q.name.as_str(), q.epoch)).collect::<Vec<_>>(),
        [("b", 2), ("a", 3)]
    );
    assert_eq!(all_changes(&*s, 2).await.len(), 1);
    assert!(all_changes(&*s, 3).await.is_empty());
    assert_eq!(s.changes_since(0, 1).await.unwrap().len(), 1);
}

async fn tombstones(s: Arc<dyn QuotaStore>) {
    put(&*s, "p", None).await.unwrap();
    put(&*s, "c", Some("p")).await.unwrap();
    match s.delete("p".into()).await {
        Err(StoreError::HasChildren { name, children, index: None }) => {
            assert_eq!((name.as_str(), children), ("p", vec!["c".to_owned()]))
        }
        other => panic!("{other:?}"),
    }
    let w = s.delete("c".into()).await.unwrap();
    assert_eq!((w.base_epoch, w.quotas[0].epoch, w.quotas[0].deleted), (2, 3, true));
    let id_c = w.quotas[0].id;
    assert!(matches!(s.delete("c".into()).await, Err(StoreError::NotFound(n)) if n == "c"));
    assert!(s.get("c".into()).await.unwrap().is_none());
    // The tombstone is in the change log so limiters learn about the delete.
    let ch = all_changes(&*s, 2).await;
    assert_eq!((ch.len(), ch[0].deleted, ch[0].epoch, ch[0].name.as_str()), (1, true, 3, "c"));
    // A tombstone is no parent.
    assert!(matches!(put(&*s, "x", Some("c")).await, Err(StoreError::UnknownParent { .. })));
    s.delete("p".into()).await.unwrap();
    // Re-creating keeps the id, with a new epoch, and starts from empty: its reset epoch is
    // the new epoch, so a root that polls after both writes (and sees an edit only) empties
    // the counter, and counts sent before the delete are not summed into the new quota.
    let w = s.put_many(vec![nq("c", None)]).await.unwrap();
    assert_eq!((w.quotas[0].id, w.quotas[0].epoch, w.quotas[0].deleted), (id_c, 5, false));
    assert_eq!(w.quotas[0].reset_epoch, 5);
    // An edit of a live quota keeps its reset epoch.
    let w = s.put_many(vec![nq("c", None)]).await.unwrap();
    assert_eq!((w.quotas[0].epoch, w.quotas[0].reset_epoch), (6, 5));
    let ch = all_changes(&*s, 4).await;
    assert_eq!(ch.iter().map(|q| (q.epoch, q.reset_epoch)).collect::<Vec<_>>(), [(6, 5)]);
    assert!(s.list(String::new(), None, 10).await.unwrap().iter().all(|q| q.name == "c"));
}

/// A key's reset is a tombstone of its name whose `reset_epoch` is its epoch: made on the
/// first, moved to a new epoch by the next, never listed, and a live quota of the name
/// (made since the caller looked) is reset as a quota.
async fn key_resets_are_tombstones(s: Arc<dyn QuotaStore>) {
    put(&*s, "k_*", None).await.unwrap();
    let limits = Limits::from_milli(5, 1000, 2000).unwrap();
    let w = s.reset_key("k_abc".into(), limits).await.unwrap();
    let q = &w.quotas[0];
    assert_eq!((q.name.as_str(), q.deleted, q.epoch, q.reset_epoch), ("k_abc", true, 2, 2));
    assert_eq!(q.limits.limit().milli(), 5);
    let id = q.id;
    let w = s.reset_key("k_abc".into(), limits).await.unwrap();
    let q = &w.quotas[0];
    assert_eq!((q.id, q.deleted, q.epoch, q.reset_epoch), (id, true, 3, 3));
    assert!(s.get("k_abc".into()).await.unwrap().is_none());
    assert_eq!(s.list(String::new(), None, 10).await.unwrap().len(), 1);
    let ch = all_changes(&*s, 1).await;
    assert_eq!((ch.len(), ch[0].name.as_str(), ch[0].reset_epoch), (1, "k_abc", 3));
    // An override made over the record keeps its id; a key reset of a live name resets it.
    put(&*s, "k_abc", None).await.unwrap();
    let w = s.reset_key("k_abc".into(), limits).await.unwrap();
    let q = &w.quotas[0];
    assert_eq!((q.id, q.deleted, q.epoch, q.reset_epoch), (id, false, 5, 5));
}

async fn graph_rules(s: Arc<dyn QuotaStore>) {
    put(&*s, "a", None).await.unwrap();
    put(&*s, "b", Some("a")).await.unwrap();
    put(&*s, "c", Some("b")).await.unwrap();
    match put(&*s, "a", Some("c")).await {
        Err(StoreError::Cycle { cycle, .. }) => assert_eq!(cycle, ["a", "c", "b", "a"]),
        other => panic!("{other:?}"),
    }
    match put(&*s, "d", Some("nope")).await {
        Err(StoreError::UnknownParent { parent, .. }) => assert_eq!(parent, "nope"),
        other => panic!("{other:?}"),
    }
    // Chains deeper than limiters follow are refused, through stored rows too.
    let mut prev = "c".to_owned();
    for i in 3..yarl_core::MAX_CHAIN {
        let n = format!("n{i}");
        put(&*s, &n, Some(&prev)).await.unwrap();
        prev = n;
    }
    assert!(
        matches!(put(&*s, "deep", Some(&prev)).await, Err(StoreError::ChainTooDeep { depth, .. }) if depth == yarl_core::MAX_CHAIN + 1)
    );
    // Re-parenting without a cycle is fine; nothing of the refused writes is stored.
    put(&*s, "c", Some("a")).await.unwrap();
    // A re-parented quota takes its subtree along: its deepest descendant's chain counts.
    // a c n3..n15 is 15 long; under "top" it is 16, under "top2" above that it would be 17.
    put(&*s, "top", None).await.unwrap();
    put(&*s, "a", Some("top")).await.unwrap();
    put(&*s, "top2", None).await.unwrap();
    match put(&*s, "top", Some("top2")).await {
        Err(StoreError::DescendantTooDeep { name, descendant, depth, .. }) => {
            assert_eq!((name.as_str(), descendant.as_str()), ("top", prev.as_str()));
            assert_eq!(depth, yarl_core::MAX_CHAIN + 1);
        }
        other => panic!("{other:?}"),
    }
    let names: BTreeSet<String> = all_changes(&*s, 0).await.into_iter().map(|q| q.name).collect();
    assert!(!names.contains("d") && !names.contains("deep"));
}

async fn batch_is_atomic(s: Arc<dyn QuotaStore>) {
    put(&*s, "root", None).await.unwrap();
    let bad = vec![nq("x1", Some("root")), nq("x2", Some("x1")), nq("x3", Some("ghost"))];
    match s.put_many(bad).await {
        Err(e @ StoreError::UnknownParent { .. }) => assert_eq!(e.item_index(), Some(2)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.put_many(vec![nq("y", None), nq("y", None)]).await,
        Err(StoreError::Duplicate { index: 1, first: 0, .. })
    ));
    assert_eq!(all_changes(&*s, 0).await.len(), 1, "a refused batch left rows behind");
    // A large batch crossing insert chunks, replacing some rows, with parents inside.
    let mut items: Vec<NewQuota> =
        (0..25_000).map(|i| nq(&format!("k{i:05}"), Some("root"))).collect();
    items.push(nq("root", None));
    items.push(nq("leaf", Some("k24999")));
    let w = s.put_many(items).await.unwrap();
    assert_eq!((w.base_epoch, w.last_epoch(), w.quotas.len()), (1, 25_003, 25_002));
    assert!(w.quotas.iter().all(|q| q.id > 0));
    let ch = all_changes(&*s, 0).await;
    assert_eq!(ch.len(), 25_002);
    assert!(ch.windows(2).all(|p| p[0].epoch + 1 == p[1].epoch));
    let by_db: Vec<(u64, u64)> = ch.iter().map(|q| (q.id, q.epoch)).collect();
    let by_write: Vec<(u64, u64)> = w.quotas.iter().map(|q| (q.id, q.epoch)).collect();
    assert_eq!(by_db, by_write, "the ids a write reports must be the stored ones");
}

async fn list_is_bytewise_with_literal_prefix(s: Arc<dyn QuotaStore>) {
    let names = ["a_b", "aXb", "a.b", "Ab", "ab", "a", "b", "a_bc"];
    s.put_many(names.iter().map(|n| nq(n, None)).collect()).await.unwrap();
    s.delete("ab".into()).await.unwrap();
    let list = |p: &str, after: Option<&str>, n| {
        let s = s.clone();
        let (p, after) = (p.to_owned(), after.map(str::to_owned));
        async move { s.list(p, after, n).await.unwrap().into_iter().map(|q| q.name).collect::<Vec<_>>() }
    };
    assert_eq!(list("", None, 100).await, ["Ab", "a", "a.b", "aXb", "a_b", "a_bc", "b"]);
    assert_eq!(list("a_", None, 100).await, ["a_b", "a_bc"]);
    assert_eq!(list("a", Some("a.b"), 2).await, ["aXb", "a_b"]);
    assert!(list("zz", None, 100).await.is_empty());
}

/// Several writers commit concurrently while a poller follows `epoch > cursor`: the poller
/// must end up with every row, and epochs must be dense. On PostgreSQL this fails without
/// serialising epoch assignment until commit.
async fn concurrent_writers_never_hide_an_epoch(s: Arc<dyn QuotaStore>) {
    const WRITERS: usize = 6;
    const EACH: usize = 25;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (s, done) = (s.clone(), done.clone());
        tokio::spawn(async move {
            let mut cursor = 0;
            let mut seen = BTreeSet::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::Acquire);
                for q in s.changes_since(cursor, 1_000).await.unwrap() {
                    assert!(q.epoch > cursor);
                    cursor = q.epoch;
                    seen.insert(q.name);
                }
                if finished {
                    return seen;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        })
    };
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let s = s.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                put(&*s, &format!("w{w}.{i}"), None).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let seen = poller.await.unwrap();
    assert_eq!(seen.len(), WRITERS * EACH, "the poller skipped rows");
    let epochs: Vec<u64> = all_changes(&*s, 0).await.iter().map(|q| q.epoch).collect();
    assert_eq!(epochs, (1..=(WRITERS * EACH) as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn reopen_runs_migrations_once() {
    let (s, url, _dir) = common::sqlite_store().await;
    put(&*s, "kept", None).await.unwrap();
    let again = db::open(&url).await.unwrap();
    assert_eq!(again.get("kept".into()).await.unwrap().unwrap().epoch, 1);
    assert_eq!(put(&*again, "next", None).await.unwrap(), 2);
    let Some(base) = common::pg_url("reopen_runs_migrations_once (postgres part)") else { return };
    let url = common::fresh_pg_db(&base).await;
    let s = db::open(&url).await.unwrap();
    put(&*s, "kept", None).await.unwrap();
    let again = db::open(&url).await.unwrap();
    assert_eq!(put(&*again, "next", None).await.unwrap(), 2);
}

/// Writes waiting for PostgreSQL's write lock (held by a long batch, of this root or
/// another) hold connections of their own: reads and the poller's `changes_since` still
/// answer at once, and the writes go on when the lock comes free.
#[tokio::test]
async fn writes_waiting_for_the_lock_leave_reads_alone() {
    use sqlx::Connection;
    let Some(base) = common::pg_url("writes_waiting_for_the_lock_leave_reads_alone") else {
        return;
    };
    let url = common::fresh_pg_db(&base).await;
    let s = db::open(&url).await.unwrap();
    put(&*s, "x", None).await.unwrap();
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(2036429420)").execute(&mut other).await.unwrap();
    let writes: Vec<_> = (0..12)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { put(&*s, &format!("w{i}"), None).await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        assert_eq!(s.get("x".into()).await.unwrap().unwrap().epoch, 1);
        assert_eq!(s.changes_since(0, 10).await.unwrap().len(), 1);
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "{:?}", t.elapsed());
    }
    sqlx::query("SELECT pg_advisory_unlock(2036429420)").execute(&mut other).await.unwrap();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    assert_eq!(all_changes(&*s, 0).await.len(), 13);
}

#[tokio::test]
async fn bad_urls_are_refused() {
    let e = db::open("mysql://x").await.err().unwrap().to_string();
    assert!(e.contains("unsupported database URL"), "{e}");
}

async fn batch_deletes_with_writes(s: Arc<dyn QuotaStore>) {
    // p <- c <- g, p <- k; o stays.
    let w = s
        .put_many(vec![
            nq("p", None),
            nq("c", Some("p")),
            nq("g", Some("c")),
            nq("k", Some("p")),
            nq("o", None),
        ])
        .await
        .unwrap();
    let ids: Vec<u64> = w.quotas.iter().map(|q| q.id).collect();
    let refused = |r: Result<yarl_root::db::Written, StoreError>| match r {
        Err(e) => e,
        Ok(w) => panic!("written: {w:?}"),
    };
    // A missing name fails the whole batch, as a single delete does.
    let e = refused(s.write_batch(vec![nq("new", None)], vec!["o".into(), "ghost".into()]).await);
    assert!(
        matches!(&e, StoreError::DeleteNotFound { name, index: 2 } if name == "ghost"),
        "{e:?}"
    );
    // A tombstone is no longer there to delete.
    s.delete("o".into()).await.unwrap();
    let e = refused(s.write_batch(vec![], vec!["o".into()]).await);
    assert!(matches!(&e, StoreError::DeleteNotFound { name, index: 0 } if name == "o"), "{e:?}");
    // Deleting a parent whose child stays (neither deleted nor moved) is refused.
    let e = refused(s.write_batch(vec![], vec!["c".into()]).await);
    assert!(
        matches!(&e, StoreError::HasChildren { name, children, index: Some(0) } if name == "c" && children == &["g"]),
        "{e:?}"
    );
    // So is a write that names a parent deleted in the same batch.
    let e = refused(s.write_batch(vec![nq("n", Some("k"))], vec!["k".into()]).await);
    assert!(
        matches!(&e, StoreError::HasChildren { name, children, index: Some(1) } if name == "k" && children == &["n"]),
        "{e:?}"
    );
    // A name both written and deleted, or deleted twice.
    let e = refused(s.write_batch(vec![nq("k", None)], vec!["k".into()]).await);
    assert!(matches!(e, StoreError::Duplicate { index: 1, first: 0, .. }), "{e:?}");
    let e = refused(s.write_batch(vec![], vec!["g".into(), "g".into()]).await);
    assert!(matches!(e, StoreError::Duplicate { index: 1, first: 0, .. }), "{e:?}");
    assert_eq!(all_changes(&*s, 6).await.len(), 0, "a refused batch left rows behind");

    // Deleting p with its subtree, k moved away first: writes, then tombstones children
    // first, each with its own epoch after the writes, contiguous from base + 1.
    let w =
        s.write_batch(vec![nq("k", None)], vec!["p".into(), "c".into(), "g".into()]).await.unwrap();
    assert_eq!(w.base_epoch, 6);
    let got: Vec<(&str, u64, bool)> =
        w.quotas.iter().map(|q| (q.name.as_str(), q.epoch, q.deleted)).collect();
    assert_eq!(got, [("k", 7, false), ("g", 8, true), ("c", 9, true), ("p", 10, true)]);
    // Tombstones as `delete` writes them: same id, no parent, the numbers kept.
    let g = &w.quotas[1];
    assert_eq!((g.id, g.parent.as_deref(), g.limits), (ids[2], None, nq("g", None).limits));
    // What pollers read is what the write reported.
    let ch = all_changes(&*s, 6).await;
    assert_eq!(ch, w.quotas);
    let live: Vec<String> =
        s.list(String::new(), None, 10).await.unwrap().into_iter().map(|q| q.name).collect();
    assert_eq!(live, ["k"]);
}
