//! Wire types of MCP: the JSON-RPC 2.0 envelope, per-request `_meta`, results with `resultType`,
//! the MRTR input requests and responses, and the error codes with their data.
//!
//! Nothing here knows about HTTP or about any server's domain: the transport turns bytes into these types, the
//! server dispatches them, and the MRTR engine builds `input_required` results from them.

pub mod content;
pub mod error;
pub mod form;
pub mod input;
pub mod jsonrpc;
pub mod meta;
pub mod method;
pub mod version;

pub use error::ProtocolError;
pub use jsonrpc::{Incoming, RequestId};
pub use meta::{ClientCapabilities, LogLevel, RequestMeta, TraceCarrier};
pub use method::Method;
