//! The nouns of the movie domain: moods, watch statuses, titles, reviews and watch-list items.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The moods a viewer can ask recommendations for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mood {
    Comfort,
    Adventure,
    Romance,
    Horror,
    Thoughtful,
    Comedy,
}

impl Mood {
    pub const ALL: [Mood; 6] = [
        Self::Comfort,
        Self::Adventure,
        Self::Romance,
        Self::Horror,
        Self::Thoughtful,
        Self::Comedy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Comfort => "COMFORT",
            Self::Adventure => "ADVENTURE",
            Self::Romance => "ROMANCE",
            Self::Horror => "HORROR",
            Self::Thoughtful => "THOUGHTFUL",
            Self::Comedy => "COMEDY",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|mood| mood.as_str() == name)
    }
}

/// Where a title stands on a viewer's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WatchStatus {
    WantToWatch,
    Watched,
}

impl WatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WantToWatch => "WANT_TO_WATCH",
            Self::Watched => "WATCHED",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "WANT_TO_WATCH" => Some(Self::WantToWatch),
            "WATCHED" => Some(Self::Watched),
            _ => None,
        }
    }
}

/// A movie or a TV show, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Title {
    Movie(i64),
    TvShow(i64),
}

impl Title {
    pub fn describe(self) -> String {
        match self {
            Self::Movie(id) => format!("movie {id}"),
            Self::TvShow(id) => format!("TV show {id}"),
        }
    }
}

/// A movie as recommendations list it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MovieSummary {
    pub id: i64,
    pub title: String,
    pub release_year: i64,
    pub genre: String,
    pub rating: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Review {
    pub score: i64,
    pub comment: String,
    pub author: String,
}

/// The title of a watch-list item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemContent {
    pub title: String,
    /// `movie` or `tvShow`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The movie's or show's id.
    pub id: i64,
}

/// One entry of a viewer's watch list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchlistItem {
    pub id: i64,
    pub status: WatchStatus,
    /// When it was added, RFC 3339.
    pub added_at: String,
    pub content: ItemContent,
}
