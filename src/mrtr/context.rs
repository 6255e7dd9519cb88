//! The handle a handler uses to talk to its client: ask questions (elicitation, sampling, roots),
//! remember work across rounds, and report progress and log messages.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::auth::Principal;
use crate::protocol::input::{
    ElicitParams, Elicitation, EmptyParams, InputRequest, Roots, Sampling, SamplingParams,
};
use crate::protocol::jsonrpc::notification_bytes;
use crate::protocol::{ClientCapabilities, LogLevel, ProtocolError, RequestMeta};

/// How a handler stops: it needs input (the engine asks the client), a protocol error for the
/// client, or an internal failure (logged, reported as -32603).
#[derive(Debug)]
pub enum HandlerError {
    InputRequired(InputPending),
    Protocol(ProtocolError),
    Internal(anyhow::Error),
}

/// Marker that a round of questions is pending; only the context creates it.
#[derive(Debug)]
pub struct InputPending(());

impl From<ProtocolError> for HandlerError {
    fn from(error: ProtocolError) -> Self {
        Self::Protocol(error)
    }
}

impl From<anyhow::Error> for HandlerError {
    fn from(error: anyhow::Error) -> Self {
        Self::Internal(error)
    }
}

/// Sends request-scoped notifications (progress, log messages) on the request's response stream.
#[derive(Clone)]
pub struct Notifier {
    tx: mpsc::Sender<Vec<u8>>,
}

impl Notifier {
    pub fn new(tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self { tx }
    }

    async fn send(&self, method: &str, params: Value) {
        // A closed stream means the client went away; the handler is about to be dropped.
        self.send_raw(notification_bytes(method, &params)).await;
    }

    /// Sends an already-serialized message; `false` when the stream is gone.
    pub(crate) async fn send_raw(&self, message: Vec<u8>) -> bool {
        self.tx.send(message).await.is_ok()
    }
}

/// The answers of one round, by key.
#[derive(Debug, Default)]
pub struct Answers {
    elicitations: Vec<(String, Elicitation)>,
    samplings: Vec<(String, Sampling)>,
    roots: Vec<(String, Roots)>,
}

impl Answers {
    pub fn elicitation(&self, key: &str) -> Option<&Elicitation> {
        self.elicitations
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, a)| a)
    }

    pub fn sampling(&self, key: &str) -> Option<&Sampling> {
        self.samplings
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, a)| a)
    }

    pub fn roots(&self, key: &str) -> Option<&Roots> {
        self.roots.iter().find(|(k, _)| k == key).map(|(_, a)| a)
    }
}

/// What the engine carries from round to round for one call.
#[derive(Debug, Default)]
pub(crate) struct RoundState {
    /// Answers not read yet in this run, by key (earlier rounds' and this retry's).
    pub available: Map<String, Value>,
    /// Answers the handler has read in this run; they go into the next continuation.
    pub used: Map<String, Value>,
    /// Work remembered with [`RequestContext::remember`].
    pub memo: Map<String, Value>,
    /// Questions of the round being built.
    pub pending: Vec<(String, InputRequest)>,
}

struct Inner {
    principal: Principal,
    meta: RequestMeta,
    notifier: Option<Notifier>,
    round: Mutex<RoundState>,
    /// Set under a legacy session: questions go to the client as server-initiated requests.
    #[cfg(feature = "legacy")]
    peer: Option<super::legacy::LegacyPeer>,
}

/// A handler's view of its request. Cheap to clone; every clone is the same request.
#[derive(Clone)]
pub struct RequestContext {
    inner: Arc<Inner>,
}

