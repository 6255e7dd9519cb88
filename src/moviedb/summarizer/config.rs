//! How review summaries are configured: which LLM provider to call (if any), how long to wait for
//! it, and how long to keep what it wrote. Every setting is a flag and an environment variable.
//!
//! The provider is used as soon as a base URL, a model or an API key is given; with none of them
//! the server writes summaries itself. Without a base URL the provider is OpenAI
//! (`https://api.openai.com/v1`, model `gpt-4.1-mini` unless one is named); with a base URL the
//! model must be named, since only OpenAI's names are known here.

use std::fmt;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The OpenAI API, used when a model or key is given without a base URL.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// The model asked of OpenAI when none is named.
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4.1-mini";
/// The longest a summary is cached: 30 days.
const MOST_CACHE_TTL_SECS: u64 = 30 * 86_400;

/// The LLM provider and the summary cache, from flags and environment.
#[derive(Clone, clap::Args)]
pub struct LlmArgs {
    /// Base URL of an OpenAI-compatible chat-completions API, up to and including `/v1`
    /// (`http://127.0.0.1:11434/v1` for a local Ollama). OpenAI when unset.
    #[arg(long, env = "MOVIEDB_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,

    /// Model that writes review summaries. Required with --llm-base-url; `gpt-4.1-mini` on OpenAI.
    #[arg(long, env = "MOVIEDB_LLM_MODEL")]
    pub llm_model: Option<String>,

    /// API key sent to the provider as a bearer token (falls back to OPENAI_API_KEY). Never logged.
    #[arg(long, env = "MOVIEDB_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,

    /// OpenAI's own variable, read when --llm-api-key is not given.
    #[arg(long, env = "OPENAI_API_KEY", hide = true, hide_env_values = true)]
    pub openai_api_key: Option<String>,

    /// Longest wait for the provider, in seconds, before answering with the server-side summary
    /// (at most 600: a call slot is held that long).
    #[arg(long, env = "MOVIEDB_LLM_TIMEOUT", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub llm_timeout_secs: u64,

    /// Most provider calls in flight at once; a summary that finds none free within 2 s is the
    /// server's own (cached like any fallback).
    #[arg(long, env = "MOVIEDB_LLM_MAX_CONCURRENT", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..10_000))]
    pub llm_max_concurrent: u64,

    /// Most tokens the provider may write for one summary.
    #[arg(long, env = "MOVIEDB_LLM_MAX_TOKENS", default_value_t = 300,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub llm_max_tokens: u32,

    /// How long a summary written by the provider is kept, in seconds (at most 30 days). A new
    /// review replaces it at once.
    #[arg(long, env = "MOVIEDB_SUMMARY_CACHE_TTL", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=MOST_CACHE_TTL_SECS))]
    pub summary_cache_ttl_secs: u64,

    /// How long the server-side summary given while the provider failed is kept, in seconds, before
    /// the provider is asked again (at most 30 days).
    #[arg(long, env = "MOVIEDB_FALLBACK_CACHE_TTL", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=MOST_CACHE_TTL_SECS))]
    pub fallback_cache_ttl_secs: u64,
}

/// The provider to call, checked and complete.
#[derive(Clone)]
pub struct ProviderConfig {
    /// Without a trailing slash.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub max_tokens: u32,
    /// Most calls in flight at once.
    pub max_concurrent: usize,
}

/// How long each kind of summary stays cached.
#[derive(Debug, Clone, Copy)]
pub struct CacheLifetimes {
    /// A summary the provider wrote.
    pub provider: Duration,
    /// The server-side summary given because the provider failed.
    pub fallback: Duration,
}

