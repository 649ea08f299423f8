//! The quota table over a shared memory block against a model: random inserts, updates,
//! renames, re-parents, re-created names and deletes, applied through two handles of one
//! block in turn (the writer moving between nginx workers), with time passing so freed slots
//! and index areas get reused. After every step both handles must agree with the model on
//! every name: present or not, its id, numbers and parent.

use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use yarl_core::zone::prepare;
use yarl_core::{Block, Limiter, Limits, ManualClock, QuotaUpdate};

const NAMES: usize = 24;

fn name(i: usize) -> String {
    // Short names stay inside the slot, long ones need an arena tail.
    if i.is_multiple_of(3) {
        format!("quota-with-a-rather-long-name-number-{i}")
    } else {
        format!("q{i}")
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put { id: u64, name: usize, parent: Option<usize>, limit: u32 },
    Delete { id: u64 },
    Wait { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1..40u64, 0..NAMES, proptest::option::of(0..NAMES), 1..1000u32)
            .prop_map(|(id, name, parent, limit)| Op::Put { id, name, parent, limit }),
        3 => (1..40u64).prop_map(|id| Op::Delete { id }),
        1 => (0..3000u64).prop_map(|ms| Op::Wait { ms }),
    ]
}

#[derive(Default)]
struct Model {
    /// name → (id, limit, parent name)
    by_name: HashMap<String, (u64, u32, Option<String>)>,
}

impl Model {
    fn put(&mut self, id: u64, n: String, limit: u32, parent: Option<String>) {
        // The id's old name (a rename), and the name's old holder (re-created), go.
        self.by_name.retain(|k, v| v.0 != id && *k != n);
        self.by_name.insert(n, (id, limit, parent));
    }

    fn delete(&mut self, id: u64) {
        self.by_name.retain(|_, v| v.0 != id);
    }

    fn parent_of(&self, n: &str) -> Option<String> {
        let p = self.by_name.get(n)?.2.clone()?;
        (p != n && self.by_name.contains_key(&p)).then_some(p)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn table_matches_the_model(ops in proptest::collection::vec((op(), any::<bool>()), 1..120)) {
        let clock = ManualClock::at(1_000_000_000);
        let block = Block::for_quotas(1000);
        prepare(&block, 0).unwrap();
        let open = || Limiter::builder().clock(Arc::new(clock.clone())).open(block.clone()).unwrap();
        let handles = [open(), open()];
        let mut model = Model::default();
        for (epoch, (op, which)) in (1..).zip(ops) {
            let h = &handles[usize::from(which)];
            match op {
                Op::Put { id, name: n, parent, limit } => {
                    let u = QuotaUpdate {
                        id,
                        name: name(n),
                        epoch,
                        deleted: false,
                        reset_epoch: 0,
                        limits: Limits::from_units(f64::from(limit), 1.0, 2.0).unwrap(),
                        parent: parent.map(name),
                    };
                    let r = h.apply_quotas(&[u]);
                    prop_assert_eq!(r.missing, 0);
                    model.put(id, name(n), limit, parent.map(name));
                }
                Op::Delete { id } => {
                    // The root sends a tombstone with the quota's last name.
                    let Some(n) = model.by_name.iter().find(|(_, v)| v.0 == id).map(|(k, _)| k.clone()) else { continue };
                    h.apply_quotas(&[QuotaUpdate {
                        id,
                        name: n,
                        epoch,
                        deleted: true,
                        reset_epoch: 0,
                        limits: Limits::from_units(1.0, 0.0, 0.0).unwrap(),
                        parent: None,
                    }]);
                    model.delete(id);
                }
                Op::Wait { ms } => clock.advance(Duration::from_millis(ms)),
            }
            for other in &handles {
                prop_assert_eq!(other.quota_count(), model.by_name.len() as u64);
                for i in 0..NAMES {
                    let n = name(i);
                    match (model.by_name.get(&n), other.quota(&n)) {
                        (None, None) => {}
                        (Some(&(id, limit, _)), Some(q)) => {
                            prop_assert_eq!(q.id, id);
                            prop_assert_eq!(q.limit, f64::from(limit));
                            prop_assert_eq!(q.parent, model.parent_of(&n), "parent of {}", n);
                        }
                        (m, q) => prop_assert!(false, "{n}: model {m:?}, table {q:?}"),
                    }
                }
            }
        }
        prop_assert_eq!(handles[0].names(), model.by_name.keys().cloned().collect());
    }
}
