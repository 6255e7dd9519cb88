//! The Multi Round-Trip Requests engine.
//!
//! A handler (tool, prompt or resource reader) asks for what it needs in straight-line code through
//! a [`RequestContext`]; when an answer is missing the engine ends the call with `input_required`,
//! parks what the handler already has in the [`ContinuationStore`](crate::store::ContinuationStore), and hands the client a sealed
//! `requestState` that points at it. On the retry — on any replica — the engine opens the state,
//! checks what it is bound to, takes the continuation exactly once and runs the handler again, which
//! now finds its answers and remembered work.

pub mod ask;
pub mod context;
pub mod engine;
mod error;
#[cfg(feature = "legacy")]
pub mod legacy;
pub mod notify;
pub(crate) mod rounds;
pub mod seal;

pub use ask::{Answer, Answers, Asker};
pub use context::{RequestContext, TaskMode, Unkept};
pub use engine::{Call, Engine, InputRequired, Outcome, TaskSeed};
pub use error::{HandlerError, InputPending, TaskPending};
#[cfg(feature = "legacy")]
pub use legacy::{ClientAnswer, LegacyPeer, PendingAnswers, QuestionIds};
pub use notify::Notifier;
pub use seal::{SealError, StateSealer};
