//! Parent-graph checks for a write, shared by both databases.
//!
//! The rules (parent exists, no cycle, chain no deeper than limiters follow) depend on rows
//! outside the write, so a database must answer "which of these names are live quotas, and
//! what are their parents?". [`GraphCheck`] is a small state machine that asks exactly for
//! the ancestors it needs, a level at a time, so checking a batch of a million quotas costs
//! a few queries rather than a million, and checking one quota costs one per chain level.
//!
//! The database graph is acyclic (every write was checked), so any new cycle passes through
//! a quota of this write; walking up from each of them finds it.

use super::{NewQuota, StoreError};
use std::collections::{HashMap, HashSet};
use yarl_core::MAX_CHAIN;

/// Checks a write's quotas against the live rows it depends on; see the module docs.
///
/// ```text
/// let mut check = GraphCheck::new(&items)?;
/// while let Some(names) = check.wanted() {
///     let found = /* live (name, parent) rows among `names` */;
///     check.supply(&names, found);
/// }
/// check.finish()?;
/// while let Some(names) = check.wanted_children() {
///     let found = /* live (name, parent) rows whose parent is among `names` */;
///     check.supply_children(found)?;
/// }
/// ```
#[derive(Debug)]
pub struct GraphCheck<'a> {
    items: &'a [NewQuota],
    index: HashMap<&'a str, usize>,
    /// Live rows outside the write: name → parent.
    db: HashMap<String, Option<String>>,
    /// Names asked for that are not live.
    missing: HashSet<String>,
    pending: Vec<String>,
    queued: HashSet<String>,
    /// Descendant walk (after `finish`): chain length and originating item of every name
    /// reached below the written quotas, and the names whose children come next.
    below: HashMap<String, (usize, usize)>,
    below_pending: Vec<String>,
}

impl<'a> GraphCheck<'a> {
    /// Starts a check; refuses a name given twice.
    pub fn new(items: &'a [NewQuota]) -> Result<Self, StoreError> {
        let mut index = HashMap::with_capacity(items.len());
        for (i, q) in items.iter().enumerate() {
            if let Some(&first) = index.get(q.name.as_str()) {
                return Err(StoreError::Duplicate { index: i, first, name: q.name.clone() });
            }
            index.insert(q.name.as_str(), i);
        }
        let mut check = GraphCheck {
            items,
            index,
            db: HashMap::new(),
            missing: HashSet::new(),
            pending: Vec::new(),
            queued: HashSet::new(),
            below: HashMap::new(),
            below_pending: Vec::new(),
        };
        for q in items {
            if let Some(p) = &q.parent {
                check.queue(p);
            }
        }
        Ok(check)
    }

    fn queue(&mut self, name: &str) {
        if !self.index.contains_key(name) && !self.queued.contains(name) {
            self.queued.insert(name.to_owned());
            self.pending.push(name.to_owned());
        }
    }

