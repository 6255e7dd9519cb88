//! Who writes review summaries: an LLM provider the server calls itself (MCP 2026-07-28
//! deprecates sampling and leaves model calls to servers), a model a legacy client lends through
//! sampling, or the server's own rules.
//!
//! Without a provider or a lent model, the rules of [`crate::moviedb::summary`] write the summary.
//! Otherwise movies with three or more reviews are summarized by the model, through the summary
//! cache: one provider call per movie and review set, shared by concurrent callers and, with
//! Redis, by replicas (a client's lent model is asked by each of that client's calls that finds
//! nothing cached). When the model fails (an HTTP error, a timeout, a refusal, no connection, a client
//! that says no) the call still succeeds with the next source down (the provider after a lent
//! model, then the server-side summary), the log says why, and that fallback is cached only
//! briefly so a recovered model is soon used again. Our own mistakes are not hidden behind the
//! fallback: they fail the call.

mod cache;
mod config;
mod prompt;
mod provider;

pub use config::LlmArgs;

use std::sync::Arc;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use self::cache::{Found, Keep, SummaryCache, SummaryKey};
use self::config::CacheLifetimes;
use self::provider::{Provider, ProviderError, ProviderFailure};
use super::catalogue;
use super::model::Review;
use super::summary::{self, MIN_REVIEWS_FOR_SUMMARY, ReviewSummary};
use crate::store::RedisStoreConfig;
use mcp_mrtr::log_budget::LogBudget;
use tracing::Instrument as _;

/// The words of a summary, the part a summarizer writes: one sentence and the themes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryText {
    pub summary: Option<String>,
    pub themes: Vec<String>,
}

/// Writes review summaries: the provider when one is configured, a model the client lends when
/// a legacy client offers sampling, and the server's own rules otherwise and as the fallback.
pub struct Summarizer {
    /// Shared with the summaries in flight, which outlive any one caller.
    provider: Option<Arc<Provider>>,
    cache: SummaryCache,
    lifetimes: CacheLifetimes,
}

/// A model the client lends through sampling (2025-11-25 clients that declared it).
#[async_trait::async_trait]
pub trait LentModel: Send + Sync {
    /// Completes `prompt` under `instructions`; `None` when the client refused, failed or did not
    /// answer in time.
    async fn complete(&self, instructions: &str, prompt: &str, max_tokens: u32) -> Option<String>;

    /// Whose model it is: what it writes is kept for that caller alone. `None` for a caller who
    /// cannot be told from others (anonymous): nothing it writes is kept.
    fn lender(&self) -> Option<String>;
}

/// The cache's name for summaries written by a client's model.
const LENT_MODEL: &str = "client-sampling";
/// Token budget of a summary asked of a client's model.
const LENT_MODEL_MAX_TOKENS: u32 = 1024;
/// A line per call whose client's model gave nothing: a client can make every call so.
static NO_LENT_SUMMARY: LogBudget = LogBudget::new("client_model_gave_no_summary");

/// One summary to write, as [`Summarizer::plan`] worked it out.
pub struct Plan<'a> {
    movie_id: i64,
    reviews: &'a [Review],
    writer: Writer<'a>,
}

