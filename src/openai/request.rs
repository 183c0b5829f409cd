//! Reading a chat/completions body: what admission needs (prompt estimate, output reservation) and the
//! body to forward, with every generation limit an engine reads set to the reservation.

use super::error::ParseError;
use super::estimate::{Heuristic, PromptEstimator};
use super::json::{Json, Object};
use super::output::OutputTokens;
use bytes::Bytes;
use std::fmt;
use std::sync::Arc;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`: `messages`.
    Chat,
    /// `POST /v1/completions`: `prompt`.
    Completions,
}

impl Endpoint {
    /// From a request path (`/v1/chat/completions`, `/v1/completions`, a trailing `/` allowed).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::openai::Endpoint;
    ///
    /// assert_eq!(Endpoint::from_path("/v1/chat/completions/"), Some(Endpoint::Chat));
    /// assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    /// ```
    pub fn from_path(path: &str) -> Option<Self> {
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            _ => None,
        }
    }

    /// The path after `/v1`.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/chat/completions",
            Endpoint::Completions => "/completions",
        }
    }
}

/// The fields engines read as "generate at most this many tokens", in the order their value is taken
/// as the client's limit: OpenAI's `max_completion_tokens` (which vLLM's chat API prefers) and
/// `max_tokens` (vLLM's completions API, llama.cpp, Ollama, TGI, SGLang), llama.cpp's `n_predict`
/// (which its server reads before `max_tokens`) and TGI's and SGLang's native `max_new_tokens`. The
/// forwarded body has each one that is present, and `max_tokens` always, set to the reservation.
pub const GENERATION_LIMITS: [&str; 4] = ["max_completion_tokens", "max_tokens", "n_predict", "max_new_tokens"];

/// The longest `user` field kept.
const MAX_USER: usize = 256;

/// The default output reservation of a request without a generation limit.
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// The default largest output reservation (128 Ki tokens, the longest context of common models): above
/// it a request is refused with a 413 before admission, with or without a KV budget.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 131_072;

/// Reads chat/completions bodies: the prompt estimate, the output reservation, and the body to forward.
///
/// Cheap to clone (the estimator is shared).
///
/// # Examples
///
/// ```
/// use kvgate::openai::{Endpoint, Parser};
///
/// let parser = Parser::new().default_max_tokens(256);
/// let body = br#"{"model":"m","stream":true,"n_predict":-1,"messages":[{"role":"user","content":"Hello there!"}]}"#;
/// let chat = parser.parse(Endpoint::Chat, body.as_slice().into())?;
/// assert_eq!((chat.prompt_tokens, chat.max_tokens, chat.stream), (11, 256, true));
/// // Every limit an engine reads says 256, so it cannot generate more than was reserved.
/// let forwarded: serde_json::Value = serde_json::from_slice(chat.forward_body())?;
/// assert_eq!((forwarded["max_tokens"].as_u64(), forwarded["n_predict"].as_u64()), (Some(256), Some(256)));
/// let admit = chat.request().tenant("alice");
/// assert_eq!(admit.total_tokens(), 11 + 256);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Parser {
    default_max_tokens: u32,
    max_output_tokens: u32,
    estimator: Arc<dyn PromptEstimator>,
}

impl fmt::Debug for Parser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Parser")
            .field("default_max_tokens", &self.default_max_tokens)
            .field("max_output_tokens", &self.max_output_tokens)
            .finish_non_exhaustive()
    }
}

impl Default for Parser {
    fn default() -> Self {
        Self::new()
    }
}

impl Parser {
    /// A parser with [`DEFAULT_MAX_TOKENS`], [`DEFAULT_MAX_OUTPUT_TOKENS`] and the [`Heuristic`]
    /// estimate.
    pub fn new() -> Self {
        Self {
            default_max_tokens: DEFAULT_MAX_TOKENS,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            estimator: Arc::new(Heuristic),
        }
    }

    /// The output reservation of a request without a generation limit (written into the forwarded
    /// body). At least 1.
    #[must_use]
    pub fn default_max_tokens(mut self, tokens: u32) -> Self {
        self.default_max_tokens = tokens.max(1);
        self
    }

