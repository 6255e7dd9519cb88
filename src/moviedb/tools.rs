//! The movie tools as MCP tools: recommend by mood, summarize reviews, add to and read the watch
//! list. Each reads like the business rule it implements; asking the user, rounds and state are
//! the engine's business.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::catalogue::{AddError, Catalogue};
use super::model::{Id, Mood, MovieSummary, Title, WatchStatus, WatchlistItem};
use super::summarizer::{LentModel, Summarizer};
use super::summary::{self, MIN_REVIEWS_FOR_SUMMARY, ReviewSummary};
use crate::auth::{READ_SCOPE, WRITE_SCOPE};
use crate::mrtr::{HandlerError, RequestContext};
use crate::protocol::content::CallToolResult;
use crate::protocol::input::{Elicitation, Sampling, SamplingParams};
use crate::registry::{NoArguments, Registry, Tool};
use mcp_mrtr::log_budget::LogBudget;

/// The question `addToWatchlist` asks when the agent gave no status.
pub const STATUS_QUESTION: &str =
    "Have you already watched this title, or is it one to watch later?";

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MoodQuery {
    /// The mood to match: COMFORT, ADVENTURE, ROMANCE, HORROR, THOUGHTFUL or COMEDY.
    pub mood: Mood,
    /// Optional, false when left out or null. True drops the movies the signed-in user marked
    /// WATCHED; set it only when the user asks to skip what they have already seen.
    #[schemars(extend("default" = false))]
    pub exclude_watched: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RecommendArgs {
    /// What to recommend for: a mood, and whether to leave out what the user already watched.
    pub input: MoodQuery,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Recommendations<'a> {
    /// Highest rating first, equal ratings by id.
    pub movies: &'a [MovieSummary],
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SummarizeArgs {
    /// The movie's id as the other tools give it, a string of digits such as "97".
    pub movie_id: Id,
}

/// Exactly one of `movieId` and `tvShowId`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    /// The movie's id, a string of digits such as "97".
    pub movie_id: Option<Id>,
    /// The TV show's id, a string of digits such as "3".
    pub tv_show_id: Option<Id>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AddArgs {
    /// The title to add: exactly one of movieId or tvShowId.
    pub subject: Subject,
    /// Optional starting status, WANT_TO_WATCH or WATCHED. Leave it out to let the user say;
    /// WANT_TO_WATCH is recorded when they do not.
    pub status: Option<WatchStatus>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SavedItem {
    /// The watch-list item's id.
    pub id: Id,
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

const RECOMMEND_DESCRIPTION: &str = "Suggests movies that suit a mood, for light recommendation \
requests an agent makes on a user's behalf. Returns up to 20 movies, highest rating first, equal \
ratings ordered by id: calling again gives the same list in the same order, so an agent that retries \
does not see it reshuffle.";

const SUMMARIZE_DESCRIPTION: &str = "Summarizes what reviewers said about one movie: how many \
reviews there are, their average score (1 to 10), a short summary and recurring themes. It always \
answers with a summary object. With fewer than three reviews `summary` is null: read `reviewCount` \
to see how many there are. An unknown movie id answers `reviewCount: 0`, not an error. Call it once \
the user has settled on a movie they care about, not speculatively across many movies.";

const ADD_DESCRIPTION: &str = "Puts a movie or TV show on the signed-in user's watch list. Give \
exactly one of subject.movieId and subject.tvShowId, never both. status is optional: without it the \
user is asked whether they already watched the title, and WANT_TO_WATCH is recorded when no answer \
comes. A title already on the list fails with an \"already in your watch list\" error: treat that as \
done, not as a failure to retry.";

const WATCHLIST_DESCRIPTION: &str = "Lists the signed-in user's watch list, newest first.";

/// A line per failed sampling request: a client can fail every one.
static CLIENT_MODEL_FAILURES: LogBudget = LogBudget::new("client_model_failed");

/// The behaviour hints every movie tool shares: none destroys anything, repeating a call changes
/// nothing more, and none reaches beyond the catalogue.
fn hints(title: &str, read_only: bool) -> serde_json::Value {
    json!({
        "title": title,
        "readOnlyHint": read_only,
        "destructiveHint": false,
        "idempotentHint": true,
        "openWorldHint": false,
    })
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
                RECOMMEND_DESCRIPTION,
                move |ctx, args: RecommendArgs| recommend(for_recommend.clone(), ctx, args),
            )
            .title("Recommend Movies For Mood")
            .requires_scope(READ_SCOPE)
            .output::<Recommendations<'static>>()
            .annotations(hints("Recommend Movies For Mood", true)),
        )
        .add_tool(
            Tool::new(
                "summarizeMovieReviews",
                SUMMARIZE_DESCRIPTION,
                move |ctx, args: SummarizeArgs| {
                    summarize(for_summary.clone(), summarizer.clone(), ctx, args)
                },
            )
            .title("Summarize Movie Reviews")
            .requires_scope(READ_SCOPE)
            .output::<ReviewSummary>()
            .annotations(hints("Summarize Movie Reviews", true)),
        )
        .add_tool(
            Tool::new(
                "addToWatchlist",
                ADD_DESCRIPTION,
                move |ctx, args: AddArgs| add_to_watchlist(for_add.clone(), ctx, args),
            )
            .title("Add To Watchlist")
            .requires_scope(WRITE_SCOPE)
            .output::<SavedItem>()
            .annotations(hints("Add To Watchlist", false)),
        )
        .add_tool(
            Tool::new(
                "getWatchlist",
                WATCHLIST_DESCRIPTION,
                move |ctx, _: NoArguments| get_watchlist(catalogue.clone(), ctx),
            )
            .title("Show My Watchlist")
            .requires_scope(READ_SCOPE)
            .output::<Watchlist>()
            .annotations(hints("Show My Watchlist", true)),
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
    let watched_by = if args.input.exclude_watched.unwrap_or(false) {
        ctx.principal().user()
    } else {
        None
    };
    let movies = catalogue
        .recommend(args.input.mood, watched_by)
        .await
        .map_err(internal)?;
    Ok(CallToolResult::structured(&Recommendations {
        movies: &movies,
    }))
}

async fn summarize(
    catalogue: Arc<Catalogue>,
    summarizer: Arc<Summarizer>,
    ctx: RequestContext,
    args: SummarizeArgs,
) -> Result<CallToolResult, HandlerError> {
    let movie_id = args.movie_id.0;
    ctx.progress(0.0, Some(1.0), Some("Loading reviews")).await;
    let reviews = catalogue.reviews(movie_id).await.map_err(internal)?;
    if reviews.len() < MIN_REVIEWS_FOR_SUMMARY {
        // Counts only: nothing slow follows, so no further checkpoints.
        return Ok(CallToolResult::structured(&summary::summarize(
            movie_id, &reviews,
        )));
    }
    ctx.progress(0.4, Some(1.0), Some("Summarizing")).await;
    // A client that answers live and offers sampling (a 2025-11-25 session) lends its own model;
    // 2026-07-28 clients are not asked: that revision leaves model calls to servers.
    let client_model = ClientModel(&ctx);
    let lent: Option<&dyn LentModel> =
        (ctx.answers_live() && ctx.capabilities().sampling).then_some(&client_model);
    let plan = summarizer.plan(movie_id, &reviews, lent);
    // A provider call may take seconds: a client that takes tasks gets one and polls for it.
    if summarizer.calls_provider(&plan).await {
        ctx.continue_as_task()?;
    }
    let summary = summarizer.summarize(plan).await.map_err(internal)?;
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
                if let Some(held_back) = CLIENT_MODEL_FAILURES.take() {
                    tracing::info!(held_back, "the client's model did not summarize: {why}");
                }
                None
            }
            _ => None,
        }
    }

    fn lender(&self) -> Option<String> {
        self.0.principal().user().map(str::to_owned)
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
        (Some(Id(id)), None) => Title::Movie(id),
        (None, Some(Id(id))) => Title::TvShow(id),
        _ => {
            return Ok(CallToolResult::error(
                "Give exactly one of subject.movieId and subject.tvShowId.",
            ));
        }
    };
    // Checked once, before the question (no question about a title that does not exist or is
    // already listed); after the answer, the insert itself refuses a title listed or deleted in
    // the meantime.
    let on_list = ctx
        .remember("title", || async {
            catalogue.on_list(&user, title).await.map_err(internal)
        })
        .await?;
    let Some(name) = on_list.name else {
        return Ok(no_such(title));
    };
    if on_list.listed {
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
        Err(AddError::NoSuchTitle(title)) => Ok(no_such(title)),
        Err(e) => Err(internal(e)),
    }
}

fn no_such(title: Title) -> CallToolResult {
    CallToolResult::error(format!("There is no {}.", title.describe()))
}

/// Asks whether the user already watched the title; any answer but an accepted status (decline,
/// cancel, an empty form, no elicitation support) means WANT_TO_WATCH. A status the form does not
/// offer never gets here: the engine refuses it (-32602) and the question stands.
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
