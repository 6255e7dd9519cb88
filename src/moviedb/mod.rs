//! The movie domain: the catalogue in SQL, review summaries (the server's own or an LLM
//! provider's), the watch list, and the tools that expose them. Nothing here knows about the MCP
//! transport or JSON-RPC; tools talk to the user only through the MRTR request context.

mod batch;
pub mod catalogue;
mod catalogue_batches;
mod fresh;
pub mod model;
pub mod seed;
mod sqlite_file;
pub mod summarizer;
pub mod summary;
pub mod tools;
mod watchlist_batches;

pub use catalogue::Catalogue;
