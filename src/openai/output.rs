//! Counting the output tokens of an OpenAI-compatible answer as it passes through: SSE chunks, the
//! `usage` object of a streamed answer's last chunk (`stream_options.include_usage`) or of a whole JSON
//! answer.

use crate::stream::OutputCounter;
use serde_json::Value;

/// The longest SSE line kept while waiting for its end; a longer one is skipped (and not counted).
const MAX_LINE: usize = 1 << 20;

/// Bytes of a JSON answer kept between two frames, so that a `usage` split across them is still read.
const CARRY: usize = 64;

/// The key whose number is the output count.
const KEY: &[u8] = b"\"completion_tokens\"";

/// Counts the output tokens of an OpenAI-compatible response body, frame by frame, as an
/// [`OutputCounter`] for [`PermitBody`](crate::http::PermitBody) and
/// [`AdmissionLayer`](crate::tower::AdmissionLayer).
///
/// - **SSE** (`data: {...}` events): the `usage.completion_tokens` of a chunk that has one (the last
///   chunk with `stream_options.include_usage`) is the count; until one arrives, every chunk carrying
///   generated text (`delta.content`, `text`, reasoning or tool-call arguments) counts one token, as
///   vLLM, llama.cpp, SGLang and Ollama send one token per chunk.
/// - **JSON** (a whole answer): the last `"completion_tokens"` number of the body, read without
///   buffering it (the top-level `usage` comes after the choices). No `usage` (an error body, an engine
///   that omits it): **no count** — the permit is returned without a report rather than with a guess.
/// - Anything else: no count.
///
/// # Examples
///
/// ```
/// use kvgate::openai::OutputTokens;
/// use kvgate::stream::OutputCounter;
///
/// let mut json = OutputTokens::new();
/// let frames: [&[u8]; 2] = [br#"{"choices":[{"message":{"content":"Hi!"}}],"usage":{"prompt_tokens":9,"comple"#, br#"tion_tokens":12,"total_tokens":21}}"#];
/// let summed: u32 = frames.iter().map(|f| json.count(*f)).sum();
/// assert_eq!(OutputCounter::<[u8]>::total(&json, summed), Some(12));
///
/// let mut sse = OutputTokens::new();
/// let frame = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
/// let summed = sse.count(&frame[..]);
/// assert_eq!(OutputCounter::<[u8]>::total(&sse, summed), Some(1));
/// ```
#[derive(Debug, Clone, Default)]
pub struct OutputTokens {
    format: Format,
    /// SSE: the partial line; JSON: the last [`CARRY`] bytes seen.
    pending: Vec<u8>,
    /// SSE: skipping the rest of an over-long line.
    skipping: bool,
    /// JSON: bytes seen before `pending`'s start (absolute offsets of matches).
    offset: usize,
    /// JSON: the absolute offset of the last match read (matches are read once).
    last_match: Option<usize>,
    /// JSON: a match whose colon or number runs on past the bytes seen so far.
    open: Option<Open>,
    /// The last `usage.completion_tokens` seen.
    usage: Option<u32>,
}

/// A `"completion_tokens"` match read up to the end of the bytes seen so far: its absolute offset and
/// where its reading stands. Carried as a state, so that white space or digits of any length after the
/// key are read as in a whole body, however the frames cut them.
#[derive(Debug, Clone, Copy)]
struct Open {
    at: usize,
    stage: Stage,
}

/// Where the reading of a match's `: N` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// White space after the key, before the colon.
    Key,
    /// White space after the colon, before the number.
    Colon,
    /// The number's digits so far (saturating).
    Digits(u64),
}

/// What reading a match's `: N` in some bytes came to.
enum Read {
    /// The number, ended by a byte that is not a digit.
    Number(u64),
    /// Not `: N`: the match counts for nothing.
    NotANumber,
    /// The bytes ended first: the stage reached.
    More(Stage),
}

