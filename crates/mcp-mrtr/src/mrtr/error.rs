//! How a handler stops short of a result: it needs input from the client, it refuses the request
//! with a protocol error, or it failed inside.

use crate::protocol::ProtocolError;

/// How a handler stops: it needs input (the engine asks the client), a protocol error for the
/// client, or an internal failure (logged, reported as -32603).
#[derive(Debug)]
pub enum HandlerError {
    /// A round of questions awaits the client; the engine answers the call with `input_required`.
    InputRequired(InputPending),
    /// The handler asked to continue as a task; the call is answered with the new task.
    TaskRequested(TaskPending),
    /// The request is refused with this JSON-RPC error.
    Protocol(ProtocolError),
    /// The handler failed; logged, and the client sees a generic -32603.
    Internal(anyhow::Error),
}

/// Marker that a round of questions is pending; only an [`Asker`](super::Asker) creates it.
#[derive(Debug)]
pub struct InputPending(());

impl InputPending {
    pub(crate) fn new() -> Self {
        Self(())
    }
}

/// Marker that a handler asked to continue as a task; only a
/// [`RequestContext`](super::RequestContext) that may create one creates it.
#[derive(Debug)]
pub struct TaskPending {
    /// Asked with `require_task`: the handler cannot go on without a task.
    required: bool,
}

impl TaskPending {
    pub(crate) fn new(required: bool) -> Self {
        Self { required }
    }

    pub(crate) fn required(&self) -> bool {
        self.required
    }
}

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