    /// The largest output reservation a request may ask for; above it, a 413 before admission. At least
    /// 1.
    #[must_use]
    pub fn max_output_tokens(mut self, tokens: u32) -> Self {
        self.max_output_tokens = tokens.max(1);
        self
    }

    /// Estimates prompts with `estimator` (a real tokenizer) instead of the [`Heuristic`].
    #[must_use]
    pub fn estimator(mut self, estimator: impl PromptEstimator + 'static) -> Self {
        self.estimator = Arc::new(estimator);
        self
    }

    /// The configured default reservation.
    pub fn default_max_tokens_value(&self) -> u32 {
        self.default_max_tokens
    }

    /// Reads and checks one request body.
    ///
    /// The prompt estimate counts everything the chat template puts into the prompt: every message's
    /// text (content, text parts, `name`, tool calls' names and arguments, `tool_call_id`, reasoning),
    /// the `tools`/`functions` definitions, `tool_choice`, `documents` and a request-supplied
    /// `chat_template`, plus per-message overheads; image, audio and file parts at a flat price. The
    /// output reservation is the first generation limit of [`GENERATION_LIMITS`] the body sets, else
    /// the default.
    ///
    /// Only what forwarding needs is kept: the body as received when it already says the reservation
    /// everywhere and no object in it repeats a key, else one re-serialized copy (keys in byte order, a
    /// repeated key once with its last value, as `serde_json::Value` writes it: this parser reads a
    /// repeated key's last occurrence, an engine may read the first, so the engine gets only what was
    /// checked and priced); the parsed JSON is dropped before this returns. Reading allocates only for
    /// arrays, objects and strings with escapes (the rest borrows from `body`).
    ///
    /// # Errors
    ///
    /// A [`ParseError`]: malformed JSON, a body that is not an object, missing or mistyped
    /// `messages`/`prompt`/`model`/`stream`, several prompts, `n`/`best_of` above 1 or
    /// `use_beam_search`, a generation limit that is not a positive integer (400), or one above
    /// [`max_output_tokens`](Parser::max_output_tokens) (413).
    pub fn parse(&self, endpoint: Endpoint, body: Bytes) -> Result<CompletionRequest, ParseError> {
        let value = Json::from_slice(&body).map_err(|e| ParseError::InvalidJson(e.to_string()))?;
        let Json::Object(mut json) = value else {
            return Err(ParseError::NotAnObject);
        };
        let model = match json.get("model") {
            None | Some(Json::Null) => String::new(),
            Some(Json::String(s)) => s.to_string(),
            Some(_) => return Err(ParseError::InvalidType { field: "model", expected: "a string" }),
        };
        let stream = optional_bool(&json, "stream")?.unwrap_or(false);
        // OpenAI's end-user id; a gateway may name tenants by it. Kept only when short.
        let user = json.get("user").and_then(Json::as_str).filter(|u| u.len() <= MAX_USER).map(str::to_owned);
        let include_usage = match json.get("stream_options") {
            Some(Json::Object(options)) => options.get("include_usage").and_then(Json::as_bool).unwrap_or(false),
            _ => false,
        };
        one_sequence(&json)?;
        let estimator = self.estimator.as_ref();
        let (prompt_tokens, prefix) = match endpoint {
            Endpoint::Chat => chat_tokens(&json, estimator)?,
            Endpoint::Completions => (completion_tokens(&json, estimator)?, None),
        };
        let (max_tokens, defaulted) = match client_limit(&json)? {
            Some((field, n)) if n > u64::from(self.max_output_tokens) => {
                return Err(ParseError::MaxTokensTooLarge { field, value: n, limit: self.max_output_tokens });
            }
            Some((_, n)) => (u32::try_from(n).unwrap_or(u32::MAX), false),
            None => (self.default_max_tokens.min(self.max_output_tokens), true),
        };
        // A repeated key is read here as its last occurrence; an engine may read the first. So a body with
        // one anywhere goes out re-serialized, each key once: the engine reads what was checked and priced.
        let body = if says_everywhere(&json, max_tokens) && !json.has_repeated_keys() {
            drop(json);
            body
        } else {
            set_limits(&mut json, max_tokens);
            Bytes::from(json.canonical_text())
        };
        Ok(CompletionRequest {
            endpoint,
            model,
            stream,
            include_usage,
            prompt_tokens: prompt_tokens.max(1),
            max_tokens,
            max_tokens_defaulted: defaulted,
            prefix,
            user,
            body,
        })
    }
}