    /// Names to look up next, or `None` when everything needed is known.
    pub fn wanted(&mut self) -> Option<Vec<String>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }

    /// The live rows among `asked`, as `(name, parent)`.
    pub fn supply(&mut self, asked: &[String], found: Vec<(String, Option<String>)>) {
        for (name, parent) in found {
            if let Some(p) = &parent {
                self.queue(p);
            }
            self.db.insert(name, parent);
        }
        for a in asked {
            if !self.db.contains_key(a) {
                self.missing.insert(a.clone());
            }
        }
    }

    fn parent_of(&self, name: &str) -> Option<&str> {
        match self.index.get(name) {
            Some(&i) => self.items[i].parent.as_deref(),
            None => self.db.get(name).and_then(|p| p.as_deref()),
        }
    }

    /// The verdict on the written quotas and their ancestors, reporting the first offending
    /// item in the order given. Then the descendants: see [`GraphCheck::wanted_children`].
    pub fn finish(&mut self) -> Result<(), StoreError> {
        for (i, q) in self.items.iter().enumerate() {
            if let Some(p) = &q.parent {
                if self.missing.contains(p) {
                    return Err(StoreError::UnknownParent {
                        index: i,
                        name: q.name.clone(),
                        parent: p.clone(),
                    });
                }
            }
        }
        // Chain length (the quota and its ancestors) of every name walked so far.
        let mut depth: HashMap<&str, usize> = HashMap::with_capacity(self.items.len());
        let mut path: Vec<&str> = Vec::new();
        let mut on_path: HashMap<&str, usize> = HashMap::new();
        for (i, q) in self.items.iter().enumerate() {
            path.clear();
            on_path.clear();
            let mut cur = Some(q.name.as_str());
            let base = loop {
                let Some(n) = cur else { break 0 };
                if let Some(&d) = depth.get(n) {
                    break d;
                }
                if let Some(&pos) = on_path.get(n) {
                    let mut cycle: Vec<String> =
                        path[pos..].iter().map(|s| (*s).to_owned()).collect();
                    cycle.push(n.to_owned());
                    return Err(StoreError::Cycle { index: i, name: q.name.clone(), cycle });
                }
                on_path.insert(n, path.len());
                path.push(n);
                cur = self.parent_of(n);
            };
            let len = path.len();
            for (k, n) in path.iter().enumerate() {
                depth.insert(n, base + len - k);
            }
            let d = depth[q.name.as_str()];
            if d > MAX_CHAIN {
                return Err(StoreError::ChainTooDeep {
                    index: i,
                    name: q.name.clone(),
                    depth: d,
                    max: MAX_CHAIN,
                });
            }
        }
        let below: HashMap<String, (usize, usize)> = self
            .items
            .iter()
            .enumerate()
            .map(|(i, q)| (q.name.clone(), (depth[q.name.as_str()], i)))
            .collect();
        self.below_pending = below.keys().cloned().collect();
        self.below = below;
        Ok(())
    }

    /// Names whose live children to look up next (after [`GraphCheck::finish`]), or `None`
    /// when the walk is done. A re-parented quota moves its whole subtree: the deepest
    /// descendant's chain must stay within what limiters follow.
    pub fn wanted_children(&mut self) -> Option<Vec<String>> {
        (!self.below_pending.is_empty()).then(|| std::mem::take(&mut self.below_pending))
    }

    /// Live rows `(name, parent)` whose parent was among the names asked for.
    pub fn supply_children(
        &mut self,
        found: Vec<(String, Option<String>)>,
    ) -> Result<(), StoreError> {
        for (child, parent) in found {
            // A child that is itself written hangs where the write says (already checked).
            let Some(parent) = parent else { continue };
            if self.index.contains_key(child.as_str()) {
                continue;
            }
            let Some(&(len, origin)) = self.below.get(&parent) else { continue };
            let depth = len + 1;
            if depth > MAX_CHAIN {
                return Err(StoreError::DescendantTooDeep {
                    index: origin,
                    name: self.items[origin].name.clone(),
                    descendant: child,
                    depth,
                    max: MAX_CHAIN,
                });
            }
            if self.below.get(&child).is_none_or(|&(d, _)| d < depth) {
                self.below.insert(child.clone(), (depth, origin));
                self.below_pending.push(child);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yarl_core::Limits;

    fn q(name: &str, parent: Option<&str>) -> NewQuota {
        NewQuota {
            name: name.into(),
            limits: Limits::from_milli(1000, 0, 0).unwrap(),
            parent: parent.map(Into::into),
        }
    }

    /// Runs the check against `db` rows given as (name, parent).
    fn run(items: &[NewQuota], db: &[(&str, Option<&str>)]) -> Result<usize, StoreError> {
        let mut c = GraphCheck::new(items)?;
        let mut rounds = 0;
        while let Some(names) = c.wanted() {
            rounds += 1;
            let found = db
                .iter()
                .filter(|(n, _)| names.iter().any(|x| x == n))
                .map(|(n, p)| ((*n).to_owned(), p.map(str::to_owned)))
                .collect();
            c.supply(&names, found);
        }
        c.finish()?;
        while let Some(names) = c.wanted_children() {
            let found = db
                .iter()
                .filter(|(_, p)| p.is_some_and(|p| names.iter().any(|x| x == p)))
                .map(|(n, p)| ((*n).to_owned(), p.map(str::to_owned)))
                .collect();
            c.supply_children(found)?;
        }
        Ok(rounds)
    }

    #[test]
    fn descendants_of_a_reparented_quota_stay_within_the_chain_limit() {
        // db: r <- d1 <- d2 <- ... <- d15 (16 long). Re-parenting r under a new root makes
        // d15's chain 17: refused, naming the written item and the descendant.
        let names: Vec<String> = (1..MAX_CHAIN).map(|i| format!("d{i}")).collect();
        let mut db: Vec<(&str, Option<&str>)> = vec![("r", None)];
        for (i, n) in names.iter().enumerate() {
            db.push((n, Some(if i == 0 { "r" } else { &names[i - 1] })));
        }
        match run(&[q("top", None), q("r", Some("top"))], &db) {
            Err(StoreError::DescendantTooDeep { index: 1, name, descendant, depth, .. }) => {
                assert_eq!((name.as_str(), descendant.as_str(), depth), ("r", "d15", MAX_CHAIN + 1))
            }
            other => panic!("{other:?}"),
        }
        // Moving the lower half away first keeps every chain short enough.
        assert!(run(&[q("top", None), q("r", Some("top")), q("d8", None)], &db).is_ok());
    }

    #[test]
    fn parents_in_batch_or_db() {
        let items = [q("c", Some("b")), q("b", Some("a"))];
        assert_eq!(run(&items, &[("a", None)]).unwrap(), 1);
        match run(&items, &[]) {
            Err(StoreError::UnknownParent { index: 1, name, parent }) => {
                assert_eq!((name.as_str(), parent.as_str()), ("b", "a"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn duplicates() {
        let items = [q("a", None), q("b", None), q("a", None)];
        assert!(matches!(run(&items, &[]), Err(StoreError::Duplicate { index: 2, first: 0, .. })));
    }

    #[test]
    fn cycle_through_database_rows() {
        // db: x -> y -> z (z is a root). Re-parenting z under x closes z -> x -> y -> z.
        let db = [("x", Some("y")), ("y", Some("z")), ("z", None)];
        match run(&[q("z", Some("x"))], &db) {
            Err(StoreError::Cycle { index: 0, cycle, .. }) => {
                assert_eq!(cycle, ["z", "x", "y", "z"])
            }
            other => panic!("{other:?}"),
        }
        // Re-parenting y under a fresh root is fine.
        assert!(run(&[q("w", None), q("y", Some("w"))], &db).is_ok());
    }

    #[test]
    fn cycle_inside_batch() {
        let items = [q("a", Some("b")), q("b", Some("a"))];
        assert!(matches!(run(&items, &[]), Err(StoreError::Cycle { index: 0, .. })));
    }

    #[test]
    fn chain_depth_is_bounded() {
        let names: Vec<String> = (0..=MAX_CHAIN).map(|i| format!("q{i}")).collect();
        let mut items: Vec<NewQuota> = vec![q(&names[0], None)];
        for i in 1..MAX_CHAIN {
            items.push(q(&names[i], Some(&names[i - 1])));
        }
        assert!(run(&items, &[]).is_ok());
        items.push(q(&names[MAX_CHAIN], Some(&names[MAX_CHAIN - 1])));
        assert!(matches!(
            run(&items, &[]),
            Err(StoreError::ChainTooDeep { index, depth, .. }) if index == MAX_CHAIN && depth == MAX_CHAIN + 1
        ));
    }

    #[test]
    fn large_batch_is_linear() {
        // 200k items in chains of 10 under 20k roots: must finish quickly with no lookups.
        let mut items = Vec::new();
        for r in 0..20_000 {
            items.push(q(&format!("r{r}"), None));
            for k in 1..10 {
                let parent = if k == 1 { format!("r{r}") } else { format!("r{r}.{}", k - 1) };
                items.push(q(&format!("r{r}.{k}"), Some(&parent)));
            }
        }
        let t = std::time::Instant::now();
        assert_eq!(run(&items, &[]).unwrap(), 0);
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
