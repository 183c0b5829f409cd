//! The Prometheus text exposition format (version 0.0.4, and the sample lines of OpenMetrics), read line
//! by line without allocating.
//!
//! ```text
//! # HELP vllm:num_requests_running Number of requests in model execution batches.
//! # TYPE vllm:num_requests_running gauge
//! vllm:num_requests_running{engine="0",model_name="m"} 3.0
//! metric_name [ "{" label_name "=" '"' label_value '"' { "," label_name "=" ... } [ "," ] "}" ] value [ timestamp ] [ "#" exemplar ]
//! ```
//!
//! # Rules kept
//! - Lines are separated by `\n` (a `\r` before it is ignored); blank lines and lines starting with `#`
//!   (HELP, TYPE, EOF, comments) carry no sample.
//! - A metric name matches `[a-zA-Z_:][a-zA-Z0-9_:]*`, a label name `[a-zA-Z_][a-zA-Z0-9_]*`; a label value
//!   is a double-quoted string in which `\\`, `\"` and `\n` are escapes.
//! - The value is a float as Go's `ParseFloat` reads it, `NaN`, `+Inf` and `-Inf` included; an optional
//!   integer timestamp and an OpenMetrics exemplar (`# {...} value`) may follow and are ignored.
//! - Anything else is an error naming the line (1-based), as Prometheus fails a scrape on a malformed line.

use super::error::FeedbackError;

/// One sample line: a metric name, its labels (the text between the braces, validated), and its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// The metric name (for a counter, with its `_total` suffix as exposed).
    pub name: &'a str,
    labels: &'a str,
    /// The value.
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The value of label `key`, unescaped; `None` when the sample has no such label.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::feedback::samples;
    ///
    /// let text = "vllm:num_requests_running{engine=\"0\",model_name=\"say \\\"hi\\\"\"} 3\n";
    /// let sample = samples(text).next().unwrap()?;
    /// assert_eq!(sample.label("engine").as_deref(), Some("0"));
    /// assert_eq!(sample.label("model_name").as_deref(), Some("say \"hi\""));
    /// assert_eq!(sample.label("tp_rank"), None);
    /// # Ok::<(), kvgate::feedback::FeedbackError>(())
    /// ```
    pub fn label(&self, key: &str) -> Option<String> {
        let mut rest = self.labels;
        loop {
            rest = rest.trim_start_matches([' ', '\t', ',']);
            if rest.is_empty() {
                return None;
            }
            // The labels were validated when the sample was read, so these cannot fail.
            let (name, after) = split_label_name(rest).ok()?;
            let after = after.trim_start().strip_prefix('=')?.trim_start();
            let (value, after) = quoted(after).ok()?;
            if name == key {
                return Some(unescape(value));
            }
            rest = after;
        }
    }
}

/// The samples of an exposition, in order, each `Ok` or an error naming its line.
///
/// # Examples
///
/// ```
/// use kvgate::feedback::samples;
///
/// let text = "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine=\"0\"} 12.0\n";
/// let all: Vec<_> = samples(text).collect::<Result<_, _>>()?;
/// assert_eq!((all[0].name, all[0].value), ("vllm:num_preemptions_total", 12.0));
/// assert!(samples("vllm:x{engine=0} 1").next().unwrap().is_err()); // unquoted label value
/// # Ok::<(), kvgate::feedback::FeedbackError>(())
/// ```
pub fn samples(text: &str) -> impl Iterator<Item = Result<Sample<'_>, FeedbackError>> {
    text.split('\n').enumerate().filter_map(|(index, line)| {
        let line = line.strip_suffix('\r').unwrap_or(line).trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        Some(sample(line).map_err(|reason| FeedbackError::Exposition { line: index + 1, reason }))
    })
}

fn sample(line: &str) -> Result<Sample<'_>, String> {
    let name_end = line
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())))
        .map_or(line.len(), |(i, _)| i);
    if name_end == 0 {
        return Err(format!("expected a metric name at {:?}", excerpt(line)));
    }
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = "";
    if let Some(inner) = rest.strip_prefix('{') {
        let end = labels_end(inner)?;
        labels = &inner[..end];
        rest = &inner[end + 1..];
    }
    if !rest.starts_with([' ', '\t']) {
        return Err(format!("expected a space and a value after {name:?}"));
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().ok_or_else(|| format!("{name} has no value"))?;
    let value = parse_value(value).ok_or_else(|| format!("{name}: {value:?} is not a number"))?;
    match fields.next() {
        None => {}
        Some(first) if first.starts_with('#') => {} // an exemplar
        Some(timestamp) => {
            if timestamp.parse::<i64>().is_err() {
                return Err(format!("{name}: {timestamp:?} is not a timestamp (milliseconds)"));
            }
            if let Some(extra) = fields.next() {
                if !extra.starts_with('#') {
                    return Err(format!("{name}: unexpected {extra:?} after the timestamp"));
                }
            }
        }
    }
    Ok(Sample { name, labels, value })
}

