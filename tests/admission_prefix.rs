//! Shared prefixes: a prompt prefix many requests start with is charged once while any of them holds a
//! permit, in tokens and in engine-exact bytes, for admitted and waiting requests, with a bounded table.
#![cfg(not(loom))]

use futures::FutureExt;
use kvgate::kv::{GpuPlan, ModelSpec};
use kvgate::{Admission, PrefixId, Rejection, Request, TenantLimits};

const SYSTEM_PROMPT: &str = "You are the company's assistant. Be concise.";

#[test]
fn a_hundred_requests_sharing_a_prefix_fit_one_prefix_and_a_hundred_suffixes() {
    // 4,000-token system prompt, 60-token question, 40-token answer: 100 of them need
    // 4,000 + 100 x 100 tokens with sharing, 100 x 4,100 without.
    let admission = Admission::builder().kv_capacity_tokens(4_000 + 100 * 100).prefix_sharing(16).build().unwrap();
    let chat = Request::new(4_060, 40).prefix(SYSTEM_PROMPT, 4_000);
    let permits: Vec<_> = (0..100).map(|i| admission.try_admit(&chat).unwrap_or_else(|e| panic!("{i}: {e}"))).collect();
    assert!(permits.iter().all(|p| p.kv_reserved() == 100));
    let s = admission.snapshot();
    assert_eq!((s.kv_used, s.prefixes, s.kv_saved_by_prefixes), (14_000, 1, 99 * 4_000));
    assert!(matches!(admission.try_admit(&chat), Err(Rejection::NoCapacity { .. })));
    drop(permits);
    let s = admission.snapshot();
    assert_eq!((s.kv_used, s.in_flight, s.prefixes), (0, 0, 0), "the last holder returns the prefix");

    // Without sharing the same budget holds three.
    let alone = Admission::builder().kv_capacity_tokens(14_000).build().unwrap();
    let held: Vec<_> = std::iter::from_fn(|| alone.try_admit(&chat).ok()).collect();
    assert_eq!(held.len(), 3);
}

#[test]
fn in_engine_exact_bytes_too() {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    let prefix = plan.prefix_bytes(4_000);
    let suffix = plan.max_suffix_bytes(4_100, 4_000);
    assert!(prefix > 0 && suffix > 0);
    let admission = Admission::builder()
        .kv_layout(plan.layout().clone())
        .kv_capacity_bytes(prefix + 100 * suffix)
        .prefix_sharing(16)
        .build()
        .unwrap();
    let chat = Request::new(4_060, 40).prefix(SYSTEM_PROMPT, 4_000);
    let permits: Vec<_> = (0..100).map(|_| admission.try_admit(&chat).unwrap()).collect();
    assert_eq!(admission.snapshot().kv_used, prefix + 100 * suffix);
    assert!(admission.try_admit(&chat).is_err());
    drop(permits);
    assert_eq!(admission.snapshot().kv_used, 0);
}

#[test]
fn waiters_are_charged_their_suffix_when_the_prefix_is_held() {
    let admission = Admission::builder().kv_capacity_tokens(1_200).max_in_flight(2).prefix_sharing(4).build().unwrap();
    let chat = Request::new(1_050, 50).prefix("p", 1_000);
    let a = admission.try_admit(&chat).unwrap();
    let b = admission.try_admit(&chat).unwrap();
    let mut c = admission.admit(&chat);
    assert!((&mut c).now_or_never().is_none(), "no slot");
    drop(a);
    let c = c.now_or_never().expect("granted").unwrap();
    assert_eq!(c.kv_reserved(), 100);
    assert_eq!(admission.snapshot().kv_used, 1_000 + 2 * 100);
    drop((b, c));
    assert_eq!(admission.snapshot().kv_used, 0);
}

#[test]
fn invented_prefix_ids_cannot_grow_the_table() {
    let admission = Admission::builder().kv_capacity_tokens(1 << 30).prefix_sharing(8).build().unwrap();
    let mut held = Vec::new();
    for id in 0..10_000u64 {
        held.push(admission.try_admit(&Request::new(100, 10).prefix(id, 90)).unwrap());
    }
    let s = admission.snapshot();
    assert_eq!(s.prefixes, 8);
    // Beyond the table each request is charged in full: nothing is under-counted.
    assert_eq!(s.kv_used, 10_000 * 110);
    drop(held);
    assert_eq!(admission.snapshot().prefixes, 0);
}

