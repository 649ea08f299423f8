//! The object store: buckets of objects in memory, every size and count bounded.

use crate::error::AppError;
use bytes::Bytes;
use serde::Serialize;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::RwLock;

/// What the store holds at most; every request that would go beyond gets an error.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Buckets.
    pub max_buckets: usize,
    /// Objects in one bucket.
    pub max_objects: usize,
    /// Bytes of one object (larger bodies are refused before they are read in full).
    pub max_object_bytes: usize,
    /// Bytes of every object together.
    pub max_total_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_buckets: 100,
            max_objects: 10_000,
            max_object_bytes: 1 << 20,
            max_total_bytes: 64 << 20,
        }
    }
}

/// Longest key, in bytes (S3's limit).
pub const MAX_KEY_BYTES: usize = 1024;
/// Most keys one listing returns (S3's `max-keys` limit).
pub const MAX_LIST_KEYS: usize = 1000;

/// Whether `name` is a bucket name: 3–63 characters of lowercase letters, digits, `.` and
/// `-`, beginning and ending with a letter or digit (S3's rules, without the IP-address
/// one). Such names always make valid quota names.
pub fn valid_bucket(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-".contains(c))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
}

/// A bucket name from a request, checked.
pub fn bucket_name(name: &str) -> Result<&str, AppError> {
    if valid_bucket(name) {
        Ok(name)
    } else {
        Err(AppError::InvalidBucketName)
    }
}

/// A key from a request, checked: 1 to 1,024 bytes, no control characters.
pub fn key_name(key: &str) -> Result<&str, AppError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(AppError::InvalidKey("a key is 1 to 1024 bytes long"));
    }
    if key.chars().any(char::is_control) {
        return Err(AppError::InvalidKey("a key has no control characters"));
    }
    Ok(key)
}

#[derive(Default)]
struct Bucket {
    objects: BTreeMap<String, Bytes>,
}

#[derive(Default)]
struct State {
    buckets: BTreeMap<String, Bucket>,
    bytes: usize,
}

/// One entry of a listing.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// Its size in bytes.
    pub size: usize,
}

/// A page of a listing.
#[derive(Debug, Serialize)]
pub struct Listing {
    /// The bucket.
    pub bucket: String,
    /// The prefix asked for.
    pub prefix: String,
    /// Keys in order.
    pub keys: Vec<Entry>,
    /// Pass as `start-after` for the next page; `null` at the end.
    pub next: Option<String>,
}

/// The buckets, behind one lock (no request holds it across an await).
#[derive(Default)]
pub struct Store {
    limits: Limits,
    state: RwLock<State>,
}

impl Store {
    /// An empty store with these limits.
    pub fn new(limits: Limits) -> Self {
        Store { limits, state: RwLock::default() }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates `bucket`.
    pub fn create_bucket(&self, bucket: &str) -> Result<(), AppError> {
        let mut s = self.write();
        if s.buckets.contains_key(bucket) {
            return Err(AppError::BucketExists);
        }
        if s.buckets.len() >= self.limits.max_buckets {
            return Err(AppError::TooManyBuckets(self.limits.max_buckets));
        }
        s.buckets.insert(bucket.to_owned(), Bucket::default());
        Ok(())
    }

    /// Deletes `bucket`, which must be empty.
    pub fn delete_bucket(&self, bucket: &str) -> Result<(), AppError> {
        let mut s = self.write();
        match s.buckets.get(bucket) {
            None => Err(AppError::NoSuchBucket),
            Some(b) if !b.objects.is_empty() => Err(AppError::BucketNotEmpty),
            Some(_) => {
                s.buckets.remove(bucket);
                Ok(())
            }
        }
    }

    /// Stores `data` as `key` in `bucket`, replacing what was there.
    pub fn put(&self, bucket: &str, key: &str, data: Bytes) -> Result<(), AppError> {
        if data.len() > self.limits.max_object_bytes {
            return Err(AppError::TooLarge(self.limits.max_object_bytes));
        }
        let mut s = self.write();
        let total = s.bytes;
        let b = s.buckets.get_mut(bucket).ok_or(AppError::NoSuchBucket)?;
        let old = b.objects.get(key).map_or(0, Bytes::len);
        if !b.objects.contains_key(key) && b.objects.len() >= self.limits.max_objects {
            return Err(AppError::TooManyObjects(self.limits.max_objects));
        }
        let after = total - old + data.len();
        if after > self.limits.max_total_bytes {
            return Err(AppError::StoreFull);
        }
        b.objects.insert(key.to_owned(), data);
        s.bytes = after;
        Ok(())
    }

    /// The object `key` of `bucket`.
    pub fn get(&self, bucket: &str, key: &str) -> Result<Bytes, AppError> {
        let s = self.read();
        let b = s.buckets.get(bucket).ok_or(AppError::NoSuchBucket)?;
        b.objects.get(key).cloned().ok_or(AppError::NoSuchKey)
    }

    /// Deletes `key` from `bucket` (S3: deleting a missing key succeeds).
    pub fn delete(&self, bucket: &str, key: &str) -> Result<(), AppError> {
        let mut s = self.write();
        let b = s.buckets.get_mut(bucket).ok_or(AppError::NoSuchBucket)?;
        if let Some(old) = b.objects.remove(key) {
            s.bytes -= old.len();
        }
        Ok(())
    }

    /// Up to `max` keys of `bucket` beginning with `prefix`, after `start_after`.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        max: usize,
    ) -> Result<Listing, AppError> {
        let s = self.read();
        let b = s.buckets.get(bucket).ok_or(AppError::NoSuchBucket)?;
        let from = match start_after {
            Some(k) if k >= prefix => Bound::Excluded(k),
            _ => Bound::Included(prefix),
        };
        let mut keys = Vec::new();
        let mut next = None;
        for (k, v) in b.objects.range::<str, _>((from, Bound::Unbounded)) {
            if !k.starts_with(prefix) {
                break;
            }
            if keys.len() == max {
                next = keys.last().map(|e: &Entry| e.key.clone());
                break;
            }
            keys.push(Entry { key: k.clone(), size: v.len() });
        }
        Ok(Listing { bucket: bucket.to_owned(), prefix: prefix.to_owned(), keys, next })
    }

