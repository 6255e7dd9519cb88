//! Review summaries computed on the server: the average score, a sentence from the average's band
//! (favourable above 7, unfavourable below 5, split otherwise) and up to five recurring themes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::model::{Id, Review};

/// What `summarizeMovieReviews` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReviewSummary {
    pub movie_id: Id,
    pub review_count: i64,
    /// A one-sentence summary; null with fewer than three reviews, or when the LLM's answer had
    /// no summary line.
    pub summary: Option<String>,
    /// Recurring themes of the reviews (at most five).
    pub themes: Vec<String>,
    /// Mean score on the 1–10 scale, two decimals; null without reviews.
    pub average_score: Option<f64>,
}

/// Fewest reviews worth summarizing.
pub const MIN_REVIEWS_FOR_SUMMARY: usize = 3;
const MAX_THEMES: usize = 5;

/// Themes and the words that reveal them in a comment: a word of the comment that begins with
/// one of them ("cast" in "casting", not in "forecast").
const THEMES: [(&str, &[&str]); 12] = [
    (
        "performances",
        &["performance", "acting", "cast", "actor", "actress"],
    ),
    ("story", &["story", "plot", "narrative"]),
    ("pacing", &["pacing", "pace", "slow", "runtime", "drags"]),
    ("music", &["soundtrack", "music", "song", "composer"]),
    (
        "visuals",
        &[
            "cinematography",
            "visual",
            "photography",
            "effects",
            "shot",
            "look",
        ],
    ),
    ("ending", &["ending", "finale", "climax"]),
    (
        "dialogue",
        &["dialogue", "script", "writing", "screenplay", "lines"],
    ),
    ("characters", &["character"]),
    ("humor", &["humor", "humour", "funny", "jokes", "laugh"]),
    (
        "atmosphere",
        &["atmosphere", "tension", "dread", "scary", "suspense"],
    ),
    ("direction", &["direction", "director", "directed"]),
    ("twist", &["twist"]),
];

/// Mean score, as computed.
fn mean(reviews: &[Review]) -> Option<f64> {
    if reviews.is_empty() {
        return None;
    }
    Some(reviews.iter().map(|r| r.score as f64).sum::<f64>() / reviews.len() as f64)
}

/// Mean score, rounded half up to two decimals.
pub fn average_score(reviews: &[Review]) -> Option<f64> {
    mean_in(reviews, 100)
}

/// The mean score in units of `1 / per_unit`, rounded half up from the exact fraction (as a
/// float, 1.025 is a hair below itself and would round down), back as a number of units.
fn mean_in(reviews: &[Review], per_unit: i128) -> Option<f64> {
    let count = i128::try_from(reviews.len())
        .ok()
        .filter(|count| *count > 0)?;
    let sum: i128 = reviews.iter().map(|review| i128::from(review.score)).sum();
    let units = (2 * sum * per_unit + count).div_euclid(2 * count);
    Some(units as f64 / per_unit as f64)
}

/// The sentence for a mean score: its band is the unrounded mean's (7.004 is above 7), and it
/// shows one decimal rounded half up (7.25 reads 7.3; a formatter would round it to even).
fn band_sentence(reviews: &[Review]) -> Option<String> {
    let mean = mean(reviews)?;
    let verdict = if mean > 7.0 {
        "Reviewers are largely favourable"
    } else if mean < 5.0 {
        "Reviewers are largely unfavourable"
    } else {
        "Reviewers are split"
    };
    let shown = mean_in(reviews, 10)?;
    let count = reviews.len();
    Some(format!(
        "{verdict}, with an average score of {shown:.1}/10 across {count} reviews."
    ))
}