/// Who writes a summary's sentence and themes.
enum Writer<'a> {
    /// A client's model (falling back on the provider, then the server).
    Lent(&'a dyn LentModel),
    /// The provider, its words cached under the key.
    Provider(&'a Arc<Provider>, SummaryKey),
    /// The server's rules.
    Server,
}

/// The server's words for `reviews`: what it says without a model, and when a model fails.
fn server_text(reviews: &[Review]) -> SummaryText {
    let (summary, themes) = summary::words(reviews);
    SummaryText { summary, themes }
}

impl Summarizer {
    /// The summarizer the configuration asks for, with its cache shared in `redis` when there is
    /// one (the replicas' Redis). Says in the log, once, which one it is.
    pub async fn configure(llm: &LlmArgs, redis: Option<RedisStoreConfig>) -> anyhow::Result<Self> {
        let provider = match llm.provider()? {
            None => {
                tracing::info!(
                    "no LLM provider configured (MOVIEDB_LLM_BASE_URL, MOVIEDB_LLM_MODEL, MOVIEDB_LLM_API_KEY \
                     or OPENAI_API_KEY): review summaries are written by the server-side summarizer"
                );
                None
            }
            Some(config) => {
                tracing::info!(
                    base_url = %catalogue::redact(&config.base_url),
                    model = %config.model,
                    timeout_secs = config.timeout.as_secs(),
                    "review summaries are written by an LLM provider"
                );
                Some(Arc::new(Provider::new(config)?))
            }
        };
        let cache = match redis {
            Some(redis) => {
                let prefix = redis.prefix.clone();
                let cache = SummaryCache::shared_in_redis(redis)
                    .await
                    .context("connecting to Redis for the summary cache")?;
                tracing::info!(%prefix, "summary cache shared in Redis");
                cache
            }
            None => SummaryCache::in_process(),
        };
        Ok(Self {
            provider,
            cache,
            lifetimes: llm.cache_lifetimes(),
        })
    }

    /// Who writes the summary of `reviews` of `movie_id`: with enough reviews to summarize,
    /// `lent` (a client's model) when given, else the provider when there is one; the server's
    /// rules otherwise. Works out the provider's cache key once (it hashes every review) for
    /// [`Self::calls_provider`] and [`Self::summarize`].
    pub fn plan<'a>(
        &'a self,
        movie_id: i64,
        reviews: &'a [Review],
        lent: Option<&'a dyn LentModel>,
    ) -> Plan<'a> {
        let enough_reviews = reviews.len() >= MIN_REVIEWS_FOR_SUMMARY;
        let writer = match (lent, &self.provider) {
            _ if !enough_reviews => Writer::Server,
            (Some(model), _) => Writer::Lent(model),
            (None, Some(provider)) => Writer::Provider(
                provider,
                SummaryKey::new(movie_id, provider.writer(), reviews),
            ),
            (None, None) => Writer::Server,
        };
        Plan {
            movie_id,
            reviews,
            writer,
        }
    }

    /// Whether `plan` calls the provider (there is one, there are enough reviews, no client's
    /// model is lent, and no summary of them is cached): work that may take seconds.
    pub async fn calls_provider(&self, plan: &Plan<'_>) -> bool {
        match &plan.writer {
            Writer::Provider(_, key) => !self.cache.contains(key).await,
            Writer::Lent(_) | Writer::Server => false,
        }
    }

    /// The summary `plan` describes: counts and average always; the sentence and themes from the
    /// plan's writer, or from the server's rules when a model fails (our own errors fail the
    /// call). The server's words are only worked out when they are used.
    pub async fn summarize(&self, plan: Plan<'_>) -> anyhow::Result<ReviewSummary> {
        let Plan {
            movie_id,
            reviews,
            writer,
        } = plan;
        let text = match writer {
            Writer::Lent(model) => self.lent_text(movie_id, reviews, model).await?,
            Writer::Provider(provider, key) => {
                self.provider_text(provider, &key, movie_id, reviews)
                    .await?
            }
            Writer::Server => server_text(reviews),
        };
        Ok(ReviewSummary {
            summary: text.summary,
            themes: text.themes,
            ..summary::counts(movie_id, reviews)
        })
    }

    /// The client's model's words for these reviews, cached like the provider's but for that
    /// client alone: a client's model may write anything, and it is never served to another
    /// caller. When the client gives none, the provider's (or the server's) words, cached
    /// briefly. An anonymous lender's words are not cached.
    async fn lent_text(
        &self,
        movie_id: i64,
        reviews: &[Review],
        model: &dyn LentModel,
    ) -> anyhow::Result<SummaryText> {
        let words = self.lent_words(movie_id, reviews, model);
        match model.lender() {
            Some(lender) => {
                let writer = format!("{LENT_MODEL}:{lender}|prompt {}", prompt::PROMPT_VERSION);
                let key = SummaryKey::new(movie_id, &writer, reviews);
                self.cache.get_or_compute_here(&key, words).await
            }
            None => Ok(words.await?.0),
        }
    }

    /// What [`Self::lent_text`] writes, with how long it may be kept.
    async fn lent_words(
        &self,
        movie_id: i64,
        reviews: &[Review],
        model: &dyn LentModel,
    ) -> anyhow::Result<(SummaryText, Keep)> {
        let prompt = prompt::prompt(movie_id, reviews);
        match model
            .complete(prompt::INSTRUCTIONS, &prompt, LENT_MODEL_MAX_TOKENS)
            .await
        {
            Some(answer) => Ok((
                prompt::parse_answer(&answer),
                Keep::Everywhere(self.lifetimes.provider),
            )),
            None => {
                if let Some(held_back) = NO_LENT_SUMMARY.take() {
                    tracing::info!(
                        movie_id,
                        held_back,
                        "the client's model gave no summary; falling back"
                    );
                }
                let text = match &self.provider {
                    Some(provider) => {
                        let key = SummaryKey::new(movie_id, provider.writer(), reviews);
                        self.provider_text(provider, &key, movie_id, reviews)
                            .await?
                    }
                    None => server_text(reviews),
                };
                // What stood in for the client's model may be a fallback only this replica
                // had to give (all its provider calls taken): kept here alone.
                Ok((text, Keep::HereOnly(self.lifetimes.fallback)))
            }
        }
    }

    /// The provider's words for these reviews, cached under `key`; the server's when it fails.
    /// The provider call is shared by every caller asking for `key` meanwhile, and cancelled when
    /// the last of them leaves.
    async fn provider_text(
        &self,
        provider: &Arc<Provider>,
        key: &SummaryKey,
        movie_id: i64,
        reviews: &[Review],
    ) -> anyhow::Result<SummaryText> {
        let found = self
            .cache
            .get_or_share(key, || {
                ask_provider(provider.clone(), movie_id, reviews.to_vec(), self.lifetimes)
            })
            .await;
        let result = match &found {
            Ok((_, Found::Cached)) => "hit",
            Ok((_, Found::Computed)) | Err(_) => "miss",
        };
        metrics::counter!("moviedb_summary_cache_total", "result" => result).increment(1);
        found.map(|(text, _)| text)
    }
}

