//! The key of a core's review caches, and its borrowed view: a cache hit looks the key up from
//! the request's own `&str` (the bearer token) without copying it.

/// (cluster, what was asked) -> the answer.
pub type ReviewKey = (u64, String);

/// A review key as its parts, so that a lookup borrows what was asked (`(u64, &str)`) instead
/// of copying it into a `ReviewKey` per request (maps look `&dyn KeyView` up through `Borrow`).
pub trait KeyView {
    fn parts(&self) -> (u64, &str);
}

impl KeyView for ReviewKey {
    fn parts(&self) -> (u64, &str) {
        (self.0, &self.1)
    }
}

impl KeyView for (u64, &str) {
    fn parts(&self) -> (u64, &str) {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn KeyView + 'a> for ReviewKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

// Hashes exactly as `ReviewKey`'s own `Hash` does (`(u64, &str)` and `(u64, String)` feed the
// hasher the same), as `Borrow` requires.
impl std::hash::Hash for dyn KeyView + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyView + '_ {}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_borrowed_view_finds_its_owned_key() {
        let mut map: HashMap<ReviewKey, u8> = HashMap::new();
        map.insert((7, "token".to_string()), 1);
        assert_eq!(map.get(&(7_u64, "token") as &dyn KeyView), Some(&1));
        assert_eq!(map.get(&(8_u64, "token") as &dyn KeyView), None);
        assert_eq!(map.get(&(7_u64, "other") as &dyn KeyView), None);
    }
}