/// A checked chat/completions request: what admission needs and the body to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompletionRequest {
    /// The endpoint it came to.
    pub endpoint: Endpoint,
    /// `model` as sent (empty when absent).
    pub model: String,
    /// `stream: true`: the answer is an SSE stream.
    pub stream: bool,
    /// `stream_options.include_usage: true`: the stream's last chunk carries `usage`.
    pub include_usage: bool,
    /// The prompt estimate (at least 1).
    pub prompt_tokens: u32,
    /// The output reservation: the client's generation limit or the default.
    pub max_tokens: u32,
    /// Whether [`max_tokens`](Self::max_tokens) is the default (the client set no limit).
    pub max_tokens_defaulted: bool,
    /// The cacheable prefix a chat request opens with: its leading `system` (or `developer`) messages,
    /// identified by a hash of their roles and contents, their estimated tokens (with the per-message
    /// overheads) as its length. `None` for a chat that opens with another role, and for completions.
    /// Engines with prefix caching keep one copy of it for every running request that shares it (see
    /// [`prefix_sharing`](crate::AdmissionBuilder::prefix_sharing)).
    pub prefix: Option<crate::Prefix>,
    /// OpenAI's `user` field (an end-user id), when it is a string of at most 256 bytes.
    pub user: Option<String>,
    /// The body to forward.
    body: Bytes,
}

impl CompletionRequest {
    /// The [`Request`](crate::Request) to admit: the prompt estimate, the output reservation and the
    /// [`prefix`](Self::prefix) (an admission without prefix sharing ignores it); add a tenant, a
    /// priority or a wait limit with its builder methods.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::openai::{Endpoint, Parser};
    ///
    /// let body = br#"{"max_tokens":10,"messages":[{"role":"system","content":"You answer in French."},{"role":"user","content":"Hi"}]}"#;
    /// let chat = Parser::new().parse(Endpoint::Chat, body.as_slice().into())?;
    /// let prefix = chat.request().prefix.unwrap();
    /// assert_eq!(prefix.tokens, 4 + 2 + 6); // the message overhead, its role, its text
    /// # Ok::<(), kvgate::openai::ParseError>(())
    /// ```
    pub fn request(&self) -> crate::Request {
        let request = crate::Request::new(self.prompt_tokens, self.max_tokens);
        match self.prefix {
            Some(prefix) => request.prefix(prefix.id, prefix.tokens),
            None => request,
        }
    }

    /// The body to send to the engine: as received, with every generation limit of
    /// [`GENERATION_LIMITS`] that is present, and `max_tokens`, set to the reservation.
    pub fn forward_body(&self) -> &Bytes {
        &self.body
    }

    /// Takes the body to forward out.
    pub fn into_forward_body(self) -> Bytes {
        self.body
    }

    /// Bytes held for forwarding (what a queued request costs in memory, besides this struct).
    pub fn held_bytes(&self) -> usize {
        self.body.len() + self.model.len() + self.user.as_ref().map_or(0, String::len)
    }

    /// A counter for the answer's output tokens (see [`OutputTokens`]).
    pub fn output_counter(&self) -> OutputTokens {
        OutputTokens::new()
    }
}

fn optional_bool(json: &Object<'_>, field: &'static str) -> Result<Option<bool>, ParseError> {
    match json.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ParseError::InvalidType { field, expected: "a boolean" }),
    }
}