impl LlmArgs {
    /// The configured provider, or `None` when summaries are the server's own. Fails on settings
    /// that cannot work (a base URL without a model, a key that cannot go in an HTTP header).
    pub fn provider(&self) -> anyhow::Result<Option<ProviderConfig>> {
        let base_url = non_empty(&self.llm_base_url);
        let model = non_empty(&self.llm_model);
        let (own_key, openai_key) = (
            non_empty(&self.llm_api_key),
            non_empty(&self.openai_api_key),
        );
        if base_url.is_none() && model.is_none() && own_key.is_none() && openai_key.is_none() {
            return Ok(None);
        }
        let (base_url, model) = match (base_url, model) {
            (Some(url), Some(model)) => (checked_base_url(&url)?, model),
            (Some(_), None) => bail!(
                "MOVIEDB_LLM_BASE_URL is set without MOVIEDB_LLM_MODEL: name the model the provider runs"
            ),
            (None, model) => (
                OPENAI_BASE_URL.to_owned(),
                model.unwrap_or_else(|| DEFAULT_OPENAI_MODEL.to_owned()),
            ),
        };
        let api_key = match own_key {
            Some(key) => Some(key),
            // OpenAI's key goes to OpenAI alone, not to a gateway or a model the base URL names.
            None if base_url == OPENAI_BASE_URL => openai_key,
            None => {
                if openai_key.is_some() {
                    tracing::warn!(
                        %base_url,
                        "OPENAI_API_KEY is not sent to a provider other than OpenAI: give its key \
                         as MOVIEDB_LLM_API_KEY"
                    );
                }
                None
            }
        };
        if api_key.is_some() {
            let url = reqwest::Url::parse(&base_url).context("MOVIEDB_LLM_BASE_URL")?;
            if url.scheme() != "https" && !crate::config::names_loopback(&url) {
                bail!(
                    "MOVIEDB_LLM_BASE_URL must be an https URL to be sent an API key (http only \
                     on a loopback host): the key would travel in the clear"
                );
            }
        }
        if let Some(key) = &api_key {
            // The key travels as `Authorization: Bearer <key>`; say what is wrong without echoing it.
            if !key.chars().all(|c| c.is_ascii_graphic()) {
                bail!(
                    "the LLM API key contains spaces or characters that cannot go in an HTTP header"
                );
            }
        }
        Ok(Some(ProviderConfig {
            base_url,
            model,
            api_key,
            timeout: Duration::from_secs(self.llm_timeout_secs),
            max_tokens: self.llm_max_tokens,
            max_concurrent: usize::try_from(self.llm_max_concurrent).unwrap_or(1),
        }))
    }

    pub fn cache_lifetimes(&self) -> CacheLifetimes {
        CacheLifetimes {
            provider: Duration::from_secs(self.summary_cache_ttl_secs),
            fallback: Duration::from_secs(self.fallback_cache_ttl_secs),
        }
    }
}

/// Shows every setting but the keys.
impl fmt::Debug for LlmArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |key: &Option<String>| key.as_ref().map(|_| "***");
        f.debug_struct("LlmArgs")
            .field("llm_base_url", &self.llm_base_url)
            .field("llm_model", &self.llm_model)
            .field("llm_api_key", &hidden(&self.llm_api_key))
            .field("openai_api_key", &hidden(&self.openai_api_key))
            .field("llm_timeout_secs", &self.llm_timeout_secs)
            .field("llm_max_concurrent", &self.llm_max_concurrent)
            .field("llm_max_tokens", &self.llm_max_tokens)
            .field("summary_cache_ttl_secs", &self.summary_cache_ttl_secs)
            .field("fallback_cache_ttl_secs", &self.fallback_cache_ttl_secs)
            .finish()
    }
}

