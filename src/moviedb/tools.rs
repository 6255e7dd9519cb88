//! The movie tools as MCP tools: recommend by mood, summarize reviews, add to and read the watch
//! list. Each reads like the business rule it implements; asking the user, rounds and state are
//! the engine's business.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::catalogue::{AddError, Catalogue};
use super::model::{Mood, MovieSummary, Title, WatchStatus, WatchlistItem};
use super::summarizer::{LentModel, Summarizer};
use super::summary::ReviewSummary;
use crate::mrtr::{HandlerError, RequestContext};
use crate::protocol::content::CallToolResult;
use crate::protocol::input::{Elicitation, Sampling, SamplingParams};
use crate::registry::{NoArguments, Registry, Tool};

/// The question `addToWatchlist` asks when the agent gave no status.
pub const STATUS_QUESTION: &str =
    "Have you already watched this title, or is it one to watch later?";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoodQuery {
    /// The mood to match.
    pub mood: Mood,
    /// Leave out titles the signed-in user marked WATCHED (default false).
    #[serde(default)]
    pub exclude_watched: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RecommendArgs {
    pub input: MoodQuery,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Recommendations {
    /// Best rated first.
    pub movies: Vec<MovieSummary>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SummarizeArgs {
    /// The movie whose reviews to summarize.
    pub movie_id: i64,
}

/// Exactly one of `movieId` and `tvShowId`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    pub movie_id: Option<i64>,
    pub tv_show_id: Option<i64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AddArgs {
    /// The title to add: give exactly one of movieId and tvShowId.
    pub subject: Subject,
    /// WANT_TO_WATCH or WATCHED. When omitted the user is asked (if the client can ask).
    pub status: Option<WatchStatus>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SavedItem {
    pub id: i64,
    pub status: WatchStatus,
    pub content: SavedContent,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SavedContent {
    pub title: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Watchlist {
    /// Newest first.
    pub items: Vec<WatchlistItem>,
}

/// Registers the movie tools on `registry`; review summaries are written by `summarizer`.
pub fn register(registry: &mut Registry, catalogue: Arc<Catalogue>, summarizer: Arc<Summarizer>) {
    let for_recommend = catalogue.clone();
    let for_summary = catalogue.clone();
    let for_add = catalogue.clone();
    registry
        .add_tool(
            Tool::new(
                "recommendMoviesForMood",
                "Recommends up to 20 movies that fit a mood (COMFORT, ADVENTURE, ROMANCE, HORROR, THOUGHTFUL or COMEDY), \
                 best rated first. With excludeWatched, leaves out what the signed-in user has already watched.",
                move |ctx, args: RecommendArgs| recommend(for_recommend.clone(), ctx, args),
            )
            .title("Recommend movies for a mood")
            .output::<Recommendations>()
            .annotations(json!({ "readOnlyHint": true, "openWorldHint": false })),
        )
        .add_tool(
            Tool::new(
                "summarizeMovieReviews",
                "Summarizes what reviewers said about a movie: review count, average score (1-10), a one-sentence \
                 summary and recurring themes. Movies with fewer than three reviews get counts only.",
                move |ctx, args: SummarizeArgs| {
                    summarize(for_summary.clone(), summarizer.clone(), ctx, args)
                },
            )
            .title("Summarize movie reviews")
            .output::<ReviewSummary>()
            .annotations(json!({ "readOnlyHint": true, "openWorldHint": false })),
        )
        .add_tool(
            Tool::new(
                "addToWatchlist",
                "Adds a movie or TV show to the signed-in user's watch list. Give subject.movieId or subject.tvShowId, \
                 and status if known; without a status the user is asked whether they already watched it \
                 (WANT_TO_WATCH when they do not answer).",
                move |ctx, args: AddArgs| add_to_watchlist(for_add.clone(), ctx, args),
            )
            .title("Add to watch list")
            .output::<SavedItem>()
            .annotations(json!({ "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false })),
        )
        .add_tool(
            Tool::new(
                "getWatchlist",
                "Lists the signed-in user's watch list, newest first.",
                move |ctx, _: NoArguments| get_watchlist(catalogue.clone(), ctx),
            )
            .title("Show my watch list")
            .output::<Watchlist>()
            .annotations(json!({ "readOnlyHint": true, "openWorldHint": false })),
        );
}

fn internal(e: impl Into<anyhow::Error>) -> HandlerError {
    HandlerError::Internal(e.into())
}

async fn recommend(
    catalogue: Arc<Catalogue>,
    ctx: RequestContext,
    args: RecommendArgs,
) -> Result<CallToolResult, HandlerError> {
    let watched_by = if args.input.exclude_watched {
        ctx.principal().user()
    } else {
        None
    };
    let movies = catalogue
        .recommend(args.input.mood, watched_by)
        .await
        .map_err(internal)?;
    Ok(CallToolResult::structured(&Recommendations { movies }))
}

async fn summarize(
    catalogue: Arc<Catalogue>,
    summarizer: Arc<Summarizer>,
    ctx: RequestContext,
    args: SummarizeArgs,
) -> Result<CallToolResult, HandlerError> {
    ctx.progress(0.0, Some(1.0), Some("Loading reviews")).await;
    let reviews = catalogue.reviews(args.movie_id).await.map_err(internal)?;
    ctx.progress(0.4, Some(1.0), Some("Summarizing")).await;
    // A legacy client that offers sampling lends its own model (2026-07-28 clients are not asked:
    // that revision leaves model calls to servers).
    let client_model = ClientModel(&ctx);
    let lent: Option<&dyn LentModel> =
        (ctx.is_legacy() && ctx.capabilities().sampling).then_some(&client_model);
    let summary = summarizer
        .summarize(args.movie_id, &reviews, lent)
        .await
        .map_err(internal)?;
    ctx.progress(1.0, Some(1.0), Some("Done")).await;
    Ok(CallToolResult::structured(&summary))
}

/// The client's model, reached through sampling.
struct ClientModel<'a>(&'a RequestContext);

#[async_trait::async_trait]
impl LentModel for ClientModel<'_> {
    async fn complete(&self, instructions: &str, prompt: &str, max_tokens: u32) -> Option<String> {
        let params = SamplingParams::user_text(prompt, max_tokens).with_system_prompt(instructions);
        match self.0.sample("review_summary", params).await {
            Ok(Sampling::Reply(reply)) if !reply.text.trim().is_empty() => Some(reply.text),
            Ok(Sampling::Failed(why)) => {
                tracing::info!("the client's model did not summarize: {why}");
                None
            }
            _ => None,
        }
    }
}

async fn add_to_watchlist(
    catalogue: Arc<Catalogue>,
    ctx: RequestContext,
    args: AddArgs,
) -> Result<CallToolResult, HandlerError> {
    let Some(user) = ctx.principal().user().map(str::to_owned) else {
        return Ok(CallToolResult::error(
            "Sign in to use your watch list: send an Authorization: Bearer token (see `moviedb-mcp token --user NAME`).",
        ));
    };
    let title = match (args.subject.movie_id, args.subject.tv_show_id) {
        (Some(id), None) => Title::Movie(id),
        (None, Some(id)) => Title::TvShow(id),
        _ => {
            return Ok(CallToolResult::error(
                "Give exactly one of subject.movieId and subject.tvShowId.",
            ));
        }
    };
    // Check before asking: no question about a title that does not exist or is already listed.
    let name = ctx
        .remember("title", || async {
            catalogue.title_of(title).await.map_err(internal)
        })
        .await?;
    let Some(name) = name else {
        return Ok(CallToolResult::error(format!(
            "There is no {}.",
            title.describe()
        )));
    };
    if catalogue.is_listed(&user, title).await.map_err(internal)? {
        return Ok(CallToolResult::error(format!(
            "\"{name}\" is already in your watch list."
        )));
    }
    let status = match args.status {
        Some(status) => status,
        None => ask_status(&ctx).await?,
    };
    match catalogue
        .add_to_watchlist(&user, title, &name, status)
        .await
    {
        Ok(item) => Ok(CallToolResult::structured(&SavedItem {
            id: item.id,
            status: item.status,
            content: SavedContent { title: name },
        })),
        Err(AddError::AlreadyListed(what)) => Ok(CallToolResult::error(format!(
            "{what} is already in your watch list."
        ))),
        Err(e) => Err(internal(e)),
    }
}

/// Asks whether the user already watched the title; any answer but an accepted, valid status
/// (decline, cancel, an empty or invalid form, no elicitation support) means WANT_TO_WATCH.
async fn ask_status(ctx: &RequestContext) -> Result<WatchStatus, HandlerError> {
    let form = json!({
        "type": "object",
        "properties": {
            "status": {
                "type": "string",
                "title": "Status",
                "oneOf": [
                    { "const": "WANT_TO_WATCH", "title": "Want to watch" },
                    { "const": "WATCHED", "title": "Already watched" }
                ]
            }
        },
        "required": ["status"]
    });
    let answer = ctx.elicit("status", STATUS_QUESTION, form).await?;
    Ok(match answer {
        Elicitation::Accepted(content) => content
            .get("status")
            .and_then(|s| s.as_str())
            .and_then(WatchStatus::parse)
            .unwrap_or(WatchStatus::WantToWatch),
        Elicitation::Declined | Elicitation::Cancelled | Elicitation::Unsupported => {
            WatchStatus::WantToWatch
        }
    })
}

async fn get_watchlist(
    catalogue: Arc<Catalogue>,
    ctx: RequestContext,
) -> Result<CallToolResult, HandlerError> {
    let Some(user) = ctx.principal().user() else {
        return Ok(CallToolResult::error(
            "Sign in to see your watch list: send an Authorization: Bearer token.",
        ));
    };
    let items = catalogue.watchlist(user).await.map_err(internal)?;
    Ok(CallToolResult::structured(&Watchlist { items }))
}