#[test]
fn a_prefix_longer_than_the_prompt_counts_as_the_prompt_less_one_token_and_zero_entries_is_an_error() {
    // The engine computes the prompt's last token itself: 99 of the 100 come from the prefix.
    let admission = Admission::builder().kv_capacity_tokens(1_000).prefix_sharing(4).build().unwrap();
    let long = Request::new(100, 20).prefix("p", 10_000);
    let a = admission.try_admit(&long).unwrap();
    let b = admission.try_admit(&long).unwrap();
    assert_eq!((a.kv_reserved(), b.kv_reserved()), (21, 21));
    assert_eq!(admission.snapshot().kv_used, 99 + 2 * 21);
    // A prompt of one token takes nothing from a prefix: no entry, charged in full.
    let one = admission.try_admit(&Request::new(1, 9).prefix("q", 1)).unwrap();
    assert_eq!((one.kv_reserved(), admission.snapshot().prefixes), (10, 1));
    assert!(Admission::builder().prefix_sharing(0).build().is_err());
}

#[test]
fn a_prefix_equal_to_the_prompt_leaves_each_request_its_last_block() {
    // vLLM caps a cache hit at the prompt less one token: with the prompt exactly the prefix, each request
    // recomputes the prefix's last block into a block of its own.
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    let admission = Admission::builder().gpu_plan(&plan).prefix_sharing(4).build().unwrap();
    let request = Request::new(4_096, 64).prefix("system", 4_096);
    let permits: Vec<_> = (0..10).map(|_| admission.try_admit(&request).unwrap()).collect();
    let shared = plan.prefix_bytes(4_095);
    assert_eq!(shared, plan.prefix_bytes(4_096) - plan.layout().block_bytes(), "the prefix's last block is its own");
    assert_eq!(admission.snapshot().kv_used, shared + 10 * plan.max_suffix_bytes(4_160, 4_095));
    drop(permits);
}

#[test]
fn requests_pricing_one_prefix_differently_do_not_share_it() {
    // A short request naming the system prompt prices it at its own prompt (less one token); chats that
    // really start with the whole prompt are charged in full while that entry is held.
    let admission = Admission::builder().kv_capacity_tokens(20_000).prefix_sharing(16).build().unwrap();
    let short = admission.try_admit(&Request::new(100, 10).prefix("system", 4_000)).unwrap();
    let chats: Vec<_> =
        std::iter::from_fn(|| admission.try_admit(&Request::new(4_100, 100).prefix("system", 4_000)).ok()).collect();
    assert_eq!(chats.len(), 4, "each chat charged its whole 4,200 tokens");
    assert_eq!(admission.snapshot().kv_used, 110 + 4 * 4_200);
    drop((short, chats));
    // With the short request gone the chats share the prefix again.
    let chats: Vec<_> =
        std::iter::from_fn(|| admission.try_admit(&Request::new(4_100, 100).prefix("system", 4_000)).ok()).collect();
    assert_eq!(chats.len(), 80, "(20,000 − 4,000) / 200");
    assert_eq!(admission.snapshot().kv_used, 4_000 + 80 * 200);
}

#[test]
fn bytes_requests_pricing_one_prefix_differently_stay_within_the_budget() {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    let admission = Admission::builder().gpu_plan(&plan).prefix_sharing(16).build().unwrap();
    // The short request's prefix is its 99 tokens: six blocks from the cache, a pricing of its own.
    let short = admission.try_admit(&Request::new(100, 16).prefix("system", 8_000)).unwrap();
    assert_eq!(short.prefix(), Some(PrefixId::from("system")));
    let chats: Vec<_> =
        std::iter::from_fn(|| admission.try_admit(&Request::new(8_100, 100).prefix("system", 8_000)).ok()).collect();
    // Each chat is charged in full: the engine's bytes for every chat fit the budget.
    let used = admission.snapshot().kv_used;
    let short_whole = plan.prefix_bytes(99) + short.kv_reserved();
    assert_eq!(used, short_whole + chats.len() as u64 * plan.max_sequence_bytes(8_200));
    assert!(used <= plan.kv_budget_bytes());
    drop((short, chats));
}