impl RequestContext {
    pub(crate) fn new(
        principal: Principal,
        meta: RequestMeta,
        notifier: Option<Notifier>,
        round: RoundState,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                principal,
                meta,
                notifier,
                round: Mutex::new(round),
                #[cfg(feature = "legacy")]
                peer: None,
            }),
        }
    }

    /// A context whose questions are sent to a legacy client and awaited.
    #[cfg(feature = "legacy")]
    pub(crate) fn legacy(
        principal: Principal,
        meta: RequestMeta,
        notifier: Option<Notifier>,
        peer: super::legacy::LegacyPeer,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                principal,
                meta,
                notifier,
                round: Mutex::new(RoundState::default()),
                peer: Some(peer),
            }),
        }
    }

    /// Whether this call is served under a legacy (2025-11-25) session.
    pub fn is_legacy(&self) -> bool {
        #[cfg(feature = "legacy")]
        return self.inner.peer.is_some();
        #[cfg(not(feature = "legacy"))]
        false
    }

    pub fn principal(&self) -> &Principal {
        &self.inner.principal
    }

    pub fn capabilities(&self) -> &ClientCapabilities {
        &self.inner.meta.capabilities
    }

    pub fn meta(&self) -> &RequestMeta {
        &self.inner.meta
    }

    /// Fails with -32021 unless the client declared `capability` on this request.
    pub fn require(&self, capability: &str) -> Result<(), ProtocolError> {
        let caps = self.capabilities();
        let declared = match capability {
            "elicitation" => caps.elicitation_form || caps.elicitation_url,
            "sampling" => caps.sampling,
            "roots" => caps.roots,
            _ => false,
        };
        if declared {
            Ok(())
        } else {
            Err(ProtocolError::missing_capability(json!({ capability: {} })))
        }
    }

    /// Asks the user to fill a form. Returns [`Elicitation::Unsupported`] at once when the client
    /// did not declare form elicitation, so the handler can take its fallback.
    pub async fn elicit(
        &self,
        key: &str,
        message: &str,
        schema: Value,
    ) -> Result<Elicitation, HandlerError> {
        let request = InputRequest::Elicit(ElicitParams::Form {
            message: message.to_owned(),
            requested_schema: schema,
        });
        let answers = self.ask(vec![(key.to_owned(), request)]).await?;
        Ok(answers
            .elicitation(key)
            .cloned()
            .unwrap_or(Elicitation::Unsupported))
    }

    /// Asks the client's model for a completion.
    pub async fn sample(
        &self,
        key: &str,
        params: SamplingParams,
    ) -> Result<Sampling, HandlerError> {
        let answers = self
            .ask(vec![(key.to_owned(), InputRequest::Sample(params))])
            .await?;
        Ok(answers
            .sampling(key)
            .cloned()
            .unwrap_or(Sampling::Unsupported))
    }

    /// Asks the client for its roots.
    pub async fn list_roots(&self, key: &str) -> Result<Roots, HandlerError> {
        let answers = self
            .ask(vec![(
                key.to_owned(),
                InputRequest::ListRoots(EmptyParams {}),
            )])
            .await?;
        Ok(answers.roots(key).cloned().unwrap_or(Roots::Unsupported))
    }

    /// Asks several questions in one round. Questions the client cannot answer (capability not
    /// declared) come back as `Unsupported`; if any other answer is missing, the call ends with
    /// `input_required` carrying every missing question, and the handler runs again on the retry.
    pub async fn ask(
        &self,
        questions: Vec<(String, InputRequest)>,
    ) -> Result<Answers, HandlerError> {
        #[cfg(feature = "legacy")]
        if let Some(peer) = &self.inner.peer {
            return Ok(self.ask_legacy(peer, questions).await);
        }
        let caps = self.capabilities().clone();
        let mut round = self.round();
        let mut answers = Answers::default();
        let mut missing = Vec::new();
        for (key, request) in questions {
            if !supports(&caps, &request) {
                match request {
                    InputRequest::Elicit(_) => {
                        answers.elicitations.push((key, Elicitation::Unsupported))
                    }
                    InputRequest::Sample(_) => answers.samplings.push((key, Sampling::Unsupported)),
                    InputRequest::ListRoots(_) => answers.roots.push((key, Roots::Unsupported)),
                }
                continue;
            }
            // A read answer moves from `available` to `used`; asking for it again reads it there.
            let raw = match round.available.remove(&key) {
                Some(raw) => raw,
                None => match round.used.get(&key) {
                    Some(raw) => raw.clone(),
                    None => {
                        missing.push((key, request));
                        continue;
                    }
                },
            };
            match request {
                InputRequest::Elicit(_) => {
                    let answer = Elicitation::from_response(&key, &raw)?;
                    answers.elicitations.push((key.clone(), answer));
                }
                InputRequest::Sample(_) => {
                    let answer = Sampling::from_response(&key, &raw)?;
                    answers.samplings.push((key.clone(), answer));
                }
                InputRequest::ListRoots(_) => {
                    let answer = Roots::from_response(&key, &raw)?;
                    answers.roots.push((key.clone(), answer));
                }
            }
            round.used.insert(key, raw);
        }
        if missing.is_empty() {
            return Ok(answers);
        }
        round.pending.extend(missing);
        Err(HandlerError::InputRequired(InputPending(())))
    }

    /// The legacy era: every supported question is sent and awaited at once; nothing interrupts.
    #[cfg(feature = "legacy")]
    async fn ask_legacy(
        &self,
        peer: &super::legacy::LegacyPeer,
        questions: Vec<(String, InputRequest)>,
    ) -> Answers {
        use super::legacy::{Interpreted, interpret};
        let caps = self.capabilities();
        let notifier = self.inner.notifier.as_ref();
        let asked = questions.into_iter().map(|(key, request)| async move {
            if !supports(caps, &request) {
                let unsupported = match request {
                    InputRequest::Elicit(_) => Interpreted::Elicitation(Elicitation::Unsupported),
                    InputRequest::Sample(_) => Interpreted::Sampling(Sampling::Unsupported),
                    InputRequest::ListRoots(_) => Interpreted::Roots(Roots::Unsupported),
                };
                return (key, unsupported);
            }
            let answer = peer.ask(notifier, &key, &request).await;
            let interpreted = interpret(&key, &request, answer);
            (key, interpreted)
        });
        let mut answers = Answers::default();
        for (key, answer) in futures::future::join_all(asked).await {
            match answer {
                Interpreted::Elicitation(a) => answers.elicitations.push((key, a)),
                Interpreted::Sampling(a) => answers.samplings.push((key, a)),
                Interpreted::Roots(a) => answers.roots.push((key, a)),
            }
        }
        answers
    }

    /// Runs `work` once per call: on a retry its remembered result is returned instead, so a
    /// database read or a model call made before a question is not made again after it.
    pub async fn remember<T, F, Fut>(&self, key: &str, work: F) -> Result<T, HandlerError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        let remembered = self.round().memo.get(key).cloned();
        if let Some(value) = remembered {
            return serde_json::from_value(value).map_err(|e| {
                HandlerError::Internal(anyhow::anyhow!(
                    "remembered value {key:?} no longer fits: {e}"
                ))
            });
        }
        let value = work().await?;
        let encoded = serde_json::to_value(&value)
            .map_err(|e| HandlerError::Internal(anyhow::anyhow!("cannot remember {key:?}: {e}")))?;
        self.round().memo.insert(key.to_owned(), encoded);
        Ok(value)
    }

    /// Reports progress when the request carries a progress token.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let (Some(notifier), Some(token)) = (&self.inner.notifier, &self.inner.meta.progress_token)
        else {
            return;
        };
        let mut params = json!({ "progressToken": token, "progress": progress });
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        notifier.send("notifications/progress", params).await;
    }

    /// Sends a log message when the request asked for this level or a lower one.
    pub async fn log(&self, level: LogLevel, logger: &str, data: Value) {
        let (Some(notifier), Some(wanted)) = (&self.inner.notifier, self.inner.meta.log_level)
        else {
            return;
        };
        if level >= wanted {
            let params = json!({ "level": level.as_str(), "logger": logger, "data": data });
            notifier.send("notifications/message", params).await;
        }
    }

    fn round(&self) -> MutexGuard<'_, RoundState> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.inner
            .round
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn take_round(&self) -> RoundState {
        std::mem::take(&mut *self.round())
    }
}

fn supports(caps: &ClientCapabilities, request: &InputRequest) -> bool {
    match request {
        InputRequest::Elicit(ElicitParams::Form { .. }) => caps.elicitation_form,
        InputRequest::Elicit(ElicitParams::Url { .. }) => caps.elicitation_url,
        InputRequest::Sample(_) => caps.sampling,
        InputRequest::ListRoots(_) => caps.roots,
    }
}