/// Refuses `n` other than 1, `best_of` above 1 and beam search: each is several sequences.
fn one_sequence(json: &Object<'_>) -> Result<(), ParseError> {
    for field in ["n", "best_of"] {
        match json.get(field) {
            None | Some(Json::Null) => {}
            Some(v) if v.as_u64() == Some(1) || v.as_f64() == Some(1.0) => {}
            Some(v) => return Err(ParseError::MultipleSequences { field, value: v.canonical_text() }),
        }
    }
    if optional_bool(json, "use_beam_search")? == Some(true) {
        return Err(ParseError::MultipleSequences { field: "use_beam_search", value: "true".into() });
    }
    Ok(())
}

/// The client's generation limit: the first field of [`GENERATION_LIMITS`] that is set.
fn client_limit(json: &Object<'_>) -> Result<Option<(&'static str, u64)>, ParseError> {
    for field in GENERATION_LIMITS {
        let value = match json.get(field) {
            None | Some(Json::Null) => continue,
            // llama.cpp reads a negative `n_predict` as "until the context is full": no limit given.
            Some(value) if field == "n_predict" && value.as_i64().is_some_and(|n| n < 0) => continue,
            Some(value) => value,
        };
        let n = value.as_u64().or_else(|| {
            value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f.min(u64::MAX as f64) as u64)
        });
        return match n {
            Some(n) if n > 0 => Ok(Some((field, n))),
            _ => Err(ParseError::InvalidMaxTokens { field, value: value.canonical_text() }),
        };
    }
    Ok(None)
}

/// Whether the body already says `max_tokens` in `max_tokens` and in every other limit it sets.
fn says_everywhere(json: &Object<'_>, max_tokens: u32) -> bool {
    let says = |v: &Json<'_>| v.as_u64() == Some(u64::from(max_tokens));
    json.get("max_tokens").is_some_and(says)
        && GENERATION_LIMITS.iter().all(|field| json.get(field).is_none_or(says))
        && nested_num_predict(json).is_none_or(says)
}

/// Ollama's native `options.num_predict`.
fn nested_num_predict<'j>(json: &'j Object<'_>) -> Option<&'j Json<'j>> {
    json.get("options")?.as_object()?.get("num_predict")
}

/// Sets every generation limit present, and `max_tokens`, to `max_tokens`.
fn set_limits(json: &mut Object<'_>, max_tokens: u32) {
    let limit = || Json::Number(max_tokens.into());
    for field in GENERATION_LIMITS {
        if field == "max_tokens" || json.contains_key(field) {
            json.set(field, limit());
        }
    }
    if let Some(Json::Object(options)) = json.get_mut("options") {
        if options.contains_key("num_predict") {
            options.set("num_predict", limit());
        }
    }
}

/// Top-level fields of a chat request whose text the chat template renders into the prompt.
const TEMPLATE_FIELDS: [&str; 5] = ["tools", "functions", "tool_choice", "documents", "chat_template"];

/// The roles whose leading messages make a chat's cacheable prefix (the system prompt).
const PREFIX_ROLES: [&str; 2] = ["system", "developer"];