    /// Buckets held.
    pub fn bucket_count(&self) -> usize {
        self.read().buckets.len()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.read().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Store {
        Store::new(Limits {
            max_buckets: 2,
            max_objects: 3,
            max_object_bytes: 10,
            max_total_bytes: 25,
        })
    }

    #[test]
    fn bucket_names() {
        for ok in ["abc", "photos", "my-bucket.v2", "a1b", &"x".repeat(63)] {
            assert!(valid_bucket(ok), "{ok}");
        }
        for bad in ["", "ab", "Photos", "-abc", "abc-", "a..b", "a_b", "a/b", &"x".repeat(64)] {
            assert!(!valid_bucket(bad), "{bad}");
        }
    }

    #[test]
    fn keys() {
        assert!(key_name("a/b/c.jpg").is_ok());
        assert!(key_name("").is_err());
        assert!(key_name(&"k".repeat(1025)).is_err());
        assert!(key_name(&"k".repeat(1024)).is_ok());
        assert!(key_name("a\nb").is_err());
    }

    #[test]
    fn counts_and_sizes_are_bounded() {
        let s = small();
        s.create_bucket("one").unwrap();
        assert!(matches!(s.create_bucket("one"), Err(AppError::BucketExists)));
        s.create_bucket("two").unwrap();
        assert!(matches!(s.create_bucket("three"), Err(AppError::TooManyBuckets(2))));
        assert!(matches!(s.put("nope", "k", Bytes::new()), Err(AppError::NoSuchBucket)));
        assert!(matches!(s.put("one", "k", Bytes::from(vec![0; 11])), Err(AppError::TooLarge(10))));
        for k in ["a", "b", "c"] {
            s.put("one", k, Bytes::from(vec![0; 8])).unwrap();
        }
        assert!(matches!(s.put("one", "d", Bytes::new()), Err(AppError::TooManyObjects(3))));
        // Replacing an object is not a new one; its old size is given back.
        s.put("one", "a", Bytes::from(vec![0; 1])).unwrap();
        assert_eq!(s.bytes(), 17);
        assert!(matches!(s.put("two", "x", Bytes::from(vec![0; 9])), Err(AppError::StoreFull)));
        s.put("two", "x", Bytes::from(vec![0; 8])).unwrap();
        assert!(matches!(s.delete_bucket("one"), Err(AppError::BucketNotEmpty)));
        s.delete("one", "a").unwrap();
        s.delete("one", "a").unwrap();
        assert_eq!(s.bytes(), 24);
        assert!(matches!(s.get("one", "a"), Err(AppError::NoSuchKey)));
        assert_eq!(s.get("one", "b").unwrap().len(), 8);
    }

    #[test]
    fn listings_page_by_prefix() {
        let s = Store::new(Limits::default());
        s.create_bucket("b01").unwrap();
        for k in ["a/1", "a/2", "a/3", "b/1", "c"] {
            s.put("b01", k, Bytes::from_static(b"xy")).unwrap();
        }
        let l = s.list("b01", "a/", None, 2).unwrap();
        assert_eq!(
            l.keys,
            vec![Entry { key: "a/1".into(), size: 2 }, Entry { key: "a/2".into(), size: 2 }]
        );
        assert_eq!(l.next.as_deref(), Some("a/2"));
        let l = s.list("b01", "a/", l.next.as_deref(), 2).unwrap();
        assert_eq!(l.keys.len(), 1);
        assert_eq!(l.next, None);
        assert_eq!(s.list("b01", "", Some("b/1"), 10).unwrap().keys.len(), 1);
        assert_eq!(s.list("b01", "zzz", None, 10).unwrap().keys.len(), 0);
        assert_eq!(s.list("b01", "", None, 10).unwrap().keys.len(), 5);
    }
}