impl Stage {
    /// Reads on from this stage through `bytes`.
    fn read(mut self, bytes: &[u8]) -> Read {
        for &b in bytes {
            self = match self {
                Stage::Key | Stage::Colon if b.is_ascii_whitespace() => self,
                Stage::Key if b == b':' => Stage::Colon,
                Stage::Colon | Stage::Digits(_) if b.is_ascii_digit() => {
                    let n = if let Stage::Digits(n) = self { n } else { 0 };
                    Stage::Digits(n.saturating_mul(10).saturating_add(u64::from(b - b'0')))
                }
                Stage::Digits(n) => return Read::Number(n),
                Stage::Key | Stage::Colon => return Read::NotANumber,
            };
        }
        Read::More(self)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Format {
    #[default]
    Unknown,
    Sse,
    Json,
    Other,
}

impl OutputTokens {
    /// A counter for one response body.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `usage.completion_tokens` seen so far, if any.
    pub fn usage(&self) -> Option<u32> {
        self.usage
    }

    /// SSE: tokens in the complete lines of `pending` plus `bytes`; keeps the partial last line.
    fn sse(&mut self, mut bytes: &[u8]) -> u32 {
        let mut tokens = 0u32;
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            let (line, rest) = bytes.split_at(end);
            bytes = &rest[1..];
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if self.pending.is_empty() {
                tokens = tokens.saturating_add(self.sse_line(line));
            } else {
                let mut whole = std::mem::take(&mut self.pending);
                whole.extend_from_slice(line);
                tokens = tokens.saturating_add(self.sse_line(&whole));
            }
        }
        if !self.skipping {
            if self.pending.len() + bytes.len() > MAX_LINE {
                self.pending.clear();
                self.skipping = true;
            } else {
                self.pending.extend_from_slice(bytes);
            }
        }
        tokens
    }

    /// One SSE line: 1 for a chunk with generated text, 0 otherwise; notes a `usage`.
    fn sse_line(&mut self, line: &[u8]) -> u32 {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { return 0 };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data.starts_with(b"[DONE]") {
            return 0;
        }
        let Ok(chunk) = serde_json::from_slice::<Value>(data) else { return 0 };
        if let Some(n) = chunk.pointer("/usage/completion_tokens").and_then(Value::as_u64) {
            self.usage = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        let generated = chunk.get("choices").and_then(Value::as_array).is_some_and(|choices| {
            choices.iter().any(|choice| {
                let delta = choice.get("delta").unwrap_or(choice);
                ["content", "text", "reasoning_content", "reasoning"]
                    .iter()
                    .any(|field| delta.get(*field).and_then(Value::as_str).is_some_and(|s| !s.is_empty()))
                    || delta.get("tool_calls").and_then(Value::as_array).is_some_and(|calls| !calls.is_empty())
            })
        });
        u32::from(generated)
    }

    /// JSON: reads every complete `"completion_tokens": N` in the carried tail plus `bytes`. A number
    /// still open when the body ends is not counted (it may have been cut short).
    fn json(&mut self, bytes: &[u8]) {
        if let Some(open) = self.open.take() {
            match open.stage.read(bytes) {
                Read::Number(n) => self.read(open.at, n),
                Read::NotANumber => self.last_match = Some(open.at),
                Read::More(stage) => self.open = Some(Open { stage, ..open }),
            }
        }
        let mut window = std::mem::take(&mut self.pending);
        window.extend_from_slice(bytes);
        let mut from = 0;
        while let Some(at) = find_key(&window[from..]).map(|i| i + from) {
            from = at + 1;
            let absolute = self.offset + at;
            let seen = self.last_match.max(self.open.map(|open| open.at));
            if seen.is_some_and(|last| absolute <= last) {
                continue;
            }
            match Stage::Key.read(&window[at + KEY.len()..]) {
                Read::Number(n) => self.read(absolute, n),
                Read::NotANumber => {}
                Read::More(stage) => {
                    // It runs to the end of what was seen: the next frame reads on from here.
                    self.open = Some(Open { at: absolute, stage });
                    break;
                }
            }
        }
        let keep = window.len().min(CARRY);
        self.offset += window.len() - keep;
        window.drain(..window.len() - keep);
        self.pending = window;
    }

    /// Notes the number `n` of the match at absolute offset `at`.
    fn read(&mut self, at: usize, n: u64) {
        self.usage = Some(u32::try_from(n).unwrap_or(u32::MAX));
        self.last_match = Some(at);
    }
}

/// The first [`KEY`] in `haystack` (a searcher built once).
fn find_key(haystack: &[u8]) -> Option<usize> {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(KEY));
    FINDER.find(haystack)
}

impl<T: AsRef<[u8]> + ?Sized> OutputCounter<T> for OutputTokens {
    fn count(&mut self, item: &T) -> u32 {
        let bytes = item.as_ref();
        if self.format == Format::Unknown {
            self.format = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
                None => return 0,
                Some(b'{') => Format::Json,
                Some(b'd' | b'e' | b'i' | b'r' | b':') => Format::Sse,
                Some(_) => Format::Other,
            };
        }
        match self.format {
            Format::Sse => self.sse(bytes),
            Format::Json => {
                self.json(bytes);
                0
            }
            Format::Unknown | Format::Other => 0,
        }
    }