/// The prompt estimate of a chat, and its prefix: the leading messages of a [`PREFIX_ROLES`] role.
fn chat_tokens(json: &Object<'_>, estimator: &dyn PromptEstimator) -> Result<(u32, Option<crate::Prefix>), ParseError> {
    let messages = match json.get("messages") {
        None => return Err(ParseError::MissingMessages),
        Some(Json::Array(messages)) if !messages.is_empty() => messages,
        Some(_) => {
            return Err(ParseError::InvalidMessages("'messages' must be a non-empty array of {role, content}".into()));
        }
    };
    let mut tokens = estimator.reply_overhead();
    // The leading system messages: their roles and contents (hashed into the prefix id) and their tokens.
    let mut prefix_text = String::new();
    let mut prefix_tokens = 0u32;
    let mut in_prefix = true;
    for (i, message) in messages.iter().enumerate() {
        let Some(message) = message.as_object() else {
            return Err(ParseError::InvalidMessages(format!("messages[{i}] must be an object")));
        };
        if !message.get("role").is_some_and(Json::is_string) {
            return Err(ParseError::InvalidMessages(format!("messages[{i}].role must be a string")));
        }
        match message.get("content") {
            None | Some(Json::Null | Json::String(_) | Json::Array(_)) => {}
            Some(_) => {
                return Err(ParseError::InvalidMessages(format!(
                    "messages[{i}].content must be a string or an array of parts"
                )));
            }
        }
        // Every field of the message: role, content (text parts; media at a flat price), name, tool calls'
        // names and arguments, tool_call_id, reasoning — whatever the template renders.
        let message_tokens = estimator.message_overhead().saturating_add(object_tokens(message, estimator, false));
        tokens = tokens.saturating_add(message_tokens);
        let role = message.get("role").and_then(Json::as_str).unwrap_or_default();
        in_prefix &= PREFIX_ROLES.contains(&role);
        if in_prefix {
            prefix_tokens = prefix_tokens.saturating_add(message_tokens);
            prefix_text.push_str(role);
            prefix_text.push('\0');
            prefix_text.push_str(&message.canonical_text());
            prefix_text.push('\0');
        }
    }
    for field in TEMPLATE_FIELDS {
        let text = match json.get(field) {
            None | Some(Json::Null) => continue,
            Some(Json::String(text)) => text.to_string(),
            // Templates render tool definitions as JSON: price the compact JSON text.
            Some(value) => value.canonical_text(),
        };
        tokens = tokens.saturating_add(estimator.text_tokens(&text));
        // Templates often render tools into the system prompt: requests share a prefix only with the same.
        prefix_text.push_str(field);
        prefix_text.push('\0');
        prefix_text.push_str(&text);
    }
    let prefix = (prefix_tokens > 0)
        .then(|| crate::Prefix { id: crate::PrefixId::from(prefix_text.as_str()), tokens: prefix_tokens });
    Ok((tokens, prefix))
}

/// The text tokens of every string in `value` (object keys excluded). In a message's `content` array
/// (`in_content`), a part whose `type` is not text (an image, audio, a file) is priced at
/// [`PromptEstimator::media_tokens`] instead of its payload.
fn value_tokens(value: &Json<'_>, estimator: &dyn PromptEstimator, in_content: bool) -> u32 {
    match value {
        Json::String(text) => estimator.text_tokens(text),
        Json::Array(items) => {
            items.iter().fold(0u32, |sum, item| sum.saturating_add(value_tokens(item, estimator, in_content)))
        }
        Json::Object(fields) => object_tokens(fields, estimator, in_content),
        Json::Number(n) => estimator.text_tokens(&n.to_string()),
        Json::Bool(_) | Json::Null => 0,
    }
}

/// [`value_tokens`] of an object: of each of its fields (a repeated field each time it appears: the
/// estimate errs high, never low).
fn object_tokens(fields: &Object<'_>, estimator: &dyn PromptEstimator, in_content: bool) -> u32 {
    let media = in_content
        && fields
            .get("type")
            .and_then(Json::as_str)
            .is_some_and(|t| !matches!(t, "text" | "input_text" | "output_text" | "refusal" | "reasoning"));
    if media {
        return estimator.media_tokens();
    }
    fields.iter().fold(0u32, |sum, (key, item)| match key {
        // `type` tags are not rendered.
        "type" => sum,
        "content" => sum.saturating_add(value_tokens(item, estimator, true)),
        _ => sum.saturating_add(value_tokens(item, estimator, false)),
    })
}

