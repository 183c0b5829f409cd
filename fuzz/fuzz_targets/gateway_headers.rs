//! The gateway's key and tenant path on arbitrary headers: `Authorization` (the key), the priority
//! header, a tenant header, `x-request-id`, `traceparent` and the TTFT deadline header, whatever bytes
//! they hold.
//!
//! It never panics. A caller is found only for a configured key (byte for byte, after `Bearer `); the
//! priority is never above the caller's; a tenant name is 1 to 128 bytes without control characters; the
//! request id is printable ASCII of at most 128 bytes; the trace id and span id are lower-case hex of 32
//! and 16 digits, never all zeros, and the `traceparent` sent upstream is well-formed; a deadline is never
//! zero, never longer than the gateway's default when there is one, nor than the header's limit.
//!
//! Input: a selector byte (which key is configured, the caller's class), then up to six header values
//! separated by `\n`.
#![no_main]

use kvgate::Priority;
use kvgate_gateway::deadline::{MAX_TTFT_DEADLINE, TTFT_DEADLINE_HEADER, request_ttft_deadline};
use kvgate_gateway::keys::{KeyHash, bearer};
use kvgate_gateway::tenants::{KeyConfig, Keys, PriorityConfig, TenantConfig, request_priority, tenant_name};
use kvgate_gateway::trace::Trace;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fn hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) && s.bytes().any(|b| b != b'0')
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let configured = ["sk-fuzz", "sk-other-key", "k"][usize::from(selector) % 3];
    let class = [PriorityConfig::Batch, PriorityConfig::Normal, PriorityConfig::Interactive][usize::from(selector >> 2) % 3];
    let tenants = [TenantConfig {
        name: "fuzz".into(),
        keys: vec![KeyConfig::Key(KeyHash::of(configured).to_string())],
        priority: class,
        ..TenantConfig::default()
    }];
    let keys = Keys::new(&tenants).unwrap();
    let names = ["authorization", "x-kvgate-priority", "x-team", "x-request-id", "traceparent", TTFT_DEADLINE_HEADER];
    let mut headers = http::HeaderMap::new();
    for (name, value) in names.iter().zip(rest.split(|b| *b == b'\n')) {
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            headers.insert(*name, value);
        }
    }
    match keys.caller(&headers) {
        Ok(Some(caller)) => {
            assert_eq!(bearer(&headers), Some(configured), "a caller without its key");
            let priority = request_priority(caller.priority, &headers);
            if let Ok(priority) = priority {
                assert!(priority <= caller.priority, "the header raised the class");
            }
        }
        Ok(None) => unreachable!("keys are configured"),
        Err(_) => assert_ne!(bearer(&headers), Some(configured)),
    }
    if let Ok(priority) = request_priority(Priority::Normal, &headers) {
        assert!(priority <= Priority::Normal);
    }
    if let Some(name) = headers.get("x-team").and_then(|v| v.to_str().ok()).and_then(tenant_name) {
        assert!(!name.is_empty() && name.len() <= 128 && !name.chars().any(char::is_control));
    }
    let default = (selector & 0x10 != 0).then(|| Duration::from_millis(u64::from(selector) * 37 + 1));
    if let Ok(deadline) = request_ttft_deadline(default, &headers) {
        match (deadline, default) {
            (None, None) => assert!(!headers.contains_key(TTFT_DEADLINE_HEADER)),
            (None, Some(_)) => unreachable!("a default deadline was lost"),
            (Some(d), default) => {
                assert!(!d.is_zero() && d <= MAX_TTFT_DEADLINE, "{d:?}");
                assert!(default.is_none_or(|default| d <= default), "the header lengthened the deadline");
            }
        }
    }
    let trace = Trace::from_headers(&headers);
    assert!(!trace.request_id.is_empty() && trace.request_id.len() <= 128);
    assert!(trace.request_id.bytes().all(|b| b.is_ascii_graphic()));
    assert!(hex(&trace.trace_id, 32) && hex(&trace.span_id, 16), "{trace:?}");
    let parent = trace.traceparent();
    assert!(http::HeaderValue::from_str(&parent).is_ok());
    assert_eq!(parent.split('-').count(), 4, "{parent}");
});
