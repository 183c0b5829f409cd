//! Why a chat/completions body cannot be admitted as it is.

use http::StatusCode;

/// A request body the [`Parser`](super::Parser) refuses, with the OpenAI-style error to answer:
/// [`status`](ParseError::status) (400, or 413 for a limit no budget could hold),
/// [`code`](ParseError::code) (machine-readable) and the message (`Display`: what is wrong and what a
/// valid request looks like).
///
/// # Examples
///
/// ```
/// use kvgate::openai::{Endpoint, ParseError, Parser};
///
/// let err = Parser::new().parse(Endpoint::Chat, br#"{"messages":[{"role":"user","content":"hi"}],"n":3}"#.as_slice().into()).unwrap_err();
/// assert_eq!((err.status(), err.code()), (400, "unsupported_n"));
/// assert_eq!(err.to_response().status(), 400);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The body is not JSON.
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// The body is JSON, but not an object.
    #[error("the request body must be a JSON object")]
    NotAnObject,
    /// A field has the wrong type.
    #[error("'{field}' must be {expected}")]
    InvalidType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A chat request without `messages`.
    #[error("'messages' is required: a non-empty array of {{role, content}}")]
    MissingMessages,
    /// `messages` is not a non-empty array of messages with a role.
    #[error("{0}")]
    InvalidMessages(String),
    /// A completions request without `prompt`.
    #[error("'prompt' is required")]
    MissingPrompt,
    /// `prompt` is not a string, an array of strings or an array of token ids.
    #[error("'prompt' must be a string, an array of strings, or an array of token ids")]
    InvalidPrompt,
    /// Several prompts in one request.
    #[error("send one prompt per request: each prompt is a sequence of its own")]
    Batch,
    /// `n`, `best_of` or `use_beam_search` asks for more than one sequence.
    #[error("'{field}' = {value} asks for more than one sequence; this server reserves one sequence per request")]
    MultipleSequences {
        /// The field.
        field: &'static str,
        /// Its value, as sent.
        value: String,
    },
    /// A generation limit that is not a positive integer.
    #[error("'{field}' must be a positive integer, got {value}")]
    InvalidMaxTokens {
        /// The field.
        field: &'static str,
        /// Its value, as sent.
        value: String,
    },
    /// A generation limit above what the server allows any request.
    #[error("'{field}' = {value} tokens exceeds the largest output this server reserves ({limit} tokens)")]
    MaxTokensTooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The largest allowed.
        limit: u32,
    },
}

impl ParseError {
    /// The HTTP status to answer: 413 for [`MaxTokensTooLarge`](ParseError::MaxTokensTooLarge), 400
    /// otherwise.
    pub fn status(&self) -> u16 {
        match self {
            ParseError::MaxTokensTooLarge { .. } => 413,
            _ => 400,
        }
    }

    /// The machine-readable `code` of the error body (also a metrics label).
    pub fn code(&self) -> &'static str {
        match self {
            ParseError::InvalidJson(_) | ParseError::NotAnObject => "invalid_json",
            ParseError::InvalidType { .. } => "invalid_type",
            ParseError::MissingMessages => "missing_messages",
            ParseError::InvalidMessages(_) => "invalid_messages",
            ParseError::MissingPrompt => "missing_prompt",
            ParseError::InvalidPrompt => "invalid_prompt",
            ParseError::Batch => "unsupported_batch",
            ParseError::MultipleSequences { .. } => "unsupported_n",
            ParseError::InvalidMaxTokens { .. } => "invalid_max_tokens",
            ParseError::MaxTokensTooLarge { .. } => "max_tokens_too_large",
        }
    }

    /// The OpenAI-style error response (`type: invalid_request_error`).
    pub fn to_response(&self) -> http::Response<bytes::Bytes> {
        let status = StatusCode::from_u16(self.status()).unwrap_or(StatusCode::BAD_REQUEST);
        crate::http::error_response(status, &self.to_string(), "invalid_request_error", self.code())
    }
}
