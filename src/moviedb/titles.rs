//! The titles of movies and shows, kept in memory. A title never changes once written (the
//! server renames and deletes nothing), so a copy answers without asking the database; a title
//! not in the copy (added since, by `seed` or another process) is looked up and then kept.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use super::model::Title;

#[derive(Default)]
pub struct Titles(RwLock<HashMap<Title, String>>);

impl Titles {
    pub fn get(&self, title: Title) -> Option<String> {
        let titles = self.0.read().unwrap_or_else(PoisonError::into_inner);
        titles.get(&title).cloned()
    }

    pub fn keep(&self, found: impl IntoIterator<Item = (Title, String)>) {
        let mut titles = self.0.write().unwrap_or_else(PoisonError::into_inner);
        titles.extend(found);
    }
}