fn completion_tokens(json: &Object<'_>, estimator: &dyn PromptEstimator) -> Result<u32, ParseError> {
    let ids =
        |items: &[Json<'_>]| items.iter().all(Json::is_u64).then(|| u32::try_from(items.len()).unwrap_or(u32::MAX));
    let prompt = match json.get("prompt") {
        None | Some(Json::Null) => return Err(ParseError::MissingPrompt),
        Some(Json::String(text)) => estimator.text_tokens(text),
        Some(Json::Array(items)) => match (ids(items), items.as_slice()) {
            (Some(n), _) => n,
            (None, [Json::String(text)]) => estimator.text_tokens(text),
            (None, [Json::Array(inner)]) => ids(inner).ok_or(ParseError::InvalidPrompt)?,
            (None, [_]) => return Err(ParseError::InvalidPrompt),
            (None, _) if items.iter().all(|i| i.is_string() || i.is_array()) => return Err(ParseError::Batch),
            (None, _) => return Err(ParseError::InvalidPrompt),
        },
        Some(_) => return Err(ParseError::InvalidPrompt),
    };
    // An insertion's suffix is part of the prompt.
    let suffix = match json.get("suffix") {
        None | Some(Json::Null) => 0,
        Some(Json::String(text)) => estimator.text_tokens(text),
        Some(_) => return Err(ParseError::InvalidType { field: "suffix", expected: "a string" }),
    };
    Ok(prompt.saturating_add(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse(endpoint: Endpoint, body: Value) -> Result<CompletionRequest, ParseError> {
        Parser::new().default_max_tokens(100).parse(endpoint, Bytes::from(body.to_string()))
    }

    fn forwarded(request: &CompletionRequest) -> Value {
        serde_json::from_slice(request.forward_body()).unwrap()
    }

    #[test]
    fn chat_with_system_user_and_limits() {
        let chat = parse(
            Endpoint::Chat,
            json!({"model": "llama", "max_completion_tokens": 50, "max_tokens": 4000, "n_predict": 9000,
                   "stream": true, "stream_options": {"include_usage": true},
                   "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]}),
        )
        .unwrap();
        assert_eq!((chat.model.as_str(), chat.stream, chat.include_usage), ("llama", true, true));
        // 3 + (4 + "system" 2 + "Be brief." 3) + (4 + "user" 1 + "Hello there!" 3)
        assert_eq!(chat.prompt_tokens, 20);
        assert_eq!((chat.max_tokens, chat.max_tokens_defaulted), (50, false));
        let body = forwarded(&chat);
        for field in ["max_completion_tokens", "max_tokens", "n_predict"] {
            assert_eq!(body[field], 50, "{field}");
        }
        assert_eq!(body["messages"][1]["content"], "Hello there!");
        // The system message is the cacheable prefix: 4 + 2 + 3 tokens.
        assert_eq!(chat.request(), crate::Request::new(20, 50).prefix(chat.prefix.unwrap().id, 9));
    }

    #[test]
    fn a_body_that_already_says_the_reservation_is_forwarded_as_received() {
        let raw = Bytes::from_static(br#"{"max_tokens":7, "messages":[{"role":"user","content":"x"}]}"#);
        let chat = Parser::new().parse(Endpoint::Chat, raw.clone()).unwrap();
        assert_eq!(chat.forward_body(), &raw);
        assert_eq!(chat.forward_body().as_ptr(), raw.as_ptr(), "the same buffer, not a copy");
        let defaulted =
            Parser::new().parse(Endpoint::Chat, Bytes::from_static(br#"{"messages":[{"role":"user","content":"x"}]}"#));
        assert_eq!(forwarded(&defaulted.unwrap())["max_tokens"], DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn a_repeated_generation_limit_is_set_in_every_occurrence() {
        // The last `max_tokens` (7) is the reservation; an engine reading the first must not see 99999.
        for raw in [
            &br#"{"max_tokens":99999,"messages":[{"role":"user","content":"x"}],"max_tokens":7}"#[..],
            br#"{"max_tokens":7,"options":{"num_predict":99999},"options":{"num_predict":7},"messages":[{"role":"user","content":"x"}]}"#,
            br#"{"max_tokens":7,"options":{"num_predict":99999,"num_predict":7},"messages":[{"role":"user","content":"x"}]}"#,
        ] {
            let chat = Parser::new().parse(Endpoint::Chat, Bytes::copy_from_slice(raw)).unwrap();
            assert_eq!(chat.max_tokens, 7);
            let text = std::str::from_utf8(chat.forward_body()).unwrap();
            assert!(!text.contains("99999"), "{text}");
            assert_eq!(forwarded(&chat)["max_tokens"], 7);
        }
    }

    #[test]
    fn a_body_with_a_repeated_key_goes_out_with_each_key_once() {
        // `n` and the prompt are read as their last occurrence: the engine must not see the first.
        let big = "word ".repeat(2_000);
        for (endpoint, raw) in [
            (Endpoint::Chat, r#"{"max_tokens":7,"n":4,"n":1,"messages":[{"role":"user","content":"x"}]}"#.to_owned()),
            (Endpoint::Completions, format!(r#"{{"max_tokens":7,"prompt":"{big}","prompt":"x"}}"#)),
            (
                Endpoint::Chat,
                format!(
                    r#"{{"max_tokens":7,"messages":[{{"role":"user","content":"{big}"}}],"messages":[{{"role":"user","content":"x"}}]}}"#
                ),
            ),
        ] {
            let request = Parser::new().parse(endpoint, Bytes::from(raw.clone())).unwrap();
            let text = std::str::from_utf8(request.forward_body()).unwrap();
            assert!(!text.contains(r#""n":4"#) && !text.contains("word"), "{raw} went out as {text}");
            assert_eq!(forwarded(&request)["max_tokens"], 7);
        }
    }

    #[test]
    fn ollama_options_num_predict_is_rewritten() {
        let chat = parse(
            Endpoint::Chat,
            json!({"max_tokens": 10, "options": {"num_predict": 5000}, "messages": [{"role": "user", "content": "x"}]}),
        )
        .unwrap();
        assert_eq!(forwarded(&chat)["options"]["num_predict"], 10);
    }

    #[test]
    fn tools_tool_calls_and_names_are_counted() {
        let arguments = "x".repeat(40_000);
        let description = "d".repeat(40_000);
        let chat = parse(
            Endpoint::Chat,
            json!({
                "tools": [{"type": "function", "function": {"name": "lookup", "description": description, "parameters": {"type": "object"}}}],
                "messages": [
                    {"role": "user", "content": "hi", "name": "n".repeat(4_000)},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "result"}]},
                ],
            }),
        )
        .unwrap();
        // 40 KB of description + 40 KB of arguments + 4 KB of name: at least 21,000 tokens at 4 bytes a token.
        assert!(chat.prompt_tokens >= 21_000, "{}", chat.prompt_tokens);
        assert!(chat.prompt_tokens < 22_000, "{}", chat.prompt_tokens);
    }

    #[test]
    fn media_parts_have_a_flat_price() {
        let image = format!("data:image/png;base64,{}", "A".repeat(1 << 20));
        let chat = parse(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": image}}]}]}),
        )
        .unwrap();
        assert_eq!(chat.prompt_tokens, 3 + 4 + 1 + 4 + 256);
    }

    #[test]
    fn completions_prompts() {
        let one =
            parse(Endpoint::Completions, json!({"prompt": "Once upon a time", "suffix": "the end", "max_tokens": 16}))
                .unwrap();
        assert_eq!((one.prompt_tokens, one.max_tokens), (4 + 2, 16));
        let ids = parse(Endpoint::Completions, json!({"prompt": [1, 2, 3, 4, 5]})).unwrap();
        assert_eq!(ids.prompt_tokens, 5);
        let nested = parse(Endpoint::Completions, json!({"prompt": [[1, 2, 3]]})).unwrap();
        assert_eq!(nested.prompt_tokens, 3);
        assert_eq!(parse(Endpoint::Completions, json!({"prompt": ["a", "b"]})).unwrap_err(), ParseError::Batch);
        assert_eq!(parse(Endpoint::Completions, json!({"prompt": {"a": 1}})).unwrap_err(), ParseError::InvalidPrompt);
        assert_eq!(parse(Endpoint::Completions, json!({"model": "m"})).unwrap_err(), ParseError::MissingPrompt);
    }

    #[test]
    fn several_sequences_are_refused() {
        let base = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            parse(Endpoint::Chat, body)
        };
        for extra in [json!({"n": 2}), json!({"best_of": 3}), json!({"use_beam_search": true}), json!({"n": 0})] {
            assert_eq!(base(extra.clone()).unwrap_err().code(), "unsupported_n", "{extra}");
        }
        assert!(base(json!({"n": 1, "best_of": 1, "use_beam_search": false})).is_ok());
    }

    #[test]
    fn bad_limits() {
        let chat = |limit: Value| {
            parse(Endpoint::Chat, json!({"max_tokens": limit, "messages": [{"role": "user", "content": "x"}]}))
        };
        for bad in [json!(0), json!(-5), json!("lots"), json!(1.5)] {
            assert_eq!(chat(bad.clone()).unwrap_err().code(), "invalid_max_tokens", "{bad}");
        }
        let huge = chat(json!(4_294_967_295u64)).unwrap_err();
        assert_eq!((huge.status(), huge.code()), (413, "max_tokens_too_large"));
        assert_eq!(chat(json!(1e13)).unwrap_err().status(), 413);
        assert_eq!(chat(json!(1000.0)).unwrap().max_tokens, 1000);
        let small = Parser::new().max_output_tokens(64);
        let err = small.parse(
            Endpoint::Chat,
            Bytes::from_static(br#"{"max_tokens":65,"messages":[{"role":"user","content":"x"}]}"#),
        );
        assert_eq!(err.unwrap_err(), ParseError::MaxTokensTooLarge { field: "max_tokens", value: 65, limit: 64 });
        // The default never exceeds the largest reservation either.
        let chat = Parser::new()
            .default_max_tokens(1000)
            .max_output_tokens(64)
            .parse(Endpoint::Chat, Bytes::from_static(br#"{"messages":[{"role":"user","content":"x"}]}"#));
        assert_eq!(chat.unwrap().max_tokens, 64);
    }

    #[test]
    fn malformed_bodies() {
        let raw =
            |body: &'static [u8]| Parser::new().parse(Endpoint::Chat, Bytes::from_static(body)).unwrap_err().code();
        assert_eq!(raw(b"{\"messages\": ["), "invalid_json");
        assert_eq!(raw(b"[1, 2]"), "invalid_json");
        assert_eq!(raw(br#"{"max_tokens":10}"#), "missing_messages");
        assert_eq!(raw(br#"{"messages":[]}"#), "invalid_messages");
        assert_eq!(raw(br#"{"messages":[{"content":"hi"}]}"#), "invalid_messages");
        assert_eq!(raw(br#"{"messages":[{"role":"user","content":5}]}"#), "invalid_messages");
        assert_eq!(raw(br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#), "invalid_type");
        assert_eq!(raw(br#"{"messages":[{"role":"user","content":"x"}],"model":5}"#), "invalid_type");
    }

    #[test]
    fn the_prefix_is_the_leading_system_messages() {
        let prefix = |body: &str| Parser::new().parse(Endpoint::Chat, Bytes::from(body.to_owned())).unwrap().prefix;
        let french =
            prefix(r#"{"messages":[{"role":"system","content":"Answer in French."},{"role":"user","content":"a"}]}"#);
        let again =
            prefix(r#"{"messages":[{"role":"system","content":"Answer in French."},{"role":"user","content":"bb"}]}"#);
        let german =
            prefix(r#"{"messages":[{"role":"system","content":"Answer in German."},{"role":"user","content":"a"}]}"#);
        assert_eq!(french, again, "the same system prompt, another question: one prefix");
        assert_ne!(french.unwrap().id, german.unwrap().id);
        assert_eq!(prefix(r#"{"messages":[{"role":"user","content":"a"},{"role":"system","content":"x"}]}"#), None);
        let tools = prefix(
            r#"{"tools":[{"type":"function"}],"messages":[{"role":"system","content":"Answer in French."},{"role":"user","content":"a"}]}"#,
        );
        assert_ne!(tools.unwrap().id, french.unwrap().id, "other tools, another prefix");
        let two = prefix(
            r#"{"messages":[{"role":"system","content":"Answer in French."},{"role":"developer","content":"Be brief."},{"role":"user","content":"a"}]}"#,
        )
        .unwrap();
        assert!(two.tokens > french.unwrap().tokens);
        let completions = Parser::new().parse(Endpoint::Completions, Bytes::from_static(br#"{"prompt":"x"}"#)).unwrap();
        assert_eq!(completions.prefix, None);
    }
}