/// One provider call for `reviews` of `movie_id`, traced and counted, and how long its words
/// (or the server's, when it fails) are kept. Owns what it needs: it runs for whichever caller
/// still waits for it.
async fn ask_provider(
    provider: Arc<Provider>,
    movie_id: i64,
    reviews: Vec<Review>,
    lifetimes: CacheLifetimes,
) -> anyhow::Result<(SummaryText, Keep)> {
    let started = std::time::Instant::now();
    let span = tracing::info_span!(
        "llm.summarize",
        otel.name = "llm.summarize",
        gen_ai.request.model = provider.model(),
        movie_id,
        reviews = reviews.len(),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        outcome = tracing::field::Empty,
        fallback = tracing::field::Empty,
    );
    let answer = provider
        .summarize(movie_id, &reviews)
        .instrument(span.clone())
        .await;
    let outcome = match &answer {
        Ok(_) => "ok",
        Err(ProviderError::Failed(failure)) => failure.kind(),
        Err(ProviderError::Internal(_)) => "internal",
    };
    span.record("outcome", outcome);
    // A summary that found every call allowed at once taken made no call.
    let busy = matches!(answer, Err(ProviderError::Failed(ProviderFailure::Busy(_))));
    if !busy {
        metrics::counter!("moviedb_llm_calls_total", "model" => provider.model().to_owned(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("moviedb_llm_call_seconds").record(started.elapsed().as_secs_f64());
    }
    match answer {
        Ok(text) => Ok((text, Keep::Everywhere(lifetimes.provider))),
        Err(ProviderError::Failed(failure)) => {
            tracing::warn!(
                movie_id,
                "LLM provider failed, answering with the server-side summary: {failure}"
            );
            span.record("fallback", failure.kind());
            metrics::counter!("moviedb_llm_fallbacks_total", "reason" => failure.kind())
                .increment(1);
            // Every call taken is this replica's state: another replica asks its own provider
            // calls instead of serving this fallback. A fallback never replaces the provider's
            // words another replica put in Redis meanwhile: those are served instead.
            let keep = if busy {
                Keep::HereOnly(lifetimes.fallback)
            } else {
                Keep::UnlessShared(lifetimes.fallback)
            };
            Ok((server_text(&reviews), keep))
        }
        Err(ProviderError::Internal(error)) => Err(error),
    }
}