/// Up to five themes, the most often mentioned first (counted once per review).
pub fn themes(reviews: &[Review]) -> Vec<String> {
    let comments: Vec<Vec<String>> = reviews
        .iter()
        .map(|review| {
            review
                .comment
                .to_lowercase()
                .split(|c: char| !c.is_alphabetic())
                .filter(|word| !word.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect();
    let mut counted: Vec<(usize, usize, &str)> = THEMES
        .iter()
        .enumerate()
        .map(|(order, (theme, stems))| {
            let mentions = comments
                .iter()
                .filter(|words| {
                    words
                        .iter()
                        .any(|word| stems.iter().any(|stem| word.starts_with(stem)))
                })
                .count();
            (mentions, order, *theme)
        })
        .filter(|(mentions, _, _)| *mentions > 0)
        .collect();
    counted.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    counted
        .into_iter()
        .take(MAX_THEMES)
        .map(|(_, _, theme)| theme.to_owned())
        .collect()
}

/// The whole server-side summary of a movie's reviews.
pub fn summarize(movie_id: i64, reviews: &[Review]) -> ReviewSummary {
    let (summary, themes) = words(reviews);
    ReviewSummary {
        summary,
        themes,
        ..counts(movie_id, reviews)
    }
}

/// The counts of a movie's reviews and their average, without words: what every summary holds,
/// whoever writes its sentence and themes.
pub fn counts(movie_id: i64, reviews: &[Review]) -> ReviewSummary {
    ReviewSummary {
        movie_id: Id(movie_id),
        review_count: reviews.len() as i64,
        summary: None,
        themes: Vec::new(),
        average_score: average_score(reviews),
    }
}

/// The server's words for `reviews`: the sentence of the average's band and the themes; none
/// below [`MIN_REVIEWS_FOR_SUMMARY`] reviews.
pub fn words(reviews: &[Review]) -> (Option<String>, Vec<String>) {
    if reviews.len() >= MIN_REVIEWS_FOR_SUMMARY {
        (band_sentence(reviews), themes(reviews))
    } else {
        (None, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(score: i64, comment: &str) -> Review {
        Review {
            score,
            comment: comment.into(),
            author: "t".into(),
        }
    }

    /// Reviews with these scores.
    fn scored(scores: &[i64]) -> Vec<Review> {
        scores.iter().map(|score| review(*score, "ok")).collect()
    }

    #[test]
    fn the_band_follows_the_average() {
        let band = |scores: &[i64]| band_sentence(&scored(scores)).unwrap_or_default();
        assert!(band(&[7, 8]).contains("favourable"));
        assert!(!band(&[7, 8]).contains("unfavourable"));
        assert!(band(&[5, 5, 5, 5, 5, 5, 5, 5, 5, 4]).contains("unfavourable"));
        assert!(band(&[7, 7, 7]).contains("split"));
        assert!(band(&[5, 5, 5]).contains("split"));
    }

    #[test]
    fn the_average_rounds_half_up_from_the_exact_mean() {
        // 41/40 = 1.025 and 169/40 = 4.225: as floats a hair below, they would round down.
        let mut low = vec![1; 39];
        low.push(2);
        let mut middle = vec![4; 31];
        middle.extend([5; 9]);
        for (scores, average, shown) in [
            (low, 1.03, "1.0/10"),
            (middle, 4.23, "4.2/10"),
            (
                vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2],
                1.05,
                "1.1/10",
            ),
        ] {
            let summary = summarize(1, &scored(&scores));
            assert_eq!(summary.average_score, Some(average), "{scores:?}");
            let sentence = summary.summary.unwrap_or_default();
            assert!(sentence.contains(shown), "{sentence}");
        }
    }

    #[test]
    fn the_band_is_the_unrounded_means_and_the_sentence_rounds_half_up() {
        // 249 sevens and an eight: 7.004, shown as 7.0 yet above 7.
        let mut reviews = vec![review(7, "fine"); 249];
        reviews.push(review(8, "good"));
        let summary = summarize(1, &reviews);
        assert_eq!(summary.average_score, Some(7.0));
        let sentence = summary.summary.unwrap_or_default();
        assert!(sentence.contains("largely favourable"), "{sentence}");
        assert!(sentence.contains("7.0/10"), "{sentence}");
        let quarter = summarize(
            1,
            &[
                review(7, "a"),
                review(7, "b"),
                review(7, "c"),
                review(8, "d"),
            ],
        );
        assert_eq!(quarter.average_score, Some(7.25));
        let sentence = quarter.summary.unwrap_or_default();
        assert!(sentence.contains("7.3/10"), "{sentence}");
    }

    #[test]
    fn few_reviews_get_an_average_but_no_summary() {
        let two = [review(8, "Great acting"), review(6, "Slow pacing")];
        let summary = summarize(9, &two);
        assert_eq!(
            (summary.review_count, summary.average_score, summary.summary),
            (2, Some(7.0), None)
        );
        assert!(summary.themes.is_empty());
        assert_eq!(summarize(9, &[]).average_score, None);
    }

    #[test]
    fn a_theme_needs_a_word_that_begins_with_its_stem() {
        let themes_of = |comment: &str| themes(&[review(7, comment)]);
        assert_eq!(themes_of("The casting is perfect."), ["performances"]);
        assert_eq!(
            themes_of("Characters you believe; songs you hum."),
            ["music", "characters"]
        );
        assert!(themes_of("A forecast of rain in a space station.").is_empty());
        assert!(themes_of("Follow the guidelines for the broadcast.").is_empty());
    }

    #[test]
    fn themes_are_ranked_by_mentions() {
        let reviews = [
            review(9, "The soundtrack soars and the acting is superb."),
            review(8, "Superb performances, and what an ending."),
            review(4, "Great cast, but the pacing drags."),
        ];
        let summary = summarize(1, &reviews);
        assert_eq!(
            summary.themes.first().map(String::as_str),
            Some("performances")
        );
        assert!(summary.themes.contains(&"music".to_owned()));
        assert!(summary.themes.len() <= 5);
        assert!(summary.summary.unwrap().contains("split"));
    }
}