#[test]
fn another_length_of_a_sliding_prefix_shares_nothing() {
    // Every layer slides: the prefix's cached blocks are its last window, as many bytes at 10,000 tokens
    // as at 20,000 but different blocks. The two lengths must not share one entry.
    let plan = GpuPlan::builder(ModelSpec::preset("mistral-7b").unwrap()).gpu("h100-80").build().unwrap();
    assert_eq!(plan.prefix_bytes(10_000), plan.prefix_bytes(20_000));
    let admission = Admission::builder().gpu_plan(&plan).prefix_sharing(4).build().unwrap();
    let short = admission.try_admit(&Request::new(10_001, 100).prefix("system", 10_000)).unwrap();
    let long = admission.try_admit(&Request::new(20_001, 100).prefix("system", 20_000)).unwrap();
    let cut = admission.try_admit(&Request::new(15_001, 100).prefix("system", 20_000)).unwrap();
    assert_eq!(short.prefix(), Some(PrefixId::from("system")));
    assert_eq!((long.prefix(), long.kv_reserved()), (None, plan.max_sequence_bytes(20_101)));
    assert_eq!((cut.prefix(), cut.kv_reserved()), (None, plan.max_sequence_bytes(15_101)));
    let short_whole = plan.prefix_bytes(10_000) + plan.max_suffix_bytes(10_101, 10_000);
    assert_eq!(admission.snapshot().kv_used, short_whole + long.kv_reserved() + cut.kv_reserved());
    drop((short, long, cut));
    assert_eq!((admission.snapshot().kv_used, admission.snapshot().prefixes), (0, 0));
}

#[test]
fn a_request_sharing_nothing_costs_what_it_costs_without_a_prefix() {
    // With sliding layers the prefix and its suffix counted apart hold a window twice; a request that
    // shares nothing, or whose shared pricing cannot fit the budget, pays only its own cost.
    let plan = GpuPlan::builder(ModelSpec::preset("gemma-3-27b").unwrap()).gpu("h100-80").build().unwrap();
    let alone = plan.max_sequence_bytes(20_100);
    assert!(plan.prefix_bytes(19_999) + plan.max_suffix_bytes(20_100, 19_999) > alone);
    let tight = Admission::builder()
        .kv_layout(plan.layout().clone())
        .kv_capacity_bytes(alone)
        .prefix_sharing(4)
        .build()
        .unwrap();
    let named = tight.try_admit(&Request::new(20_000, 100).prefix("system", 19_999)).unwrap();
    assert_eq!((named.prefix(), named.kv_reserved()), (None, alone));
    drop(named);
    let full = Admission::builder().gpu_plan(&plan).prefix_sharing(1).build().unwrap();
    let _other = full.try_admit(&Request::new(200, 10).prefix("other", 100)).unwrap();
    let left_out = full.try_admit(&Request::new(20_000, 100).prefix("system", 19_999)).unwrap();
    assert_eq!((left_out.prefix(), left_out.kv_reserved()), (None, alone));
}

#[test]
fn a_prefix_shorter_than_a_block_takes_no_entry() {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    assert_eq!(plan.prefix_bytes(8), 0);
    let admission = Admission::builder().gpu_plan(&plan).prefix_sharing(1).build().unwrap();
    let tiny = admission.try_admit(&Request::new(100, 10).prefix("greeting", 8)).unwrap();
    assert_eq!(
        (tiny.prefix(), tiny.kv_reserved(), admission.snapshot().prefixes),
        (None, plan.max_sequence_bytes(110), 0)
    );
    // The system prompt still finds the table's one slot.
    let chat = Request::new(4_100, 100).prefix("system", 4_000);
    let chats: Vec<_> = (0..3).map(|_| admission.try_admit(&chat).unwrap()).collect();
    assert!(chats.iter().all(|c| c.prefix() == Some(PrefixId::from("system"))));
    assert_eq!(admission.snapshot().prefixes, 1);
}