    fn total(&self, summed: u32) -> Option<u32> {
        match self.format {
            Format::Sse => Some(self.usage.unwrap_or(summed)),
            // An empty body generated nothing.
            Format::Unknown => Some(0),
            Format::Json => self.usage,
            Format::Other => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(frames: &[&[u8]]) -> Option<u32> {
        let mut counter = OutputTokens::new();
        let summed = frames.iter().map(|f| OutputCounter::<[u8]>::count(&mut counter, *f)).sum();
        OutputCounter::<[u8]>::total(&counter, summed)
    }

    #[test]
    fn vllm_chat_stream_without_usage_counts_chunks_with_text() {
        let stream = concat!(
            "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        assert_eq!(run(&[stream.as_bytes()]), Some(2));
        // Split anywhere, the same.
        for cut in 1..stream.len() {
            let (a, b) = stream.as_bytes().split_at(cut);
            assert_eq!(run(&[a, b]), Some(2), "cut at {cut}");
        }
    }

    #[test]
    fn include_usage_gives_the_exact_count() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello world\"}}],\"usage\":null}\r\n\r\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\r\n\r\n",
            "data: [DONE]\r\n\r\n"
        );
        assert_eq!(run(&[stream.as_bytes()]), Some(7));
    }

    #[test]
    fn completions_stream_and_tool_calls_count() {
        let stream = concat!(
            "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" the\",\"logprobs\":null,\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\"}}]}}]}\n\n",
            "data: {\"error\":{\"message\":\"boom\"}}\n\n",
        );
        assert_eq!(run(&[stream.as_bytes()]), Some(2));
    }

    #[test]
    fn a_whole_json_answer_reports_its_usage_even_split() {
        let body = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"say \"completion_tokens\": 99"},"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":345,"total_tokens":357,"completion_tokens_details":null},"timings":{"predicted_n":345}}"#;
        assert_eq!(run(&[body]), Some(345));
        for cut in 1..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(run(&[a, b]), Some(345), "cut at {cut}");
        }
        let bytewise: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(run(&bytewise), Some(345));
    }

    #[test]
    fn a_long_number_or_long_white_space_is_read_however_it_is_cut() {
        let long = format!("{{\"usage\":{{\"completion_tokens\":{}}}}}", "8".repeat(150));
        let spaced = format!("{{\"usage\":{{\"completion_tokens\"{}:{}7}}}}", " ".repeat(100), " ".repeat(100));
        let zeros = format!("{{\"completion_tokens\":{}12,\"x\":1}}", "0".repeat(200));
        let not_a_number = format!("{{\"completion_tokens\"{}x, \"completion_tokens\":3}}", " ".repeat(100));
        for (body, count) in [(long, Some(u32::MAX)), (spaced, Some(7)), (zeros, Some(12)), (not_a_number, Some(3))] {
            let body = body.as_bytes();
            assert_eq!(run(&[body]), count);
            for cut in 1..body.len() {
                let (a, b) = body.split_at(cut);
                assert_eq!(run(&[a, b]), count, "cut at {cut}");
            }
            let bytewise: Vec<&[u8]> = body.chunks(1).collect();
            assert_eq!(run(&bytewise), count);
        }
        // A number the body ends in may have been cut short: not counted, however it is cut.
        let cut_short = b"{\"completion_tokens\":12";
        assert_eq!(run(&[cut_short]), None);
        assert_eq!(run(&cut_short.chunks(1).collect::<Vec<_>>()), None);
    }

    #[test]
    fn what_cannot_be_counted_reports_nothing() {
        assert_eq!(run(&[br#"{"error":{"message":"overloaded","code":503}}"#]), None);
        assert_eq!(run(&[b"<html>busy</html>"]), None);
        assert_eq!(run(&[br#"{"choices":[{"message":{"content":"no usage here"}}]}"#]), None);
        assert_eq!(run(&[]), Some(0));
    }

    #[test]
    fn an_over_long_line_is_skipped() {
        let mut long = b"data: {\"choices\":[{\"delta\":{\"content\":\"".to_vec();
        long.extend(std::iter::repeat_n(b'x', 2 * MAX_LINE));
        long.extend_from_slice(b"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"y\"}}]}\n\n");
        let frames: Vec<&[u8]> = long.chunks(4096).collect();
        assert_eq!(run(&frames), Some(1));
    }
}
