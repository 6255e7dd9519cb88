//! Reading what other services answer (the authorization server's documents, the LLM provider's
//! completions) up to a size the server chose, so none of them can make it hold any amount.

/// The body of `response`, or `None` when it is larger than `most` bytes: told by its length
/// when it gives one, else found while reading (a body sent in chunks).
pub async fn read_at_most(
    response: &mut reqwest::Response,
    most: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if response
        .content_length()
        .is_some_and(|length| length > most as u64)
    {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > most {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}