/// The index of the `}` closing a label set that starts at `inner` (after its `{`), checking every pair.
fn labels_end(inner: &str) -> Result<usize, String> {
    let mut rest = inner;
    loop {
        let trimmed = rest.trim_start_matches([' ', '\t']);
        if let Some(after) = trimmed.strip_prefix('}') {
            return Ok(inner.len() - after.len() - 1);
        }
        let (_, after) = split_label_name(trimmed)?;
        let after = after.trim_start().strip_prefix('=').ok_or("expected `=` after a label name")?.trim_start();
        let (_, after) = quoted(after)?;
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(after) => after,
            None if after.starts_with('}') => after,
            None => return Err(format!("expected `,` or `}}` at {:?}", excerpt(after))),
        };
    }
}

fn split_label_name(text: &str) -> Result<(&str, &str), String> {
    let end = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit())))
        .map_or(text.len(), |(i, _)| i);
    if end == 0 {
        return Err(format!("expected a label name at {:?}", excerpt(text)));
    }
    Ok(text.split_at(end))
}

/// A double-quoted label value (still escaped) and the text after its closing quote.
fn quoted(text: &str) -> Result<(&str, &str), String> {
    let body = text.strip_prefix('"').ok_or_else(|| format!("expected a quoted label value at {:?}", excerpt(text)))?;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => return Ok((&body[..i], &body[i + 1..])),
            _ => {}
        }
    }
    Err("a label value is not closed by `\"`".into())
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// A float as Go's `ParseFloat` reads Prometheus values: Rust's syntax plus `+Inf`/`-Inf`/`NaN` in any case.
fn parse_value(text: &str) -> Option<f64> {
    text.parse::<f64>().ok()
}

fn excerpt(text: &str) -> &str {
    match text.char_indices().nth(24) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Result<Sample<'_>, String> {
        sample(line)
    }

    #[test]
    fn reads_what_engines_write() {
        let s = one(r#"vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.42"#).unwrap();
        assert_eq!((s.name, s.value), ("vllm:kv_cache_usage_perc", 0.42));
        assert_eq!(s.label("model_name").as_deref(), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(one("sglang:token_usage 2.8e-01").unwrap().value, 0.28);
        assert_eq!(one("x +Inf").unwrap().value, f64::INFINITY);
        assert_eq!(one("x -Inf").unwrap().value, f64::NEG_INFINITY);
        assert!(one("x NaN").unwrap().value.is_nan());
        assert_eq!(one("x{} 1 1700000000000").unwrap().value, 1.0);
        assert_eq!(one(r#"x{a="1",} 2 # {trace_id="abc"} 1.0"#).unwrap().value, 2.0);
        assert_eq!(one(r#"x{ a = "}" , b="\\\"" } 3"#).unwrap().label("b").as_deref(), Some("\\\""));
        assert_eq!(one(r#"x{a="l\nine"} 3"#).unwrap().label("a").as_deref(), Some("l\nine"));
    }

    #[test]
    fn malformed_lines_are_errors_with_their_number() {
        for bad in [
            "9x 1",
            "x",
            "x{a=\"1\"}",
            "x{a=1} 1",
            "x{a=\"1\" 1",
            "x{=\"1\"} 1",
            "x{a\"1\"} 1",
            "x one",
            "x 1 soon",
            "x 1 2 3",
            "x{a=\"1\"b=\"2\"} 1",
            "x{a=\"unclosed} 1",
        ] {
            assert!(one(bad).is_err(), "{bad:?} was accepted");
        }
        let text = "# HELP x fine\nx 1\r\n\nx{a=1} 2\n";
        let errors: Vec<_> = samples(text).filter_map(Result::err).collect();
        assert!(matches!(errors[..], [FeedbackError::Exposition { line: 4, .. }]), "{errors:?}");
    }
}
