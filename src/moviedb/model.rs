//! The nouns of the movie domain: ids, moods, watch statuses, titles, reviews and watch-list
//! items.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Unexpected, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The id of a movie, a TV show or a watch-list item. The database numbers rows; clients see ids
/// as strings (the course's GraphQL `ID`). Like GraphQL's `ID`, input takes a string of digits or
/// a non-negative integer, so clients that learned integers keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub i64);

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(IdVisitor)
    }
}

struct IdVisitor;

impl Visitor<'_> for IdVisitor {
    type Value = Id;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an id: a string of digits such as \"97\"")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Id, E> {
        let digits_only = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        match text.parse() {
            Ok(id) if digits_only => Ok(Id(id)),
            _ => Err(E::invalid_value(Unexpected::Str(text), &self)),
        }
    }

    fn visit_i64<E: de::Error>(self, number: i64) -> Result<Id, E> {
        if number < 0 {
            return Err(E::invalid_value(Unexpected::Signed(number), &self));
        }
        Ok(Id(number))
    }

    fn visit_u64<E: de::Error>(self, number: u64) -> Result<Id, E> {
        i64::try_from(number)
            .map(Id)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(number), &self))
    }
}

impl JsonSchema for Id {
    fn schema_name() -> Cow<'static, str> {
        "Id".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "pattern": "^[0-9]+$"})
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// How many movies one recommendation returns.
pub const RECOMMENDATION_LIMIT: usize = 20;

/// A movie as recommendations list it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MovieSummary {
    pub id: Id,
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
    pub id: Id,
}

/// One entry of a viewer's watch list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchlistItem {
    pub id: Id,
    pub status: WatchStatus,
    /// When it was added, RFC 3339.
    pub added_at: String,
    pub content: ItemContent,
}