fn non_empty(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// An http(s) URL without its trailing slash (paths such as `/chat/completions` are appended,
/// so a query or fragment would end up in the middle). Credentials in it are refused, unshown:
/// the client sends only the API key.
fn checked_base_url(url: &str) -> anyhow::Result<String> {
    let trimmed = url.trim_end_matches('/');
    let parsed = reqwest::Url::parse(trimmed)
        .context("MOVIEDB_LLM_BASE_URL must be an http:// or https:// URL")?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        bail!("MOVIEDB_LLM_BASE_URL must be an http:// or https:// URL");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        bail!(
            "MOVIEDB_LLM_BASE_URL must not carry credentials (they would not be sent): give the \
             key as MOVIEDB_LLM_API_KEY"
        );
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        bail!(
            "MOVIEDB_LLM_BASE_URL must not have a query or fragment: request paths are appended to it"
        );
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        llm: LlmArgs,
    }

    /// The defaults, with the provider settings cleared of whatever the environment holds.
    fn defaults() -> LlmArgs {
        let mut args = Cli::try_parse_from(["moviedb-mcp"])
            .expect("no flags parse")
            .llm;
        args.llm_base_url = None;
        args.llm_model = None;
        args.llm_api_key = None;
        args.openai_api_key = None;
        args
    }

    fn with(base_url: Option<&str>, model: Option<&str>, api_key: Option<&str>) -> LlmArgs {
        LlmArgs {
            llm_base_url: base_url.map(str::to_owned),
            llm_model: model.map(str::to_owned),
            llm_api_key: api_key.map(str::to_owned),
            ..defaults()
        }
    }

    #[test]
    fn nothing_configured_means_the_server_side_summarizer() {
        assert!(defaults().provider().expect("valid").is_none());
        assert!(
            with(Some(" "), Some(""), None)
                .provider()
                .expect("valid")
                .is_none()
        );
    }

    #[test]
    fn a_key_alone_means_openai_with_the_default_model() {
        let provider = with(None, None, Some("sk-test"))
            .provider()
            .expect("valid")
            .expect("a provider");
        assert_eq!(provider.base_url, OPENAI_BASE_URL);
        assert_eq!(provider.model, DEFAULT_OPENAI_MODEL);
        assert_eq!(provider.api_key.as_deref(), Some("sk-test"));
        assert_eq!(provider.timeout, Duration::from_secs(20));
        assert_eq!(provider.max_tokens, 300);
        assert_eq!(provider.max_concurrent, 16);
    }

    #[test]
    fn openai_api_key_is_the_fallback_key() {
        let args = LlmArgs {
            openai_api_key: Some("sk-openai".into()),
            ..defaults()
        };
        let provider = args.provider().expect("valid").expect("a provider");
        assert_eq!(provider.api_key.as_deref(), Some("sk-openai"));
        let both = LlmArgs {
            llm_api_key: Some("sk-mine".into()),
            ..args
        };
        let provider = both.provider().expect("valid").expect("a provider");
        assert_eq!(provider.api_key.as_deref(), Some("sk-mine"));
    }

    #[test]
    fn openai_api_key_goes_to_openai_alone_and_no_key_travels_in_the_clear() {
        let openai_key = |args: LlmArgs| LlmArgs {
            openai_api_key: Some("sk-openai".into()),
            ..args
        };
        let key_sent = |args: LlmArgs| args.provider().expect("valid").expect("a provider").api_key;
        let gateway = openai_key(with(Some("https://gateway.example/v1"), Some("m"), None));
        assert_eq!(key_sent(gateway), None, "not to a gateway");
        let named = openai_key(with(Some("https://api.openai.com/v1/"), Some("m"), None));
        assert_eq!(
            key_sent(named).as_deref(),
            Some("sk-openai"),
            "to OpenAI named"
        );

        for clear in ["http://llm.example/v1", "HTTP://llm.example/v1"] {
            let error = with(Some(clear), Some("m"), Some("sk-mine"))
                .provider()
                .err()
                .expect("a key in the clear is refused");
            assert!(
                error.to_string().contains("in the clear")
                    && !error.to_string().contains("sk-mine"),
                "{clear}: {error}"
            );
        }
        for local in ["http://localhost:11434/v1", "http://[::1]:11434/v1"] {
            let args = with(Some(local), Some("m"), Some("sk-mine"));
            assert_eq!(key_sent(args).as_deref(), Some("sk-mine"), "{local}");
        }
        let keyless = with(Some("http://llm.example/v1"), Some("m"), None);
        assert_eq!(
            key_sent(keyless),
            None,
            "no key, nothing to keep from the wire"
        );
    }

    #[test]
    fn a_base_url_needs_a_model_and_loses_its_trailing_slash() {
        assert!(
            with(Some("http://127.0.0.1:11434/v1"), None, None)
                .provider()
                .is_err()
        );
        let ollama = with(Some("http://127.0.0.1:11434/v1/"), Some("llama3.2"), None)
            .provider()
            .expect("valid")
            .expect("a provider");
        assert_eq!(ollama.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(ollama.model, "llama3.2");
        assert_eq!(ollama.api_key, None);
        assert!(
            with(Some("127.0.0.1:11434"), Some("m"), None)
                .provider()
                .is_err()
        );
        assert!(
            with(Some("ftp://host/v1"), Some("m"), None)
                .provider()
                .is_err()
        );
    }

    #[test]
    fn a_base_url_with_credentials_a_query_or_a_fragment_is_refused() {
        let error = with(
            Some("https://ann:sk-in-url@llm.example/v1"),
            Some("m"),
            None,
        )
        .provider()
        .err()
        .expect("refused");
        assert!(
            error.to_string().contains("MOVIEDB_LLM_API_KEY")
                && !error.to_string().contains("sk-in-url"),
            "{error}"
        );
        for odd in ["https://llm.example/v1?key=1", "https://llm.example/v1#top"] {
            let error = with(Some(odd), Some("m"), None)
                .provider()
                .err()
                .expect("refused");
            assert!(error.to_string().contains("query or fragment"), "{error}");
        }
    }

    #[test]
    fn a_key_that_cannot_be_a_header_is_refused_without_being_shown() {
        let error = with(None, None, Some("sk-bad\nkey"))
            .provider()
            .err()
            .expect("refused");
        assert!(!error.to_string().contains("sk-bad"), "{error}");
    }

    #[test]
    fn debug_output_hides_the_keys() {
        let shown = format!("{:?}", with(None, None, Some("sk-secret")));
        assert!(!shown.contains("sk-secret"), "{shown}");
    }
}