#[test]
fn a_waiter_resized_out_is_told_what_it_needs() {
    let admission = Admission::builder().kv_capacity_tokens(1_000).prefix_sharing(4).build().unwrap();
    let _holder = admission.try_admit(&Request::new(600, 100).prefix("p", 500)).unwrap();
    let _filler = admission.try_admit(&Request::new(200, 50)).unwrap();
    let mut waiting = admission.admit(&Request::new(550, 50).prefix("p", 500));
    assert!((&mut waiting).now_or_never().is_none());
    // Under 600 it can never run once the prefix's holder leaves: the prefix and its suffix.
    admission.set_kv_capacity(550).unwrap();
    match waiting.now_or_never() {
        Some(Err(Rejection::TooLarge { requested, capacity, .. })) => assert_eq!((requested, capacity), (600, 550)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_tenant_share_counts_a_request_at_most_its_cost_without_a_prefix() {
    // gemma-3-27b: the prefix and its suffix counted apart exceed the request's own cost; a share between
    // the two admits the request, named prefix or not.
    let plan = GpuPlan::builder(ModelSpec::preset("gemma-3-27b").unwrap()).gpu("h100-80").build().unwrap();
    let alone = plan.max_sequence_bytes(20_100);
    let whole = plan.prefix_bytes(19_999) + plan.max_suffix_bytes(20_100, 19_999);
    let budget = 4 * whole;
    let share = (alone + whole) as f64 / 2.0 / budget as f64;
    let admission = Admission::builder()
        .kv_layout(plan.layout().clone())
        .kv_capacity_bytes(budget)
        .prefix_sharing(4)
        .tenant_defaults(TenantLimits::new().kv_share(share))
        .build()
        .unwrap();
    let named = admission.try_admit(&Request::new(20_000, 100).tenant("a").prefix("system", 19_999)).unwrap();
    assert_eq!(named.prefix(), Some(PrefixId::from("system")));
}

#[test]
fn a_prefix_every_sharer_would_hold_again_shares_nothing() {
    // mistral-7b: every layer slides past a 2,000-token prefix, so a request's suffix is its whole cost;
    // sharing would save nothing and charge the prefix besides.
    let plan = GpuPlan::builder(ModelSpec::preset("mistral-7b").unwrap()).gpu("h100-80").build().unwrap();
    assert_eq!(plan.max_suffix_bytes(8_100, 2_000), plan.max_sequence_bytes(8_100));
    let admission = Admission::builder().gpu_plan(&plan).prefix_sharing(4).build().unwrap();
    let permits: Vec<_> =
        (0..10).map(|_| admission.try_admit(&Request::new(8_000, 100).prefix("system", 2_000)).unwrap()).collect();
    assert!(permits.iter().all(|p| p.prefix().is_none()));
    let s = admission.snapshot();
    assert_eq!((s.kv_used, s.prefixes, s.kv_saved_by_prefixes), (10 * plan.max_sequence_bytes(8_100), 0, 0));
}

#[test]
fn what_sharing_saved_is_each_later_holders_cost_without_a_prefix_less_its_suffix() {
    // gemma-3-27b: its sliding layers keep a window of their own beyond the prefix, so a later holder saves
    // less than the prefix's bytes.
    let plan = GpuPlan::builder(ModelSpec::preset("gemma-3-27b").unwrap()).gpu("h100-80").build().unwrap();
    let (alone, suffix, prefix) =
        (plan.max_sequence_bytes(8_100), plan.max_suffix_bytes(8_100, 4_000), plan.prefix_bytes(4_000));
    assert!(alone - suffix < prefix);
    let admission = Admission::builder()
        .kv_layout(plan.layout().clone())
        .kv_capacity_bytes(prefix + 5 * suffix)
        .prefix_sharing(4)
        .build()
        .unwrap();
    let request = Request::new(8_000, 100).prefix("system", 4_000);
    let mut held: Vec<_> = (0..5).map(|_| admission.try_admit(&request).unwrap()).collect();
    let s = admission.snapshot();
    assert_eq!((s.kv_used, s.kv_saved_by_prefixes), (prefix + 5 * suffix, 4 * (alone - suffix)));
    // A waiter granted while the prefix is held saves as much.
    let mut waiting = admission.admit(&request);
    assert!((&mut waiting).now_or_never().is_none());
    held.pop();
    assert!(waiting.now_or_never().unwrap().is_ok());
    assert_eq!(admission.snapshot().kv_saved_by_prefixes, 5 * (alone - suffix));
}
