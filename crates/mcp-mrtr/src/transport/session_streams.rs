//! Which GET stream a 2025-11-25 session's notices go to on this replica: the one opened last.
//!
//! The spec has each message sent on one stream only. A client that reconnects after a network
//! failure may open its new stream before the server notices that the old one is dead, so a new
//! stream takes the session's notices over and the one before it ends, rather than the new one
//! being refused until then. Across replicas the session's stored record names its latest
//! stream, and a stream elsewhere that is no longer it ends before its next notice.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::claims::{Claim, Claims};

/// The latest GET stream of each session that has one open here, by what ends it when dropped.
/// Clones share the streams.
#[derive(Default, Clone)]
pub(super) struct SessionStreams {
    latest: Arc<Claims<String, oneshot::Sender<()>>>,
}

impl SessionStreams {
    /// Makes a new stream the one `session_id`'s notices go to; the stream before it, if any,
    /// ends.
    pub(super) fn take_over(&self, session_id: &str) -> StreamClaim {
        let (ends, superseded) = oneshot::channel();
        // Dropping the earlier stream's sender is what ends it.
        let (claim, _earlier) = self.latest.claim(session_id.to_owned(), ends);
        StreamClaim {
            _claim: claim,
            superseded: Some(superseded),
        }
    }
}

impl SessionStreams {
    /// Ends the session's stream here, if it has one (the session ended).
    pub(super) fn end(&self, session_id: &str) {
        // Dropping its sender is what ends it.
        drop(self.latest.release(&session_id.to_owned()));
    }
}

/// A stream's hold on its session's notices, given up when it is dropped.
pub(super) struct StreamClaim {
    _claim: Claim<String, oneshot::Sender<()>>,
    /// Completes once the stream is superseded; gone once that has been seen.
    superseded: Option<oneshot::Receiver<()>>,
}

impl StreamClaim {
    /// Completes once a newer stream of the session has taken its notices over here (or the
    /// session ended).
    pub(super) async fn superseded(&mut self) {
        if let Some(superseded) = &mut self.superseded {
            let _ = superseded.await;
            self.superseded = None;
        }
    }

    /// Whether the stream has been superseded by now.
    pub(super) fn is_superseded(&mut self) -> bool {
        let over = self.superseded.as_mut().is_none_or(|superseded| {
            !matches!(
                superseded.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            )
        });
        if over {
            self.superseded = None;
        }
        over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_stream_ends_the_one_before_it_and_no_other() {
        let streams = SessionStreams::default();
        let mut first = streams.take_over("s1");
        let mut other_session = streams.take_over("s2");
        assert!(!first.is_superseded());
        let mut second = streams.take_over("s1");
        assert!(first.is_superseded(), "seen at once");
        tokio::time::timeout(std::time::Duration::from_secs(1), first.superseded())
            .await
            .expect("the first stream of s1 is superseded");
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            other_session.superseded(),
        )
        .await;
        assert!(waiting.is_err(), "another session's stream goes on");
        streams.end("s1");
        tokio::time::timeout(std::time::Duration::from_secs(1), second.superseded())
            .await
            .expect("the stream of an ended session ends");
    }
}
